"""Cursors follow a plan's consumption under DataLoader reordering, repeats, foreign opens; retirement."""
import logging
import random

import numpy as np
import pytest

from shadefs.plan.plans import NOT_PLANNED, PlanError, PlanRegistry


def loader_open_order(plan, workers, prefetch_factor, batch_size, seed):
    """The order a DataLoader's workers open a plan: batch k to worker k mod W, each worker keeps up to
    ``prefetch_factor`` batches queued and reads a batch in order, workers interleave at random, and the
    main process consumes batches in order (which frees the next slot)."""
    rng = random.Random(seed)
    batches = [plan[i:i + batch_size] for i in range(0, len(plan), batch_size)]
    queues = {w: [] for w in range(workers)}
    issued = 0
    out = []
    done = set()
    next_needed = 0

    def issue():
        nonlocal issued
        while issued < len(batches) and issued < next_needed + workers * prefetch_factor:
            queues[issued % workers].append([issued, 0])
            issued += 1

    issue()
    while next_needed < len(batches):
        busy = [w for w in queues if queues[w]]
        w = rng.choice(busy)
        b = queues[w][0]
        out.append(batches[b[0]][b[1]])
        b[1] += 1
        if b[1] == len(batches[b[0]]):
            queues[w].pop(0)
            done.add(b[0])
            while next_needed in done:
                next_needed += 1
            issue()
    return out


def registry(n, **kw):
    r = PlanRegistry(n, **kw)
    handle, _ = r.register(None, np.arange(n, dtype=np.int64))
    return r, handle


def test_four_worker_reordering_matches_every_open():
    n = 600
    plan = np.random.default_rng(0).permutation(n)
    opens = loader_open_order(plan.tolist(), workers=4, prefetch_factor=2, batch_size=16, seed=1)
    assert opens != plan.tolist()  # really reordered
    r, h = registry(n, window=4 * 2 * 16 * 2)
    p = r.announce(h, 0, 0, [n], plan.astype(np.uint32))
    assert all(r.observe(f) == 1 for f in opens)
    assert p.finished and p.matched == n and p.unmatched == 0 and p.skipped == 0
    assert r.counters()["plans_active"] == 0 and r.finished == 1 and r.retired == 0


def test_repeats_are_separate_positions_consumed_in_order():
    r, h = registry(5)
    order = np.array([1, 1, 3, 1, 4, 3], dtype=np.uint32)
    p = r.announce(h, 0, 0, [6], order)
    assert r.distances(np.array([1, 3, 4, 0])).tolist() == [0, 2, 4, NOT_PLANNED]
    assert r.observe(1) == 1 and p.pos == 1
    assert r.distance(1) == 0      # its second use is next
    assert r.observe(3) == 1 and p.pos == 1   # out of order: position 2 consumed, cursor waits at 1
    assert r.distance(1) == 0 and r.distance(3) == 4    # 3's next use is position 5
    assert r.observe(1) == 1 and p.pos == 3
    assert r.observe(1) == 1 and r.observe(4) == 1 and r.observe(3) == 1
    assert p.finished and p.matched == 6


def test_foreign_opens_are_ignored():
    r, h = registry(10)
    handle2, _ = r.register(None, np.arange(5, 10, dtype=np.int64))
    p = r.announce(h, 0, 0, [3], np.array([0, 1, 2], dtype=np.uint32))  # files 0..2 only
    for _ in range(100):
        assert r.observe(7) == 0   # the test split: not in the plan
    assert p.unmatched == 0 and r.retired == 0 and r.counters()["plans_active"] == 1


def test_a_plan_the_reader_stopped_following_is_retired_once(caplog):
    n = 400
    r, h = registry(n, window=32, unmatched_limit=50)
    plan = np.random.default_rng(0).permutation(n)
    p = r.announce(h, 0, 0, [n], plan.astype(np.uint32))
    other = np.random.default_rng(1).permutation(n)   # the job changed its mind
    with caplog.at_level(logging.WARNING, logger="shadefs.plan"):
        for i, f in enumerate(other.tolist()):
            r.observe(f)
            if r.retired:
                break
    assert r.retired == 1 and r.counters()["plans_active"] == 0
    assert i < 2 * 50   # within two blocks of opens
    for f in other.tolist():
        r.observe(f)
    assert r.retired == 1
    assert sum("retired plan" in m for m in caplog.messages) == 1
    # a retired plan ranks nothing any more
    assert r.distances(plan[:10]).tolist() == [NOT_PLANNED] * 10


