"""Clairvoyant caching on a real mount: PlanSampler announces, the daemon follows, prefetches, evicts
by Belady; bad plan messages are rejected and counted while the daemon keeps serving."""
import os

import numpy as np
import pytest
from conftest import require

torch = require("torch")  # skipped without torch; failed under CI=true
from torch.utils.data import DataLoader  # noqa: E402

from shadefs import sim  # noqa: E402
from shadefs.control import protocol as P  # noqa: E402
from shadefs.control.client import ControlClient, ControlError, find_endpoint  # noqa: E402
from shadefs.hooks import PlanSampler  # noqa: E402
from shadefs.testing.datasets import FileDataset as Files  # noqa: E402

from mountutil import class_tree, read, wait_for  # noqa: E402


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    return src, class_tree(src, 120, 4, 500, 3000, seed=5)


def invariant(s):
    p = s["prefetch"]
    assert s["opens"] == s["hits"]["ram"] + s["hits"]["disk"] + p["ready"] + p["late"] + s["misses"]


def test_live_daemon_with_a_plan_makes_opts_decisions(tree, mount, tmp_path):
    src, spec = tree
    total = sum(len(v) for v in spec.values())
    trace = tmp_path / "trace.csv"
    m = mount(src, "--ram-cache", str(total // 10), "--trace", trace, "--no-kernel-cache")
    ds = Files(m.path)
    sampler = PlanSampler(ds, seed=3, lookahead_epochs=1)
    for epoch in range(3):   # one reader (num_workers=0): the trace's order is the plan's order
        sampler.set_epoch(epoch)
        it = iter(sampler)
        assert sampler.flush()
        wait_for(lambda: m.full_stats()["plans_received"] == epoch + 1)
        for i in it:
            assert ds[i] == len(spec[os.path.relpath(ds.samples[i][0], m.path)])
    live = m.full_stats()
    invariant(live)
    t = sim.read_trace(str(trace))
    assert t.requests == live["opens"] == 3 * len(spec)
    opt = sim.belady(t, total // 10)
    assert live["hits"]["ram"] == opt.hits                    # exactly OPT's hits
    p = live["prefetch"]
    assert p["ready"] + p["late"] + live["misses"] == t.requests - opt.hits
    assert p["plans_retired"] == 0 and live["scores_rejected"]["flood"] == 0
    outcomes = {row.split(",")[-1] for row in trace.read_text().splitlines()[1:]}
    assert "prefetch" in outcomes and outcomes <= {"ram", "prefetch", "late", "miss"}


def test_four_workers_follow_the_plan(tree, mount, cli):
    from mountutil import metrics_port, scrape

    src, spec = tree
    m = mount(src, "--ram-cache", "10%", "--no-kernel-cache", "--metrics-port", "0")
    ds = Files(m.path)
    sampler = PlanSampler(ds, seed=0)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=4, multiprocessing_context="spawn")
    for epoch in range(2):
        sampler.set_epoch(epoch)
        assert sum(int(b.sum()) for b in loader) == sum(len(v) for v in spec.values())
    s = m.full_stats()
    invariant(s)
    p = s["prefetch"]
    assert s["opens"] == 2 * len(spec) and p["plans_retired"] == 0
    assert p["ready"] + p["late"] + s["hits"]["ram"] >= 0.9 * s["opens"], s
    got = scrape(metrics_port(m))
    assert got[("shadefs_prefetch_opens_total", (("state", "ready"),))] == p["ready"]
    assert got[("shadefs_plan_messages_total", ())] == s["plans_received"] == 2
    assert got[("shadefs_plans_ended_total", (("why", "retired"),))] == 0
    table = cli("stats", m.path).stdout
    assert f"prefetch        {p['ready']} ready, {p['late']} late" in table


def test_bad_plan_messages_are_rejected_counted_and_serving_goes_on(tree, mount):

    src, spec = tree
    m = mount(src, "--ram-cache", "0")
    c = ControlClient(find_endpoint(m.path))
    try:
        with pytest.raises(ControlError) as e:
            c.register(["c0/0000.bin", "no/such.bin"])
        assert e.value.reason == "unknown_path"
        handle, size = c.register(["c0/0000.bin", "c1/0001.bin"])
        assert size == 2
        with pytest.raises(ControlError) as e:
            c.register(["c0/0000.bin"], handle=b"\x07" * 8)
        assert e.value.reason == "unknown_handle"
        c.send_plan(b"\x07" * 8, 0, 0, [1], np.array([0], dtype=np.uint32))        # unknown handle
        c.send_plan(handle, 0, 0, [1], np.array([5], dtype=np.uint32))             # beyond the table
        sock = c._socket()
        sock.send_multipart(P.encode_plan(handle, 0, 0, [1], [0])[:4] + [np.ones(17, "<u4").tobytes(), b"\0" * 68])
        for _ in range(100):                                                       # a flood from one stream
            c.send_plan(handle, 9, 0, [2], np.array([0, 1], dtype=np.uint32))
        s = c.stats()
        r = s["scores_rejected"]
        assert r["unknown_path"] == 2 and r["unknown_handle"] == 2 and r["oversize"] == 1
        assert r["flood"] >= 50 and r["flood"] + s["plans_received"] == 100
        assert read(os.path.join(m.path, "c1/0001.bin")) == spec["c1/0001.bin"]   # still serving
    finally:
        c.close()
