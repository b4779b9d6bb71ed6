"""A reader of no plan's job followed as a scan: the files it read, with no planned use, go first."""
import subprocess

import numpy as np
import pytest

from shadefs.cache.index import TierIndex
from shadefs.plan.plans import PlanRegistry, proc_start_time
from shadefs.plan.policy import PlanPolicy
from shadefs.policies.base import Importance, get_policy


@pytest.fixture
def procs():
    ps = [subprocess.Popen(["sleep", "600"]) for _ in range(3)]  # a job with a plan, two readers of none
    yield ps
    for p in ps:
        p.kill()
        p.wait()


def job(p):
    return (p.pid, proc_start_time(p.pid))


def open_as(plans, idx, proc, f):
    """An open as the daemon serves it: the plans follow it, then a hit or the miss's admission."""
    plans.observe(f, proc.pid)
    if f in idx:
        idx.hit(f)
        return None
    return idx.admit(f, 1)


def test_files_a_scan_read_go_first_and_a_file_it_just_read_is_not_admitted(procs):
    n = 20
    plans = PlanRegistry(n)
    idx = TierIndex("ram", 4, PlanPolicy(get_policy("lru")(4, Importance(n)), plans))
    h, _ = plans.register(None, np.arange(n))
    plans.announce(h, 0, 0, [3], np.array([10, 11, 12], dtype=np.uint32), job=job(procs[0]))
    for f in (0, 1, 2, 3):                      # residents with no planned use, LRU order 0, 1, 2, 3
        assert open_as(plans, idx, procs[1], f) == []
    # the reader of no plan read 0 .. 3 as misses: all four are spent. The job's planned newcomer
    # evicts the highest spent id (LRU would take 0)
    assert open_as(plans, idx, procs[0], 10) == [3]
    assert plans.spent(0) and not plans.spent(10) and not plans.spent(5)
    assert open_as(plans, idx, procs[1], 5) is None   # read by the scan, no plan: not admitted
    assert 5 not in idx
    # a second reader starts: what the first read may be read again; its hits are its own reads
    assert open_as(plans, idx, procs[2], 1) is None and open_as(plans, idx, procs[2], 2) is None
    assert not plans.spent(0) and plans.spent(1) and plans.spent(2)
    assert open_as(plans, idx, procs[0], 11) == [2]   # spent by both: 2 first, not LRU's 0
    # a repeat starts the scan's next pass: what it read before may be read again
    assert open_as(plans, idx, procs[2], 1) is None
    assert plans.spent(1) and not plans.spent(2)
    assert open_as(plans, idx, procs[0], 12) == [1]
    assert plans.foreign_opens == 8


def replay(n, scans):
    """Two jobs (2 epochs each, a plan each) and one reader of every file once, interleaved at random at
    speeds 1 : 1 : 1/3; unit sizes, a tier of n / 5 files. Returns misses per stream."""
    rng = np.random.default_rng(0)
    streams = [np.concatenate([rng.permutation(n), rng.permutation(n)]) for _ in range(2)] + [rng.permutation(n)]
    ptr, order, who = [0, 0, 0], [], []
    w = np.array([1.0, 1.0, 1 / 3])
    for u in rng.random(sum(len(s) for s in streams)).tolist():
        live = [i for i in range(3) if ptr[i] < len(streams[i])]
        c = np.cumsum(w[live]) / w[live].sum()
        i = live[int(np.searchsorted(c, u, side="right"))] if len(live) > 1 else live[0]
        order.append(int(streams[i][ptr[i]]))
        who.append(i)
        ptr[i] += 1
    ps = [subprocess.Popen(["sleep", "600"]) for _ in range(3)]
    try:
        plans = PlanRegistry(n, max_scans=scans)
        idx = TierIndex("ram", n // 5, PlanPolicy(get_policy("static")(n // 5, Importance(n)), plans))
        h, _ = plans.register(None, np.arange(n))
        for j in range(2):
            plans.announce(h, j, 0, [n, n], streams[j].astype(np.uint32), job=job(ps[j]))
        miss = [0, 0, 0]
        for f, i in zip(order, who):
            if open_as(plans, idx, ps[i], f) is not None or f not in idx:
                miss[i] += 1
        assert plans.retired == 0 and plans.finished == 2
        return miss
    finally:
        for p in ps:
            p.kill()
            p.wait()


@pytest.mark.slow
def test_a_scan_of_no_plan_misses_less_and_the_jobs_miss_as_before():
    off, on = replay(3000, 0), replay(3000, 4)       # scans not followed / followed
    assert off[:2] == on[:2] == [3280, 3373]          # the jobs miss as many either way
    assert (off[2], on[2]) == (2494, 2143)            # the reader: 351 fewer misses of its 3000 opens


def test_a_newcomer_of_no_plan_takes_room_from_the_residents_now_after_an_install(procs):
    n = 20
    plans = PlanRegistry(n)
    idx = TierIndex("ram", 4, PlanPolicy(get_policy("static")(4, Importance(n)), plans))
    h, _ = plans.register(None, np.arange(n))
    plans.announce(h, 0, 0, [1], np.array([10], dtype=np.uint32), job=job(procs[0]))
    for f in (0, 1, 2, 3):                      # the job's opens of files its plan does not name
        assert open_as(plans, idx, procs[0], f) == []

    def meanwhile(active):  # while the next plan's structure is prepared: 3 leaves, the reader brings 6
        with plans.lock:
            idx.remove(3)
            assert open_as(plans, idx, procs[1], 6) == []
        return lambda version: {}

    plans.preparers.append(meanwhile)             # after the tier took its snapshot
    plans.announce(h, 1, 0, [1], np.array([11], dtype=np.uint32), job=job(procs[0]))
    plans.preparers.remove(meanwhile)
    plans.observe(5, procs[0].pid)
    assert idx.admit(5, 2) == [6, 2]             # the spent 6, then static's highest id among the residents
