"""TierIndex: exact byte budgets with in-flight fills, and the budget enforced against a bad policy."""
import pytest

from shadefs.cache.index import AlreadyInTier, TierIndex
from shadefs.policies.base import Policy
from shadefs.policies.lru import LRUPolicy
from shadefs.policies.static import StaticPolicy


def test_reserved_bytes_count_against_the_budget():
    idx = TierIndex("ram", 10, StaticPolicy(10))
    assert idx.reserve(1, 6) == []
    assert idx.reserved_bytes == 6 and idx.used_bytes == 0
    assert idx.reserve(2, 5) is None          # 6 in flight + 5 > 10
    assert idx.reserve(3, 4) == []
    idx.commit(1)
    idx.abort(3)
    assert (idx.used_bytes, idx.reserved_bytes, len(idx)) == (6, 0, 1)
    with pytest.raises(AlreadyInTier):        # already resident: not a refusal, a caller bug
        idx.reserve(1, 6)
    assert idx.reserve(4, 4) == []
    with pytest.raises(AlreadyInTier):        # already pending
        idx.reserve(4, 4)
    assert (idx.used_bytes, idx.reserved_bytes, len(idx)) == (6, 4, 1)


def test_budget_is_enforced_not_trusted():
    class Liar(Policy):
        name = "liar"

        def victims(self, fid, size, free_bytes):
            return []  # claims everything fits

    idx = TierIndex("ram", 10, Liar(10))
    assert idx.admit(1, 8) == []
    assert idx.admit(2, 8) is None
    assert idx.used_bytes == 8


def test_victims_must_be_resident():
    class Ghost(Policy):
        name = "ghost"

        def victims(self, fid, size, free_bytes):
            return [99] if size > free_bytes else []

    idx = TierIndex("ram", 10, Ghost(10))
    idx.admit(1, 8)
    assert idx.admit(2, 8) is None and 1 in idx


def test_snapshot_and_evictions():
    idx = TierIndex("disk", 4, LRUPolicy(4))
    for fid in range(6):
        idx.admit(fid, 1)
    assert idx.snapshot() == {"used_bytes": 4, "capacity_bytes": 4, "files": 4, "evictions": 2}


def test_duplicate_victims_are_refused():
    class Twice(Policy):
        name = "twice"

        def victims(self, fid, size, free_bytes):
            return [1, 1] if size > free_bytes else []

    idx = TierIndex("ram", 10, Twice(10))
    assert idx.admit(1, 6) == [] and idx.admit(2, 4) == []
    assert idx.reserve(3, 10) is None          # 1 named twice would "free" 12 bytes
    assert (idx.used_bytes, sorted(idx.sizes), idx.evictions) == (10, [1, 2], 0)


def test_held_victims_stay_counted_until_released():
    idx = TierIndex("disk", 10, LRUPolicy(10))
    assert idx.admit(1, 6) == [] and idx.admit(2, 4) == []
    assert idx.reserve(3, 8, hold_victims=True) == [1, 2]
    # the victims' 10 bytes are still on the store: the fill is credited with them, nothing else fits
    assert (idx.used_bytes, idx.dying_bytes, idx.reserved_bytes, idx.free_bytes) == (0, 10, 0, 0)
    assert idx.reserve(4, 1) is None
    idx.release(3)                             # victims deleted: 8 reserved, 2 free
    assert (idx.dying_bytes, idx.reserved_bytes, idx.free_bytes) == (0, 8, 2)
    idx.commit(3)
    assert (idx.used_bytes, idx.reserved_bytes, idx.free_bytes) == (8, 0, 2)
    assert idx.remove(3, dying=True) and (idx.used_bytes, idx.dying_bytes, idx.free_bytes) == (0, 8, 2)
    idx.unlinked(8)
    assert idx.free_bytes == 10


def test_a_smaller_fill_than_its_victims_never_counts_more():
    idx = TierIndex("disk", 10, LRUPolicy(10))
    idx.admit(1, 9)
    assert idx.reserve(2, 2, hold_victims=True) == [1]
    assert (idx.dying_bytes, idx.reserved_bytes, idx.free_bytes) == (9, 0, 1)
    idx.abort(2)
    assert (idx.dying_bytes, idx.reserved_bytes, idx.free_bytes) == (0, 0, 10)


def test_pinned_victims_leave_the_tier_while_the_spill_room_covers_them():
    # RAM tier: victims 1 and 2 are held open (pinned); 5 bytes may be held outside the tier
    idx = TierIndex("ram", 10, LRUPolicy(10))
    spilled = []
    idx.pinned = {1: None, 2: None}
    idx.spill_room = lambda: 5
    idx.spill = lambda fid, n: spilled.append((fid, n))
    for f, n in ((1, 3), (2, 3), (3, 4)):
        assert idx.admit(f, n) == []
    assert idx.reserve(4, 3) == [1]            # the policy's victim, credited: no extra victim
    assert spilled == [(1, 3)] and (idx.used_bytes, idx.dying_bytes, idx.reserved_bytes) == (7, 0, 3)
    idx.commit(4)
    idx.spill_room = lambda: 2                 # 2 (3 bytes) no longer fits outside: it stays dying here
    assert idx.reserve(5, 3) == [2, 3]         # ... and the policy is asked for more (3)
    assert spilled == [(1, 3)] and (idx.used_bytes, idx.dying_bytes, idx.reserved_bytes) == (3, 3, 3)
    assert idx.used_bytes + idx.reserved_bytes + idx.dying_bytes <= 10
    idx.unlinked(3)
    assert idx.dying_bytes == 0


@pytest.mark.parametrize("policy", ["lru", "fifo", "static", "shade"])
def test_would_admit_is_reserves_answer_and_changes_nothing(policy):
    import random

    from shadefs.policies import Importance, get_policy

    rng = random.Random(policy)
    imp = Importance(200)
    imp.values[:] = [rng.random() for _ in range(200)]
    idx = TierIndex("ram", 1000, get_policy(policy)(1000, imp))
    for _ in range(400):
        fid, size = rng.randrange(200), rng.randrange(1, 400)
        if fid in idx.sizes:
            idx.hit(fid)
            continue
        before = (idx.snapshot(), dict(idx.sizes), idx.reserved_bytes, idx.evictions)
        answer = idx.would_admit(fid, size)
        assert (idx.snapshot(), dict(idx.sizes), idx.reserved_bytes, idx.evictions) == before
        victims = idx.reserve(fid, size)
        assert answer == (victims is not None), (fid, size)
        if victims is not None:
            idx.commit(fid)
    assert idx.would_admit(next(iter(idx.sizes)), 1) is False  # resident: never admitted again
