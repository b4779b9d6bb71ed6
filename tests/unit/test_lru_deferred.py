"""``lru`` with deferred hits (the daemon's mode, issue 9 item 3) makes exactly the decisions of ``lru``
applying each hit at once: queued touches are applied, in order, before every read or change of the
order, and the background slices apply them oldest first."""
import random

from hypothesis import given, settings, strategies as st

from shadefs.policies import get_policy
from shadefs.policies.fifo import FIFOPolicy
from shadefs.policies.lru import LRUPolicy

CAP = 10_000

# an operation: (kind, a file id 0-39, a size, a slice limit)
ops = st.lists(st.tuples(st.sampled_from(["hit", "hit", "hit", "admit", "insert", "remove", "apply"]),
                         st.integers(0, 39), st.integers(1, 3000), st.integers(1, 5)),
               max_size=300)


def run(policy, seq, deferred):
    """Apply ``seq`` as a tier would (admit = victims, remove them, insert); returns every decision."""
    resident = {}
    decisions = []
    for kind, fid, size, limit in seq:
        if kind == "hit":
            if fid in resident:
                policy.on_hit(fid)
        elif kind == "admit":
            if fid in resident:
                continue
            free = CAP - sum(resident.values())
            vs = policy.victims(fid, size, free)
            decisions.append(None if vs is None else list(vs))
            if vs is None:
                continue
            for v in vs:
                policy.on_remove(v)
                del resident[v]
            policy.on_insert(fid, size)
            resident[fid] = size
        elif kind == "insert":  # a commit after hits since its reservation, or a restore: no victims()
            if fid not in resident and sum(resident.values()) + size <= CAP:
                policy.on_insert(fid, size)
                resident[fid] = size
        elif kind == "remove":
            if fid in resident:
                policy.on_remove(fid)
                del resident[fid]
        elif deferred:
            policy.apply_pending(limit)
    # the final order, as the next eviction would see it
    decisions.append(policy.victims(-1, CAP, 0))
    return decisions


@settings(max_examples=300, deadline=None)
@given(ops)
def test_deferred_lru_decides_as_immediate_lru(seq):
    now = LRUPolicy(CAP)
    later = LRUPolicy(CAP)
    assert later.defer() is True
    assert run(later, seq, deferred=True) == run(now, seq, deferred=False)


def test_a_deferred_hit_is_queued_not_applied():
    p = LRUPolicy(CAP)
    p.defer()
    for f in (1, 2, 3):
        p.on_insert(f, 100)
    p.on_hit(1)
    p.on_hit(2)
    assert p.pending() == 2
    assert list(p._order) == [1, 2, 3]          # nothing moved yet: the hit only queued its id
    assert p.apply_pending(1) is True           # one applied (the oldest), one left
    assert list(p._order) == [2, 3, 1] and p.pending() == 1
    assert p.victims(9, 200, 0) == [3, 1]       # the eviction decision applies the rest first
    assert p.pending() == 0 and p.apply_pending(64) is False


def test_fifo_and_subclasses_defer_nothing():
    assert FIFOPolicy(CAP).defer() is False
    assert get_policy("fifo")(CAP).defer() is False
    p = get_policy("lru")(CAP)
    assert p.defer() is True and p.defer() is True  # idempotent
    p.on_insert(5, 10)
    p.on_hit(5)
    assert p.pending() == 1


def test_daemon_cache_defers_lru_hits_and_applies_them(tmp_path):
    """Through a TieredCache with its background thread: hits queue, the thread applies them within
    its period, and an eviction after hits evicts the least recently used file."""
    import time

    from shadefs.backends.posix import PosixBackend
    from shadefs.cache.core import TieredCache
    from shadefs.cache.index import TierIndex
    from shadefs.cache.tiers import MemoryTier
    from shadefs.namespace import Namespace
    from shadefs.policies import Importance

    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"f{i}.bin").write_bytes(bytes([i]) * 1000)
    backend = PosixBackend(str(src))
    ns = Namespace(backend.walk())
    imp = Importance(ns.num_files)
    pol = LRUPolicy(3000, imp)
    cache = TieredCache(ns, backend, (TierIndex("ram", 3000, pol), MemoryTier()), None, imp)
    ids = [ns.file_id(f"f{i}.bin") for i in range(4)]
    try:
        cache.start_background()
        assert pol.pending() == 0 and pol._touches is not None
        for f in ids[:3]:
            cache.open(f).release()              # misses: admitted in order 0, 1, 2
        cache.open(ids[0]).release()             # a hit: 0 becomes the most recent
        deadline = time.monotonic() + 10
        while pol.pending() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert pol.pending() == 0                # applied by the background thread
        cache.open(ids[1]).release()             # another hit, maybe still queued at the next miss
        cache.open(ids[3]).release()             # a miss: evicts 2, the least recently used
        assert sorted(f for f in ids if f in cache.ram_index) == sorted([ids[0], ids[1], ids[3]])
        assert cache.stats()["hits"]["ram"] == 2
    finally:
        cache.close()


def test_random_long_sequence_matches():
    rng = random.Random(7)
    seq = [(rng.choice(["hit"] * 6 + ["admit", "insert", "remove", "apply"]), rng.randrange(200),
            rng.randrange(1, 400), rng.randrange(1, 70)) for _ in range(20_000)]
    now, later = LRUPolicy(CAP), LRUPolicy(CAP)
    later.defer()
    assert run(later, seq, deferred=True) == run(now, seq, deferred=False)
