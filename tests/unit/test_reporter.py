"""ScoreReporter: batch -> dataset index mapping by the sampler's yielded order, the rank transform on
exactly those indices, raw losses to a real daemon behind a real ControlServer, and a tiny training run
with no daemon (the three-line user change, verbatim)."""
import subprocess
import sys

import numpy as np
import pytest
from conftest import require

torch = require("torch")  # skipped without torch; failed under CI=true
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from shadefs.hooks import Client, ScoreReporter, ShadeSampler  # noqa: E402
from shadefs.hooks.sampler import rank_transform  # noqa: E402

from hookfakes import FakeDataset, LiveDaemon  # noqa: E402


class IndexDataset(FakeDataset):
    """Returns (feature, class, index): lets a test see which index a loader position carried."""

    def __getitem__(self, i):
        return torch.tensor([float(i % 7), float(i % 3)]), i % 3, i


def expected_weights(n, batches):
    w = np.ones(n)
    for idx, losses in batches:
        w[idx] = rank_transform(np.asarray(losses, dtype=np.float32))
    return w


# ---------------------------------------------------------------------------- index mapping
def test_report_scores_exactly_the_yielded_indices():
    n, bs = 30, 8
    s = ShadeSampler(FakeDataset(n), client=False, seed=3)
    r = ScoreReporter(FakeDataset(n), sampler=s, batch_size=bs)
    order = np.array(list(s))
    rng = np.random.default_rng(0)
    batches = []
    for start in range(0, n, bs):
        idx = order[start : start + bs]
        losses = rng.random(idx.size).astype(np.float32)
        r.report(torch.from_numpy(losses))
        batches.append((idx, losses))
    np.testing.assert_allclose(s.weights, expected_weights(n, batches), rtol=1e-6)
    untouched = np.setdiff1d(np.arange(n), order)
    assert untouched.size > 0 and np.all(s.weights[untouched] == 1.0)
    with pytest.raises(ValueError, match="sampler positions"):
        r.report(np.ones(1))  # the epoch is fully reported
    list(s)  # next epoch: the cursor restarts at its first position
    first = s.plan.order[:bs]
    r.report(np.arange(bs, dtype=np.float32))
    np.testing.assert_allclose(s.weights[first[-1]], np.log(10 + bs - 1), rtol=1e-6)


def test_explicit_indices_and_tensor_with_grad():
    s = ShadeSampler(FakeDataset(10), client=False)
    r = ScoreReporter(FakeDataset(10), sampler=s)
    loss = torch.tensor([3.0, 1.0, 2.0], requires_grad=True) * 1.0
    r.report(loss, indices=torch.tensor([9, 0, 4]))
    np.testing.assert_allclose(s.weights[[9, 0, 4]], np.log([12.0, 10.0, 11.0]), rtol=1e-6)
    with pytest.raises(ValueError, match="indices"):
        r.report(np.ones(2), indices=[1])


def test_report_rejects_a_mean_loss_and_a_foreign_loader():
    s = ShadeSampler(FakeDataset(10), client=False)
    r = ScoreReporter(FakeDataset(10), sampler=s, batch_size=4)
    with pytest.raises(ValueError, match="needs a ShadeSampler"):
        r.report(np.ones(4))  # the sampler was never iterated
    list(s)
    with pytest.raises(ValueError, match='reduction="none"'):
        r.report(torch.tensor(1.5))
    with pytest.raises(ValueError, match="batch size"):
        r.report(np.ones(3))  # short but not the epoch's last batch
    r.report(np.ones(4))
    r.report(np.ones(4))
    r.report(np.ones(2))  # the last, short batch is fine


def test_nonfinite_losses_are_dropped(tmp_path):
    with LiveDaemon(tmp_path, 10) as live, live.client() as client:
        ds = live.dataset
        s = ShadeSampler(ds, client=client)
        r = ScoreReporter(ds, sampler=s)
        r.report(np.array([2.0, np.nan, 0.5, np.inf]), indices=[1, 2, 3, 4])
        assert s.nonfinite == 2
        np.testing.assert_allclose(s.weights[[1, 2, 3, 4]], [np.log(11.0), 1.0, np.log(10.0), 1.0], rtol=1e-6)
        stats = client.stats()  # after the scores on the same socket
        assert stats["scores_received"] == 1 and sum(stats["scores_rejected"].values()) == 0
        # only the finite ones arrived, raw ("--score-transform raw"); the others keep the default 1.0
        np.testing.assert_array_equal(live.importance([1, 3]), [2.0, 0.5])
        np.testing.assert_array_equal(live.importance([0, 2, 4, 5]), [1.0, 1.0, 1.0, 1.0])


def test_sends_raw_losses_with_mount_relative_paths(tmp_path):
    with LiveDaemon(tmp_path, 12) as live, live.client() as client:
        ds = live.dataset
        s = ShadeSampler(ds, client=client, seed=1)
        r = ScoreReporter(ds, sampler=s)
        assert r.client is client
        order = list(s)
        r.report(np.array([2.5, 0.25, 1.0, 7.0], dtype=np.float32))
        assert client.stats()["scores_received"] == 1
        # the daemon resolved the mount-relative paths to the right files and got the raw losses
        np.testing.assert_array_equal(live.importance(order[:4]), [2.5, 0.25, 1.0, 7.0])
        rest = [i for i in range(12) if i not in set(order[:4])]
        np.testing.assert_array_equal(live.importance(rest), np.ones(len(rest)))


