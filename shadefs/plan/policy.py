"""Belady's MIN on the announced future: the policy wrapper every tier runs while a plan is active.

:class:`PlanPolicy` wraps the mount's ``--policy`` (the *inner* policy) and asks a
:class:`~shadefs.plan.plans.PlanRegistry` for each file's next planned use. With no active plan it is the
inner policy, call for call. With a plan it decides as Belady's MIN (Belady, IBM Systems Journal 5(2),
1966; the same rule as :func:`shadefs.sim.belady`) on the known future:

- the victim is the resident whose next planned use is furthest; a resident with no planned use is
  infinitely far, so those go first, in the inner policy's order (``shade``: lowest importance first;
  policies without an order: highest file id first, as ``sim.belady`` breaks its ties);
- a newcomer with a planned use is admitted if it fits, else if evicting residents whose next use is
  further than its own frees enough bytes; otherwise it is not admitted and nothing is evicted;
- a newcomer with no planned use is decided by the inner policy, except that it may never displace a
  file that has a planned use (to Belady, it is the furthest of all).

The byte budget stays with :class:`~shadefs.cache.index.TierIndex`; the same class runs in the daemon and
in ``shadefs simulate --plan`` (:func:`shadefs.sim.simulate_plan`). Not thread-safe: the tier's caller
holds the lock the registry shares.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from ..policies.base import Policy
from .plans import NOT_PLANNED, PlanRegistry

__all__ = ["PlanPolicy"]


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
        self._sizes: Dict[int, int] = {}

    def on_hit(self, fid: int) -> None:
        self.inner.on_hit(fid)

    def on_insert(self, fid: int, size: int) -> None:
        self._sizes[fid] = size
        self.inner.on_insert(fid, size)

    def on_remove(self, fid: int) -> None:
        self._sizes.pop(fid, None)
        self.inner.on_remove(fid)

    def defer(self, wake=None) -> bool:
        return self.inner.defer(wake)

    def apply_pending(self, limit: int = 256) -> bool:
        return self.inner.apply_pending(limit)

    def _inner_order(self, fids: List[int]) -> List[int]:
        ranking = getattr(self.inner, "ranking", None)
        if ranking is not None:
            want = set(fids)
            return [f for f in ranking() if f in want]
        return sorted(fids, reverse=True)

    def victims(self, fid: int, size: int, free_bytes: int) -> Optional[List[int]]:
        if not self.plans.plans:
            return self.inner.victims(fid, size, free_bytes)
        if size > self.capacity_bytes:
            return None
        need = size - free_bytes
        mine = self.plans.distance(fid)
        if mine == NOT_PLANNED:
            out = self.inner.victims(fid, size, free_bytes)
            if out and np.any(self.plans.distances(np.array(out, dtype=np.int64)) != NOT_PLANNED):
                return None  # never displace a file with a planned use for one without
            return out
        if need <= 0:
            return []
        res = np.fromiter(self._sizes.keys(), dtype=np.int64, count=len(self._sizes))
        dist = self.plans.distances(res)
        never = res[dist == NOT_PLANNED].tolist()
        out: List[int] = []
        freed = 0
        for v in self._inner_order(never):
            out.append(v)
            freed += self._sizes[v]
            if freed >= need:
                return out
        later = dist > mine
        planned = res[later & (dist != NOT_PLANNED)]
        order = planned[np.argsort(-dist[later & (dist != NOT_PLANNED)], kind="stable")]
        for v in order.tolist():
            out.append(v)
            freed += self._sizes[v]
            if freed >= need:
                return out
        return None  # would evict a file needed sooner than the newcomer: bypass
