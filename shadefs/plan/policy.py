"""Belady's MIN on the announced future: the policy wrapper every tier runs while a plan is active.

:class:`PlanPolicy` wraps the mount's ``--policy`` (the *inner* policy) and asks a
:class:`~shadefs.plan.plans.PlanRegistry` for each file's next planned use. With no active plan it is the
inner policy, call for call. With a plan it decides as Belady's MIN (Belady, IBM Systems Journal 5(2),
1966; the same rule as :func:`shadefs.sim.belady`) on the known future:

- the victim is the resident whose next planned use is furthest (the distance: positions from a plan's
  cursor to the file's next unconsumed position, the least over the plans); ties (only possible between
  plans) go to the highest file id; a resident with no planned use is infinitely far, so those go first,
  in the inner policy's order (``shade``: lowest importance first; policies without an order: highest
  file id first, as ``sim.belady`` breaks its ties);
- a newcomer with a planned use is admitted if it fits, else if evicting residents whose next use is
  further than its own frees enough bytes; otherwise it is not admitted and nothing is evicted;
- a newcomer with no planned use is decided by the inner policy, except that it may never displace a
  file that has a planned use (to Belady, it is the furthest of all).

**Scans of no plan** (:meth:`PlanRegistry.spent <shadefs.plan.plans.PlanRegistry.spent>`): a process of no
plan's job that opens files while plans are active (an evaluation loop, ``cp -r``) is followed as a scan,
a pass over distinct files in an order the daemon does not know. A file every followed scan has read in
its current pass will not be read again by it, while the files it has not read yet will be; so among the
residents with no planned use, those a scan read go first (highest file id first), then the inner
policy's order; a newcomer with no planned use that a scan has just read is not admitted when it needs
room, and one it has not read takes room from those first, then from the other residents with no planned
use (never from a planned one). The rule holds after the plans end, while the scans go on (until
``idle_s`` without an open); without scans the policy is as above.

**Structure** (what makes a victim choice O(log n), not a sort of every resident per miss). Each
resident with a planned use has a *home* plan, one it is planned in, and sits in that plan's max-heap
keyed by (its next position there, file id); the key minus the plan's cursor is an upper bound of the
file's true distance (the least over the plans). The registry reports every time a file's next position
moves later (:attr:`~shadefs.plan.plans.PlanRegistry.watchers`: an open consumed it, or the cursor skipped
it); a hit only notes that per file (residents in a heap only: at most one entry per resident; a
tier of capacity 0 does not listen), and the next victim search first re-keys those files, vectorised,
in their home heaps (lazy invalidation: an old entry is dropped when it surfaces). A victim search takes the greatest bound over the plans' heap tops; if that file's
true distance equals its bound it is the furthest resident (every other bound is no greater), else it
moves to the plan that gives its true distance and the search goes on. With one plan a bound is always
exact. Residents with no planned use sit in a set (and, for inner policies without an order, a heap by
file id). Costs: O(1) per hit, O(log n) per re-key and per victim, O(K) per victim with K active plans, plus one
vectorised rebuild, O(n log n) in numpy, whenever the set of plans changes (an announcement: once per
epoch and stream) or the heaps hold more than twice as many entries as residents; 6 bytes per file id of
the namespace (``int32`` home position, ``int16`` home plan). With ``shade`` as the inner policy, choosing
among unplanned residents walks shade's order and skips planned residents (O(skipped)).

The byte budget stays with :class:`~shadefs.cache.index.TierIndex`; the same class runs in the daemon and
in ``shadefs simulate --plan`` (:func:`shadefs.sim.simulate_plan`). Not thread-safe: the tier's caller
holds the lock the registry shares.
"""
from __future__ import annotations

import heapq
from typing import Dict, List, Optional, Set

import numpy as np

from ..policies.base import Policy
from .plans import NOT_PLANNED, STRIDE_SHIFT, PlanRegistry, fresh_gil

__all__ = ["PlanPolicy"]

