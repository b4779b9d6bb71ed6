"""The read path without a mount: tiers, promotion/demotion, single-flight, corrupt entries, budgets."""
import os
import random
import threading

import pytest

from shadefs.backends.posix import PosixBackend
from shadefs.cache.core import TieredCache
from shadefs.cache.index import TierIndex
from shadefs.cache.tiers import DiskTier, MemoryTier
from shadefs.namespace import Namespace
from shadefs.policies import Importance, get_policy
from shadefs.testing.handles import open_read


class CountingBackend(PosixBackend):
    """The real posix backend, counting reads and optionally holding them until released."""

    def __init__(self, url, gate=None):
        super().__init__(url)
        self.reads = []
        self.gate = gate
        self.lock = threading.Lock()
        self.reading = threading.Event()  # set once a read has started (bounded waits, no busy loops)

    def read(self, path, size):
        with self.lock:
            self.reads.append(path)
        self.reading.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        return super().read(path, size)


def build(src, tmp_path, policy="lru", ram=0, disk=0, gate=None):
    backend = CountingBackend(str(src), gate)
    ns = Namespace(backend.walk())
    imp = Importance(ns.num_files)
    cls = get_policy(policy)
    ram_t = (TierIndex("ram", ram, cls(ram, imp)), MemoryTier())
    disk_t = (TierIndex("disk", disk, cls(disk, imp)), DiskTier(str(tmp_path / "cache"), str(src))) if disk else None
    return TieredCache(ns, backend, ram_t, disk_t, imp), ns, backend


def fid(ns, name):
    return ns.file_id(name)


