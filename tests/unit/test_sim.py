"""shadefs.sim: trace reading, policy replay, Belady's OPT, sweeps, scores files and the CLI helper.

Hit counts on hand-made traces are computed by hand in the comments (cache contents shown oldest
first for lru/fifo); OPT is also checked against an exhaustive search and a slow reference.
"""
from __future__ import annotations

import argparse
import functools
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shadefs import sim
from shadefs.policies import Importance, PolicyError, policy_names

ALL_POLICIES = policy_names()  # whatever is registered (shade too, once it lands)


def T(spec, sizes=None):
    """A trace from 'a b c ...'; ``sizes`` maps a name to bytes (default 1 byte each)."""
    names = spec.split()
    return sim.Trace.from_requests(names, None if sizes is None else [sizes[p] for p in names])


# -- policies on hand-made traces --------------------------------------------------------------------

# T1 = a b c a b d a b c d (positions 0..9); a: 0,3,6  b: 1,4,7  c: 2,8  d: 5,9. Unit sizes.
T1 = "a b c a b d a b c d"


@pytest.mark.parametrize("policy,cache,hits", [
    # static keeps the first `cache` distinct files (a, b, c, d) forever; hits = their later accesses.
    ("static", 1, 2),   # {a}: a@3, a@6
    ("static", 2, 4),   # {a,b}: + b@4, b@7
    ("static", 3, 5),   # {a,b,c}: + c@8
    ("static", 4, 6),   # everything: 10 requests - 4 cold misses
    # lru, cache 1: every access differs from the previous one -> 0.
    ("lru", 1, 0),
    # lru, cache 2: a [a]; b [a b]; c -a [b c]; a -b [c a]; b -c [a b]; d -a [b d]; a -b [d a];
    # b -d [a b]; c -a [b c]; d -b [c d]: 0 hits (each file returns after 2 others).
    ("lru", 2, 0),
    # lru, cache 3: a b c [a b c]; a hit [b c a]; b hit [c a b]; d -c [a b d]; a hit [b d a];
    # b hit [d a b]; c -d [a b c]; d -a [b c d]: 4 hits.
    ("lru", 3, 4),
    ("lru", 4, 6),
    ("fifo", 1, 0),
    ("fifo", 2, 0),     # no hits at all, so identical to lru
    # fifo, cache 3: a b c [a b c]; a hit, b hit (order unchanged); d -a [b c d]; a -b [c d a];
    # b -c [d a b]; c -d [a b c]; d -a [b c d]: 2 hits (lru: 4).
    ("fifo", 3, 2),
    ("fifo", 4, 6),
])
def test_policy_hits_unit_sizes(policy, cache, hits):
    r = sim.simulate(T(T1), policy, cache)
    assert (r.policy, r.cache_bytes, r.hits, r.requests) == (policy, cache, hits, 10)
    assert r.hit_bytes == hits and r.request_bytes == 10
    assert r.hit_ratio == hits / 10 and r.byte_hit_ratio == hits / 10


SIZES = {"a": 4, "b": 3, "c": 3, "d": 6}


