"""The prefetcher: reads ahead of each plan's cursor, in plan order, into a bounded RAM window.

With a plan announced (:mod:`shadefs.plan.plans`), ``concurrency`` threads walk each plan from its cursor
forward and read the files the reader will open next that no tier holds, many at once, so a
latency-bound reader becomes bandwidth-bound (NoPFS, SC '21; docs/architecture.md, "Plans"). A fetched file waits in the
**window** (``--prefetch-window`` bytes, fetched-but-not-yet-opened bytes and in-flight prefetches
together never exceed it) until its open takes it: the open is then counted ``prefetch.ready``, or
``prefetch.late`` if it had to wait for the read to finish (with the wait in seconds). The open then offers
the bytes to the tiers exactly as a miss would, so the tiers' decisions (Belady on the plan,
:mod:`shadefs.plan.policy`) are the same with and without prefetching, and the prefetcher never evicts
anything: a window entry only leaves by being opened (its one use) or as waste.

Single-flight with the read path: each read goes through the cache's one read-ahead entry point,
:meth:`TieredCache.prefetch(fid, hold=...) <shadefs.cache.core.TieredCache.prefetch>`, which registers it
in the cache's in-flight table, so an open of a file being prefetched waits for that read and never starts
another; a file an open is already reading is skipped. With a shared tier the read asks the
group first: a file the group holds is prefetched from it (``shared_bytes``), not from the backend. A
prefetch whose read fails (after the backend's own retries) is logged at a bounded rate and dropped: the
open that wanted it reads the file itself and is counted a miss. Several plans share the window fairly
(each may hold ``window / active plans`` bytes). Across an epoch boundary it reads only the next
epoch's first :attr:`Prefetcher.BOUNDARY_OPENS` positions until the cursor enters that epoch: enough to
take the cold burst off the epoch's start, and no more bytes than that if the epoch never runs.

**The kernel's pages.** With the kernel cache on, the kernel keeps the pages of files read through the
mount between opens (the mount is a snapshot: ``Handle.keep_pages``) for as long as the *reader's* memory
lets it: a memory cgroup, other jobs or the reader itself (``POSIX_FADV_DONTNEED``) decide, not the
daemon. So nothing is assumed; it is observed. Each file has a page state (:attr:`Prefetcher.pages`, one
byte): never opened through the mount (the kernel holds none of its pages: prefetched without asking),
opened (asked before a prefetch), left to the kernel, or dropped. Before prefetching a file opened
before, the prefetcher asks the front end's :attr:`Prefetcher.page_probe` (the kernel front end's
``FUSE_NOTIFY_RETRIEVE`` of its first and last page, :meth:`KernelFrontend.pages_held
<shadefs.fuse.kernel.KernelFrontend.pages_held>`): if the kernel returns both, the file is **left to the
kernel**: not prefetched, and its next open fills no tier (:meth:`Prefetcher.kernel_holds`, asked by the
cache) and keeps the pages, so it costs the backend nothing while they serve it; otherwise it is
prefetched and its open fills the tiers as a miss would. A READ that reaches the daemon for a file left to
the kernel is the other observation: the kernel no longer had those pages (counted ``kernel_reads``; the
READ is served by ranges from the backend), and the file is **dropped**: its next planned use is
prefetched without asking. A file whose open is under way or not yet released (:attr:`Prefetcher.page_open`)
is asked about once it is released: its reader may still be reading it into the pages. A planned open that
no prefetch served (the file was resident when the scan passed it, evicted before its open) asks at the
open (:meth:`Prefetcher.ask_at_open`, on the front end's worker). Without a probe (the libfuse front end,
``--no-kernel-cache``), every planned file no tier holds is prefetched.

``wasted_bytes`` counts prefetched bytes that left the window without being opened (their plan was
retired, replaced or finished, or the cursor passed them). Threads start with :meth:`Prefetcher.start`
(from FUSE ``init()``, like every daemon thread).
"""
from __future__ import annotations

import logging
import math
import threading

import numpy as np
import time
from typing import Callable, Dict, List, Optional, Tuple

from ..backends.timeout import on_deadline
from ..cache.core import PrefetchFuture  # noqa: F401  (re-exported: the in-flight table's entry)
from ..logutil import RateLimitedLog
from ..procutil import name_thread

__all__ = ["Prefetcher", "PrefetchFuture", "PAGES_UNSEEN", "PAGES_SEEN", "PAGES_LEFT", "PAGES_DROPPED",
           "PAGES_ASKED"]