def test_every_open_returns_the_source_bytes(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, _ = build(src, tmp_path, "lru", ram=12000, disk=20000)
    rng = random.Random(1)
    names = sorted(spec)
    for _ in range(200):
        name = rng.choice(names)
        data, outcome = open_read(cache, fid(ns, name))
        assert data == spec[name]
        assert outcome in ("ram", "disk", "miss")
    s = cache.stats()
    assert s["opens"] == 200 == s["hits"]["ram"] + s["hits"]["disk"] + s["misses"]
    assert s["tiers"]["ram"]["used_bytes"] <= 12000 and s["tiers"]["disk"]["used_bytes"] <= 20000


def test_lru_demotes_ram_victims_and_promotes_disk_hits(small_tree, tmp_path):
    src, spec = small_tree
    # files 00..02 are 1000, 2000, 3000 bytes; RAM holds 3000 bytes, disk 10000
    cache, ns, backend = build(src, tmp_path, "lru", ram=3000, disk=10000)
    a, b, c = fid(ns, "dog/00.bin"), fid(ns, "cat/01.bin"), fid(ns, "dog/02.bin")
    assert open_read(cache, a)[1] == "miss"   # RAM: a
    assert open_read(cache, b)[1] == "miss"   # RAM: a, b (3000)
    assert open_read(cache, c)[1] == "miss"   # RAM evicts a, b -> demoted to disk; RAM: c
    assert a in cache.disk_index and b in cache.disk_index and c in cache.ram_index
    assert open_read(cache, a)[1] == "disk"   # promoted: RAM evicts c -> disk; RAM: a
    assert a in cache.ram_index and a not in cache.disk_index and c in cache.disk_index
    assert open_read(cache, a)[1] == "ram"
    assert len(backend.reads) == 3
    s = cache.stats()
    assert s["hits"] == {"ram": 1, "disk": 1} and s["misses"] == 3
    assert s["backend_bytes"] == 6000
    assert s["tiers"]["ram"]["evictions"] == 3 and s["tiers"]["disk"]["evictions"] == 0
    # the disk entry files exist exactly for the disk-resident ids
    for f in (b, c):
        assert os.path.exists(cache.disk_entry_path(f))
    assert cache.disk_entry_path(a) is None
    h = cache.disk.key(ns.path(a))
    assert not [n for n in os.listdir(os.path.join(cache.disk.dir, h[:2])) if n.startswith(h)]


def test_static_fills_ram_then_disk_and_never_evicts(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, _ = build(src, tmp_path, "static", ram=3000, disk=4000)
    order = ["dog/00.bin", "cat/01.bin", "dog/02.bin", "cat/03.bin", "dog/04.bin"]  # 1000..5000 bytes
    for name in order:
        open_read(cache, fid(ns, name))
    assert sorted(ns.path(f) for f in cache.ram_index.sizes) == ["cat/01.bin", "dog/00.bin"]
    assert sorted(ns.path(f) for f in cache.disk_index.sizes) == ["dog/02.bin"]
    assert cache.stats()["tiers"]["disk"]["evictions"] == 0
    assert [open_read(cache, fid(ns, n))[1] for n in order] == ["ram", "ram", "disk", "miss", "miss"]


def test_single_flight_shares_one_backend_read(small_tree, tmp_path):
    src, spec = small_tree
    gate = threading.Event()
    cache, ns, backend = build(src, tmp_path, "static", ram=100000, gate=gate)
    f = fid(ns, "cat/05.bin")
    results = []
    threads = [threading.Thread(target=lambda: results.append(open_read(cache, f))) for _ in range(4)]
    for t in threads:
        t.start()
    assert backend.reading.wait(10), "no backend read started within 10 s"
    # a hit on another (cached) file must not wait behind the held miss
    other = fid(ns, "dog/00.bin")
    cache.ram_index.admit(other, 1000)
    cache.ram.put(other, spec["dog/00.bin"])
    assert open_read(cache, other) == (spec["dog/00.bin"], "ram")
    gate.set()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), "an open is still blocked 10 s after the read was released"
    assert backend.reads == ["cat/05.bin"]
    assert [r[0] == spec["cat/05.bin"] for r in results] == [True] * 4
    assert cache.stats()["misses"] == 4 and cache.stats()["backend_bytes"] == 6000


def test_corrupt_disk_entry_is_dropped_and_read_from_backend(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, backend = build(src, tmp_path, "static", ram=0, disk=100000)
    f = fid(ns, "dog/04.bin")
    open_read(cache, f)
    path = cache.disk_entry_path(f)
    with open(path, "r+b") as fh:
        fh.truncate(100)  # a partial entry
    data, outcome = open_read(cache, f)
    assert (data, outcome) == (spec["dog/04.bin"], "miss")
    assert cache.corrupt_entries == 1
    assert open_read(cache, f) == (spec["dog/04.bin"], "disk")  # re-admitted whole


def test_a_flipped_byte_is_counted_in_the_stats_json_counters_and_prometheus(small_tree, tmp_path):
    """One byte flipped inside a disk entry (same size): the hit is refused, the backend's bytes are
    served, and the three views of ``corrupt_entries`` say 1 (the real-mount test is the stress suite's)."""
    import types

    from prometheus_client import CollectorRegistry, generate_latest

    from shadefs import metrics as M

    src, spec = small_tree
    cache, ns, backend = build(src, tmp_path, "static", ram=0, disk=100000)
    f = fid(ns, "cat/05.bin")
    assert open_read(cache, f) == (spec["cat/05.bin"], "miss")
    assert cache.stats()["corrupt_entries"] == 0
    path = cache.disk_entry_path(f)
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:
        fh.seek(size // 2)
        b = fh.read(1)
        fh.seek(size // 2)
        fh.write(bytes([b[0] ^ 0x01]))
    assert os.path.getsize(path) == size
    assert open_read(cache, f) == (spec["cat/05.bin"], "miss")  # verified, dropped, read again
    assert backend.reads == ["cat/05.bin", "cat/05.bin"]
    assert cache.stats()["corrupt_entries"] == 1
    assert cache.counters()["corrupt_entries"] == 1
    registry = CollectorRegistry(auto_describe=False)
    daemon = types.SimpleNamespace(cache=cache, backend=backend,
                                   cfg=types.SimpleNamespace(mountpoint="/mnt/x", policy="static"))
    registry.register(M.CacheCollector(daemon))
    text = generate_latest(registry).decode()
    assert f"{M.CORRUPT} 1.0" in text.splitlines()
    assert open_read(cache, f) == (spec["cat/05.bin"], "disk")  # the re-read entry is good
    assert cache.stats()["corrupt_entries"] == 1


def test_missing_source_file_is_file_not_found(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, _ = build(src, tmp_path, "static", ram=100000)
    os.unlink(os.path.join(src, "cat/07.bin"))
    with pytest.raises(FileNotFoundError):
        open_read(cache, fid(ns, "cat/07.bin"))
    assert cache.stats()["misses"] == 1 and cache.backend_errors == 0


def test_changed_source_file_is_an_error_not_a_short_file(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, _ = build(src, tmp_path, "static", ram=100000)
    with open(os.path.join(src, "cat/09.bin"), "wb") as fh:
        fh.write(b"short")
    with pytest.raises(OSError, match="changed"):
        open_read(cache, fid(ns, "cat/09.bin"))
    assert fid(ns, "cat/09.bin") not in cache.ram_index


@pytest.mark.parametrize("policy", ["static", "lru", "fifo"])
def test_budgets_hold_under_concurrent_opens(small_tree, tmp_path, policy):
    src, spec = small_tree
    cache, ns, _ = build(src, tmp_path, policy, ram=7000, disk=9000)
    names = sorted(spec)
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        try:
            for _ in range(150):
                name = rng.choice(names)
                assert open_read(cache, fid(ns, name))[0] == spec[name]
                with cache.lock:
                    for idx in (cache.ram_index, cache.disk_index):
                        assert idx.used_bytes + idx.reserved_bytes <= idx.capacity_bytes
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    s = cache.stats()
    assert s["opens"] == 900 == s["hits"]["ram"] + s["hits"]["disk"] + s["misses"]
    assert not (set(cache.ram_index.sizes) & set(cache.disk_index.sizes))  # exclusive tiers


def test_a_file_no_tier_admits_is_read_whole_once_into_a_transient_buffer(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, backend = build(src, tmp_path, "lru", ram=3000, disk=4000)
    big = fid(ns, "dog/08.bin")  # 9000 bytes: above both tiers, at most whole_max
    ranges = []
    real = backend.read_range
    backend.read_range = lambda *a: ranges.append(a) or real(*a)
    h = cache.open(big)
    assert (h.outcome, h.source, h.backing_fd()) == ("miss", "memory", None)
    assert backend.reads == ["dog/08.bin"]  # one whole read, whatever the READ sizes that follow
    assert cache.loose_bytes == 9000          # the transient buffer is counted loose while held
    assert b"".join(h.read(off, 1000) for off in range(0, 9000, 1000)) == spec["dog/08.bin"]
    assert h.read(9000, 10) == b"" and ranges == []
    h.release()
    s = cache.stats()
    assert s["misses"] == 1 and s["backend_bytes"] == 9000
    assert big not in cache.ram_index and big not in cache.disk_index
    c = cache.counters()
    assert (c["streamed"], c["backend_reads"], c["loose_bytes"]) == (0, 1, 0)
    # a file a tier admits is cached as usual
    assert open_read(cache, fid(ns, "cat/01.bin")) == (spec["cat/01.bin"], "miss")
    assert fid(ns, "cat/01.bin") in cache.ram_index


def test_a_file_above_whole_max_is_streamed_by_whole_chunks(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, backend = build(src, tmp_path, "lru", ram=3000, disk=4000)
    cache.whole_max = cache.chunk = 4096
    big = fid(ns, "dog/08.bin")  # 9000 bytes: three chunks of 4096
    ranges = []
    real = backend.read_range
    backend.read_range = lambda *a: ranges.append(a) or real(*a)
    h = cache.open(big)
    assert (h.outcome, h.source, h.backing_fd()) == ("miss", "backend", None)
    assert backend.reads == [] and ranges == []  # nothing read at open
    assert b"".join(h.read(off, 1000) for off in range(0, 9000, 1000)) == spec["dog/08.bin"]
    assert h.read(9000, 10) == b""
    assert ranges == [("dog/08.bin", 0, 4096), ("dog/08.bin", 4096, 4096), ("dog/08.bin", 8192, 808)]
    assert cache.loose_bytes == 4096  # the chunk the handle holds
    h.release()
    c = cache.counters()
    assert (c["streamed"], c["misses"], c["loose_bytes"], c["backend_bytes"]) == (1, 1, 0, 9000)
    # no loose room for a chunk: exactly the bytes asked, as before
    cache.loose_budget = 100
    h = cache.open(big)
    assert h.read(5000, 10) == spec["dog/08.bin"][5000:5010] and ranges[-1] == ("dog/08.bin", 5000, 10)
    h.release()


def _flip(path, at):
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x01]))


def test_first_hit_verification_checks_each_entry_generation_once(small_tree, tmp_path):
    """--verify-entries first-hit (opt-in): an entry is verified at its first hit after it was written;
    a byte flipped before that hit is caught, one flipped after it is not (the documented trade: every
    later hit of that generation trusts it), and the next generation is verified again."""
    src, spec = small_tree
    cache, ns, backend = build(src, tmp_path, "static", ram=0, disk=100000)
    cache.verify_entries = "first-hit"
    f = fid(ns, "dog/04.bin")
    want = spec["dog/04.bin"]
    assert open_read(cache, f) == (want, "miss")          # written into the disk tier, not yet read back
    _flip(cache.disk_entry_path(f), 10)
    assert open_read(cache, f) == (want, "miss")          # its first hit verifies it: dropped, re-read
    assert cache.corrupt_entries == 1 and len(backend.reads) == 2
    assert open_read(cache, f) == (want, "disk")          # the new generation's first hit: verified
    assert bool(cache.verified[f])
    _flip(cache.disk_entry_path(f), 20)
    data, outcome = open_read(cache, f)                   # trusted: not read back, not detected
    assert outcome == "disk" and data != want and data[:20] == want[:20] and data[21:] == want[21:]
    assert cache.corrupt_entries == 1


def test_every_open_verification_catches_a_flip_after_earlier_hits(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, backend = build(src, tmp_path, "static", ram=0, disk=100000)
    assert cache.verify_entries == "every-open"                 # the default: every disk hit
    f = fid(ns, "cat/05.bin")
    want = spec["cat/05.bin"]
    open_read(cache, f)
    assert open_read(cache, f) == (want, "disk")
    assert open_read(cache, f) == (want, "disk")
    _flip(cache.disk_entry_path(f), 30)
    assert open_read(cache, f) == (want, "miss")
    assert cache.corrupt_entries == 1 and len(backend.reads) == 2
    assert open_read(cache, f) == (want, "disk")


def test_kernel_pages_are_kept_for_hits_and_untiered_files(small_tree, tmp_path):
    """``Handle.keep_pages`` (the front ends' FOPEN_KEEP_CACHE): the pages of a hit and of a file no tier
    holds are kept between opens (the mount is a snapshot); a miss that fills a tier drops them (the open
    sees the bytes the tier now holds), and so does the first open after the file's disk entry was dropped
    as corrupt (pages read from that entry are not served again)."""
    src, spec = small_tree
    cache, ns, backend = build(src, tmp_path, "static", ram=0, disk=5000)
    f, big = fid(ns, "dog/04.bin"), fid(ns, "dog/08.bin")  # 5000 bytes: fits the disk tier; 9000: no tier

    def opened(x):
        h = cache.open(x)
        try:
            assert h.read(0, 1 << 20) == spec[ns.path(x)]
            return h.outcome, h.source, h.keep_pages
        finally:
            h.release()

    assert opened(big) == ("miss", "memory", True)   # read whole into a transient buffer
    assert opened(big) == ("miss", "backend", True)  # its pages may be kept: streamed at a READ, if any
    assert opened(f) == ("miss", "entry", False)   # fills the disk tier
    assert opened(f) == ("disk", "entry", True)
    _flip(cache.disk_entry_path(f), 10)
    cache.disk_index.capacity_bytes = 4000           # the tier will not take it again: untiered from now on
    assert opened(f) == ("miss", "memory", False)  # its corrupt entry dropped: pages read from it dropped
    assert opened(f) == ("miss", "backend", True)
    assert cache.corrupt_entries == 1


@pytest.mark.parametrize("size", [0, 1, 300, 1 << 20, (1 << 20) + 7])
def test_entry_verify_exact_short_long(tmp_path, size):
    """DiskTier.verify: the exact bytes pass (one pread below 1 MiB), a byte short or long, or one
    flipped byte, is CorruptEntry."""
    import xxhash

    from shadefs.cache.tiers import CorruptEntry, DiskTier

    data = os.urandom(size)
    csum = xxhash.xxh3_64_intdigest(data)
    p = tmp_path / "e"
    variants = {"exact": data, "long": data + b"x", "short": data[:-1] if size else None,
                "flipped": (bytes([data[0] ^ 1]) + data[1:]) if size else None}
    for name, content in variants.items():
        if content is None:
            continue
        p.write_bytes(content)
        fd = os.open(p, os.O_RDONLY)
        try:
            if name == "exact":
                assert DiskTier.verify(fd, size, csum, keep=True) == data
                assert DiskTier.verify(fd, size, csum, keep=False) is None
            else:
                with pytest.raises(CorruptEntry):
                    DiskTier.verify(fd, size, csum, keep=True)
        finally:
            os.close(fd)
