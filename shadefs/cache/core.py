"""The read path: RAM tier, then NVMe tier, then the backend, as one per-file state machine.

:meth:`TieredCache.open` is called once per file open (a sample access) and returns a :class:`Handle`
that serves the file's exact bytes and says where they came from (``"ram"``, ``"disk"`` or ``"miss"``).
That is also where counting happens: hit = an open served without touching the backend; hit ratio =
hits / opens; every open counts exactly one outcome.

Each file is in exactly one state (docs/architecture.md, "The per-file state machine"), kept in one table
of typed records with named transitions (:mod:`shadefs.cache.state`: ``absent``, ``fetching``
(:class:`~shadefs.cache.state.Fetch`), ``resident(ram)``, ``resident(disk)``, ``moving``
(:class:`~shadefs.cache.state.Move`), and a dropped disk entry ``deleting``
(:class:`~shadefs.cache.state.DyingEntry`): its bytes stay counted in the tier's budget until the file is
unlinked, and the file name carries a generation number, so that delete can never remove a newer entry of
the same file). This module is the read path over that table; :mod:`shadefs.cache.movers` does the disk
work of other files' transitions (demotions, deletes) on its own thread, and
:mod:`shadefs.cache.counters` counts every open under exactly one outcome.

Every transition happens under ``self.lock`` (microseconds: dict and index updates only); all I/O
(backend reads, disk reads, writes, unlinks) happens outside it. Tiers are exclusive: a file is
resident in at most one at every instant. A miss is offered to RAM first, then to the disk tier; a file
no tier admits is read whole with one GET into a transient buffer when it is at most :data:`FILL_CHUNK`
bytes and :data:`LOOSE_BUFFERS` has room for it, else streamed to the reader by ranges of whole
:data:`FILL_CHUNK` chunks (one chunk held per open), never one request per kernel READ. RAM's victims are
demoted to the disk tier when the disk policy admits them; a disk hit is promoted to RAM when RAM admits
it (and leaves the disk tier). Victims' disk writes and the unlinks of entries other than a fill's own
victims (a promoted file's old entry, a corrupt entry, a changed file's) are handed, the moment they are
decided (before the evicting miss's backend read), to one mover thread
(:meth:`TieredCache.start_background`; inline before it): no open waits for a victim's disk write or for
another entry's unlink.

Must never: serve partial or unverified data, exceed a tier's byte budget (in-flight fills and
undeleted victims included), read one file twice from the backend for concurrent opens, or let a
failing cache disk turn into an error for the reader.
"""
from __future__ import annotations

import concurrent.futures as cf
import collections
import errno
import logging
import os
import threading
import time
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from ..backends.base import Backend
from ..backends.timeout import on_deadline
from ..logutil import RateLimitedLog
from ..namespace import Namespace
from ..plan.plans import opener, set_opener
from ..policies.base import Importance
from ..procutil import FdReserve
from .buffers import FILL_BUFFERS, FillBuffers
from .counters import COUNTER_NAMES, OpenCounters
from .chunks import ChunkedHandle, ChunkedNamespace, ChunkMap, take_disk_chunks
from .index import TierIndex
from .movers import MOVE_QUEUE, Mover, Victim
from .state import (JOINER_OUTCOME, LEADER_OUTCOME, PIN_DYING, PIN_LOOSE, PIN_TIER, SOURCE_BACKEND, SOURCE_SHARED,
                    SOURCE_WINDOW, DyingEntry, Fetch, Move, Pin, StateTable)
from .tiers import CompactionBehind, CorruptEntry, DiskFloorReached, DiskTier, MemoryTier

__all__ = ["TieredCache", "Handle", "OpenTicket", "Outcome", "PrefetchFuture", "MOVE_QUEUE", "PIN_TIER",
           "PIN_DYING", "PIN_LOOSE"]

log = logging.getLogger("shadefs.cache")

Outcome = str  # "ram" | "disk" | "shared" | "miss" | "prefetch" (a completed prefetch) | "late" (waited on one)
RAM_BIT, DISK_BIT = 1, 2  # bits of TieredCache.resident_flags

# a fill into the disk tier reads the backend in pieces of this many bytes (the working set of one fill); a
# miss no tier admits is read whole with one request up to this size, and by ranges of this size above it
FILL_CHUNK = 8 << 20
# bytes the daemon may hold outside every tier (its bounded working set): buffers open handles keep that
# no tier holds (a shared-tier read no node tier kept, a prefetch no tier admitted, a fill whose disk write
# failed, a RAM victim evicted while held open) and RAM victims on their way to the disk tier. An open
# beyond it is served by ranges from the backend; a demotion beyond it is skipped (the victim is dropped)
LOOSE_BUFFERS = 64 << 20
# seconds an open of a file whose corrupt disk entry is being deleted waits for that delete (the mover's)
# when the tier cannot take the refill without those bytes; past it the refill is decided as things stand
UNLINK_WAIT = 5.0
#: seconds a fill waits for the segments' compaction to make room for its packed victims' dead records
COMPACTION_WAIT = 5.0
# the errnos of opening a disk entry that mean the entry itself is gone or damaged (dropped as corrupt);
# any other (EMFILE, ENFILE: the daemon is out of descriptors) fails that open and keeps the entry
ENTRY_GONE_ERRNOS = frozenset({errno.ENOENT, errno.EIO})
# MOVE_QUEUE (shadefs.cache.movers): submissions with RAM victims that may wait for the mover; the victims of
# one beyond it are dropped (not demoted), as when LOOSE_BUFFERS has no room; deletes are never dropped
# PIN_TIER, PIN_DYING, PIN_LOOSE (shadefs.cache.state): where the bytes of a RAM buffer record (Pin) count


