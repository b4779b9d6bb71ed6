"""The daemon's working set outside the tiers: pins of RAM buffers that open handles hold, the bytes held
outside every tier (:data:`LOOSE_BUFFERS`), and RAM victims on their way out (moving to the disk tier, or
dropped)."""
from __future__ import annotations

from typing import List, Optional

from .counters import Outcome
from .handle import Handle
from .movers import Victim
from .state import PIN_DYING, PIN_LOOSE, PIN_TIER, Pin

# bytes the daemon may hold outside every tier (its bounded working set): buffers open handles keep that
# no tier holds (a shared-tier read no node tier kept, a prefetch no tier admitted, a fill whose disk write
# failed, a RAM victim evicted while held open) and RAM victims on their way to the disk tier. An open
# beyond it is served by ranges from the backend; a demotion beyond it is skipped (the victim is dropped)
LOOSE_BUFFERS = 64 << 20


class WorkingSet:
    """Pins and the daemon's working set (mixed into :class:`~shadefs.cache.core.TieredCache`): RAM buffers
    held by open handles (:class:`~shadefs.cache.state.Pin`), handed back lock-free and applied by the next
    critical section (:meth:`_settle`); bytes held outside the tiers (loose, at most :data:`LOOSE_BUFFERS`);
    RAM victims leaving the tier (:meth:`_evict_ram`)."""

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
