"""The open's decision: one lookup under the cache lock decides how an open is served, the serving happens
outside it, and every open is counted under exactly one outcome (:mod:`shadefs.cache.counters`).

A RAM hit is decided and counted in one critical section (:meth:`OpenPath.open_nowait`); anything else
is decided once (:meth:`OpenPath._plan_open`: a disk hit, a join of the fetch in flight, a fetch this
open leads, a prefetch taken or waited for, a stream from the backend) and served by
:meth:`OpenPath._finish_open`, which may block on the backend or on another open's read of the same file
(the single-flight: :mod:`shadefs.cache.fetch`)."""
from __future__ import annotations

import time
from typing import Optional

from .chunks import ChunkedHandle
from .handle import Handle, OpenTicket, Outcome
from .state import JOINER_OUTCOME, LEADER_OUTCOME, PIN_TIER, SOURCE_WINDOW, Move, Pin

# seconds an open of a file whose corrupt disk entry is being deleted waits for that delete (the mover's)
# when the tier cannot take the refill without those bytes; past it the refill is decided as things stand
UNLINK_WAIT = 5.0


class OpenPath:
    """The open's decision (mixed into :class:`~shadefs.cache.core.TieredCache`, whose state it reads): a RAM
    hit in one critical section (:meth:`open_nowait`), else a decision under the lock (:meth:`_plan_open`)
    served outside it (:meth:`_finish_open`): a disk hit, a join of the fetch in flight, a new fetch this
    open leads, a prefetch taken, or a stream from the backend. Every open is counted once, by
    :meth:`_count`."""

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

    def open_ticket(self, t: "OpenTicket") -> Handle:
        """Serve an open :meth:`open_nowait` returned a ticket for (counts one outcome; may block on the
        backend, as :meth:`open`). Raises as :meth:`open`."""
        plan, t.plan = t.plan, None
        if plan is None:
            raise ValueError(f"ticket for file {t.fid} already used")
        h = self._finish_open(t.fid, t.size, *plan)
        return h if h is not None else self.open(t.fid)

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

    def _pages_trusted(self, fid: int) -> bool:
        # under self.lock: False once after fid's disk entry was dropped as corrupt
        if fid in self._stale_pages:
            self._stale_pages.discard(fid)
            return False
        return True

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