@pytest.mark.parametrize("spec,policy,cache,hits,hit_bytes", [
    # a b c a d b a, cache 10 bytes (a=4 b=3 c=3 d=6).
    # static: a (4) b (7) c (10) full; a hit; d refused (6 > 0 free); b hit; a hit: 3 hits, 4+3+4 bytes.
    ("a b c a d b a", "static", 10, 3, 11),
    # lru: [a b c] 10; a hit [b c a]; d needs 6: evict b (3), c (3) -> [a d] 10; b needs 3, 0 free:
    # evict a -> [d b] 9; a needs 4, 1 free: evict d -> [b a] 7: 1 hit (a@3), 4 bytes.
    ("a b c a d b a", "lru", 10, 1, 4),
    # fifo: [a b c]; a hit (order kept); d needs 6: evict a (4), b (3) -> [c d] 9; b needs 3, 1 free:
    # evict c -> [d b] 9; a needs 4, 1 free: evict d -> [b a] 7: 1 hit, 4 bytes.
    ("a b c a d b a", "fifo", 10, 1, 4),
    # two passes over a b c d (16 bytes) in 10 bytes: static keeps a b c (10) -> 3 hits, 10 bytes;
    # lru/fifo: [a b c]; d evicts a, b -> [c d] 9; a evicts c -> [d a] 10; b evicts d -> [a b] 7;
    # c fits -> [a b c] 10; d evicts a, b: 0 hits.
    ("a b c d a b c d", "static", 10, 3, 10),
    ("a b c d a b c d", "lru", 10, 0, 0),
    ("a b c d a b c d", "fifo", 10, 0, 0),
    # 16 bytes hold everything: the second pass hits 4 files, 16 bytes.
    ("a b c d a b c d", "lru", 16, 4, 16),
    # d (6 bytes) never fits in 5 bytes: a (4) in, d refused, a@2 hit, d refused: 1 hit, 4 bytes.
    ("a d a d", "lru", 5, 1, 4),
    ("a d a d", "static", 5, 1, 4),
])
def test_policy_hits_byte_sizes(spec, policy, cache, hits, hit_bytes):
    r = sim.simulate(T(spec, SIZES), policy, cache)
    assert (r.hits, r.hit_bytes) == (hits, hit_bytes)
    assert r.request_bytes == sum(SIZES[p] for p in spec.split())


@pytest.mark.parametrize("policy", ALL_POLICIES + [sim.OPT])
def test_no_cache_no_hits(policy):
    r = sim.simulate(T(T1), policy, 0)
    assert r.hits == 0 and r.hit_ratio == 0.0 and r.cache_bytes == 0


def test_simulate_errors():
    with pytest.raises(PolicyError, match="choose one of"):
        sim.simulate(T(T1), "nope", 3)
    with pytest.raises(ValueError, match="negative"):
        sim.simulate(T(T1), "lru", -1)
    with pytest.raises(ValueError, match="importance has 2 files"):
        sim.simulate(T(T1), "lru", 3, Importance(2))


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_importance_is_not_shared(policy):
    imp = Importance(4)
    before = imp.values.copy()
    sim.simulate(T(T1), policy, 2, imp)
    assert np.array_equal(imp.values, before) and not imp._listeners


# -- the same numbers as the daemon's read path ------------------------------------------------------

class _MemBackend:
    """Just enough of a Backend for TieredCache: zero bytes of the snapshot's size."""

    def __init__(self, sizes):
        self.sizes = sizes

    def read(self, path, size):
        return bytes(size)


