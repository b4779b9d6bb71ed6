"""Files above the chunk size are cached by chunks, through real mounts: only the chunks a reader
touches are read and admitted, each chunk is its own entry (counted, traced, evicted, verified), and a
corrupted chunk entry is dropped and read again, never served."""
import mmap
import os
import random

import pytest

from shadefs import sim
from shadefs.cache.chunks import CHUNK

pytestmark = pytest.mark.usefixtures("fuse")

AUDIT = dict(os.environ, SHADEFS_AUDIT="1")
BIG = 2 * CHUNK + CHUNK // 2  # chunks of CHUNK, CHUNK and CHUNK / 2 bytes


def _tree(tmp_path, n=1):
    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(5)
    spec = {}
    for i in range(n):
        spec[f"big{i}.bin"] = rng.randbytes(BIG)
    spec["small.bin"] = rng.randbytes(3000)
    for rel, data in spec.items():
        (src / rel).write_bytes(data)
    return src, spec


def _pread(path, offset, length):
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


@pytest.mark.both_frontends
def test_a_read_caches_only_the_chunk_it_touches(tmp_path, mount):
    src, spec = _tree(tmp_path)
    m = mount(src, "--ram-cache", str(CHUNK + CHUNK // 2), "--no-kernel-cache")
    p = os.path.join(m.path, "big0.bin")
    off = CHUNK + 12345
    assert _pread(p, off, 4096) == spec["big0.bin"][off:off + 4096]
    s = m.stats()
    # one entry opened (chunk 1), a miss; read with one request of the chunk, admitted to RAM whole
    assert (s["opens"], s["misses"], s["hits"]["ram"]) == (1, 1, 0)
    assert s["backend_bytes"] == CHUNK
    assert (s["tiers"]["ram"]["files"], s["tiers"]["ram"]["used_bytes"]) == (1, CHUNK)
    assert _pread(p, off - 100, 200) == spec["big0.bin"][off - 100:off + 100]
    s = m.stats()
    assert (s["opens"], s["hits"]["ram"], s["backend_bytes"]) == (2, 1, CHUNK)
    # a read across chunks 0 and 1: chunk 0 is a miss no tier admits (static: the RAM tier is full)
    assert _pread(p, CHUNK - 10, 20) == spec["big0.bin"][CHUNK - 10:CHUNK + 10]
    s = m.stats()
    assert (s["opens"], s["misses"], s["hits"]["ram"]) == (4, 2, 2)
    assert (s["tiers"]["ram"]["files"], s["tiers"]["ram"]["used_bytes"]) == (1, CHUNK)
    assert s["backend_bytes"] == 2 * CHUNK
    with open(p, "rb") as f:
        assert f.read() == spec["big0.bin"]
    with open(os.path.join(m.path, "small.bin"), "rb") as f:
        assert f.read() == spec["small.bin"]


@pytest.mark.both_frontends
def test_chunks_fill_the_disk_tier_and_a_corrupt_chunk_is_read_again(tmp_path, mount):
    src, spec = _tree(tmp_path)
    cache = tmp_path / "cache"
    m = mount(src, "--ram-cache", "0", "--disk-cache", str(cache), "--disk-cache-size", str(4 * CHUNK),
              "--no-kernel-cache", env=AUDIT)
    p = os.path.join(m.path, "big0.bin")
    with open(p, "rb") as f:
        assert f.read() == spec["big0.bin"]
    a = m.full_stats()["audit"]
    # file ids: big0.bin 0, small.bin 1; chunks 2, 3, 4
    assert a["disk"] == [2, 3, 4]
    s = m.stats()
    assert (s["opens"], s["misses"], s["backend_bytes"]) == (3, 3, BIG)
    entry = a["entries"]["3"]  # chunk 1
    assert os.path.getsize(entry) == CHUNK
    with open(entry, "r+b") as f:
        f.seek(CHUNK // 3)
        b = f.read(1)
        f.seek(CHUNK // 3)
        f.write(bytes([b[0] ^ 0xFF]))
    with open(p, "rb") as f:
        assert f.read() == spec["big0.bin"]
    s = m.stats()
    assert s["corrupt_entries"] == 1
    assert (s["opens"], s["hits"]["disk"], s["misses"]) == (6, 2, 4)
    assert s["backend_bytes"] == BIG + CHUNK  # the corrupt chunk, read again; nothing else
    assert m.full_stats()["audit"]["disk"] == [2, 3, 4]  # and written again
    with open(p, "rb") as f:
        assert f.read() == spec["big0.bin"]
    s = m.stats()
    assert (s["opens"], s["hits"]["disk"], s["corrupt_entries"]) == (9, 5, 1)


@pytest.mark.parametrize("policy", ["lru", "static"])
def test_live_chunk_hits_equal_the_replay(tmp_path, mount, policy):
    src, spec = _tree(tmp_path, n=3)
    trace = tmp_path / "trace.csv"
    cap = 3 * CHUNK
    m = mount(src, "--ram-cache", str(cap), "--policy", policy, "--trace", trace, "--no-kernel-cache")
    rng = random.Random(policy)
    # one reader, and reads shorter than a sequential run (SEQUENTIAL_RUN, with the kernel's read-ahead
    # around them): no chunk is opened ahead on a worker, so the trace's order is the order of the opens
    for _ in range(40):
        rel = rng.choice(sorted(spec))
        size = len(spec[rel])
        off = rng.randrange(size)
        n = rng.choice([100, 5000, 600_000])
        assert _pread(os.path.join(m.path, rel), off, n) == spec[rel][off:off + n]
    live = m.stats()
    t = sim.read_trace(str(trace))
    assert t.requests == live["opens"]
    assert any("/@chunk/" in p for p in t.paths)
    result = sim.simulate(t, policy, cap)
    assert result.hits == live["hits"]["ram"]
    assert result.byte_hit_ratio == pytest.approx(live["byte_hit_ratio"])


def _disk_mount(mount, src, cache):
    return mount(src, "--ram-cache", "0", "--disk-cache", str(cache), "--disk-cache-size", str(4 * CHUNK),
                 "--no-kernel-cache")


def test_chunk_entries_are_reloaded_after_a_restart(tmp_path, mount):
    src, spec = _tree(tmp_path)
    cache = tmp_path / "cache"
    m = _disk_mount(mount, src, cache)
    assert _pread(os.path.join(m.path, "big0.bin"), CHUNK + 5, 10) == spec["big0.bin"][CHUNK + 5:CHUNK + 15]
    assert m.stats()["tiers"]["disk"]["files"] == 1  # chunk 1 only
    m.umount()
    m.start()
    s = m.stats()
    assert s["tiers"]["disk"]["files"] == 1
    assert "disk tier: reloaded 1 entries (8388608 bytes)" in m.log()
    with open(os.path.join(m.path, "big0.bin"), "rb") as f:
        assert f.read() == spec["big0.bin"]
    s = m.stats()
    # chunk 1 is a disk hit from the first open; chunks 0 and 2 are read from the source
    assert (s["opens"], s["hits"]["disk"], s["misses"]) == (3, 1, 2)
    assert s["backend_bytes"] == BIG - CHUNK


def test_a_chunked_file_changed_at_the_source_is_never_served_from_old_chunks(tmp_path, mount):
    src, spec = _tree(tmp_path)
    cache = tmp_path / "cache"
    m = _disk_mount(mount, src, cache)
    p = os.path.join(m.path, "big0.bin")
    with open(p, "rb") as f:
        assert f.read() == spec["big0.bin"]
    assert m.stats()["tiers"]["disk"]["files"] == 3
    m.umount()
    # same size, new bytes and mtime; the directory's mtime is kept, so the snapshot is reused and the
    # file is compared with the source at its first open
    new = bytes(b ^ 0x5A for b in spec["big0.bin"])
    st = os.stat(src / "big0.bin")
    with open(src / "big0.bin", "r+b") as f:  # in place: the directory's mtime and ctime stay
        f.write(new)
    os.utime(src / "big0.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    m.start()
    assert m.stats()["tiers"]["disk"]["files"] == 3  # reloaded: the snapshot still says the old version
    with open(p, "rb") as f:
        assert f.read() == new
    s = m.stats()
    assert (s["opens"], s["hits"]["disk"], s["misses"]) == (3, 0, 3)
    assert s["backend_bytes"] == BIG
    assert s["tiers"]["disk"]["files"] == 3


@pytest.mark.parametrize("advice", ["random", "normal"])
def test_a_sequential_reader_has_the_next_chunk_opened_ahead(tmp_path, mount, advice):
    from mountutil import wait_for

    src, spec = _tree(tmp_path)
    m = mount(src, "--ram-cache", str(4 * CHUNK), "--no-kernel-cache")
    fd = os.open(os.path.join(m.path, "big0.bin"), os.O_RDONLY)
    # random: no kernel read-ahead, each pread is its own READ, in order. normal: the kernel sends several
    # read-ahead READs at once, which the two reader threads may serve out of order (still one run: reads
    # near the furthest end continue it, shadefs.cache.chunks.RUN_WINDOW)
    if advice == "random":
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    try:
        got = b"".join(os.pread(fd, 1 << 20, off) for off in range(0, 5 << 20, 1 << 20))
        assert got == spec["big0.bin"][:5 << 20]
        # half-way through chunk 0, read back to back: chunk 1 is opened (a miss, admitted) ahead of the reader
        s = wait_for(lambda: (lambda s: s if s["opens"] == 2 else None)(m.stats()), what="chunk 1 read ahead")
        assert (s["misses"], s["tiers"]["ram"]["files"], s["backend_bytes"]) == (2, 2, 2 * CHUNK)
        assert os.pread(fd, 1 << 20, CHUNK) == spec["big0.bin"][CHUNK:CHUNK + (1 << 20)]
        s = m.stats()
        assert (s["opens"], s["misses"], s["backend_bytes"]) == (2, 2, 2 * CHUNK)  # served by the held chunk
    finally:
        os.close(fd)


def test_first_hit_verifies_each_reloaded_chunk_and_drops_a_corrupt_one(tmp_path, mount):
    import hashlib

    from shadefs.cache.tiers import DiskTier

    src, spec = _tree(tmp_path)
    cache = tmp_path / "cache"
    args = ("--ram-cache", "0", "--disk-cache", str(cache), "--disk-cache-size", str(4 * CHUNK),
            "--no-kernel-cache", "--verify-entries", "first-hit")
    m = mount(src, *args)
    p = os.path.join(m.path, "big0.bin")
    with open(p, "rb") as f:
        assert f.read() == spec["big0.bin"]
    m.umount()
    ns_dir = os.path.join(str(cache), hashlib.sha256(str(src).encode()).hexdigest()[:16])
    h = DiskTier.key("big0.bin/@chunk/1")
    (name,) = [n for n in os.listdir(os.path.join(ns_dir, h[:2])) if n.startswith(h + ".")]
    with open(os.path.join(ns_dir, h[:2], name), "r+b") as f:
        f.seek(777)
        b = f.read(1)
        f.seek(777)
        f.write(bytes([b[0] ^ 1]))
    m.start()
    assert m.stats()["tiers"]["disk"]["files"] == 3  # the reload reads no data
    with open(p, "rb") as f:
        assert f.read() == spec["big0.bin"]
    s = m.stats()
    assert (s["opens"], s["hits"]["disk"], s["misses"], s["corrupt_entries"]) == (3, 2, 1, 1)
    assert s["backend_bytes"] == CHUNK


def test_a_plans_next_use_of_a_file_is_the_next_use_of_its_chunks(tmp_path, mount):
    import numpy as np
    from mountutil import wait_for

    from shadefs.control.client import ControlClient, find_endpoint

    src, spec = _tree(tmp_path, n=3)
    m = mount(src, "--ram-cache", str(2 * CHUNK), "--policy", "lru", "--no-kernel-cache")
    c = ControlClient(find_endpoint(m.path))
    try:
        handle, _ = c.register(["big0.bin", "big1.bin", "big2.bin"])
        c.send_plan(handle, 0, 0, [6], np.array([0, 1, 2, 0, 1, 2], dtype=np.uint32))
        wait_for(lambda: m.full_stats()["plans_received"] == 1, what="the plan")
    finally:
        c.close()
    for i in (0, 1, 2, 0, 1, 2):  # chunk 0 of each file, in the plan's order
        assert _pread(os.path.join(m.path, f"big{i}.bin"), 100, 4096) == spec[f"big{i}.bin"][100:4196]
    s = m.stats()
    # Belady on the plan: big2's chunk (next use furthest) is not admitted over big0's and big1's, which
    # are hits next; LRU without the plan's ranking of chunks would evict each one before its reuse (0 hits)
    assert (s["opens"], s["hits"]["ram"], s["misses"]) == (6, 2, 4)
    assert s["prefetch"]["plans_retired"] == 0


@pytest.mark.both_frontends
def test_a_chunked_file_no_tier_admits_is_read_again_from_the_kernels_pages(tmp_path, mount):
    """Random records of a chunked file no tier admits (HDF5, LMDB, an mmap'd array over a small tier):
    the first epoch reads each chunk from the backend once; every later epoch (a new
    open, the same records in another order, by pread and by mmap) is served by the kernel's pages: no
    chunk is opened, no byte is read from the backend."""
    src, spec = _tree(tmp_path)
    data = spec["big0.bin"]
    # through the daemon (passthrough to the source file: tests/integration/test_source_passthrough.py)
    m = mount(src, "--ram-cache", "64KiB", "--source-passthrough", "off", env=AUDIT)
    p = os.path.join(m.path, "big0.bin")
    rng = random.Random(11)
    offsets = rng.sample(range(0, BIG - 10_000, 4096), 300)

    def counters():
        s = m.full_stats()
        c = s["audit"]["counters"]
        return (c["opens"], c["misses"], c["range_reads"], c["backend_reads"], s["backend_bytes"])

    def epoch(order):
        fd = os.open(p, os.O_RDONLY)
        try:
            for off in order:
                assert os.pread(fd, 10_000, off) == data[off:off + 10_000]
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mm:
                for off in order[::7]:
                    assert mm[off:off + 100] == data[off:off + 100]
        finally:
            os.close(fd)

    epoch(offsets)
    first = counters()
    # each chunk opened once by the handle, a miss no tier admits read whole once (a transient buffer)
    assert first == (3, 3, 0, 3, BIG)
    for e in range(2):
        epoch(random.Random(e).sample(offsets, len(offsets)))
        assert counters() == first  # nothing reached the daemon
    s = m.stats()
    assert s["tiers"]["ram"]["files"] == 0


def test_a_planned_replay_of_chunk_rows_equals_the_planned_daemon(tmp_path, mount):
    """``shadefs simulate --plan`` on a trace of chunk rows plans them as the daemon does (the plan
    names files; a chunk's next use is its file's): its hits are the planned daemon's."""
    import numpy as np
    from mountutil import wait_for

    from shadefs.control.client import ControlClient, find_endpoint

    src, spec = _tree(tmp_path, n=2)
    trace = tmp_path / "trace.csv"
    cap = 2 * CHUNK
    m = mount(src, "--ram-cache", str(cap), "--policy", "lru", "--trace", trace, "--no-kernel-cache")
    c = ControlClient(find_endpoint(m.path))
    try:
        handle, _ = c.register(["big0.bin", "big1.bin"])
        c.send_plan(handle, 0, 0, [4], np.array([0, 1, 0, 1], dtype=np.uint32))
        wait_for(lambda: m.full_stats()["plans_received"] == 1, what="the plan")
    finally:
        c.close()
    # big0 across its chunks 0 and 1 (one open, two chunk rows), big1's chunk 0, big0's chunk 0, big1's
    # chunk 0: chunk 1 of big0 is never read again, but the plan knows files, not chunks
    for rel, off in (("big0.bin", CHUNK - 50), ("big1.bin", 100), ("big0.bin", 100), ("big1.bin", 100)):
        assert _pread(os.path.join(m.path, rel), off, 100) == spec[rel][off:off + 100]
    live = m.stats()
    assert (live["opens"], live["hits"]["ram"]) == (5, 1)
    t = sim.read_trace(str(trace))
    assert t.requests == 5
    assert sim.simulate_plan(t, "lru", cap).hits == live["hits"]["ram"]


@pytest.mark.both_frontends
@pytest.mark.parametrize("verify", ["every-open", "first-hit"])
def test_a_chunk_disk_hit_the_ram_tier_refuses_is_never_read_whole(tmp_path, mount, verify):
    """NVMe hits of chunks with a RAM tier that holds one chunk and never evicts (static): the first hit is
    promoted (its entry read whole, once), the others are served from their entries without being read
    whole into the daemon (``entry_loads``)."""
    src, spec = _tree(tmp_path)
    cache = tmp_path / "cache"
    common = ["--disk-cache", str(cache), "--disk-cache-size", str(4 * CHUNK), "--verify-entries", verify,
              "--no-kernel-cache"]
    m = mount(src, "--ram-cache", "0", *common)
    with open(os.path.join(m.path, "big0.bin"), "rb") as f:
        assert f.read() == spec["big0.bin"]
    m.umount()
    m = mount(src, "--ram-cache", str(CHUNK + (1 << 20)), "--policy", "static", *common, env=AUDIT)
    for _ in range(2):
        with open(os.path.join(m.path, "big0.bin"), "rb") as f:
            assert f.read() == spec["big0.bin"]
    c = m.full_stats()["audit"]["counters"]
    # chunk 0 promoted at its first hit (then RAM hits); chunks 1 and 2: 2 disk hits each, never loaded
    assert (c["hits_disk"], c["hits_ram"], c["promotions"], c["entry_loads"], c["misses"]) == (5, 1, 1, 1, 0)
