"""The hooks work with any DataLoader setup: a relative dataset root, and hook
objects pickled into DataLoader workers under every multiprocessing start method, over a real mount."""
from __future__ import annotations

import os
import pickle
import time
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.datasets import DatasetFolder

from shadefs.hooks import Client, ScoreReporter, ShadeSampler
from shadefs.hooks.client import DatasetPaths

REL = ["cat/01.bin", "cat/03.bin", "cat/05.bin", "cat/07.bin", "cat/09.bin",
       "dog/00.bin", "dog/02.bin", "dog/04.bin", "dog/06.bin", "dog/08.bin"]  # DatasetFolder's order


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def folder(root):
    return DatasetFolder(str(root), loader=read_bytes, extensions=(".bin",))


def wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.05)
    return pred()


# -- item 7: a relative root ---------------------------------------------------------------------------
def test_a_relative_dataset_root_keeps_importance_mode(small_tree, mount, tmp_path, monkeypatch):
    src, spec = small_tree
    m = mount(src, "--ram-cache", "1MiB", "--policy", "shade", name="m")
    monkeypatch.chdir(tmp_path)
    ds = folder("m")  # relative, as in a notebook
    assert ds.samples[0][0] == "m/cat/01.bin"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: everything is inside the mount
        sampler = ShadeSampler(ds, seed=1)
        reporter = ScoreReporter(ds, sampler=sampler)
    monkeypatch.chdir("/")  # a later chdir changes nothing
    assert sampler.paths.rel_paths(range(len(ds))) == REL
    with open(os.path.join(m.path, "dog/00.bin"), "rb") as f:
        assert f.read() == spec["dog/00.bin"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        order = list(sampler)  # the first announcement: the path table is built on the background thread
        assert sampler.announcer.flush(timeout=30.0)  # gives the thread's queued warnings on this thread
    assert [str(w.message) for w in caught] == []  # e.g. none "... lie outside the mount"
    ann = sampler.announcer
    assert ann.enabled and ann.sent >= 1 and ann.failed == 0
    assert ann._table_index is not None and ann._table_index.tolist() == list(range(len(REL)))  # all 10 planned
    assert wait_for(lambda: m.full_stats()["plans_received"] >= 1)
    assert sampler.plan.resident == int(np.sum(sampler.plan.shard == REL.index("dog/00.bin")))
    assert sampler.plan.resident > 0 and order[0] == REL.index("dog/00.bin")
    reporter.report(np.arange(len(order), dtype=np.float32))
    assert reporter.sent == 1
    assert wait_for(lambda: m.full_stats()["scores_received"] == 1)


def test_a_plan_sampler_on_a_relative_root_plans_every_sample_after_a_chdir(small_tree, mount, tmp_path,
                                                                             monkeypatch):
    from shadefs.hooks import PlanSampler

    src, _ = small_tree
    m = mount(src, "--ram-cache", "1MiB", name="m")
    monkeypatch.chdir(tmp_path)
    ds = folder("m")  # relative
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sampler = PlanSampler(ds, seed=2, lookahead_epochs=0)
        monkeypatch.chdir("/")  # between construction and the first epoch: discovery and table unchanged
        order = list(sampler)
        assert sampler.flush(timeout=30.0)
        sampler.close()
    assert [str(w.message) for w in caught] == []
    ann = sampler.announcer
    assert sorted(order) == list(range(len(REL))) and ann.sent == 1 and ann.failed == 0
    assert ann._table_index.tolist() == list(range(len(REL)))  # every sample is in the path table
    assert wait_for(lambda: m.full_stats()["plans_received"] == 1)


def test_most_indices_outside_the_mount_warn_once(small_tree, mount, tmp_path):
    src, _ = small_tree
    m = mount(src, "--ram-cache", "1MiB")
    outside = folder(src)  # the source tree itself, not the mount
    with pytest.warns(RuntimeWarning, match=r"10 of 10 sampled dataset paths .* lie outside the mount") as w:
        paths = DatasetPaths(outside, m.path)
    assert len([x for x in w if "outside the mount" in str(x.message)]) == 1
    assert paths.outside_fraction == 1.0 and paths.rel_paths(range(10)) == [None] * 10


# -- item 8: every hook object pickles, and works in DataLoader workers -------------------------------------
class HookedDataset(Dataset):
    """A dataset that holds all three hook objects and uses them from inside the workers."""

    def __init__(self, ds, client, sampler, reporter):
        self.ds, self.client, self.sampler, self.reporter = ds, client, sampler, reporter

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        rel = self.sampler.paths.rel_path(i)
        flag = bool(self.client.resident([rel])[0])  # before this worker reads the file
        flag2 = bool(self.sampler.client.resident([rel])[0])
        data, _ = self.ds[i]
        sent = self.reporter.client.send_scores([rel], [float(i)])
        return i, len(data), flag, flag2, sent, os.getpid()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_hook_objects_pickle_into_dataloader_workers(small_tree, mount, method):
    src, spec = small_tree
    m = mount(src, "--ram-cache", "1MiB")
    ds = folder(m.path)
    with open(os.path.join(m.path, "cat/03.bin"), "rb") as f:
        f.read()  # resident
    sampler = ShadeSampler(ds, seed=3)
    list(sampler)  # first use: a residency query opened the socket
    reporter = ScoreReporter(ds, sampler=sampler)
    reporter.report(np.ones(len(ds), dtype=np.float32))  # first use of the send path
    client = Client(m.path)
    assert client.resident(["cat/03.bin"]).tolist() == [True]
    for obj in (client, sampler, reporter):  # pickling after use, then use in this process
        copy = pickle.loads(pickle.dumps(obj))
        c = copy if isinstance(copy, Client) else copy.client
        assert c.resident(["cat/03.bin", "cat/01.bin"]).tolist() == [True, False]
    before = m.full_stats()["scores_received"]
    dl = DataLoader(HookedDataset(ds, client, sampler, reporter), batch_size=None, num_workers=2,
                    multiprocessing_context=method)
    rows = list(dl)
    assert sorted(r[0] for r in rows) == list(range(len(ds)))
    for i, size, flag, flag2, sent, pid in rows:
        assert size == len(spec[REL[i]])
        assert flag == flag2 == (REL[i] == "cat/03.bin")
        assert sent is True and pid != os.getpid()
    assert len({r[5] for r in rows}) == 2
    assert wait_for(lambda: m.full_stats()["scores_received"] == before + len(ds))
