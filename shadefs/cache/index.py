"""Byte-budget accounting for one tier: which files are resident, how many bytes they, the in-flight
fills and the victims not yet deleted take, and the policy that chooses victims.

A :class:`TierIndex` holds no data; the daemon's tiers (:mod:`shadefs.cache.tiers`) move bytes, the
simulator (:mod:`shadefs.sim`) moves none, and both account through this class, so they count the same
hits and evictions. The invariant ``used_bytes + reserved_bytes + dying_bytes <= capacity_bytes`` holds
after every call, where

- ``used_bytes``: resident files;
- ``dying_bytes``: files out of the index whose bytes still exist (disk entries not yet unlinked: a
  victim of a reservation made with ``hold_victims=True``, or one :meth:`remove` d with ``dying=True``);
- ``reserved_bytes``: in-flight fills, each counted beyond the dying bytes of its own victims
  (``max(0, size - credit)``: a fill may reuse its victims' bytes only once they are gone, so the caller
  deletes them *before* it writes, and calls :meth:`release`).

So the bytes of a tier's store (entries, temporaries, victims awaiting deletion) never exceed the
capacity when the caller follows that order. Not thread-safe: the caller holds its lock.

A store whose bytes are not a file's size (the disk tier: device bytes) sets :attr:`TierIndex.charge`
(source bytes -> bytes taken), :attr:`TierIndex.overhead_bytes` (bytes of the store that no entry owns:
metadata) and :attr:`TierIndex.headroom_bytes` (bytes kept for the store's own slack: the dead records of
packed segments until compaction reclaims them, a compaction's copy). Admission counts entries only: a
packed victim frees its record's bytes for admission as a file victim does, and the store keeps its dead
bytes within the headroom (:meth:`shadefs.cache.segments.SegmentStore.make_room`), so the decisions
depend on the accesses alone, never on when a compaction ran (the simulator makes the same ones). Every
method still takes source sizes; ``used_bytes`` and the rest are then device bytes.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from ..policies.base import Policy

__all__ = ["TierIndex", "AlreadyInTier"]


class AlreadyInTier(ValueError):
    """:meth:`TierIndex.reserve` of a file that is already resident or pending in that tier (a caller bug:
    the read path's state machine never asks twice)."""


class TierIndex:
    """Residency and byte budget of one tier.

    Args:
        name: ``"ram"`` or ``"disk"`` (as in the stats).
        capacity_bytes: the budget; 0 turns the tier off.
        policy: decides admission and victims.
    """

    def __init__(self, name: str, capacity_bytes: int, policy: Policy):
        self.name = name
        self.capacity_bytes = int(capacity_bytes)
        self.policy = policy
        self.sizes: Dict[int, int] = {}       # resident fid -> bytes (the policy reads these: one per resident)
        self.pending: Dict[int, List[int]] = {}  # reserved (being filled) fid -> [bytes, credit]
        self.used_bytes = 0
        self.reserved_bytes = 0                # sum of max(0, bytes - credit) over pending fills
        self.dying_bytes = 0                   # out of the index, not yet deleted from the store
        self.evictions = 0
        self.changes = 0                       # bumped whenever the resident set changes (checkpoints)
        self.flags = None                      # optional residency array (track_residency)
        self.bit = 0
        self.order = None                      # optional commit sequence per file id (checkpoints)
        self.pinned = None                     # optional: fids whose bytes an eviction cannot free yet
        self.spill_room = None                 # optional () -> bytes pinned victims may take outside the tier
        self.spill = None                      # optional (fid, bytes): a pinned victim now held outside
        self.charge = None                     # optional source bytes -> bytes the store takes for them
        self.overhead_bytes = 0                # bytes of the store no entry owns (metadata)
        self.headroom_bytes = 0                # kept from entries for the store's slack (dead records, copies)
        self.pack_below = 0                    # the store's packing threshold (stats; the simulator's model)
        policy.share_sizes(self.sizes)

    def track_residency(self, flags: np.ndarray, bit: int, keep_order: bool = False) -> None:
        """Keep ``flags[fid] & bit`` set exactly while ``fid`` is resident here.

        ``flags`` is a numpy uint8 array over file ids (shape (num_files,)), shared by a cache's tiers
        (one bit each), so a residency query or a checkpoint reads an array instead of walking the index
        under the lock. With ``keep_order``, ``self.order[fid]`` (int64, 8 bytes per file id) also records
        when ``fid`` became resident, so a checkpoint can list entries oldest first. Files already
        resident are marked at once (in the index's order).
        """
        self.flags, self.bit = flags, int(bit)
        if keep_order:
            self.order = np.zeros(len(flags), dtype=np.int64)
        if self.sizes:
            ids = np.fromiter(self.sizes, dtype=np.int64, count=len(self.sizes))
            flags[ids] |= self.bit
            if self.order is not None:
                self.order[ids] = np.arange(1, len(ids) + 1) + self.changes
                self.changes += len(ids)

    def __contains__(self, fid: int) -> bool:
        return fid in self.sizes

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def free_bytes(self) -> int:
        """Bytes a new fill may take without victims."""
        return (self.capacity_bytes - self.used_bytes - self.reserved_bytes - self.dying_bytes
                - self.overhead_bytes - self.headroom_bytes)

    def needs_dying(self, size: int) -> bool:
        """Whether a fill of ``size`` source bytes could not fit even with every resident file evicted,
        until bytes now dying are deleted (the refill of a file whose own entry is being deleted)."""
        if self.charge is not None:
            size = self.charge(size)
        room = self.capacity_bytes - self.overhead_bytes - self.headroom_bytes
        return self.dying_bytes > 0 and size <= room and size > room - self.dying_bytes - self.reserved_bytes

    @property
    def entry_bytes(self) -> int:
        """The budget for entries: capacity less the overhead and the headroom (what the simulator is
        given to replay this tier)."""
        return max(0, self.capacity_bytes - self.overhead_bytes - self.headroom_bytes)

    def hit(self, fid: int) -> None:
        """Record a read of resident ``fid``."""
        self.policy.on_hit(fid)

    def reserve(self, fid: int, size: int, hold_victims: bool = False) -> Optional[List[int]]:
        """Ask the policy to admit ``fid`` (``size`` bytes) and reserve its bytes.

        Args:
            hold_victims: the victims' bytes stay counted (``dying_bytes``, credited to this fill) until
                :meth:`release`; for a store whose deletes happen after this call (the disk tier).

        A victim in :attr:`pinned` (the RAM tier: a buffer that open handles still hold) leaves the tier
        at once and is credited like any other victim when its bytes can be held outside the tier:
        :attr:`spill_room` (bytes, asked once per call) covers it, in eviction order, and :attr:`spill`
        ``(fid, size)`` is called for it once the reservation is made (the caller counts those bytes
        against its own bound). So the victims are exactly the policy's. A pinned victim the room does
        not cover frees nothing now: its bytes move to ``dying_bytes`` (not credited to the fill) until
        :meth:`unlinked`, and the policy is asked for more victims (up to 3 more times) to cover them.

        Returns:
            ``None`` when refused (nothing changes: the policy said no, the file is larger than the tier,
            or the policy's victims are not resident, repeated, or do not free enough bytes), else the
            victims, already removed from the index (and counted as evictions) in eviction order; the
            caller deletes or demotes their data and then calls :meth:`commit` or :meth:`abort` for ``fid``.

        Raises:
            AlreadyInTier: ``fid`` is resident or pending here (nothing changes).
        """
        if fid in self.sizes or fid in self.pending:
            raise AlreadyInTier(f"file {fid} is already {'resident' if fid in self.sizes else 'pending'} "
                                f"in the {self.name} tier")
        if self.charge is not None:
            size = self.charge(size)
        if self.capacity_bytes <= 0 or size > self.capacity_bytes - self.overhead_bytes - self.headroom_bytes:
            return None
        free = self.free_bytes
        pinned = self.pinned
        room = self.spill_room() if pinned and self.spill_room is not None else 0
        held = 0
        spilled: list = []
        for _ in range(4):  # pinned victims held in the tier free nothing: ask the policy for that much more
            victims = self.policy.victims(fid, size, free - held)
            if victims is None:
                return None
            victims = list(victims)
            if len(set(victims)) != len(victims):
                return None  # a victim named twice would be counted twice: refuse rather than overfill
            freed = was_held = out = 0
            spilled = []
            sizes = self.sizes
            for v in victims:
                if v not in sizes:
                    return None  # a policy naming a non-resident victim is a bug; refuse rather than corrupt
                n = sizes[v]
                if pinned and v in pinned:
                    if out + n <= room:      # held outside the tier (the caller's bound): credited
                        out += n
                        spilled.append((v, n))
                    else:                    # stays counted here until its last holder lets go
                        was_held += n
                else:
                    freed += n
            if free + freed + out >= size or was_held == held:
                break
            held = was_held
        if free + freed + out < size:
            return None  # the budget is enforced here, not trusted to the policy
        for v in victims:
            self._drop(v)
            self.evictions += 1
        for v, n in spilled:
            self.spill(v, n)
        credit = freed if hold_victims else 0  # (spilled bytes are not this store's: never credited)
        self.dying_bytes += credit + was_held  # pinned victims stay counted until :meth:`unlinked`
        self.pending[fid] = [size, credit]
        self.reserved_bytes += max(0, size - credit)
        return victims

    def would_admit(self, fid: int, size: int) -> bool:
        """Whether :meth:`reserve` would admit ``fid`` (``size`` bytes) now, asked without changing
        anything: the policy's answer and whether its victims free enough bytes. A pinned or deferred
        victim is counted as freeing its bytes, so a True may still be refused by :meth:`reserve`; a False
        is its answer too (for a policy whose victims free what it asks). One call of ``policy.victims``."""
        if fid in self.sizes or fid in self.pending:
            return False
        if self.charge is not None:
            size = self.charge(size)
        if self.capacity_bytes <= 0 or size > self.capacity_bytes - self.overhead_bytes - self.headroom_bytes:
            return False
        free = self.free_bytes
        victims = self.policy.victims(fid, size, free)
        if victims is None:
            return False
        sizes = self.sizes
        return free + sum(sizes.get(v, 0) for v in victims) >= size

    def release(self, fid: int) -> None:
        """The victims of ``fid``'s pending fill are deleted from the store: their bytes are free."""
        entry = self.pending.get(fid)
        if entry is None or entry[1] == 0:
            return
        size, credit = entry
        self.reserved_bytes += size - max(0, size - credit)
        self.dying_bytes -= credit
        entry[1] = 0

    def commit(self, fid: int) -> None:
        """The reserved fill of ``fid`` completed: it is now resident (its victims must be gone)."""
        self.release(fid)
        size, _ = self.pending.pop(fid)
        self.reserved_bytes -= size
        self.sizes[fid] = size
        self.used_bytes += size
        self.changes += 1
        if self.flags is not None:
            self.flags[fid] |= self.bit
            if self.order is not None:
                self.order[fid] = self.changes
        self.policy.on_insert(fid, size)

    def abort(self, fid: int) -> None:
        """The reserved fill of ``fid`` failed: release its bytes (and the credit of its victims)."""
        entry = self.pending.pop(fid, None)
        if entry is not None:
            size, credit = entry
            self.reserved_bytes -= max(0, size - credit)
            self.dying_bytes -= credit

    def admit(self, fid: int, size: int) -> Optional[List[int]]:
        """:meth:`reserve` then :meth:`commit` at once (no data to move). Returns the victims or None.

        Raises:
            AlreadyInTier: as :meth:`reserve`.
        """
        victims = self.reserve(fid, size)
        if victims is not None:
            self.commit(fid)
        return victims

    def restore(self, fids: Sequence[int], sizes: Sequence[int]) -> None:
        """Make ``fids`` resident at once, oldest first, without asking the policy for admission.

        For a restart reloading entries the policy admitted before (:mod:`shadefs.cache.persist`): the
        policy is told of each through ``on_insert`` in the given order, so order-keeping policies (LRU,
        FIFO) see them as inserted in that order. Not counted as admissions or evictions.

        Args:
            fids, sizes: Python ints (``ndarray.tolist()``), same length.

        Raises:
            ValueError: an id is repeated or already resident or pending, or the total does not fit in
                the free budget (nothing changes).
        """
        fids, sizes = list(fids), list(sizes)
        if self.charge is not None:
            sizes = [self.charge(s) for s in sizes]
        ids = set(fids)
        if len(ids) != len(fids) or len(sizes) != len(fids) or not ids.isdisjoint(self.sizes) \
                or not ids.isdisjoint(self.pending):
            raise ValueError("restore: a file id is repeated or already in the tier")
        total = sum(sizes)
        if total > self.free_bytes:
            raise ValueError(f"restore: {total} bytes do not fit in the free budget")
        self.sizes.update(zip(fids, sizes))
        self.used_bytes += total
        if self.flags is not None and fids:
            ids = np.asarray(fids, dtype=np.int64)
            self.flags[ids] |= self.bit
            if self.order is not None:
                self.order[ids] = self.changes + 1 + np.arange(len(ids))
                self.changes += len(ids)
        self.changes += 1
        if type(self.policy).on_insert is not Policy.on_insert:  # skip a million no-op calls (static)
            on_insert = self.policy.on_insert
            for fid, size in zip(fids, sizes):
                on_insert(fid, size)

    def _drop(self, fid: int) -> int:
        size = self.sizes.pop(fid)
        self.used_bytes -= size
        self.changes += 1
        if self.flags is not None:
            self.flags[fid] &= ~self.bit & 0xFF
        self.policy.on_remove(fid)
        return size

    def remove(self, fid: int, dying: bool = False) -> bool:
        """Drop resident ``fid`` (not counted as an eviction). Returns whether it was resident.

        Args:
            dying: its bytes stay counted (``dying_bytes``) until :meth:`unlinked` (a disk entry that
                is deleted after this call).
        """
        if fid not in self.sizes:
            return False
        size = self._drop(fid)
        if dying:
            self.dying_bytes += size
        return True

    def unlinked(self, nbytes: int) -> None:
        """``nbytes`` (source bytes) of dying entries (:meth:`remove` with ``dying=True``) are deleted
        from the store (a packed record's bytes are then the store's slack)."""
        if self.charge is not None:
            nbytes = self.charge(nbytes)
        self.dying_bytes -= int(nbytes)
        assert self.dying_bytes >= 0, "unlinked more bytes than were dying"

    def snapshot(self) -> dict:
        """The tier's entry in the stats JSON."""
        out = {
            "used_bytes": self.used_bytes,
            "capacity_bytes": self.capacity_bytes,
            "files": len(self.sizes),
            "evictions": self.evictions,
        }
        if self.charge is not None:  # device bytes: what the store keeps from entries, what is dying
            out["overhead_bytes"] = self.overhead_bytes + self.headroom_bytes
            out["metadata_bytes"] = self.overhead_bytes
            out["slack_bytes"] = self.headroom_bytes
            out["entry_bytes"] = self.entry_bytes
            out["pack_below"] = self.pack_below
            out["dying_bytes"] = self.dying_bytes
        return out
