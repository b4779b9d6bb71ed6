"""The read path: RAM tier, then NVMe tier, then the backend, one whole file per open.

:meth:`TieredCache.open` is called once per file open (a sample access) and returns the file's exact
bytes and where they came from (``"ram"``, ``"disk"`` or ``"miss"``). That is also where counting
happens: hit = an open served without touching the backend; hit ratio = hits / opens.

Tiers are exclusive: a file is resident in at most one of them. A miss is offered to RAM first; RAM's
victims are demoted to the disk tier when the disk policy admits them, and a file that RAM refuses is
offered to the disk tier directly. A disk hit is promoted to RAM when RAM admits it (and leaves the disk
tier). Concurrent misses on one file share one backend read (single-flight). Backend and disk I/O
happen outside the lock, so a hit never waits behind another file's backend read.

Must never: serve partial data as a whole file, exceed a tier's byte budget (in-flight fills included),
or let a failing cache disk turn into an error for the reader.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..backends.base import Backend
from ..namespace import Namespace
from ..policies.base import Importance
from ..logutil import RateLimitedLog
from .index import TierIndex
from .tiers import CorruptEntry, DiskFloorReached, DiskTier, MemoryTier

__all__ = ["TieredCache", "Outcome"]

log = logging.getLogger("shadefs.cache")

Outcome = str  # "ram" | "disk" | "miss" | "prefetch" (a completed prefetch) | "late" (waited on one)
RAM_BIT, DISK_BIT = 1, 2  # bits of TieredCache.resident_flags


class TieredCache:
    """The cache of one mount.

    Args:
        namespace: the metadata snapshot (file ids, sizes).
        backend: reads files on a miss.
        ram: (index, store) of the RAM tier; index capacity 0 turns it off.
        disk: (index, store) of the disk tier, or None.
        importance: per-file importance shared by importance-aware policies.
        trace: an object with ``record(path, size, outcome)`` called once per open, or None.
        on_backend_read: optional ``callback(seconds: float)`` after every successful backend read
            (the latency histogram); every other figure is a counter read at scrape time.
        shared: the group's :class:`~shadefs.cache.shared.SharedTier` (between the NVMe tier and the
            backend), or None. A miss asks it first (within its deadline); a shared hit is counted
            ``"shared"`` and offered to the node's tiers like a backend read. A file read from the
            backend that no tier of the node admits, and a RAM victim no disk tier takes, is offered to
            the group off the request path (the group is the node's victim cache: it holds what the
            node does not).
    """

    def __init__(self, namespace: Namespace, backend: Backend, ram: Tuple[TierIndex, MemoryTier],
                 disk: Optional[Tuple[TierIndex, DiskTier]], importance: Importance,
                 trace=None, on_backend_read=None, stream_threshold: int = 64 * 2**20, shared=None):
        self.ns = namespace
        self.shared = shared
        # a file above this size that no tier can hold is streamed from the backend by ranges
        self.stream_threshold = int(stream_threshold)
        self.backend = backend
        self.ram_index, self.ram = ram
        self.disk_index, self.disk = disk if disk is not None else (None, None)
        self.importance = importance
        self.trace = trace
        self.on_backend_read = on_backend_read
        self.lock = threading.Lock()
        self._inflight: Dict[int, cf.Future] = {}
        self._moving: Dict[int, bytes] = {}  # RAM victims on their way to the disk tier
        self.started = time.monotonic()
        # counters (read under self.lock for a consistent snapshot)
        self.opens = 0
        self.hits_ram = 0
        self.hits_disk = 0
        self.hits_shared = 0
        self.misses = 0
        self.open_bytes = 0
        self.hit_bytes = 0
        self.backend_bytes = 0
        self.backend_errors = 0
        self.corrupt_entries = 0
        self.disk_write_errors = 0
        self.disk_writes_refused = 0   # refused by --disk-min-free (not an error)
        self.promotions = 0
        self.demotions = 0
        self._write_error_log = RateLimitedLog(log, 10.0)
        # residency of every file id, one bit per tier, maintained by the tier indexes on commit/remove:
        # resident() and the checkpoint read it instead of walking the indexes under the lock
        self.resident_flags = np.zeros(namespace.num_files, dtype=np.uint8)
        self.ram_index.track_residency(self.resident_flags, RAM_BIT)
        if self.disk_index is not None:
            self.disk_index.track_residency(self.resident_flags, DISK_BIT, keep_order=True)
        # deferred policy bookkeeping (score batches, hit touches), applied by a background thread
        self.apply_slice = 32            # ids per lock acquisition (~1-3 us per id at 1M residents)
        self._bg_policies: List = []
        self._bg_wake = threading.Event()
        self._bg_stop = threading.Event()
        self._bg_thread: Optional[threading.Thread] = None
        self.plans = None        # shadefs.plan.plans.PlanRegistry: cursors follow every counted open
        self.prefetcher = None   # shadefs.plan.prefetch.Prefetcher

    def attach_plans(self, plans, prefetcher=None) -> None:
        """Follow announced plans (issue 11): ``plans`` shares this cache's lock; ``prefetcher`` reads
        ahead of them into its window. Call before serving."""
        self.plans = plans
        self.prefetcher = prefetcher

    # -- the read path -----------------------------------------------------------------------------
    def open(self, fid: int) -> Tuple[Optional[bytes], Outcome]:
        """Return the whole content of file ``fid`` and where it was served from.

        The content is None for a file too large for any tier and above ``stream_threshold``: it is
        not cached and is read by ranges with :meth:`read_range` (counted as a miss).

        Raises:
            FileNotFoundError: the backend says the file is gone (ENOENT).
            OSError: the backend failed (EIO), after the backend's own retries.
        """
        size = self.ns.size(fid)
        if size > self.stream_threshold and self._fits_no_tier(size):
            with self.lock:
                self._count(fid, size, "miss")
            return None, "miss"
        with self.lock:
            data = self._ram_lookup(fid)
            if data is not None:
                self._count(fid, size, "ram")
                return data, "ram"
            on_disk = self.disk_index is not None and fid in self.disk_index
            if on_disk:
                self.disk_index.hit(fid)
            elif self.prefetcher is not None:
                data = self.prefetcher.take(fid)
                if data is not None:
                    self._count(fid, size, "prefetch")
                else:
                    fut = self._inflight.get(fid)
                    if fut is None or not getattr(fut, "prefetch", False):
                        fut = None
        if not on_disk and self.prefetcher is not None:
            if data is not None:
                self._admit(fid, data)
                return data, "prefetch"
            if fut is not None:  # single-flight: wait for the prefetch's read, never start another
                t0 = time.monotonic()
                got = fut.result()
                if got is not None:
                    data = got[0]
                    with self.lock:
                        self.prefetcher.took_late(fid, time.monotonic() - t0)
                        self._count(fid, size, "late")
                    self._admit(fid, data)
                    return data, "late"
                # the prefetch failed: read it ourselves, counted as a miss
        if on_disk:
            try:
                data = self.disk.get(self.ns.path(fid), size)
            except CorruptEntry as e:
                with self.lock:
                    if self.disk_index.remove(fid):  # else: evicted meanwhile, not corrupt
                        log.warning("dropping corrupt disk entry: %s", e)
                        self.corrupt_entries += 1
            else:
                with self.lock:
                    self._count(fid, size, "disk")
                self._promote(fid, data)
                return data, "disk"
        return self._miss(fid, size)

    def _fits_no_tier(self, size: int) -> bool:
        return size > self.ram_index.capacity_bytes and (
            self.disk_index is None or size > self.disk_index.capacity_bytes)

    def read_range(self, fid: int, offset: int, length: int) -> bytes:
        """Read ``length`` bytes at ``offset`` of a streamed (uncached) file straight from the backend."""
        size = self.ns.size(fid)
        length = max(0, min(length, size - offset))
        if length == 0:
            return b""
        data = self.backend.read_range(self.ns.path(fid), offset, length)
        if len(data) != length:
            raise OSError(f"backend returned {len(data)} bytes at {offset} of {self.ns.path(fid)!r}, "
                          f"expected {length} (the file changed under the mount)")
        with self.lock:
            self.backend_bytes += length
        return data

    def _ram_lookup(self, fid: int) -> Optional[bytes]:
        if fid in self.ram_index:
            self.ram_index.hit(fid)
            return self.ram.get(fid)
        return self._moving.get(fid)

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

    def _miss(self, fid: int, size: int) -> Tuple[bytes, Outcome]:
        # counted once the source is known: "shared" when the group served it, else "miss"
        if self.shared is None:
            with self.lock:
                self._count(fid, size, "miss")
            return self._fetch(fid, size), "miss"
        outcome = "miss"
        try:
            data, outcome = self._fetch(fid, size, with_source=True)
        finally:
            with self.lock:
                self._count(fid, size, outcome)
        return data, outcome

    def shared_key(self, fid: int) -> str:
        """The group-wide key of file ``fid`` (path, size and mtime: a changed file never matches)."""
        return self.shared.key(self.ns.path(fid), int(self.ns.size(fid)), round(float(self.ns.mtimes[fid]) * 1e9))

    def _fetch(self, fid: int, size: int, with_source: bool = False):
        """Read ``fid`` once for all concurrent callers (single-flight): from the shared tier when the group
        has it, else from the backend (then offered to the group); then admit it to the node's tiers.

        Returns the bytes, or (bytes, ``"shared"`` | ``"miss"``) with ``with_source``."""
        with self.lock:
            fut = self._inflight.get(fid)
            leader = fut is None
            if leader:
                fut = cf.Future()
                self._inflight[fid] = fut
        while not leader:
            got = fut.result()  # single-flight: share the leader's read
            if got is not None:
                if getattr(fut, "prefetch", False):
                    with self.lock:
                        self.prefetcher.discard(fid)
                data, source = got
                return (data, source) if with_source else data
            # a failed prefetch resolves to None: read the file ourselves
            with self.lock:
                fut = self._inflight.get(fid)
                leader = fut is None
                if leader:
                    fut = cf.Future()
                    self._inflight[fid] = fut
        shared = self.shared
        if shared is not None and size <= shared.max_file:
            data = shared.get(self.shared_key(fid), size)  # None past its deadline: a miss, never an error
            if data is not None:
                with self.lock:
                    del self._inflight[fid]
                fut.set_result((data, "shared"))
                self._admit(fid, data)
                return (data, "shared") if with_source else data
        try:
            t0 = time.monotonic()
            data = self.backend.read(self.ns.path(fid), size)
            if len(data) != size:  # a backend bug must not become a short file
                raise OSError(f"backend returned {len(data)} bytes for {self.ns.path(fid)!r}, expected {size}")
            if self.on_backend_read is not None:
                self.on_backend_read(time.monotonic() - t0)
        except BaseException as e:
            with self.lock:
                self.backend_errors += not isinstance(e, FileNotFoundError)
                del self._inflight[fid]
            fut.set_exception(e)
            raise
        with self.lock:
            self.backend_bytes += size
            del self._inflight[fid]
        fut.set_result((data, "miss"))
        if not self._admit(fid, data):
            self._offer_shared(fid, data)
        return (data, "miss") if with_source else data

    # -- admission, promotion, demotion ------------------------------------------------------------
    def _admit(self, fid: int, data: bytes) -> bool:
        """Offer a file just read to RAM, else to the disk tier. Returns whether a tier admitted it."""
        with self.lock:
            victims = self.ram_index.reserve(fid, len(data))
            if victims is not None:
                demote = self._evict_ram(victims)
                self.ram.put(fid, data)
                self.ram_index.commit(fid)
        if victims is not None:
            self._demote(demote)
            return True
        return self._write_disk(fid, data)

    def _offer_shared(self, fid: int, data: bytes) -> None:
        """A file leaves this node (refused by its tiers, or a victim no lower tier takes): offer it to
        the group, off the request path. The group then holds what the node does not (f + s, not max)."""
        if self.shared is not None and len(data) <= self.shared.max_file:
            self.shared.offer_async(self.shared_key(fid), data, self.importance.get(fid))

    def _promote(self, fid: int, data: bytes) -> None:
        """A disk hit moves to RAM if RAM admits it."""
        with self.lock:
            if fid not in self.disk_index:
                return  # evicted meanwhile
            victims = self.ram_index.reserve(fid, len(data))
            if victims is None:
                return
            demote = self._evict_ram(victims)
            self.ram.put(fid, data)
            self.ram_index.commit(fid)
            self.disk_index.remove(fid)
            self.promotions += 1
        self.disk.delete(self.ns.path(fid))
        self._demote(demote)

    def _evict_ram(self, victims: List[int]) -> List[Tuple[int, bytes]]:
        # called with self.lock held; victims are already out of the RAM index
        out = []
        for v in victims:
            data = self.ram.pop(v)
            if data is not None and (self.disk_index is not None or self.shared is not None):
                self._moving[v] = data
                out.append((v, data))
        return out

    def _demote(self, items: List[Tuple[int, bytes]]) -> None:
        for fid, data in items:
            try:
                if self._write_disk(fid, data):
                    with self.lock:
                        self.demotions += 1
                else:
                    self._offer_shared(fid, data)
            finally:
                with self.lock:
                    self._moving.pop(fid, None)

    def _write_disk(self, fid: int, data: bytes) -> bool:
        """Admit ``fid`` to the disk tier if its policy agrees; returns whether it is now resident."""
        if self.disk_index is None:
            return False
        with self.lock:
            victims = self.disk_index.reserve(fid, len(data))
            if victims is None:
                return False
        for v in victims:
            self.disk.delete(self.ns.path(v))
        try:
            self.disk.put(self.ns.path(fid), data, mtime_ns=round(float(self.ns.mtimes[fid]) * 1e9))
        except DiskFloorReached as e:
            with self.lock:
                self.disk_index.abort(fid)
                self.disk_writes_refused += 1
            self._write_error_log(logging.INFO, "disk tier write refused: %s", e)
            return False
        except OSError as e:
            with self.lock:
                self.disk_index.abort(fid)
                self.disk_write_errors += 1
            self._write_error_log(logging.WARNING, "disk tier write failed (%s); serving continues without it", e)
            return False
        with self.lock:
            self.disk_index.commit(fid)
        return True

    def prefetch(self, fid: int) -> str:
        """Warm-up: read ``fid`` into the cache through the policies without counting an open.

        Returns:
            ``"resident"`` (already cached), ``"ram"`` / ``"disk"`` (admitted there) or ``"rejected"``
            (the policies did not admit it).

        Raises:
            FileNotFoundError, OSError: as :meth:`open`.
        """
        with self.lock:
            if fid in self.ram_index or (self.disk_index is not None and fid in self.disk_index):
                return "resident"
        self._fetch(fid, self.ns.size(fid))
        with self.lock:
            if fid in self.ram_index:
                return "ram"
            if self.disk_index is not None and fid in self.disk_index:
                return "disk"
        return "rejected"

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

    def warm_shared(self, fids) -> int:
        """Read the files of ``fids`` the group holds in one pipelined batch and admit them to this node's
        tiers (``warm``); not counted as opens. Returns how many came from the shared tier."""
        if self.shared is None:
            return 0
        with self.lock:
            todo = [int(f) for f in fids if int(f) not in self.ram_index and int(f) not in self._inflight
                    and (self.disk_index is None or int(f) not in self.disk_index)]
        todo = [f for f in todo if int(self.ns.size(f)) <= self.shared.max_file]
        n = 0
        for i in range(0, len(todo), 64):
            batch = todo[i:i + 64]
            got = self.shared.get_many([self.shared_key(f) for f in batch], [int(self.ns.size(f)) for f in batch])
            for f, data in zip(batch, got):
                if data is not None:
                    self._admit(f, data)
                    n += 1
        return n

    # -- background work -------------------------------------------------------------------------
    def start_background(self) -> None:
        """Start the threads that keep work off the read path (after the FUSE fork, from the daemon's
        ``on_mounted``): policy bookkeeping in bounded slices and the trace writer. Idempotent."""
        if self._bg_thread is not None:
            return
        for index in (self.ram_index, self.disk_index):
            if index is not None and index.capacity_bytes > 0 and index.policy.defer(self._bg_wake.set):
                self._bg_policies.append(index.policy)
        if self.trace is not None and hasattr(self.trace, "start"):
            self.trace.start()
        self._bg_thread = threading.Thread(target=self._background, name="shadefs-rerank", daemon=True)
        self._bg_thread.start()

    def _background(self) -> None:
        while not self._bg_stop.is_set():
            self._bg_wake.wait(0.05)  # hit touches are applied at least this often
            self._bg_wake.clear()
            for policy in self._bg_policies:
                more = True
                while more and not self._bg_stop.is_set():
                    with self.lock:
                        more = policy.apply_pending(self.apply_slice)
                    if more:
                        time.sleep(0)  # let a waiting open take the lock between slices

    def close(self) -> None:
        """Stop the background thread (the trace is closed by its owner). Idempotent."""
        self._bg_stop.set()
        self._bg_wake.set()
        t = self._bg_thread
        if t is not None and t is not threading.current_thread():
            t.join(10)

    def counters(self) -> dict:
        """Every counter and tier figure at one instant (what :mod:`shadefs.metrics` exports)."""
        with self.lock:
            tiers = {"ram": self.ram_index.snapshot()}
            if self.disk_index is not None:
                tiers["disk"] = self.disk_index.snapshot()
            if self.shared is not None:
                tiers["shared"] = self.shared.stats()
            return {
                "opens": self.opens, "hits_ram": self.hits_ram, "hits_disk": self.hits_disk,
                "hits_shared": self.hits_shared,
                "shared": self.shared.counters() if self.shared is not None else None,
                "misses": self.misses, "open_bytes": self.open_bytes, "hit_bytes": self.hit_bytes,
                "backend_bytes": self.backend_bytes, "backend_errors": self.backend_errors,
                "corrupt_entries": self.corrupt_entries, "disk_write_errors": self.disk_write_errors,
                "disk_writes_refused": self.disk_writes_refused, "promotions": self.promotions,
                "demotions": self.demotions, "tiers": tiers, "prefetch": self._prefetch_stats(),
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
                "tiers": {"ram": self.ram_index.snapshot(), "disk": disk},
                "prefetch": self._prefetch_stats(),
            }
            if self.shared is not None:  # only with --shared-tier: the keys of a plain mount stay as they are
                out["hits"]["shared"] = self.hits_shared
                out["tiers"]["shared"] = self.shared.stats()
                out["shared_errors"] = self.shared.counters()["errors"]
            return out
