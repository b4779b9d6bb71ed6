"""The policy contract, parametrized over every registered policy, with exact hit counts on small
hand-written traces (replayed through TierIndex exactly as the daemon and the simulator do)."""
import numpy as np
import pytest

from shadefs.cache.index import TierIndex
from shadefs.policies import Importance, PolicyError, get_policy, policy_names


def replay(policy, trace, sizes, capacity, num_files=16):
    imp = Importance(num_files)
    idx = TierIndex("ram", capacity, get_policy(policy)(capacity, imp))
    hits = 0
    for name in trace:
        fid = ord(name) - ord("a")
        if fid in idx:
            idx.hit(fid)
            hits += 1
        else:
            idx.admit(fid, sizes.get(name, 1))
        assert idx.used_bytes + idx.reserved_bytes <= capacity
    return hits, idx


# trace, sizes, capacity, expected hits per policy (shade without scores behaves as static)
CASES = [
    # static: a,b admitted; c refused; a,b hit; d refused; a hit = 3.
    # lru/fifo: every request after the first two evicts the one needed next = 0 hits.
    ("abcabda", {}, 2, {"static": 3, "lru": 0, "fifo": 0}),
    # lru: a,b; a hit (b oldest); c evicts b; a hit = 2.  fifo: a hit keeps a oldest; c evicts a; a miss = 1.
    ("abaca", {}, 2, {"static": 2, "lru": 2, "fifo": 1}),
    # variable sizes, capacity 10: static admits a(6), refuses b(5), a hit, admits c(4), a hit, refuses b = 2.
    # lru: b evicts a; a evicts b; c fits; a hit; b must evict c then a = 1.  fifo: same misses, b evicts a only = 1.
    ("abacab", {"a": 6, "b": 5, "c": 4}, 10, {"static": 2, "lru": 1, "fifo": 1}),
    # a file larger than the tier is never admitted by any policy
    ("zz", {"z": 11}, 10, {"static": 0, "lru": 0, "fifo": 0}),
]


@pytest.mark.parametrize("policy", policy_names())
@pytest.mark.parametrize("trace,sizes,capacity,expected", CASES)
def test_exact_hits(policy, trace, sizes, capacity, expected):
    want = expected.get(policy, expected["static"] if policy == "shade" else None)
    if want is None:
        pytest.skip(f"no hand-computed answer for {policy}")
    hits, _ = replay(policy, trace, sizes, capacity)
    assert hits == want


@pytest.mark.parametrize("policy", policy_names())
def test_capacity_zero_admits_nothing(policy):
    hits, idx = replay(policy, "aaaa", {}, 0)
    assert hits == 0 and len(idx) == 0


def _state(idx):
    return (dict(idx.sizes), dict(idx.pending), idx.used_bytes, idx.reserved_bytes, idx.evictions,
            getattr(idx.policy, "ranking", lambda: None)())


@pytest.mark.parametrize("policy", ["static", "shade"])
def test_a_policy_refusal_changes_nothing(policy):
    """A file that FITS the tier (1 byte of 2), refused by the policy itself: static never evicts; shade
    keeps residents more important than the newcomer. Nothing changes, not even the ranking."""
    imp = Importance(16)
    idx = TierIndex("ram", 2, get_policy(policy)(2, imp))
    assert idx.admit(0, 1) == [] and idx.admit(1, 1) == []
    imp.update(np.array([0, 1, 2], dtype=np.int64), np.array([5.0, 3.0, 1.0], dtype=np.float32))
    before = _state(idx)
    assert idx.reserve(2, 1) is None
    assert _state(idx) == before
    assert 2 not in idx


@pytest.mark.parametrize("policy", ["lru", "fifo"])
def test_recency_policies_never_refuse_a_file_that_fits(policy):
    _, idx = replay(policy, "ab", {}, 2)
    assert idx.reserve(2, 1) == [0]  # the oldest goes; the newcomer's byte is reserved
    assert sorted(idx.sizes) == [1] and idx.reserved_bytes == 1 and idx.evictions == 1


@pytest.mark.parametrize("policy", policy_names())
def test_the_index_refuses_a_file_larger_than_the_tier_before_asking_the_policy(policy):
    _, idx = replay(policy, "ab", {}, 2)
    before = _state(idx)
    assert idx.reserve(5, 3) is None
    assert _state(idx) == before


def test_lru_victim_order():
    _, idx = replay("lru", "abc", {}, 3)
    idx.hit(0)  # a is now most recent: order b, c, a
    assert idx.admit(3, 2) == [1, 2]
    assert sorted(idx.sizes) == [0, 3]
    assert idx.evictions == 2


def test_unknown_policy_lists_names():
    with pytest.raises(PolicyError, match="static"):
        get_policy("nope")
