"""Work kept off the read path: the residency array, deferred re-ranking on a background
thread in bounded slices, the threaded trace writer, and the checkpoint's snapshot."""
import csv
import os
import threading
import time

import numpy as np
import pytest

from shadefs.backends.posix import PosixBackend
from shadefs.cache import persist
from shadefs.cache.core import DISK_BIT, RAM_BIT, TieredCache
from shadefs.cache.index import TierIndex
from shadefs.cache.tiers import DiskTier, MemoryTier
from shadefs.cache.trace import TraceWriter
from shadefs.namespace import Namespace
from shadefs.policies import Importance, get_policy


def build(src, tmp_path, policy="lru", ram=0, disk=0, trace=None):
    backend = PosixBackend(str(src))
    ns = Namespace(backend.walk())
    imp = Importance(ns.num_files)
    cls = get_policy(policy)
    ram_t = (TierIndex("ram", ram, cls(ram, imp)), MemoryTier())
    disk_t = (TierIndex("disk", disk, cls(disk, imp)), DiskTier(str(tmp_path / "cache"), str(src))) if disk else None
    return TieredCache(ns, backend, ram_t, disk_t, imp, trace=trace), ns, imp


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_residency_array_follows_every_tier_change(small_tree, tmp_path):
    src, spec = small_tree
    # dog/00, cat/01, dog/02: 1000, 2000, 3000 bytes; RAM 3000, disk 10000 (as test_cache's LRU case)
    cache, ns, _ = build(src, tmp_path, "lru", ram=3000, disk=10000)
    a, b, c = (ns.file_id(p) for p in ("dog/00.bin", "cat/01.bin", "dog/02.bin"))
    everyone = np.arange(ns.num_files)
    assert not cache.resident(everyone).any()
    cache.open(a).release()  # released: an open handle pins its RAM buffer (not evictable)
    cache.open(b).release()
    assert cache.resident_flags[[a, b]].tolist() == [RAM_BIT, RAM_BIT]
    cache.open(c).release()                        # a, b demoted to disk
    assert cache.resident_flags[[a, b, c]].tolist() == [DISK_BIT, DISK_BIT, RAM_BIT]
    cache.open(a).release()                        # promoted; c demoted
    assert cache.resident_flags[[a, b, c]].tolist() == [RAM_BIT, DISK_BIT, DISK_BIT]
    got = cache.resident(everyone)
    assert got.dtype == bool and np.flatnonzero(got).tolist() == sorted([a, b, c])
    # the array says exactly what the indexes say
    for f in everyone.tolist():
        assert bool(got[f]) == (f in cache.ram_index or f in cache.disk_index)
    # out-of-range ids are not resident (no IndexError), shape is kept
    q = np.array([[a, -1], [ns.num_files, c]])
    assert cache.resident(q).tolist() == [[True, False], [False, True]]
    cache.disk_index.remove(b)
    assert cache.resident_flags[b] == 0


def test_restore_marks_the_array_and_keeps_the_commit_order(small_tree, tmp_path):
    src, _ = small_tree
    cache, ns, _ = build(src, tmp_path, "lru", ram=0, disk=100000)
    cache.disk_index.restore([4, 1, 7], [ns.size(4), ns.size(1), ns.size(7)])
    assert np.flatnonzero(cache.resident_flags).tolist() == [1, 4, 7]
    order = cache.disk_index.order
    assert sorted([1, 4, 7], key=lambda f: order[f]) == [4, 1, 7]
    # a later index (tracking enabled after entries exist) marks them too, in the index's order
    idx = TierIndex("disk", 100, get_policy("lru")(100))
    idx.restore([3, 0], [10, 10])
    flags = np.zeros(5, dtype=np.uint8)
    idx.track_residency(flags, 2, keep_order=True)
    assert flags.tolist() == [2, 0, 0, 2, 0] and idx.order[3] < idx.order[0]


def test_score_batches_wait_for_the_background_thread_and_apply_in_slices(small_tree, tmp_path):
    src, _ = small_tree
    total = sum(1000 * (i + 1) for i in range(10))
    cache, ns, imp = build(src, tmp_path, "shade", ram=total)
    for f in range(ns.num_files):
        cache.open(f)                               # everything fits: 10 residents, all 1.0
    policy = cache.ram_index.policy
    assert policy.ranking() == list(range(ns.num_files))
    slices = []
    real = policy.apply_pending
    gate = threading.Event()

    def spy(limit):
        if not gate.is_set():                       # hold the thread back until we looked
            time.sleep(0.001)
            return True
        slices.append((limit, cache.lock.locked(), policy.pending()))
        return real(limit)

    policy.apply_pending = spy
    cache.apply_slice = 3
    cache.start_background()
    cache.update_importance(np.arange(10), np.linspace(9, 0, 10).astype(np.float32))
    assert imp.values[9] == 0.0                     # the values are set at once ...
    assert cache.open(3).outcome == "ram"             # ... and neither the update nor this hit re-ranks
    with cache.lock:
        assert policy.ranking() == list(range(10))
        assert policy.pending() == 11
    gate.set()
    assert wait_for(lambda: policy.ranking() == list(range(9, -1, -1)))
    assert wait_for(lambda: policy.pending() == 0)
    # 10 ids + 1 hit touch in slices of at most 3, each under the lock (a slice the thread runs after
    # the last one found nothing queued)
    assert [left for _, _, left in slices if left] == [11, 8, 5, 2]
    assert all(limit == 3 and locked for limit, locked, _ in slices)
    cache.close()
    assert not cache._bg_thread.is_alive()


