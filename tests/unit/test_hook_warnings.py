"""The hooks' no-daemon warnings, as a user sees them: one warning, attributed to the user's line (the
``for`` over the DataLoader, or the sampler's construction), saying in plain words what happened and what
the job does now -- not a torch frame, not a raw errno text, not once per epoch."""
import errno
import inspect
import os
import socket
import warnings

import pytest
from conftest import require

torch = require("torch")
from torch.utils.data import DataLoader  # noqa: E402

from hookfakes import FakeDataset  # noqa: E402
from shadefs.control.client import EndpointNotFound, find_endpoint  # noqa: E402
from shadefs.hooks import Client, PlanSampler, ShadeSampler  # noqa: E402
from shadefs.hooks.client import no_daemon_reason  # noqa: E402


class Items(FakeDataset):
    def __getitem__(self, i):
        return i


def here() -> int:
    """The caller's line number."""
    return inspect.currentframe().f_back.f_lineno


def shadefs_warnings(record):
    return [w for w in record if str(w.message).startswith("shadefs:")]


def _one(record, lineno):
    got = shadefs_warnings(record)
    assert len(got) == 1, [str(w.message) for w in got]
    w = got[0]
    assert w.category is RuntimeWarning
    assert (w.filename, w.lineno) == (__file__, lineno), (w.filename, w.lineno)
    return str(w.message)


def test_plan_sampler_off_the_mount_warns_once_at_the_users_for_line(tmp_path, monkeypatch):
    monkeypatch.delenv("SHADEFS_ENDPOINT", raising=False)
    ds = Items(20, root=str(tmp_path / "train"))
    (tmp_path / "train").mkdir()
    sampler = PlanSampler(ds, seed=0)
    loader = DataLoader(ds, batch_size=5, sampler=sampler)
    seen = []
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for epoch in range(3):
            sampler.set_epoch(epoch)
            line = here() + 1
            for batch in loader:
                seen += batch.tolist()
    text = _one(record, line)
    assert sorted(seen) == sorted(list(range(20)) * 3)       # a plain sampler without the daemon
    assert f"no daemon answered for {str(tmp_path / 'train')!r}" in text
    assert "not on a shadefs mount" in text and "SHADEFS_ENDPOINT is not set" in text
    assert "the plan is not announced, so training continues without prefetch" in text
    assert "No data available" not in text and "torch" not in text


def test_missing_control_socket_is_said_so(tmp_path, monkeypatch):
    sock = tmp_path / "gone.sock"
    monkeypatch.setenv("SHADEFS_ENDPOINT", f"ipc://{sock}")
    ds = Items(10, root=str(tmp_path / "train"))
    sampler = PlanSampler(ds, seed=0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for epoch in range(2):
            line = here() + 1
            for _ in DataLoader(ds, batch_size=5, sampler=sampler):
                pass
    text = _one(record, line)
    assert f"no daemon answered at ipc://{sock}: its control socket {sock} does not exist" in text
    assert "training continues without prefetch" in text


@pytest.mark.slow
def test_an_endpoint_nobody_answers_warns_once_on_the_users_thread(tmp_path):
    with socket.socket() as s:                                # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = Client(endpoint=f"tcp://127.0.0.1:{port}", mount_root=str(tmp_path), timeout_s=0.3,
                    credentials=False)
    ds = Items(10, root=str(tmp_path / "train"))
    sampler = PlanSampler(ds, seed=0, client=client)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for epoch in range(3):
            for _ in DataLoader(ds, batch_size=5, sampler=sampler):
                pass
            line = here() + 1
            assert sampler.flush(10.0)                    # the registration timed out on the thread
    text = _one(record, line)
    assert text.startswith(f"shadefs: no daemon answered at tcp://127.0.0.1:{port} within 0.3 s: PlanSampler's "
                           "plan is not announced")
    assert sampler.announcer.failed == 3 and sampler.announcer.sent == 0   # still tried each epoch
    client.close()


def test_shade_sampler_warns_once_at_its_construction(tmp_path, monkeypatch):
    monkeypatch.delenv("SHADEFS_ENDPOINT", raising=False)
    ds = Items(12, root=str(tmp_path / "train"))
    (tmp_path / "train").mkdir()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        line = here() + 1
        sampler = ShadeSampler(ds)
        for epoch in range(2):
            for _ in DataLoader(ds, batch_size=4, sampler=sampler):
                pass
    text = _one(record, line)
    assert "not on a shadefs mount" in text and "without cache awareness" in text
    assert "No data available" not in text and sampler.client is None


def test_reasons_in_plain_words(tmp_path, monkeypatch):
    monkeypatch.delenv("SHADEFS_ENDPOINT", raising=False)
    with pytest.raises(EndpointNotFound) as e:
        find_endpoint(str(tmp_path))
    assert e.value.errno == errno.ENODATA
    assert no_daemon_reason(e.value) == "it is not on a shadefs mount, and SHADEFS_ENDPOINT is not set"
    with pytest.raises(EndpointNotFound) as e:
        find_endpoint(str(tmp_path / "missing"))
    assert no_daemon_reason(e.value) == "the path does not exist"
    gone = EndpointNotFound("x", errno.ENOTCONN)
    assert "no running daemon" in no_daemon_reason(gone)
    assert no_daemon_reason(ImportError("no zmq")).startswith("the shadefs control client is not installed")
    assert not os.path.exists(tmp_path / "missing")
