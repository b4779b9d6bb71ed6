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
the same file). :class:`TieredCache` is the read path over that table, one part per job, each a mixin
over the cache's state (this module's ``__init__``): the open's decision (:mod:`shadefs.cache.opens`,
typed decisions in :mod:`shadefs.cache.decision`), NVMe hits (:mod:`shadefs.cache.disk_hits`), misses'
single-flight (:mod:`shadefs.cache.fetch`), pins and the working set outside the tiers
(:mod:`shadefs.cache.pins`), a reused snapshot's recheck (:mod:`shadefs.cache.recheck`), reading ahead
(:mod:`shadefs.plan.fill`), passthrough to the source file and the compiled loop's RAM hits (the kernel
front end's: :mod:`shadefs.fuse.passthrough`, :mod:`shadefs.fuse.residents`). What the front ends call
on it is :class:`~shadefs.cache.api.CacheAPI`. :mod:`shadefs.cache.movers` does the disk work of other
files' transitions (demotions, deletes) on its own thread, and :mod:`shadefs.cache.counters` counts every
open under exactly one :class:`~shadefs.cache.counters.Outcome`.

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

import collections
import logging
import threading
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..backends.base import Backend
from ..fuse.passthrough import SourcePassthrough
from ..fuse.residents import Residents
from ..logutil import RateLimitedLog
from ..namespace import Namespace
from ..plan.fill import Fill, PrefetchFuture
from ..policies.base import Importance
from ..procutil import FdReserve
from .buffers import FILL_BUFFERS, FillBuffers
from .chunks import ChunkedNamespace, ChunkMap
from .counters import COUNTER_NAMES, OpenCounters, Outcome
from .disk_hits import ENTRY_GONE_ERRNOS, DiskHits
from .fetch import COMPACTION_WAIT, FILL_CHUNK, Fetches
from .handle import Handle, OpenTicket
from .index import TierIndex
from .movers import MOVE_QUEUE, Mover
from .opens import UNLINK_WAIT, OpenPath
from .pins import LOOSE_BUFFERS, WorkingSet
from .recheck import Recheck
from .state import PIN_DYING, PIN_LOOSE, PIN_TIER, Fetch, Move, StateTable
from .tiers import DiskTier, MemoryTier

__all__ = ["TieredCache", "Handle", "OpenTicket", "Outcome", "PrefetchFuture", "MOVE_QUEUE", "PIN_TIER",
           "PIN_DYING", "PIN_LOOSE", "FILL_CHUNK", "LOOSE_BUFFERS", "UNLINK_WAIT", "COMPACTION_WAIT",
           "ENTRY_GONE_ERRNOS", "RAM_BIT", "DISK_BIT"]

log = logging.getLogger("shadefs.cache")

RAM_BIT, DISK_BIT = 1, 2  # bits of TieredCache.resident_flags
# FILL_CHUNK, COMPACTION_WAIT (shadefs.cache.fetch), LOOSE_BUFFERS (shadefs.cache.pins), UNLINK_WAIT
# (shadefs.cache.opens), ENTRY_GONE_ERRNOS (shadefs.cache.disk_hits): re-exported here, where they were
# MOVE_QUEUE (shadefs.cache.movers): submissions with RAM victims that may wait for the mover; the victims of
# one beyond it are dropped (not demoted), as when LOOSE_BUFFERS has no room; deletes are never dropped
# PIN_TIER, PIN_DYING, PIN_LOOSE (shadefs.cache.state): where the bytes of a RAM buffer record (Pin) count


class TieredCache(OpenPath, DiskHits, Fetches, WorkingSet, Recheck, Fill, SourcePassthrough, Residents):
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
                "loose_refused", "source_changes", "source_opens", "source_checks",
                "source_passthrough_bytes")}
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
                "source_passthrough_bytes": self.source_passthrough_bytes,
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
                "source_passthrough_bytes": self.source_passthrough_bytes,
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




def _counter(name: str) -> property:
    def get(self):
        return getattr(self.counts, name)

    def put(self, value):
        setattr(self.counts, name, value)
    return property(get, put, doc=f"``counts.{name}`` (:class:`~shadefs.cache.counters.OpenCounters`).")


for _name in COUNTER_NAMES:
    setattr(TieredCache, _name, _counter(_name))
del _name
