"""Large files cached by chunks: entries are (file, chunk).

A file larger than :data:`CHUNK` bytes is never one cache entry. Its chunk ``k`` (bytes
``[k * CHUNK, min(size, (k + 1) * CHUNK))``) is an entry of its own, with an id in the cache's id space
above the namespace's file ids: ``num_files + first[file] + k`` (:class:`ChunkMap`, built at mount from
the snapshot's sizes). So the tier indexes, the policies, the read path's state machine (single-flight,
admission, eviction, demotion, promotion, checksums), the mover and the trace work per chunk exactly as
they work per small file: any part of any file can be cached, and only the chunks a reader touches are.

- :class:`ChunkedNamespace` is the namespace the read path sees when there are chunks: a chunk's path is
  ``<file path>/@chunk/<k>`` (below a regular file, so it never names a real file; it keys the chunk's
  disk entry and its trace rows) and its size the chunk's length; its source bytes are a range of the
  file (:meth:`ChunkedNamespace.source`).
- :class:`ChunkedHandle` is an open of a chunked file. The open itself counts nothing and waits for
  nothing; each chunk a READ touches is opened through the read path on demand (counted as one open of
  that entry: ``ram``, ``disk`` or ``miss``, and traced as such, so ``shadefs simulate`` replays the
  same entries), held by the handle while it is among the last :data:`HELD_CHUNKS` it read, and a
  sequential reader (:data:`SEQUENTIAL_RUN`) has the next chunk opened ahead once it is half-way through
  one (:data:`READ_AHEAD_FROM`). A chunk no tier holds is read by whole chunks for a sequential reader,
  and by exactly the bytes a random reader's READ asks for (the kernel keeps the pages it read).
- Importance: a chunk weighs what its file weighs (:meth:`ChunkMap.follow_importance`, kept in step by
  :class:`~shadefs.policies.base.Importance`).

Must never: serve a byte of a chunk before its entry was verified (the read path checks every disk hit
as it does a whole file's), or let a chunk id reach the backend or the plans as if it were a file.
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import errno
import threading
from typing import Optional, Tuple

import numpy as np

from .handle import read_end

__all__ = ["CHUNK", "HELD_CHUNKS", "READ_AHEAD_FROM", "SEQUENTIAL_RUN", "ChunkMap", "ChunkedNamespace", "ChunkedHandle",
           "CHUNK_MARK"]

CHUNK = 8 << 20
"""Bytes per chunk; a file larger than this is cached by chunks (equal to the read path's fill piece)."""
HELD_CHUNKS = 4
"""Chunk entries one open of a chunked file keeps open, the most recently read (a RAM pin, an entry's fd,
or a streamed chunk's buffer each)."""
READ_AHEAD_FROM = CHUNK // 2
"""A sequential reader's read past this offset within chunk ``k`` opens chunk ``k + 1`` ahead (not waited
for)."""
SEQUENTIAL_RUN = 1 << 20
"""Bytes of a run (below) that make a reader sequential: it then reads chunks no tier holds by whole
chunks and has the next chunk opened ahead; a shorter run (the kernel's read-ahead around a random
``pread`` or page fault) reads what it asks."""

RUN_WINDOW = 512 << 10
"""A run is a span of the file read nearly whole: a read that starts within this many bytes of the span
continues it, and the span counts as sequential while the bytes it has not read come to at most this
many. The kernel sends a sequential reader's read-ahead as several READs at once, and the reader threads
may serve them out of order (the gap a later READ leaves is filled by an earlier one, served after it:
four READs of the kernel's 128 KiB read-ahead fit); a strided reader leaves its gaps unread, and
re-reads of the same bytes do not grow the span."""
CHUNK_MARK = "/@chunk/"
"""Between a file's path and a chunk number in a chunk's path (trace rows, disk entry keys)."""


class ChunkMap:
    """Which files are chunked and the ids of their chunks.

    Args:
        sizes: the snapshot's file sizes in bytes, shape (num_files,).
        chunk: bytes per chunk.

    Memory: one byte per file (the chunked mask) plus 16 bytes per chunked file.
    """

    def __init__(self, sizes: np.ndarray, chunk: int = CHUNK):
        sizes = np.asarray(sizes, dtype=np.int64)
        self.chunk = int(chunk)
        self.num_files = len(sizes)
        self.chunked = sizes > self.chunk
        self.files = np.flatnonzero(self.chunked).astype(np.int64)        # sorted file ids
        self.counts = (sizes[self.files] + self.chunk - 1) // self.chunk    # chunks per chunked file
        self.sizes = sizes[self.files].copy()                               # their sizes at mount
        self.first = self.num_files + np.cumsum(self.counts) - self.counts  # id of each one's chunk 0
        self.num_chunks = int(self.counts.sum())
        self.num_ids = self.num_files + self.num_chunks
        self._pool: Optional[cf.ThreadPoolExecutor] = None
        self._pool_lock = threading.Lock()

    def __bool__(self) -> bool:
        return self.num_chunks > 0

    def is_chunked(self, fid: int) -> bool:
        """Whether file ``fid`` is served by chunks (False for a chunk id or a retired file)."""
        return fid < self.num_files and bool(self.chunked[fid])

    def span(self, fid: int) -> Tuple[int, int]:
        """(first chunk id, chunk count) of chunked file ``fid``."""
        i = int(np.searchsorted(self.files, fid))
        return int(self.first[i]), int(self.counts[i])

    def owner(self, cid: int) -> Tuple[int, int]:
        """(file id, chunk number) of chunk id ``cid`` (>= num_files)."""
        i = int(np.searchsorted(self.first, cid, side="right")) - 1
        return int(self.files[i]), cid - int(self.first[i])

    def extent(self, cid: int) -> Tuple[int, int, int]:
        """(file id, offset, length in bytes) of chunk id ``cid``: its bytes in its file."""
        i = int(np.searchsorted(self.first, cid, side="right")) - 1
        k = cid - int(self.first[i])
        off = k * self.chunk
        return int(self.files[i]), off, min(self.chunk, int(self.sizes[i]) - off)

    def owner_id(self, i: int) -> int:
        """The file id of entry ``i``: a chunk's file, else ``i`` itself."""
        return i if i < self.num_files else self.owner(i)[0]

    def owner_ids(self, ids: np.ndarray) -> np.ndarray:
        """:meth:`owner_id` of each of ``ids`` (int64, shape (n,))."""
        ids = np.asarray(ids, dtype=np.int64)
        chunk = ids >= self.num_files
        if not chunk.any():
            return ids
        out = ids.copy()
        out[chunk] = self.files[np.searchsorted(self.first, ids[chunk], side="right") - 1]
        return out

    def alias_ids(self, fid: int) -> range:
        """The chunk ids of file ``fid`` (empty for a file that is not chunked)."""
        if not self.is_chunked(fid):
            return range(0)
        first, count = self.span(fid)
        return range(first, first + count)

    def retire(self, fid: int) -> None:
        """File ``fid`` changed size at the source (a reused snapshot's recheck): its chunk layout no
        longer fits, so it is served as a whole file from now on (its chunk ids stay unused)."""
        self.chunked[fid] = False

    def owners(self) -> np.ndarray:
        """The file id of every chunk id, in id order: shape (num_chunks,), int64."""
        return np.repeat(self.files, self.counts)

    def follow_importance(self, fids: np.ndarray, values: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """:class:`~shadefs.policies.base.Importance`'s follower: the chunks of the chunked files among
        ``fids`` (shape (n,)) take their file's value from ``values`` (shape (n,)). Returns (chunk ids,
        int64; their values, float32)."""
        fids = np.asarray(fids, dtype=np.int64)
        inside = fids < self.num_files
        hit = np.zeros(len(fids), dtype=bool)
        hit[inside] = self.chunked[fids[inside]]
        if not hit.any():
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        idx = np.searchsorted(self.files, fids[hit])
        firsts, counts = self.first[idx], self.counts[idx]
        ids = np.repeat(firsts, counts) + (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts,
                                                                                     counts))
        return ids, np.repeat(np.asarray(values, dtype=np.float32)[hit], counts)

    def pool(self) -> cf.ThreadPoolExecutor:
        """Threads that open chunks ahead of sequential readers (two; created at first use)."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = cf.ThreadPoolExecutor(2, thread_name_prefix="shadefs-chunk-ahead")
            return self._pool

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


class _Ext:
    """A per-file array read by entry id: a chunk id reads its file's value (int indices only)."""

    __slots__ = ("base", "map")

    def __init__(self, base, cmap: ChunkMap):
        self.base, self.map = base, cmap

    def __getitem__(self, i):
        if i >= self.map.num_files:
            i = self.map.owner(int(i))[0]
        return self.base[i]

    def __setitem__(self, i, v):
        self.base[i] = v

    def __len__(self):
        return len(self.base)


class ChunkedNamespace:
    """The namespace as the read path sees it when files are chunked: ids below ``num_files`` are the
    snapshot's files, ids above are chunks (their path ``<file>/@chunk/<k>``, their size the chunk's
    length, their mtime and version tag their file's). Everything else is the snapshot's."""

    def __init__(self, ns, cmap: ChunkMap):
        self._ns = ns
        self.chunks = cmap
        self.num_files = ns.num_files
        self.mtimes_ns = _Ext(ns.mtimes_ns, cmap)
        self.etags = _Ext(ns.etags, cmap)
        un = getattr(ns, "unchecked", None)
        # a chunk is never compared with the source (its file is, at the file's first open)
        self.unchecked = None if un is None else np.concatenate([un, np.zeros(cmap.num_chunks, dtype=np.bool_)])

    def __getattr__(self, name):
        return getattr(self._ns, name)

    def path(self, i: int) -> str:
        if i < self.num_files:
            return self._ns.path(i)
        fid, k = self.chunks.owner(i)
        return f"{self._ns.path(fid)}{CHUNK_MARK}{k}"

    def size(self, i: int) -> int:
        if i < self.num_files:
            return self._ns.size(i)
        return self.chunks.extent(i)[2]

    def source(self, i: int) -> Tuple[str, int]:
        """(the source path, the offset in it) of entry ``i``'s bytes."""
        if i < self.num_files:
            return self._ns.path(i), 0
        fid, off, _ = self.chunks.extent(i)
        return self._ns.path(fid), off


class _Sub:
    """One chunk entry a :class:`ChunkedHandle` holds open: its Handle once opened, or the error."""

    __slots__ = ("handle", "error", "done", "users")

    def __init__(self):
        self.handle = None
        self.error: Optional[BaseException] = None
        self.done = threading.Event()
        self.users = 0


class ChunkedHandle:
    """One open of a chunked file (the interface of :class:`~shadefs.cache.core.Handle`).

    The open counted nothing; :meth:`read` opens the chunk entries it touches through the cache's read
    path (``cache.open(chunk id)``: each counted once per time this handle opens it), keeps the last
    :data:`HELD_CHUNKS`, and opens the next chunk ahead of a sequential reader. Reads may block on the
    backend (``source`` is ``"backend"``: the kernel front end serves them on a worker).

    Attributes: ``fid``, ``size`` (bytes), ``outcome`` (``"chunks"``), ``gen`` (0), ``keep_pages``.
    """

    outcome = "chunks"
    gen = 0
    source = "backend"

    def __init__(self, cache, fid: int, size: int, cmap: ChunkMap, keep_pages: bool = True):
        self.fid = fid
        self.size = size
        self.keep_pages = keep_pages
        self._cache = cache
        self._chunk = cmap.chunk
        self._map = cmap
        self._first, self._count = cmap.span(fid)
        self._lock = threading.Lock()
        self._subs: "collections.OrderedDict[int, _Sub]" = collections.OrderedDict()
        self._released = False
        self._start = self._next = 0  # the current run's span [start, next): RUN_WINDOW
        self._run = 0                   # bytes of the span read (at most its length)

    def backing_fd(self) -> Optional[int]:
        return None  # its bytes come from several entries: never passthrough

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (fewer only at EOF).

        Raises:
            OSError: EBADF after :meth:`release`; as the read path's open and read of a chunk (EIO,
                ENOENT from the backend).
            ValueError: a negative offset or length.
        """
        end = read_end(self._released, self.size, offset, length)
        if end <= offset:
            return b""
        c = self._chunk
        out = []
        pos = offset
        with self._lock:  # READs of one open come from several reader threads
            if self._start - RUN_WINDOW <= offset <= self._next + RUN_WINDOW:
                self._start, self._next = min(self._start, offset), max(self._next, end)
                self._run = min(self._run + end - offset, self._next - self._start)
            else:
                self._start, self._next, self._run = offset, end, end - offset
            span = self._next - self._start
            sequential = self._run >= SEQUENTIAL_RUN and span - self._run <= RUN_WINDOW
        while pos < end:
            k = pos // c
            base = k * c
            stop = min(end, base + c)
            sub = self._take(k)
            try:
                h = sub.handle
                if h.source == "backend" and not sequential:
                    # a chunk no tier holds, read at random (HDF5, LMDB, an mmap'd array): the bytes asked,
                    # not the whole chunk per READ (the kernel keeps the pages it read)
                    piece = self._cache.read_range(self._first + k, pos - base, stop - pos)
                else:
                    piece = h.read(pos - base, stop - pos)
            finally:
                self._untake(sub)
            if len(piece) != stop - pos:
                raise OSError(errno.EIO, f"chunk {k} of file {self.fid} ended early")
            out.append(piece)
            pos = stop
        if sequential and (end - 1) % c >= READ_AHEAD_FROM:
            k = (end - 1) // c + 1
            if k < self._count and k not in self._subs:
                try:
                    self._map.pool().submit(self._ahead, k)
                except RuntimeError:
                    pass  # shutting down
        return out[0] if len(out) == 1 else b"".join(out)

    def _ahead(self, k: int) -> None:
        try:
            self._untake(self._take(k))
        except Exception:
            pass  # the reader opens it itself (and gets the error) when it gets there

    def _take(self, k: int) -> _Sub:
        # the open chunk k, opened now if this handle does not hold it; one more user of it
        with self._lock:
            if self._released:
                raise OSError(errno.EBADF, "read of a released handle")
            sub = self._subs.get(k)
            lead = sub is None
            if lead:
                sub = self._subs[k] = _Sub()
            else:
                self._subs.move_to_end(k)
            sub.users += 1
            drop = self._trim()
        for h in drop:
            h.release()
        if lead:
            try:
                sub.handle = self._cache.open(self._first + k)
            except BaseException as e:
                sub.error = e
                with self._lock:
                    if self._subs.get(k) is sub:
                        del self._subs[k]
            finally:
                sub.done.set()
        else:
            sub.done.wait()
        if sub.error is not None:
            with self._lock:
                sub.users -= 1
            raise sub.error
        return sub

    def _untake(self, sub: _Sub) -> None:
        with self._lock:
            sub.users -= 1
            late = self._released and sub.users == 0 and sub.handle is not None
        if late:
            sub.handle.release()

    def _trim(self) -> list:
        # under self._lock: chunks beyond the last HELD_CHUNKS that nobody reads now are let go
        drop = []
        if len(self._subs) > HELD_CHUNKS:
            for k, s in list(self._subs.items()):
                if len(self._subs) <= HELD_CHUNKS:
                    break
                if s.users == 0 and s.done.is_set():
                    del self._subs[k]
                    if s.handle is not None:
                        drop.append(s.handle)
        return drop

    def release(self) -> None:
        """Release every chunk entry the handle holds (one still being read is released after that
        read). Idempotent."""
        with self._lock:
            if self._released:
                return
            self._released = True
            subs, self._subs = list(self._subs.values()), collections.OrderedDict()
        for s in subs:
            if s.users == 0 and s.handle is not None:
                s.handle.release()

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass


class _Column:
    """A per-file array read by entry ids (an int or an int array): a chunk reads ``chunk_values`` (its
    own: the sizes) or, without them, its file's value."""

    __slots__ = ("base", "map", "owners", "chunk_values")

    def __init__(self, base: np.ndarray, cmap: ChunkMap, owners: np.ndarray, chunk_values=None):
        self.base, self.map, self.owners, self.chunk_values = base, cmap, owners, chunk_values

    def _chunk(self, c):
        return self.chunk_values[c] if self.chunk_values is not None else self.base[self.owners[c]]

    def __getitem__(self, idx):
        n = self.map.num_files
        if np.ndim(idx) == 0:
            i = int(idx)
            return self.base[i] if i < n else self._chunk(i - n)
        idx = np.asarray(idx, dtype=np.int64)
        out = np.empty(idx.shape, dtype=self.base.dtype)
        files = idx < n
        out[files] = self.base[idx[files]]
        out[~files] = self._chunk(idx[~files] - n)
        return out

    def __len__(self):
        return self.map.num_ids


