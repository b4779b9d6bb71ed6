"""The open's decision: one lookup under the cache lock decides how an open is served, the serving happens
outside it, and every open is counted under exactly one outcome (:class:`~shadefs.cache.counters.Outcome`).

A RAM hit is decided and counted in one critical section (:meth:`OpenPath.open_nowait`); anything else
is decided once (:meth:`OpenPath._decide`, a typed decision of :mod:`shadefs.cache.decision`: a disk hit,
a join of the fetch in flight, a fetch this open leads, a prefetch taken or waited for, a stream from the
backend) and served by :meth:`OpenPath._serve` (one ``match``), which may block on the backend or on
another open's read of the same file (the single-flight: :mod:`shadefs.cache.fetch`).

``opener`` (every entry point): the pid of the process whose open this is (the FUSE request's), handed to
the plans with the open (:meth:`~shadefs.plan.plans.PlanRegistry.observe`); None: unknown."""
from __future__ import annotations

import time
from typing import Optional

from .chunks import ChunkedHandle
from .counters import LATE, MISS, Outcome, PREFETCH, RAM
from .decision import ASK_KERNEL, STREAM, AskKernel, Decision, DiskHit, Join, Late, Lead, Ready, Stream
from .handle import Handle, OpenTicket
from .state import JOINER_OUTCOME, LEADER_OUTCOME, PIN_TIER, SOURCE_WINDOW, Move, Pin

# seconds an open of a file whose corrupt disk entry is being deleted waits for that delete (the mover's)
# when the tier cannot take the refill without those bytes; past it the refill is decided as things stand
UNLINK_WAIT = 5.0


