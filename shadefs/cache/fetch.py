"""Misses, one backend read per file: the open that finds a file absent leads its fetch (admission decided
before the read: RAM, else the disk tier, else a transient buffer or a stream), every concurrent open of
it joins that fetch, and the fetch ends in exactly one transition (commit, release or abort:
:mod:`shadefs.cache.state`). Files no tier holds are read by ranges of whole chunks."""
from __future__ import annotations

import errno
import logging
import os
import threading
import time
from typing import Iterator, List, Optional

from ..backends.timeout import on_deadline
from .counters import Outcome
from .handle import Handle, _pread_exact
from .movers import Victim
from .state import SOURCE_BACKEND, SOURCE_SHARED, DyingEntry, Fetch
from .tiers import CompactionBehind, DiskFloorReached

# a fill into the disk tier reads the backend in pieces of this many bytes (the working set of one fill); a
# miss no tier admits is read whole with one request up to this size, and by ranges of this size above it
FILL_CHUNK = 8 << 20
#: seconds a fill waits for the segments' compaction to make room for its packed victims' dead records
COMPACTION_WAIT = 5.0


class Fetches:
    """The single-flight of misses (mixed into :class:`~shadefs.cache.core.TieredCache`): a fetch entered
    under the lock (:meth:`_start_fetch`), led by one open (:meth:`_lead`), joined by the others; the
    handle of a completed fetch (:meth:`_miss_handle`); files no tier holds read by ranges
    (:meth:`_stream_read`)."""

    def _start_fetch(self, fid: int, size: int, memory: bool = True, transient: bool = False,
                     source: str = SOURCE_BACKEND):
        """Under self.lock, for an absent file: reserve it in RAM, else in the disk tier, and enter
        ``fetching`` (its bytes from ``source``). Returns (:class:`Fetch`, RAM victims, already
        ``moving``, to hand to the mover before the read) or (None, []) when no tier admits it
        (``memory``: a fetch kept by no tier, to offer to the shared tier, counts as admitted).
        ``transient`` (an open, whose handle takes the bytes): a file no tier admits of at most
        :attr:`whole_max` bytes is fetched into a transient buffer while :data:`LOOSE_BUFFERS` has room."""
        self._settle_due()
        victims = self.ram_index.reserve(fid, size)
        if victims is not None:
            moving = self._evict_ram(victims)
            return self.table.begin_fetch(fid, "ram", source), moving
        reservation = self._reserve_disk(fid, size)
        if reservation is None:
            if (transient and size <= self.whole_max and self.loose_bytes + size <= self.loose_budget
                    and not self._read_whole_once[fid]
                    and (self.source_passthrough == "off" or fid >= self._nfiles)):
                # no tier: one whole GET into a transient buffer (loose bytes, reserved for the first
                # handle), served as held-open bytes are; offered to the group when there is one
                self._read_whole_once[fid] = True
                fl = self.table.begin_fetch(fid, "memory", source)
                fl.loose = size
                self.loose_bytes += size
                return fl, []
            if memory and self.shared is not None and size <= self.shared.max_file:
                # no node tier: read it whole (at most --shared-max-file) to serve and offer to the group
                return self.table.begin_fetch(fid, "memory", source), []
            return None, []
        fl = self.table.begin_fetch(fid, "disk", source)
        fl.reservation = reservation
        return fl, []

    def _reserve_disk(self, fid: int, size: int):
        # under self.lock: reserve ``fid`` in the disk tier; its victims leave it (evict_disk), their entries
        # deleting. Returns (generation, the victims' DyingEntry records) or None (refused)
        if self.disk_index is None:
            return None
        victims = self.disk_index.reserve(fid, size, hold_victims=True)
        if victims is None:
            return None
        return self.disk.next_gen(), [self.table.evict_disk(v) for v in victims]

    def _clear_victims(self, fid: int, doomed: List[DyingEntry]) -> None:
        # outside the lock, by the thread that writes ``fid`` (its own fill's admission): delete the victims'
        # entries, then let the fill use their bytes (credited to it: the budget never counts them twice).
        # Packed victims' records stay on disk as the segments' slack until compaction: first wait until
        # they fit in it (CompactionBehind after COMPACTION_WAIT: the victims are deleted all the same,
        # the fill is refused, so the device bytes never pass the budget)
        room = self.disk.make_room([entry.gen for entry in doomed], COMPACTION_WAIT)
        for entry in doomed:
            self.disk.delete(self.ns.path(entry.fid), entry.gen, entry.csum, promised=room)
            self._unlinked_hooks(entry.fid, entry.gen)
        with self.lock:
            self.disk_index.release(fid)
        if not room:
            raise CompactionBehind(f"the segments' compaction left no room for {len(doomed)} victims' "
                                   f"records within {COMPACTION_WAIT:g} s")

    def _backend_read(self, fid: int, size: int) -> bytes:
        if fid >= self._nfiles:  # a chunk: a range of its file
            path, off = self.ns.source(fid)
            t0 = time.monotonic()
            data = self.backend.read_range(path, off, size)
        else:
            path = self.ns.path(fid)
            t0 = time.monotonic()
            data = self.backend.read(path, size)
        if len(data) != size:  # a backend bug must not become a short file
            raise OSError(f"backend returned {len(data)} bytes for {path!r}, expected {size}")
        if self.on_backend_read is not None:
            self.on_backend_read(time.monotonic() - t0)
        return data

    def _backend_chunks(self, fid: int, size: int, failed: list) -> Iterator[bytes]:
        """The file's bytes from the backend in FILL_CHUNK pieces; a backend error is put in ``failed``."""
        try:
            if size <= FILL_CHUNK:
                yield self._backend_read(fid, size)
                return
            path = self.ns.path(fid)
            t0 = time.monotonic()
            for off in range(0, size, FILL_CHUNK):
                n = min(FILL_CHUNK, size - off)
                grant = self.fills.take(n)  # one piece in flight per fill: given back before the next
                try:
                    piece = self.backend.read_range(path, off, n)
                    if len(piece) != n:
                        raise OSError(f"backend returned {len(piece)} bytes at {off} of {path!r}, expected {n} "
                                      f"(the file changed under the mount)")
                    yield piece  # resumed once the disk tier wrote it
                    del piece
                finally:
                    self.fills.give(grant)
            if self.on_backend_read is not None:
                self.on_backend_read(time.monotonic() - t0)
        except GeneratorExit:
            raise  # closed by its consumer (the disk write failed): not a backend failure
        except BaseException as e:
            failed.append(e)
            raise

    def _lead(self, fid: int, size: int, fl: Fetch, demote: List[Victim], data: Optional[bytes] = None) -> None:
        """The leader's half of a fetch: hand its RAM victims to the mover, read the bytes (``data`` when
        given: ``fl.source`` says whose, else the shared tier, else the backend) into the reserved tier,
        then end the fetch (commit_fetch, release_fetch or abort_fetch).

        Raises:
            FileNotFoundError, OSError: the backend failed (every joined open gets the same error).
        """
        self.mover.submit(demote)  # the victims move now, never behind this file's read
        offer = None
        # a read of the whole file (into RAM, a buffer no tier keeps, or a disk fill of one piece) holds its
        # bytes against the fill-buffer bound from the request until they are committed; a larger disk fill
        # holds one piece at a time (_backend_chunks)
        grant = 0
        if data is None and (fl.tier in ("ram", "memory") or size <= FILL_CHUNK):
            grant = self.fills.take(size)
        try:
            # a backend read of this thread past its deadline (the backend's watchdog) fails the opens
            # waiting on this fetch, and every open of the file until this read returns, at once
            with on_deadline(lambda e: _fail_waiters(fl, e), answers=False):
                shared = self.shared
                if data is None and shared is not None and size <= shared.max_file:
                    data = shared.get(self.shared_key(fid), size)  # None past its deadline: a miss, never an error
                    if data is not None:
                        fl.source = SOURCE_SHARED
                if fl.tier in ("ram", "memory"):
                    fetched = data is None
                    if fetched:
                        data = offer = self._backend_read(fid, size)
                    with self.lock:
                        if fetched:
                            self.counts.backend_reads += 1
                            self.counts.backend_bytes += size
                        if fl.tier == "ram":
                            self.table.commit_fetch(fid, fl, data, self.ram)
                        else:
                            self.table.release_fetch(fid, fl, data)  # served from this buffer, kept by no tier
                else:
                    offer = self._fill_disk(fid, size, fl, data)
        except BaseException as e:
            with self.lock:
                self.counts.backend_errors += not isinstance(e, FileNotFoundError)
                self.loose_bytes -= fl.loose  # the transient buffer's reservation (no handle takes it)
                fl.loose = 0
                self.table.abort_fetch(fid, fl)
            fl.error = e
            raise
        finally:
            fl.done.set()
            self.fills.give(grant)
        if offer is not None and fl.tier is None:
            self._offer_shared(fid, offer)  # read from the backend, kept by no tier of this node

    def shared_key(self, fid: int) -> str:
        """The group-wide key of file ``fid`` (path, size, mtime and ETag: a changed file never matches)."""
        etag = int(self.ns.etags[fid]) if self._etags_are_versions else 0
        return self.shared.key(self.ns.path(fid), int(self.ns.size(fid)), self._mtime_ns(fid), etag)

    def _offer_shared(self, fid: int, data: bytes) -> None:
        """A file leaves this node (refused by its tiers, or a victim no lower tier takes): offer it to
        the group, off the request path. The group then holds what the node does not (f + s, not max)."""
        if self.shared is not None and len(data) <= self.shared.max_file:
            self.shared.offer_async(self.shared_key(fid), data, self.importance.get(fid))

    def _fill_disk(self, fid: int, size: int, fl: Fetch, data: Optional[bytes]) -> Optional[bytes]:
        """Fill the reserved disk entry from ``data`` or the backend. Returns the bytes read from the
        backend when they were read whole (to offer to the group), else None."""
        gen, doomed = fl.reservation
        failed: list = []
        keep: list = []
        if data is not None:
            chunks = (data,)
        else:
            chunks = self._backend_chunks(fid, size, failed)
            if size <= FILL_CHUNK:
                chunks = _tee(chunks, keep)  # a small file is in memory anyway: keep it if the write fails
        fetched = data is None
        try:
            try:
                self._clear_victims(fid, doomed)
            except CompactionBehind:
                if data is None and size <= FILL_CHUNK:  # the open still needs the bytes: read them whole
                    try:
                        keep.append(self._backend_read(fid, size))
                    except BaseException as e:
                        failed.append(e)
                raise
            csum = self.disk.put(self.ns.path(fid), gen, chunks, size, mtime_ns=self._mtime_ns(fid))
        except BaseException as e:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()  # its piece's fill buffer goes back now, not when the error is collected
            if failed:
                raise failed[0]  # the backend failed: _lead aborts and reports it
            whole = data if data is not None else (keep[0] if keep else None)
            with self.lock:
                self._count_write_failure(e)
                if fetched and keep:
                    self.counts.backend_reads += 1
                    self.counts.backend_bytes += size
                self.table.release_fetch(fid, fl, whole)  # its disk reservation is aborted
            return keep[0] if fetched and keep else None
        with self.lock:
            if fetched:
                self.counts.backend_reads += 1
                self.counts.backend_bytes += size
            # the bytes in hand: an open whose entry is evicted before it opens it is served from them,
            # not read from the backend a second time (they live only as long as the fetch's waiters)
            self.table.commit_fetch(fid, fl, data if data is not None else (keep[0] if keep else None),
                                    gen=gen, csum=csum)
        return keep[0] if fetched and keep else None

    def _count_write_failure(self, e: BaseException) -> None:
        # under self.lock
        if isinstance(e, (DiskFloorReached, CompactionBehind)):
            self.counts.disk_writes_refused += 1
            self._write_error_log(logging.INFO, "disk tier write refused: %s", e)
        else:
            self.counts.disk_write_errors += 1
            self._write_error_log(logging.WARNING, "disk tier write failed (%s); serving continues without it",
                                  e)

    def _mtime_ns(self, fid: int) -> int:
        return int(self.ns.mtimes_ns[fid])

    def _miss_handle(self, fid: int, size: int, fl: Fetch, outcome: Outcome) -> Handle:
        """A Handle for an open (counted ``outcome``) whose fetch ``fl`` completed."""
        if fl.tier == "ram":
            with self.lock:
                if fid in self.ram_index and self.ram.get(fid) is fl.data:
                    return Handle(self, fid, size, outcome, data=fl.data, pin=self._pin_ram(fid, size))
            return self._loose_handle(fid, size, outcome, fl.data)  # evicted already: bytes in hand
        if fl.tier == "disk" and not (self.disk.segments is not None and self.disk.packed(size)):
            try:
                return self._entry_handle(fid, size, outcome, self.disk.open_entry(self.ns.path(fid), fl.gen,
                                                                                    fl.csum), fl.gen, fl.csum)
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    self.fds.out_of_descriptors()
                # evicted already, or no descriptor left: serve from the backend
        if fl.tier is None:  # no tier took it (a transient buffer, or read whole for the shared tier)
            with self.lock:
                keep = not self._stale_pages or self._pages_trusted(fid)
                loose = 0
                if fl.loose and fl.data is not None:
                    loose, fl.loose = fl.loose, 0
            if loose:  # the first handle of a transient buffer takes the loose bytes reserved for it
                return Handle(self, fid, size, outcome, data=fl.data, loose=loose, keep_pages=keep)
            return self._loose_handle(fid, size, outcome, fl.data, keep_pages=keep)
        return self._loose_handle(fid, size, outcome, fl.data)

    def _read_range(self, fid: int, offset: int, length: int, grant: Optional[int] = None) -> bytes:
        # ``grant``: fill-buffer bytes the caller took for this read (given back here); None: taken here
        grant = self.fills.take(length) if grant is None else grant
        t0 = time.monotonic()
        try:
            if fid >= self._nfiles:  # a chunk: a range of its file
                path, base = self.ns.source(fid)
                data = self.backend.read_range(path, base + offset, length)
            else:
                data = self.backend.read_range(self.ns.path(fid), offset, length)
        finally:
            self.fills.give(grant)  # the caller hands them on at once (the reply, or the handle's chunk)
        if self.on_backend_read is not None:
            self.on_backend_read(time.monotonic() - t0)
        if len(data) != length:
            raise OSError(f"backend returned {len(data)} bytes at {offset} of {self.ns.path(fid)!r}, "
                          f"expected {length} (the file changed under the mount)")
        with self.lock:
            self.counts.backend_bytes += length
            self.counts.range_reads += 1
        return data

    def _entry_read(self, h: Handle, offset: int, end: int) -> Optional[bytes]:
        """Bytes ``[offset, end)`` of the disk entry a handle served before it closed its fd
        (:meth:`Handle.close_entry_fd`), read through a descriptor opened for this read only; None when
        the entry is gone (evicted, promoted, dropped), short, or cannot be opened (EMFILE): the caller
        reads the backend."""
        try:
            fd = self.disk.open_entry(self.ns.path(h.fid), h.gen, h._csum)
        except OSError:
            return None
        try:
            return _pread_exact(fd, end - offset, offset)
        except OSError:
            return None
        finally:
            os.close(fd)

    def _stream_read(self, h: Handle, offset: int, end: int) -> bytes:
        """Bytes ``[offset, end)`` of a file served by ranges (``end`` within its size): read from the
        backend in whole chunks of :attr:`chunk` bytes (one request each, pinned to the object's version
        by the backend), the last chunk kept by the handle, counted against :data:`LOOSE_BUFFERS`
        (``min(chunk, size)`` reserved at the first read); with no room, exactly the bytes asked.
        Concurrent READs of one handle take turns (one request per chunk, not one per READ)."""
        if h.left:  # an open left to the kernel's pages: a READ reaching us means they are gone
            with self.lock:
                if h.left:
                    h.left = False
                    self.prefetcher.pages_missed(h.fid)
        if h._chunk is None:  # the first read: a chunk buffer and its lock, if the working set has room
            want = min(self.chunk, h.size)
            with self.lock:
                self._settle_due()
                if type(h._chunk) is not tuple and self.loose_bytes + want <= self.loose_budget:
                    self.loose_bytes += want
                    h._loose += want
                    h._chunk = (0, b"", threading.Lock())
            if h._chunk is None:
                return self._read_range(h.fid, offset, end - offset)
        out = []
        with h._chunk[2]:
            while offset < end:
                start, data, lock = h._chunk
                if start <= offset < start + len(data):
                    piece = data[offset - start:end - start]
                    out.append(piece)
                    offset += len(piece)
                    continue
                start = offset - offset % self.chunk
                n = min(self.chunk, h.size - start)
                grant = self.fills.try_take(n)
                if not grant:
                    # the fill buffers are full: the bytes asked, not a whole chunk (streamed without one)
                    out.append(self._read_range(h.fid, offset, end - offset))
                    break
                h._chunk = (start, b"", lock)  # the old chunk's bytes go before the new one is read
                h._chunk = (start, self._read_range(h.fid, start, n, grant), lock)
        return out[0] if len(out) == 1 else b"".join(out)

    def read_range(self, fid: int, offset: int, length: int) -> bytes:
        """Read ``length`` bytes at ``offset`` of file ``fid`` straight from the backend (not counted as
        an open; fewer bytes only at EOF)."""
        length = max(0, min(length, int(self.ns.size(fid)) - offset))
        return self._read_range(fid, offset, length) if length else b""



def _fail_waiters(fl: Fetch, e: BaseException) -> None:
    """A fetch whose leader's backend read is past its deadline (called by the backend's watchdog): every
    open waiting on it, and every open that joins it until the leader's read returns and ends the fetch,
    raises ``e`` (the leader, stuck, cannot tell them)."""
    if fl.error is None:
        fl.error = e
    fl.done.set()


def _tee(chunks: Iterator[bytes], keep: list) -> Iterator[bytes]:
    for c in chunks:
        keep.append(c)
        yield c
