"""Which opens the cache hands to the kernel front end for passthrough to the source file, and how such an
open is counted, without a mount: the source file's fd for a streamed open (none for an open left to the
kernel's pages, none under ``off``), and the file's size at the open in ``source_passthrough_bytes`` while
``backend_bytes`` counts only what the daemon read."""
import os

from shadefs.backends.posix import PosixBackend
from shadefs.cache.core import TieredCache
from shadefs.cache.index import TierIndex
from shadefs.cache.tiers import MemoryTier
from shadefs.namespace import Namespace
from shadefs.policies import Importance, get_policy


def _cache(src, mode):
    # no tier (a RAM tier of 0 bytes): every open of a file is a miss no tier admits (streamed)
    backend = PosixBackend(str(src))
    ns = Namespace(backend.walk())
    imp = Importance(ns.num_files)
    cache = TieredCache(ns, backend, (TierIndex("ram", 0, get_policy("static")(0, imp)), MemoryTier()), None, imp)
    cache.source_passthrough = mode  # what the kernel front end sets at INIT
    return cache, ns


def test_a_streamed_open_is_handed_the_checked_source_file_and_counts_its_size(small_tree):
    src, spec = small_tree
    cache, ns = _cache(src, "untiered")
    assert cache.opens_source
    fid = ns.file_id("cat/03.bin")
    h = cache.open(fid)
    try:
        assert (h.outcome, h.source, h.gen) == ("miss", "backend", 0)
        fd = cache.source_fd(h)
        assert fd is not None
        try:
            assert os.pread(fd, 10_000, 0) == spec["cat/03.bin"]  # the source file itself
        finally:
            os.close(fd)
        s = cache.stats()
        # nothing counted before the kernel took it
        assert (s["source_passthrough_bytes"], s["backend_bytes"]) == (0, 0)
        cache.source_opened(h)
    finally:
        h.release()
    c = cache.counters()
    assert (c["opens"], c["misses"], c["streamed"], c["source_opens"]) == (1, 1, 1, 1)
    assert (c["source_passthrough_bytes"], c["backend_bytes"], c["backend_reads"]) == (4000, 0, 0)
    assert cache.stats()["source_passthrough_bytes"] == 4000


def test_an_open_left_to_the_kernels_pages_is_not_handed_the_source_file(small_tree):
    """The plan prefetcher left the file to the mount's page cache (it found its pages there and did not
    prefetch it): the open must read those pages through the mount, which passthrough would bypass."""
    src, _ = small_tree
    cache, ns = _cache(src, "untiered")
    h = cache.open(ns.file_id("dog/04.bin"))
    try:
        h.left = True  # as TieredCache._stream_open marks it when Prefetcher.kernel_holds(fid)
        assert cache.source_fd(h) is None
    finally:
        h.release()
    assert cache.counters()["source_passthrough_bytes"] == 0


def test_off_hands_no_open_the_source_file(small_tree):
    src, spec = small_tree
    cache, ns = _cache(src, "off")
    h = cache.open(ns.file_id("dog/04.bin"))
    try:
        assert cache.source_fd(h) is None
        assert h.read(0, 10_000) == spec["dog/04.bin"]  # through the daemon: counted in backend_bytes
    finally:
        h.release()
    c = cache.counters()
    assert (c["source_passthrough_bytes"], c["backend_bytes"]) == (0, 5000)
