"""Plans at scale: bounded bookkeeping with tiers that never evict, announcements built off the lock,
plan state that follows the plan's length, registration that does not copy the table under the lock."""
import gc
import time
import sys
import tracemalloc
import threading
import weakref

import numpy as np
import pytest

from shadefs.cache.index import TierIndex
from shadefs.plan.plans import PlanRegistry
from shadefs.plan.policy import PlanPolicy
from shadefs.policies.base import Importance, get_policy


def tiers(n, capacities, inner="lru"):
    plans = PlanRegistry(n)
    h, _ = plans.register(None, np.arange(n, dtype=np.int64))
    imp = Importance(n)
    idx = [TierIndex(f"t{i}", c, PlanPolicy(get_policy(inner)(c, imp), plans)) for i, c in enumerate(capacities)]
    return plans, h, idx


@pytest.mark.slow
def test_a_tier_that_is_off_or_never_evicts_keeps_no_growing_backlog():
    n = 500
    plans, h, (off, big) = tiers(n + 1, [0, n])
    for f in range(n):
        assert big.admit(f, 1) == []
    plans.announce(h, 0, 0, [2], np.array([n, 1], dtype=np.uint32))
    (victim,) = big.admit(n, 1)                       # one victim search: the structure is current
    big.remove(n)
    assert big.admit(victim, 1) == []
    rng = np.random.default_rng(0)
    dead = []
    for epoch in range(6):
        order = rng.permutation(n).astype(np.uint32)
        plans.announce(h, 0, epoch, [n, n], np.concatenate([order, rng.permutation(n).astype(np.uint32)]))
        dead.append(weakref.ref(plans.plans[(h, 0)]))
        for f in order.tolist():                      # every open a hit: no insert, no victim search
            assert plans.observe(f) == 1
            big.hit(f)
    assert len(off.policy._dirty) == 0                # the tier that is off does not listen at all
    assert len(big.policy._dirty) <= n                # at most one entry per resident
    plans.announce(h, 0, 99, [1], np.array([1], dtype=np.uint32))
    gc.collect()
    assert [r() for r in dead] == [None] * len(dead)  # no replaced plan is kept alive by a backlog


