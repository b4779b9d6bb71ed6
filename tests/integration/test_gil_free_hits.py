"""RAM hits answered by the kernel front end's compiled loop without the GIL (docs/architecture.md, "The front
ends"): a file's first RAM hit served by the cache publishes it; its later opens, reads and releases are
answered in C and logged, and the cache applies the log (counters, the policy's recency, the plans, the
trace) before any critical section that reads or decides on them. Real mounts; exact counts."""
import csv
import os
import re

import numpy as np
import pytest

from conftest import CI
from mountutil import read, wait_for

pytestmark = pytest.mark.usefixtures("fuse")

AUDIT = dict(os.environ, SHADEFS_AUDIT="1")
# the compiled loop answers RAM hits where no FUSE passthrough was negotiated (its io modes are per file):
# no passthrough to the source file, which a directory source has by default
KERNEL = ("--fuse-impl", "kernel", "--source-passthrough", "off")


def _c_hits(m) -> tuple:
    """(opens, READs) the compiled loop answered without the GIL, from the log line at unmount."""
    found = re.findall(r"kernel front end: (\d+) RAM hits \((\d+) READs of them\) answered without the GIL",
                       m.log())
    assert found, m.log()
    return int(found[-1][0]), int(found[-1][1])


def _gil_free(m) -> None:
    log = m.log()
    if "(compiled loop" not in log:
        (pytest.fail if CI else pytest.skip)("shadefs.fuse._fastloop is not built")
    assert "RAM hits answered without the GIL" in log, log


def _trace(path) -> list:
    with open(path, newline="") as f:
        return [(r["path"], int(r["size_bytes"]), r["outcome"]) for r in csv.DictReader(f)]


def test_a_hit_answered_in_c_is_counted_traced_and_ranked_before_the_next_eviction(small_tree, mount, tmp_path):
    """LRU with room for two of A (1000 B), B (2000 B), C (3000 B): A's third open is answered in C; the miss
    of C that follows must see it (A most recent), so B is the victim, not A."""
    src, spec = small_tree
    trace = tmp_path / "trace.csv"
    m = mount(src, *KERNEL, "--ram-cache", "5000", "--policy", "lru", "--trace", trace)
    _gil_free(m)
    a, b, c = "dog/00.bin", "cat/01.bin", "dog/02.bin"
    for rel in (a, b, a, b, a, c):   # miss, miss, hit (publishes A), hit (publishes B), hit in C, miss
        assert read(os.path.join(m.path, rel)) == spec[rel]
    s = m.stats()
    assert (s["opens"], s["hits"]["ram"], s["misses"]) == (6, 3, 3)
    assert s["tiers"]["ram"]["files"] == 2 and s["tiers"]["ram"]["evictions"] == 1
    from shadefs.control.client import ControlClient, find_endpoint
    cl = ControlClient(find_endpoint(m.path))
    try:
        assert cl.resident([a, b, c]).tolist() == [True, False, True]
    finally:
        cl.close()
    m.umount()
    assert _c_hits(m)[0] == 1
    rows = [(p.lstrip("/"), n, o) for p, n, o in _trace(trace)]
    assert rows == [(a, 1000, "miss"), (b, 2000, "miss"), (a, 1000, "ram"), (b, 2000, "ram"), (a, 1000, "ram"),
                    (c, 3000, "miss")]


def test_every_hit_answered_in_c_is_in_the_stats_at_once(small_tree, mount):
    src, spec = small_tree
    m = mount(src, *KERNEL, "--ram-cache", "100%")
    _gil_free(m)
    paths = sorted(spec)
    for i in range(7):   # a miss, a hit through the cache (publishes), then 5 answered in C, per file
        for rel in paths:
            assert read(os.path.join(m.path, rel)) == spec[rel]
        s = m.stats()    # no wait: the stats apply the log first
        assert (s["opens"], s["hits"]["ram"], s["misses"]) == (10 * (i + 1), 10 * i, 10)
        assert s["byte_hit_ratio"] == pytest.approx(i / (i + 1))
    m.umount()
    assert _c_hits(m)[0] == 50