def test_capacity_zero_tier_never_subscribes_and_nothing_queues(small_tree, tmp_path):
    src, _ = small_tree
    cache, ns, imp = build(src, tmp_path, "shade", ram=0, disk=100000)
    assert len(imp._listeners) == 1                 # the disk tier's policy only
    cache.start_background()
    assert cache._bg_policies == [cache.disk_index.policy]
    for _ in range(200):
        cache.update_importance(np.arange(ns.num_files), np.full(ns.num_files, 2.0, dtype=np.float32))
    assert wait_for(lambda: cache.disk_index.policy.pending() == 0)
    assert cache.ram_index.policy._queued_ids == 0 and not cache.ram_index.policy._queued
    cache.close()


def test_trace_rows_are_written_by_the_thread_in_order(tmp_path):
    path = tmp_path / "t.csv"
    clock = iter(range(1_000_000)).__next__
    t = TraceWriter(str(path), flush_every=10, clock=clock, interval_s=3600)  # no periodic write here
    t.start()
    def record(lo, hi):
        for i in range(lo, hi):
            t.record(f"d/{i}.bin", i, "miss" if i % 2 else "ram")

    record(0, 10)
    assert wait_for(lambda: t.written == 10)        # a block of 10 woke the writer: it wrote those 10
    record(10, 19)
    assert t.written == 10                          # 9 rows: no block, nothing wakes the writer
    record(19, 20)
    assert wait_for(lambda: t.written == 20)        # the second block
    record(20, 25)
    assert t.written == 20                          # the last 5 wait for a block, the interval or a flush
    t.flush()
    assert t.written == 25
    t.close()
    rows = list(csv.reader(open(path)))
    assert rows[0] == ["time_s", "path", "size_bytes", "outcome"]
    assert rows[1:] == [[f"{i + 1:.6f}", f"d/{i}.bin", str(i), "miss" if i % 2 else "ram"] for i in range(25)]
    t.close()                                       # idempotent


def test_trace_buffer_is_bounded_and_drops_are_counted(tmp_path, caplog):
    path = tmp_path / "t.csv"
    t = TraceWriter(str(path), flush_every=1000, max_rows=5)
    t.start()
    t._stop.set()                                   # a writer that is not writing
    t._wake.set()
    t._thread.join(5)
    for i in range(8):
        t.record(f"{i}", 1, "ram")
    assert t.dropped == 3 and len(t._rows) == 5
    with caplog.at_level("WARNING", logger="shadefs.trace"):
        t.close()
    assert "3 rows dropped" in caplog.text
    assert len(open(path).read().splitlines()) == 6


def test_trace_without_thread_writes_blocks_inline(tmp_path):
    path = tmp_path / "t.csv"
    t = TraceWriter(str(path), flush_every=4)
    for i in range(9):
        t.record("p", 1, "disk")
    assert t.written == 8
    t.close()
    assert len(open(path).read().splitlines()) == 10


def test_checkpoint_copies_the_residency_array_and_lists_entries_oldest_first(small_tree, tmp_path):
    src, _ = small_tree
    cache, ns, imp = build(src, tmp_path, "lru", ram=0, disk=100000)
    for f in (6, 2, 9, 0):
        cache.open(f)
    cache.disk_index.remove(9)
    digests = persist.PathDigests(ns.paths)
    d = tmp_path / "ck"
    d.mkdir()
    ck = persist.Checkpointer(str(d), ns, imp, cache.disk_index, digests, cache.lock, interval_s=0)
    assert ck.save()
    dig, sizes, mtimes, _gens, _etags = persist.read_index(str(d / persist.INDEX_FILE))
    want = [6, 2, 0]
    assert dig.tolist() == digests.rows(np.array(want)).tolist()
    assert sizes.tolist() == [ns.size(f) for f in want]
    assert not ck.save()                            # nothing changed
    cache.open(9)
    assert ck.save()
    dig = persist.read_index(str(d / persist.INDEX_FILE))[0]
    assert dig.tolist() == digests.rows(np.array([6, 2, 0, 9])).tolist()
