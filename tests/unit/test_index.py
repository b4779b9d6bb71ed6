"""TierIndex: exact byte budgets with in-flight fills, and the budget enforced against a bad policy."""
from shadefs.cache.index import TierIndex
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
    assert idx.reserve(1, 6) is None          # already resident


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