def test_hits_answered_in_c_advance_the_plan_cursor(small_tree, mount):
    from shadefs.control.client import ControlClient, find_endpoint

    src, spec = small_tree
    m = mount(src, *KERNEL, "--ram-cache", "100%")
    _gil_free(m)
    paths = sorted(spec)
    for _ in range(2):   # resident, and published
        for rel in paths:
            assert read(os.path.join(m.path, rel)) == spec[rel]
    order = [3, 7, 1, 9, 0, 5, 2, 8, 6, 4]
    c = ControlClient(find_endpoint(m.path))
    try:
        handle, n = c.register(paths)
        assert n == 10 and c.send_plan(handle, 0, 0, [10], np.array(order, dtype=np.uint32))
        wait_for(lambda: m.full_stats()["plans_received"] == 1, timeout=10, what="the plan")
    finally:
        c.close()
    for i in order[:6]:
        assert read(os.path.join(m.path, paths[i])) == spec[paths[i]]
    p = m.full_stats()["prefetch"]
    assert (p["plans_matched"], p["plans_unmatched"], p["plans_active"]) == (6, 0, 1)
    for i in order[6:]:
        assert read(os.path.join(m.path, paths[i])) == spec[paths[i]]
    s = m.full_stats()
    assert (s["prefetch"]["plans_matched"], s["prefetch"]["plans_active"]) == (10, 0)
    assert (s["opens"], s["hits"]["ram"]) == (30, 20)
    m.umount()
    assert _c_hits(m)[0] == 10


def test_an_entry_evicted_while_an_open_answered_in_c_holds_it_keeps_its_bytes_until_released(
        small_tree, mount):
    """A (1000 B) is open through the compiled loop when a miss of a 5000 B file evicts it from the 5000 B RAM
    tier: its bytes are counted as held outside the tier (as for an open the cache answered), its READ is
    still answered with them, and they are let go at its RELEASE."""
    src, spec = small_tree
    m = mount(src, *KERNEL, "--ram-cache", "5000", "--policy", "lru", "--no-kernel-cache", env=AUDIT)
    _gil_free(m)
    a, big = "dog/00.bin", "dog/04.bin"
    pa = os.path.join(m.path, a)
    assert read(pa) == spec[a] and read(pa) == spec[a]    # miss, hit (publishes A)
    fd = os.open(pa, os.O_RDONLY)                          # answered in C: A held
    try:
        assert read(os.path.join(m.path, big)) == spec[big]   # evicts A
        s = m.full_stats()
        au = s["audit"]
        assert au["ram"] == [sorted(spec).index(big)]    # (file ids: the paths in sorted order)
        assert au["held"] == {"dying": 0, "loose": 1000, "uncounted": []}
        assert au["loose"]["bytes"] == 1000
        assert os.read(fd, 1 << 20) == spec[a]             # answered in C from the evicted entry's bytes
        assert os.read(fd, 1 << 20) == b""
    finally:
        os.close(fd)
    wait_for(lambda: m.full_stats()["audit"]["loose"]["bytes"] == 0, timeout=10, what="A's bytes let go")
    au = m.full_stats()["audit"]
    assert au["held"] == {"dying": 0, "loose": 0, "uncounted": []}
    s = m.stats()
    assert (s["opens"], s["hits"]["ram"], s["misses"]) == (4, 2, 2)
    assert read(pa) == spec[a]                             # a miss again: evicted
    assert m.stats()["misses"] == 3
    m.umount()
    opens, reads = _c_hits(m)
    assert (opens, reads) == (1, 1), (opens, reads)  # its one READ (the read at EOF sends none: the kernel knows the size)


def test_a_victim_held_in_c_with_no_loose_room_is_not_evicted_and_published_again_after(small_tree, mount):
    """No loose room (``SHADEFS_LOOSE_BUFFERS=0``): A, open through the compiled loop, cannot leave the tier,
    so the miss of a 5000 B file is not admitted (streamed) and A stays resident; its opens go through the
    cache until its next hit there publishes it again."""
    src, spec = small_tree
    env = dict(AUDIT, SHADEFS_LOOSE_BUFFERS="0")
    m = mount(src, *KERNEL, "--ram-cache", "5000", "--policy", "lru", "--no-kernel-cache", env=env)
    _gil_free(m)
    a, big = "dog/00.bin", "dog/04.bin"
    pa = os.path.join(m.path, a)
    assert read(pa) == spec[a] and read(pa) == spec[a]    # miss, hit (publishes A)
    fd = os.open(pa, os.O_RDONLY)                          # answered in C
    try:
        assert read(os.path.join(m.path, big)) == spec[big]   # a miss no tier takes: A is held
        au = m.full_stats()["audit"]
        assert au["ram"] == [sorted(spec).index(a)] and au["budget"]["ram"]["used"] == 1000
        assert au["held"] == {"dying": 0, "loose": 0, "uncounted": []} and au["loose"]["bytes"] == 0
        assert os.read(fd, 1 << 20) == spec[a]
    finally:
        os.close(fd)
    assert read(pa) == spec[a]                             # a hit through the cache: published again
    assert read(pa) == spec[a]                             # answered in C
    s = m.stats()
    assert (s["opens"], s["hits"]["ram"], s["misses"], s["tiers"]["ram"]["evictions"]) == (6, 4, 2, 0)
    m.umount()
    assert _c_hits(m)[0] == 2
