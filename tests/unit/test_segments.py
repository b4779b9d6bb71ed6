"""The segment store of packed disk entries: append, seal, reclaim by live bytes, compaction, reload, and
torn records (a writer killed mid-append, a truncated or damaged segment) never served."""
import errno
import hashlib
import os
import random

import pytest

from shadefs.cache.segments import HEADER, SegmentStore
from shadefs.cache.tiers import CorruptEntry


def digest(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


class Ledger:
    """The store's callbacks, counted like the disk tier's index counts them."""

    def __init__(self, store: SegmentStore, room: int = 1 << 30):
        self.dead = 0        # bytes reported dead (padding, failed or orphaned copies)
        self.reclaimed = 0   # bytes handed back when a segment left the disk
        self.held = 0
        self.room = room
        store.on_dead = self.on_dead
        store.on_reclaimed = self.on_reclaimed
        store.on_hold = self.on_hold
        store.on_unhold = self.on_unhold

    def on_dead(self, n):
        self.dead += n

    def on_reclaimed(self, n):
        self.reclaimed += n

    def on_hold(self, n):
        if n > self.room:
            return False
        self.held += n
        return True

    def on_unhold(self, n):
        self.held -= n


def seg_files(d):
    return sorted(n for n in os.listdir(d) if n.endswith(".seg"))


def fill(store, n, size=300, seed=1, gen0=1):
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        data = rng.randbytes(size)
        gen = gen0 + i
        csum = store.append(digest(f"f{i}"), gen, 1_000_000_000_123_456_789 + i, data)
        out[gen] = (csum, data)
    return out


def test_append_then_read_is_one_record_with_a_64_byte_header(tmp_path):
    d = str(tmp_path / "seg")
    s = SegmentStore(d, segment_bytes=1 << 20)
    recs = fill(s, 10)
    for gen, (csum, data) in recs.items():
        assert s.read(gen, csum, len(data)) == data
    (name,) = seg_files(d)
    assert os.path.getsize(os.path.join(d, name)) == 10 * (HEADER + 300)
    assert s.live_bytes() == 10 * (HEADER + 300)
    with pytest.raises(FileNotFoundError):
        s.read(999, 0, 300)
    with pytest.raises(FileNotFoundError):  # a stale checksum names another generation's bytes
        s.read(1, recs[1][0] ^ 1, 300)
    with pytest.raises(ValueError):
        s.append(digest("f0"), 1, 0, b"x")  # a generation is written once
    s.close()


def test_a_full_segment_is_sealed_and_its_page_padding_reported_dead(tmp_path):
    d = str(tmp_path / "seg")
    s = SegmentStore(d, segment_bytes=16 << 10)
    led = Ledger(s)
    fill(s, 100)  # 364-byte records: 45 per 16 KiB segment
    per = (16 << 10) // (HEADER + 300)
    assert s.segments() == len(seg_files(d)) == -(-100 // per) == 3
    used = per * (HEADER + 300)
    assert led.dead == 2 * (-used % 4096)  # two sealed segments, each padded to whole pages
    s.close()


def test_deletes_reclaim_an_emptied_segment_and_compaction_copies_live_records_forward(tmp_path):
    d = str(tmp_path / "seg")
    s = SegmentStore(d, segment_bytes=16 << 10, compact_below=0.5)
    led = Ledger(s)
    recs = fill(s, 135)  # 45 per segment: segments 1, 2 sealed, 3 active
    gens = sorted(recs)
    first = seg_files(d)[0]
    for g in gens[:45]:  # every record of segment 1: it goes at once, nothing to copy
        assert s.delete(g)
    assert first not in seg_files(d) and s.reclaimed_segments == 1
    pad = -(45 * (HEADER + 300)) % 4096
    assert led.reclaimed == 45 * (HEADER + 300) + pad
    assert not s.delete(gens[0])  # already dead
    second = seg_files(d)[0]
    for g in gens[45:80]:  # 35 of 45 dead: below half live -> compaction copies the 10 live ones
        s.delete(g)
    assert s.compact_once() == 1
    assert second not in seg_files(d) and s.compactions == 1
    assert led.held == 0  # every hold handed back
    for g in gens[80:]:
        csum, data = recs[g]
        assert s.read(g, csum, 300) == data  # moved records still read right
    assert s.live_bytes() == (135 - 80) * (HEADER + 300)
    s.close()


def test_compaction_waits_for_room(tmp_path):
    d = str(tmp_path / "seg")
    s = SegmentStore(d, segment_bytes=16 << 10)
    Ledger(s, room=0)
    recs = fill(s, 90)
    for g in sorted(recs)[:40]:
        s.delete(g)
    assert s.compact_once() == 0 and s.compactions == 0  # no room for the copy: the segment stays
    s.close()


def test_reload_finds_every_record_and_drops_nothing_valid(tmp_path):
    d = str(tmp_path / "seg")
    s = SegmentStore(d, segment_bytes=16 << 10)
    recs = fill(s, 100)
    for g in sorted(recs)[:10]:
        s.delete(g)  # not persisted: a reload sees them again (the cache's reload decides)
    s.close()
    t = SegmentStore(d, segment_bytes=16 << 10)
    digests, gens, csums, sizes, mtimes = t.scan()
    assert sorted(gens.tolist()) == sorted(recs)
    assert set(sizes.tolist()) == {300} and t.torn == 0
    i = gens.tolist().index(7)
    assert bytes(digests[i]) == digest("f6") and mtimes[i] == 1_000_000_000_123_456_789 + 6
    for g, (csum, data) in recs.items():
        assert t.read(g, csum, 300) == data
    # appends after a reload go to a new segment
    t.append(digest("new"), 10_000, 0, b"new bytes")
    assert len(seg_files(d)) == 4
    t.close()


def test_a_writer_killed_mid_append_leaves_no_record_that_is_served(tmp_path):
    d = str(tmp_path / "seg")
    s = SegmentStore(d, segment_bytes=1 << 20)
    recs = fill(s, 5)
    s.close()
    pid = os.fork()
    if pid == 0:  # the child appends with the real store; its write stops half way, then it dies
        try:
            c = SegmentStore(d, segment_bytes=1 << 20)
            c.scan()
            real = os.pwrite

            def torn(fd, data, off):
                real(fd, data[:len(data) // 2], off)
                os._exit(0)  # kill -9 semantics: no cleanup, no unwinding

            os.pwrite = torn
            c.append(digest("torn"), 777, 0, b"t" * 20000)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0  # it died inside the write
    t = SegmentStore(d, segment_bytes=1 << 20)
    _, gens, _, _, _ = t.scan()
    assert sorted(gens.tolist()) == sorted(recs) and 777 not in t and t.torn == 1
    with pytest.raises(FileNotFoundError):
        t.read(777, 0, 20000)
    for g, (csum, data) in recs.items():
        assert t.read(g, csum, 300) == data
    # the torn tail was cut: the segment ends after its last whole record
    assert sum(os.path.getsize(os.path.join(d, n)) for n in seg_files(d)) == 5 * (HEADER + 300)
    t.close()


def test_a_truncated_segment_drops_its_last_record_only(tmp_path):
    d = str(tmp_path / "seg")
    s = SegmentStore(d, segment_bytes=1 << 20)
    recs = fill(s, 4)
    s.close()
    (name,) = seg_files(d)
    os.truncate(os.path.join(d, name), 4 * (HEADER + 300) - 1)
    t = SegmentStore(d, segment_bytes=1 << 20)
    _, gens, _, _, _ = t.scan()
    assert sorted(gens.tolist()) == sorted(recs)[:3] and t.torn == 1
    t.close()


def test_a_damaged_record_is_never_served(tmp_path):
    d = str(tmp_path / "seg")
    s = SegmentStore(d, segment_bytes=1 << 20)
    recs = fill(s, 3)
    (name,) = seg_files(d)
    path = os.path.join(d, name)
    with open(path, "r+b") as f:  # flip a payload byte of the second record
        f.seek(HEADER + 300 + HEADER + 17)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    g = sorted(recs)[1]
    with pytest.raises(CorruptEntry):
        s.read(g, recs[g][0], 300)
    assert s.read(g, recs[g][0], 300, verify=False) != recs[g][1]  # (first-hit trusts a checked record)
    s.close()
    t = SegmentStore(d, segment_bytes=1 << 20)
    _, gens, _, _, _ = t.scan()
    assert gens.tolist() == [sorted(recs)[0]]  # the damaged record ends its segment
    t.close()


def _packed_cache(src, tmp_path, disk_bytes, policy="lru"):
    import threading  # noqa: F401  (the cache lock the tier's callbacks take)

    from shadefs.backends.posix import PosixBackend
    from shadefs.cache.core import TieredCache
    from shadefs.cache.index import TierIndex
    from shadefs.cache.tiers import DiskTier, MemoryTier
    from shadefs.namespace import Namespace
    from shadefs.policies import Importance, get_policy

    backend = PosixBackend(str(src))
    ns = Namespace(backend.walk())
    imp = Importance(ns.num_files)
    cls = get_policy(policy)
    store = DiskTier(str(tmp_path / "cache"), str(src), pack_below=64 << 10)
    cache = TieredCache(ns, backend, (TierIndex("ram", 0, cls(0, imp)), MemoryTier()),
                        (TierIndex("disk", disk_bytes, cls(disk_bytes, imp)), store), imp)
    store.bind(cache.disk_index, cache.lock)
    return cache, ns, store


def test_a_packed_hit_is_one_record_and_a_damaged_one_is_dropped_and_read_again(small_tree, tmp_path):
    from shadefs.testing.handles import open_read

    src, spec = small_tree
    cache, ns, store = _packed_cache(src, tmp_path, 1 << 20)
    for rel, data in sorted(spec.items()):
        assert open_read(cache, ns.file_id(rel)) == (data, "miss")
    # each record is charged its bytes and an eighth of them (the dead bytes compaction lets lie)
    assert cache.disk_index.used_bytes == sum(HEADER + len(d) + (HEADER + len(d)) // 8 for d in spec.values())
    # the segments' slack besides the records' shares: 2 x 64 KiB of dead records, a 64 KiB segment to copy
    assert cache.disk_index.overhead_bytes > 0 and cache.disk_index.headroom_bytes == (128 + 64) << 10
    for rel, data in sorted(spec.items()):
        assert open_read(cache, ns.file_id(rel)) == (data, "disk")
    # flip one byte of dog/04.bin's record: its next hit finds it, drops it, reads the source again
    rel = "dog/04.bin"
    fid = ns.file_id(rel)
    r = store.segments._map[int(cache.entries.gen[fid])]
    with open(r.seg.path, "r+b") as f:
        f.seek(r.off + HEADER + 5)
        b = f.read(1)
        f.seek(r.off + HEADER + 5)
        f.write(bytes([b[0] ^ 1]))
    assert open_read(cache, fid) == (spec[rel], "miss")
    assert cache.stats()["corrupt_entries"] == 1
    assert open_read(cache, fid) == (spec[rel], "disk")  # written again
    store.close()


def _reads_without_waiting(path) -> bool:
    """Whether the file system of ``path`` serves preadv2(RWF_NOWAIT) (tmpfs, for one, does not)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
        return True
    except OSError as e:
        return e.errno != errno.EOPNOTSUPP  # EAGAIN: served, the page was not cached
    finally:
        os.close(fd)


@pytest.mark.parametrize("mode", ["every-open", "first-hit"])
def test_a_packed_hit_reads_its_record_once_and_its_reads_are_served_from_those_bytes(small_tree, tmp_path, mode):
    from shadefs.cache import segments

    src, spec = small_tree
    cache, ns, store = _packed_cache(src, tmp_path, 1 << 20)
    cache.verify_entries = mode
    for rel in sorted(spec):
        cache.open(ns.file_id(rel)).release()  # misses: the records are written
    seg = store.segments
    assert (seg.reads, seg.cached_reads) == (0, 0)
    for _ in range(3):
        for rel, data in sorted(spec.items()):
            h = cache.open(ns.file_id(rel))
            assert h.outcome == "disk" and h.source == "memory" and h.backing_fd() is None
            # READs of 7 bytes, one past the end: all from the bytes the hit read and checked
            assert b"".join(h.read(o, 7) for o in range(0, len(data) + 7, 7)) == data
            h.release()
    hits = 3 * len(spec)
    assert cache.stats()["hits"]["disk"] == hits and cache.stats()["misses"] == len(spec)
    assert seg.reads == hits  # one read of header and bytes per hit, none per READ
    # just written, the records are in the page cache: read with the GIL kept where the extension is built
    # and the file system reads without waiting; with os.pread otherwise
    (name,) = seg_files(seg.dir)
    nowait = segments._pread_cached is not None and _reads_without_waiting(os.path.join(seg.dir, name))
    assert seg.cached_reads == (hits if nowait else 0)
    store.close()


def test_evicted_records_are_reclaimed_and_the_device_bytes_stay_within_the_budget(small_tree, tmp_path):
    from shadefs.testing.handles import open_read

    src, spec = small_tree
    names = sorted(spec)
    cache, ns, store = _packed_cache(src, tmp_path, 20_000 + (8 << 12) + (192 << 10))
    idx = cache.disk_index
    room = idx.capacity_bytes - idx.overhead_bytes - idx.headroom_bytes
    assert room == idx.entry_bytes
    assert 10_000 < room < 25_000  # 8 pages of overhead, 192 KiB of slack: ~4 of the 10 files fit
    seg = store.segments
    rng = random.Random(5)
    for _ in range(300):
        rel = rng.choice(names)
        data, _ = open_read(cache, ns.file_id(rel))
        assert data == spec[rel]
        seg.drain()
        seg.compact_once()
        on_disk = sum(os.stat(os.path.join(seg.dir, n)).st_blocks * 512 for n in seg_files(seg.dir))
        assert idx.used_bytes + idx.reserved_bytes + idx.dying_bytes <= idx.entry_bytes
        # the segments' allocated bytes are the entries the index counts and the slack (dead records,
        # padding), within its limit, but for the active segment's last page
        assert seg.slack_bytes() <= seg.slack_limit()
        assert on_disk <= idx.used_bytes + idx.dying_bytes + seg.slack_bytes() + 4096
        assert on_disk <= idx.capacity_bytes - idx.overhead_bytes
    s = cache.stats()
    assert s["tiers"]["disk"]["evictions"] > 0 and s["hits"]["disk"] > 0 and seg.reclaimed_segments > 0
    store.close()


def test_a_failed_append_is_not_indexed_and_the_next_goes_to_a_new_segment(tmp_path, monkeypatch):
    import errno

    d = str(tmp_path / "seg")
    s = SegmentStore(d, segment_bytes=1 << 20)
    led = Ledger(s)
    recs = fill(s, 3)
    real = os.pwrite

    def full(fd, data, off):
        real(fd, data[:100], off)  # a partial write, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(OSError):
        s.append(digest("x"), 99, 0, b"y" * 300)
    monkeypatch.setattr(os, "pwrite", real)
    assert 99 not in s and led.dead >= HEADER + 300  # its bytes are dead (counted until reclaimed)
    s.append(digest("z"), 100, 0, b"z" * 300)
    assert len(seg_files(d)) == 2
    s.close()
    t = SegmentStore(d, segment_bytes=1 << 20)
    _, gens, _, _, _ = t.scan()
    assert sorted(gens.tolist()) == sorted(recs) + [100]
    t.close()


def test_a_packed_hit_finds_the_loose_room_of_a_handle_released_just_before(small_tree, tmp_path):
    """A handle's release takes no lock (its bytes are handed back at the next critical section): a packed
    hit whose own critical section comes right after one, as on another reader thread, counts the room it
    freed and serves its record's bytes, not ranges from the source."""
    from shadefs.testing.handles import open_read

    src, spec = small_tree
    cache, ns, store = _packed_cache(src, tmp_path, 1 << 20)
    rel = "dog/04.bin"
    f, size = ns.file_id(rel), len(spec[rel])
    assert open_read(cache, f) == (spec[rel], "miss")   # packed into a segment
    cache.loose_budget = size                           # room for one record's bytes held by a handle
    h = cache.open(f)
    assert h.outcome == "disk" and cache.loose_bytes == size
    h.release()                                         # queued
    before = cache.stats()["backend_bytes"]             # (settles the release: queue it again)
    h = cache.open(f)
    h.release()
    h2 = cache._packed_hit(f, size, int(cache.entries.gen[f]), int(cache.entries.csum[f]))
    assert h2.read(0, size) == spec[rel]
    assert cache.stats()["backend_bytes"] == before     # from the record's bytes: the source not read
    h2.release()
    store.close()


def test_the_slack_is_dead_records_and_padding_and_a_fill_waits_for_compaction_to_keep_it(tmp_path):
    d = str(tmp_path / "seg")
    s = SegmentStore(d, segment_bytes=16 << 10)
    rec = HEADER + 300
    recs = fill(s, 100)  # 45 records per segment: two sealed (padded to whole pages), one active
    gens = sorted(recs)
    pad = -(45 * rec) % 4096
    assert s.slack_bytes() == 2 * pad
    assert s.make_room(gens[:10], 0.0)  # no limit set: always granted
    s.slack_base = 20 * rec
    assert s.slack_limit() == 20 * rec + 100 * rec // 8
    # 20 records of the first segment deleted unpromised: they are slack now
    for g in gens[:20]:
        assert s.delete(g)
    assert s.slack_bytes() == 2 * pad + 20 * rec
    limit = s.slack_limit()
    # victims whose records would take the slack past its limit: no room without a compaction
    many = gens[20:20 + (limit - s.slack_bytes()) // rec + 1]
    assert len(many) == 10 and not s.make_room(many, 0.0)
    # a compaction of the segment with the fewest live records (the first) gives the room back
    assert s.compact_once() == 1  # the first segment alone
    assert s.slack_bytes() <= limit // 2
    assert s.make_room(many, 0.0)
    promised = len(many) * rec
    assert s._promised == promised
    for g in many:
        s.delete(g, promised=True)
    assert s._promised == 0
    for g in gens[20 + len(many):]:
        csum, data = recs[g]
        assert s.read(g, csum, 300) == data  # the records compaction moved read right
    s.close()


def test_a_fill_waiting_for_room_is_granted_when_the_compaction_thread_reclaims(tmp_path):
    d = str(tmp_path / "seg")
    s = SegmentStore(d, segment_bytes=16 << 10)
    recs = fill(s, 135)
    gens = sorted(recs)
    s.slack_base = 0
    for g in gens[:40]:
        s.delete(g)
    assert s.slack_bytes() > s.slack_limit()  # over its limit: a fill must wait
    s.start()  # the thread wakes on the waiter and compacts the segments with the fewest live records
    assert s.make_room(gens[100:101], 30.0)
    assert s.slack_bytes() + HEADER + 300 <= s.slack_limit() and s.compactions == 1, s.compactions
    s.close()