@pytest.mark.parametrize("policy", ALL_POLICIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_daemon_single_tier(tmp_path, policy, seed):
    """Open files through the daemon's TieredCache (RAM tier only) with a TraceWriter attached, then
    replay the recorded trace: every outcome, hit and hit byte agree."""
    from shadefs.backends.base import Entry
    from shadefs.cache import MemoryTier, TierIndex, TieredCache
    from shadefs.cache.trace import TraceWriter
    from shadefs.namespace import Namespace
    from shadefs.policies import get_policy

    rng = np.random.default_rng(seed)
    names = [f"d{i % 3}/f{i:02d}" for i in range(40)]
    sizes = {p: int(s) for p, s in zip(names, rng.integers(1, 50, len(names)))}
    scores = {p: float(v) for p, v in zip(names, rng.uniform(2, 4, len(names))) if rng.random() < 0.5}
    # never-read extra files shift the daemon's absolute ids; the replay keeps the relative order
    entries = [Entry(p, s, 0.0) for p, s in sizes.items()] + [Entry(f"zz/{i}", 7, 0.0) for i in range(5)]
    ns = Namespace(entries)
    imp = Importance(ns.num_files)
    for p, v in scores.items():
        imp.values[ns.file_id(p)] = v
    cap = sum(sizes.values()) // 4
    tier = TierIndex("ram", cap, get_policy(policy)(cap, imp))
    path = tmp_path / "trace.csv"
    writer = TraceWriter(str(path))
    cache = TieredCache(ns, _MemBackend(sizes), (tier, MemoryTier()), None, imp, trace=writer)
    accessed = rng.choice(names[:30], size=400, p=np.linspace(1, 3, 30) / np.linspace(1, 3, 30).sum())
    outcomes = [cache.open(ns.file_id(p)).outcome for p in accessed.tolist()]
    writer.close()

    trace = sim.read_trace(str(path))
    r = sim.simulate(trace, policy, cap, sim.scores_to_importance(scores, trace))
    daemon = cache.stats()
    assert r.hits == daemon["hits"]["ram"] == sum(o == "ram" for o in outcomes)
    assert r.requests == daemon["opens"] == 400
    assert r.byte_hit_ratio == pytest.approx(daemon["byte_hit_ratio"], abs=0, rel=1e-12)


# -- Belady's OPT ------------------------------------------------------------------------------------

def test_next_use():
    # ids 0 1 0 2 1 0 -> next access of the same id, 6 = none
    assert sim.next_use(np.array([0, 1, 0, 2, 1, 0])).tolist() == [2, 4, 5, 6, 6, 6]
    assert sim.next_use(np.array([], dtype=np.int64)).tolist() == []


@pytest.mark.parametrize("spec,cache,hits", [
    # a b c a b, cache 2: a, b admitted. c misses with next uses a@3, b@4, c never -> c is further
    # than every cached file: bypass. a hit, b hit: 2. (Evicting b for c would give 1.)
    ("a b c a b", 2, 2),
    # a b c c c a b, cache 2: at c@2 next uses a@5, b@6, c@3 -> evict b (furthest). c@3, c@4, a@5 hit;
    # b@6 misses: 3 hits (bypassing c would give 2: a, b).
    ("a b c c c a b", 2, 3),
    # T1, cache 1: a in; b@1 (next 4) vs a (next 3): bypass; c@2 (8) bypass; a@3 hit; b@4 (7) vs a (6):
    # bypass; d@5 (9) bypass; a@6 hit; b, c, d never again: bypass. 2 hits.
    (T1, 1, 2),
    # T1, cache 2: a, b in; c@2 (next 8) vs a@3, b@4: bypass; a, b hit; d@5 (9) vs a@6, b@7: bypass;
    # a, b hit; c, d: never again: bypass. 4 hits.
    (T1, 2, 4),
    # T1, cache 3: a b c in; a, b hit; d@5 (9) vs a@6 b@7 c@8: bypass; a b c hit; d miss. 5 hits.
    (T1, 3, 5),
    (T1, 4, 6),
])
def test_opt_hand_cases_unit(spec, cache, hits):
    r = sim.belady(T(spec), cache)
    assert (r.policy, r.hits, r.cache_bytes) == ("opt", hits, cache)


@pytest.mark.parametrize("spec,sizes,cache,hits,hit_bytes", [
    # a=4 b=3 c=3 d=6, cache 10. a b c fill 10 bytes. d@3 (next 4) needs 6: next uses a@5, b,c never:
    # evict c then b (never used again, furthest) -> 6 free, admit d. d@4 hit, a@5 hit: 2 hits, 10 bytes.
    ("a b c d d a", SIZES, 10, 2, 10),
    # a b c d b a d c: at d@3 (next 6) next uses are a@5, b@4, c@7. Pop c@7 (> 6): 3 bytes free, not
    # enough; next is a@5 < 6 -> bypass, and c goes back. b@4, a@5 hit; d@6 never again: bypass; c@7 hit
    # (so c was restored). 3 hits, 3+4+3 bytes.
    ("a b c d b a d c", SIZES, 10, 3, 10),
    # size-unaware: x y z (1 byte each) then B (3 bytes) x3, then x y z, cache 3. At B@3 (next 4) the
    # next uses are x@6 y@7 z@8, all later: evict z, y, x, admit B; B@4, B@5 hit; x y z miss (never
    # used again: bypass). 2 hits, 6 bytes -- bypassing B would keep x y z for 3 hits (3 bytes):
    # not optimal in hits, which is why the docs call OPT a reference, not a bound, for mixed sizes.
    ("x y z B B B x y z", {"x": 1, "y": 1, "z": 1, "B": 3}, 3, 2, 6),
    # a file larger than the cache is never admitted: d (6) in 5 bytes; a (4) in, a hit.
    ("d a d a", SIZES, 5, 1, 4),
])
def test_opt_hand_cases_bytes(spec, sizes, cache, hits, hit_bytes):
    r = sim.belady(T(spec, sizes), cache)
    assert (r.hits, r.hit_bytes) == (hits, hit_bytes)


def test_simulate_opt_is_belady():
    assert sim.simulate(T(T1), "opt", 2) == sim.belady(T(T1), 2)


def brute_force_max_hits(accesses, cache):
    """Most hits any cache of ``cache`` unit slots can get: tries every admit/evict/bypass choice."""
    @functools.lru_cache(maxsize=None)
    def best(i, held):
        if i == len(accesses):
            return 0
        f = accesses[i]
        if f in held:
            return 1 + best(i + 1, held)
        options = [best(i + 1, held)]  # bypass
        if len(held) < cache:
            options.append(best(i + 1, held | {f}))
        elif cache > 0:
            options += [best(i + 1, (held - {v}) | {f}) for v in held]
        return max(options)
    return best(0, frozenset())


unit_traces = st.lists(st.integers(0, 4), max_size=10)


@settings(max_examples=300, deadline=None)
@given(accesses=unit_traces, cache=st.integers(0, 3))
def test_opt_is_optimal_for_unit_sizes(accesses, cache):
    trace = sim.Trace.from_requests([f"f{a}" for a in accesses])
    assert sim.belady(trace, cache).hits == brute_force_max_hits(tuple(accesses), cache)


@settings(max_examples=100, deadline=None)
@given(accesses=st.lists(st.integers(0, 6), max_size=30), cache=st.integers(0, 5),
       policy=st.sampled_from(ALL_POLICIES))
def test_no_policy_beats_opt_for_unit_sizes(accesses, cache, policy):
    trace = sim.Trace.from_requests([f"f{a}" for a in accesses])
    assert sim.simulate(trace, policy, cache).hits <= sim.belady(trace, cache).hits


def belady_reference(accesses, sizes, cache):
    """The rule of sim.belady, spelled out in O(n^2): returns (hits, hit_bytes)."""
    n = len(accesses)

    def nxt(f, i):
        return next((j for j in range(i + 1, n) if accesses[j] == f), math.inf)

    held, hits, hit_bytes = set(), 0, 0
    for i, f in enumerate(accesses):
        if f in held:
            hits, hit_bytes = hits + 1, hit_bytes + sizes[f]
            continue
        free = cache - sum(sizes[c] for c in held)
        if cache == 0 or sizes[f] > cache:
            continue
        if sizes[f] <= free:
            held.add(f)
            continue
        if nxt(f, i) == math.inf:
            continue
        victims = []
        for c in sorted(held, key=lambda c: nxt(c, i), reverse=True):
            if free >= sizes[f] or nxt(c, i) < nxt(f, i):
                break
            victims.append(c)
            free += sizes[c]
        if free >= sizes[f]:
            held.difference_update(victims)
            held.add(f)
    return hits, hit_bytes


@settings(max_examples=300, deadline=None)
@given(accesses=st.lists(st.integers(0, 7), max_size=60),
       sizes=st.lists(st.integers(0, 6), min_size=8, max_size=8), cache=st.integers(0, 14))
def test_opt_matches_reference_for_mixed_sizes(accesses, sizes, cache):
    trace = sim.Trace.from_requests([f"f{a}" for a in accesses], [sizes[a] for a in accesses])
    r = sim.belady(trace, cache)
    assert (r.hits, r.hit_bytes) == belady_reference(accesses, sizes, cache)


def test_opt_heap_compaction_long_trace():
    # 200 hits per file on 3 files in a cache of 3: the heap is compacted many times; every re-access hits
    trace = T(" ".join(["a b c"] * 200))
    assert sim.belady(trace, 3).hits == 600 - 3


# -- the theory check: uniform random sampling, a fresh permutation every epoch ------------------------

def epoch_trace(files, epochs, seed):
    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(files) for _ in range(epochs)])
    return sim.Trace.from_requests([f"f{i:05d}" for i in order.tolist()])


