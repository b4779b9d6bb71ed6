"""ChunkedHandle's sequential-reader detection: a run of reads near each other that leaves no more than a
window unread (the kernel's read-ahead READs, served out of order by several reader threads) makes a
reader sequential (whole chunks, the next chunk opened ahead); reads far apart, a strided reader and
re-reads of the same bytes do not."""
import threading

import numpy as np

from shadefs.cache.chunks import CHUNK, SEQUENTIAL_RUN, ChunkedHandle, ChunkMap

KB = 1 << 10


class _Chunk:
    source = "backend"  # a chunk no tier holds

    def __init__(self, log, cid):
        self.log, self.cid = log, cid

    def read(self, off, n):
        self.log.append(("whole", self.cid, off, n))
        return bytes(n)

    def release(self):
        pass


class _Cache:
    """What ChunkedHandle calls: open(chunk id) and read_range(chunk id, offset, length)."""

    def __init__(self):
        self.log, self.opened, self.lock = [], [], threading.Lock()

    def open(self, cid):
        with self.lock:
            self.opened.append(cid)
        return _Chunk(self.log, cid)

    def read_range(self, cid, off, n):
        self.log.append(("range", cid, off, n))
        return bytes(n)


def handle(chunks=3):
    cmap = ChunkMap(np.array([chunks * CHUNK]), chunk=CHUNK)
    cache = _Cache()
    return ChunkedHandle(cache, 0, chunks * CHUNK, cmap), cache, cmap


def test_read_ahead_served_out_of_order_is_still_a_sequential_run():
    h, cache, cmap = handle()
    step = 128 * KB
    offsets = []
    for pair in range(0, CHUNK // 2 + 4 * step, 2 * step):  # 0, 256K, 128K, 512K, 384K, ...: pairs swapped
        offsets += [pair + step, pair]
    for off in offsets:
        assert h.read(off, step) == bytes(step)
    kinds = [k for k, *_ in cache.log]
    first_whole = kinds.index("whole")
    # sequential once 1 MiB was read near the furthest end: from then on by whole chunks
    assert sum(n for _, _, _, n in cache.log[:first_whole]) >= SEQUENTIAL_RUN - step
    assert first_whole <= SEQUENTIAL_RUN // step + 1 and set(kinds[first_whole:]) == {"whole"}
    h.release()
    cmap.pool().shutdown(wait=True)
    assert 1 in {cid - cmap.span(0)[0] for cid in cache.opened}  # chunk 1 opened ahead past half of chunk 0


def test_reads_far_apart_stay_ranges():
    h, cache, cmap = handle()
    rng = np.random.default_rng(3)
    # 1 MiB apart at least: each read starts 896 KiB or more from where any other ended, beyond the window
    offs = [int(o) for o in rng.choice(np.arange(0, 3 * CHUNK - 128 * KB, 1 << 20), 20, replace=False)]
    for off in offs:
        h.read(off, 128 * KB)
    assert {k for k, *_ in cache.log} == {"range"}
    h.release()


def test_a_jump_ends_the_run():
    h, cache, cmap = handle()
    for off in range(0, SEQUENTIAL_RUN - 128 * KB, 128 * KB):  # 7 reads back to back: 896 KiB, short of 1 MiB
        h.read(off, 128 * KB)
    h.read(2 * CHUNK, 128 * KB)                  # far away: a new run of 128 KiB
    h.read(2 * CHUNK + 128 * KB, 128 * KB)       # 256 KiB: still ranges
    assert {k for k, *_ in cache.log} == {"range"}
    h.release()


def test_a_strided_reader_stays_ranges():
    h, cache, cmap = handle()
    for off in range(0, 2 * CHUNK, 448 * KB):  # 64 KiB every 448 KiB: gaps inside the window, never read
        h.read(off, 64 * KB)
    assert {k for k, *_ in cache.log} == {"range"}
    h.release()


def test_re_reading_the_same_bytes_is_not_a_run():
    h, cache, cmap = handle()
    for _ in range(20):  # 20 x 128 KiB read, all of it the same 128 KiB
        h.read(3 * CHUNK // 2, 128 * KB)
    assert {k for k, *_ in cache.log} == {"range"}
    h.release()