class OpenPath:
    """The open's decision (mixed into :class:`~shadefs.cache.core.TieredCache`, whose state it reads): a RAM
    hit in one critical section (:meth:`open_nowait`), else a decision under the lock (:meth:`_decide`)
    served outside it (:meth:`_serve`): a disk hit, a join of the fetch in flight, a new fetch this
    open leads, a prefetch taken, or a stream from the backend. Every open is counted once, by
    :meth:`_count`."""

    def open(self, fid: int, opener: Optional[int] = None) -> Handle:
        """Open file ``fid`` for process ``opener``: count one outcome and return a :class:`Handle` serving its bytes.

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
            h = self.open_nowait(fid, True, opener)
            if h is not None:
                break
        return self.open_ticket(h) if type(h) is OpenTicket else h

    def open_nowait(self, fid: int, ticket: bool = False, opener: Optional[int] = None):
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
                return self._ram_hit(fid, data, opener)
        if self._unchecked is not None and self._unchecked[fid]:
            return None  # its record must be compared with the source first (a stat: open() does it)
        if self.chunks is not None and self.chunks.is_chunked(fid):
            return self._open_chunked(fid, opener)
        size = int(self.ns.size(fid))
        while True:
            with self.lock:
                self._settle_due()
                h = self._memory_hit(fid, size, opener)
                if h is not None:
                    return h
                if fid in self._flights or self.disk_index is None or fid not in self.disk_index:
                    if fid in self._unlinking:
                        return None  # open() waits for its corrupt entry's delete first
                    return OpenTicket(fid, size, self._decide(fid, size, opener), opener) if ticket else None
                self.disk_index.hit(fid)
                gen, csum = int(self.entries.gen[fid]), int(self.entries.csum[fid])
            h = self._disk_hit(fid, size, gen, csum, opener)
            if h is not None:
                return h

    def open_ticket(self, t: "OpenTicket") -> Handle:
        """Serve an open :meth:`open_nowait` returned a ticket for (counts one outcome; may block on the
        backend, as :meth:`open`). Raises as :meth:`open`."""
        decision, t.decision = t.decision, None
        if decision is None:
            raise ValueError(f"ticket for file {t.fid} already used")
        h = self._serve(t.fid, t.size, decision, t.opener)
        return h if h is not None else self.open(t.fid, t.opener)

    def _decide(self, fid: int, size: int, opener: Optional[int]) -> Decision:
        """Under self.lock, for an open that is no memory hit (so its file is not ``moving``): how it is
        served (:mod:`shadefs.cache.decision`): a :class:`DiskHit`, a :class:`Join` of the fetch in flight,
        a taken prefetch (:class:`Ready`, counted) or one in flight (:class:`Late`), :class:`AskKernel`
        for its pages first, a :class:`Stream` (the kernel keeps its pages, or no tier admits it), or a
        :class:`Lead` of a new fetch (its RAM victims already ``moving``), which must be served."""
        fl = self._flights.get(fid)
        if fl is not None:                           # fetching: wait for that one read
            return Join(fl)
        if self.disk_index is not None and fid in self.disk_index:
            self.disk_index.hit(fid)
            return DiskHit(int(self.entries.gen[fid]), int(self.entries.csum[fid]))
        # absent: a prefetch has it, or this open leads
        pf = self._prefetched(fid, size, opener)
        if pf is not None:
            return pf
        p = self.prefetcher
        if p is not None:
            if p.kernel_holds(fid):
                return STREAM  # the kernel keeps its pages: no tier fill, no read now
            if p.ask_at_open(fid):
                return ASK_KERNEL  # ask the kernel for its pages first
        fl, demote = self._start_fetch(fid, size, transient=True)
        return STREAM if fl is None else Lead(fl, demote)

    def _serve(self, fid: int, size: int, decision: Decision, opener: Optional[int]) -> Optional[Handle]:
        """Outside the lock: serve the open :meth:`_decide` decided (may block on the backend or on another
        open's read); None when the file moved meanwhile (nothing counted: decide again).

        Every open that returns a handle or raises is counted exactly once: a hit by :meth:`_disk_hit`, a
        prefetch taken by :meth:`_prefetched`, a wait for one here (``late``), a leader under
        :data:`LEADER_OUTCOME` of its fetch's source (even when the read fails), an open that joined a
        fetch under :data:`JOINER_OUTCOME` of it (every source maps to one outcome)."""
        match decision:
            case DiskHit(gen, csum):
                return self._disk_hit(fid, size, gen, csum, opener)  # None: dropped or moved meanwhile
            case Join(fl):
                t0 = time.monotonic()
                fl.done.wait()
                outcome = JOINER_OUTCOME[fl.source]
                with self.lock:
                    if fl.source == SOURCE_WINDOW:
                        # it joined the admission of bytes another open took from the prefetch window: it
                        # waited for a prefetch (not a miss: it shared no open's backend read)
                        self.prefetcher.count_late(time.monotonic() - t0)
                    else:
                        self.counts.joined += 1
                    self._count(fid, size, outcome, opener)
                if fl.error is not None:
                    raise fl.error
                return self._miss_handle(fid, size, fl, outcome)
            case Lead(fl, demote):
                # counted once the source is known: "shared" when the group served it, else "miss"
                try:
                    self._lead(fid, size, fl, demote)
                finally:
                    with self.lock:
                        self._count(fid, size, LEADER_OUTCOME[fl.source], opener)
                return self._miss_handle(fid, size, fl, LEADER_OUTCOME[fl.source])
            case Stream():
                return self._stream_open(fid, size, opener)
            case Ready(got):
                return self._admit_data(fid, size, *got, PREFETCH)
            case Late(future):
                t0 = time.monotonic()
                got = future.result()
                if got is None:
                    return None  # the prefetch failed: look again (nothing was counted)
                with self.lock:
                    self.prefetcher.took_late(fid, time.monotonic() - t0)
                    self._count(fid, size, LATE, opener)
                return self._admit_data(fid, size, *got, LATE)
            case AskKernel():
                self.prefetcher.ask(fid)  # outside the lock; then decide again (nothing was counted)
                return None
        raise TypeError(f"not a decision: {decision!r}")

    def _prefetched(self, fid: int, size: int, opener: Optional[int]):
        # under self.lock, for an absent file: Ready (counted "prefetch"), Late, or None
        if self.prefetcher is None:
            return None
        got = self.prefetcher.take(fid)
        if got is not None:
            self._count(fid, size, PREFETCH, opener)
            return Ready(got)
        fut = self._inflight.get(fid)
        if fut is not None and getattr(fut, "prefetch", False):
            return Late(fut)
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

    def _stream_open(self, fid: int, size: int, opener: Optional[int]) -> Handle:
        """An open of a file no tier admits: streamed from the backend by ranges; the kernel keeps its
        pages between opens (``keep_pages``), so a re-read reaches neither the daemon nor the backend."""
        with self.lock:
            # asked before the open is counted (counting marks the file opened): left to the kernel's pages
            left = self.prefetcher is not None and self.prefetcher.kernel_holds(fid)
            self._count(fid, size, MISS, opener)
            self.counts.streamed += 1
            keep = not self._stale_pages or self._pages_trusted(fid)
        h = Handle(self, fid, size, MISS, keep_pages=keep)
        h.left = left
        return h

    def _pages_trusted(self, fid: int) -> bool:
        # under self.lock: False once after fid's disk entry was dropped as corrupt
        if fid in self._stale_pages:
            self._stale_pages.discard(fid)
            return False
        return True

    def _open_chunked(self, fid: int, opener: Optional[int]) -> ChunkedHandle:
        """An open of a chunked file: counts nothing and waits for nothing (its READs open the chunk
        entries they touch, each counted as one open: shadefs.cache.chunks); plans follow the file."""
        first, count = self.chunks.span(fid)
        with self.lock:
            if self.plans is not None:
                self.plans.observe(fid, opener)
            keep = True
            if self._stale_pages:  # a chunk of it was dropped as corrupt: its pages go once
                stale = [c for c in self._stale_pages if first <= c < first + count]
                keep = not stale
                self._stale_pages.difference_update(stale)
        return ChunkedHandle(self, fid, int(self.ns.size(fid)), self.chunks, keep_pages=keep)

    def _ram_hit(self, fid: int, data: bytes, opener: Optional[int]) -> Handle:
        """Under self.lock: serve a hit of resident(ram) ``fid`` (its bytes ``data``, the RAM store's own):
        its policy told, the open counted (:meth:`_count`, as every open is), its buffer pinned; returns the
        Handle. Residency and bytes come from one lookup (the RAM store holds exactly the RAM index's files,
        both changed in the same critical sections) and the size is ``len(data)``."""
        size = len(data)
        self.ram_index.policy.on_hit(fid)
        self._count(fid, size, RAM, opener)
        rec = self._pins.get(fid)
        if rec is None:
            rec = self._pins[fid] = Pin(1, size, PIN_TIER, fid)
        else:
            rec.refs += 1
        if self._residents is not None:
            self._residents.publish(fid, data)  # its next opens are answered without the GIL
        return Handle(self, fid, size, RAM, data, None, rec)

    def _memory_hit(self, fid: int, size: int, opener: Optional[int]) -> Optional[Handle]:
        # under self.lock: resident(ram), or moving (its bytes are still in memory)
        data = self._ram_data.get(fid)
        if data is not None:
            return self._ram_hit(fid, data, opener)
        mv = self._flights.get(fid)
        if type(mv) is Move:
            # moving: served from its bytes in memory (its Pin counts them while any ref holds them); a Move
            # has nothing to wait on
            self._count(fid, size, RAM, opener)
            mv.pin.refs += 1
            return Handle(self, fid, size, RAM, data=mv.data, pin=mv.pin)
        return None

    def _count(self, fid: int, size: int, outcome: Outcome, opener: Optional[int]) -> None:
        # called with self.lock held: one open of ``fid`` counted ``outcome`` ("prefetch" / "late" are also
        # counted by the prefetcher: ready / late), and the plans and the trace told. The one place an open
        # is counted, whatever served it (a RAM hit too: _ram_hit, a moving victim's bytes); _apply_hits
        # inlines it for the hits the compiled loop answered without the GIL
        self.counts.count(outcome, size)
        if self.plans is not None and fid < self._nfiles:  # a chunk's open is its file's, counted once
            self.plans.observe(fid, opener)
        if self.trace is not None:
            self.trace.record(self.ns.path(fid), size, outcome)