def test_uniform_epochs_theory():
    """N = 10000 unit files, E = 5 epochs, cache C = 10 % = 1000 files.

    Epoch 1 is all cold misses for every policy, so hits over epochs 2..E are all the hits.
    static and opt: a hit in epoch k+1 on file x needs x cached at the boundary between epochs k and
    k+1 (x is read once in each), so no cache hits more than C per epoch; static keeps C files and
    hits each once per epoch, so static = opt = (E-1)*C exactly.
    lru: file x read at u*N from the end of epoch k and at v*N into epoch k+1 (u, v ~ U(0,1)) has about
    (u + v - uv)*N distinct files between its reads, a hit iff that is < f*N: P = f + (1-f) ln(1-f)
    = f^2/2 + f^3/6 + ... (0.5175 % at f = 0.1). Hits are rare and nearly independent, so the total is
    about Poisson with mean mu = (E-1)*N*P: assert within 5 sqrt(mu) (+2 for the discrete positions).
    """
    n, epochs, f = 10_000, 5, 0.10
    trace = epoch_trace(n, epochs, seed=7)
    cache = int(f * n)
    first = sim.Trace.from_requests(trace.paths)  # epoch 1 alone: ids by first appearance = epoch 1
    for policy in ("static", "lru", "opt"):
        assert sim.simulate(first, policy, cache).hits == 0
    assert sim.simulate(trace, "static", cache).hits == (epochs - 1) * cache
    assert sim.belady(trace, cache).hits == (epochs - 1) * cache
    p = f + (1 - f) * math.log(1 - f)
    mu = (epochs - 1) * n * p
    lru = sim.simulate(trace, "lru", cache).hits
    assert abs(lru - mu) <= 5 * math.sqrt(mu) + 2, (lru, mu)
    assert lru / ((epochs - 1) * n) < f / 10  # the order-of-magnitude gap the design rests on