class _EntryPaths:
    """Entry paths by entry id (``Sequence``-like): the files', then the chunks' (``<file>/@chunk/<k>``)."""

    def __init__(self, ns, view: "ChunkedNamespace"):
        self._ns, self._view = ns, view

    def __len__(self):
        return self._view.chunks.num_ids

    def __getitem__(self, i):
        return self._view.path(int(i))

    def __iter__(self):
        yield from iter(self._ns.paths)
        for i in range(self._view.chunks.num_files, self._view.chunks.num_ids):
            yield self._view.path(i)


class EntryIds:
    """What persistence (:mod:`shadefs.cache.persist`: the reload and the manifest) sees of a namespace
    with chunks: ``num_files`` entry ids, each with a ``path`` (a chunk's: ``<file>/@chunk/<k>``, the key
    of its disk entry), a size (a chunk's length), an mtime and a version tag (a chunk's: its file's), and
    a ``fingerprint`` that changes with the chunk layout. Columns are read through, not copied."""

    def __init__(self, ns, cmap: ChunkMap):
        import hashlib

        view = ChunkedNamespace(ns, cmap)
        owners = cmap.owners()
        lengths = np.full(cmap.num_chunks, cmap.chunk, dtype=np.int64)
        last = cmap.first + cmap.counts - 1 - cmap.num_files
        lengths[last] = cmap.sizes - (cmap.counts - 1) * cmap.chunk
        self._view = view
        self.num_files = cmap.num_ids
        self.sizes = _Column(ns.sizes, cmap, owners, lengths)
        self.mtimes_ns = _Column(ns.mtimes_ns, cmap, owners)
        self.etags = _Column(ns.etags, cmap, owners)
        self.paths = _EntryPaths(ns, view)
        fp = getattr(ns, "fingerprint", None)
        self.fingerprint = None if fp is None else hashlib.sha256(
            fp.encode() + cmap.files.tobytes() + cmap.sizes.tobytes()).hexdigest()

    def path(self, i: int) -> str:
        return self._view.path(i)


def take_disk_chunks(cache, fid: int) -> list:
    """Under ``cache.lock``: the chunks of chunked file ``fid`` resident in the disk tier leave it (each by
    the state table's ``drop_entry``: their entries become deleting, still counted in the budget); returns
    their :class:`~shadefs.cache.state.DyingEntry` records, for the mover to unlink outside the lock. For a
    file that changed at the source."""
    ix = cache.disk_index
    out = []
    if ix is None:
        return out
    first, count = cache.chunks.span(fid)
    for cid in range(first, first + count):
        if cid in ix and cid not in cache._flights:
            out.append(cache.table.drop_entry(cid, int(cache.ns.size(cid))))
    return out
