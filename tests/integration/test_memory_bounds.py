"""The daemon's memory bounds on real mounts (docs/operations.md, "The daemon's memory").

- Fill buffers: concurrent misses whose backend reads hang (the source is a FUSE filesystem run in this
  process whose ``hang/`` opens block until the test opens the gate) hold at most ``SHADEFS_FILL_BUFFERS``
  bytes of reads in flight; the others wait for room, counted, and every reader gets its exact bytes. A
  single read larger than the bound runs alone.
- Streamed reads: with no room for a whole chunk, each READ of a streamed file reads the bytes it asked.
- Listings: a directory of thousands of entries lists exactly (names, types) over many READDIR replies,
  from the snapshot each time.
"""
import contextlib
import os
import threading

import pytest

from mountutil import gated_fuse_source, read, wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse") or os.geteuid() != 0,
                                reason="needs /dev/fuse and root (an in-process FUSE source)")

AUDIT = dict(os.environ, SHADEFS_AUDIT="1")
READERS = 8
SIZE = 100_000      # bytes per file: two fit in the bound below, a third does not
BOUND = 256 << 10


@pytest.fixture
def gated_source(tmp_path):
    """``(mountpoint, {relpath: bytes}, gate, cache)`` of a FUSE source whose ``hang/`` opens block."""
    spec = {f"hang/{i:02d}.bin": os.urandom(SIZE) for i in range(READERS)}
    spec["big.bin"] = os.urandom(300_000)
    spec["plain/s.bin"] = os.urandom(SIZE)
    gate = threading.Event()
    with gated_fuse_source(tmp_path, spec, gate, lambda: gate.wait(60)) as (mp, cache):
        yield mp, spec, gate, cache


@contextlib.contextmanager
def fills_waiting_for_room(m, spec, gate, cache, out):
    """A reader thread per ``hang/`` file of mount ``m`` (each puts its bytes in ``out[relpath]``); yields
    ``(hung relpaths, reader)`` once two fills hold 200,000 bytes and hang in the source and the other six
    wait for room; on exit opens the gate and joins the readers."""
    def reader(rel):
        out[rel] = read(os.path.join(m.path, rel))

    hung = sorted(r for r in spec if r.startswith("hang/"))
    threads = [threading.Thread(target=reader, args=(rel,)) for rel in hung]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: cache.waiting == 2, timeout=20)
        wait_for(lambda: m.stats()["memory"]["fill_buffers"]["waits"] == READERS - 2, timeout=20)
        yield hung, reader
    finally:
        gate.set()
    for t in threads:
        t.join(30)


def test_concurrent_fills_hold_at_most_the_fill_buffer_bound(gated_source, mount, tmp_path):
    src, spec, gate, cache = gated_source
    env = dict(AUDIT, SHADEFS_FILL_BUFFERS=str(BOUND))
    m = mount(src, "--ram-cache", "0", "--disk-cache", str(tmp_path / "disk"), "--disk-cache-size", "4MiB",
              "--no-kernel-cache", "--fuse-impl", "kernel", env=env)
    out = {}
    with fills_waiting_for_room(m, spec, gate, cache, out) as (hung, _):
        fb = m.stats()["memory"]["fill_buffers"]
        assert fb["used_bytes"] == 2 * SIZE and fb["bound_bytes"] == BOUND
        assert cache.waiting == 2
    assert out == {rel: spec[rel] for rel in hung}
    s = m.stats()
    fb = s["memory"]["fill_buffers"]
    assert fb == {"bound_bytes": BOUND, "used_bytes": 0, "high_water_bytes": 2 * SIZE, "waits": READERS - 2,
                  "refused": 0, "oversize": 0}
    assert s["misses"] == READERS and s["tiers"]["disk"]["files"] == READERS
    # a read larger than the bound runs alone (never waits for room that cannot come)
    assert read(os.path.join(m.path, "big.bin")) == spec["big.bin"]
    fb = m.stats()["memory"]["fill_buffers"]
    assert fb["oversize"] == 1 and fb["high_water_bytes"] == 300_000 and fb["used_bytes"] == 0
    assert fb["waits"] == READERS - 2


def test_a_streamed_read_without_room_for_a_whole_chunk_reads_the_bytes_asked(gated_source, mount):
    src, spec, gate, cache = gated_source
    env = dict(AUDIT, SHADEFS_FILL_BUFFERS=str(BOUND))
    # the streamed file's READs through the daemon (no passthrough to the source file)
    m = mount(src, "--ram-cache", "0", "--no-kernel-cache", "--fuse-impl", "kernel", "--source-passthrough", "off",
              env=env)
    s_path = os.path.join(m.path, "plain/s.bin")
    assert read(s_path) == spec["plain/s.bin"]  # read whole once (no tier): its next opens are streamed
    out = {}
    with fills_waiting_for_room(m, spec, gate, cache, out) as (hung, reader):
        # 200,000 bytes in flight: no room for the streamed file's whole chunk (100,000 more)
        streamed = threading.Thread(target=reader, args=("plain/s.bin",))
        streamed.start()
        wait_for(lambda: m.stats()["memory"]["fill_buffers"]["refused"] >= 1, timeout=20)
    streamed.join(30)
    assert out == {rel: spec[rel] for rel in hung + ["plain/s.bin"]}
    s = m.full_stats()
    fb = s["memory"]["fill_buffers"]
    # every READ of the streamed open that found no room read the bytes it asked: one range read each
    assert fb["refused"] == s["audit"]["counters"]["range_reads"] >= 1
    assert fb["high_water_bytes"] == 2 * SIZE and fb["used_bytes"] == 0 and fb["oversize"] == 0
    assert s["audit"]["counters"]["streamed"] == 1


def test_a_large_directory_lists_exactly_over_many_readdir_replies(tmp_path, mount):
    src = tmp_path / "src"
    big = src / "big"
    big.mkdir(parents=True)
    names = [f"sample-{i:05d}-{'x' * (i % 40)}.bin" for i in range(3000)]
    for n in names:
        (big / n).write_bytes(b"")
    for d in ("sub-a", "sub-b"):
        (big / d).mkdir()
    m = mount(src, "--ram-cache", "1MiB")
    for _ in range(2):  # the second listing is built from the snapshot again (the kernel may cache it)
        with os.scandir(os.path.join(m.path, "big")) as it:
            got = {e.name: e.is_dir(follow_symlinks=False) for e in it}
        assert got == {**{n: False for n in names}, "sub-a": True, "sub-b": True}
    assert sorted(os.listdir(os.path.join(m.path, "big"))) == sorted(names + ["sub-a", "sub-b"])