def test_idle_plan_is_retired_after_idle_s():
    now = [0.0]
    r, h = registry(10, idle_s=5.0, clock=lambda: now[0])
    r.announce(h, 0, 0, [3], np.array([0, 1, 2], dtype=np.uint32))
    r.observe(0)
    now[0] = 4.0
    r.expire()
    assert r.counters()["plans_active"] == 1
    now[0] = 10.0
    r.expire()
    assert r.counters()["plans_active"] == 0 and r.retired == 1


def test_a_missing_open_does_not_stall_the_cursor():
    r, h = registry(100, window=16)
    p = r.announce(h, 0, 0, [100], np.arange(100, dtype=np.uint32))
    for f in range(1, 100):   # position 0's open never comes
        r.observe(f)
    assert p.finished and p.skipped == 1 and p.matched == 99


def test_lookahead_epoch_keeps_its_consumption_when_confirmed():
    r, h = registry(4)
    e0, e1 = [0, 1, 2, 3], [3, 2, 1, 0]
    r.announce(h, 0, 5, [4, 4], np.array(e0 + e1, dtype=np.uint32))
    for f in e0:
        r.observe(f)
    r.observe(3)                                      # epoch 6 began before its announcement arrived
    p = r.announce(h, 0, 6, [4], np.array(e1, dtype=np.uint32))
    assert p.pos == 1 and p.matched == 1 and r.distance(2) == 0


def test_limits_are_refused_with_reasons():
    r, h = registry(4, max_plans=2, announce_burst=2, announce_rate=0.0)
    with pytest.raises(PlanError) as e:
        r.announce(b"\x00" * 8, 0, 0, [1], np.array([0], dtype=np.uint32))
    assert e.value.reason == "unknown_handle"
    with pytest.raises(PlanError) as e:
        r.announce(h, 0, 0, [1], np.array([4], dtype=np.uint32))
    assert e.value.reason == "unknown_path"
    r.announce(h, 0, 0, [1], np.array([0], dtype=np.uint32))
    r.announce(h, 1, 0, [1], np.array([0], dtype=np.uint32))
    with pytest.raises(PlanError) as e:
        r.announce(h, 2, 0, [1], np.array([0], dtype=np.uint32))   # a third stream
    assert e.value.reason == "flood"
    r.announce(h, 0, 0, [1], np.array([1], dtype=np.uint32))        # stream 0's second token
    with pytest.raises(PlanError) as e:
        r.announce(h, 0, 0, [1], np.array([1], dtype=np.uint32))    # its bucket is empty
    assert e.value.reason == "flood"
    with pytest.raises(PlanError) as e:
        r.register(b"\x09" * 8, np.array([0]))
    assert e.value.reason == "unknown_handle"


def test_withdraw_drops_the_stream_plan_at_once_and_tells_the_listeners(caplog):
    r, h = registry(10)
    ended = []
    r.listeners.append(lambda plan, why: ended.append((plan.key, why)))
    r.announce(h, 0, 0, [10], np.arange(10, dtype=np.uint32))
    r.announce(h, 1, 0, [10], np.arange(10, dtype=np.uint32))
    with caplog.at_level(logging.WARNING, logger="shadefs.plan"):
        plan = r.withdraw(h, 0)
    assert plan is not None and plan.key == (h, 0)
    assert [p.key for p in r.active()] == [(h, 1)] and ended == [((h, 0), "withdrawn")]
    assert r.distance(3) == 3                          # stream 1 still plans file 3
    c = r.counters()
    assert (c["plans_withdrawn"], c["plans_retired"], c["plans_finished"], c["plans_active"]) == (1, 0, 0, 1)
    assert not caplog.records                          # a clean end is not a warning
    assert r.withdraw(h, 0) is None and r.withdraw(b"\x09" * 8, 1) is None   # nothing held: no change
    assert r.counters()["plans_withdrawn"] == 1 and r.counters()["tables"] == 1
