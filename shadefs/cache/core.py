"""The read path: RAM tier, then NVMe tier, then the backend, as one per-file state machine.

:meth:`TieredCache.open` is called once per file open (a sample access) and returns a :class:`Handle`
that serves the file's exact bytes and says where they came from (``"ram"``, ``"disk"`` or ``"miss"``).
That is also where counting happens: hit = an open served without touching the backend; hit ratio =
hits / opens; every open counts exactly one outcome.

Each file is in exactly one state (docs/architecture.md, "The per-file state machine"):

- ``absent``: in no tier, nothing in flight;
- ``fetching``: one leader reads it from the backend into the tier that admitted it *before* the read
  (RAM: into memory; disk: into a temporary file, then renamed); every other open of it waits for that
  one read (single-flight), and it leaves this state only once admission is complete;
- ``resident(ram)`` / ``resident(disk)``: in exactly one tier's index (and store);
- ``moving``: a RAM victim on its way to the disk tier; its bytes are still served from memory;
- a file dropped from the disk tier (victim, promotion, corrupt entry) leaves its old entry file
  ``deleting``: the bytes stay counted in the tier's budget until the file is unlinked, and the file
  name carries a generation number, so that delete can never remove a newer entry of the same file.

Every transition happens under ``self.lock`` (microseconds: dict and index updates only); all I/O
(backend reads, disk reads, writes, unlinks) happens outside it. Tiers are exclusive: a file is
resident in at most one at every instant. A miss is offered to RAM first, then to the disk tier; a file
no tier admits is read whole with one GET into a transient buffer when it is at most :data:`FILL_CHUNK`
bytes and :data:`LOOSE_BUFFERS` has room for it, else streamed to the reader by ranges of whole
:data:`FILL_CHUNK` chunks (one chunk held per open), never one request per kernel READ. RAM's victims are
demoted to the disk tier when the disk policy admits them; a disk hit is promoted to RAM when RAM admits
it (and leaves the disk tier). Victims' disk writes and a promoted file's old entry's unlink are handed,
the moment they are decided (before the evicting miss's backend read), to one mover thread
(:meth:`TieredCache.start_background`; inline before it): no open waits for a victim's disk write.

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
import queue
import threading
import time
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from ..backends.base import Backend
from ..logutil import RateLimitedLog
from ..namespace import Namespace
from ..policies.base import Importance
from .index import TierIndex
from .tiers import CorruptEntry, DiskFloorReached, DiskTier, MemoryTier

__all__ = ["TieredCache", "Handle", "OpenTicket", "Outcome", "PrefetchFuture"]

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
# the errnos of opening a disk entry that mean the entry itself is gone or damaged (dropped as corrupt);
# any other (EMFILE, ENFILE: the daemon is out of descriptors) fails that open and keeps the entry
ENTRY_GONE_ERRNOS = frozenset({errno.ENOENT, errno.EIO})
# moves queued for the mover thread (demotions, entry deletes); a demotion beyond it is skipped (the victim
# is dropped, as when LOOSE_BUFFERS has no room), a delete beyond it is done by the thread that queued it
MOVE_QUEUE = 1024
# where the bytes of a RAM buffer record ([refs, bytes, where, fid]) are counted
PIN_TIER, PIN_DYING, PIN_LOOSE = 0, 1, 2  # resident (the tier's own), the RAM index's dying bytes, loose


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

    The bytes come from exactly one source: the RAM tier's own ``bytes`` object (no copy; pinned, so
    that if the file is evicted while the handle is open its bytes are counted against
    :data:`LOOSE_BUFFERS`, or, when that has no room, stay counted in the RAM tier's budget, until the
    last handle on them is released), an fd of the file's verified disk entry (``pread``), a buffer
    counted against :data:`LOOSE_BUFFERS`, or the backend by ranges (a file no tier holds).

    :meth:`release` takes no lock: it queues its pin (``TieredCache._orphans``) and the cache's next
    critical section applies it, as it does for a handle dropped without release.
    """

    __slots__ = ("fid", "size", "outcome", "_cache", "_data", "_fd", "_released", "_pin", "_loose", "gen",
                 "keep_pages", "_chunk")

    def __init__(self, cache: "TieredCache", fid: int, size: int, outcome: Outcome,
                 data: Optional[bytes] = None, fd: Optional[int] = None, pin: Optional[list] = None,
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
        self._pin = pin      # [refs, bytes, where (PIN_*), fid] of the RAM tier buffer this handle holds
        self._loose = loose  # bytes of a buffer counted against LOOSE_BUFFERS
        self._chunk = None   # served by ranges: (offset, bytes, lock) of the last whole chunk read (loose)

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


class _Flight:
    """A file in state ``fetching`` (kind ``"fetch"``) or ``moving`` (kind ``"demote"``)."""

    __slots__ = ("kind", "data", "error", "tier", "source", "gen", "csum", "plan", "done", "pin", "loose")

    def __init__(self, kind: str, data: Optional[bytes] = None):
        self.kind = kind
        self.data = data               # moving: the bytes; fetching: set only when no tier kept them
        self.error: Optional[BaseException] = None
        self.tier: Optional[str] = None  # where the file ended: "ram", "disk" or None
        self.source = "miss"           # where the bytes came from: "miss" (the backend) or "shared"
        self.gen = 0
        self.csum = 0
        self.plan = None               # fetching into the disk tier: (generation, victims to delete)
        self.pin = None                # moving: the bytes' record (the flight holds one ref; counted)
        self.loose = 0                 # fetching into no tier: loose bytes reserved for the first handle
        self.done = threading.Event()


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
    """

    def __init__(self, namespace: Namespace, backend: Backend, ram: Tuple[TierIndex, MemoryTier],
                 disk: Optional[Tuple[TierIndex, DiskTier]], importance: Importance,
                 trace=None, on_backend_read=None, shared=None):
        self.ns = namespace
        self.shared = shared
        self.backend = backend
        self._etags_are_versions = getattr(backend, "etags_are_versions", True)  # shared-tier keys
        self.ram_index, self.ram = ram
        self.disk_index, self.disk = disk if disk is not None else (None, None)
        self.entries = self.disk.table(namespace.num_files) if self.disk is not None else None
        # entry checksums (docs/architecture.md, "Entry checksums"): "every-open" (the default) verifies an
        # entry on every disk hit; "first-hit" verifies each entry generation at its first hit after it was
        # written or reloaded, then trusts it while it stays resident. verified[fid]: the resident generation
        # passed (kept in both modes; read only by first-hit).
        self.verify_entries = "every-open"
        self.verified = np.zeros(namespace.num_files if self.disk is not None else 0, dtype=np.bool_)
        self.importance = importance
        self.trace = trace
        self.on_backend_read = on_backend_read
        self.lock = threading.Lock()
        self._flights: Dict[int, _Flight] = {}   # files fetching or moving
        # RAM tier buffers that open handles hold: fid -> [refs, bytes, PIN_TIER, fid]. Evicted while held
        # (or moving to the disk tier: the flight holds a ref), a record leaves the tier at once and its
        # bytes are counted against loose_budget (PIN_LOOSE), or, with no room there, stay in the RAM
        # index's dying bytes (PIN_DYING), until its last ref goes; self._held has those records
        self._pins: Dict[int, list] = {}
        self._held: Dict[int, list] = {}         # id(record) -> record, for records out of the tier
        self.ram_index.pinned = self._pins
        self._ram_data = self.ram._data          # the RAM store's dict: the hit path reads it directly
        self.ram_index.spill_room = self._loose_room
        self.ram_index.spill = self._spill
        self.loose_bytes = 0                     # bytes held outside the tiers (<= loose_budget)
        # (pin, loose bytes) handed back by released or dropped handles, applied by the next critical
        # section (deque.append: no lock on release)
        self._orphans: collections.deque = collections.deque()
        self.loose_budget = LOOSE_BUFFERS
        self.demotions_skipped = 0               # RAM victims not demoted: no loose room for their bytes
        self.loose_refused = 0                   # opens with bytes in hand served by ranges: no loose room
        # called with a file id right after one of its disk entries is unlinked, before its bytes leave the
        # budget (outside the lock): a front end that pins entry files (passthrough backing ids) lets go
        self.entry_unlinked: List = []
        self.started = time.monotonic()
        # counters (read under self.lock for a consistent snapshot)
        self.opens = 0
        self.hits_ram = 0
        self.hits_disk = 0
        self.hits_shared = 0
        self.misses = 0
        self.joined = 0                # misses that waited for another open's backend read
        self.streamed = 0              # misses no tier admitted: served by ranges
        self.backend_reads = 0         # whole-file backend reads (fills)
        self.range_reads = 0           # backend reads of one range (streamed files; reported in audit())
        self.open_bytes = 0
        self.hit_bytes = 0
        self.backend_bytes = 0
        self.backend_errors = 0
        self.corrupt_entries = 0
        # files whose disk entry was dropped as corrupt since their last open: the kernel may hold pages
        # read from it, so their next open of the untiered kind does not keep pages (Handle.keep_pages)
        self._stale_pages: set = set()
        self.disk_write_errors = 0
        self.disk_writes_refused = 0   # refused by --disk-min-free (not an error)
        self.promotions = 0
        self.demotions = 0
        self.source_changes = 0        # files a reused snapshot described before they changed (recheck)
        # the namespace's not-yet-compared records (a reused snapshot), or None: see recheck()
        self._unchecked = getattr(namespace, "unchecked", None)
        self._write_error_log = RateLimitedLog(log, 10.0)
        # residency of every file id, one bit per tier, maintained by the tier indexes on commit/remove:
        # resident() and the checkpoint read it instead of walking the indexes under the lock
        self.resident_flags = np.zeros(namespace.num_files, dtype=np.uint8)
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
        # the mover (start_background): demotions and entry deletes of the read path, off the thread that
        # evicted or promoted (a FUSE reader never writes or unlinks for another file); None: done inline
        self._moves: Optional[queue.Queue] = None
        self._mover_lock = threading.Lock()      # orders queueing against close()
        self._mover_thread: Optional[threading.Thread] = None
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
        self._read_whole_once = np.zeros(namespace.num_files, dtype=bool)

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
        # one lookup path: a hit is served by open_nowait, anything else by its ticket
        h = self.open_nowait(fid, ticket=True)
        return self.open_ticket(h) if type(h) is OpenTicket else h

    def _plan_open(self, fid: int, size: int) -> tuple:
        """Under self.lock, for an open that is no memory hit: what it waits on (``fl``: a flight, a
        prefetch ``(kind, x)`` or None), the disk entry it hits (``disk_gen``), whether it leads a new
        fetch (``leader``, with the RAM victims to demote). A leading plan must be finished."""
        fl = self._flights.get(fid)
        disk_gen = None
        leader = False
        demote: list = []
        if fl is not None:                           # fetching: wait for that one read
            pass                                     # (moving: for the disk write, then again)
        elif self.disk_index is not None and fid in self.disk_index:
            self.disk_index.hit(fid)
            disk_gen = (int(self.entries.gen[fid]), int(self.entries.csum[fid]))
        else:                                        # absent: a prefetch has it, or this open leads
            pf = self._prefetched(fid, size)
            if pf is None:
                if self.prefetcher is not None and self.prefetcher.kernel_holds(fid):
                    return None, None, False, demote  # the kernel keeps its pages: no tier fill, no read now
                fl, demote = self._start_fetch(fid, size, transient=True)
                leader = True
            else:
                fl = pf
        return fl, disk_gen, leader, demote

    def _finish_open(self, fid: int, size: int, fl, disk_gen, leader: bool, demote) -> Optional[Handle]:
        """Outside the lock: serve the open :meth:`_plan_open` planned (may block on the backend or on
        another open's read); None when the file moved meanwhile (nothing counted: plan again)."""
        if isinstance(fl, _Flight) and fl.kind == "demote":
            fl.done.wait()  # moving (a plan made before it was; _memory_hit serves a moving file): look again
            return None
        if isinstance(fl, tuple):                        # from the plan prefetcher
            kind, x = fl
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
                    self._count(fid, size, fl.source)
        else:
            t0 = time.monotonic()
            fl.done.wait()
            outcome = fl.source
            with self.lock:
                if outcome in ("prefetch", "late"):
                    # it joined the admission of bytes another open took from the prefetch window: it waited
                    # for a prefetch (not a miss: it shared no open's backend read), counted late
                    outcome = "late"
                    self.prefetcher.count_late(time.monotonic() - t0)
                else:
                    self.joined += 1
                self._count(fid, size, outcome)
            if fl.error is not None:
                raise fl.error
            return self._miss_handle(fid, size, fl, outcome)
        return self._miss_handle(fid, size, fl)

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
        """Admit bytes already in hand (a prefetch; ``source`` ``"miss"`` or ``"shared"``, where they came
        from) through the state machine; a Handle counted ``outcome``. Bytes from the backend that no tier
        of this node keeps are offered to the group, as a miss's are."""
        with self.lock:
            fl = None
            absent = self._absent(fid)
            if absent:
                fl, demote = self._start_fetch(fid, size, transient=True)
        if fl is not None:
            self._lead(fid, size, fl, demote, data=data, source=outcome)
        if source == "miss" and absent and (fl is None or fl.tier is None):
            self._offer_shared(fid, data)
        if fl is None:
            return self._loose_handle(fid, size, outcome, data)
        return self._miss_handle(fid, size, fl)

    def _stream_open(self, fid: int, size: int) -> Handle:
        """An open of a file no tier admits: streamed from the backend by ranges; the kernel keeps its
        pages between opens (``keep_pages``), so a re-read reaches neither the daemon nor the backend."""
        with self.lock:
            self._count(fid, size, "miss")
            self.streamed += 1
            keep = not self._stale_pages or self._pages_trusted(fid)
        return Handle(self, fid, size, "miss", keep_pages=keep)

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
            if self._orphans:
                self._settle()
            data = self._ram_data.get(fid)
            if data is not None:
                return self._ram_hit(fid, data)
        if self._unchecked is not None and self._unchecked[fid]:
            return None  # its record must be compared with the source first (a stat: open() does it)
        size = int(self.ns.size(fid))
        while True:
            with self.lock:
                if self._orphans:
                    self._settle()
                h = self._memory_hit(fid, size)
                if h is not None:
                    return h
                if fid in self._flights or self.disk_index is None or fid not in self.disk_index:
                    return OpenTicket(fid, size, self._plan_open(fid, size)) if ticket else None
                self.disk_index.hit(fid)
                gen, csum = int(self.entries.gen[fid]), int(self.entries.csum[fid])
            h = self._disk_hit(fid, size, gen, csum)
            if h is not None:
                return h

    def open_ticket(self, t: "OpenTicket") -> Handle:
        """Serve an open :meth:`open_nowait` returned a ticket for (counts one outcome; may block on the
        backend, as :meth:`open`). Raises as :meth:`open`."""
        plan, t.plan = t.plan, None
        if plan is None:
            raise ValueError(f"ticket for file {t.fid} already used")
        h = self._finish_open(t.fid, t.size, *plan)
        return h if h is not None else self.open(t.fid)

    def _ram_hit(self, fid: int, data: bytes) -> Handle:
        """Under self.lock: count a hit of resident(ram) ``fid`` (its bytes ``data``, the RAM store's
        own) and return its pinned Handle. The hot path (docs/performance.md, "Lock hold"): residency and
        bytes come from one lookup (the RAM store holds exactly the RAM index's files, both changed in
        the same critical sections), the size is ``len(data)``, :meth:`_count` and :meth:`_pin_ram` are
        inlined."""
        self.ram_index.policy.on_hit(fid)
        size = len(data)
        self.opens += 1
        self.open_bytes += size
        self.hits_ram += 1
        self.hit_bytes += size
        if self.plans is not None:
            self.plans.observe(fid)
        if self.trace is not None:
            self.trace.record(self.ns.path(fid), size, "ram")
        rec = self._pins.get(fid)
        if rec is None:
            rec = self._pins[fid] = [1, size, PIN_TIER, fid]
        else:
            rec[0] += 1
        return Handle(self, fid, size, "ram", data, None, rec)

    def _memory_hit(self, fid: int, size: int) -> Optional[Handle]:
        # under self.lock: resident(ram), or moving (its bytes are still in memory)
        data = self._ram_data.get(fid)
        if data is not None:
            return self._ram_hit(fid, data)
        fl = self._flights.get(fid)
        if fl is not None and fl.kind == "demote":
            # moving: served from its bytes in memory (the flight's record counts them while any ref holds
            # them), never waiting for the disk write
            self._count(fid, size, "ram")
            fl.pin[0] += 1
            return Handle(self, fid, size, "ram", data=fl.data, pin=fl.pin)
        return None

    def _pin_ram(self, fid: int, size: int) -> list:
        # under self.lock: one more open handle on resident(ram) ``fid``'s buffer
        rec = self._pins.get(fid)
        if rec is None:
            rec = self._pins[fid] = [0, size, PIN_TIER, fid]
        rec[0] += 1
        return rec

    def _settle(self) -> None:
        """Under self.lock: apply the pins handed back by released (or dropped) handles. Every critical
        section that reads or decides on pins or loose bytes (opens, reservations, stats, audit) calls it
        first, so they see exact figures."""
        orphans, pins = self._orphans, self._pins
        while orphans:
            rec, loose = orphans.popleft()
            if loose or rec is None or rec[2] != PIN_TIER or rec[0] != 1:
                self._unpin_locked(rec, loose)
            else:                                  # the common case, inlined: a RAM hit's last handle
                rec[0] = 0
                if pins.get(rec[3]) is rec:
                    del pins[rec[3]]

    def _unpin_locked(self, rec: Optional[list], loose: int) -> None:
        # under self.lock: one ref on buffer record ``rec`` and/or ``loose`` loose bytes go
        if loose:
            self.loose_bytes -= loose
        if rec is None:
            return
        rec[0] -= 1
        if rec[0] == 0:
            where = rec[2]
            if where == PIN_TIER:
                if self._pins.get(rec[3]) is rec:
                    del self._pins[rec[3]]
                return
            del self._held[id(rec)]
            if where == PIN_LOOSE:
                self.loose_bytes -= rec[1]       # evicted while held or moving: its bytes are free now
            else:
                self.ram_index.unlinked(rec[1])

    def _loose_room(self) -> int:
        # under self.lock (TierIndex.spill_room): bytes a held RAM victim may take outside the tier
        return self.loose_budget - self.loose_bytes

    def _spill(self, fid: int, size: int) -> None:
        # under self.lock (TierIndex.spill): RAM victim ``fid``, held open, leaves the tier; its bytes
        # are counted against loose_budget until its last ref goes
        rec = self._pins[fid]
        rec[2] = PIN_LOOSE
        self.loose_bytes += size

    def _loose_handle(self, fid: int, size: int, outcome: Outcome, data: Optional[bytes],
                      keep_pages: Optional[bool] = None) -> Handle:
        """A handle on bytes no tier holds: kept while :data:`LOOSE_BUFFERS` allows, else dropped and
        served by ranges from the backend."""
        with self.lock:
            if self._orphans:
                self._settle()
            if data is not None:
                if self.loose_bytes + size <= self.loose_budget:
                    self.loose_bytes += size
                    return Handle(self, fid, size, outcome, data=data, loose=size, keep_pages=keep_pages)
                self.loose_refused += 1
        return Handle(self, fid, size, outcome, keep_pages=keep_pages)

    def _count(self, fid: int, size: int, outcome: Outcome) -> None:
        # called with self.lock held
        self.opens += 1
        self.open_bytes += size
        if outcome == "ram":
            self.hits_ram += 1
            self.hit_bytes += size
        elif outcome == "disk":
            self.hits_disk += 1
            self.hit_bytes += size
        elif outcome == "shared":
            self.hits_shared += 1
            self.hit_bytes += size
        elif outcome == "miss":
            self.misses += 1
        # "prefetch" / "late" are counted by the prefetcher (ready / late)
        if self.plans is not None:
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
        with self.lock:
            if not self._unchecked[fid]:
                return False  # another open of it checked it meanwhile
            if changed:
                if self._orphans:
                    self._settle()
                old = int(ns.sizes[fid])
                if self.disk_index is not None and fid in self.disk_index and fid not in self._flights:
                    drop = (int(self.entries.gen[fid]), int(self.entries.csum[fid]), old)
                    self.disk_index.remove(fid, dying=True)
                ns.revise(fid, size, mtime, tag)
                self.source_changes += 1
            self._unchecked[fid] = False
        if changed:
            log.info("%r changed at the source since the snapshot (now %d bytes, mtime %d ns): its cached "
                     "copies are dropped and it is read again", path, size, mtime)
        if drop is not None:
            self._unlink(fid, *drop)
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
        verified it: ``verified[fid]``), cannot be promoted (larger than the RAM tier) and is neither
        fetching nor moving. The handle opens no entry and has no fd (:meth:`Handle.backing_fd` None):
        the caller serves the open from its own reference (a read through it, not expected, is served by
        ranges from the backend). One critical section; no path hash, no ``open``/``close``.

        Returns None, and nothing is counted, otherwise (evicted, replaced by a newer generation, dropped
        as corrupt, not yet verified, ``every-open``, promotable): the caller then opens the file the
        usual way (:meth:`open_nowait`) and must not use its reference to generation ``gen``.
        """
        with self.lock:
            if self._orphans:
                self._settle()
            if (self.verify_entries != "first-hit" or self.disk_index is None or fid not in self.disk_index
                    or fid in self._flights or not self.verified[fid] or int(self.entries.gen[fid]) != gen):
                return None
            size = int(self.ns.size(fid))
            if size <= self.ram_index.capacity_bytes:
                return None  # _disk_hit reads and verifies it to promote it
            self.disk_index.hit(fid)
            self._count(fid, size, "disk")
        return Handle(self, fid, size, "disk", gen=gen)

    def _disk_hit(self, fid: int, size: int, gen: int, csum: int) -> Optional[Handle]:
        """Serve a disk-resident file: open its entry, verify its checksum, count the hit, promote it to
        RAM when RAM admits it. None (nothing counted) when the entry was dropped, moved or corrupt."""
        fd = None
        packed = self.disk.segments is not None and self.disk.packed(size)
        try:
            if packed:  # a record in a segment: one pread, served from the bytes read
                data = self.disk.read_packed(gen, csum, size, verify=self.verify_entries != "first-hit"
                                             or not self.verified[fid])
            else:
                fd = self.disk.open_entry(self.ns.path(fid), gen, csum)
        except CorruptEntry as e:
            self._drop_corrupt(fid, gen, csum, size, f"{e} ({self.ns.path(fid)!r})")
            return None
        except OSError as e:
            if e.errno not in ENTRY_GONE_ERRNOS:
                # out of descriptors (EMFILE, ENFILE) or another failure of this open, not of the entry:
                # the open fails with that errno and the entry stays
                raise
            with self.lock:
                corrupt = self._current(fid, gen)  # else it was evicted or promoted meanwhile
            if corrupt:
                self._drop_corrupt(fid, gen, csum, size,
                                   f"disk entry for {self.ns.path(fid)!r}: {e.strerror or e}")
            return None
        keep = size <= self.ram_index.capacity_bytes  # it could be promoted: keep the bytes we verify
        if not packed and not keep and self.verify_entries == "first-hit":
            with self.lock:  # this generation passed at an earlier hit (cleared with every new one)
                if self._current(fid, gen) and self.verified[fid]:
                    self._count(fid, size, "disk")
                    return Handle(self, fid, size, "disk", fd=fd, gen=gen)
        if not packed:
            try:
                data = self.disk.verify(fd, size, csum, keep=keep)
            except CorruptEntry as e:
                os.close(fd)
                self._drop_corrupt(fid, gen, csum, size, f"{e} ({self.ns.path(fid)!r})")
                return None
        demote: List[Tuple[int, bytes, _Flight]] = []
        promoted = None
        loose = 0
        with self.lock:
            if self._current(fid, gen):
                self.verified[fid] = True
            self._count(fid, size, "disk")
            if data is not None and self._current(fid, gen):
                if self._orphans:
                    self._settle()
                victims = self.ram_index.reserve(fid, size)
                if victims is not None:
                    demote = self._evict_ram(victims)
                    self.ram.put(fid, data)
                    self.ram_index.commit(fid)
                    self.disk_index.remove(fid, dying=True)  # resident(ram); the old entry: deleting
                    self.promotions += 1
                    promoted = self._pin_ram(fid, size)
            if packed and promoted is None and self.loose_bytes + size <= self.loose_budget:
                self.loose_bytes += size  # the record's bytes, held by the handle (LOOSE_BUFFERS)
                loose = size
        if promoted is not None:
            if fd is not None:
                os.close(fd)
            self._move(demote, (fid, gen, csum, size))  # the old entry's unlink and the victims' writes
            return Handle(self, fid, size, "disk", data=data, pin=promoted)
        if packed:  # (no loose room: served by ranges from the backend)
            return Handle(self, fid, size, "disk", data=data if loose else None, loose=loose)
        return Handle(self, fid, size, "disk", fd=fd, gen=gen)

    def _drop_corrupt(self, fid: int, gen: int, csum: int, size: int, why: str) -> None:
        with self.lock:
            if not self._current(fid, gen):
                return  # evicted meanwhile, not corrupt
            self.disk_index.remove(fid, dying=True)
            self.corrupt_entries += 1
            self._stale_pages.add(fid)
        log.warning("dropping corrupt disk entry: %s", why)
        self._unlink(fid, gen, csum, size)

    def _unlink(self, fid: int, gen: int, csum: int, size: int) -> None:
        # a dying entry (out of the index, still counted): delete it, then stop counting it
        self.disk.delete(self.ns.path(fid), gen, csum)
        self._unlinked_hooks(fid)
        with self.lock:
            self.disk_index.unlinked(size)

    def _unlinked_hooks(self, fid: int) -> None:
        for hook in self.entry_unlinked:
            hook(fid)

    # -- misses: one leader per file, admission decided before the read -----------------------------
    def _start_fetch(self, fid: int, size: int, memory: bool = True, transient: bool = False):
        """Under self.lock, for an absent file: reserve it in RAM, else in the disk tier, and enter
        ``fetching``. Returns (flight, RAM victims to demote) or (None, []) when no tier admits it
        (``memory``: a flight kept by no tier, to offer to the shared tier, counts as admitted).
        ``transient`` (an open, whose handle takes the bytes): a file no tier admits of at most
        :attr:`whole_max` bytes is fetched into a transient buffer while :data:`LOOSE_BUFFERS` has room."""
        if self._orphans:
            self._settle()
        victims = self.ram_index.reserve(fid, size)
        if victims is not None:
            fl = _Flight("fetch")
            fl.tier = "ram"
            self._flights[fid] = fl
            return fl, self._evict_ram(victims)
        plan = self._reserve_disk(fid, size)
        if plan is None:
            if (transient and size <= self.whole_max and self.loose_bytes + size <= self.loose_budget
                    and not self._read_whole_once[fid]):
                # no tier: one whole GET into a transient buffer (loose bytes, reserved for the first
                # handle), served as held-open bytes are; offered to the group when there is one
                self._read_whole_once[fid] = True
                fl = _Flight("fetch")
                fl.tier = "memory"
                fl.loose = size
                self.loose_bytes += size
                self._flights[fid] = fl
                return fl, []
            if memory and self.shared is not None and size <= self.shared.max_file:
                # no node tier: read it whole (at most --shared-max-file) to serve and offer to the group
                fl = _Flight("fetch")
                fl.tier = "memory"
                self._flights[fid] = fl
                return fl, []
            return None, []
        fl = _Flight("fetch")
        fl.tier = "disk"
        fl.plan = plan
        self._flights[fid] = fl
        return fl, []

    def _reserve_disk(self, fid: int, size: int):
        # under self.lock: reserve ``fid`` in the disk tier; its victims enter ``deleting``
        if self.disk_index is None:
            return None
        victims = self.disk_index.reserve(fid, size, hold_victims=True)
        if victims is None:
            return None
        doomed = [(v, int(self.entries.gen[v]), int(self.entries.csum[v])) for v in victims]
        return self.disk.next_gen(), doomed

    def _clear_victims(self, fid: int, doomed) -> None:
        # outside the lock: delete the victims' entries, then let ``fid``'s fill use their bytes
        for v, gen, csum in doomed:
            self.disk.delete(self.ns.path(v), gen, csum)
            self._unlinked_hooks(v)
        with self.lock:
            self.disk_index.release(fid)

    def _backend_read(self, fid: int, size: int) -> bytes:
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
                piece = self.backend.read_range(path, off, n)
                if len(piece) != n:
                    raise OSError(f"backend returned {len(piece)} bytes at {off} of {path!r}, expected {n} "
                                  f"(the file changed under the mount)")
                yield piece
            if self.on_backend_read is not None:
                self.on_backend_read(time.monotonic() - t0)
        except BaseException as e:
            failed.append(e)
            raise

    def _lead(self, fid: int, size: int, fl: _Flight, demote, data: Optional[bytes] = None,
              source: Outcome = "shared") -> None:
        """The leader's half of a miss: read the bytes (``data`` when given, else the shared tier, else the
        backend) into the reserved tier, commit, end the flight.

        Raises:
            FileNotFoundError, OSError: the backend failed (every joined open gets the same error).
        """
        self._move(demote)  # the victims move now, never behind this file's read
        offer = None
        try:
            shared = self.shared
            if data is not None:
                fl.source = source
            elif shared is not None and size <= shared.max_file:
                data = shared.get(self.shared_key(fid), size)  # None past its deadline: a miss, never an error
                if data is not None:
                    fl.source = "shared"
            if fl.tier in ("ram", "memory"):
                fetched = data is None
                if fetched:
                    data = offer = self._backend_read(fid, size)
                with self.lock:
                    if fetched:
                        self.backend_reads += 1
                        self.backend_bytes += size
                    if fl.tier == "ram":
                        self.ram.put(fid, data)
                        self.ram_index.commit(fid)
                    else:
                        fl.tier = None  # served from this buffer, kept by no tier
                    fl.data = data
                    del self._flights[fid]
            else:
                offer = self._fill_disk(fid, size, fl, data)
        except BaseException as e:
            with self.lock:
                self.backend_errors += not isinstance(e, FileNotFoundError)
                self.loose_bytes -= fl.loose  # the transient buffer's reservation (no handle takes it)
                fl.loose = 0
                if fl.tier == "ram":
                    self.ram_index.abort(fid)
                elif fl.tier == "disk":
                    self.disk_index.abort(fid)
                self._flights.pop(fid, None)
            fl.error = e
            fl.tier = None
            raise
        finally:
            fl.done.set()
        if offer is not None and fl.tier is None:
            self._offer_shared(fid, offer)  # read from the backend, kept by no tier of this node

    def _offer_shared(self, fid: int, data: bytes) -> None:
        """A file leaves this node (refused by its tiers, or a victim no lower tier takes): offer it to
        the group, off the request path. The group then holds what the node does not (f + s, not max)."""
        if self.shared is not None and len(data) <= self.shared.max_file:
            self.shared.offer_async(self.shared_key(fid), data, self.importance.get(fid))

    def _fill_disk(self, fid: int, size: int, fl: _Flight, data: Optional[bytes]) -> Optional[bytes]:
        """Fill the reserved disk entry from ``data`` or the backend. Returns the bytes read from the
        backend when they were read whole (to offer to the group), else None."""
        gen, doomed = fl.plan
        self._clear_victims(fid, doomed)
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
            csum = self.disk.put(self.ns.path(fid), gen, chunks, size, mtime_ns=self._mtime_ns(fid))
        except BaseException as e:
            if failed:
                raise failed[0]  # the backend failed: _lead aborts and reports it
            whole = data if data is not None else (keep[0] if keep else None)
            with self.lock:
                self.disk_index.abort(fid)
                self._count_write_failure(e)
                if fetched and keep:
                    self.backend_reads += 1
                    self.backend_bytes += size
                fl.tier = None
                fl.data = whole
                del self._flights[fid]
            return keep[0] if fetched and keep else None
        with self.lock:
            if fetched:
                self.backend_reads += 1
                self.backend_bytes += size
            self.disk_index.commit(fid)
            self.entries.gen[fid] = gen
            self.entries.csum[fid] = csum
            self.verified[fid] = False  # written, not yet read back: its first hit verifies it
            fl.gen, fl.csum = gen, csum
            # the bytes in hand: an open whose entry is evicted before it opens it is served from them,
            # not read from the backend a second time (they live only as long as the flight's waiters)
            fl.data = data if data is not None else (keep[0] if keep else None)
            del self._flights[fid]
        return keep[0] if fetched and keep else None

    def _count_write_failure(self, e: BaseException) -> None:
        # under self.lock
        if isinstance(e, DiskFloorReached):
            self.disk_writes_refused += 1
            self._write_error_log(logging.INFO, "disk tier write refused: %s", e)
        else:
            self.disk_write_errors += 1
            self._write_error_log(logging.WARNING, "disk tier write failed (%s); serving continues without it",
                                  e)

    def _mtime_ns(self, fid: int) -> int:
        return int(self.ns.mtimes_ns[fid])

    def _miss_handle(self, fid: int, size: int, fl: _Flight, outcome: Optional[Outcome] = None) -> Handle:
        """A Handle for an open whose miss ``fl`` completed (counted ``outcome``, by default ``fl.source``)."""
        outcome = outcome or fl.source
        if fl.tier == "ram":
            with self.lock:
                if fid in self.ram_index and self.ram.get(fid) is fl.data:
                    return Handle(self, fid, size, outcome, data=fl.data, pin=self._pin_ram(fid, size))
            return self._loose_handle(fid, size, outcome, fl.data)  # evicted already: bytes in hand
        if fl.tier == "disk" and not (self.disk.segments is not None and self.disk.packed(size)):
            try:
                return Handle(self, fid, size, outcome,
                              fd=self.disk.open_entry(self.ns.path(fid), fl.gen, fl.csum), gen=fl.gen)
            except OSError:
                pass  # evicted already: serve from the backend
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

    def _read_range(self, fid: int, offset: int, length: int) -> bytes:
        t0 = time.monotonic()
        data = self.backend.read_range(self.ns.path(fid), offset, length)
        if self.on_backend_read is not None:
            self.on_backend_read(time.monotonic() - t0)
        if len(data) != length:
            raise OSError(f"backend returned {len(data)} bytes at {offset} of {self.ns.path(fid)!r}, "
                          f"expected {length} (the file changed under the mount)")
        with self.lock:
            self.backend_bytes += length
            self.range_reads += 1
        return data

    def _stream_read(self, h: Handle, offset: int, end: int) -> bytes:
        """Bytes ``[offset, end)`` of a file served by ranges (``end`` within its size): read from the
        backend in whole chunks of :attr:`chunk` bytes (one request each, pinned to the object's version
        by the backend), the last chunk kept by the handle, counted against :data:`LOOSE_BUFFERS`
        (``min(chunk, size)`` reserved at the first read); with no room, exactly the bytes asked.
        Concurrent READs of one handle take turns (one request per chunk, not one per READ)."""
        if h._chunk is None:  # the first read: a chunk buffer and its lock, if the working set has room
            want = min(self.chunk, h.size)
            with self.lock:
                if self._orphans:
                    self._settle()
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
                h._chunk = (start, self._read_range(h.fid, start, min(self.chunk, h.size - start)), lock)
        return out[0] if len(out) == 1 else b"".join(out)

    def read_range(self, fid: int, offset: int, length: int) -> bytes:
        """Read ``length`` bytes at ``offset`` of file ``fid`` straight from the backend (not counted as
        an open; fewer bytes only at EOF)."""
        length = max(0, min(length, int(self.ns.size(fid)) - offset))
        return self._read_range(fid, offset, length) if length else b""

    # -- demotion ----------------------------------------------------------------------------------
    def _evict_ram(self, victims: List[int]) -> List[Tuple[int, bytes, Optional[_Flight]]]:
        """Under self.lock; ``victims`` are already out of the RAM index (``reserve`` credited all of them
        but the held-open ones it kept dying): they enter ``moving`` (or ``absent``).

        A victim's bytes that stay in memory, held open (``reserve`` spilled it: PIN_LOOSE, or kept it:
        PIN_DYING) or moving to the disk tier (the flight holds a ref), are counted until the last ref
        goes. A victim with no handle whose bytes :data:`LOOSE_BUFFERS` has no room for is not demoted
        (counted ``demotions_skipped``; it is only offered to the group, as a victim no disk tier takes)."""
        out = []
        demotes = (self.disk_index is not None and self.disk_index.capacity_bytes > 0) or self.shared is not None
        for v in victims:
            data = self.ram.pop(v)
            rec = self._pins.pop(v, None)
            if rec is not None:
                if rec[2] == PIN_TIER:
                    rec[2] = PIN_DYING  # no loose room: reserve() kept its bytes dying in the tier
                self._held[id(rec)] = rec
            if data is None or not demotes:
                continue
            if rec is None:
                if self.loose_bytes + len(data) > self.loose_budget:
                    self.demotions_skipped += 1
                    out.append((v, data, None))
                    continue
                rec = [0, len(data), PIN_LOOSE, v]
                self.loose_bytes += len(data)
                self._held[id(rec)] = rec
            rec[0] += 1  # the flight's ref, dropped when the disk write is done
            fl = _Flight("demote", data)
            fl.pin = rec
            self._flights[v] = fl
            out.append((v, data, fl))
        return out

    def _move(self, demote: List[Tuple[int, bytes, Optional[_Flight]]],
              unlink: Optional[Tuple[int, int, int, int]] = None) -> None:
        """Outside the lock: hand RAM victims (``demote``, as :meth:`_evict_ram` returns them) and a dying
        disk entry (``unlink``: fid, generation, checksum, size in bytes) to the mover thread; never waits
        for their I/O. Before :meth:`start_background` and after :meth:`close` they are moved on this
        thread. With :data:`MOVE_QUEUE` full, the delete is done here and the demotions are skipped."""
        if not demote and unlink is None:
            return
        with self._mover_lock:
            q = self._moves
            if q is not None:
                try:
                    q.put_nowait((demote, unlink))
                    return
                except queue.Full:
                    pass
        if q is None:
            self._run_move(demote, unlink)
            return
        if unlink is not None:
            self._unlink(*unlink)
        self._skip_demotions(demote)

    def _run_move(self, demote, unlink) -> None:
        if unlink is not None:
            self._unlink(*unlink)
        self._demote(demote)

    def _skip_demotions(self, items: List[Tuple[int, bytes, Optional[_Flight]]]) -> None:
        # outside the lock: moving victims that will not be written leave ``moving`` (dropped; offered to
        # the group, as a victim no disk tier takes)
        for fid, data, fl in items:
            if fl is not None:
                with self.lock:
                    self.demotions_skipped += 1
                    del self._flights[fid]
                    self._unpin_locked(fl.pin, 0)
                fl.done.set()
            self._offer_shared(fid, data)

    def _mover(self, q: queue.Queue) -> None:
        while True:
            job = q.get()
            if job is None:
                return
            try:
                self._run_move(*job)
            except Exception:  # a bug must not stop the mover (every later victim would stay moving)
                log.exception("moving RAM victims / deleting a disk entry failed")

    def _demote(self, items: List[Tuple[int, bytes, Optional[_Flight]]]) -> None:
        """Outside the lock: write each moving RAM victim to the disk tier if its policy admits it (a
        victim without a flight was not demoted: it is offered to the group only)."""
        for fid, data, fl in items:
            if fl is None:
                self._offer_shared(fid, data)
                continue
            gen = csum = 0
            with self.lock:
                plan = self._reserve_disk(fid, len(data))
            ok = False
            try:
                if plan is not None:
                    gen, doomed = plan
                    self._clear_victims(fid, doomed)
                    csum = self.disk.put(self.ns.path(fid), gen, (data,), len(data), mtime_ns=self._mtime_ns(fid))
                    ok = True
            except Exception as e:
                with self.lock:
                    self._count_write_failure(e)
            finally:
                with self.lock:
                    if ok:
                        self.disk_index.commit(fid)
                        self.entries.gen[fid] = gen
                        self.entries.csum[fid] = csum
                        self.verified[fid] = False
                        self.demotions += 1
                        fl.tier = "disk"
                    elif plan is not None:
                        self.disk_index.abort(fid)
                    del self._flights[fid]
                    self._unpin_locked(fl.pin, 0)  # the bytes are on disk (or dropped): the flight's ref
                fl.done.set()
            if not ok:
                self._offer_shared(fid, data)  # a RAM victim no disk tier takes goes to the group

    # -- reading ahead: warm-up and the plan prefetcher ---------------------------------------------
    def fetchable(self, fid: int) -> bool:
        """Whether a read ahead of ``fid`` would start now: in no tier, not moving, no read of it in flight
        (an open's or a prefetch's). Caller holds :attr:`lock`."""
        return self._absent(fid) and fid not in self._inflight

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
        size = int(self.ns.size(fid))
        if hold is not None:
            return self._read_ahead(fid, size, hold)
        with self.lock:
            if fid in self.ram_index or (self.disk_index is not None and fid in self.disk_index):
                return "resident"
            fl = self._flights.get(fid)
            if fl is not None and fl.kind == "demote":
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

    def _read_ahead(self, fid: int, size: int, hold) -> str:
        """:meth:`prefetch` into ``hold`` (its docstring): registered in the in-flight table, read from the
        group or the backend outside the lock, handed to ``hold`` under it."""
        with self.lock:
            fl = self._flights.get(fid)
            if fid in self.ram_index or (self.disk_index is not None and fid in self.disk_index) or (
                    fl is not None and fl.kind == "demote"):
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
                        self.backend_bytes += size
                    kept = bool(hold(fid, data, source))
                else:
                    self.backend_errors += not isinstance(err, FileNotFoundError)
        finally:
            fut.set_result(None if err is not None else (data, source))
        if err is not None:
            raise err
        return "held" if kept else "dropped"

    # -- inspection ----------------------------------------------------------------------------------
    def state(self, fid: int) -> str:
        """The file's state: ``"absent"``, ``"fetching"``, ``"moving"``, ``"ram"`` or ``"disk"``."""
        with self.lock:
            fl = self._flights.get(int(fid))
            if fl is not None:
                return "fetching" if fl.kind == "fetch" else "moving"
            if fid in self.ram_index:
                return "ram"
            if self.disk_index is not None and fid in self.disk_index:
                return "disk"
            return "absent"

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
            fetching = sorted(f for f, fl in self._flights.items() if fl.kind == "fetch")
            moving = sorted(f for f, fl in self._flights.items() if fl.kind == "demote")
            moving_bytes = sum(len(fl.data) for fl in self._flights.values()
                               if fl.kind == "demote" and fl.data is not None)
            held = {"dying": sum(r[1] for r in self._held.values() if r[2] == PIN_DYING),
                    "loose": sum(r[1] for r in self._held.values() if r[2] == PIN_LOOSE),
                    "uncounted": sorted(f for f, fl in self._flights.items() if fl.kind == "demote" and (
                        fl.pin is None or self._held.get(id(fl.pin)) is not fl.pin or fl.pin[0] < 1))}
            loose = {"bytes": self.loose_bytes, "budget": self.loose_budget}
            budget = {}
            for ix in (self.ram_index, self.disk_index):
                if ix is not None:
                    budget[ix.name] = {"capacity": ix.capacity_bytes, "used": ix.used_bytes,
                                       "reserved": ix.reserved_bytes, "dying": ix.dying_bytes,
                                       "pending": sorted(ix.pending)}
            gens = [(f, int(self.entries.gen[f]), int(self.entries.csum[f])) for f in disk]
            flags = self.resident_flags.copy()
            counters = {k: getattr(self, k) for k in (
                "opens", "hits_ram", "hits_disk", "hits_shared", "misses", "joined", "streamed",
                "backend_reads", "range_reads", "backend_errors", "corrupt_entries", "disk_write_errors",
                "disk_writes_refused", "promotions", "demotions", "demotions_skipped", "loose_refused",
                "source_changes")}
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
        todo = [f for f in todo if self._checked(f) and int(self.ns.size(f)) <= self.shared.max_file]
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
                    fl, demote = self._start_fetch(f, len(data))
                if fl is None:
                    continue
                self._lead(f, len(data), fl, demote, data=data)
                n += fl.tier is not None
        return n

    # -- background work -------------------------------------------------------------------------
    def start_background(self) -> None:
        """Start the threads that keep work off the read path (after the FUSE fork, from the daemon's
        ``on_mounted``): policy bookkeeping in bounded slices, the trace writer, and the mover (RAM
        victims' disk writes and dying entries' deletes, from a queue of :data:`MOVE_QUEUE`). Idempotent."""
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
        q: queue.Queue = queue.Queue(MOVE_QUEUE)
        self._mover_thread = threading.Thread(target=self._mover, args=(q,), name="shadefs-mover", daemon=True)
        self._mover_thread.start()
        with self._mover_lock:
            self._moves = q

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
        self._bg_stop.set()
        self._bg_wake.set()
        with self._mover_lock:
            q, self._moves = self._moves, None
        if q is not None:
            try:
                q.put(None, timeout=10)
            except queue.Full:
                pass
        for t in (self._bg_thread, self._mover_thread):
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
                out["shared_errors"] = self.shared.counters()["errors"]
            return out


def _tee(chunks: Iterator[bytes], keep: list) -> Iterator[bytes]:
    for c in chunks:
        keep.append(c)
        yield c