class SpyLock:
    """The cache's lock, telling whether it is held (one thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.held = False

    def __enter__(self):
        self._lock.__enter__()
        self.held = True
        return self

    def __exit__(self, *exc):
        self.held = False
        return self._lock.__exit__(*exc)


HEAVY = {"Plan.__init__", "PlanPolicy._compute", "PlanPolicy._rebuild", "argsort", "concatenate", "unique"}


def calls_by_lock(lock, fn):
    """Run ``fn``; returns {(name, lock held)} of the heavy calls it made (plan builds, sorts, copies)."""
    seen = set()

    def profile(frame, event, arg):
        name = frame.f_code.co_qualname if event == "call" else getattr(arg, "__name__", "") if event == "c_call" else ""
        if name in HEAVY:
            seen.add((name, lock.held))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def test_announcing_and_registering_build_off_the_lock_and_the_next_search_needs_no_rebuild():
    n = 4000
    lock = SpyLock()
    plans = PlanRegistry(n, lock)
    imp = Importance(n)
    pol = PlanPolicy(get_policy("lru")(n // 2, imp), plans)
    idx = TierIndex("ram", n // 2, pol)
    for f in range(n // 2):
        idx.admit(f, 1)
    rng = np.random.default_rng(1)
    e0, e1, e2 = (rng.permutation(n).astype(np.uint32) for _ in range(3))

    def register():
        h, _ = plans.register(None, np.arange(0, n // 2))
        plans.register(h, np.arange(n // 2, n))       # appended: the table is not copied under the lock
        return h

    h = []
    seen = calls_by_lock(lock, lambda: h.append(register()))
    assert ("concatenate", True) not in seen
    h = h[0]
    seen = calls_by_lock(lock, lambda: plans.announce(h, 0, 0, [n, n], np.concatenate([e0, e1])))
    for f in e0[:100].tolist():
        plans.observe(f)
    seen |= calls_by_lock(lock, lambda: plans.announce(h, 0, 1, [n, n], np.concatenate([e1, e2])))

    def search():
        f = next(f for f in e1.tolist() if f not in idx)
        with lock:                                     # as the cache calls its tiers
            plans.observe(f)
            idx.admit(f, 1)

    seen |= calls_by_lock(lock, search)
    assert {name for name, held in seen if held} == set()
    assert {("Plan.__init__", False), ("PlanPolicy._compute", False)} <= seen
    assert pol.prepared == 2 and pol.rebuilds == 0
    assert plans.plans[(h, 0)].matched == 1           # epoch 1 was confirmed: its one open carried over


def test_plan_memory_follows_the_plan_not_the_namespace():
    n = 2_000_000
    plans = PlanRegistry(n)
    h, _ = plans.register(None, np.arange(64, dtype=np.int64) * 31_000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for stream in range(16):
            plans.announce(h, stream, 0, [1], np.array([stream], dtype=np.uint32))
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(plans.plans) == 16
    assert grown < 256 * 1024                          # 16 one-position plans; not 16 x 4 bytes x 2M files
    assert sum(p.nbytes() for p in plans.plans.values()) < 16 * 1024


def belady_victim(plans, idx):
    """The resident Belady evicts first: the furthest next use over the plans, ties to the highest id."""
    return max((plans.distance(f), f) for f in idx.policy.sizes)[1]


def test_an_install_only_swaps_under_the_lock_and_what_changed_meanwhile_is_rekeyed_at_the_next_search():
    n = 4000
    lock = SpyLock()
    plans = PlanRegistry(n, lock)
    pol = PlanPolicy(get_policy("lru")(n // 2, Importance(n)), plans)
    idx = TierIndex("ram", n // 2, pol)
    for f in range(n // 2):
        idx.admit(f, 1)
    h, _ = plans.register(None, np.arange(n))
    rng = np.random.default_rng(3)
    e0, e1 = rng.permutation(n).astype(np.uint32), rng.permutation(n).astype(np.uint32)
    plans.announce(h, 0, 0, [n], e0)
    mine = [False]

    def meanwhile(active):
        # runs after the policy took its snapshot for stream 1's plan: 40 opens of stream 0's files move
        # their next uses, 10 residents leave and 10 files come in, all before the install
        mine[0] = True
        with lock:
            for f in e0[:40].tolist():
                plans.observe(f)
            for f in range(10):
                idx.remove(f)
            for f in range(n // 2, n // 2 + 10):
                idx.admit(f, 1)
        mine[0] = False
        return lambda version: {}

    plans.preparers.append(meanwhile)
    heavy = {"_nearest_use", "Plan.next_positions", "Plan.next_position", "PlanPolicy._rehome_many",
             "PlanPolicy._rehome", "PlanPolicy._fixup", "PlanPolicy._compute"}
    under = []

    def profile(frame, event, arg):
        if event == "call" and lock.held and not mine[0] and frame.f_code.co_qualname in heavy:
            under.append(frame.f_code.co_qualname)

    sys.setprofile(profile)
    try:
        plans.announce(h, 1, 0, [n], e1)
    finally:
        sys.setprofile(None)
    assert under == []                                # no file re-keyed, no next use looked up under the lock
    # exactly what changed meanwhile waits to be re-keyed: the 40 opened files, the 10 gone, the 10 come in
    assert pol.prepared == 2
    assert pol._catch_up == set(e0[:40].tolist()) | set(range(10)) | set(range(n // 2, n // 2 + 10))
    expect = belady_victim(plans, idx)
    newcomer = next(f for f in e1.tolist() if f not in idx and plans.distance(f) < n)
    with lock:                                        # (a planned newcomer, its open not yet followed)
        assert idx.admit(newcomer, 1) == [expect]     # the next search re-keyed them: Belady's victim
    assert pol.rebuilds == 0 and len(pol._catch_up) == 0


def test_a_plan_that_ends_gets_the_next_structure_built_off_the_lock():
    n = 4000
    lock = SpyLock()
    plans = PlanRegistry(n, lock)
    pol = PlanPolicy(get_policy("lru")(n // 2, Importance(n)), plans)
    idx = TierIndex("ram", n // 2, pol)
    for f in range(n // 2):
        idx.admit(f, 1)
    h, _ = plans.register(None, np.arange(n))
    rng = np.random.default_rng(4)
    short = rng.permutation(n)[:300].astype(np.uint32)          # stream 0: 300 positions, read to the end
    long_ = rng.permutation(n).astype(np.uint32)                # stream 1: a whole epoch
    plans.start()
    try:
        plans.announce(h, 0, 0, [len(short)], short)
        plans.announce(h, 1, 0, [n], long_)
        assert plans.version == plans._installed_version       # both installed by their announcements

        def search(newcomer):  # a planned newcomer (its open not yet followed): Belady decides
            with lock:
                return idx.admit(newcomer, 1)

        for f in short.tolist():                                # stream 0 finishes: the plan set changes
            with lock:
                plans.observe(f)
                if f not in idx:
                    idx.admit(f, 1)
        assert (h, 0) not in plans.plans and plans.finished == 1
        seen = calls_by_lock(lock, lambda: search(next(f for f in long_.tolist() if f not in idx and plans.distance(f) < n)))
        assert {name for name, held in seen if held} == set()  # no rebuild at the search after the end
        deadline = time.monotonic() + 30
        while plans.reinstalls < 1:                             # the installer thread swaps the next one in
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert plans.version == plans._installed_version and pol._version == plans.version
        for _ in range(3):
            expect = belady_victim(plans, idx)
            assert search(next(f for f in long_.tolist() if f not in idx and plans.distance(f) < n)) == [expect]
        assert pol.rebuilds == 0 and pol.prepared == 3
    finally:
        plans.stop()


def test_a_confirmation_carries_what_was_consumed_meanwhile_without_numpy_under_the_lock():
    n = 4000
    lock = SpyLock()
    plans = PlanRegistry(n, lock, window=512)
    pol = PlanPolicy(get_policy("lru")(n // 2, Importance(n)), plans)
    idx = TierIndex("ram", n // 2, pol)
    for f in range(n // 2):
        idx.admit(f, 1)
    h, _ = plans.register(None, np.arange(n))
    rng = np.random.default_rng(5)
    e0, e1 = rng.permutation(n).astype(np.uint32), rng.permutation(n).astype(np.uint32)
    plans.announce(h, 0, 0, [n, n], np.concatenate([e0, e1]))
    order = e0[:300].copy()
    rng.shuffle(order[100:])                          # out of order within the window, as workers open
    with lock:
        for f in order[:100].tolist():
            plans.observe(f)
    mine = [False]

    def meanwhile(active):
        # runs while the confirmation is prepared, before the tier takes its snapshot: 200 more opens of
        # epoch 0, and a skip of 5 positions whose opens never came (the cursor passes them)
        mine[0] = True
        with lock:
            for f in order[100:].tolist():
                plans.observe(f)
            old = plans.plans[(h, 0)]
            old._skip_to(old.pos + 5)
        mine[0] = False
        return lambda version: {}

    plans.preparers.insert(0, meanwhile)              # before the tier's preparation: it does not see them
    heavy = {"carry", "carry_positions", "_consume", "Plan.groups",
             "flatnonzero", "_nearest_use", "Plan.next_positions", "PlanPolicy._rehome_many"}
    under = []

    def profile(frame, event, arg):
        name = frame.f_code.co_qualname if event == "call" else getattr(arg, "__name__", "") if event == "c_call" else ""
        if lock.held and not mine[0] and (name in heavy or name == "at"):
            under.append(name)

    old = plans.plans[(h, 0)]
    sys.setprofile(profile)
    try:
        plans.announce(h, 0, 0, [n, n], np.concatenate([e0, e1]))  # the lookahead confirmed, same order
    finally:
        sys.setprofile(None)
    assert under == []                                # the carry ran off the lock, numpy and all
    new = plans.plans[(h, 0)]
    assert new is not old and old.journal is None
    assert (old.matched, old.skipped, old.unmatched) == (300, 5, 0)
    assert new.matched == 305 and new.pos == old.pos == 305  # (a carried skip counts as matched)
    assert np.array_equal(new.consumed, old.consumed)
    assert np.array_equal(new.ptr, old.ptr)           # each file's next use as the old plan had it
    assert new.next_positions(np.arange(n)).tolist() == old.next_positions(np.arange(n)).tolist()
    expect = belady_victim(plans, idx)
    newcomer = next(f for f in e0[400:].tolist() if f not in idx)
    with lock:                                        # the files consumed meanwhile were re-keyed
        assert idx.admit(newcomer, 1) == [expect]