# heap entries: one int, smallest first = furthest position first, then the highest file id
_LOW = (1 << 32) - 1


def _encode(pos, fid):
    return ((_LOW - pos) << 32) | (_LOW - fid)


class PlanPolicy(Policy):
    """Belady-on-plan around ``inner`` (module docstring).

    Args:
        inner: the mount's policy instance for this tier (receives every ``on_*`` call).
        plans: the registry with the announced future.
    """

    def __init__(self, inner: Policy, plans: PlanRegistry):
        super().__init__(inner.capacity_bytes, inner.importance)
        self.inner = inner
        self.plans = plans
        self.name = inner.name  # the stats keep naming the mount's --policy
        inner.share_sizes(self.sizes)               # one size per resident: ours (or the tier index's)
        n = int(plans.num_files)
        self._resident = np.zeros(n, dtype=bool)     # the residents, readable without the lock (a snapshot)
        self._tracking: List[Set[int]] = []          # files changed since a preparation's snapshot began
        self._spare = None                           # (home, home_pos) arrays free for the next build
        self.prepared = 0                            # structures built off the lock and installed
        self._home_pos = np.zeros(n, dtype=np.int32)  # resident, planned: its next position in its home
        self._home = np.full(n, -1, dtype=np.int16)   # resident, planned: index into _active; else -1
        self._never: Set[int] = set()                # resident, no planned use in any plan
        self._never_heap: List[int] = []             # -fid, for inner policies without an order
        self._active: list = []                      # the registry's plans when the heaps were built
        self._slot: Dict[int, int] = {}              # id(plan) -> index into _active
        self._heaps: List[List[int]] = []
        self._entries = 0
        self._version = -1                           # the registry's version the structure reflects
        self._ordered = getattr(inner, "ranking", None) is not None
        self.rebuilds = 0
        # residents homed in a heap of the current structure whose next use moved later (in some plan),
        # not yet re-keyed: at most one entry per resident. A tier without capacity never evicts: it
        # does not watch.
        self._dirty: Set[int] = set()
        # files that changed while an installed structure was being prepared: re-keyed at the next victim
        # search (vectorised there), not in the install under the lock
        self._catch_up: Set[int] = set()
        # while the set of plans changed and the registry's installer builds the next structure: the
        # slots of _active whose plan has ended (their heaps are passed over; nothing is homed there)
        self._dead: Set[int] = set()
        self._dead_version = -1
        # residents a scan read (PlanRegistry.spent), maybe: with no planned use they go first (checked
        # when used; a superset)
        self._spent: Set[int] = set()
        self._spent_heap: List[int] = []             # -fid of _spent, those that may have no planned use
        self._spent_parked: Set[int] = set()         # of _spent, last seen with a planned use
        self._spent_recheck: Set[int] = set()        # of _spent, parked before the plans last changed
        if inner.capacity_bytes > 0:
            plans.watchers.append(self._moved)       # O(1) on the hit path; applied at the next victim search
            plans.spent_watchers.append(self._spent_note)
            plans.preparers.append(self.prepare)     # a new plan set's structure, built off the lock
        self.on_hit = inner.on_hit                   # type: ignore[method-assign]  # no frame of ours on a hit

    # -- the inner policy's calls, and keeping the structure --------------------------------------
    def on_hit(self, fid: int) -> None:
        self.inner.on_hit(fid)

    def _moved(self, item) -> None:
        # the registry's watcher: (plan, fid), fid's next use in plan moved later
        plan, fid = item
        for changed in self._tracking:
            changed.add(fid)
        if self._home[fid] < 0 or not self._usable():
            return  # not in a heap (absent, or never used again), or the next search rebuilds anyway
        self._dirty.add(fid)

    def _usable(self) -> bool:
        """Whether the live structure stays in use: it reflects the registry's plan set, or the set changed
        and the registry's installer is building the next one off the lock (meanwhile the slots of plans
        that ended are passed over, :attr:`_dead`)."""
        if self._version == self.plans.version:
            return True
        if not self.plans.installs_off_lock or self._version < 0:
            return False
        if self._dead_version != self.plans.version:
            live = {id(p) for p in self.plans.plans.values()}
            self._dead = {k for k, p in enumerate(self._active) if id(p) not in live}
            self._dead_version = self.plans.version
        return True

    def _spent_note(self, fid) -> None:
        if fid is None:
            self._spent.clear()
            self._spent_heap.clear()
            self._spent_parked.clear()
            self._spent_recheck.clear()
        elif fid in self.sizes and fid not in self._spent:
            self._spent_add(fid)

    def _spent_add(self, fid: int) -> None:
        self._spent.add(fid)
        h = self._spent_heap
        heapq.heappush(h, -fid)
        if len(h) > 2 * len(self._spent) + 1024:  # stale entries of files gone: compact
            h[:] = [-f for f in self._spent if f not in self._spent_parked]
            heapq.heapify(h)

    def on_insert(self, fid: int, size: int) -> None:
        if self.plans.spent(fid) and fid not in self._spent:
            self._spent_add(fid)
        if self.owns_sizes:
            self.sizes[fid] = size
        self._resident[fid] = True
        for changed in self._tracking:
            changed.add(fid)
        self.inner.on_insert(fid, size)
        if self._active and self._usable():
            self._rehome(fid)

    def on_remove(self, fid: int) -> None:
        if self.owns_sizes:
            self.sizes.pop(fid, None)
        if self._resident[fid]:
            self._resident[fid] = False
            for changed in self._tracking:
                changed.add(fid)
            self._home[fid] = -1
            self._never.discard(fid)
            self._dirty.discard(fid)
            self._spent.discard(fid)
            self._spent_parked.discard(fid)
        self.inner.on_remove(fid)

    def share_sizes(self, sizes) -> None:
        super().share_sizes(sizes)
        self.inner.share_sizes(sizes)

    def defer(self, wake=None) -> bool:
        deferred = self.inner.defer(wake)
        self.on_hit = self.inner.on_hit  # type: ignore[method-assign]  # the inner policy may rebind it (shade)
        return deferred

    def apply_pending(self, limit: int = 256) -> bool:
        return self.inner.apply_pending(limit)

    def _apply_moves(self) -> None:
        """Re-key the files whose next use moved later since the last search (an open consumed it, the
        cursor skipped it), vectorised (:meth:`_rehome_many`)."""
        if self._catch_up:
            todo, self._catch_up = self._catch_up, set()
            self._dirty.difference_update(todo)
            self._fixup(self.__dict__, np.fromiter(todo, dtype=np.int64, count=len(todo)))
        dirty = self._dirty
        if not dirty:
            return
        fids = np.fromiter(dirty, dtype=np.int64, count=len(dirty))
        dirty.clear()
        self._rehome_many(fids[self._home[fids] >= 0])

    def _rehome_many(self, fids: np.ndarray, st: Optional[dict] = None) -> None:
        """:meth:`_rehome` for many residents at once, in structure ``st`` (default the live one): their
        homes in numpy, one push per planned file (a heapify of the heap instead when they are many)."""
        if st is None:
            st = self.__dict__
            if fids.size < 16:
                for f in fids.tolist():
                    self._rehome(f)
                return
        if fids.size == 0:
            return
        active = st["_active"]
        if st is self.__dict__ and self._dead:
            active = [None if k in self._dead else p for k, p in enumerate(active)]
        best, home, pos = _nearest_use(active, fids)
        st["_home"][fids] = home
        st["_home_pos"][fids] = pos
        never = st["_never"]
        planned = fids[home >= 0]
        never.difference_update(planned.tolist())
        new_never = [f for f in fids[home < 0].tolist() if f not in never]
        never.update(new_never)
        if self._spent_parked and st is self.__dict__:
            self._unpark(new_never)
        if not self._ordered:
            self._push_all(st["_never_heap"], [-f for f in new_never])
        heaps = st["_heaps"]
        for k in range(len(active)):
            mine = home == k
            if mine.any():
                keys = (((_LOW - pos[mine]).astype(np.uint64) << np.uint64(32))
                        | (_LOW - fids[mine]).astype(np.uint64))
                self._push_all(heaps[k], keys.tolist())
        st["_entries"] += int(planned.size)

    @staticmethod
    def _push_all(heap: list, items: list) -> None:
        if len(items) * 16 < len(heap):
            for x in items:
                heapq.heappush(heap, x)
        else:
            heap.extend(items)
            heapq.heapify(heap)

    def _rehome(self, fid: int) -> None:
        """File ``fid`` (resident) goes to the plan that gives its least distance, or to the unplanned."""
        best, slot, pos = NOT_PLANNED, -1, -1
        dead = self._dead
        for k, plan in enumerate(self._active):
            if dead and k in dead:
                continue
            p = plan.next_position(fid)
            if p is not None and ((p - plan.pos) * plan.stride >> STRIDE_SHIFT) < best:
                best, slot, pos = ((p - plan.pos) * plan.stride >> STRIDE_SHIFT), k, p
        if slot < 0:
            if self._home[fid] >= 0 or fid not in self._never:
                self._home[fid] = -1
                self._to_never(fid)
            return
        self._never.discard(fid)
        self._home[fid] = slot
        self._home_pos[fid] = pos
        heapq.heappush(self._heaps[slot], _encode(pos, fid))
        self._entries += 1

    def _distance(self, fid: int) -> int:
        """``fid``'s least distance over the structure's live plans (the registry's, once it is current)."""
        best, dead = NOT_PLANNED, self._dead
        for k, plan in enumerate(self._active):
            if dead and k in dead:
                continue
            p = plan.next_position(fid)
            if p is not None and ((p - plan.pos) * plan.stride >> STRIDE_SHIFT) < best:
                best = ((p - plan.pos) * plan.stride >> STRIDE_SHIFT)
        return best

    def _to_never(self, fid: int) -> None:
        self._never.add(fid)
        if self._spent_parked:
            self._unpark((fid,))
        if not self._ordered:
            heapq.heappush(self._never_heap, -fid)

    def _rebuild(self) -> None:
        """Every resident's home and key from scratch, vectorised (the set of plans changed), under the lock."""
        self.rebuilds += 1
        spare, self._spare = self._spare, None
        self._swap(self._compute(self.plans.active(), np.flatnonzero(self._resident), spare), self.plans.version)

    def _compute(self, active: list, res: np.ndarray, spare: Optional[tuple] = None) -> dict:
        """Homes, keys and heaps of residents ``res`` (int64 file ids) under plans ``active``; reads the plans
        and this policy's arrays only, so it may run without the lock on a snapshot (:meth:`prepare`)."""
        if any(len(p) >= 2**31 for p in active) or len(active) >= 2**15:
            raise ValueError("PlanPolicy: a plan of 2**31 positions or more, or 2**15 plans (the daemon "
                             "accepts at most 8 Mi ids per plan message and 64 plans)")
        res = np.asarray(res, dtype=np.int64)
        best, home, pos = _nearest_use(active, res)
        n = self._home.shape[0]
        if spare is not None:  # the arrays the last swap replaced: reused, not reallocated
            home_arr, pos_arr = spare
            home_arr.fill(-1)
        else:
            home_arr = np.full(n, -1, dtype=np.int16)
            pos_arr = np.zeros(n, dtype=np.int32)
        home_arr[res] = home
        pos_arr[res] = pos
        heaps = []
        for k in range(len(active)):
            mine = home == k
            keys = (((_LOW - pos[mine]).astype(np.uint64) << np.uint64(32))
                    | (_LOW - res[mine]).astype(np.uint64))
            keys.sort()
            heaps.append(keys.tolist())  # a sorted list is a heap
        never = res[home < 0]
        never_heap = [] if self._ordered else np.sort(-never).tolist()
        return {"_active": list(active), "_home": home_arr, "_home_pos": pos_arr, "_heaps": heaps,
                "_entries": len(res) - int(never.size), "_never": set(never.tolist()), "_never_heap": never_heap}

    def _swap(self, built: dict, version: int) -> dict:
        """Under the lock: install what :meth:`_compute` built; returns the structure it replaced (for the
        caller to drop after the lock: freeing large heaps takes milliseconds)."""
        old = {k: getattr(self, k) for k in built}
        self.__dict__.update(built)
        self._spare = (old.pop("_home"), old.pop("_home_pos"))  # nothing else refers to them now
        self._slot = {id(p): k for k, p in enumerate(self._active)}
        old["_dirty"], self._dirty = self._dirty, set()
        self._recheck_parked()  # a new set of residents with no planned use
        self._catch_up = set()
        self._dead = set()
        self._version = version
        return old

    def _fixup(self, st: dict, fids: np.ndarray) -> None:
        """Bring the residents ``fids`` up to date in structure ``st`` (``self.__dict__``: the live one):
        the absent ones leave it, the others are re-keyed."""
        here = self._resident[fids]
        gone = fids[~here]
        st["_home"][gone] = -1
        st["_never"].difference_update(gone.tolist())
        self._rehome_many(fids[here], st)

    #: files changed during a preparation that are left for the next victim search to re-key (beyond
    #: it, the preparation catches up without the lock first, a few rounds); the install under the lock
    #: only swaps the structure in and hands those files over
    CATCH_UP = 64

    def prepare(self, active: list):
        """Build the structure for plan set ``active`` (the registry's next :meth:`PlanRegistry.active`)
        without the lock, from a snapshot of the residents; returns ``install(version)``, which the
        registry calls under the lock right after it installed that set: it swaps the structure in and
        re-keys the files that changed since (inserted, removed, or their next use moved: at most about
        :attr:`CATCH_UP`, the rest were re-keyed without the lock), so the next victim search needs no
        rebuild. ``install`` returns the replaced structure (drop it after the lock). If the set differs
        by then, ``install`` does nothing and the next search rebuilds under the lock as before."""
        lock = self.plans.lock
        changed: Set[int] = set()
        fresh_gil()
        with lock:  # (the list is read under the lock by every change)
            self._tracking.append(changed)  # before the snapshot: a change after it is noted
            spare, self._spare = self._spare, None  # this build's arrays: a rebuild meanwhile allocates its own
        try:
            # one copy first: np.flatnonzero counts, then fills, and the array may change in between
            # (opens insert and remove under the lock meanwhile); the tracking notes what changes after
            built = self._compute(active, np.flatnonzero(self._resident.copy()), spare)
            for _ in range(8):  # catch up without the lock while many changed meanwhile
                if len(changed) <= self.CATCH_UP:
                    break
                batch, changed = changed, set()
                fresh_gil()
                with lock:
                    self._tracking.append(changed)
                    self._tracking.remove(batch)
                self._fixup(built, np.fromiter(batch, dtype=np.int64, count=len(batch)))
        except BaseException:
            fresh_gil()
            with lock:
                self._tracking.remove(changed)
            raise

        def install(version: int) -> Optional[dict]:
            self._tracking.remove(changed)
            now = self.plans.active()
            if len(now) != len(active) or any(a is not b for a, b in zip(now, active)):
                return None
            old = self._swap(built, version)
            self.prepared += 1
            self._catch_up = changed  # re-keyed at the next victim search (_apply_moves), not here
            return old
        return install

    def _current(self) -> None:
        bloated = (self._entries > 2 * len(self.sizes) + 1024
                   or len(self._never_heap) > 2 * len(self._never) + 1024)
        if self.plans.installs_off_lock and self._usable():
            # a changed plan set or heaps full of stale entries: the registry's installer builds the next
            # structure without the lock; this one decides until it is swapped in
            if bloated and self._version == self.plans.version:
                self.plans.request_install()
            self._apply_moves()
        elif self._version != self.plans.version or bloated:
            self._rebuild()
        else:
            self._apply_moves()

    # -- victims ------------------------------------------------------------------------------------
    def _next_planned(self, taken: Set[int]):
        """Pop the resident with the greatest true distance: (distance, fid), or None."""
        heaps, active, home, home_pos = self._heaps, self._active, self._home, self._home_pos
        while True:
            top, top_k = None, -1
            dead = self._dead
            for k, h in enumerate(heaps):
                if dead and k in dead:
                    continue  # its plan ended: the installer's next structure re-homes these residents
                while h:
                    e = h[0]
                    fid = _LOW - (e & _LOW)
                    p = _LOW - (e >> 32)
                    if home[fid] == k and home_pos[fid] == p and fid not in taken:
                        break
                    heapq.heappop(h)  # stale (re-keyed, re-homed, removed) or a duplicate of a taken one
                    self._entries -= 1
                if h:
                    d = (p - active[k].pos) * active[k].stride >> STRIDE_SHIFT
                    if top is None or (d, fid) > top:
                        top, top_k = (d, fid), k
            if top is None:
                return None
            d, fid = top
            if len(active) > 1 and self._distance(fid) < d:
                self._rehome(fid)  # its home's bound is above its true distance: move it, look again
                continue
            heapq.heappop(heaps[top_k])
            self._entries -= 1
            return top_k, d, fid

    def _spent_order(self, unplanned: bool = False):
        """Residents with no planned use that every scan followed has read (:meth:`PlanRegistry.spent`):
        those in the heap (highest file id first), then those to look at again after the plans changed.
        Those with a planned use are parked until they lose it (:meth:`_unpark`). ``unplanned``: no plan
        is active (every resident counts as having no planned use)."""
        if unplanned:
            self._recheck_parked()
        h, mark, spent, parked, seen = self._spent_heap, self._spent, self.plans.spent, self._spent_parked, []
        recheck = self._spent_recheck
        never = self.sizes if unplanned else self._never
        try:
            while h or recheck:
                f = -heapq.heappop(h) if h else recheck.pop()
                if f not in mark or f in parked or f in seen:
                    continue
                if not spent(f):
                    mark.discard(f)
                elif f in never:
                    seen.append(f)
                    yield f
                else:
                    parked.add(f)  # back in the heap when it has no planned use any more (_unpark)
        finally:
            for f in seen:
                heapq.heappush(h, -f)

    def _recheck_parked(self) -> None:
        """The plans changed: the parked files are looked at again, lazily (no pass over them here)."""
        if not self._spent_parked:
            return
        if not self._spent_recheck:
            self._spent_recheck, self._spent_parked = self._spent_parked, set()
        else:
            small, big = sorted((self._spent_parked, self._spent_recheck), key=len)
            big.update(small)
            self._spent_recheck, self._spent_parked = big, set()

    def _unpark(self, fids) -> None:
        """Files that lost their planned use: those a scan has read go back to :meth:`_spent_order`."""
        parked = self._spent_parked
        for f in fids:
            if f in parked:
                parked.remove(f)
                heapq.heappush(self._spent_heap, -f)

    def _never_order(self):
        """Residents with no planned use, first victim first: those a scan has read (nothing will read
        them again that the daemon can tell), then the inner policy's order."""
        if not self._spent:
            yield from self._never_order_inner()
            return
        done = set()
        first = self._spent_order()
        try:
            for f in first:
                done.add(f)
                yield f
        finally:
            first.close()
        rest = self._never_order_inner()
        try:
            for f in rest:
                if f not in done:
                    yield f
        finally:
            rest.close()

    def _never_order_inner(self):
        if self._ordered:
            never = self._never
            iter_ranking = getattr(self.inner, "iter_ranking", None)
            for f in (iter_ranking() if iter_ranking is not None else self.inner.ranking()):
                if f in never:
                    yield f
            return
        h, never, seen = self._never_heap, self._never, []
        try:
            while h:
                f = -heapq.heappop(h)
                if f in never and (not seen or seen[-1] != f):
                    seen.append(f)
                    yield f
        finally:
            for f in seen:  # put back what was looked at (victims leave ``never`` when evicted)
                heapq.heappush(h, -f)

    def _spent_victims(self, fid: int, need: int):
        """For a newcomer with no planned use while scans are followed: None (not admitted: a scan has
        read it and nothing else will that the daemon knows of), or victims that free ``need`` bytes:
        residents a scan has read, then (plans active) the other residents with no planned use in the
        inner policy's order, never one with a planned use (None if those do not suffice); with no plan
        active, False when the scans' residents do not suffice (the inner policy decides)."""
        if self.plans.spent(fid):
            return None
        unplanned = not self.plans.plans
        if not unplanned:
            self._current()  # the structure's unplanned set is that of the residents now
        out, freed = [], 0
        order = self._spent_order(True) if unplanned else self._never_order()
        try:
            for v in order:
                size = self.sizes.get(v)
                if size is None:
                    continue  # (not resident: only a structure being replaced may still name it)
                out.append(v)
                freed += size
                if freed >= need:
                    return out
        finally:
            order.close()
        return False if unplanned else None

    def victims(self, fid: int, size: int, free_bytes: int) -> Optional[List[int]]:
        if not self.plans.plans:
            if self._spent and size - free_bytes > 0 and size <= self.capacity_bytes:
                out = self._spent_victims(fid, size - free_bytes)
                if out is not False:
                    return out
            return self.inner.victims(fid, size, free_bytes)
        if size > self.capacity_bytes:
            return None
        need = size - free_bytes
        mine = self.plans.distance(fid)
        if mine == NOT_PLANNED:
            if need > 0 and self._spent:
                out = self._spent_victims(fid, need)
                if out is not False:
                    return out
            out = self.inner.victims(fid, size, free_bytes)
            if out and np.any(self.plans.distances(np.array(out, dtype=np.int64)) != NOT_PLANNED):
                return None  # never displace a file with a planned use for one without
            return out
        if need <= 0:
            return []
        self._current()
        out: List[int] = []
        freed = 0
        sizes = self.sizes
        if self._never:
            order = self._never_order()
            try:
                for v in order:
                    out.append(v)
                    freed += sizes[v]
                    if freed >= need:
                        return out
            finally:
                order.close()
        taken: Set[int] = set()
        popped = []
        try:
            while True:
                got = self._next_planned(taken)
                if got is None or got[1] <= mine:
                    if got is not None:
                        popped.append(got)
                    return None  # would evict a file needed sooner than the newcomer: bypass
                popped.append(got)
                taken.add(got[2])
                out.append(got[2])
                freed += sizes[got[2]]
                if freed >= need:
                    return out
        finally:
            for k, _, v in popped:  # still valid entries: push back (an evicted one turns stale)
                heapq.heappush(self._heaps[k], _encode(int(self._home_pos[v]), v))
                self._entries += 1


def _nearest_use(active, fids: np.ndarray):
    """For each file id of ``fids`` (int64, shape (n,)): the distance in positions to its next use in any
    plan of ``active`` (:data:`NOT_PLANNED` where none), the index in ``active`` of that plan (-1), and
    the position of that use there (0). Three int64 arrays of shape (n,)."""
    best = np.full(fids.shape, NOT_PLANNED, dtype=np.int64)
    home = np.full(fids.shape, -1, dtype=np.int64)
    pos = np.zeros(fids.shape, dtype=np.int64)
    for k, plan in enumerate(active):
        if plan is None:  # a slot whose plan ended
            continue
        nxt = plan.next_positions(fids)
        d = np.where(nxt >= 0, (nxt - plan.pos) * plan.stride >> STRIDE_SHIFT, NOT_PLANNED)
        better = d < best
        best[better] = d[better]
        home[better] = k
        pos[better] = nxt[better]
    return best, home, pos