def test_smoothing_term_from_reported_losses():
    n = 8
    s = ShadeSampler(FakeDataset(n), client=False, smoothing=0.1)
    r = ScoreReporter(FakeDataset(n), sampler=s)
    list(s)
    r.report(np.full(n, 2.0))
    assert s.ls == 0.0
    list(s)  # epoch end: ls = 0.1 * mean loss of epoch 0
    assert s.ls == pytest.approx(0.2)
    r.report(np.full(n, 1.0))
    list(s)
    assert s.ls == pytest.approx(0.2 * np.exp(-0.5))
    list(s)  # nothing reported: unchanged
    assert s.ls == pytest.approx(0.2 * np.exp(-0.5))


# ------------------------------------------------------------------- a real daemon and ControlServer
def test_with_a_real_control_server(tmp_path, monkeypatch):
    monkeypatch.delenv("SHADEFS_ENDPOINT", raising=False)
    n = 40
    with LiveDaemon(tmp_path, n, resident=range(4)) as live:
        ds = live.dataset
        client = live.client()
        client.RESIDENT_CHUNK = 7  # several requests per epoch
        s = ShadeSampler(ds, client=client, seed=2, rep_factor=3)
        r = ScoreReporter(ds, sampler=s, batch_size=8)
        order = np.array(list(s))
        assert s.plan.resident > 0 and s.plan.hits == 3 * s.plan.resident
        assert np.all(order[: s.plan.hits] < 4) and np.all(order[s.plan.hits :] >= 4)
        losses = np.linspace(0.1, 0.8, 8).astype(np.float32)
        r.report(losses)
        stats = client.stats()
        assert stats["scores_received"] == 1 and client.dropped == 0
        first = order[:8]
        want = {int(i): float(v) for i, v in zip(first, losses)}  # a file drawn twice: its last value wins
        np.testing.assert_array_equal(live.importance(list(want)), list(want.values()))
        client.close()


# -------------------------------------------------------------------- no daemon: tiny training
def _image_folder(root, per_class=8):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(2):
        d = root / f"class{c}"
        d.mkdir(parents=True)
        for i in range(per_class):
            px = (rng.random((8, 8)) * 100 + 100 * c).astype(np.uint8)
            Image.fromarray(px, mode="L").save(d / f"{i}.png")


@pytest.mark.slow  # a training run (torchvision's import included): over a second
def test_tiny_training_without_a_daemon_follows_the_user_code(tmp_path, monkeypatch):
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    monkeypatch.delenv("SHADEFS_ENDPOINT", raising=False)
    _image_folder(tmp_path / "train")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    with pytest.warns(RuntimeWarning, match="no daemon") as rec:
        dataset = ImageFolder(str(tmp_path / "train"), transform=transforms.ToTensor())
        sampler = ShadeSampler(dataset)
        loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=0)
        reporter = ScoreReporter(dataset, sampler=sampler)
        losses = []
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for x, y in loader:
                loss = F.cross_entropy(model(x), y, reduction="none")
                reporter.report(loss)
                loss.mean().backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.detach().mean().item())
    assert [str(w.message)[:16] for w in rec] == ["shadefs: no daem"]
    assert reporter.batches == 12 and all(np.isfinite(losses))
    assert np.any(sampler.weights != 1.0) and sampler.ls > 0
    assert sampler.plan.mode == "aggressive"  # no validation: SHADE's trend stays 100


def test_worker_processes_keep_the_sampler_order():
    ds = IndexDataset(23)
    s = ShadeSampler(ds, client=False, seed=5)
    r = ScoreReporter(ds, sampler=s, batch_size=4)
    loader = DataLoader(ds, batch_size=4, sampler=s, num_workers=2)
    for epoch in range(2):
        s.set_epoch(epoch)
        pos = 0
        for x, y, idx in loader:
            assert idx.tolist() == s.plan.order[pos : pos + len(idx)].tolist()
            pos += len(idx)
            r.report(x[:, 0])
            np.testing.assert_allclose(s.weights[idx.numpy()[-1]], rank_transform(x[:, 0].numpy())[-1])


@pytest.mark.slow
def test_importing_the_hooks_does_not_import_torch():
    code = (
        "import sys, shadefs.hooks as h\n"
        "from shadefs.hooks import Client, ScoreReporter\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "h.ShadeSampler\n"
        "assert 'torch' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -------------------------------------------------------------------------------------- Client
@pytest.mark.slow
def test_client_endpoint_discovery_and_sends_that_never_raise(tmp_path, monkeypatch):
    from shadefs.control import client as cc

    monkeypatch.delenv("SHADEFS_ENDPOINT", raising=False)
    with pytest.raises(cc.EndpointNotFound):
        Client(str(tmp_path))
    with pytest.raises(cc.EndpointNotFound):
        Client()
    monkeypatch.setenv("SHADEFS_ENDPOINT", "tcp://127.0.0.1:9")
    client = Client(str(tmp_path), mount_root=str(tmp_path), timeout_s=0.2)
    assert client.endpoint == "tcp://127.0.0.1:9" and client.mount_root == str(tmp_path)
    assert client.send_scores(["../escape.png"], [1.0]) is False  # invalid path: dropped, not raised
    assert client.dropped == 1
    assert client.send_scores([], []) is True
    with pytest.raises(TimeoutError):  # nobody listens: queries fail, the sampler degrades on that
        client.resident(["a.png"])
    client.close()
