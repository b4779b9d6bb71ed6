"""A RAM hit is counted by the one function every open is counted by (``TieredCache._count``): the same
counters, trace row and plan observation as any other outcome. A chunk's open is its file's: the plans (and
the prefetcher's ``on_open``) see the file's open once, never a chunk id, whether the chunk missed or hit.
Real posix backend, namespace, chunk map, plan registry and RAM tier."""
import csv
import os

from shadefs.backends.posix import PosixBackend
from shadefs.cache.chunks import CHUNK_MARK, ChunkMap
from shadefs.cache.core import TieredCache
from shadefs.cache.index import TierIndex
from shadefs.cache.tiers import MemoryTier
from shadefs.cache.trace import TraceWriter
from shadefs.namespace import Namespace
from shadefs.plan.plans import PlanRegistry
from shadefs.policies import Importance, get_policy

BIG = "cat/09.bin"   # 10000 bytes: chunks of 4096, 4096 and 1808 bytes


def _chunked_cache(src, tmp_path, ram=1 << 20):
    """A cache whose files above 4096 bytes are cached by chunks, following a plan registry whose
    ``on_open`` calls are recorded; returns (cache, ns, chunk map, on_open calls, trace rows: a function
    returning the trace file's rows so far)."""
    ns = Namespace(PosixBackend(str(src)).walk())
    chunks = ChunkMap(ns.sizes, chunk=4096)
    imp = Importance(chunks.num_ids)
    lru = get_policy("lru")
    trace_file = str(tmp_path / "trace.csv")
    trace = TraceWriter(trace_file)
    cache = TieredCache(ns, PosixBackend(str(src)), (TierIndex("ram", ram, lru(ram, imp)), MemoryTier()), None,
                        imp, trace=trace, chunks=chunks)
    plans = PlanRegistry(chunks.num_ids, cache.lock)
    plans.aliases = chunks
    cache.attach_plans(plans)
    opened = []
    plans.on_open = opened.append
    return cache, ns, chunks, opened, lambda: _trace_rows(trace, trace_file)


def _trace_rows(trace, trace_file) -> list:
    """The trace's rows so far, as its CSV file has them: (path, size, outcome)."""
    trace.flush()
    with open(trace_file, newline="") as f:
        return [(path, int(size), outcome) for _, path, size, outcome in list(csv.reader(f))[1:]]


def _read_whole(cache, fid, size):
    h = cache.open(fid)
    try:
        return h.read(0, size)
    finally:
        h.release()


def test_a_chunks_ram_hit_reaches_the_plans_as_its_files_open_only(small_tree, tmp_path):
    """The chunks' misses (first pass) and their RAM hits (second pass) are counted alike: the plans
    see each open of the chunked file once (its own open), no chunk id."""
    src, spec = small_tree
    cache, ns, chunks, opened, trace_rows = _chunked_cache(src, tmp_path)
    f = ns.file_id(BIG)
    first, count = chunks.span(f)
    assert count == 3
    assert _read_whole(cache, f, 10000) == spec[BIG]         # three chunk misses, now RAM residents
    s = cache.stats()
    assert (s["opens"], s["misses"], s["hits"]["ram"]) == (3, 3, 0)
    assert opened == [f]
    assert _read_whole(cache, f, 10000) == spec[BIG]         # three chunk RAM hits
    s = cache.stats()
    assert (s["opens"], s["misses"], s["hits"]["ram"], cache.hit_bytes) == (6, 3, 3, 10000)
    assert opened == [f, f]                                  # (a chunk id here: counted unlike its miss)
    rows = trace_rows()
    chunk_paths = [f"{BIG}{CHUNK_MARK}{k}" for k in range(3)]
    sizes = [4096, 4096, 1808]
    assert rows == ([(p, n, "miss") for p, n in zip(chunk_paths, sizes)]
                    + [(p, n, "ram") for p, n in zip(chunk_paths, sizes)])


class _HitLog:
    """The compiled loop's log of the RAM hits it answered without the GIL, in the interface of
    ``shadefs.fuse._fastloop.Residents`` (publish, retire, take, pending), filled by the test: the real
    loop logs only the files its table holds (never a chunk id), so only a stand-in puts a chunk id
    through the code that applies the log (``TieredCache._apply_hits``)."""

    def __init__(self):
        self.hits = []   # (fid, opener pid, size)

    def publish(self, fid, data):
        return False     # nothing is answered without the GIL here: every open goes through the cache

    def retire(self, fid, pin):
        return False

    def pending(self):
        return len(self.hits)

    def take(self):
        hits, self.hits = self.hits, []
        return [h[0] for h in hits], [h[1] for h in hits], [h[2] for h in hits], []


def test_the_compiled_loops_logged_hits_count_as_the_caches_own_ram_hits(small_tree, tmp_path):
    """The same RAM hits (a chunk id, then a whole file) counted by the cache's own RAM hit path
    (``_ram_hit``: ``_count``) and applied from the compiled loop's log (``_apply_hits``, which inlines
    ``_count``): identical counters, ``on_open`` calls and trace rows."""
    src, spec = small_tree
    seen = []
    for path in ("cache", "log"):
        (tmp_path / path).mkdir()
        cache, ns, chunks, opened, trace_rows = _chunked_cache(src, tmp_path / path)
        log = _HitLog()
        cache.attach_residents(log)
        f, small = ns.file_id(BIG), ns.file_id("dog/00.bin")
        c0 = chunks.span(f)[0]
        assert _read_whole(cache, f, 10000) == spec[BIG]    # its chunks' misses: RAM residents
        assert _read_whole(cache, small, 1000) == spec["dog/00.bin"]
        before, calls, rows = cache.counters(), len(opened), len(trace_rows())
        if path == "cache":
            for fid in (c0, small):
                cache.open(fid).release()                   # RAM hits, served by the cache
        else:
            log.hits = [(c0, os.getpid(), 4096), (small, os.getpid(), 1000)]
            cache.apply_hits()
        seen.append((_delta(cache.counters(), before), opened[calls:], trace_rows()[rows:]))
    (counts, calls, rows), other = seen[0], seen[1]
    assert counts == {"opens": 2, "hits_ram": 2, "open_bytes": 5096, "hit_bytes": 5096}
    assert calls == [small]                                  # the chunk's hit is its file's: no chunk id
    assert rows == [(f"{BIG}{CHUNK_MARK}0", 4096, "ram"), ("dog/00.bin", 1000, "ram")]
    assert other == (counts, calls, rows)


def _delta(after: dict, before: dict) -> dict:
    """The integer counters that changed between two ``counters()`` snapshots, by how much."""
    return {k: v - before[k] for k, v in after.items() if isinstance(v, int) and v != before[k]}
