"""PlanSampler yields exactly what it wraps, is deterministic per (seed, epoch), pickles, warns once
without a daemon, and computes its table from a relative dataset root."""
import os
import pickle
import warnings

import numpy as np
import pytest

from conftest import require  # noqa: E402

torch = require("torch")
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

from hookfakes import FakeDataset  # noqa: E402
from shadefs.hooks import PlanSampler  # noqa: E402
from shadefs.hooks.plan import PlanAnnouncer  # noqa: E402


def test_default_order_is_a_seeded_permutation_per_epoch():
    ds = FakeDataset(500)
    a, b = PlanSampler(ds, seed=3, client=False), PlanSampler(ds, seed=3, client=False)
    e0, e0b = list(iter(a)), list(iter(b))
    assert sorted(e0) == list(range(500)) and e0 == e0b
    e1 = list(iter(a))                                 # no set_epoch: the epoch advances
    assert e1 != e0 and a.epoch == 1
    a.set_epoch(0)
    assert list(iter(a)) == e0
    assert list(iter(PlanSampler(ds, seed=4, client=False))) != e0
    assert np.array_equal(a.order(1), np.array(e1))   # the lookahead announced is what epoch 1 yields


@pytest.mark.parametrize("lookahead", [0, 1, 3])
def test_wrapped_sampler_is_yielded_exactly_and_lookahead_does_not_disturb_it(lookahead):
    ds = FakeDataset(101)
    ref = DistributedSampler(ds, num_replicas=2, rank=1, seed=7)
    wrapped = PlanSampler(ds, sampler=DistributedSampler(ds, num_replicas=2, rank=1, seed=7),
                          lookahead_epochs=lookahead, client=False)
    for epoch in range(3):
        ref.set_epoch(epoch)
        wrapped.set_epoch(epoch)
        assert list(iter(wrapped)) == list(iter(ref))
        assert len(wrapped) == len(ref)
        assert wrapped.sampler.epoch == epoch


def test_a_sampler_without_set_epoch_is_never_iterated_ahead():
    ds = FakeDataset(50)
    g = torch.Generator().manual_seed(0)
    ref = list(torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(0)))
    s = PlanSampler(ds, sampler=torch.utils.data.RandomSampler(ds, generator=g), lookahead_epochs=2, client=False)
    assert list(iter(s)) == ref   # iterating ahead would have consumed the generator


def test_no_daemon_warns_once_and_samples_as_usual(tmp_path):
    root = tmp_path / "train"
    ds = FakeDataset(20, root=str(root))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        s = PlanSampler(ds, seed=0)
        for _ in range(3):
            assert sorted(iter(s)) == list(range(20))
    assert sum("no daemon" in str(x.message) for x in w) == 1


def test_pickles_without_its_thread():
    s = PlanSampler(FakeDataset(30), seed=1, client=False)
    first = list(iter(s))
    s2 = pickle.loads(pickle.dumps(s))
    s2.set_epoch(0)
    assert list(iter(s2)) == first


def test_relative_dataset_root_is_resolved_against_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    class Recorder:
        endpoint, mount_root = "ipc:///nonexistent", str(tmp_path / "mnt")

        def register_paths(self, paths):
            self.paths = list(paths)
            return b"\x01" * 8

    ds = FakeDataset(4, root="mnt/train")              # a relative root, as ImageFolder("mnt/train") keeps it
    ds.samples.append(("/elsewhere/x.png", 0))          # outside the mount: left out of the table
    a = PlanAnnouncer(ds, client=False)
    a._client, a._sender, a.enabled = Recorder(), Recorder(), True
    a._register()
    assert a._sender.paths == [f"train/c{i % 3}/img{i:05d}.png" for i in range(4)]
    assert a._table_index.tolist() == [0, 1, 2, 3, -1]


def test_no_epoch_after_the_last_is_announced():
    ds = FakeDataset(40)
    sent = []
    s = PlanSampler(ds, seed=1, lookahead_epochs=2, client=False, epochs=3)
    s.announcer.announce = lambda epoch, orders: sent.append((epoch, [list(o) for o in orders]))
    for epoch in range(3):
        s.set_epoch(epoch)
        list(iter(s))
    assert [(e, len(o)) for e, o in sent] == [(0, 3), (1, 2), (2, 1)]   # epoch 3 is never announced
    assert sent[1][1] == [s.order(1).tolist(), s.order(2).tolist()]
    sent.clear()
    t = PlanSampler(ds, seed=1, client=False)                            # told late: set_epoch(last=True)
    t.announcer.announce = lambda epoch, orders: sent.append((epoch, len(orders)))
    list(iter(t))
    t.set_epoch(1, last=True)
    list(iter(t))
    assert sent == [(0, 2), (1, 1)]
    with pytest.raises(ValueError):
        PlanSampler(ds, client=False, epochs=0)