log = logging.getLogger("shadefs.prefetch")

# a file's page state (Prefetcher.pages; module docstring, "The kernel's pages")
PAGES_UNSEEN = 0   # never opened through the mount: the kernel holds none of its pages
PAGES_SEEN = 1     # opened: the kernel may hold its pages; asked before a prefetch
PAGES_LEFT = 2     # the kernel returned its first and last page: not prefetched; its next open fills no tier
PAGES_DROPPED = 3  # a READ of an open left to the kernel reached the daemon: prefetched without asking
PAGES_ASKED = 4    # asked at an open that found it in no tier and not prefetched: not held, that open reads it


def _nobody_waits(err: BaseException) -> None:
    # the deadline handler of a prefetch thread's reads: no request waits on the thread itself
    pass


class Prefetcher:
    """Prefetch ahead of the plans of one cache.

    Args:
        cache: the :class:`~shadefs.cache.core.TieredCache` (its lock, in-flight table, tiers, backend).
        plans: the :class:`~shadefs.plan.plans.PlanRegistry` (sharing the cache's lock).
        window_bytes: the window (bytes); 0 disables prefetching.
        concurrency: backend reads in flight at most (threads; fewer claim reads while the source answers
            fast: :meth:`_read_took`).
        page_probe: ``probe(fid) -> True | False | None``, whether the kernel holds the file's pages now
            (True: its first and last page; None: cannot tell, prefetched); None: never asked, every
            planned file is prefetched. Settable before :meth:`start` (the kernel front end sets it at
            INIT). Module docstring, "The kernel's pages".
        page_open: ``open_now(fid) -> bool``, whether an open of the file is not yet released (its reader
            may still be reading it into the kernel's pages: the prefetcher asks about it once it is); None:
            never. Settable like ``page_probe``.
    """

    #: positions of a plan's next epoch read ahead while its cursor is still in the one before: the
    #: DataLoader's first burst after an epoch boundary (W x prefetch_factor x batch size; ~800 opens,
    #: docs/performance.md), not the whole epoch, which may never run (the job stops after this one)
    BOUNDARY_OPENS = 800
    #: seconds between looks while the scan waits for an open of a file to be released (``page_open``)
    OPEN_POLL_S = 0.005
    #: threads that claim reads while the source is fast; the others wait apart (no wake-up per freed slot)
    MIN_ACTIVE = 2
    #: a read's wall time per claiming thread: ceil(the reads' moving average / this) threads claim, at least
    #: MIN_ACTIVE, at most ``concurrency`` (a fast local source: 2, a 5 ms object store: 10, 16 ms: 32)
    READ_S_PER_THREAD = 0.0005

    def __init__(self, cache, plans, window_bytes: int, concurrency: int = 32,
                 boundary_opens: Optional[int] = None,
                 page_probe: Optional[Callable[[int], Optional[bool]]] = None,
                 page_open: Optional[Callable[[int], bool]] = None):
        self.cache = cache
        self.plans = plans
        self.window_bytes = int(window_bytes)
        self.concurrency = int(concurrency)
        self.boundary_opens = int(self.BOUNDARY_OPENS if boundary_opens is None else boundary_opens)
        self.cond = threading.Condition(cache.lock)
        self.active = min(self.concurrency, self.MIN_ACTIVE)   # threads 0..active-1 claim reads
        self._parked = threading.Condition(cache.lock)          # where the others wait
        self._read_s = -1.0  # moving average of a read's wall time, seconds (< 0: none yet)
        self.staged: Dict[int, Tuple[bytes, tuple]] = {}     # fid -> (data, owner plan key)
        self.from_shared: set = set()                        # staged files read from the group, not the backend
        self.shared_bytes = 0                                # bytes prefetched from the group's shared tier
        self.pending: Dict[int, Tuple[int, tuple]] = {}      # fid -> (bytes, owner plan key), in flight
        self.owned: Dict[tuple, int] = {}                    # plan key -> bytes staged or in flight
        self.reserved_bytes = 0
        self.peak_bytes = 0
        self.ready = 0
        self.late = 0
        self.late_wait_s = 0.0
        self.fetched_bytes = 0
        self.wasted_bytes = 0
        self.errors = 0
        self._rr = 0
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self._log_error = RateLimitedLog(log, 10.0)
        self.page_probe = page_probe
        self.page_open = page_open
        self.pages = np.zeros(plans.num_files, dtype=np.uint8)  # per file: PAGES_* (module docstring)
        self._settling = False   # the last scan stopped at a file whose open may still be reading it
        self.probed = 0          # planned files whose pages the prefetcher asked the kernel about
        self.kernel_kept = 0     # ... that the kernel held: left to it, not prefetched
        self.kernel_reads = 0    # READs that reached the daemon for a file left to the kernel (pages gone)
        plans.on_open = self._opened
        plans.listeners.append(self._plan_ended)

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the reader threads (none when the window or the concurrency is 0)."""
        if self._threads or self.window_bytes <= 0:
            return
        self._stop.clear()
        for i in range(self.concurrency):
            t = threading.Thread(target=self._run, args=(i,), name=f"shadefs-prefetch-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads (in-flight reads finish or are abandoned after ``timeout``). Idempotent."""
        self._stop.set()
        with self.cond:
            self.cond.notify_all()
            self._parked.notify_all()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._threads = []

    def wake(self) -> None:
        """Something changed (a plan arrived, an open took a file): let idle threads look again."""
        with self.cond:
            self.cond.notify_all()

    # -- the read path's side (caller holds the cache lock) ------------------------------------------
    def take(self, fid: int) -> Optional[Tuple[bytes, str]]:
        """Hand a completed prefetch of ``fid`` to its open (``ready``): ``(bytes, source)`` (``"miss"``:
        read from the backend, ``"shared"``: from the group), or None. Caller holds the lock."""
        item = self.staged.pop(fid, None)
        if item is None:
            return None
        source = "shared" if fid in self.from_shared else "miss"
        self.from_shared.discard(fid)
        self._release(len(item[0]), item[1])
        self.ready += 1
        self.cond.notify()  # one slot of the window freed: one reader thread, not all of them
        return item[0], source

    def took_late(self, fid: int, waited_s: float) -> None:
        """An open waited ``waited_s`` seconds for the in-flight prefetch of ``fid`` and got its bytes."""
        item = self.staged.pop(fid, None)
        self.from_shared.discard(fid)
        if item is not None:
            self._release(len(item[0]), item[1])
        self.count_late(waited_s)
        self.cond.notify()

    def count_late(self, waited_s: float) -> None:
        """Count one ``late`` open that waited ``waited_s`` seconds for a prefetch of its file: for its read
        (:meth:`took_late`), or for the admission to the tiers of the bytes another open took from the
        window (it joined that open's fill). Caller holds the lock."""
        self.late += 1
        self.late_wait_s += waited_s

    def _release(self, size: int, owner: tuple) -> None:
        self.reserved_bytes -= size
        left = self.owned.get(owner, 0) - size
        if left > 0:
            self.owned[owner] = left
        else:
            self.owned.pop(owner, None)

    def _opened(self, fid: int) -> None:
        # under the lock, every counted open (after the cache asked kernel_holds): its pages may be kept
        # now; a file dropped keeps that state until its next planned use is prefetched without asking
        if fid < len(self.pages) and self.pages[fid] != PAGES_DROPPED:
            self.pages[fid] = PAGES_SEEN

    def kernel_holds(self, fid: int) -> bool:
        """Whether ``fid`` is left to the kernel's pages: the kernel returned its first and last page when
        the prefetcher asked (module docstring): its open fills no tier and reads nothing now. Caller
        holds the lock."""
        return fid < len(self.pages) and self.pages[fid] == PAGES_LEFT

    def ask_at_open(self, fid: int) -> bool:
        """Whether an open of ``fid`` that finds it in no tier and not prefetched asks the kernel first
        (:meth:`ask`): a plan is active, a page probe exists, the file was opened before and not asked
        about since (a planned file resident when the scan passed it, evicted before its open). Caller
        holds the lock."""
        return (self.page_probe is not None and fid < len(self.pages) and self.pages[fid] == PAGES_SEEN
                and bool(self.plans.plans))

    def ask(self, fid: int) -> None:
        """For an open (:meth:`ask_at_open`), outside the lock: ask the kernel for ``fid``'s pages; held,
        the file is left to them (the open streams it, filling no tier), else the open reads it."""
        try:
            held = self.page_probe(fid)
        except Exception:  # never fails an open: it reads the file
            held = None
        with self.cond:
            self.probed += 1
            if self.pages[fid] == PAGES_SEEN:
                if held:
                    self.pages[fid] = PAGES_LEFT
                    self.kernel_kept += 1
                else:
                    self.pages[fid] = PAGES_ASKED

    def pages_missed(self, fid: int) -> None:
        """A READ of an open left to the kernel reached the daemon: the kernel no longer had those pages.
        Counted (``kernel_reads``); the file's next planned use is prefetched without asking. Caller
        holds the lock."""
        self.kernel_reads += 1
        self.pages[fid] = PAGES_DROPPED

    # -- choosing what to read -------------------------------------------------------------------------
    def _claim(self) -> Optional[Tuple[int, int, tuple, bool]]:
        """The next file to prefetch, reserved in the window (its read is registered in flight by
        :meth:`_fetch`, through the cache), as ``(fid, size, plan key, ask the kernel first)``; or None.
        Caller holds the lock."""
        plans = self.plans.active()
        if not plans or self.window_bytes <= 0:
            return None
        cache = self.cache
        ns = cache.ns
        share = max(1, self.window_bytes // len(plans))
        n = len(plans)
        self._rr = (self._rr + 1) % n
        for k in range(n):
            plan = plans[(self._rr + k) % n]
            owned = self.owned.get(plan.key, 0)
            q = max(plan.prefetch_pos, plan.pos)
            # the epoch the cursor is in, and only the first burst of the next one
            L = min(len(plan), plan.segment_end(plan.pos) + self.boundary_opens)
            ids, consumed = plan.ids, plan.consumed
            while q < L:
                if consumed[q]:
                    q += 1
                    continue
                fid = int(ids[q])
                if fid in self.staged or fid in self.pending:
                    if plan.next_position(fid) != q:
                        # staged (or in flight) for an earlier use: that copy serves that open; this later
                        # use needs a read of its own once it is taken, so the scan waits here instead of
                        # passing over it (passing left a repeated epoch without any prefetch)
                        break
                    q += 1
                    continue
                if not cache.fetchable(fid):
                    q += 1
                    continue
                state = self.pages[fid]
                if state == PAGES_LEFT:
                    # left to the kernel for an earlier use: the scan waits for that open, as for a staged copy
                    if plan.next_position(fid) != q:
                        break
                    q += 1
                    continue
                if state == PAGES_ASKED:
                    state = PAGES_SEEN  # its open (under way, or failed) asked: ask again once it is released
                if state == PAGES_SEEN and self.page_open is not None and self.page_open(fid):
                    # an open of it may still be reading it into the kernel's pages: ask once it is
                    # released (the threads look again within OPEN_POLL_S, no open wakes them for it)
                    self._settling = True
                    break
                size = int(ns.size(fid))
                if size > self.window_bytes or size > cache.stream_threshold:
                    q += 1  # never fits the window: its open reads it
                    continue
                if self.reserved_bytes + size > self.window_bytes or (owned and owned + size > share):
                    break  # window (or this plan's share) full: wait for opens to take files
                plan.prefetch_pos = q + 1
                self.pending[fid] = (size, plan.key)
                self.reserved_bytes += size
                self.owned[plan.key] = owned + size
                self.peak_bytes = max(self.peak_bytes, self.reserved_bytes)
                if state == PAGES_DROPPED:
                    self.pages[fid] = PAGES_SEEN  # prefetched without asking, this once
                return fid, size, plan.key, state == PAGES_SEEN and self.page_probe is not None
            plan.prefetch_pos = q
        return None

    def _wanted(self, fid: int, owner: tuple) -> bool:
        """Whether a just-fetched file is still ahead of a live plan's cursor (not consumed)."""
        plan = self.plans.plans.get(owner)
        if plan is None:
            return False
        return plan.next_position(fid) is not None

    # -- reading ---------------------------------------------------------------------------------------
    def _run(self, index: int = 0) -> None:
        name_thread()
        while not self._stop.is_set():
            with self.cond:
                if index >= self.active:  # not needed while the source is fast: wait apart (_read_took)
                    self._parked.wait(0.5)
                    continue
                self._settling = False
                job = self._claim()
                if job is None:
                    self.plans.expire()
                    self.cond.wait(self.OPEN_POLL_S if self._settling else 0.5)
                    continue
            self._fetch(*job)

    def step(self) -> bool:
        """Run one prefetch on the calling thread (tests, the simulator); returns whether there was one."""
        with self.cond:
            job = self._claim()
        if job is None:
            return False
        self._fetch(*job)
        return True

    def _fetch(self, fid: int, size: int, owner: tuple, probe: bool = False) -> None:
        """Read the claimed ``fid`` through :meth:`TieredCache.prefetch` into the window (outside the lock);
        with ``probe``, first ask the kernel whether it holds the file's pages (then it is left to them)."""
        if probe:
            try:
                held = self.page_probe(fid)
            except Exception:  # cannot tell: prefetch it
                held = None
            with self.cond:
                self.probed += 1
                if held:
                    if self.pages[fid] in (PAGES_SEEN, PAGES_ASKED) and self._wanted(fid, owner):
                        self.pages[fid] = PAGES_LEFT
                        self.kernel_kept += 1
                    self._unclaim(fid, size, owner)
                    return
        try:
            # the read runs on this thread under the backend's watchdog (--backend-timeout), not handed to
            # a thread of the backend's (a hand-off and two thread switches per file): nobody waits on this
            # thread, and at a deadline the opens waiting on the read are let go by the cache's handler;
            # this thread is abandoned until the read returns (then counted an error, its window bytes freed)
            t0 = time.monotonic()
            with on_deadline(_nobody_waits):
                got = self.cache.prefetch(fid, hold=lambda f, data, source: self._hold(f, data, source, owner, t0))
        except Exception as e:
            with self.cond:
                self.errors += 1
                self._unclaim(fid, size, owner)
            self._log_error(logging.WARNING, "prefetch of %s failed (its open will read it): %s",
                            self.cache.ns.path(fid), e)
            return
        if got in ("resident", "fetching"):  # an open got there between the claim and the read
            with self.cond:
                self._unclaim(fid, size, owner)

    def _read_took(self, secs: float) -> None:
        """A read ahead took ``secs`` seconds (caller holds the lock): the claiming threads follow the reads'
        moving average (over about the last 8; the first read sets it), so a slow source gets up to
        ``concurrency`` reads in flight and a fast one :attr:`MIN_ACTIVE` threads, whose wake-ups and GIL
        hand-offs cost less."""
        avg = self._read_s = secs if self._read_s < 0 else self._read_s + (secs - self._read_s) * 0.125
        want = min(self.concurrency, max(self.MIN_ACTIVE, math.ceil(avg / self.READ_S_PER_THREAD)))
        if want > self.active:
            self._parked.notify_all()  # (rare: the source slowed down) those now below want claim
        self.active = want

    def _hold(self, fid: int, data: bytes, source: str, owner: tuple, started: Optional[float] = None) -> bool:
        # under the lock, from the cache once the bytes are read (``started``: the read's monotonic start):
        # keep them in the window if still wanted
        if started is not None:
            self._read_took(time.monotonic() - started)
        size, _ = self.pending.pop(fid, (len(data), owner))
        self.fetched_bytes += size
        if source == "shared":
            self.shared_bytes += size
        if self._wanted(fid, owner):
            self.staged[fid] = (data, owner)
            if source == "shared":
                self.from_shared.add(fid)
            return True
        self._release(size, owner)
        self.wasted_bytes += size
        self.cond.notify()
        return False

    def _unclaim(self, fid: int, size: int, owner: tuple) -> None:
        # under the lock: a claimed read that did not happen gives its window bytes back
        if self.pending.pop(fid, None) is not None:
            self._release(size, owner)
            self.cond.notify()

    def _plan_ended(self, plan, why: str) -> None:
        # Called under the lock by the registry: drop what only this plan wanted.
        if why == "replaced":
            return  # the stream's new plan (same key) takes over its window entries
        for fid, (data, owner) in list(self.staged.items()):
            if owner == plan.key:
                del self.staged[fid]
                self.from_shared.discard(fid)
                self._release(len(data), owner)
                self.wasted_bytes += len(data)

    def counters(self) -> dict:
        """The ``prefetch`` object of the stats JSON (caller holds the lock)."""
        return {"ready": self.ready, "late": self.late, "late_wait_s": round(self.late_wait_s, 6),
                "fetched_bytes": self.fetched_bytes, "shared_bytes": self.shared_bytes,
                "wasted_bytes": self.wasted_bytes,
                "window_bytes": self.window_bytes, "window_used_bytes": self.reserved_bytes,
                "window_peak_bytes": self.peak_bytes, "errors": self.errors, "probed": self.probed,
                "kernel_kept": self.kernel_kept, "kernel_reads": self.kernel_reads}