class Handle:
    """One open of one file: serves its bytes until :meth:`release`.

    Attributes:
        fid: the file id.
        size: the file's size in bytes (the snapshot's).
        outcome: what this open was counted as: ``"ram"``, ``"disk"``, ``"shared"``, ``"miss"``,
            ``"prefetch"`` (a completed prefetch, ``ready``) or ``"late"`` (it waited for one).
        gen: the generation of the disk entry the handle serves (or served: an entry-less disk hit of
            :meth:`TieredCache.open_kept`), else 0.
        keep_pages: whether the kernel may keep the file's pages from earlier opens (FOPEN_KEEP_CACHE):
            True for a hit, and for an open of a file no tier holds (the mount is a snapshot: its pages
            are the bytes the backend would serve again); False for a miss that fills a tier (the
            kernel drops its pages, so the open sees the bytes the tier now holds) and for the first
            open after the file's disk entry was dropped as corrupt (pages read from it are dropped).
        left: the open was left to the kernel's pages (the plan prefetcher found them:
            :meth:`Prefetcher.kernel_holds <shadefs.plan.prefetch.Prefetcher.kernel_holds>`) and no READ of
            it has reached the daemon yet; the first one tells the prefetcher the pages were gone.

    The bytes come from exactly one source: the RAM tier's own ``bytes`` object (no copy; pinned, so
    that if the file is evicted while the handle is open its bytes are counted against
    :data:`LOOSE_BUFFERS`, or, when that has no room, stay counted in the RAM tier's budget, until the
    last handle on them is released), an fd of the file's verified disk entry (``pread``), a buffer
    counted against :data:`LOOSE_BUFFERS`, or the backend by ranges (a file no tier holds).

    :meth:`release` takes no lock: it queues its pin (``TieredCache._orphans``) and the cache's next
    critical section applies it, as it does for a handle dropped without release.
    """

    __slots__ = ("fid", "size", "outcome", "_cache", "_data", "_fd", "_released", "_pin", "_loose", "gen",
                 "keep_pages", "_chunk", "_csum", "left")

    def __init__(self, cache: "TieredCache", fid: int, size: int, outcome: Outcome,
                 data: Optional[bytes] = None, fd: Optional[int] = None, pin: Optional[Pin] = None,
                 loose: int = 0, gen: int = 0, keep_pages: Optional[bool] = None):
        self.fid = fid
        self.gen = gen
        self.size = size
        self.outcome = outcome
        self.keep_pages = outcome != "miss" if keep_pages is None else keep_pages
        self._cache = cache
        self._data = data
        self._fd = fd
        self._released = False
        self._pin = pin      # the Pin of the RAM tier buffer this handle holds
        self._loose = loose  # bytes of a buffer counted against LOOSE_BUFFERS
        self._chunk = None   # served by ranges: (offset, bytes, lock) of the last whole chunk read (loose)
        self._csum = None    # the checksum naming the entry file of generation gen (an entry fd's handle)
        self.left = False

    @property
    def source(self) -> str:
        """Where reads are served from: ``"memory"``, ``"entry"`` (a disk entry fd) or ``"backend"``."""
        return "memory" if self._data is not None else "entry" if self._fd is not None else "backend"

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (fewer only at EOF; ``b""`` at or past it).

        Raises:
            OSError: EBADF after :meth:`release`; EIO when the entry or the backend fails mid-read.
            ValueError: a negative offset or length.
        """
        if self._released:
            raise OSError(errno.EBADF, "read of a released handle")
        if offset < 0 or length < 0:
            raise ValueError(f"read at {offset} of {length} bytes")
        end = min(self.size, offset + length)
        if end <= offset:
            return b""
        if self._data is not None:
            return self._data[offset:end]
        if self._fd is not None:
            return _pread_exact(self._fd, end - offset, offset)
        if self._csum is not None:  # its entry fd was closed (close_entry_fd): the entry opened per read
            piece = self._cache._entry_read(self, offset, end)
            if piece is not None:
                return piece
        return self._cache._stream_read(self, offset, end)

    def backing_fd(self) -> Optional[int]:
        """An ``O_RDONLY`` fd of the file's (checksum-verified or just written) disk entry, for FUSE
        passthrough; None when the bytes are served from memory or the backend. Owned by the handle."""
        return None if self._released else self._fd

    def __del__(self):
        # a handle dropped without release(): its pin is handed back at the cache's next open (never
        # here: this may run where the cache lock is held)
        if not self._released:
            self._released = True
            if self._pin is not None or self._loose:
                self._cache._orphans.append((self._pin, self._loose))
            if self._fd is not None:
                try:
                    os.close(self._fd)
                except OSError:
                    pass
                self._cache.fds.drop()

    def release(self) -> None:
        """Close the fd and drop the buffer. Idempotent. Lock-free: the pin is handed back at the
        cache's next critical section (every open, stats, audit and reservation applies it first)."""
        if self._released:
            return
        self._released = True
        self._data = None
        if self._chunk is not None:
            self._chunk = (0, b"", self._chunk[2])  # the chunk's bytes go; a READ racing release keeps the lock
        if self._pin is not None or self._loose:
            self._cache._orphans.append((self._pin, self._loose))
            self._pin, self._loose = None, 0
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
            self._cache.fds.drop()

    def close_entry_fd(self) -> None:
        """Close the disk entry fd of a handle whose bytes the kernel reads from its own reference to the
        entry file (a FUSE passthrough backing id): the open then holds no descriptor of the daemon. Call
        it before the handle is served. A READ that still reaches the daemon (the kernel's read-ahead
        into the mount's pages, ``POSIX_FADV_WILLNEED``) opens the entry for that read, or, when it was
        evicted or no descriptor is free, is served by ranges from the backend. No-op without an fd."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
            self._cache.fds.drop()


def _pread_exact(fd: int, length: int, offset: int) -> bytes:
    out = os.pread(fd, length, offset)
    while len(out) < length:  # short reads are legal; an early EOF is not (the entry shrank)
        more = os.pread(fd, length - len(out), offset + len(out))
        if not more:
            raise OSError(errno.EIO, f"disk entry ended at {offset + len(out)}, expected {offset + length}")
        out += more
    return out


class PrefetchFuture(cf.Future):
    """The in-flight table's entry for a read ahead (:meth:`TieredCache.prefetch` with ``hold``): resolves
    to ``(bytes, source)`` (source ``"miss"``: the backend, ``"shared"``: the group), or None if the read
    failed (the waiting open then reads the file itself)."""

    prefetch = True


class OpenTicket:
    """An open :meth:`TieredCache.open_nowait` looked up but could not serve without waiting (a miss,
    or a file fetching): pass it to :meth:`TieredCache.open_ticket`, exactly once, on a thread that may
    block. ``fid``, ``size``: the file; ``plan``: what the lookup decided (opaque)."""

    __slots__ = ("fid", "size", "plan")

    def __init__(self, fid: int, size: int, plan: tuple):
        self.fid, self.size, self.plan = fid, size, plan

    @property
    def joins(self) -> bool:
        """Whether serving it waits on another thread's read (a fetch in flight, a prefetch), rather than
        on a read of its own or nothing (a file no tier admits)."""
        fl, _, leader, _ = self.plan
        return fl is not None and not leader


class _ResidentsPinned:
    """The RAM index's ``pinned`` (TierIndex.reserve) while a front end answers RAM hits without the GIL: a
    victim asked about is first retired from the front end's table (no open of it is answered there from
    then on; those still open hold its Pin), so the index sees every open handle on it, the front end's too.
    A victim of a reservation that is then refused stays resident; its next hit goes through the cache and
    publishes it again."""

    __slots__ = ("cache",)

    def __init__(self, cache: "TieredCache"):
        self.cache = cache

    def __bool__(self) -> bool:
        return True

    def __contains__(self, fid: int) -> bool:
        self.cache._retire(fid)
        return fid in self.cache._pins


class TieredCache:
    """The cache of one mount.

    Args:
        namespace: the metadata snapshot (file ids, sizes).
        backend: reads files on a miss.
        ram: (index, store) of the RAM tier; index capacity 0 turns it off.
        disk: (index, store) of the disk tier, or None.
        importance: per-file importance shared by importance-aware policies.
        trace: an object with ``record(path, size, outcome)`` called once per open, or None.
        on_backend_read: optional ``callback(seconds: float)`` after every successful backend read (a
            whole-file fill, or one range of a streamed file: the latency histogram); every other figure
            is a counter read at scrape time.
        shared: the group's :class:`~shadefs.cache.shared.SharedTier` (between the NVMe tier and the
            backend), or None. A miss's leader asks it first (within its deadline); a shared hit is counted
            ``"shared"`` and filled into the node's tier like a backend read. A file read from the
            backend that no tier of the node admits, and a RAM victim no disk tier takes, is offered to
            the group off the request path (the group is the node's victim cache: it holds what the
            node does not).
        chunks: a :class:`~shadefs.cache.chunks.ChunkMap` of ``namespace``: its files above the chunk
            size are cached by chunks (entry ids above the file ids; ``importance`` and the policies'
            id space must cover its ``num_ids``). None: every file is one entry.
    """

    def __init__(self, namespace: Namespace, backend: Backend, ram: Tuple[TierIndex, MemoryTier],
                 disk: Optional[Tuple[TierIndex, DiskTier]], importance: Importance,
                 trace=None, on_backend_read=None, shared=None, chunks: Optional[ChunkMap] = None):
        # entry ids: the files, then (with chunks) the chunks of the chunked files (shadefs.cache.chunks)
        self.chunks = chunks if chunks else None
        self._nfiles = namespace.num_files
        num_ids = namespace.num_files
        if self.chunks is not None:
            namespace = ChunkedNamespace(namespace, self.chunks)
            num_ids = self.chunks.num_ids
        self.ns = namespace
        self.shared = shared
        self.backend = backend
        self._etags_are_versions = getattr(backend, "etags_are_versions", True)  # shared-tier keys
        self.ram_index, self.ram = ram
        self.disk_index, self.disk = disk if disk is not None else (None, None)
        self.entries = self.disk.table(num_ids) if self.disk is not None else None
        # entry checksums (docs/architecture.md, "Entry checksums"): "every-open" (the default) verifies an
        # entry on every disk hit; "first-hit" verifies each entry generation at its first hit after it was
        # written or reloaded, then trusts it while it stays resident. verified[fid]: the resident generation
        # passed (kept in both modes; read only by first-hit).
        self.verify_entries = "every-open"
        self.verified = np.zeros(num_ids if self.disk is not None else 0, dtype=np.bool_)
        self.importance = importance
        self.trace = trace
        self.on_backend_read = on_backend_read
        self.lock = threading.Lock()
        self._ram_data = self.ram._data          # the RAM store's dict: the hit path reads it directly
        # the per-file state (shadefs.cache.state): every state change is one of its transitions
        self.table = StateTable(self.ram_index, self._ram_data, self.disk_index, self.entries, self.verified)
        self._flights = self.table.flights       # fid -> Fetch | Move: files fetching or moving
        # RAM tier buffers that open handles hold: fid -> Pin (PIN_TIER). Evicted while held (or moving to
        # the disk tier: the Move holds a ref), a record leaves the tier at once and its bytes are counted
        # against loose_budget (PIN_LOOSE), or, with no room there, stay in the RAM index's dying bytes
        # (PIN_DYING), until its last ref goes; self._held (id -> Pin) has those records
        self._pins = self.table.pins
        self._held = self.table.held
        self.ram_index.pinned = self._pins
        self.ram_index.spill_room = self._loose_room
        self.ram_index.spill = self._spill
        self.loose_bytes = 0                     # bytes held outside the tiers (<= loose_budget)
        # (pin, loose bytes) handed back by released or dropped handles, applied by the next critical
        # section (deque.append: no lock on release)
        self._orphans: collections.deque = collections.deque()
        # the RAM hits a front end answers without the GIL (attach_residents): its table of residents, and
        # how many hits (and released entries) it logged that the next critical section applies (_settle)
        self._residents = None
        self._hits_pending = int   # () -> 0 without them
        self.loose_budget = LOOSE_BUFFERS
        # the bytes of backend reads in flight (fills, their pieces, streamed ranges, promotions' entry
        # reads): at most FILL_BUFFERS (shadefs.cache.buffers); past it a fill waits for room and a streamed
        # read takes the bytes asked, not a whole chunk
        self.fills = FillBuffers(FILL_BUFFERS)
        # descriptors kept free for control, the tiers and the source: an open that would hold an entry fd
        # past it is served without one (_entry_handle); the daemon sets its own (--fd-reserve)
        self.fds = FdReserve()
        self._fd_log = RateLimitedLog(log, 60.0)
        # called with (file id, entry generation) right after that generation of the file's disk entry is
        # unlinked, before its bytes leave the budget (outside the lock): a front end that pins entry files
        # (passthrough backing ids) lets go of that generation's, never of a newer one's (the mover may
        # unlink an old generation after a refill wrote and registered the next)
        self.entry_unlinked: List = []
        # called with (file id, entry generation) right after a disk entry is dropped as corrupt (outside the
        # lock): a front end that serves entry files itself (passthrough) never serves that generation again
        self.entry_dropped: List = []
        self.started = time.monotonic()
        # the counters (shadefs.cache.counters; read under self.lock for a consistent snapshot; each is also
        # an attribute of the cache, read-only)
        self.counts = OpenCounters()
        # files whose disk entry was dropped as corrupt since their last open: the kernel may hold pages
        # read from it, so their next open of the untiered kind does not keep pages (Handle.keep_pages)
        self._stale_pages: set = set()
        # files whose corrupt entry's delete is queued on the mover: fid -> set once it is done
        self._unlinking: Dict[int, threading.Event] = {}
        # the namespace's not-yet-compared records (a reused snapshot), or None: see recheck()
        self._unchecked = getattr(namespace, "unchecked", None)
        self._write_error_log = RateLimitedLog(log, 10.0)
        # residency of every file id, one bit per tier, maintained by the tier indexes on commit/remove:
        # resident() and the checkpoint read it instead of walking the indexes under the lock
        self.resident_flags = np.zeros(num_ids, dtype=np.uint8)
        self.ram_index.track_residency(self.resident_flags, RAM_BIT)
        if self.disk_index is not None:
            self.disk_index.track_residency(self.resident_flags, DISK_BIT, keep_order=True)
        # deferred policy bookkeeping (score batches, hit touches), applied by a background thread
        self.apply_slice = 64            # ids per lock acquisition (~100 us at 1M residents)
        self.apply_period = 0.05         # seconds: queued hit touches are applied at least this often
        self._bg_policies: List = []
        self._bg_wake = threading.Event()
        self._bg_stop = threading.Event()
        self._bg_thread: Optional[threading.Thread] = None
        # the mover (shadefs.cache.movers; its thread from start_background): demotions and entry deletes,
        # off the thread that evicted, promoted or found an entry corrupt (a FUSE reader never writes or
        # unlinks for another file); done inline before it starts
        self.mover = Mover(self)
        self.plans = None        # shadefs.plan.plans.PlanRegistry: cursors follow every counted open
        self.prefetcher = None   # shadefs.plan.prefetch.Prefetcher
        self._inflight: Dict[int, object] = {}  # the prefetcher's reads in flight (PrefetchFuture)
        self.stream_threshold = 64 * 2**20       # the prefetcher never reads files above this
        # a miss no tier admits: read whole (one request) up to whole_max bytes, else by ranges of chunk
        # bytes (module constants; tests lower them)
        self.whole_max = FILL_CHUNK
        self.chunk = FILL_CHUNK
        # untiered files an open already read whole: the kernel keeps their pages (Handle.keep_pages), so
        # a later open is streamed instead, by whole chunks at the first READ that reaches the daemon (one
        # request if the pages are gone, none while they serve); 1 byte per file
        self._read_whole_once = np.zeros(num_ids, dtype=bool)
        # opens served from the source answered by FUSE passthrough to the source file (set by the kernel
        # front end once the kernel granted passthrough and the backend opens source files: see
        # source_fd): "untiered", "large" or "off"
        self.source_passthrough = "off"

    def attach_plans(self, plans, prefetcher=None) -> None:
        """Follow announced plans: ``plans`` shares this cache's lock; ``prefetcher`` reads
        ahead of them into its window. Call before serving."""
        self.plans = plans
        self.prefetcher = prefetcher

    # -- the read path -----------------------------------------------------------------------------
    def open(self, fid: int) -> Handle:
        """Open file ``fid``: count one outcome and return a :class:`Handle` serving its bytes.

        May block on the backend (a miss, or an open that joins another open's read of the same file).

        Raises:
            FileNotFoundError: the backend says the file is gone (ENOENT).
            OSError: the backend failed (EIO), after the backend's own retries.
        """
        if self._unchecked is not None and self._unchecked[fid]:
            self.recheck(fid)
        while True:
            done = self._unlinking.get(fid)
            if done is not None:  # its corrupt entry's delete, queued on the mover (_drop_corrupt)
                ix = self.disk_index
                if ix is not None and ix.needs_dying(int(self.ns.size(fid))):
                    done.wait(UNLINK_WAIT)  # the refill needs the old entry's bytes back in the budget
                with self.lock:
                    if self._unlinking.get(fid) is done:
                        del self._unlinking[fid]
            # one lookup path: a hit is served by open_nowait, anything else by its ticket
            h = self.open_nowait(fid, ticket=True)
            if h is not None:
                break
        return self.open_ticket(h) if type(h) is OpenTicket else h

    def _plan_open(self, fid: int, size: int) -> tuple:
        """Under self.lock, for an open that is no memory hit (so its file is not ``moving``): what it waits
        on (``fl``: a :class:`Fetch`, a prefetch ``(kind, x)``, ``("ask", None)``: ask the kernel for
        its pages first, or None: left to them), the disk entry it hits
        (``disk_gen``), whether it leads a new fetch (``leader``, with the RAM victims it evicted, already
        ``moving``). A leading plan must be finished."""
        fl = self._flights.get(fid)
        disk_gen = None
        leader = False
        demote: list = []
        if fl is not None:                           # fetching: wait for that one read
            pass
        elif self.disk_index is not None and fid in self.disk_index:
            self.disk_index.hit(fid)
            disk_gen = (int(self.entries.gen[fid]), int(self.entries.csum[fid]))
        else:                                        # absent: a prefetch has it, or this open leads
            pf = self._prefetched(fid, size)
            if pf is None:
                p = self.prefetcher
                if p is not None:
                    if p.kernel_holds(fid):
                        return None, None, False, demote  # the kernel keeps its pages: no tier fill, no read now
                    if p.ask_at_open(fid):
                        return ("ask", None), None, False, demote  # ask the kernel for its pages first
                fl, demote = self._start_fetch(fid, size, transient=True)
                leader = True
            else:
                fl = pf
        return fl, disk_gen, leader, demote

    def _finish_open(self, fid: int, size: int, fl, disk_gen, leader: bool, demote) -> Optional[Handle]:
        """Outside the lock: serve the open :meth:`_plan_open` planned (may block on the backend or on
        another open's read); None when the file moved meanwhile (nothing counted: plan again).

        Every open that returns a handle or raises is counted exactly once: a hit by :meth:`_disk_hit`, a
        prefetch taken by :meth:`_prefetched`, a wait for one here (``late``), a leader under
        :data:`LEADER_OUTCOME` of its fetch's source (even when the read fails), an open that joined a
        fetch under :data:`JOINER_OUTCOME` of it (every source maps to one outcome)."""
        if isinstance(fl, tuple):                        # from the plan prefetcher
            kind, x = fl
            if kind == "ask":
                self.prefetcher.ask(fid)  # outside the lock; then plan again (nothing was counted)
                return None
            if kind == "late":
                t0 = time.monotonic()
                x = x.result()
                if x is None:
                    return None  # the prefetch failed: look again (nothing was counted)
                with self.lock:
                    self.prefetcher.took_late(fid, time.monotonic() - t0)
                    self._count(fid, size, "late")
            return self._admit_data(fid, size, *x, kind)
        if disk_gen is not None:
            return self._disk_hit(fid, size, *disk_gen)  # None: dropped or moved meanwhile
        if fl is None:
            return self._stream_open(fid, size)
        # counted once the source is known: "shared" when the group served it, else "miss"
        if leader:
            try:
                self._lead(fid, size, fl, demote)
            finally:
                with self.lock:
                    self._count(fid, size, LEADER_OUTCOME[fl.source])
            return self._miss_handle(fid, size, fl, LEADER_OUTCOME[fl.source])
        t0 = time.monotonic()
        fl.done.wait()
        outcome = JOINER_OUTCOME[fl.source]
        with self.lock:
            if fl.source == SOURCE_WINDOW:
                # it joined the admission of bytes another open took from the prefetch window: it waited
                # for a prefetch (not a miss: it shared no open's backend read)
                self.prefetcher.count_late(time.monotonic() - t0)
            else:
                self.counts.joined += 1
            self._count(fid, size, outcome)
        if fl.error is not None:
            raise fl.error
        return self._miss_handle(fid, size, fl, outcome)

    def _prefetched(self, fid: int, size: int):
        # under self.lock, for an absent file: ("prefetch", bytes) counted, ("late", future), or None
        if self.prefetcher is None:
            return None
        got = self.prefetcher.take(fid)
        if got is not None:
            self._count(fid, size, "prefetch")
            return ("prefetch", got)
        fut = self._inflight.get(fid)
        if fut is not None and getattr(fut, "prefetch", False):
            return ("late", fut)
        return None

    def _admit_data(self, fid: int, size: int, data: bytes, source: str, outcome: Outcome) -> Handle:
        """Admit bytes already in hand (a prefetch, its open already counted ``outcome``; ``source``
        ``"miss"`` or ``"shared"``, where the prefetch got them) through the state machine: a fetch of
        source ``window``, which an open of the file meanwhile joins (counted ``late``). Bytes from the
        backend that no tier of this node keeps are offered to the group, as a miss's are."""
        with self.lock:
            fl = None
            absent = self._absent(fid)
            if absent:
                fl, demote = self._start_fetch(fid, size, transient=True, source=SOURCE_WINDOW)
        if fl is not None:
            self._lead(fid, size, fl, demote, data=data)
        if source == "miss" and absent and (fl is None or fl.tier is None):
            self._offer_shared(fid, data)
        if fl is None:
            return self._loose_handle(fid, size, outcome, data)
        return self._miss_handle(fid, size, fl, outcome)

    def _stream_open(self, fid: int, size: int) -> Handle:
        """An open of a file no tier admits: streamed from the backend by ranges; the kernel keeps its
        pages between opens (``keep_pages``), so a re-read reaches neither the daemon nor the backend."""
        with self.lock:
            # asked before the open is counted (counting marks the file opened): left to the kernel's pages
            left = self.prefetcher is not None and self.prefetcher.kernel_holds(fid)
            self._count(fid, size, "miss")
            self.counts.streamed += 1
            keep = not self._stale_pages or self._pages_trusted(fid)
        h = Handle(self, fid, size, "miss", keep_pages=keep)
        h.left = left
        return h

    # -- passthrough to the source file (the kernel front end) -------------------------------------------
    def source_fd(self, h) -> Optional[int]:
        """For an open ``h`` served from the source (a file no tier admits, streamed; or a chunked file),
        when :attr:`source_passthrough` allows it: an ``O_RDONLY`` fd of the source file, opened and
        checked as a read opens it (``backend.open_source``: beneath the root, no symlink, ``fstat``
        against the snapshot), for the kernel front end to answer the open by passthrough to it. None when
        the open is not served that way (the front end serves it as before). Counts nothing
        (:meth:`source_opened` does, once the kernel took it). The caller closes the fd.

        A chunked file goes to the source under ``"large"`` always; under ``"untiered"`` only when no
        tier would take any more of it: none of its chunks fetching or moving, not every chunk resident
        (a file the tiers hold whole is served from them), and every chunk that is not resident refused
        by both tiers' policies now (``would_admit``). Chunks already resident stay resident (an open
        that is not passthrough reads them; the policy evicts them as it decides) but this open does not
        read them: the kernel reads the whole file from the source.

        Raises:
            FileNotFoundError, StaleSource, BackendError: the source file is gone, refused (another file,
                a symlink) or changed (size, mtime): the open fails as a read of it would.
        """
        mode = self.source_passthrough
        if mode == "off":
            return None
        opener = getattr(self.backend, "open_source", None)
        if opener is None:
            return None
        fid = h.fid
        if type(h) is ChunkedHandle:
            if mode == "untiered":
                with self.lock:
                    if not self._chunks_untiered(fid):
                        return None
        elif not (type(h) is Handle and h.outcome == "miss" and h.gen == 0 and h.source == "backend"):
            return None
        if not self.fds.room():  # past the descriptor reserve: served by ranges, as without passthrough
            self.fds.refuse()
            self._fd_log(logging.WARNING, "descriptor reserve reached (soft limit %d, %d kept free for control, "
                         "the tiers and the source): files are served from the source without passthrough to "
                         "it (counted in stats 'descriptors', refused)", self.fds.limit(), self.fds.reserve)
            return None
        return opener(self.ns.path(fid), int(self.ns.size(fid)))

    def _chunks_untiered(self, fid: int) -> bool:
        # under self.lock: no tier would take any chunk of chunked file ``fid`` now (source_fd)
        first, count = self.chunks.span(fid)
        ram, disk = self.ram_index, self.disk_index
        flags = self.resident_flags
        absent = 0
        for cid in range(first, first + count):
            if cid in self._flights:
                return False
            if flags[cid]:
                continue
            absent += 1
            size = int(self.ns.size(cid))
            if ram.would_admit(cid, size) or (disk is not None and disk.would_admit(cid, size)):
                return False
        return absent > 0

    def source_opened(self, h) -> None:
        """``h``'s open was answered by passthrough to the source file (:meth:`source_fd`): counted in
        ``source_opens``; a chunked file's open, which counted nothing (its READs would have opened its
        chunks, and none will reach the daemon now), is counted here as one miss of the file (streamed),
        and traced so; a streamed file's open was counted a miss already."""
        with self.lock:
            self.counts.source_opens += 1
            if type(h) is ChunkedHandle:
                size = int(self.ns.size(h.fid))
                self.counts.count("miss", size)
                self.counts.streamed += 1
                if self.trace is not None:
                    self.trace.record(self.ns.path(h.fid), size, "miss")

    def _pages_trusted(self, fid: int) -> bool:
        # under self.lock: False once after fid's disk entry was dropped as corrupt
        if fid in self._stale_pages:
            self._stale_pages.discard(fid)
            return False
        return True

    def shared_key(self, fid: int) -> str:
        """The group-wide key of file ``fid`` (path, size, mtime and ETag: a changed file never matches)."""
        etag = int(self.ns.etags[fid]) if self._etags_are_versions else 0
        return self.shared.key(self.ns.path(fid), int(self.ns.size(fid)), self._mtime_ns(fid), etag)

    def open_nowait(self, fid: int, ticket: bool = False):
        """Like :meth:`open` when the open is served without waiting on the backend or on an in-flight
        fetch (a RAM or NVMe hit); else None, and nothing is counted.

        With ``ticket``, an open that would wait returns an :class:`OpenTicket` instead of None: its
        lookup is done (it joined a fetch in flight, or leads a new one, or took a prefetch) and
        :meth:`open_ticket` serves it, without a second lookup. A ticket must be passed to
        :meth:`open_ticket` exactly once (a leading ticket dropped would leave the file's other opens
        waiting on a fetch nobody runs)."""
        fid = int(fid)
        with self.lock:  # the RAM hit first: one critical section, one dict lookup (no size lookup)
            if self._orphans or self._hits_pending():  # _settle_due, inlined (the hot path)
                self._settle()
            data = self._ram_data.get(fid)
            if data is not None:
                return self._ram_hit(fid, data)
        if self._unchecked is not None and self._unchecked[fid]:
            return None  # its record must be compared with the source first (a stat: open() does it)
        if self.chunks is not None and self.chunks.is_chunked(fid):
            return self._open_chunked(fid)
        size = int(self.ns.size(fid))
        while True:
            with self.lock:
                self._settle_due()
                h = self._memory_hit(fid, size)
                if h is not None:
                    return h
                if fid in self._flights or self.disk_index is None or fid not in self.disk_index:
                    if fid in self._unlinking:
                        return None  # open() waits for its corrupt entry's delete first
                    return OpenTicket(fid, size, self._plan_open(fid, size)) if ticket else None
                self.disk_index.hit(fid)
                gen, csum = int(self.entries.gen[fid]), int(self.entries.csum[fid])
            h = self._disk_hit(fid, size, gen, csum)
            if h is not None:
                return h

    def _open_chunked(self, fid: int) -> ChunkedHandle:
        """An open of a chunked file: counts nothing and waits for nothing (its READs open the chunk
        entries they touch, each counted as one open: shadefs.cache.chunks); plans follow the file."""
        first, count = self.chunks.span(fid)
        with self.lock:
            if self.plans is not None:
                self.plans.observe(fid)
            keep = True
            if self._stale_pages:  # a chunk of it was dropped as corrupt: its pages go once
                stale = [c for c in self._stale_pages if first <= c < first + count]
                keep = not stale
                self._stale_pages.difference_update(stale)
        return ChunkedHandle(self, fid, int(self.ns.size(fid)), self.chunks, keep_pages=keep)

    def open_ticket(self, t: "OpenTicket") -> Handle:
        """Serve an open :meth:`open_nowait` returned a ticket for (counts one outcome; may block on the
        backend, as :meth:`open`). Raises as :meth:`open`."""
        plan, t.plan = t.plan, None
        if plan is None:
            raise ValueError(f"ticket for file {t.fid} already used")
        h = self._finish_open(t.fid, t.size, *plan)
        return h if h is not None else self.open(t.fid)

    def _ram_hit(self, fid: int, data: bytes) -> Handle:
        """Under self.lock: serve a hit of resident(ram) ``fid`` (its bytes ``data``, the RAM store's own):
        its policy told, the open counted (:meth:`_count`, as every open is), its buffer pinned; returns the
        Handle. Residency and bytes come from one lookup (the RAM store holds exactly the RAM index's files,
        both changed in the same critical sections) and the size is ``len(data)``."""
        size = len(data)
        self.ram_index.policy.on_hit(fid)
        self._count(fid, size, "ram")
        rec = self._pins.get(fid)
        if rec is None:
            rec = self._pins[fid] = Pin(1, size, PIN_TIER, fid)
        else:
            rec.refs += 1
        if self._residents is not None:
            self._residents.publish(fid, data)  # its next opens are answered without the GIL
        return Handle(self, fid, size, "ram", data, None, rec)

    def _memory_hit(self, fid: int, size: int) -> Optional[Handle]:
        # under self.lock: resident(ram), or moving (its bytes are still in memory)
        data = self._ram_data.get(fid)
        if data is not None:
            return self._ram_hit(fid, data)
        mv = self._flights.get(fid)
        if type(mv) is Move:
            # moving: served from its bytes in memory (its Pin counts them while any ref holds them); a Move
            # has nothing to wait on
            self._count(fid, size, "ram")
            mv.pin.refs += 1
            return Handle(self, fid, size, "ram", data=mv.data, pin=mv.pin)
        return None

    def _pin_ram(self, fid: int, size: int) -> Pin:
        # under self.lock: one more open handle on resident(ram) ``fid``'s buffer
        rec = self._pins.get(fid)
        if rec is None:
            rec = self._pins[fid] = Pin(0, size, PIN_TIER, fid)
        rec.refs += 1
        return rec

    def _settle_due(self) -> None:
        """Under self.lock, first thing in a critical section that reads or decides on pins or loose bytes:
        :meth:`_settle` when a released handle or a hit logged without the GIL waits."""
        if self._orphans or self._hits_pending():
            self._settle()

    def _settle(self) -> None:
        """Under self.lock: apply the pins handed back by released (or dropped) handles. Every critical
        section that reads or decides on pins or loose bytes (opens, reservations, stats, audit) calls it
        first, so they see exact figures. With a front end that answers RAM hits without the GIL
        (:meth:`attach_residents`) it first applies the hits it logged (:meth:`_apply_hits`)."""
        if self._residents is not None:
            self._apply_hits()
        orphans, pins = self._orphans, self._pins
        while orphans:
            rec, loose = orphans.popleft()
            if loose or rec is None or rec.where != PIN_TIER or rec.refs != 1:
                self._unpin_locked(rec, loose)
            else:                                  # the common case, inlined: a RAM hit's last handle
                rec.refs = 0
                if pins.get(rec.fid) is rec:
                    del pins[rec.fid]

    # -- RAM hits answered without the GIL (the kernel front end's compiled loop) ----------------------
    def attach_residents(self, residents) -> None:
        """Let a front end answer RAM hits without the GIL (``shadefs.fuse._fastloop.Residents``; before
        serving). A RAM hit served here publishes its file's bytes to ``residents``; the front end then
        answers that file's opens and reads itself and logs each open (file id, opener pid, size), until the
        file leaves the RAM tier (:meth:`_retire`, under the lock, before an eviction decides on its pins).
        Every critical section that reads or decides on counters, pins or the policy applies the log first
        (:meth:`_settle`), and the front end has it applied every ~2 ms while its reader threads are busy,
        every 50 ms otherwise (:meth:`apply_hits`): counting is exact at every stats and metrics read."""
        self._residents = residents
        self._hits_pending = residents.pending
        self.ram_index.pinned = _ResidentsPinned(self)

    def apply_hits(self) -> None:
        """Apply the RAM hits the front end answered without the GIL (thread-safe; never raises)."""
        try:
            with self.lock:
                self._settle()
        except Exception:
            log.exception("applying the RAM hits answered by the compiled loop")

    def _apply_hits(self) -> None:
        # under self.lock: the hits logged since the last call, in order, counted and told to the policy,
        # the plans (as their opener's) and the trace as the Python RAM hit does; then the pins of retired
        # entries whose last open answered without the GIL was released
        fids, pids, sizes, pins = self._residents.take()
        if fids:
            # _count(fid, size, "ram") per hit, inlined: the one copy of it (every RAM hit after a file's
            # first is applied here; the calls doubled this loop's time per hit, ~0.17 us more, under the
            # lock). Counters per batch; policy, plans and trace per hit, as _ram_hit and _count do them
            # (tests/unit/test_ram_hits.py runs both on the same opens)
            n, nbytes = len(fids), sum(sizes)
            c = self.counts
            c.opens += n
            c.open_bytes += nbytes
            c.hits_ram += n
            c.hit_bytes += nbytes
            on_hit = self.ram_index.policy.on_hit
            resident = self.ram_index.sizes
            plans, trace, nfiles = self.plans, self.trace, self._nfiles
            saved = opener() if plans is not None else None
            try:
                for fid, pid, size in zip(fids, pids, sizes):
                    if fid in resident:  # (evicted since: its rank went with it)
                        on_hit(fid)
                    if plans is not None and fid < nfiles:  # a chunk's open is its file's, counted once
                        set_opener(pid)  # the plans follow it as its opener's open
                        plans.observe(fid)
                    if trace is not None:
                        trace.record(self.ns.path(fid), size, "ram")
            finally:
                if plans is not None:
                    set_opener(saved)
        for rec in pins:
            self._unpin_locked(rec, 0)

    def _retire(self, fid: int) -> None:
        """Under self.lock: opens of ``fid`` are no longer answered without the GIL; the ones still open hold
        one ref of its Pin (created if none), handed back when the last of them is released."""
        rec = self._pins.get(fid)
        new = rec is None
        if new:
            data = self._ram_data.get(fid)
            rec = Pin(0, len(data) if data is not None else 0, PIN_TIER, fid)
        if self._residents.retire(fid, rec):
            rec.refs += 1
            if new:
                self._pins[fid] = rec

    def _unpin_locked(self, rec: Optional[Pin], loose: int) -> None:
        # under self.lock: one ref on buffer record ``rec`` and/or ``loose`` loose bytes go
        if loose:
            self.loose_bytes -= loose
        if rec is None:
            return
        rec.refs -= 1
        if rec.refs == 0:
            where = rec.where
            if where == PIN_TIER:
                if self._pins.get(rec.fid) is rec:
                    del self._pins[rec.fid]
                return
            del self._held[id(rec)]
            if where == PIN_LOOSE:
                self.loose_bytes -= rec.size     # evicted while held or moving: its bytes are free now
            else:
                self.ram_index.unlinked(rec.size)

    def _loose_room(self) -> int:
        # under self.lock (TierIndex.spill_room): bytes a held RAM victim may take outside the tier
        return self.loose_budget - self.loose_bytes

    def _spill(self, fid: int, size: int) -> None:
        # under self.lock (TierIndex.spill): RAM victim ``fid``, held open, leaves the tier; its bytes
        # are counted against loose_budget until its last ref goes
        self._pins[fid].where = PIN_LOOSE
        self.loose_bytes += size

    def _loose_handle(self, fid: int, size: int, outcome: Outcome, data: Optional[bytes],
                      keep_pages: Optional[bool] = None) -> Handle:
        """A handle on bytes no tier holds: kept while :data:`LOOSE_BUFFERS` allows, else dropped and
        served by ranges from the backend."""
        with self.lock:
            self._settle_due()
            if data is not None:
                if self.loose_bytes + size <= self.loose_budget:
                    self.loose_bytes += size
                    return Handle(self, fid, size, outcome, data=data, loose=size, keep_pages=keep_pages)
                self.counts.loose_refused += 1
        return Handle(self, fid, size, outcome, keep_pages=keep_pages)

    def _count(self, fid: int, size: int, outcome: Outcome) -> None:
        # called with self.lock held: one open of ``fid`` counted ``outcome`` ("prefetch" / "late" are also
        # counted by the prefetcher: ready / late), and the plans and the trace told. The one place an open
        # is counted, whatever served it (a RAM hit too: _ram_hit, a moving victim's bytes); _apply_hits
        # inlines it for the hits the compiled loop answered without the GIL
        self.counts.count(outcome, size)
        if self.plans is not None and fid < self._nfiles:  # a chunk's open is its file's, counted once
            self.plans.observe(fid)
        if self.trace is not None:
            self.trace.record(self.ns.path(fid), size, outcome)

    # -- a reused snapshot: each record compared with the source at its file's first open -----------
    def unchecked(self, fid: int) -> bool:
        """Whether file ``fid``'s record came from a reused snapshot and was not compared with the
        source yet (then :meth:`recheck` stats the source before anything of it is served)."""
        return self._unchecked is not None and bool(self._unchecked[fid])

    def _checked(self, fid: int) -> bool:
        """:meth:`recheck` ``fid`` if it is unchecked; False (logged) when the source cannot say."""
        if self._unchecked is None or not self._unchecked[fid]:
            return True
        try:
            self.recheck(fid)
            return True
        except OSError as e:
            log.info("%r: not checked against the source (%s)", self.ns.path(fid), e)
            return False

    def recheck(self, fid: int) -> bool:
        """Compare file ``fid``'s snapshot record with the source (one ``stat``: size, mtime and, where
        the backend has one, its version tag). A changed file gets the source's record (its new size and
        mtime are served from now on) and its cached copies are dropped (a reused disk entry is deleted),
        so it is read again. Done once per file after a snapshot is reused; returns True if it changed.
        The stat runs on the calling thread (the open waits for it); the old entry's unlink is the mover's.

        Raises:
            FileNotFoundError: the file is gone from the source (ENOENT; checked again at the next open).
            OSError: the stat failed (EIO; likewise).
        """
        ns = self.ns
        path = ns.path(fid)
        size, mtime, tag = self.backend.identify(path)
        old_tag = int(ns.etags[fid])
        changed = (size != int(ns.sizes[fid]) or mtime != int(ns.mtimes_ns[fid])
                   or (tag != 0 and old_tag != 0 and tag != old_tag))
        drop = None
        chunk_drops: list = []
        with self.lock:
            if not self._unchecked[fid]:
                return False  # another open of it checked it meanwhile
            if changed:
                self._settle_due()
                old = int(ns.sizes[fid])
                if self.disk_index is not None and fid in self.disk_index and fid not in self._flights:
                    drop = self.table.drop_entry(fid, old)
                if self.chunks is not None and self.chunks.is_chunked(fid):
                    chunk_drops = take_disk_chunks(self, fid)  # reloaded chunk entries of the old version
                    if size != old:
                        self.chunks.retire(fid)  # its chunk layout is the old size's: a whole file now
                ns.revise(fid, size, mtime, tag)
                self.counts.source_changes += 1
            self._unchecked[fid] = False
        if changed:
            log.info("%r changed at the source since the snapshot (now %d bytes, mtime %d ns): its cached "
                     "copies are dropped and it is read again", path, size, mtime)
        if drop is not None or chunk_drops:
            self.mover.submit([], ([drop] if drop is not None else []) + chunk_drops)
        return changed

    # -- disk hits and promotion -------------------------------------------------------------------
    def _current(self, fid: int, gen: int) -> bool:
        # under self.lock: is generation ``gen`` the resident disk entry of ``fid``?
        return fid in self.disk_index and int(self.entries.gen[fid]) == gen

    def open_kept(self, fid: int, gen: int) -> Optional[Handle]:
        """An NVMe hit whose entry the caller already holds open: generation ``gen`` of ``fid``'s disk
        entry (a FUSE passthrough backing id the kernel front end kept, which pins that entry file).

        Counted as one disk hit, exactly as :meth:`open_nowait` counts it, when that generation is still
        the resident entry, under ``--verify-entries first-hit``, has passed its check (its first hit
        verified it: ``verified[fid]``), would not be promoted (the RAM tier would not admit it now) and is neither
        fetching nor moving. The handle opens no entry and has no fd (:meth:`Handle.backing_fd` None):
        the caller serves the open from its own reference (a read through it, not expected, is served by
        ranges from the backend). One critical section; no path hash, no ``open``/``close``.

        Returns None, and nothing is counted, otherwise (evicted, replaced by a newer generation, dropped
        as corrupt, not yet verified, ``every-open``, promotable): the caller then opens the file the
        usual way (:meth:`open_nowait`) and must not use its reference to generation ``gen``.
        """
        with self.lock:
            self._settle_due()
            if (self.verify_entries != "first-hit" or self.disk_index is None or fid not in self.disk_index
                    or fid in self._flights or not self.verified[fid] or int(self.entries.gen[fid]) != gen):
                return None
            size = int(self.ns.size(fid))
            if self._promotable(fid, size):
                return None  # _disk_hit reads and verifies it to promote it
            self.disk_index.hit(fid)
            self._count(fid, size, "disk")
        return Handle(self, fid, size, "disk", gen=gen)

    def _disk_hit(self, fid: int, size: int, gen: int, csum: int) -> Optional[Handle]:
        """Serve a disk-resident file: open its entry, verify its checksum, count the hit, promote it to
        RAM when RAM admits it. None (nothing counted) when the entry was dropped, moved or corrupt. A
        packed entry: :meth:`_packed_hit`."""
        if self.disk.segments is not None and self.disk.packed(size):
            return self._packed_hit(fid, size, gen, csum)
        try:
            fd = self.disk.open_entry(self.ns.path(fid), gen, csum)
        except CorruptEntry as e:
            self._drop_corrupt(fid, gen, csum, size, f"{e} ({self.ns.path(fid)!r})")
            return None
        except OSError as e:
            if e.errno not in ENTRY_GONE_ERRNOS:
                # out of descriptors (EMFILE, ENFILE) or another failure of this open, not of the entry:
                # the open fails with that errno and the entry stays
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    self.fds.out_of_descriptors()
                raise
            self._entry_gone(fid, gen, csum, size, e)
            return None
        with self.lock:  # the RAM tier would admit it now: the bytes we verify are kept to promote it
            keep = self._promotable(fid, size)
        if not keep and self.verify_entries == "first-hit":
            with self.lock:  # this generation passed at an earlier hit (cleared with every new one)
                passed = self._current(fid, gen) and self.verified[fid]
                if passed:
                    self._count(fid, size, "disk")
            if passed:
                return self._entry_handle(fid, size, "disk", fd, gen, csum)
        grant = self.fills.take(size) if keep else 0  # an entry read whole is a fill buffer until promoted
        try:
            data = self.disk.verify(fd, size, csum, keep=keep)
        except CorruptEntry as e:
            self.fills.give(grant)
            os.close(fd)
            self._drop_corrupt(fid, gen, csum, size, f"{e} ({self.ns.path(fid)!r})")
            return None
        except BaseException:
            self.fills.give(grant)
            raise
        demote: List[Victim] = []
        promoted = old = None
        with self.lock:
            self._settle_due()  # (it may promote: a reservation decides on pins)
            if self._current(fid, gen):
                self.verified[fid] = True
            self._count(fid, size, "disk")
            if keep:
                self.counts.entry_loads += 1
            if data is not None and self._current(fid, gen):
                demote, old, promoted = self._promote_locked(fid, size, data)
        self.fills.give(grant)
        if promoted is not None:
            os.close(fd)
            self.mover.submit(demote, [old])  # the old entry's unlink and the victims' writes
            return Handle(self, fid, size, "disk", data=data, pin=promoted)
        return self._entry_handle(fid, size, "disk", fd, gen, csum, data)

    def _entry_handle(self, fid: int, size: int, outcome: Outcome, fd: int, gen: int, csum: int,
                      data: Optional[bytes] = None) -> Handle:
        """A handle serving generation ``gen`` of ``fid``'s disk entry from ``fd`` (already checked as the
        caller's ``--verify-entries`` requires), which the handle then owns. Past the descriptor reserve
        (:class:`~shadefs.procutil.FdReserve`) the open holds no descriptor: its bytes (``data`` when the
        caller read them already) are read now and ``fd`` is closed; they are served from a buffer counted
        against :data:`LOOSE_BUFFERS`, or, with no room there, by ranges from the backend."""
        if self.fds.hold(fd):
            h = Handle(self, fid, size, outcome, fd=fd, gen=gen)
            h._csum = csum   # names the entry file again after close_entry_fd
            return h
        try:
            if data is None and size <= self.loose_budget - self.loose_bytes:  # a hint: _loose_handle decides
                data = _pread_exact(fd, size, 0)
        except OSError:
            data = None  # the entry failed mid-read: served by ranges from the backend
        finally:
            os.close(fd)
        self._fd_log(logging.WARNING, "descriptor reserve reached (soft limit %d, %d kept free for control, the "
                     "tiers and the source): NVMe hits are served without holding their entry's descriptor "
                     "(counted in stats 'descriptors', refused)", self.fds.limit(), self.fds.reserve)
        return self._loose_handle(fid, size, outcome, data)

    def _entry_gone(self, fid: int, gen: int, csum: int, size: int, e: OSError) -> None:
        # a disk hit's entry could not be opened or read (ENTRY_GONE_ERRNOS): dropped as corrupt when it
        # is still the resident generation, else it was evicted or promoted meanwhile (nothing to do)
        with self.lock:
            corrupt = self._current(fid, gen)
        if corrupt:
            self._drop_corrupt(fid, gen, csum, size, f"disk entry for {self.ns.path(fid)!r}: {e.strerror or e}")

    def _packed_hit(self, fid: int, size: int, gen: int, csum: int) -> Optional[Handle]:
        """A disk hit of a packed entry (a record in a segment): one read of its header and bytes together
        (:meth:`SegmentStore.read`), checked (header always, the bytes' xxh3_64 per ``--verify-entries``),
        then counted and served from those bytes: its READs never read the record again; promoted to RAM
        with them when the RAM tier admits it. None (nothing counted) when the record was dropped, moved or
        corrupt (a corrupt one is dropped: the open reads the source)."""
        try:
            data = self.disk.segments.read(gen, csum, size,
                                           self.verify_entries != "first-hit" or not self.verified[fid])
        except CorruptEntry as e:
            self._drop_corrupt(fid, gen, csum, size, f"{e} ({self.ns.path(fid)!r})")
            return None
        except OSError as e:
            if e.errno not in ENTRY_GONE_ERRNOS:
                raise  # another failure of this open, not of the entry: the open fails, the entry stays
            self._entry_gone(fid, gen, csum, size, e)
            return None
        demote: List[Victim] = []
        promoted = old = None
        with self.lock:
            self._settle_due()  # (it may promote, or hold the bytes against the loose budget)
            current = self._current(fid, gen)
            if current:
                self.verified[fid] = True
            self._count(fid, size, "disk")
            if current and self.ram_index.capacity_bytes > 0:
                demote, old, promoted = self._promote_locked(fid, size, data)
            if promoted is None:
                if self.loose_bytes + size <= self.loose_budget:
                    self.loose_bytes += size  # the record's bytes, held by the handle (LOOSE_BUFFERS)
                    return Handle(self, fid, size, "disk", data, None, None, size)
        if promoted is not None:
            self.mover.submit(demote, [old])  # the old entry's unlink and the victims' writes
            return Handle(self, fid, size, "disk", data=data, pin=promoted)
        return Handle(self, fid, size, "disk")  # no loose room: served by ranges from the backend

    def _promote_locked(self, fid: int, size: int, data: bytes):
        # under self.lock, settled (_settle_due), for a verified disk hit of ``fid`` with its bytes in hand:
        # promote it to RAM if the RAM tier takes it (resident(ram); its old entry: deleting). Returns (RAM
        # victims to demote, the old entry to unlink, the pin), ([], None, None) when RAM refuses it
        victims = self.ram_index.reserve(fid, size)
        if victims is None:
            return [], None, None
        demote = self._evict_ram(victims)
        old = self.table.promote(fid, size, data, self.ram)
        self.counts.promotions += 1
        return demote, old, self._pin_ram(fid, size)

    def _promotable(self, fid: int, size: int) -> bool:
        # under self.lock: would a disk hit of ``fid`` be promoted now (the RAM tier's policy admits it and
        # its victims free the room)? Only then is its entry read whole into the daemon; otherwise it is
        # served from the entry (pread or passthrough) and, when checked, checked by pieces
        return self.ram_index.would_admit(fid, size)

    def _drop_corrupt(self, fid: int, gen: int, csum: int, size: int, why: str) -> None:
        # resident(disk) -> absent; the entry (deleting) is unlinked by the mover, never on this thread
        with self.lock:
            if not self._current(fid, gen) or fid in self._flights:
                return  # evicted meanwhile, not corrupt
            dying = self.table.drop_entry(fid, size)
            self.counts.corrupt_entries += 1
            self._stale_pages.add(fid)
            # the file's next open waits for this delete (on a thread that may block: open(), never
            # open_nowait) when its refill needs the entry's bytes back in the budget
            done = self._unlinking[fid] = threading.Event()
        log.warning("dropping corrupt disk entry: %s", why)
        for hook in self.entry_dropped:
            hook(fid, gen)
        self.mover.submit([], [dying], done)

    def _unlinked_hooks(self, fid: int, gen: int) -> None:
        for hook in self.entry_unlinked:
            hook(fid, gen)

    # -- misses: one leader per file, admission decided before the read -----------------------------
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
        plan = self._reserve_disk(fid, size)
        if plan is None:
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
        fl.plan = plan
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

    def _offer_shared(self, fid: int, data: bytes) -> None:
        """A file leaves this node (refused by its tiers, or a victim no lower tier takes): offer it to
        the group, off the request path. The group then holds what the node does not (f + s, not max)."""
        if self.shared is not None and len(data) <= self.shared.max_file:
            self.shared.offer_async(self.shared_key(fid), data, self.importance.get(fid))

    def _fill_disk(self, fid: int, size: int, fl: Fetch, data: Optional[bytes]) -> Optional[bytes]:
        """Fill the reserved disk entry from ``data`` or the backend. Returns the bytes read from the
        backend when they were read whole (to offer to the group), else None."""
        gen, doomed = fl.plan
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

    # -- RAM victims --------------------------------------------------------------------------------
    def _evict_ram(self, victims: List[int]) -> List[Victim]:
        """Under self.lock; ``victims`` are already out of the RAM index (``reserve`` credited all of them
        but the held-open ones it kept dying): each enters ``moving`` (``begin_move``) or ``absent``
        (``evict_ram``). The caller hands the result to :meth:`Mover.submit` before any other I/O.

        A victim's bytes that stay in memory, held open (``reserve`` spilled it: PIN_LOOSE, or kept it:
        PIN_DYING) or moving to the disk tier (the Move holds a ref), are counted until the last ref
        goes. A victim with no handle whose bytes :data:`LOOSE_BUFFERS` has no room for is not demoted
        (counted ``demotions_skipped``; it is only offered to the group, as a victim no disk tier takes)."""
        out = []
        demotes = (self.disk_index is not None and self.disk_index.capacity_bytes > 0) or self.shared is not None
        table = self.table
        residents = self._residents
        for v in victims:
            data = self._ram_data.get(v)
            if residents is not None:
                self._retire(v)  # (done already by reserve's pinned check: a no-op then)
            rec = self._pins.pop(v, None)
            if rec is not None:
                if rec.where == PIN_TIER:
                    rec.where = PIN_DYING  # no loose room: reserve() kept its bytes dying in the tier
                self._held[id(rec)] = rec
            if data is not None and demotes and rec is None and \
                    self.loose_bytes + len(data) > self.loose_budget:
                self.counts.demotions_skipped += 1
                demotes_v = False
            else:
                demotes_v = data is not None and demotes
            if not demotes_v:
                if data is not None:
                    table.evict_ram(v)
                    self.ram.pop(v)
                if data is not None and demotes:
                    out.append((v, data, None))  # offered to the group only
                continue
            if rec is None:
                rec = Pin(0, len(data), PIN_LOOSE, v)
                self.loose_bytes += len(data)
                self._held[id(rec)] = rec
            out.append((v, data, table.begin_move(v, data, rec)))  # the Move's ref: dropped when written
            self.ram.pop(v)
        return out

    # -- reading ahead: warm-up and the plan prefetcher ---------------------------------------------
    def fetchable(self, fid: int) -> bool:
        """Whether a read ahead of ``fid`` would start now: in no tier, not moving, no read of it in flight
        (an open's or a prefetch's); never a chunked file (its chunks are read as its READs reach them).
        Caller holds :attr:`lock`."""
        return (self._absent(fid) and fid not in self._inflight
                and (self.chunks is None or not self.chunks.is_chunked(fid)))

    def prefetch(self, fid: int, hold=None, keep_only: bool = False) -> str:
        """Read ``fid`` ahead of its open without counting an open, through the same single-flight as
        :meth:`open`: the one entry point for reading ahead (``warm``, the plan prefetcher).

        Args:
            hold: None (warm-up): the bytes go into the tiers through their policies, as a miss's do.
                Else ``hold(fid, data, source) -> bool`` (the plan prefetcher's window), called under
                :attr:`lock` once the bytes are read, ``source`` ``"shared"`` (the group held them; asked
                first, within its deadline) or ``"miss"`` (the backend): the tiers are not offered the
                bytes now but at the file's open, so they decide the same with and without prefetching.
                While the read is in flight, an open of ``fid`` waits for it (counted ``late``) and never
                starts another; the bytes ``hold`` keeps are taken by the open (``ready``).
            keep_only: warm-up: a file no tier of this node admits is not read (without it, a mount with a
                shared tier reads it to offer it to the group, as a miss does).

        Returns:
            ``"resident"`` (already cached or moving: nothing read); warm-up: ``"ram"`` / ``"disk"``
            (admitted there) or ``"rejected"`` (the policies did not admit it, or the disk write failed);
            with ``hold``: ``"fetching"`` (a read of it is in flight already: nothing started), ``"held"``
            or ``"dropped"`` (read, and ``hold`` returned True / False).

        Raises:
            FileNotFoundError, OSError: as :meth:`open` (with ``hold``: the in-flight entry is resolved to
                None first, so a waiting open reads the file itself).
        """
        fid = int(fid)
        if self._unchecked is not None and self._unchecked[fid]:
            self.recheck(fid)
        if self.chunks is not None and self.chunks.is_chunked(fid):
            return self._prefetch_chunks(fid, hold, keep_only)
        size = int(self.ns.size(fid))
        if hold is not None:
            return self._read_ahead(fid, size, hold)
        with self.lock:
            if fid in self.ram_index or (self.disk_index is not None and fid in self.disk_index):
                return "resident"
            fl = self._flights.get(fid)
            if type(fl) is Move:
                return "resident"
            leader = fl is None
            if leader:
                fl, demote = self._start_fetch(fid, size, memory=not keep_only)
                if fl is None:
                    return "rejected"
        if leader:
            self._lead(fid, size, fl, demote)
        else:
            fl.done.wait()
            if fl.error is not None:
                raise fl.error
        return fl.tier or "rejected"

    def _prefetch_chunks(self, fid: int, hold, keep_only: bool) -> str:
        """:meth:`prefetch` of a chunked file: warm-up reads each chunk into the tiers (``"ram"`` /
        ``"disk"`` when one was admitted there, RAM first, else ``"rejected"``); a read ahead into a
        plan's window (``hold``) reads nothing (``"resident"``: its chunks are read at its READs)."""
        if hold is not None:
            return "resident"
        first, count = self.chunks.span(fid)
        got = {self.prefetch(first + k, keep_only=keep_only) for k in range(count)}
        return next((t for t in ("ram", "disk", "resident") if t in got), "rejected")

    def _read_ahead(self, fid: int, size: int, hold) -> str:
        """:meth:`prefetch` into ``hold`` (its docstring): registered in the in-flight table, read from the
        group or the backend outside the lock, handed to ``hold`` under it."""
        with self.lock:
            fl = self._flights.get(fid)
            if fid in self.ram_index or (self.disk_index is not None and fid in self.disk_index) or \
                    type(fl) is Move:
                return "resident"
            if fl is not None or fid in self._inflight:
                return "fetching"
            fut = PrefetchFuture()
            self._inflight[fid] = fut
        data, source, err = None, "miss", None
        try:
            shared = self.shared
            if shared is not None and size <= shared.max_file:
                data = shared.get(self.shared_key(fid), size)  # None past its deadline: read the backend
            if data is None:
                data = self._backend_read(fid, size)
            else:
                source = "shared"
        except BaseException as e:
            err = e
        kept = False
        try:
            with self.lock:
                del self._inflight[fid]
                if err is None:
                    if source == "miss":
                        self.counts.backend_bytes += size
                    kept = bool(hold(fid, data, source))
                else:
                    self.counts.backend_errors += not isinstance(err, FileNotFoundError)
        finally:
            fut.set_result(None if err is not None else (data, source))
        if err is not None:
            raise err
        return "held" if kept else "dropped"

    # -- inspection ----------------------------------------------------------------------------------
    def state(self, fid: int) -> str:
        """The file's state (:class:`~shadefs.cache.state.FileState`'s value): ``"absent"``, ``"fetching"``,
        ``"moving"``, ``"ram"`` or ``"disk"``."""
        with self.lock:
            return self.table.state(int(fid)).value

    def audit(self) -> dict:
        """One consistent view of the state machine at one instant (taken under the lock), for tests and
        debugging: the daemon adds it to the stats JSON as ``audit`` when started with ``SHADEFS_AUDIT=1``
        (docs/metrics.md). O(resident files): not for a production scrape.

        Returns (JSON-ready; ids are file ids, sizes bytes):
            ``ram`` / ``disk``: resident ids, sorted; ``both``: ids resident in both (must be empty);
            ``flag_errors``: ids whose residency flags disagree with the indexes (must be empty);
            ``fetching`` / ``moving``: ids in those states; ``moving_bytes``: the bytes moving flights hold;
            ``budget``: per tier ``capacity``, ``used``, ``reserved``, ``dying``, ``pending`` (ids);
            ``held``: RAM victims whose bytes are still in memory (held open or moving): ``dying`` (bytes
            counted in the RAM tier's dying bytes, which they are all of), ``loose`` (bytes counted in
            ``loose``), ``uncounted`` (ids of moving files whose bytes are counted nowhere: must be empty);
            ``loose``: ``bytes`` (all bytes held outside the tiers: held victims and handles' buffers) and
            ``budget`` (:data:`LOOSE_BUFFERS`); ``entries``: ``{id: entry file path}`` of every
            disk-resident id; ``counters``: the open/miss/backend counters of :meth:`counters` at the same
            instant.
        """
        with self.lock:
            self._settle()
            ram = sorted(self.ram_index.sizes)
            disk = sorted(self.disk_index.sizes) if self.disk_index is not None else []
            fetching = sorted(f for f, fl in self._flights.items() if type(fl) is Fetch)
            moving = sorted(f for f, fl in self._flights.items() if type(fl) is Move)
            moving_bytes = sum(len(fl.data) for fl in self._flights.values() if type(fl) is Move)
            held = {"dying": sum(r.size for r in self._held.values() if r.where == PIN_DYING),
                    "loose": sum(r.size for r in self._held.values() if r.where == PIN_LOOSE),
                    "uncounted": sorted(f for f, fl in self._flights.items() if type(fl) is Move and (
                        self._held.get(id(fl.pin)) is not fl.pin or fl.pin.refs < 1))}
            loose = {"bytes": self.loose_bytes, "budget": self.loose_budget}
            budget = {}
            for ix in (self.ram_index, self.disk_index):
                if ix is not None:
                    budget[ix.name] = {"capacity": ix.capacity_bytes, "used": ix.used_bytes,
                                       "reserved": ix.reserved_bytes, "dying": ix.dying_bytes,
                                       "pending": sorted(ix.pending)}
            gens = [(f, int(self.entries.gen[f]), int(self.entries.csum[f])) for f in disk]
            flags = self.resident_flags.copy()
            counters = {k: getattr(self.counts, k) for k in (
                "opens", "hits_ram", "hits_disk", "hits_shared", "misses", "joined", "streamed",
                "backend_reads", "range_reads", "backend_errors", "corrupt_entries", "disk_write_errors",
                "disk_writes_refused", "promotions", "entry_loads", "demotions", "demotions_skipped",
                "loose_refused", "source_changes", "source_opens")}
        want = np.zeros(len(flags), dtype=np.uint8)
        want[np.asarray(ram, dtype=np.int64)] |= RAM_BIT
        want[np.asarray(disk, dtype=np.int64)] |= DISK_BIT
        return {
            "ram": ram, "disk": disk, "both": sorted(set(ram) & set(disk)),
            "flag_errors": np.flatnonzero(flags != want).tolist(),
            "fetching": fetching, "moving": moving, "moving_bytes": moving_bytes, "budget": budget,
            "held": held, "loose": loose,
            "entries": {str(f): self.disk.entry_file(self.ns.path(f), g, c) for f, g, c in gens},
            "counters": counters,
        }

    def disk_entry_path(self, fid: int) -> Optional[str]:
        """The path of ``fid``'s resident disk entry, or None when it is not disk-resident."""
        with self.lock:
            if self.disk_index is None or fid not in self.disk_index:
                return None
            gen, csum = int(self.entries.gen[fid]), int(self.entries.csum[fid])
        return self.disk.entry_file(self.ns.path(fid), gen, csum)

    # -- control-plane queries -------------------------------------------------------------------
    def resident(self, fids: np.ndarray) -> np.ndarray:
        """Residency flags (shape like ``fids``, bool) in any tier, the group's shared tier included (one
        pipelined query for the files not resident on this node; False where it fails). An id out of
        range is not resident.

        This node's tiers: reads the maintained residency array without the cache lock (a file moving
        between tiers at this instant may read as either); O(len(fids)) in numpy.
        """
        fids = np.asarray(fids, dtype=np.int64)
        flags = self.resident_flags
        if fids.size and (fids.min() < 0 or fids.max() >= len(flags)):
            ok = (fids >= 0) & (fids < len(flags))
            out = np.zeros(fids.shape, dtype=bool)
            out[ok] = flags[fids[ok]] != 0
        else:
            ok = None
            out = flags[fids] != 0
        if self.shared is not None and out.ndim == 1 and not out.all():
            rest = np.flatnonzero(~out if ok is None else (~out & ok))
            rest = rest[[int(self.ns.size(int(fids[i]))) <= self.shared.max_file for i in rest]]
            if rest.size:
                got = self.shared.contains_many([self.shared_key(int(fids[i])) for i in rest])
                out[rest] = got
        return out

    def update_importance(self, fids: np.ndarray, values: np.ndarray) -> None:
        """Set importance of ``fids`` (int64, shape (n,)) to ``values`` (float32, shape (n,)); policies re-rank.
        The shared tier's ranks of those files follow in the background (under ``shade``).

        Once :meth:`start_background` ran, policies only queue the ids and a background thread applies
        them in slices of ``apply_slice`` ids per lock acquisition; before, they re-rank in this call,
        under the lock.

        Raises:
            ValueError: as :meth:`shadefs.policies.base.Importance.update` (nothing changes).
        """
        if self._bg_thread is not None:
            self.importance.update(fids, values)
        else:
            with self.lock:
                self.importance.update(fids, values)
        if self.shared is not None and self.shared.mode == "imp":
            fids = np.asarray(fids).tolist()
            self.shared.rescore_async([self.shared_key(f) for f in fids],
                                      self.importance.values[fids].tolist())

    def _absent(self, fid: int) -> bool:
        # under self.lock
        return fid not in self.ram_index and fid not in self._flights and (
            self.disk_index is None or fid not in self.disk_index)

    def warm_shared(self, fids) -> int:
        """Read the files of ``fids`` the group holds in one pipelined batch and admit them to this node's
        tiers through the state machine (``warm``); not counted as opens. Returns how many came from the
        shared tier and were admitted."""
        if self.shared is None:
            return 0
        with self.lock:
            todo = [int(f) for f in fids if self._absent(int(f))]
        todo = [f for f in todo if self._checked(f) and int(self.ns.size(f)) <= self.shared.max_file
                and (self.chunks is None or not self.chunks.is_chunked(f))]
        n = 0
        for i in range(0, len(todo), 64):
            batch = todo[i:i + 64]
            got = self.shared.get_many([self.shared_key(f) for f in batch], [int(self.ns.size(f)) for f in batch])
            for f, data in zip(batch, got):
                if data is None:
                    continue
                with self.lock:
                    if not self._absent(f):
                        continue
                    fl, demote = self._start_fetch(f, len(data), source=SOURCE_SHARED)
                if fl is None:
                    continue
                self._lead(f, len(data), fl, demote, data=data)
                n += fl.tier is not None
        return n

    # -- background work -------------------------------------------------------------------------
    def start_background(self) -> None:
        """Start the threads that keep work off the read path (after the FUSE fork, from the daemon's
        ``on_mounted``): policy bookkeeping in bounded slices, the trace writer, and the mover (RAM
        victims' disk writes and dying entries' deletes: :class:`~shadefs.cache.movers.Mover`). Idempotent."""
        if self._bg_thread is not None:
            return
        for index in (self.ram_index, self.disk_index):
            if index is not None and index.capacity_bytes > 0 and index.policy.defer(self._bg_wake.set):
                self._bg_policies.append(index.policy)
        if self.trace is not None and hasattr(self.trace, "start"):
            self.trace.start()
        if self.disk is not None and self.disk.segments is not None:
            self.disk.segments.start()  # compaction, off the reader threads
        self._bg_thread = threading.Thread(target=self._background, name="shadefs-rerank", daemon=True)
        self._bg_thread.start()
        self.mover.start()

    def _background(self) -> None:
        while not self._bg_stop.is_set():
            self._bg_wake.wait(self.apply_period)
            self._bg_wake.clear()
            for policy in self._bg_policies:
                more = True
                while more and not self._bg_stop.is_set():
                    with self.lock:
                        more = policy.apply_pending(self.apply_slice)
                    if more:
                        time.sleep(0)  # let a waiting open take the lock between slices

    def close(self) -> None:
        """Stop the background threads, the mover once it has done the moves queued (up to 10 s; the
        trace is closed by its owner). Later moves are done inline. Idempotent."""
        if self.chunks is not None:
            self.chunks.close()  # the chunks opened ahead of readers
        self._bg_stop.set()
        self._bg_wake.set()
        self.mover.close(10)
        t = self._bg_thread
        if t is not None and t is not threading.current_thread():
            t.join(10)

    def counters(self) -> dict:
        """Every counter and tier figure at one instant (what :mod:`shadefs.metrics` exports)."""
        with self.lock:
            self._settle()
            tiers = {"ram": self.ram_index.snapshot()}
            if self.disk_index is not None:
                tiers["disk"] = self.disk_index.snapshot()
            if self.shared is not None:
                tiers["shared"] = self.shared.stats()
            return {
                "opens": self.opens, "hits_ram": self.hits_ram, "hits_disk": self.hits_disk,
                "hits_shared": self.hits_shared,
                "shared": self.shared.counters() if self.shared is not None else None,
                "misses": self.misses, "joined": self.joined, "streamed": self.streamed,
                "backend_reads": self.backend_reads, "open_bytes": self.open_bytes,
                "hit_bytes": self.hit_bytes,
                "backend_bytes": self.backend_bytes, "backend_errors": self.backend_errors,
                "corrupt_entries": self.corrupt_entries, "disk_write_errors": self.disk_write_errors,
                "disk_writes_refused": self.disk_writes_refused, "promotions": self.promotions,
                "demotions": self.demotions, "demotions_skipped": self.demotions_skipped,
                "loose_refused": self.loose_refused, "source_changes": self.source_changes,
                "entry_loads": self.entry_loads, "source_opens": self.source_opens,
                "loose_bytes": self.loose_bytes, "tiers": tiers, "prefetch": self._prefetch_stats(),
            }

    def _prefetch_stats(self) -> dict:
        # caller holds self.lock
        out = {"ready": 0, "late": 0, "late_wait_s": 0.0, "fetched_bytes": 0, "wasted_bytes": 0,
               "plans_active": 0, "plans_retired": 0}
        if self.prefetcher is not None:
            out.update(self.prefetcher.counters())
        if self.plans is not None:
            out.update(self.plans.counters())
        return out

    def stats(self) -> dict:
        """The stats JSON of docs/metrics.md (exact keys)."""
        with self.lock:
            self._settle()
            hits = self.hits_ram + self.hits_disk + self.hits_shared
            disk = (self.disk_index.snapshot() if self.disk_index is not None
                    else {"used_bytes": 0, "capacity_bytes": 0, "files": 0, "evictions": 0})
            out = {
                "policy": self.ram_index.policy.name,
                "uptime_s": round(time.monotonic() - self.started, 3),
                "opens": self.opens,
                "hits": {"ram": self.hits_ram, "disk": self.hits_disk},
                "misses": self.misses,
                "hit_ratio": hits / self.opens if self.opens else 0.0,
                "byte_hit_ratio": self.hit_bytes / self.open_bytes if self.open_bytes else 0.0,
                "backend_bytes": self.backend_bytes,
                "corrupt_entries": self.corrupt_entries,
                "tiers": {"ram": self.ram_index.snapshot(), "disk": disk},
                "prefetch": self._prefetch_stats(),
            }
            if self.shared is not None:  # only with --shared-tier: the keys of a plain mount stay as they are
                out["hits"]["shared"] = self.hits_shared
                out["tiers"]["shared"] = self.shared.stats()
                sc = self.shared.counters()
                out["shared_errors"] = sc["errors"]
                out["shared_deadlines"] = sc["deadlines"]
            return out


    def memory(self) -> dict:
        """The cache's part of the stats JSON's ``memory`` object (docs/metrics.md): each bounded part of
        the working set as ``{"bound_bytes", "used_bytes"}`` (bytes): ``ram_tier`` (its budget; in-flight
        fills and held-open victims included), ``fill_buffers`` (backend reads in flight; with
        ``high_water_bytes``, ``waits``, ``refused``, ``oversize``: :class:`~shadefs.cache.buffers.FillBuffers`),
        ``loose_buffers`` (bytes held outside the tiers), ``prefetch_window``."""
        with self.lock:
            self._settle()
            ram = self.ram_index.snapshot()
            out = {"ram_tier": {"bound_bytes": int(ram["capacity_bytes"]), "used_bytes": int(ram["used_bytes"])},
                   "loose_buffers": {"bound_bytes": int(self.loose_budget), "used_bytes": int(self.loose_bytes)}}
            pf = self.prefetcher
            out["prefetch_window"] = ({"bound_bytes": int(pf.window_bytes), "used_bytes": int(pf.reserved_bytes)}
                                      if pf is not None else {"bound_bytes": 0, "used_bytes": 0})
        out["fill_buffers"] = self.fills.snapshot()
        return out
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


def _counter(name: str) -> property:
    def get(self):
        return getattr(self.counts, name)

    def put(self, value):
        setattr(self.counts, name, value)
    return property(get, put, doc=f"``counts.{name}`` (:class:`~shadefs.cache.counters.OpenCounters`).")


for _name in COUNTER_NAMES:
    setattr(TieredCache, _name, _counter(_name))
del _name
