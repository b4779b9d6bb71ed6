"""Small disk-tier entries packed into append-only segment files.

A file-system object per cached sample costs a whole block (4 KiB on ext4/xfs/tmpfs) and an open, a read
and a close per hit. Entries below :data:`PACK_BELOW` bytes (record header included) are instead appended
as *records* to the active *segment* of a :class:`SegmentStore`: one file per segment, kept open, so an
NVMe hit is one ``pread`` of the record on an open fd, and a sample takes its bytes plus a 64-byte header.

Layout: ``<namespace>/seg/<id:016x>.seg``, ids growing; each segment is a run of records::

    header (64 bytes, little-endian): payload size u32, generation u64, xxh3_64 of the payload u64,
        source mtime in ns i64, sha256 of the path (32 bytes), crc32 of the 60 bytes before u32
    payload (size bytes)

A record is written with one ``pwrite`` (header and payload together) and put in the in-memory map
(generation -> segment, offset) only after it returned, so a reader never sees a record being written.
A segment is *sealed* when the next record does not fit in :attr:`SegmentStore.segment_bytes`; a new one
becomes active. Deleting a record only marks it dead (live-byte accounting per segment); a sealed segment
whose live bytes fall below :attr:`SegmentStore.compact_below` of its length is *compacted* by a
background thread (never a FUSE reader): its live records are copied forward to the active segment, then
it is unlinked. A sealed segment with no live record is unlinked at once.

Crash safety: after a ``kill -9`` the store is rebuilt by :meth:`SegmentStore.scan`, which reads every
segment front to back and keeps a record only when its header CRC, its length and the xxh3_64 of its
payload all check; the first bad record ends its segment (the file is truncated there: a torn append).
So a crash loses at most the records being written and never serves a torn one. A compaction interrupted
by a crash leaves both copies of the records it moved: the newest segment's copy wins (same bytes).

Byte accounting (the budget is in device bytes, see :class:`shadefs.cache.index.TierIndex`): a record
costs ``HEADER + size`` bytes; a dead record keeps costing them (the index's dying bytes) until its
segment is unlinked, when :attr:`SegmentStore.on_reclaimed` is called with the dead bytes freed, and the
padding of a sealed segment to whole pages is reported the same way (:attr:`on_dead`). Compaction asks
:attr:`on_hold` for room for the bytes it copies before it copies them.

Must never: serve a record whose header or checksum does not match, keep a segment fd closed while a
reader may pread it, or call back into the cache with its own lock held.
"""
from __future__ import annotations

import collections
import errno
import logging
import os
import struct
import threading
import time
import zlib
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import xxhash

try:  # the read of a record from the page cache with the GIL kept (optional: built by pip install)
    from ._pread import pread_cached as _pread_cached
except ImportError:
    _pread_cached = None

__all__ = ["SegmentStore", "Record", "HEADER", "PACK_BELOW", "SLACK_SHARE", "SEG_DIR", "pack_header",
           "segment_bytes_for"]

log = logging.getLogger("shadefs.segments")

PACK_BELOW = 64 << 10   # an entry is packed when its record (header + bytes) is smaller than this
SLACK_SHARE = 8         # a record is charged 1/8 more for the dead bytes compaction lets lie (the slack)
SEG_DIR = "seg"
_HDR = struct.Struct("<IQQq32sI")
HEADER = _HDR.size      # 64
_CRC_AT = HEADER - 4
_PAGE = 4096
_SUFFIX = ".seg"


class CorruptEntry(OSError):
    """A cached entry is missing, truncated or otherwise unreadable; the caller drops it."""


def _corrupt(message: str) -> OSError:
    return CorruptEntry(message)


def pack_header(size: int, gen: int, csum: int, mtime_ns: int, digest: bytes) -> bytes:
    """The 64-byte header of a record (see the module docstring)."""
    head = _HDR.pack(size, gen, csum, mtime_ns, digest, 0)[:_CRC_AT]
    return head + struct.pack("<I", zlib.crc32(head))


