"""A disk hit reads its entry whole into the daemon only when the RAM tier would admit it (a promotion),
into one buffer of the entry's size; a disk hit the RAM tier refuses is served from the entry (pread, or
passthrough in the kernel front end) and, when checked, checked by pieces. Real disk tier in tmp_path,
real posix backend; memory by tracemalloc (every allocation of every thread while it runs)."""
import os
import tracemalloc

import xxhash

from shadefs.cache.tiers import DiskTier

from test_cache import build, fid

SIZE = 6 << 20
PIECE = 1 << 20  # DiskTier.verify's default piece


def _tree(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    spec = {name: os.urandom(SIZE) for name in ("a.bin", "b.bin")}
    for name, data in spec.items():
        (src / name).write_bytes(data)
    return src, spec


def _open_read_peak(cache, f):
    """(bytes, outcome, handle source, peak traced bytes) of one open, whole read and release."""
    tracemalloc.start()
    try:
        h = cache.open(f)
        source = h.source
        data = h.read(0, h.size)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    h.release()
    return data, h.outcome, source, peak


def test_a_promotion_loads_the_entry_into_one_buffer(tmp_path):
    data = os.urandom(SIZE)
    p = tmp_path / "entry"
    p.write_bytes(data)
    csum = xxhash.xxh3_64_intdigest(data)
    fd = os.open(p, os.O_RDONLY)
    try:
        tracemalloc.start()
        try:
            out = DiskTier.verify(fd, SIZE, csum, keep=True)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        os.close(fd)
    assert out == data
    # one buffer of the entry's size (the pieces and their join were two)
    assert SIZE <= peak < SIZE + (64 << 10), peak


def test_a_disk_hit_the_ram_tier_refuses_is_never_loaded_whole(tmp_path):
    src, spec = _tree(tmp_path)
    # static: RAM holds a.bin (and cannot take b.bin beside it: it never evicts), b.bin goes to disk
    cache, ns, backend = build(src, tmp_path, "static", ram=SIZE + 1000, disk=4 * SIZE)
    a, b = fid(ns, "a.bin"), fid(ns, "b.bin")
    assert _open_read_peak(cache, a)[:2] == (spec["a.bin"], "miss")
    assert _open_read_peak(cache, b)[:2] == (spec["b.bin"], "miss")
    assert a in cache.ram_index and b in cache.disk_index
    # every-open: the hit is checked by pieces and served from the entry; nothing of its size is held
    data, outcome, source, peak = _open_read_peak(cache, b)
    assert (data, outcome, source) == (spec["b.bin"], "disk", "entry")
    assert peak < SIZE + PIECE + (64 << 10), peak  # the read's own buffer and one piece
    # first-hit, verified at the last hit: no read of the entry at all before the READs
    cache.verify_entries = "first-hit"
    tracemalloc.start()
    try:
        h = cache.open(b)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (h.outcome, h.source) == ("disk", "entry") and h.read(0, SIZE) == spec["b.bin"]
    h.release()
    assert peak < (64 << 10), peak
    c = cache.counters()
    assert (c["hits_disk"], c["promotions"], c["entry_loads"], c["misses"]) == (2, 0, 0, 2)
    assert len(backend.reads) == 2


def test_a_disk_hit_the_ram_tier_admits_is_loaded_once_and_promoted(tmp_path):
    src, spec = _tree(tmp_path)
    # lru, RAM of one file: b.bin evicts a.bin (demoted to disk); a.bin's hit evicts b.bin and is promoted
    cache, ns, backend = build(src, tmp_path, "lru", ram=SIZE + 1000, disk=4 * SIZE)
    a, b = fid(ns, "a.bin"), fid(ns, "b.bin")
    _open_read_peak(cache, a)
    _open_read_peak(cache, b)
    assert a in cache.disk_index and b in cache.ram_index
    data, outcome, source, peak = _open_read_peak(cache, a)
    assert (data, outcome, source) == (spec["a.bin"], "disk", "memory")
    assert a in cache.ram_index
    # the RAM tier's buffer, and the read's copy of it: never a third buffer of the entry's size
    assert peak < 2 * SIZE + (256 << 10), peak
    c = cache.counters()
    assert (c["hits_disk"], c["promotions"], c["entry_loads"]) == (1, 1, 1)