# -- reading traces ----------------------------------------------------------------------------------

def write(tmp_path, text, name="trace.csv"):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


def test_read_daemon_trace(tmp_path):
    path = write(tmp_path, "time_s,path,size_bytes,outcome\n"
                           "0.000001,train/a.png,10,miss\n"
                           "0.5,train/b.png,20,miss\n"
                           "\n"
                           '0.75,"train/with,comma.png",5,miss\n'
                           "1.0,/train/a.png,10,ram\n")
    t = sim.read_trace(path)
    assert t.ids.dtype == np.int64 and t.ids.tolist() == [0, 1, 2, 0]  # '/train/a.png' is train/a.png
    assert t.sizes.dtype == np.int64 and t.sizes.tolist() == [10, 20, 5]
    assert t.paths == ["train/a.png", "train/b.png", "train/with,comma.png"]
    assert (t.requests, t.distinct_files, t.distinct_bytes, t.request_bytes) == (4, 3, 35, 45)


def test_read_trace_written_by_daemon(tmp_path):
    from shadefs.cache.trace import TraceWriter
    w = TraceWriter(str(tmp_path / "t.csv"), flush_every=2)
    for p, s, o in [("x/1", 3, "miss"), ("x/2", 4, "miss"), ("x/1", 3, "ram"), ("é ü/3", 0, "disk")]:
        w.record(p, s, o)
    w.close()
    t = sim.read_trace(str(tmp_path / "t.csv"))
    assert t.paths == ["x/1", "x/2", "é ü/3"] and t.ids.tolist() == [0, 1, 0, 2] and t.sizes.tolist() == [3, 4, 0]


@pytest.mark.parametrize("text", ["a\nb\na\nc\n", "path\na\nb\na\nc\n", "a\n\nb\r\na\nc"])
def test_read_path_list(tmp_path, text):
    t = sim.read_trace(write(tmp_path, text))
    assert t.paths == ["a", "b", "c"] and t.ids.tolist() == [0, 1, 0, 2] and t.sizes.tolist() == [1, 1, 1]