def segment_bytes_for(budget: int) -> int:
    """The segment size for a tier of ``budget`` bytes: a sixteenth of it, in whole pages, between
    :data:`PACK_BELOW` and 64 MiB (a small tier reclaims in small steps, a large one keeps few files)."""
    return max(PACK_BELOW, min(64 << 20, (budget // 16) // _PAGE * _PAGE))


class Record:
    """Where one live record is: its segment, the offset of its header, payload size, checksum."""

    __slots__ = ("seg", "off", "size", "csum")

    def __init__(self, seg: "_Segment", off: int, size: int, csum: int):
        self.seg, self.off, self.size, self.csum = seg, off, size, csum


class _Segment:
    __slots__ = ("id", "path", "fd", "length", "live", "dead", "gens", "sealed", "doomed", "refs", "padded")

    def __init__(self, sid: int, path: str, fd: int, length: int = 0):
        self.id, self.path, self.fd, self.length = sid, path, fd, length
        self.live = 0          # bytes of live records (header included)
        self.dead = 0          # bytes of dead records, counted by the index as dying
        self.gens: set = set()  # generations of the live records
        self.sealed = False
        self.doomed = False    # unlinked; its fd closes when the last reader lets go
        self.refs = 0          # readers between lookup and pread
        self.padded = 0        # page padding reported dead at seal


class SegmentStore:
    """Records of small entries in append-only segment files under ``directory``.

    Args:
        directory: the folder of the segments (created, 0700).
        segment_bytes: seal a segment when the next record would take it past this many bytes.
        compact_below: compact a sealed segment when its live bytes fall below this fraction of its length.

    Callbacks (set by the owner; called without the store's lock held, from any thread):
        on_reclaimed(nbytes): dead bytes (and padding) left the device (a segment was unlinked and closed).
        on_dead(nbytes): bytes became dead without a delete (a seal's padding to whole pages).
        on_hold(nbytes) -> bool: room for a compaction to copy ``nbytes``; False: not now.
        on_unhold(nbytes): the copy is done (its bytes are counted by the records now).

    Thread-safe. Raises OSError from the file system (ENOSPC, EIO) to the caller of :meth:`append`.
    """

    def __init__(self, directory: str, segment_bytes: int = 64 << 20, compact_below: float = 0.5):
        self.dir = directory
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.segment_bytes = int(segment_bytes)
        self.compact_below = float(compact_below)
        self._lock = threading.Lock()
        self._append_lock = threading.Lock()  # one append at a time: offsets are taken in order
        self._map: Dict[int, Record] = {}
        self._segs: Dict[int, _Segment] = {}
        self._active: Optional[_Segment] = None
        self._next_id = 1
        self.on_reclaimed: Optional[Callable[[int], None]] = None
        self.on_dead: Optional[Callable[[int], None]] = None
        self.on_hold: Optional[Callable[[int], bool]] = None
        self.on_unhold: Optional[Callable[[int], None]] = None
        # the slack: bytes of the segments on disk that no live record holds (dead records, page padding,
        # the old copies of a compaction in progress). With ``slack_base`` set (the disk tier does), a
        # fill's deletes wait in :meth:`make_room` until the slack is at most :meth:`slack_limit`
        # (``slack_base`` + a ``SLACK_SHARE``-th of the live bytes), and the compaction thread keeps it
        # under half of that: the tier charges each record its bytes and that share, and keeps
        # ``slack_base`` plus one segment (a compaction's copy) from its entries
        self.slack_base: Optional[int] = None
        self._room = threading.Condition(self._lock)
        self._on_disk = 0          # bytes of the segment files not yet closed (records, padding)
        self._live = 0             # bytes of live records
        self._promised = 0         # bytes of records a fill is about to delete (make_room granted them)
        self._waiting = 0          # fills waiting in make_room
        self._queued: collections.deque = collections.deque()  # generations to delete off the caller
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.compactions = 0       # segments compacted (live records copied forward)
        self.reclaimed_segments = 0  # segments unlinked
        self.torn = 0              # records dropped at scan (bad header, length or checksum)
        self.reads = 0             # records read by read(): one read of header and payload each
        self.cached_reads = 0      # of those, read from the page cache with the GIL kept (pread_cached)
        self._nowait = _pread_cached is not None

    # -- writing --------------------------------------------------------------------------------------
    def _new_segment(self) -> _Segment:
        sid = self._next_id
        self._next_id += 1
        path = os.path.join(self.dir, f"{sid:016x}{_SUFFIX}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        seg = _Segment(sid, path, fd)
        self._segs[sid] = seg
        return seg

    def append(self, digest: bytes, gen: int, mtime_ns: int, data: bytes) -> int:
        """Append one record (``data`` is the entry's bytes; ``digest`` the 32-byte sha256 of its path) and
        index it under ``gen``. Returns the xxh3_64 of ``data``.

        Raises:
            ValueError: ``gen`` is already stored, or the record does not fit in a segment.
            OSError: the write failed (nothing is indexed; the bytes written, if any, are dead).
        """
        csum = xxhash.xxh3_64_intdigest(data)
        rec = pack_header(len(data), gen, csum, mtime_ns, digest) + data
        n = len(rec)
        if n > self.segment_bytes:
            raise ValueError(f"a record of {n} bytes does not fit in a {self.segment_bytes}-byte segment")
        with self._append_lock:
            with self._lock:
                if gen in self._map:
                    raise ValueError(f"generation {gen:016x} is already in the segment store")
            seg, off, sealed = self._write(rec)
            with self._lock:
                self._map[gen] = Record(seg, off, len(data), csum)
                seg.live += n
                self._live += n
                seg.gens.add(gen)
        if sealed:
            self._report_dead(sealed)
        return csum

    def _write(self, rec: bytes) -> Tuple[_Segment, int, int]:
        # with self._append_lock held: write ``rec`` at the end of the active segment (sealing it first when
        # full). Returns (segment, offset, padding of the segment sealed, 0 if none); on failure the bytes
        # taken are dead and the segment is sealed (what follows a torn record is lost at reload)
        n = len(rec)
        sealed = 0
        with self._lock:
            seg = self._active
            if seg is None or seg.length + n > self.segment_bytes:
                if seg is not None:
                    sealed = self._seal_locked(seg)
                    self._active = None
                seg = self._active = self._new_segment()
            off = seg.length
            seg.length += n      # taken: a failed write leaves dead bytes, never an overlap
            self._on_disk += n
        try:
            written = os.pwrite(seg.fd, rec, off)
            if written != n:
                raise OSError(errno.ENOSPC, f"short write to a segment ({written} of {n} bytes)")
        except OSError:
            with self._lock:
                seg.dead += n
                if self._active is seg:
                    sealed += self._seal_locked(seg)
                    self._active = None
            self._report_dead(n + sealed)
            raise
        return seg, off, sealed

    def _seal_locked(self, seg: _Segment) -> int:
        # under self._lock: the active segment is full; returns its page padding (now dead bytes)
        seg.sealed = True
        pad = -seg.length % _PAGE
        seg.padded = pad
        self._on_disk += pad
        if seg.live < self.compact_below * seg.length:
            self._wake.set()
        return pad

    def _report_dead(self, n: int) -> None:
        if n and self.on_dead is not None:
            self.on_dead(n)

    # -- reading --------------------------------------------------------------------------------------
    def read(self, gen: int, csum: int, size: int, verify: bool = True) -> bytes:
        """The bytes of record ``gen``: one read of header and payload together, checked against its header
        (size, generation, checksum) and, with ``verify``, the xxh3_64 of the payload.

        The read is ``pread_cached`` (:mod:`shadefs.cache._pread`) under the store's lock when the record is
        in the page cache: the GIL is kept (no hand-off to another thread for a microsecond's copy) and the
        lock keeps the fd open, so no reference is taken. Otherwise (not all in the page cache, a file system
        without ``RWF_NOWAIT``, the extension not built) it is one ``os.pread`` outside the lock, the
        segment referenced meanwhile so that its fd is not closed under it.

        Raises:
            FileNotFoundError: no live record ``gen`` with checksum ``csum`` and ``size`` bytes.
            CorruptEntry: the record on disk does not match (a damaged segment).
        """
        n = HEADER + size
        buf = None
        with self._lock:
            r = self._map.get(gen)
            if r is None or r.csum != csum or r.size != size:
                raise FileNotFoundError(errno.ENOENT, f"no packed record {gen:016x}")
            seg = r.seg
            fd, off = seg.fd, r.off
            self.reads += 1
            if self._nowait and fd >= 0:
                got = _pread_cached(fd, n, off)
                if got.__class__ is bytes:
                    buf = got
                    self.cached_reads += 1
                elif got == errno.EOPNOTSUPP:
                    self._nowait = False  # this file system never reads without waiting: os.pread from now on
            if buf is None:
                seg.refs += 1
        if buf is None:
            try:
                buf = os.pread(fd, n, off)
            except OSError as e:
                raise _corrupt(f"packed record unreadable: {e.strerror or e}") from e
            finally:
                with self._lock:
                    seg.refs -= 1
                    close = seg.doomed and seg.refs == 0 and seg.fd >= 0
                    if close:
                        seg.fd = -1
                if close:
                    self._close(seg, fd)
        if len(buf) != n:
            raise _corrupt(f"packed record {gen:016x}: {len(buf)} bytes, expected {n}")
        rsize, rgen, rcsum, _, _, crc = _HDR.unpack_from(buf)
        if rsize != size or rgen != gen or rcsum != csum or crc != zlib.crc32(memoryview(buf)[:_CRC_AT]):
            raise _corrupt(f"packed record {gen:016x}: header does not match")
        data = buf[HEADER:]
        if verify and xxhash.xxh3_64_intdigest(data) != csum:
            raise _corrupt(f"packed record {gen:016x}: checksum differs from {csum:016x}")
        return data

    def _unref(self, seg: _Segment) -> None:
        with self._lock:
            seg.refs -= 1
            close = seg.doomed and seg.refs == 0 and seg.fd >= 0
            fd = seg.fd
            if close:
                seg.fd = -1
        if close:
            self._close(seg, fd)

    def __contains__(self, gen: int) -> bool:
        return gen in self._map

    # -- deleting and reclaiming ----------------------------------------------------------------------
    def delete(self, gen: int, promised: bool = False) -> bool:
        """Mark record ``gen`` dead (its bytes stay until its segment is reclaimed). Returns whether it was
        live. A sealed segment left without live records is unlinked; one below ``compact_below`` wakes
        the compaction thread. ``promised``: :meth:`make_room` counted this record's bytes already."""
        doomed = None
        with self._lock:
            r = self._map.pop(gen, None)
            if r is None:
                return False
            seg = r.seg
            n = HEADER + r.size
            seg.live -= n
            seg.dead += n
            self._live -= n
            if promised:
                self._promised -= n
            if self._over_trigger():
                self._wake.set()
            seg.gens.discard(gen)
            if seg.sealed and not seg.gens:
                doomed = self._doom_locked(seg)
            elif seg.live < self.compact_below * seg.length:
                self._wake.set()  # (the active one is sealed by the compaction when mostly dead)
        if doomed is not None:
            self._close(seg, doomed)
        return True

    def _doom_locked(self, seg: _Segment) -> Optional[int]:
        # under self._lock: unlink a segment with no live records; returns its fd when no reader holds it
        seg.doomed = True
        self._segs.pop(seg.id, None)
        try:
            os.unlink(seg.path)
        except OSError:
            pass
        if seg.refs == 0 and seg.fd >= 0:
            fd, seg.fd = seg.fd, -1
            return fd
        return None

    def _close(self, seg: _Segment, fd: int) -> None:
        # the segment's bytes leave the device once its last fd closes
        try:
            os.close(fd)
        except OSError:
            pass
        with self._lock:
            self._on_disk -= seg.length + seg.padded
            self._room.notify_all()
        self.reclaimed_segments += 1
        if self.on_reclaimed is not None:
            self.on_reclaimed(seg.dead + seg.padded)

    # -- the slack ------------------------------------------------------------------------------------
    def slack_bytes(self) -> int:
        """Bytes of the segment files on disk that no live record holds: dead records, page padding, the
        old copies of a compaction in progress (``_on_disk - _live``)."""
        with self._lock:
            return self._on_disk - self._live

    def slack_limit(self) -> Optional[int]:
        """The slack a fill may leave: ``slack_base`` + the live bytes / :data:`SLACK_SHARE` (None: no
        limit)."""
        return None if self.slack_base is None else self.slack_base + self._live // SLACK_SHARE

    def _over_trigger(self) -> bool:
        # under self._lock: the compaction thread should reclaim (the slack is over half its limit, or a
        # fill waits for room)
        limit = self.slack_limit()
        return limit is not None and (self._waiting > 0 or
                                      self._on_disk - self._live + self._promised > limit // 2)

    def make_room(self, gens, timeout: float) -> bool:
        """Before a fill deletes the records ``gens`` (its victims; generations not in the store are
        ignored): wait until their bytes fit in the slack (the slack, the bytes other fills were granted
        and theirs at most :meth:`slack_limit`; or the slack empty), waking the compaction thread. The
        bytes granted are counted until each record is deleted with ``promised=True``.

        Returns:
            True when granted (also when there is no limit or no such record), False after ``timeout``
            seconds without room (nothing granted: the caller deletes the records unpromised).
        """
        with self._lock:
            n = sum(HEADER + self._map[g].size for g in gens if g in self._map)
            if not n or self.slack_base is None:
                return True
            deadline = None
            self._waiting += 1
            try:
                while True:
                    slack = self._on_disk - self._live + self._promised
                    if slack + n <= self.slack_limit() or slack == 0:
                        self._promised += n
                        return True
                    self._wake.set()
                    if deadline is None:
                        deadline = time.monotonic() + timeout
                    left = deadline - time.monotonic()
                    if left <= 0 or self._stop.is_set():
                        return False
                    self._room.wait(min(left, 0.5))
            finally:
                self._waiting -= 1

    def compact_once(self) -> int:
        """Compact every sealed segment whose live bytes are below ``compact_below`` of its length (and
        for whose live bytes :attr:`on_hold` grants room); then, while the slack is over half of
        :meth:`slack_limit` (or a fill waits for room), the segment with the fewest live bytes next.
        Returns how many segments were reclaimed."""
        pad = None
        with self._append_lock:
            with self._lock:
                # the active segment too, when it is mostly dead: in a full tier no append would seal it
                act = self._active
                if act is not None and act.length >= _PAGE and act.live < self.compact_below * act.length:
                    pad = self._seal_locked(act)
                    self._active = None
                victims = sorted((s for s in self._segs.values()
                                  if s.sealed and not s.doomed and s.live < self.compact_below * s.length),
                                 key=lambda s: s.live)
        if pad:
            self._report_dead(pad)
        done = 0
        for seg in victims:
            if self._stop.is_set():
                break
            if self._compact(seg):
                done += 1
        tried = set()
        while not self._stop.is_set():
            pad = 0
            with self._append_lock:
                with self._lock:
                    if not self._over_trigger():
                        break
                    # the segment with the fewest live bytes among those with any slack (the active one
                    # too: sealed first), one at a time, so each copy takes at most one segment
                    cands = [s for s in self._segs.values()
                             if not s.doomed and s.id not in tried and s.length + s.padded > s.live
                             and (s.sealed or s.length >= _PAGE)]
                    if not cands:
                        break
                    seg = min(cands, key=lambda s: s.live)
                    tried.add(seg.id)
                    if not seg.sealed:
                        pad = self._seal_locked(seg)
                        self._active = None
            if pad:
                self._report_dead(pad)
            if self._compact(seg):
                done += 1
        return done

    def _compact(self, seg: _Segment) -> bool:
        with self._lock:
            if seg.doomed:
                return False
            live = seg.live
            fd = self._doom_locked(seg) if live == 0 else None
        if live == 0:
            if fd is not None:
                self._close(seg, fd)
            return True
        if self.on_hold is not None and not self.on_hold(live):
            return False
        moved = 0
        try:
            with self._lock:
                todo = sorted((self._map[g].off, g) for g in seg.gens)
            for off, gen in todo:
                with self._lock:
                    r = self._map.get(gen)
                    if r is None or r.seg is not seg:
                        continue
                    size, csum = r.size, r.csum
                    seg.refs += 1
                try:
                    buf = os.pread(seg.fd, HEADER + size, off)
                finally:
                    self._unref(seg)
                if len(buf) != HEADER + size or xxhash.xxh3_64_intdigest(buf[HEADER:]) != csum:
                    self.delete(gen)  # damaged: dropped here, the file is read again on its next miss
                    continue
                if not self._copy(gen, buf, seg, off):
                    continue
                moved += HEADER + size
            with self._lock:
                fd = None
                if not seg.gens and not seg.doomed:
                    fd = self._doom_locked(seg)
                    self.compactions += 1
            if fd is not None:
                self._close(seg, fd)
            return True
        except OSError as e:
            log.warning("segment compaction stopped: %s", e)
            return False
        finally:
            if self.on_unhold is not None:
                self.on_unhold(live)

    def _copy(self, gen: int, rec: bytes, old: _Segment, old_off: int) -> bool:
        # append the record ``rec`` (header included) of live ``gen`` to the active segment and move it
        n = len(rec)
        with self._append_lock:
            with self._lock:
                r = self._map.get(gen)
                if r is None or r.seg is not old or r.off != old_off:
                    return False
            seg, off, sealed = self._write(rec)
            with self._lock:
                r = self._map.get(gen)
                if r is None or r.seg is not old:  # deleted while copying: the copy is dead
                    seg.dead += n
                    gone = True
                else:
                    old.gens.discard(gen)
                    old.live -= n
                    r.seg, r.off = seg, off
                    seg.gens.add(gen)
                    seg.live += n
                    gone = False
        # the old copy stays on disk until its segment is unlinked, covered by the compaction's hold
        self._report_dead((n if gone else 0) + sealed)
        return not gone

    def delete_later(self, gens) -> None:
        """Queue deletes of records ``gens`` for the compaction thread (callable with any lock held)."""
        self._queued.extend(gens)
        self._wake.set()

    def drain(self) -> int:
        """Apply the queued deletes now. Returns how many records were live."""
        n = 0
        while self._queued:
            n += self.delete(self._queued.popleft())
        return n

    # -- background compaction ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the compaction thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="shadefs-compact", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            if self._stop.is_set():
                break
            self._wake.clear()
            try:
                self.drain()
                self.compact_once()
            except Exception:  # never let the thread die: the next wake retries
                log.exception("segment compaction failed")

    # -- reload ---------------------------------------------------------------------------------------
    def scan(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Rebuild the store from the segment files (at mount, before any append): read every segment,
        keep the records whose header CRC, length and payload checksum hold, truncate a segment at its
        first bad record, seal every segment. Of two copies of one generation the later one is kept.

        Returns:
            (digests (k, 32) uint8, generations, checksums (uint64), sizes, mtimes in ns (int64)) of the
            live records, in segment order (oldest first).
        """
        found: List[Tuple[bytes, int, int, int, int]] = []
        names = sorted(n for n in os.listdir(self.dir) if n.endswith(_SUFFIX) and len(n) == 16 + len(_SUFFIX))
        for name in os.listdir(self.dir):
            if name not in names:  # foreign files in the segment folder
                try:
                    os.unlink(os.path.join(self.dir, name))
                except OSError:
                    pass
        where: Dict[int, int] = {}
        for name in names:
            try:
                sid = int(name[:16], 16)
            except ValueError:
                continue
            path = os.path.join(self.dir, name)
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            with open(fd, "rb", buffering=0, closefd=False) as f:
                blob = f.read()
            seg = _Segment(sid, path, fd, 0)
            off = 0
            while off + HEADER <= len(blob):
                head = blob[off:off + HEADER]
                size, gen, csum, mtime, digest, crc = _HDR.unpack(head)
                end = off + HEADER + size
                if crc != zlib.crc32(head[:_CRC_AT]) or end > len(blob) or \
                        xxhash.xxh3_64_intdigest(blob[off + HEADER:end]) != csum:
                    break
                prev = where.get(gen)
                if prev is not None:  # an earlier copy (a compaction a crash interrupted): this one wins
                    r = self._map[gen]
                    r.seg.gens.discard(gen)
                    r.seg.live -= HEADER + r.size
                    r.seg.dead += HEADER + r.size
                    found[prev] = None
                self._map[gen] = Record(seg, off, size, csum)
                seg.gens.add(gen)
                seg.live += HEADER + size
                where[gen] = len(found)
                found.append((digest, gen, csum, size, mtime))
                off = end
            if off < len(blob):
                self.torn += 1
                os.ftruncate(fd, off)
            seg.length = off
            seg.dead = off - seg.live
            seg.sealed = True
            seg.padded = -off % _PAGE
            self._segs[sid] = seg
            self._next_id = max(self._next_id, sid + 1)
        for seg in list(self._segs.values()):
            if not seg.gens:
                fd = self._doom_locked(seg)
                if fd is not None:
                    os.close(fd)
        self._on_disk = sum(s.length + s.padded for s in self._segs.values())
        self._live = sum(s.live for s in self._segs.values())
        rows = [f for f in found if f is not None]
        k = len(rows)
        digests = np.frombuffer(b"".join(r[0] for r in rows), dtype=np.uint8).reshape(k, 32)
        gens = np.fromiter((r[1] for r in rows), dtype=np.uint64, count=k)
        csums = np.fromiter((r[2] for r in rows), dtype=np.uint64, count=k)
        sizes = np.fromiter((r[3] for r in rows), dtype=np.int64, count=k)
        mtimes = np.fromiter((r[4] for r in rows), dtype=np.int64, count=k)
        return digests, gens, csums, sizes, mtimes

    def dead_bytes(self) -> int:
        """Bytes of the segments on disk that no live record holds (dead records and page padding)."""
        with self._lock:
            return sum(s.dead + s.padded for s in self._segs.values())

    def live_bytes(self) -> int:
        """Bytes of live records (headers included)."""
        with self._lock:
            return sum(s.live for s in self._segs.values())

    def segments(self) -> int:
        """Segment files on disk (active included)."""
        return len(self._segs)

    def clear(self) -> None:
        """Drop every record and unlink every segment (no callbacks)."""
        with self._lock:
            segs = list(self._segs.values())
            self._segs.clear()
            self._map.clear()
            self._active = None
            self._on_disk = self._live = self._promised = 0
            self._room.notify_all()
        for seg in segs:
            try:
                os.unlink(seg.path)
            except OSError:
                pass
            if seg.fd >= 0 and seg.refs == 0:
                os.close(seg.fd)
                seg.fd = -1

    def close(self) -> None:
        """Stop the compaction thread and close the segment fds (records stay on disk). Idempotent."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            self._room.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(30)
        self._thread = None
        with self._lock:
            for seg in self._segs.values():
                if seg.fd >= 0 and seg.refs == 0:
                    os.close(seg.fd)
                    seg.fd = -1
