"""An NVMe hit on a kept passthrough backing id: ``TieredCache.open_kept`` counts the
hit without opening the entry only while the generation the caller holds is the resident, verified entry
(``--verify-entries first-hit``); the kernel front end's ``_Modes`` reuses a backing id only for a disk hit
of the generation it was registered from. Real disk tier in tmp_path, real posix backend."""
import os

from shadefs.cache.core import Handle
from shadefs.fuse.backing import _Kept
from shadefs.fuse.kernel import _Modes
from shadefs.testing.handles import open_read

from test_cache import _flip, build, fid

BIG = "cat/09.bin"   # 10000 bytes


def _first_hit_cache(src, tmp_path, ram=0, disk=100000, policy="static"):
    cache, ns, backend = build(src, tmp_path, policy, ram=ram, disk=disk)
    cache.verify_entries = "first-hit"
    return cache, ns, backend


def test_open_kept_counts_a_verified_generation_without_an_fd(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, backend = _first_hit_cache(src, tmp_path)
    f = fid(ns, BIG)
    assert open_read(cache, f) == (spec[BIG], "miss")      # written, not yet verified
    gen = int(cache.entries.gen[f])
    assert cache.open_kept(f, gen) is None                 # its first hit must read and verify it
    assert cache.opens == 1
    assert open_read(cache, f) == (spec[BIG], "disk")      # verified now
    h = cache.open_kept(f, gen)
    assert isinstance(h, Handle)
    assert (h.outcome, h.size, h.gen, h.backing_fd()) == ("disk", 10000, gen, None)
    h.release()
    s = cache.stats()
    assert (s["opens"], s["hits"]["disk"], s["misses"], s["corrupt_entries"]) == (3, 2, 1, 0)
    assert cache.hit_bytes == 20000 and len(backend.reads) == 1
    # any other generation number: refused, nothing counted
    assert cache.open_kept(f, gen + 1) is None and cache.open_kept(f, 0) is None
    assert cache.opens == 3


def test_open_kept_refuses_evicted_replaced_and_corrupt_entries(small_tree, tmp_path):
    src, spec = small_tree
    # lru, a disk tier of 12000 B: the 10000 B file is evicted by the next 3000 B one
    cache, ns, backend = _first_hit_cache(src, tmp_path, disk=12000, policy="lru")
    f, other = fid(ns, BIG), fid(ns, "dog/02.bin")
    open_read(cache, f)
    open_read(cache, f)
    old = int(cache.entries.gen[f])
    cache.open_kept(f, old).release()                      # 3 opens so far
    assert open_read(cache, other) == (spec["dog/02.bin"], "miss")   # evicts f
    assert cache.state(f) == "absent"
    assert cache.open_kept(f, old) is None                 # evicted
    assert open_read(cache, f) == (spec[BIG], "miss")      # re-admitted: a new generation (evicts other)
    new = int(cache.entries.gen[f])
    assert new > old
    open_read(cache, f)                                    # verifies the new generation
    assert cache.open_kept(f, old) is None                 # the old generation's id is stale
    cache.open_kept(f, new).release()
    # the entry found corrupt by a full open (every-open): dropped; its generation is refused after that
    cache.verify_entries = "every-open"
    assert cache.open_kept(f, new) is None                 # every-open never trusts a generation
    _flip(cache.disk_entry_path(f), 5)
    assert open_read(cache, f) == (spec[BIG], "miss")      # detected, dropped, read again
    cache.verify_entries = "first-hit"
    assert cache.open_kept(f, new) is None
    newer = int(cache.entries.gen[f])
    assert cache.open_kept(f, newer) is None               # written again, not yet verified
    s = cache.stats()
    assert (s["opens"], s["hits"]["disk"], s["misses"], s["corrupt_entries"]) == (8, 4, 4, 1)
    assert len(backend.reads) == 4


def test_open_kept_refuses_a_file_the_ram_tier_could_take(small_tree, tmp_path):
    """A disk hit that may be promoted reads (and checks) its bytes: never counted without the entry."""
    src, spec = small_tree
    cache, ns, _ = _first_hit_cache(src, tmp_path, ram=20000, disk=100000)
    f = fid(ns, "dog/00.bin")
    cache.ram_index.capacity_bytes = 0      # admitted into the disk tier only
    open_read(cache, f)
    cache.ram_index.capacity_bytes = 20000  # now RAM could take it at its next hit
    cache.verified[f] = True
    assert cache.open_kept(f, int(cache.entries.gen[f])) is None
    assert cache.opens == 1


class _H:
    """A stand-in for a handle as _Modes sees it (outcome, size, gen, backing_fd)."""

    def __init__(self, outcome, gen, fd=None, size=100):
        self.outcome, self.gen, self.size, self._fd = outcome, gen, size, fd

    def backing_fd(self):
        return self._fd


def test_modes_reuse_a_kept_backing_id_only_for_its_generation(tmp_path):
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        _modes_generations(_Modes(null), tmp_path)
    finally:
        os.close(null)


def _modes_generations(m, tmp_path):
    # m's device is /dev/null: registering a new backing id fails (ENOTTY, counted), closing one is logged
    m.kept[7] = _Kept(41, 100, 5)
    m.kept_bytes = 100
    assert m.gen_of(7) == 5 and m.gen_of(8) is None
    assert not m.on_entry(7)                             # kept, not held: a new open registers its own
    assert m.acquire(7, _H("disk", 5)) == 41               # same generation: reused, no ioctl
    assert m.gen_of(7) == 5 and m.kept_bytes == 0
    assert m.on_entry(7) and not m.on_entry(8)         # held on an entry's id: a streamed open joins it
    m.release(7)
    assert not m.on_entry(7)
    assert m.kept[7] == (41, 100, 5) and m.kept_bytes == 100
    p = tmp_path / "entry"
    p.write_bytes(b"x" * 100)
    fd = os.open(p, os.O_RDONLY)
    try:
        # a newer generation: the kept id is dropped, a new one registered from the handle's fd
        assert m.acquire(7, _H("disk", 6, fd)) is None     # (no /dev/fuse here: the ioctl fails)
        assert m.backing_errors == 1 and "Inappropriate ioctl" in m.first_error
        assert 7 not in m.kept and m.kept_bytes == 0 and m.gen_of(7) is None
    finally:
        os.close(fd)
    m.release(7)
    assert 7 not in m.kept and m.kept_bytes == 0
    # a kept id, then an older generation's entry is unlinked (late, by the mover): the id stays
    m.kept[9] = _Kept(43, 100, 2)
    m.kept_bytes = 100
    m.forget(9, 1)
    assert m.kept[9] == (43, 100, 2) and m.gen_of(9) == 2 and m.kept_bytes == 100
    # then its own generation's entry is unlinked (evicted, replaced, dropped as corrupt): forgotten
    m.forget(9, 2)
    assert m.gen_of(9) is None and m.kept_bytes == 0


def test_modes_keep_at_most_keep_ids_backing_ids_least_recently_released_out():
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        m = _Modes(null, keep_ids=2)
        for fid, bid in ((1, 51), (2, 52), (3, 53)):
            m.kept[fid] = _Kept(bid, 1000, 7)
        m.kept_bytes = 3000
        assert m.acquire(3, _H("disk", 7, size=1000)) == 53   # taken out of the kept ids while open
        m.release(3)                               # kept again, newest: 3 ids > 2, the oldest (1) is closed
        assert list(m.kept) == [2, 3] and m.kept_bytes == 2000 and m.gen_of(1) is None
        assert m.acquire(2, _H("disk", 7, size=1000)) == 52
        m.release(2)
        assert list(m.kept) == [3, 2]
        assert m.acquire(1, _H("disk", 7, size=1000)) is None  # its id is gone (no fd here: cached mode)
        m.release(1)
        assert list(m.kept) == [3, 2] and m.kept_bytes == 2000
    finally:
        os.close(null)
