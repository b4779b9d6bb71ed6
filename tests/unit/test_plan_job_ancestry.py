"""Plans keyed to their job: an open moves only the cursors of the opener's job (the announcing process
and its descendants, threads resolved to their process); a reader of no job moves none."""
import os
import subprocess
import threading
import time

import numpy as np
import pytest

from shadefs.plan.plans import PlanRegistry, ancestry, proc_start_time


def children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


@pytest.fixture
def other_job():
    """A process of this test's (a shell) with a child of its own (its DataLoader worker, as it were)."""
    p = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        while not children(p.pid):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield p.pid, children(p.pid)[0]
    finally:
        p.kill()
        p.wait()


def test_an_open_moves_only_the_plans_of_the_openers_job(other_job):
    shell, worker = other_job
    n = 64
    plans = PlanRegistry(n, window=8)
    h, _ = plans.register(None, np.arange(n))
    order = np.arange(n, dtype=np.uint32)
    mine = plans.announce(h, 0, 0, [n], order, job=(os.getpid(), proc_start_time(os.getpid())))
    theirs = plans.announce(h, 1, 0, [n], order, job=(shell, proc_start_time(shell)))
    assert ancestry(worker)[:3] == (worker, shell, os.getpid())

    # the other job's worker: its plan only (the nearest owner)
    assert [plans.observe(f, worker) for f in range(4)] == [1] * 4
    assert (theirs.pos, mine.pos) == (4, 0)

    tid, started, done = [], threading.Event(), threading.Event()
    t = threading.Thread(target=lambda: (tid.append(threading.get_native_id()), started.set(), done.wait(10)))
    t.start()
    try:
        assert started.wait(10)
        assert tid[0] != os.getpid()
        # a thread of the announcing process: its process's job
        assert plans.observe(0, tid[0]) == 1 and (theirs.pos, mine.pos) == (4, 1)
    finally:
        done.set()
        t.join()

    # a reader of no job (this test's parent): no cursor moves
    assert [plans.observe(f, os.getppid()) for f in range(10, 30)] == [0] * 20
    assert (theirs.pos, mine.pos) == (4, 1) and theirs.unmatched == mine.unmatched == 0
    assert plans.counters()["plans_foreign_opens"] == 20
    assert plans.counters()["plans_matched"] == 5 and plans.retired == 0


def test_a_job_this_daemon_cannot_see_gets_a_plan_that_follows_every_open():
    n = 16
    plans = PlanRegistry(n)
    h, _ = plans.register(None, np.arange(n))
    start = proc_start_time(os.getpid())
    unseen = plans.announce(h, 0, 0, [n], np.arange(n, dtype=np.uint32), job=(os.getpid(), start + 1))
    assert unseen.owner is None                  # same pid, another start time: not this process
    assert plans.observe(0, os.getppid()) == 1
    assert plans.observe(1, None) == 1           # an opener nobody named: every plan follows it