@pytest.mark.parametrize("text,message", [
    ("time_s,path,size_bytes,outcome\n0,a,1,miss\n0,b,2\n", r":3: expected 4 fields"),
    ("time_s,path,size_bytes,outcome\n0,a,1.5,miss\n", r":2: size_bytes '1.5' is not a whole number"),
    ("time_s,path,size_bytes,outcome\nnow,a,1,miss\n", r":2: time_s 'now' is not a number"),
    ("time_s,path,size_bytes,outcome\n0,a,-1,miss\n", r":2: negative size -1"),
    ("time_s,path,size_bytes,outcome\n0,a,1,miss\n0,b,2,miss\n0,a,3,miss\n",
     r":4: 'a' has size 3 bytes here but 1 bytes on line 2"),
    ("time_s,path,size_bytes,outcome\n0,../a,1,miss\n", r":2: invalid path '../a'"),
    ("time_s,path,size_bytes,outcome\n0,,1,miss\n", r":2: invalid path ''"),
    ("t,file,bytes\n0,a,1\n", r":1: unrecognised header 't,file,bytes'"),
    ("a\nb,c\n", r":2: expected one path per line \(quote a path that contains a comma\), got 2 fields"),
    ("time_s,path,size_bytes,outcome\n", r"no requests"),
    ("", r"no requests"),
    ('path\n"a\n', r":2: unexpected end of data"),
])
def test_read_trace_errors(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        sim.read_trace(write(tmp_path, text))


def test_read_trace_missing_file(tmp_path):
    with pytest.raises(OSError):
        sim.read_trace(str(tmp_path / "absent.csv"))


def test_from_requests_errors():
    with pytest.raises(ValueError, match="2 paths but 1 sizes"):
        sim.Trace.from_requests(["a", "b"], [1])
    with pytest.raises(ValueError, match="size 2 bytes here but 1 bytes on line 1"):
        sim.Trace.from_requests(["a", "a"], [1, 2])


def test_namespace_ids_sorted_order():
    t = T("c a b c")
    assert t.paths == ["c", "a", "b"] and t.namespace_ids.tolist() == [2, 0, 1]


# -- scores files ------------------------------------------------------------------------------------

def test_scores_round_trip_exact(tmp_path):
    paths = ["a", "b/c", "with,comma", "é"]
    values = np.array([1.0, math.log(10.0), 2.7182817, -3.25e-7], dtype=np.float32)
    f = str(tmp_path / "scores.csv")
    sim.write_scores(f, paths, values)
    assert open(f, encoding="utf-8").readline() == "path,importance\n"
    back = sim.read_scores(f)
    assert list(back) == paths
    assert np.array_equal(np.array(list(back.values()), dtype=np.float32), values)  # float32-exact


def test_load_scores(tmp_path):
    f = write(tmp_path, "path,importance\nb,3.5\nnot/in/trace,9\n/c,2.5\nb,4.0\n", "s.csv")
    imp = sim.load_scores(f, T("a b c a"))
    # a: not scored -> 1.0; b: last row wins; '/c' is c; paths outside the trace are ignored
    assert imp.values.dtype == np.float32 and imp.values.tolist() == [1.0, 4.0, 2.5]


@pytest.mark.parametrize("text,message", [
    ("path,score\na,1\n", r":1: expected the header 'path,importance'"),
    ("", r"expected the header"),
    ("path,importance\na,1,2\n", r":2: expected 2 fields"),
    ("path,importance\na,high\n", r":2: importance 'high' is not a finite number"),
    ("path,importance\na,nan\n", r":2: importance 'nan' is not a finite number"),
])
def test_read_scores_errors(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        sim.read_scores(write(tmp_path, text, "s.csv"))


def test_write_scores_errors(tmp_path):
    with pytest.raises(ValueError, match="2 paths but 1 values"):
        sim.write_scores(str(tmp_path / "s.csv"), ["a", "b"], [1.0])
    with pytest.raises(ValueError, match="finite"):
        sim.write_scores(str(tmp_path / "s.csv"), ["a"], [math.inf])
    assert list(tmp_path.iterdir()) == []  # nothing half-written


# -- sweeps, output, command line --------------------------------------------------------------------

def test_run_json_shape():
    t = T("a b c a b d a b c d", {"a": 100, "b": 100, "c": 100, "d": 100})
    out = sim.run(t, ["50%", "300"], ["lru", "static"])
    assert set(out) == {"requests", "distinct_files", "distinct_bytes", "results"}
    assert (out["requests"], out["distinct_files"], out["distinct_bytes"]) == (10, 4, 400)
    assert [(r["policy"], r["cache_bytes"]) for r in out["results"]] == [
        ("lru", 200), ("static", 200), ("opt", 200), ("lru", 300), ("static", 300), ("opt", 300)]
    for r in out["results"]:
        assert set(r) == {"policy", "cache_bytes", "hit_ratio", "byte_hit_ratio"}
    # 50 % = 200 bytes = 2 files: T1 at cache 2 gives lru 0, static 4, opt 4 hits of 10
    assert [r["hit_ratio"] for r in out["results"][:3]] == [0.0, 0.4, 0.4]
    json.dumps(out)  # plain JSON types only


def test_run_policy_selection():
    t = T(T1)
    assert [r["policy"] for r in sim.run(t, ["2"], "all")["results"]] == ALL_POLICIES + ["opt"]
    assert [r["policy"] for r in sim.run(t, ["2"], "opt")["results"]] == ["opt"]
    assert [r["policy"] for r in sim.run(t, ["2"], "fifo,lru,fifo")["results"]] == ["fifo", "lru", "opt"]
    with pytest.raises(PolicyError):
        sim.run(t, ["2"], ["lru", "bogus"])


def test_format_table_and_plot(tmp_path):
    out = sim.run(T(T1), ["20%", "50%"], "lru")
    table = sim.format_table(out)
    lines = table.splitlines()
    assert lines[0] == "trace: 10 requests, 4 distinct files, 4 B distinct"
    assert lines[1].split() == ["policy", "cache", "size", "hit", "ratio", "%", "byte", "hit", "ratio", "%"]
    assert len({len(l) for l in lines[1:]}) == 1  # fixed width
    assert lines[2].split() == ["lru", "0", "B", "(0.0%)", "0.00", "0.00"]
    assert lines[5].split() == ["opt", "2", "B", "(50.0%)", "40.00", "40.00"]
    png = tmp_path / "hits.png"
    sim.plot(out, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def parse(argv):
    p = argparse.ArgumentParser(prog="shadefs simulate")
    sim.add_simulate_arguments(p)
    return p.parse_args(argv)


def test_cli_arguments():
    a = parse(["t.csv", "--cache-size", "10%", "--cache-size", "64MiB"])
    assert (a.trace, a.cache_size, a.policy, a.json, a.plot, a.scores) == (
        "t.csv", ["10%", "64MiB"], "all", False, None, None)
    with pytest.raises(SystemExit):
        parse(["t.csv"])  # --cache-size is required


def test_main_simulate_json_and_table(tmp_path, capsys):
    trace = write(tmp_path, "path\n" + "\n".join(T1.split()) + "\n")
    assert sim.main_simulate(parse([trace, "--cache-size", "50%", "--policy", "lru", "--json"])) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["results"] == [
        {"policy": "lru", "cache_bytes": 2, "hit_ratio": 0.0, "byte_hit_ratio": 0.0},
        {"policy": "opt", "cache_bytes": 2, "hit_ratio": 0.4, "byte_hit_ratio": 0.4}]
    png = tmp_path / "p.png"
    assert sim.main_simulate(parse([trace, "--cache-size", "1", "--cache-size", "3", "--plot", str(png)])) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("trace: 10 requests") and png.exists() and captured.err == ""


def test_main_simulate_scores(tmp_path, capsys):
    trace = write(tmp_path, "path\n" + "\n".join(T1.split()) + "\n")
    scores = str(tmp_path / "s.csv")
    sim.write_scores(scores, ["c", "d"], [5.0, 5.0])
    assert sim.main_simulate(parse([trace, "--cache-size", "2", "--policy", "static", "--scores", scores])) == 0
    assert capsys.readouterr().err == ""
    sim.write_scores(scores, ["elsewhere/x"], [5.0])
    assert sim.main_simulate(parse([trace, "--cache-size", "2", "--scores", scores, "--json"])) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)
    assert "warning: no path in" in captured.err


@pytest.mark.parametrize("argv,message", [
    (["--cache-size", "ten"], "--cache-size 'ten': "),
    (["--cache-size", "10%", "--policy", "bogus"],
     "--policy: unknown policy 'bogus'; choose one of: fifo, lru, shade, static"),
    (["--cache-size", "10%", "--scores", "/nonexistent/s.csv"],
     "cannot read --scores '/nonexistent/s.csv': No such file or directory"),
    (["--cache-size", "10%", "--plot", "/nonexistent/dir/p.png"],
     "cannot write --plot '/nonexistent/dir/p.png': No such file or directory"),
])
def test_main_simulate_errors(tmp_path, capsys, argv, message):
    trace = write(tmp_path, "a\nb\n")
    assert sim.main_simulate(parse([trace] + argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("shadefs simulate: error: " + message), captured.err
    assert captured.err.count("\n") == 1


@pytest.mark.parametrize("name,make,message", [
    ("absent.csv", None, "cannot read the trace '{path}': No such file or directory"),
    ("adir", "dir", "cannot read the trace '{path}': Is a directory"),
    ("nul.csv", b"path\na\x00b\n", "{path}:2: invalid path 'a\\x00b' (want a file path relative to the mount "
                                   "root, without '.', '..' or empty components)"),
])
def test_main_simulate_names_the_trace_and_the_problem(tmp_path, capsys, name, make, message):
    path = tmp_path / name
    if make == "dir":
        path.mkdir()
    elif make is not None:
        path.write_bytes(make)
    assert sim.main_simulate(parse([str(path), "--cache-size", "1"])) == 2
    assert capsys.readouterr().err == f"shadefs simulate: error: {message.format(path=path)}\n"


def test_main_simulate_bad_trace(tmp_path, capsys):
    trace = write(tmp_path, "time_s,path,size_bytes,outcome\n0,a,x,miss\n")
    assert sim.main_simulate(parse([trace, "--cache-size", "1"])) == 2
    assert f"{trace}:2: size_bytes 'x'" in capsys.readouterr().err


def test_plan_replay_plans_chunk_rows_by_their_file():
    # rows: a's chunks 0 and 1 (one open), b's chunk 0, a's chunk 0, b's chunk 0; a cache of 2 entries.
    # The daemon's plan names files (a, b, a, b) and a chunk's next use is its file's: a0 and a1 are both
    # next used at a's next open (before b's), so b0 is refused at its first open and misses again: 1 hit.
    # Planned by rows (the chunks as files), a1's absence from the future would let b0 in: 2 hits.
    rows = ["a.bin/@chunk/0", "a.bin/@chunk/1", "b.bin/@chunk/0", "a.bin/@chunk/0", "b.bin/@chunk/0"]
    t = sim.Trace.from_requests(rows)
    mask = np.zeros(t.requests, dtype=bool)
    r = sim.simulate_plan(t, "lru", 2, hit_mask=mask)
    assert r.hits == 1 and mask.tolist() == [False, False, False, True, False]
    # a file's chunk rows back to back are one open; a chunk read again starts another open
    t2 = sim.Trace.from_requests(["a.bin/@chunk/0", "a.bin/@chunk/1", "a.bin/@chunk/0", "a.bin/@chunk/1",
                                  "b.bin/@chunk/0", "b.bin/@chunk/0", "c.bin", "c.bin"])
    owners = sim._ChunkOwners.of(t2)
    assert owners.use_starts(t2.namespace_ids[t2.ids]) == [True, False, True, False, True, True, True, True]
    assert sim._ChunkOwners.of(sim.Trace.from_requests(["c.bin", "d.bin"])) is None
    # whole files only: the plan is the rows, as before
    whole = sim.Trace.from_requests(["x", "y", "x", "z", "x", "y"])
    assert sim.simulate_plan(whole, "lru", 2).hits == sim.belady(whole, 2).hits


def test_a_disk_replay_charges_each_entry_its_device_bytes_and_returns_the_residents():
    from shadefs.cache.tiers import entry_cost
    from shadefs.policies import PolicyError as _PolicyError

    # 300 B files are records of 364 B charged 409 B; a 70,000 B file is 18 blocks of 4 KiB
    t = sim.Trace.from_requests(["a", "b", "c", "big", "a"], [300, 300, 300, 70_000, 300])
    assert entry_cost(300, 64 << 10) == 364 + 364 // 8 == 409 and entry_cost(70_000, 64 << 10) == 18 * 4096
    r = sim.simulate(t, "static", 900, pack_below=64 << 10, residents=True)
    assert r.residents == ("a", "b") and r.hits == 1  # c (a third 409) and big find no room; a hits
    r = sim.simulate(t, "static", 900, residents=True)  # bytes as they are: a, b and c fit
    assert r.residents == ("a", "b", "c")
    with pytest.raises(_PolicyError):
        sim.simulate(t, "opt", 1000, pack_below=64 << 10)
