"""RAM hits answered without the GIL: the cache publishes a RAM-resident file's bytes to the compiled
loop's table (``shadefs.fuse._fastloop.Residents``), the loop answers its opens and reads and logs each
open, and the cache applies the log (counters, policy, plans, trace) in its next critical section."""
from __future__ import annotations

import logging

from ..cache.state import PIN_TIER, Pin
from ..cache.counters import RAM

log = logging.getLogger("shadefs.cache")


class _ResidentsPinned:
    """The RAM index's ``pinned`` (TierIndex.reserve) while a front end answers RAM hits without the GIL: a
    victim asked about is first retired from the front end's table (no open of it is answered there from
    then on; those still open hold its Pin), so the index sees every open handle on it, the front end's too.
    A victim of a reservation that is then refused stays resident; its next hit goes through the cache and
    publishes it again."""

    __slots__ = ("cache",)

    def __init__(self, cache):
        self.cache = cache

    def __bool__(self) -> bool:
        return True

    def __contains__(self, fid: int) -> bool:
        self.cache._retire(fid)
        return fid in self.cache._pins


class Residents:
    """RAM hits the kernel front end's compiled loop answers without the GIL (mixed into
    :class:`~shadefs.cache.core.TieredCache`): publishing residents, retiring them before an eviction
    decides on their pins, and applying the loop's hit log."""

    def attach_residents(self, residents) -> bool:
        """Let a front end answer RAM hits without the GIL (``shadefs.fuse._fastloop.Residents``; before
        serving). A RAM hit served here publishes its file's bytes to ``residents``; the front end then
        answers that file's opens and reads itself and logs each open (file id, opener pid, size), until the
        file leaves the RAM tier (:meth:`_retire`, under the lock, before an eviction decides on its pins).
        Every critical section that reads or decides on counters, pins or the policy applies the log first
        (:meth:`_settle`), and the front end has it applied every ~2 ms while its reader threads are busy,
        every 50 ms otherwise (:meth:`apply_hits`): counting is exact at every stats and metrics read.
        Returns True (this cache publishes its RAM hits)."""
        self._residents = residents
        self._hits_pending = residents.pending
        self.ram_index.pinned = _ResidentsPinned(self)
        return True

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
            # _count(fid, size, RAM, pid) per hit, inlined: the one copy of it (every RAM hit after a file's
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
            for fid, pid, size in zip(fids, pids, sizes):
                if fid in resident:  # (evicted since: its rank went with it)
                    on_hit(fid)
                if plans is not None and fid < nfiles:  # a chunk's open is its file's, counted once
                    plans.observe(fid, pid)  # the plans follow it as its opener's open
                if trace is not None:
                    trace.record(self.ns.path(fid), size, RAM)
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
