"""The daemon's memory bounds, in process: the fill-buffer accounting, one size per resident, listings by
slice (docs/operations.md, "The daemon's memory")."""
import threading

import pytest

from shadefs.backends.base import Entry
from shadefs.cache.buffers import FillBuffers, tune_malloc
from shadefs.cache.index import TierIndex
from shadefs.fuse.ops import listdir_slice
from shadefs.namespace import Namespace
from shadefs.plan.plans import PlanRegistry
from shadefs.plan.policy import PlanPolicy
from shadefs.policies.base import Importance, get_policy


def test_fill_buffers_grant_within_the_bound_and_one_oversize_read_alone():
    fb = FillBuffers(100)
    assert fb.take(60) == 60 and fb.try_take(50) == 0 and fb.try_take(40) == 40
    assert fb.snapshot() == {"bound_bytes": 100, "used_bytes": 100, "high_water_bytes": 100, "waits": 0,
                             "refused": 1, "oversize": 0}
    got = []
    t = threading.Thread(target=lambda: got.append(fb.take(30)))
    t.start()
    with fb.cond:  # the taker waits for room: counted once it waits
        assert fb.cond.wait_for(lambda: fb.waits == 1, timeout=10)
    assert got == []
    fb.give(60)
    t.join(10)
    assert got == [30] and fb.used == 70
    fb.give(40)
    fb.give(30)
    assert fb.take(250) == 250  # nothing else in flight: larger than the bound, it runs alone
    assert fb.try_take(1) == 0
    fb.give(250)
    assert fb.snapshot() == {"bound_bytes": 100, "used_bytes": 0, "high_water_bytes": 250, "waits": 1,
                             "refused": 2, "oversize": 1}
    assert fb.take(0) == 0 and fb.try_take(-1) == 0
    with pytest.raises(ValueError):
        FillBuffers(0)


def test_tune_malloc_sets_glibc_options():
    assert tune_malloc() is True


@pytest.mark.parametrize("inner", ["lru", "fifo", "shade", "static"])
def test_the_policy_reads_the_tier_index_sizes_and_keeps_none_itself(inner):
    imp = Importance(10)
    pol = PlanPolicy(get_policy(inner)(300, imp), PlanRegistry(10))
    idx = TierIndex("ram", 300, pol)
    assert pol.sizes is idx.sizes and pol.inner.sizes is idx.sizes and not pol.owns_sizes
    assert [idx.admit(f, 100) for f in (1, 2, 3)] == [[], [], []]
    assert idx.sizes == {1: 100, 2: 100, 3: 100}
    own = getattr(pol.inner, "_order", None)
    if own is not None:  # lru, fifo: the order only, no sizes
        assert list(own.items()) == [(1, None), (2, None), (3, None)]
    levels = getattr(pol.inner, "_levels", None)
    if levels is not None:  # shade: the levels hold ids only
        assert [list(v.items()) for v in levels.values()] == [[(1, None), (2, None), (3, None)]]
    imp.update([4], [2.0])  # more important than the residents (shade admits only such a newcomer)
    victims = idx.admit(4, 150)
    assert victims == (None if inner == "static" else [1, 2])
    assert idx.used_bytes == sum(idx.sizes.values())


def test_a_policy_alone_keeps_its_own_sizes():
    pol = get_policy("lru")(300)
    for f in (1, 2, 3):
        pol.on_insert(f, 100)
    assert pol.owns_sizes and pol.sizes == {1: 100, 2: 100, 3: 100}
    assert pol.victims(4, 150, 0) == [1, 2]
    pol.on_remove(1)
    assert pol.sizes == {2: 100, 3: 100}


def test_listdir_slice_is_the_listing_s_slice():
    ns = Namespace([Entry(f"d/{i:03d}", i, 0) for i in range(50)] + [Entry("d/sub/x", 1, 0)])
    d = ns.child(ns.root, "d")
    whole = ns.listdir(d)
    assert len(whole) == 51
    for a, b in ((0, 0), (0, 7), (7, 20), (45, 60), (60, 70)):
        assert ns.listdir_slice(d, a, b) == whole[a:b]
        assert listdir_slice(ns, d, a, b) == whole[a:b]


def test_a_read_larger_than_the_bound_waiting_to_run_alone_holds_back_new_reads():
    fb = FillBuffers(100)
    assert fb.take(60) == 60
    got = []
    big = threading.Thread(target=lambda: got.append(fb.take(250)))
    big.start()
    with fb.cond:
        assert fb.cond.wait_for(lambda: fb.waits == 1, timeout=10)
    assert fb.try_take(10) == 0  # room for it, but the large read waits first
    small = threading.Thread(target=lambda: got.append(fb.take(10)))
    small.start()
    with fb.cond:
        assert fb.cond.wait_for(lambda: fb.waits == 2, timeout=10)
    fb.give(60)
    big.join(10)
    assert got == [250] and fb.used == 250
    fb.give(250)
    small.join(10)
    assert got == [250, 10] and fb.snapshot() == {"bound_bytes": 100, "used_bytes": 10, "high_water_bytes": 250,
                                                  "waits": 2, "refused": 1, "oversize": 1}
