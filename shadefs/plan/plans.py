"""Announced sample orders (plans) and the cursors that follow their consumption.

A training job announces each epoch's order (:mod:`shadefs.hooks.plan`, docs/protocol.md ``register`` /
``plan``): first its dataset's path table, once, which the daemon resolves to file ids and keeps under a
handle; then, per epoch, the order as uint32 indices into that table. :class:`PlanRegistry` keeps the
tables and one :class:`Plan` per stream (a handle and a stream id: one DDP rank, one sampler).

A plan's **cursor** follows the opens the daemon sees. DataLoader workers reorder the plan: batch k goes
to worker k mod W, each worker keeps ``prefetch_factor`` batches in flight, so opens arrive up to about
W x prefetch_factor x batch_size positions ahead of the oldest unconsumed one, interleaved. An open of
file f therefore consumes f's earliest unconsumed planned position if it lies within ``window`` positions
of the cursor (the lowest unconsumed position); repeats (with-replacement draws) are separate positions
of the same file, consumed in order. An open of a file the plan does not name (the test split) is not
this plan's business and is ignored; nor is an open by a process outside the plan's job, when the plan
names its job (:class:`JobKey`: the announcing process and its descendants; the opener of each open). An open of a file the plan names, but not within the
window, is *unmatched*; a plan with ``unmatched_limit`` unmatched opens since its last match, or no match
for ``idle_s`` seconds, is **retired** (its reader stopped following it: the job changed its mind,
crashed or ended), logged once and counted. A plan whose every position was consumed is *finished*. A
job that ends cleanly **withdraws** its plans (``withdraw``, docs/protocol.md), which drops them at once;
the retirement after ``idle_s`` remains for a job that crashed.
A process of no plan's job that opens files while plans have owners is followed as a **scan** (a pass
over distinct files; a repeat starts its next pass): a file every scan followed has read in its current
pass is *spent* (:meth:`PlanRegistry.spent`), which the tiers use among their files with no planned use
(:mod:`shadefs.plan.policy`). At most ``max_scans`` at once, one byte per namespace file each.
Neither state pins cache space: a plan only ranks files (Belady on the known future,
:mod:`shadefs.plan.policy`) and lends the prefetcher its order (:mod:`shadefs.plan.prefetch`).

Here: the registry of path tables, plans and scans (:class:`PlanRegistry`). A plan and its cursor are in
:mod:`shadefs.plan.cursor`, an open's job (:func:`ancestry`) in :mod:`shadefs.plan.jobs`;
their names are re-exported here.

Not thread-safe by itself: every method runs under ``lock`` (the cache's lock in the daemon), which
:meth:`PlanRegistry.announce` and :meth:`PlanRegistry.register` take themselves, briefly: an
announcement builds its plan and the tiers' structures without it and swaps them in.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .cursor import NOT_PLANNED, STRIDE_ONE, STRIDE_SHIFT, Plan, carry, carry_positions, carry_rest
from .jobs import JobKey, ancestry, proc_start_time

__all__ = ["Plan", "PlanRegistry", "PlanError", "NOT_PLANNED", "STRIDE_SHIFT", "JobKey", "ancestry", "proc_start_time"]

log = logging.getLogger("shadefs.plan")

#: opens of the mount between two measurements of the plans' strides
STRIDE_PERIOD = 2048


class PlanError(ValueError):
    """A plan or table message the registry refuses.

    Attributes:
        reason: a reason of :data:`shadefs.control.protocol.REASONS` (``unknown_handle``,
            ``unknown_path``, ``oversize``, ``flood``).
    """

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


def fresh_gil() -> None:
    """Give the GIL up and take it back before a short critical section under the cache lock (announcing,
    registering, preparing: the threads that run next to the FUSE threads' opens). CPython
    forces the holder of the GIL to hand it over when another thread has waited a switch interval (5 ms)
    without the GIL changing hands; a thread that has just taken the GIL has that long before anyone may
    force it out, so a section of pure Python shorter than that is not preempted while it holds the lock
    (preempted, it holds the lock one switch interval longer while threads building plans in numpy
    run)."""
    time.sleep(0)


class _Table:
    """One path table: table index -> file id (int32), appended in chunks without copying what is there;
    the flat array is made outside the lock by the first announcement that needs it."""

    def __init__(self, fids: np.ndarray, now: float):
        self.chunks: List[np.ndarray] = [fids] if fids.size else []
        self.size = int(fids.size)
        self.last_used = now

    def append(self, fids: np.ndarray) -> None:
        if fids.size:
            self.chunks = self.chunks + [fids]    # a new list: a snapshot taken before stays as it was
            self.size += int(fids.size)

    @staticmethod
    def flat(chunks: List[np.ndarray]) -> np.ndarray:
        if not chunks:
            return np.zeros(0, dtype=np.int32)
        return np.concatenate(chunks) if len(chunks) != 1 else chunks[0]


class _Scan:
    """A reader of no plan's job followed as a scan: the files it read in its current pass."""

    __slots__ = ("seen", "last")

    def __init__(self, num_files: int, now: float):
        self.seen = memoryview(np.zeros(num_files, dtype=np.uint8))  # per file: read in this pass (0/1)
        self.last = now


class PlanRegistry:
    """Path tables and plans of one mount.

    Args:
        num_files: the namespace's file count (below 2**31).
        lock: the lock every method runs under (the cache's); a fresh one by default.
        window: default matching window in positions (a plan may ask for more).
        unmatched_limit: unmatched opens since the last match that retire a plan (default ``window``).
        idle_s: seconds without a match that retire a plan.
        max_tables, max_table_paths, max_plans: limits (beyond them: ``flood`` / ``oversize``).
        announce_burst, announce_rate: per-stream token bucket on plan announcements (burst, per second).
        clock: monotonic seconds.
        job_ttl_s: how long an opener's ancestry (``/proc``) is trusted before it is read again (seconds).
        max_scans: readers of no plan followed as scans at once (each costs 1 byte per namespace file);
            0: none.
    """

    def __init__(self, num_files: int, lock: Optional[threading.Lock] = None, *, window: int = 8192,
                 unmatched_limit: Optional[int] = None, idle_s: float = 300.0, max_tables: int = 64,
                 max_table_paths: int = 1 << 27, max_plans: int = 64, announce_burst: int = 32,
                 announce_rate: float = 4.0, clock=time.monotonic, job_ttl_s: float = 5.0, max_scans: int = 4):
        if not 0 <= int(num_files) < 2**31:
            raise ValueError(f"plans need fewer than 2**31 files, got {num_files}")
        self.num_files = int(num_files)
        self.lock = lock if lock is not None else threading.Lock()
        self.window = int(window)
        self.unmatched_limit = int(unmatched_limit if unmatched_limit is not None else max(64, window))
        self.idle_s = float(idle_s)
        self.max_tables = int(max_tables)
        self.max_table_paths = int(max_table_paths)
        self.max_plans = int(max_plans)
        self.announce_burst = float(announce_burst)
        self.announce_rate = float(announce_rate)
        self.clock = clock
        self.job_ttl_s = float(job_ttl_s)
        self.tables: Dict[bytes, _Table] = {}
        self.plans: Dict[Tuple[bytes, int], Plan] = {}
        self._buckets: Dict[Tuple[bytes, int], Tuple[float, float]] = {}
        self.version = 0                       # bumped whenever the set of plans changes
        self.announced = 0
        self.retired = 0
        self.finished = 0
        self.withdrawn = 0
        self.foreign_opens = 0                 # opens by a process of no plan's job (while plans have owners)
        self.matched_opens = 0                 # positions consumed by opens, over all plans ever
        self.unmatched_opens = 0               # opens of a plan's file outside its window, over all plans ever
        self.listeners: List = []              # callback(plan, why) when a plan ends (prefetcher waste)
        self.watchers: List = []               # callback((plan, fid)) when fid's next use in plan moved later
        # entry ids whose planned uses are their file's (the chunks of a chunked file: a
        # shadefs.cache.chunks.ChunkMap, with owner_id, owner_ids and alias_ids), or None
        self.aliases = None
        self.preparers: List = []              # prepare(plans) -> install(): off the lock, for a new plan set
        self.on_open = None                    # callback(fid) on every open observe() sees, plans or not
        self._opens = 0                        # opens observe() saw while plans were active
        self._opens_mark = 0
        self._owned = False                    # some plan has an owner: opens are matched to jobs
        self._jobs: Dict[int, tuple] = {}      # opener pid -> (expires, ancestry, version, owner pid)
        self._owners: Dict[int, List[Plan]] = {}  # owner pid -> its plans (rebuilt with the version)
        self._free: List[Plan] = []            # plans without an owner: they follow every open
        self.install_hold_s: List[float] = []  # lock holds of the last announcements' installs (seconds)
        self._installing = threading.Lock()    # serialises announcements' preparations and installs
        self._installed_version = 0            # the plan set whose tier structures were last installed
        self._install_wanted = False           # a tier asked for a fresh structure (its heaps need compacting)
        self._install_due = threading.Event()  # wakes the installer thread (start())
        self._installer: Optional[threading.Thread] = None
        self._installer_stop = threading.Event()
        self._installer_failed = False
        self.reinstalls = 0                    # structures the installer thread built and installed
        # readers of no plan's job, each taken for a scan (distinct files in a random order, one pass):
        # tgid -> _Scan. A file every scan has read has no future the daemon can guess ("spent"): the
        # tiers evict those first among their files with no planned use (callbacks(fid), None: forget)
        self.max_scans = int(max_scans)
        self._scans: Dict[int, "_Scan"] = {}
        self.spent_watchers: List = []

    # -- the installer thread -----------------------------------------------------------------------
    @property
    def installs_off_lock(self) -> bool:
        """Whether the installer thread runs (:meth:`start`): a plan set that changed without an
        announcement (a plan finished, was retired or withdrawn) gets its tier structures built off the
        lock, and the tiers keep deciding with the ones they have until then. False again once a
        preparation failed: the tiers then rebuild under the lock, as without the thread."""
        return self._installer is not None and not self._installer_failed

    def start(self) -> None:
        """Start the installer thread (``shadefs-plan-install``): whenever the set of plans changes without
        an announcement installing structures for it, it prepares them without the lock and swaps them in
        (:meth:`reinstall`). Without it, the tiers rebuild under the lock at their next victim search.
        Idempotent."""
        if self._installer is not None:
            return
        self._installer_stop.clear()
        t = threading.Thread(target=self._install_loop, name="shadefs-plan-install", daemon=True)
        self._installer = t
        t.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the installer thread (after the preparation it may be running). Idempotent."""
        t, self._installer = self._installer, None
        if t is None:
            return
        self._installer_stop.set()
        self._install_due.set()
        t.join(timeout)

    def request_install(self) -> None:
        """A tier wants its structure rebuilt for the current plan set (its heaps hold many stale entries):
        the installer thread does it off the lock. Caller holds :attr:`lock`."""
        self._install_wanted = True
        self._install_due.set()

    def _install_loop(self) -> None:
        while not self._installer_stop.is_set():
            self._install_due.wait()
            self._install_due.clear()
            if self._installer_stop.is_set():
                return
            try:
                self.reinstall()
            except Exception:  # a bug must not leave stale structures: the tiers rebuild under the lock
                self._installer_failed = True
                log.exception("preparing the tiers for the plans failed; they rebuild at their next search")
                return

    def reinstall(self) -> bool:
        """Build the tiers' structures for the current plan set without the lock and swap them in (what an
        announcement does for its own set), unless they are current. Returns whether it installed."""
        with self._installing:
            for _ in range(3):
                fresh_gil()
                with self.lock:
                    if self.version == self._installed_version and not self._install_wanted:
                        return False
                    self._install_wanted = False
                    current = list(self.plans.values())
                    version = self.version
                installs = [prep(current) for prep in self.preparers]
                fresh_gil()
                with self.lock:
                    t0 = time.perf_counter()
                    if self.version != version:
                        replaced = [install(-1) for install in installs]  # ends their tracking
                        continue
                    replaced = [install(version) for install in installs]
                    self._installed_version = version
                    self.reinstalls += 1
                    self.install_hold_s.append(time.perf_counter() - t0)
                del replaced  # freed after the lock
                return True
            self._install_due.set()  # the set kept changing: look again
            return False

    # -- tables ----------------------------------------------------------------------------------
    def register(self, handle: Optional[bytes], fids: np.ndarray) -> Tuple[bytes, int]:
        """Create a path table (``handle`` None) or append ``fids`` to table ``handle``.

        Args:
            fids: file ids (ints below 2**31, shape (n,)), already resolved from paths by the caller.

        Returns:
            (handle: 8 bytes, table size after the call).

        Raises:
            PlanError: ``unknown_handle``; ``oversize`` (the table would exceed ``max_table_paths``);
                ``flood`` (``max_tables`` tables exist and every one has an active plan).

        The ids are copied before the lock is taken; under it the table only gains a chunk (no copy of
        what it holds).
        """
        fids = np.array(np.asarray(fids).reshape(-1), dtype=np.int32)
        fresh_gil()
        with self.lock:
            now = self.clock()
            if handle is None:
                if len(self.tables) >= self.max_tables and not self._drop_idle_table():
                    raise PlanError("flood", f"{len(self.tables)} path tables with active plans; "
                                             "register fewer datasets")
                if fids.size > self.max_table_paths:
                    raise PlanError("oversize", f"a table of {fids.size} paths exceeds {self.max_table_paths}")
                handle = os.urandom(8)
                self.tables[handle] = _Table(fids, now)
                return handle, int(fids.size)
            t = self.tables.get(bytes(handle))
            if t is None:
                raise PlanError("unknown_handle", f"no path table {bytes(handle).hex()}")
            if t.size + fids.size > self.max_table_paths:
                raise PlanError("oversize", f"a table of {t.size + fids.size} paths exceeds "
                                            f"{self.max_table_paths}")
            t.append(fids)
            t.last_used = now
            return bytes(handle), t.size

    def _drop_idle_table(self) -> bool:
        busy = {k[0] for k in self.plans}
        idle = [(t.last_used, h) for h, t in self.tables.items() if h not in busy]
        if not idle:
            return False
        del self.tables[min(idle)[1]]
        return True

    # -- plans -------------------------------------------------------------------------------------
    def announce(self, handle: bytes, stream: int, first_epoch: int, segments: Sequence[int],
                 ids: np.ndarray, window: int = 0, job: Optional[Tuple[int, int]] = None) -> Plan:
        """Install the order of epochs ``first_epoch, first_epoch + 1, ...`` for stream ``(handle, stream)``.

        Args:
            segments: positions per epoch (ints), summing to ``len(ids)``.
            ids: table indices (uint32, shape (L,)), in plan order.
            window: the client's matching window (0: the registry's default); the larger of the two is used.
            job: the announcing process as it says it, ``(pid, start time)`` (docs/protocol.md), or None.
                Checked against ``/proc``: if this daemon sees no process with that pid and start time
                (another pid namespace, a process gone), the plan gets no owner and follows every open.

        If the stream's current plan holds ``first_epoch`` with the same order, that epoch keeps its
        consumption (a lookahead announced before is confirmed); epochs before it are dropped.

        The plan, and the tiers' structures for the new set of plans (:attr:`preparers`), are built
        without the lock; under it, the new plan is swapped in with what was consumed meanwhile (a few
        milliseconds at most, whatever the plan's length: :attr:`install_hold_s`).

        Raises:
            PlanError: ``unknown_handle``, ``unknown_path`` (an index beyond the table), ``flood`` (too many
                streams, or announcements faster than the stream's token bucket).
        """
        ids = np.asarray(ids)
        key = (bytes(handle), int(stream))
        top = int(ids.max()) if ids.size else -1
        fresh_gil()
        with self.lock:  # the checks and a snapshot of the table: O(1)
            now = self.clock()
            t = self.tables.get(key[0])
            if t is None:
                raise PlanError("unknown_handle", f"no path table {key[0].hex()}")
            if top >= t.size:
                raise PlanError("unknown_path", f"plan index {top} beyond the table's {t.size} paths")
            self._check_room(key, now)
            tokens, last = self._buckets.get(key, (self.announce_burst, now))
            tokens = min(self.announce_burst, tokens + (now - last) * self.announce_rate)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                raise PlanError("flood", f"stream {stream} announces faster than {self.announce_rate:g} plans/s")
            self._buckets[key] = (tokens - 1.0, now)
            t.last_used = now
            chunks = t.chunks
        owner = None
        if job is not None:
            start = proc_start_time(job[0]) if job[0] > 0 else None
            if start is not None and start == int(job[1]):
                owner = JobKey(int(job[0]), int(job[1]))
            else:
                log.info("plan of stream %d: no process %d started at %d here (another pid namespace?): it "
                         "follows every open", key[1], job[0], job[1])
        flat = _Table.flat(chunks)
        fids = flat[ids.astype(np.int64, copy=False)]
        segs = [(int(first_epoch) + i, int(n)) for i, n in enumerate(segments)]
        plan = Plan(key, fids, segs, self.num_files, max(self.window, int(window)), now, owner)
        plan.alias = self.aliases
        with self._installing:  # one announcement prepares and installs at a time (not the cache lock)
            return self._install(plan, key, t, chunks, flat, int(first_epoch))

    def _install(self, plan: Plan, key: Tuple[bytes, int], t: "_Table", chunks: list, flat: np.ndarray,
                 first_epoch: int) -> Plan:
        """Prepare the tiers for ``plan`` and swap it in (under :attr:`_installing`): a few tries when a
        plan ends meanwhile; the last installs without preparations (the next search rebuilds).

        When ``plan`` confirms the stream's current epoch (same order), what the current plan consumed of
        it is carried over without the lock: everything up to the start, then what its journal
        (:attr:`Plan.journal`) recorded during the preparation, whose files the watchers hear of before
        the swap (a few hundred per hold of the lock; the preparations track them, so the tiers re-key them
        at their next search); the swap carries only the journal's last few positions, in plain Python
        (no numpy under the lock)."""
        for attempt in range(3):
            fresh_gil()
            with self.lock:
                old = self.plans.get(key)
                current = list(self.plans.values())
                version = self.version
                if t.chunks is chunks and len(chunks) > 1:
                    t.chunks = [flat]  # the next announcement finds it flat
                if old is not None and old.segment_of(first_epoch) is not None:
                    old.journal = []  # what it consumes from now on (it may be confirmed)
            journaled = old if old is not None and old.journal is not None else None
            try:
                seg = old.segment_of(first_epoch) if old is not None else None
                n = plan.segments[0][1] if plan.segments else 0
                same = (seg is not None and seg[1] == n
                        and np.array_equal(old.ids[seg[0]:seg[0] + n], plan.ids[:n]))
                if same:  # what old consumed of that epoch so far, off the lock; later ones are in its journal
                    carry(old, plan, seg[0], 0, n)
                prospective = [plan if p.key == key else p for p in current] + ([] if old is not None else [plan])
                installs = [] if attempt == 2 else [prep(prospective) for prep in self.preparers]
                moved: List[int] = []
                for _ in range(3 if same else 0):  # what old consumed during the preparation, off the lock
                    fresh_gil()
                    with self.lock:
                        done, old.journal = old.journal, []
                    carried = carry_positions(old, plan, seg[0], n, done)
                    if installs:  # the tiers' preparations track them: re-keyed after the install
                        self._notify(plan, carried)
                    else:
                        moved += carried
                    if len(done) <= 64:
                        break
                fresh_gil()
                with self.lock:
                    t0 = time.perf_counter()
                    rest = None
                    if journaled is not None:
                        rest, journaled.journal = journaled.journal, None
                    if self.version != version and attempt < 2:
                        replaced = [install(-1) for install in installs]  # (the set differs: ends the tracking)
                        continue  # the set of plans changed meanwhile (a plan ended): prepare again
                    self._check_room(key, self.clock())
                    if same and rest is not None and self.plans.get(key) is old:
                        moved += carry_rest(old, plan, seg[0], n, rest)
                    old = self.plans.get(key)
                    if old is not None:
                        if not same:
                            plan.stride = old.stride  # the stream's speed so far
                        self._end(old, "replaced")
                    plan.moved = self._moved
                    self.plans[key] = plan
                    self._changed()
                    self.announced += 1
                    replaced = [install(self.version) for install in installs]  # freed after the lock
                    if installs and all(r is not None for r in replaced) or not self.preparers:
                        self._installed_version = self.version
                    for fid in moved:
                        self._moved(plan, fid)
                    self.install_hold_s.append(time.perf_counter() - t0)
                    if len(self.install_hold_s) > 4096:
                        del self.install_hold_s[:2048]
                del replaced
                return plan
            finally:
                if journaled is not None:
                    journaled.journal = None  # (an error on the way: it journals no more)
        raise AssertionError("unreachable")  # pragma: no cover

    def _check_room(self, key: Tuple[bytes, int], now: float) -> None:
        if key not in self.plans and len(self.plans) >= self.max_plans:
            self._expire(now)
            if len(self.plans) >= self.max_plans:
                raise PlanError("flood", f"{len(self.plans)} active plans; the limit is {self.max_plans}")

    def _notify(self, plan: Plan, fids: List[int], chunk: int = 256) -> None:
        """Tell the watchers that ``fids``' next uses moved later, ``chunk`` files per hold of the lock."""
        for i in range(0, len(fids), chunk):
            fresh_gil()
            with self.lock:
                for fid in fids[i:i + chunk]:
                    self._moved(plan, fid)

    def _changed(self) -> None:
        """The set of plans changed: bump the version, re-index the plans by owner, wake the installer."""
        self.version += 1
        if self._installer is not None:
            self._install_due.set()
        owners: Dict[int, List[Plan]] = {}
        free: List[Plan] = []
        for plan in self.plans.values():
            if plan.owner is None:
                free.append(plan)
            else:
                owners.setdefault(plan.owner.pid, []).append(plan)
        self._owners, self._free, self._owned = owners, free, bool(owners)

    def _job_of(self, pid: int, now: float) -> int:
        """The owner pid of the plans whose job opener ``pid`` belongs to (itself or an ancestor), or 0."""
        e = self._jobs.get(pid)
        if e is not None and e[0] >= now:
            if e[2] == self.version:
                return e[3]
            expires, anc = e[0], e[1]
        else:
            expires, anc = now + self.job_ttl_s, ancestry(pid) if pid > 0 else ()
            if len(self._jobs) >= 4096:
                self._jobs.clear()
        owners = self._owners
        owner = next((p for p in anc if p in owners), 0)
        self._jobs[pid] = (expires, anc, self.version, owner)
        return owner

    def observe(self, fid: int, opener: Optional[int] = None) -> int:
        """Follow one open of ``fid`` by process ``opener`` (the FUSE request's pid) in the plans of the
        opener's job; retire plans that stopped matching.

        The opener's job: the owner of a plan (:class:`JobKey`) that is the opener or one of its ancestors.
        Plans without an owner follow every open; a plan with one follows only its job's opens, so another
        job's opens and a reader of no plan (an evaluation loop, ``cp``) move no cursor of it. An opener
        nobody named (None) is followed by every plan.

        Returns the number of plans whose position it consumed. Caller holds :attr:`lock`.
        """
        if self.on_open is not None:
            self.on_open(fid)
        if not self.plans:
            if self._scans:  # the scans followed while plans were active go on being followed
                pid = opener
                if pid is not None and 0 <= fid < self.num_files:
                    self._scanned(pid, fid, self.clock(), create=False)
            return 0
        self._opens += 1
        if self._opens - self._opens_mark >= STRIDE_PERIOD:
            self._measure_strides()
        now = self.clock()
        plans = self.plans.values()
        if self._owned:
            pid = opener
            if pid is not None:
                owner = self._job_of(pid, now)
                if owner:
                    plans = self._owners[owner] + self._free
                else:
                    self.foreign_opens += 1
                    plans = self._free
                    if self.spent_watchers and 0 <= fid < self.num_files:
                        self._scanned(pid, fid, now)
        matched = 0
        ended = None
        for plan in plans:
            r = plan.observe(fid, now)
            if r:
                matched += 1
                if plan.finished:
                    ended = (ended or []) + [(plan, "finished")]
            elif r is False:
                self.unmatched_opens += 1
            if r is not None and plan.stopped_matching(self.unmatched_limit):
                ended = (ended or []) + [(plan, "most opens of its files did not match it")]
        self.matched_opens += matched
        if ended:
            for plan, why in ended:
                self._remove(plan, why)
        return matched

    def _measure_strides(self) -> None:
        """Each active plan's stride: the mount's opens per position it consumed over the last period. A
        plan that consumed nothing (its job has not started yet, or pauses between epochs) gets its stride
        doubled for each such period, so the files of a plan whose reader has not come count as far away
        after a few periods, while a short pause (a DataLoader starting its workers) changes little; at
        most 4096 opens per position."""
        opens = self._opens - self._opens_mark
        self._opens_mark = self._opens
        for plan in self.plans.values():
            done = plan.matched + plan.skipped - plan._matched_mark
            plan._matched_mark = plan.matched + plan.skipped
            stride = STRIDE_ONE * opens // done if done > 0 else 2 * plan.stride
            plan.stride = max(STRIDE_ONE, min(STRIDE_ONE * 4096, stride))

    def expire(self) -> None:
        """Retire plans without a match for ``idle_s`` seconds. Caller holds :attr:`lock`."""
        self._expire(self.clock())

    def _scanned(self, pid: int, fid: int, now: float, create: bool = True) -> None:
        """An open of ``fid`` by ``pid``, a process of no plan's job: follow it as a scan (a new one only
        if ``create``). A scan reads distinct files; a repeat starts its next pass. Once every scan
        followed has read ``fid``, the watchers hear that it is spent. Scans without an open for
        ``idle_s`` are forgotten."""
        e = self._jobs.get(pid)
        proc = e[1][0] if e is not None and e[1] else pid
        scan = self._scans.get(proc)
        if scan is None:
            idle = [k for k, sc in self._scans.items() if now - sc.last > self.idle_s]
            for k in idle:
                del self._scans[k]
            if idle:
                self._spent_reset()
            if not create or len(self._scans) >= self.max_scans:
                return
            scan = self._scans[proc] = _Scan(self.num_files, now)
            self._spent_reset()  # a new reader: what the others read may be read again
        scan.last = now
        if scan.seen[fid]:
            scan.seen.obj.fill(0)  # a repeat: its next pass (or not a scan at all); forget what it read
            self._spent_reset()
        scan.seen[fid] = 1
        if self.spent(fid):
            for cb in self.spent_watchers:
                cb(fid)

    def _spent_reset(self) -> None:
        for cb in self.spent_watchers:
            cb(None)

    def spent(self, fid: int) -> bool:
        """Whether every reader of no plan followed as a scan has read ``fid`` (False without any)."""
        if not self._scans or not 0 <= fid < self.num_files:
            return False
        return all(sc.seen[fid] for sc in self._scans.values())

    def _expire(self, now: float) -> None:
        for plan in [p for p in self.plans.values() if now - p.last_match > self.idle_s]:
            self._remove(plan, f"no open matched it for {now - plan.last_match:.0f} s")

    def _moved(self, plan: Plan, fid: int) -> None:
        if self.watchers:
            item = (plan, fid)
            for cb in self.watchers:
                cb(item)
            if self.aliases is not None:  # the file's chunks: their next use is the file's
                for cid in self.aliases.alias_ids(fid):
                    item = (plan, cid)
                    for cb in self.watchers:
                        cb(item)

    def _remove(self, plan: Plan, why: str) -> None:
        if self.plans.get(plan.key) is plan:
            del self.plans[plan.key]
            self._changed()
        self._end(plan, why)

    def _end(self, plan: Plan, why: str) -> None:
        if why == "finished":
            self.finished += 1
        elif why == "withdrawn":
            self.withdrawn += 1
        elif why != "replaced":
            self.retired += 1
            log.warning("retired %s: %s", plan.describe(), why)  # once per plan: it is gone now
        for cb in self.listeners:
            cb(plan, why)

    def withdraw(self, handle: bytes, stream: int) -> Optional[Plan]:
        """End stream ``(handle, stream)``'s plan now: the job is done with it (``withdraw``). Listeners see
        it end as ``"withdrawn"`` (the prefetcher counts its window entries as wasted). Takes :attr:`lock`.

        Returns:
            the plan dropped, or None when the registry holds none for that stream (it finished or was
            retired before, or was never announced): nothing changes then.
        """
        with self.lock:
            plan = self.plans.get((bytes(handle), int(stream)))
            if plan is not None:
                self._remove(plan, "withdrawn")
            return plan

    def retire_all(self, why: str = "unmounted") -> None:
        for plan in list(self.plans.values()):
            self._remove(plan, why)

    # -- queries (Belady on the plan, the prefetcher) ---------------------------------------------
    def active(self) -> List[Plan]:
        return list(self.plans.values())

    def distances(self, fids: np.ndarray) -> np.ndarray:
        """Per file, positions to its nearest next planned use over all plans (int64);
        :data:`NOT_PLANNED` where no plan names it again."""
        fids = np.asarray(fids, dtype=np.int64)
        out = np.full(fids.shape, NOT_PLANNED, dtype=np.int64)
        for plan in self.plans.values():
            np.minimum(out, plan.distances(fids), out=out)
        return out

    def distance(self, fid: int) -> int:
        best = NOT_PLANNED
        for plan in self.plans.values():
            p = plan.next_position(fid)
            if p is not None and ((p - plan.pos) * plan.stride >> STRIDE_SHIFT) < best:
                best = ((p - plan.pos) * plan.stride >> STRIDE_SHIFT)
        return best

    def counters(self) -> dict:
        return {"plans_active": len(self.plans), "plans_retired": self.retired,
                "plans_finished": self.finished, "plans_withdrawn": self.withdrawn,
                "plans_announced": self.announced, "plans_matched": self.matched_opens, "plans_unmatched": self.unmatched_opens, "plans_foreign_opens": self.foreign_opens,
                "tables": len(self.tables)}
