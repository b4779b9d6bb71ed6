"""ShadePolicy (importance-aware admission, SHADE FAST '23) and the score transforms.

Exact victims on hand-written cases through TierIndex, the tie order, re-ranking after importance
updates, refusals that change nothing, "no scores => exactly static", and a brute-force model on random
traces with random importance updates."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from shadefs.cache.index import AlreadyInTier, TierIndex
from shadefs.policies import Importance, PolicyError, get_policy, policy_names
from shadefs.policies.shade import TRANSFORMS, ShadePolicy, get_transform, rank_transform, raw_transform
from shadefs.policies.static import StaticPolicy

TRACE = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make(capacity, n=16, importance=True):
    imp = Importance(n) if importance else None
    return TierIndex("ram", capacity, ShadePolicy(capacity, imp)), imp


def state(tier):
    return dict(tier.sizes), tier.policy.ranking(), dict(tier.policy._level_of)


# -- transforms ---------------------------------------------------------------------------------

def test_rank_transform_matches_shade():
    w = rank_transform(np.array([0.5, 0.1, 0.9, 0.3], dtype=np.float32))
    assert w.dtype == np.float32
    np.testing.assert_allclose(w, np.log([12, 10, 13, 11]).astype(np.float32))
    # a batch of 64: lowest loss ln 10 = 2.3026, highest ln 73 = 4.2905 (SHADE.md 2.2)
    w64 = rank_transform(np.arange(64, 0, -1, dtype=np.float32))
    assert math.isclose(w64.min(), math.log(10), rel_tol=1e-6)
    assert math.isclose(w64.max(), math.log(73), rel_tol=1e-6)
    assert w64[0] == w64.max()


def test_rank_transform_ties_are_stable_by_position():
    np.testing.assert_allclose(rank_transform(np.array([2.0, 1.0, 2.0, 1.0])),
                               np.log([12, 10, 13, 11]).astype(np.float32))


def test_rank_transform_edges():
    assert rank_transform(np.array([], dtype=np.float32)).shape == (0,)
    assert rank_transform([7.0]).tolist() == [pytest.approx(math.log(10))]
    with pytest.raises(ValueError):
        rank_transform(np.zeros((2, 2)))
    with pytest.raises(ValueError):
        rank_transform(np.array([1.0, np.nan]))


def test_raw_transform_and_registry():
    src = np.array([0.5, 2.0])
    out = raw_transform(src)
    assert out.dtype == np.float32 and out.tolist() == [0.5, 2.0]
    out[0] = 9
    assert src[0] == 0.5  # a copy
    assert TRANSFORMS == {"rank": rank_transform, "raw": raw_transform}
    assert get_transform("rank") is rank_transform
    with pytest.raises(PolicyError, match="rank, raw"):
        get_transform("softmax")


def test_registered():
    assert get_policy("shade") is ShadePolicy
    assert "shade" in policy_names()


# -- hand-written cases -------------------------------------------------------------------------

def test_admits_while_it_fits_then_only_more_important():
    tier, imp = make(100)
    assert tier.admit(0, 40) == []
    assert tier.admit(1, 40) == []
    imp.update(np.array([0, 1]), np.array([3.0, 2.0], dtype=np.float32))
    assert tier.admit(2, 30) is None                      # importance 1.0 beats nothing
    imp.update(np.array([2]), np.array([2.0], dtype=np.float32))
    assert tier.admit(2, 30) is None                      # equal is not strictly higher
    imp.update(np.array([2]), np.array([2.5], dtype=np.float32))
    assert tier.admit(2, 30) == [1]                       # the least important goes
    assert sorted(tier.sizes) == [0, 2] and tier.evictions == 1
    assert tier.admit(3, 20) == []                        # fits in the freed space
    assert tier.used_bytes == 90


def test_several_victims_lowest_first():
    tier, imp = make(100)
    for f in range(4):
        tier.admit(f, 25)
    imp.update(np.arange(4), np.array([2, 3, 4, 5], dtype=np.float32))
    imp.update(np.array([9]), np.array([4.5], dtype=np.float32))
    assert tier.admit(9, 60) == [0, 1, 2]
    assert sorted(tier.sizes) == [3, 9]


def test_refusal_when_a_needed_victim_is_not_less_important_changes_nothing():
    tier, imp = make(100)
    for f in range(4):
        tier.admit(f, 25)
    tier.hit(2)
    imp.update(np.arange(4), np.array([2, 3, 4, 5], dtype=np.float32))
    imp.update(np.array([9]), np.array([3.5], dtype=np.float32))
    before = state(tier)
    assert tier.admit(9, 60) is None                      # would need file 2 (4.0 >= 3.5)
    assert tier.policy.victims(9, 60, 0) is None
    assert state(tier) == before and tier.evictions == 0
    assert tier.admit(9, 50) == [0, 1]                    # two victims suffice: admitted


def test_ties_least_recently_accessed_inserted_or_scored_first():
    tier, imp = make(30)
    for f in (0, 1, 2):
        tier.admit(f, 10)
    assert tier.policy.ranking() == [0, 1, 2]             # all 1.0: insertion order
    tier.hit(0)
    assert tier.policy.ranking() == [1, 2, 0]             # least recently used first
    tier.hit(1)
    assert tier.policy.ranking() == [2, 0, 1]
    imp.update(np.array([2]), np.array([1.0], dtype=np.float32))
    assert tier.policy.ranking() == [0, 1, 2]             # a score, even unchanged, counts as an access
    imp.update(np.array([5]), np.array([2.0], dtype=np.float32))
    assert tier.admit(5, 10) == [0]
    imp.update(np.array([6]), np.array([2.0], dtype=np.float32))
    assert tier.admit(6, 20) == [1, 2]


def test_reranks_after_updates():
    tier, imp = make(30)
    for f in (0, 1, 2):
        tier.admit(f, 10)
    imp.update(np.array([0, 1, 2]), np.array([3.0, 2.0, 4.0], dtype=np.float32))
    assert tier.policy.ranking() == [1, 0, 2]
    imp.update(np.array([2, 7]), np.array([1.5, 9.0], dtype=np.float32))   # 7 is not resident
    assert tier.policy.ranking() == [2, 1, 0]
    imp.update(np.array([1, 1]), np.array([5.0, 0.5], dtype=np.float32))   # repeated id: last wins
    assert tier.policy.ranking() == [1, 2, 0]
    imp.update(np.array([2, 0]), np.array([3.0, 3.0], dtype=np.float32))   # same level: ascending id
    assert tier.policy.ranking() == [1, 0, 2]
    assert tier.admit(7, 10) == [1]


def test_rerank_walks_residents_on_a_huge_update():
    tier, imp = make(30, n=1000)
    for f in (10, 20, 30):
        tier.admit(f, 10)
    vals = np.linspace(5, 1, 1000).astype(np.float32)     # file 30 now least important
    imp.update(np.arange(1000), vals)
    assert tier.policy.ranking() == [30, 20, 10]


def test_removal_and_abort():
    tier, imp = make(30)
    for f in (0, 1, 2):
        tier.admit(f, 10)
    tier.remove(1)
    assert tier.policy.ranking() == [0, 2]
    imp.update(np.array([4]), np.array([3.0], dtype=np.float32))
    assert tier.reserve(4, 20) == [0]        # 10 free, one victim; 4 is pending, not ranked yet
    assert tier.policy.ranking() == [2]
    tier.abort(4)
    assert tier.policy.ranking() == [2] and tier.used_bytes == 10


def test_too_big_never_admitted_and_no_importance_is_static():
    tier, _ = make(100, importance=False)
    assert tier.admit(0, 101) is None
    assert tier.admit(0, 100) == []
    assert tier.admit(1, 1) is None


def test_pending_bytes_are_not_evictable():
    tier, imp = make(30)
    assert tier.reserve(0, 20) == []
    imp.update(np.array([1]), np.array([9.0], dtype=np.float32))
    assert tier.admit(1, 20) is None         # only pending bytes could make room
    tier.commit(0)
    assert tier.admit(1, 20) == [0]


def test_transform_feeds_importance():
    tier, imp = make(20)
    tier.admit(0, 10)
    tier.admit(1, 10)
    imp.update(np.array([0, 1, 2]), rank_transform(np.array([0.3, 0.9, 0.1])))  # ranks 1, 2, 0
    assert tier.policy.ranking() == [0, 1]
    assert tier.admit(2, 10) is None         # ln 10 < ln 11
    imp.update(np.array([2, 3]), rank_transform(np.array([5.0, 1.0])))
    assert tier.admit(2, 10) is None         # ln 11 is not above file 0's ln 11
    imp.update(np.array([2, 3, 4]), rank_transform(np.array([5.0, 1.0, 2.0])))
    assert tier.admit(2, 10) == [0]          # ln 12 beats ln 11


# -- properties on random traces ----------------------------------------------------------------

N_FILES = 12
sizes_st = st.lists(st.integers(1, 40), min_size=N_FILES, max_size=N_FILES)
op_st = st.tuples(st.sampled_from(["access"] * 6 + ["remove", "reserve_abort"]), st.integers(0, N_FILES - 1))


@TRACE
@given(st.integers(0, 120), sizes_st, st.lists(op_st, min_size=20, max_size=150), st.booleans())
def test_without_scores_shade_is_exactly_static(capacity, sizes, ops, with_importance):
    imp = Importance(N_FILES) if with_importance else None
    shade = TierIndex("ram", capacity, ShadePolicy(capacity, imp))
    static = TierIndex("ram", capacity, StaticPolicy(capacity, imp))
    for op, fid in ops:
        if op == "access":
            if fid in static:
                assert fid in shade
                static.hit(fid)
                shade.hit(fid)
            else:
                assert static.admit(fid, sizes[fid]) == shade.admit(fid, sizes[fid])
        elif op == "remove":
            assert static.remove(fid) == shade.remove(fid)
        elif fid in static:
            assert fid in shade  # reserving a resident file is a caller bug, not a refusal
            with pytest.raises(AlreadyInTier):
                shade.reserve(fid, sizes[fid])
        else:
            got = static.reserve(fid, sizes[fid])
            assert got == shade.reserve(fid, sizes[fid])
            if got is not None:
                static.abort(fid)
                shade.abort(fid)
        assert static.sizes == shade.sizes
    assert static.evictions == shade.evictions == 0


class Model:
    """Brute force: sort every resident by (importance, last access/insert/score) on each decision."""

    def __init__(self, capacity, importance):
        self.capacity, self.imp = capacity, importance
        self.sizes, self.last, self.seq = {}, {}, 0

    def key(self, f):
        return (self.imp.values[f], self.last[f])

    def scored(self, fids):
        for f in sorted(set(fids)):   # the ids of one update, ascending
            if f in self.sizes:
                self.hit(f)

    def reserve(self, fid, size):
        """The victims of admitting ``fid`` (removed), or None; ``fid`` itself is not made resident."""
        if size > self.capacity or fid in self.sizes:
            return None
        free = self.capacity - sum(self.sizes.values())
        if size <= free:
            out = []
        else:
            order = sorted(self.sizes, key=self.key)
            out, freed = [], 0
            for f in order:
                if self.imp.values[f] >= self.imp.values[fid]:
                    return None
                out.append(f)
                freed += self.sizes[f]
                if freed >= size - free:
                    break
            else:
                return None
        for f in out:
            self.remove(f)
        return out

    def admit(self, fid, size):
        out = self.reserve(fid, size)
        if out is not None:
            self.seq += 1
            self.sizes[fid], self.last[fid] = size, self.seq
        return out

    def hit(self, fid):
        self.seq += 1
        self.last[fid] = self.seq

    def remove(self, fid):
        if self.sizes.pop(fid, None) is None:
            return False
        del self.last[fid]
        return True


update_st = st.tuples(st.just("update"), st.lists(st.integers(0, N_FILES - 1), min_size=1, max_size=N_FILES),
                      st.lists(st.sampled_from([0.5, 1.0, 2.0, 2.5, 3.0]), min_size=N_FILES, max_size=N_FILES))


def drain(policy, limit=3):
    rounds = 0
    while policy.apply_pending(limit):
        rounds += 1
        assert rounds < 10_000
    return rounds


def test_deferred_updates_wait_for_apply_pending_in_bounded_slices():
    imp = Importance(2000)
    tier = TierIndex("ram", 1000, ShadePolicy(1000, imp))
    woken = []
    tier.policy.defer(lambda: woken.append(1))
    for f in range(1000):
        tier.admit(f, 1)
    imp.update(np.arange(1000), np.linspace(5, 2, 1000).astype(np.float32))   # 999 least important
    assert woken == [1]
    assert tier.policy.ranking() == list(range(1000))        # not applied yet: a hit or admit never does
    tier.hit(5)                                               # deferred: only queued
    assert tier.policy.ranking() == list(range(1000))
    assert tier.policy.pending() == 1001
    assert tier.policy.apply_pending(256) is True             # the touch + 255 ids
    assert tier.policy.pending() == 745
    assert tier.policy.apply_pending(256) is True
    assert tier.policy.apply_pending(256) is True
    assert tier.policy.apply_pending(256) is False
    assert tier.policy.pending() == 0
    assert tier.policy.ranking() == list(range(999, -1, -1))


def test_deferred_queue_is_bounded_and_collapses_into_a_rescan():
    imp = Importance(100)
    tier = TierIndex("ram", 10, ShadePolicy(10, imp, max_pending=8))
    tier.policy.defer()
    for f in range(10):
        tier.admit(f, 1)
    for b in range(50):                                       # 50 batches of 5 ids: never 250 queued
        imp.update(np.arange(5) + 5 * (b % 20), np.full(5, 2.0 + b, dtype=np.float32))
        assert tier.policy._queued_ids <= 8
    assert tier.policy._rescan and not tier.policy._queued
    for f in range(20):
        tier.hit(f % 10)
    assert len(tier.policy._touches) == 8                     # the oldest touches were dropped
    drain(tier.policy, limit=16)
    assert tier.policy.pending() == 0 and not tier.policy._rescan
    # the last values: ids 0-4 got 2+40=42, 5-9 got 2+41=43: ranked by importance after the re-scan
    assert tier.policy.ranking() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert [tier.policy._level_of[f] for f in (0, 9)] == [42.0, 43.0]


def test_capacity_zero_does_not_subscribe():
    imp = Importance(10)
    ShadePolicy(0, imp)
    assert imp._listeners == []
    ShadePolicy(10, imp)
    assert len(imp._listeners) == 1


@TRACE
@given(st.integers(0, 120), sizes_st,
       st.lists(st.one_of(op_st, op_st, op_st, update_st), min_size=20, max_size=150), st.booleans())
@pytest.mark.slow
def test_matches_brute_force_model(capacity, sizes, ops, deferred):
    """Immediate mode, and deferred mode drained (in slices of 3) after every step, decide as the model."""
    imp = Importance(N_FILES)
    tier = TierIndex("ram", capacity, ShadePolicy(capacity, imp))
    if deferred:
        assert tier.policy.defer() is True
    model = Model(capacity, imp)
    for op in ops:
        if op[0] == "update":
            fids = np.array(op[1])
            imp.update(fids, np.array(op[2][:len(fids)], dtype=np.float32))
            model.scored(op[1])
            if deferred:
                drain(tier.policy)
            continue
        fid = op[1]
        if op[0] == "access":
            if fid in tier:
                tier.hit(fid)
                model.hit(fid)
            else:
                expected = model.admit(fid, sizes[fid])
                before = state(tier)
                got = tier.admit(fid, sizes[fid])
                assert got == expected
                if got is None:
                    assert state(tier) == before      # a refusal changes nothing
                else:
                    assert all(imp.values[v] < imp.values[fid] for v in got)
        elif op[0] == "remove":
            assert tier.remove(fid) == model.remove(fid)
        elif fid in tier:  # reserving a resident file is a caller bug, not a refusal
            assert op[0] == "reserve_abort", op
            with pytest.raises(AlreadyInTier):
                tier.reserve(fid, sizes[fid])
        else:  # reserve_abort: a fill that failed; its victims stay evicted, fid is not resident
            assert op[0] == "reserve_abort", op
            expected = model.reserve(fid, sizes[fid])
            before = state(tier)
            got = tier.reserve(fid, sizes[fid])
            assert got == expected
            if got is None:
                assert state(tier) == before          # a refusal changes nothing
            else:
                assert tier.reserved_bytes == sizes[fid]
                tier.abort(fid)
                assert fid not in tier and tier.reserved_bytes == 0
        if deferred:
            drain(tier.policy)
        assert tier.sizes == model.sizes
        assert tier.used_bytes <= capacity
    assert tier.policy.ranking() == sorted(model.sizes, key=model.key)
