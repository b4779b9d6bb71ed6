"""``shade``: importance-aware admission and eviction (SHADE, Khan et al., USENIX FAST '23).

SHADE's cache (reference code: ``shade_utils/shadedataset.py`` with the priority queue and ghost cache of
``benchmarks/bench_cifar10.py``) admits a missed sample while there is room; when full, only if its
importance beats the least important cached sample, which is evicted. Importance is the per-minibatch
rank of the sample's loss, mapped to ln(10 + rank) (``shade_utils/shadesampler.py``, lines 104-107 and
214-224): :func:`rank_transform` here.

What differs from the reference code, on purpose:

- capacity is bytes, not samples: as many victims as the newcomer needs, all strictly less important;
- a file never scored has a defined importance (1.0, SHADE's ``init_fac``) instead of a ``KeyError``;
  with no score ever received this policy makes exactly the decisions of ``static``;
- scores arrive by path and are mapped to file ids by the daemon, so they land on the right files;
- ties are broken deterministically (least recently accessed, inserted or scored first), so the
  simulator and an immediate-mode policy agree exactly; a hit is O(1) (reference: ties by frequency).

This module must never import torch.
"""
from __future__ import annotations

import collections
import threading
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
from sortedcontainers import SortedDict

from .base import Policy, PolicyError, register

__all__ = ["ShadePolicy", "rank_transform", "raw_transform", "TRANSFORMS", "get_transform"]


def rank_transform(values: np.ndarray) -> np.ndarray:
    """SHADE's score transform: the rank of each value within its minibatch, weighted ln(10 + rank).

    Rank 0 is the lowest value (loss); equal values are ranked by position (stable), so the result is
    deterministic. Raw magnitudes are discarded: losses are not comparable across minibatches, ranks are
    (Khan et al., FAST '23; reference code ``shade_utils/shadesampler.py``, ``set_importance_per_batch``).

    Args:
        values: shape (n,), finite numbers (per-sample losses of ONE minibatch).

    Returns:
        float32 array of shape (n,), in the input order; values in [ln 10, ln(9 + n)].

    Raises:
        ValueError: not one-dimensional, or a value is NaN or infinite.
    """
    v = np.asarray(values)
    if v.ndim != 1:
        raise ValueError(f"rank_transform takes one minibatch, shape (n,), got {v.shape}")
    if v.size and not np.all(np.isfinite(v)):
        raise ValueError("rank_transform: values must be finite")
    ranks = np.empty(v.shape[0], dtype=np.float64)
    ranks[np.argsort(v, kind="stable")] = np.arange(v.shape[0], dtype=np.float64)
    return np.log(10.0 + ranks).astype(np.float32)


def raw_transform(values: np.ndarray) -> np.ndarray:
    """Use the values themselves as importance (float32 copy, shape (n,)).

    Note a never-scored file weighs 1.0, so with losses below 1.0 scored files rank below unscored ones.
    """
    return np.array(values, dtype=np.float32, copy=True).reshape(-1)


TRANSFORMS: Dict[str, Callable[[np.ndarray], np.ndarray]] = {"rank": rank_transform, "raw": raw_transform}


def get_transform(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """Return the score transform ``name`` (``rank`` or ``raw``).

    Raises:
        PolicyError: no such transform (the message lists the valid names).
    """
    try:
        return TRANSFORMS[name]
    except KeyError:
        raise PolicyError(f"unknown score transform {name!r}; choose one of: {', '.join(sorted(TRANSFORMS))}") from None


@register
class ShadePolicy(Policy):
    """Admit while the file fits; when full, admit only a file strictly more important than every victim.

    Victims are taken lowest importance first (ties: least recently accessed, inserted or scored first)
    until they free enough bytes; if that would need a victim whose importance is >= the newcomer's, the
    admission is refused and nothing is evicted. The newcomer's importance is read from
    ``self.importance`` (1.0 for every file when there is none); residents rank by the importance last
    applied to them (see below).

    Structure: one :class:`collections.OrderedDict` per distinct importance value (a *level*, least
    recent first), the levels in a :class:`sortedcontainers.SortedDict`. A hit moves the file to the
    recent end of its level, O(1); an insert or removal is O(1) plus O(log L) when a level appears or
    empties (L = distinct importance values among residents, ~batch size with the ``rank`` transform); a
    re-scored resident moves to the recent end of its new level (a score is reported right after the
    sample was trained on, so it counts as an access).

    Two modes (the decisions are the same; only *when* re-ranking happens differs):

    - immediate (default; the simulator, tests): an importance update re-ranks inside the
      :meth:`Importance.update` call (the caller holds the tier's lock), a hit at once;
    - deferred (:meth:`defer`, the daemon after mount): an update only queues the changed ids, a hit only
      appends the id to a bounded deque (no Python frame: ``on_hit`` is the deque's ``append``), and
      :meth:`apply_pending` applies them in bounded slices from a background thread under the tier's
      lock. Both queues are bounded: more than ``max_pending`` queued ids collapse into one re-scan of all
      file ids (a file whose importance changed moves; re-scores are then not counted as accesses),
      and beyond ``max_pending`` hit touches the oldest are dropped (ties only).

    A tier of capacity 0 does not subscribe to importance updates at all.
    """

    name = "shade"

    def __init__(self, capacity_bytes, importance=None, max_pending: int = 65536):
        super().__init__(capacity_bytes, importance)
        # each level: its resident ids, least recent first (their sizes: self.sizes)
        self._levels: "SortedDict[float, collections.OrderedDict[int, None]]" = SortedDict()
        self._level_of: Dict[int, float] = {}   # resident fid -> the importance it is ranked by
        self.max_pending = int(max_pending)
        self._deferred = False
        self._wake: Optional[Callable[[], None]] = None
        self._qlock = threading.Lock()           # guards the queues (callbacks come from any thread)
        self._queued: "collections.deque[List[int]]" = collections.deque()
        self._queued_ids = 0
        self._rescan = False
        self._work: Sequence[int] = ()           # ids of the update being applied, and the position
        self._work_pos = 0
        self._work_touch = True                  # whether re-scoring the current work counts as access
        self._touches: "collections.deque[int]" = collections.deque(maxlen=self.max_pending)
        if importance is not None and self.capacity_bytes > 0:
            importance.subscribe(self._on_update)

    def _imp(self, fid: int) -> float:
        return 1.0 if self.importance is None else float(self.importance.values[fid])

    # -- importance updates ------------------------------------------------------------------------
    def _on_update(self, fids: np.ndarray) -> None:
        if not self._deferred:
            self._rescore_now(fids)
            return
        ids = np.unique(fids).tolist() if len(fids) <= self.max_pending else None  # outside any lock
        with self._qlock:
            if ids is None or self._rescan or self._queued_ids + len(ids) > self.max_pending:
                self._queued.clear()
                self._queued_ids = 0
                self._rescan = True
            else:
                self._queued.append(ids)
                self._queued_ids += len(ids)
        wake = self._wake
        if wake is not None:
            wake()

    def _rescore_now(self, fids: np.ndarray) -> None:
        if len(fids) <= 4096:
            candidates = [f for f in np.unique(fids).tolist() if f in self._level_of]
        else:  # a big update: intersect with the residents instead of a lookup per id
            res = np.fromiter(self._level_of, dtype=np.int64, count=len(self._level_of))
            candidates = np.intersect1d(res, fids).tolist()
        for fid in candidates:
            self._rescore(fid, True)

    def _rescore(self, fid: int, touch: bool, new: Optional[float] = None) -> None:
        lvl = self._level_of.get(fid)
        if lvl is None:
            return
        if new is None:
            new = self._imp(fid)
        level = self._levels[lvl]
        if new == lvl:
            if touch:
                level.move_to_end(fid)
            return
        del level[fid]
        if not level:
            del self._levels[lvl]
        self._place(fid, new)

    def _place(self, fid: int, imp: float) -> None:
        level = self._levels.get(imp)
        if level is None:
            level = self._levels[imp] = collections.OrderedDict()
        level[fid] = None
        self._level_of[fid] = imp

    def defer(self, wake: Optional[Callable[[], None]] = None) -> bool:
        """Switch to deferred re-ranking (see the class docstring); ``wake()`` is called (from the updating
        thread, without the tier's lock) whenever ids are queued. Returns True (this policy has pending
        work to apply)."""
        self._wake = wake
        self._deferred = True
        self.on_hit = self._touches.append  # type: ignore[method-assign]
        return True

    def pending(self) -> int:
        """Queued work items (ids of updates not yet applied, hit touches); re-scan counts as 1 << 30."""
        with self._qlock:
            left = len(self._work) - self._work_pos
            return self._queued_ids + left + len(self._touches) + ((1 << 30) if self._rescan else 0)

    def apply_pending(self, limit: int = 256) -> bool:
        """Apply at most ``limit`` queued hit touches and re-scored ids (call with the tier's lock held).

        Returns:
            True when work remains (call again, after releasing the lock), False when all is applied.
        """
        done = 0
        touches = self._touches
        levels, level_of = self._levels, self._level_of
        while done < limit and touches:
            fid = touches.popleft()
            done += 1
            lvl = level_of.get(fid)
            if lvl is not None:
                levels[lvl].move_to_end(fid)
        while done < limit:
            if self._work_pos >= len(self._work) and not self._next_work():
                break
            end = min(len(self._work), self._work_pos + (limit - done))
            touch = self._work_touch
            ids = self._work[self._work_pos:end]
            if isinstance(ids, range):
                ids = [f for f in ids if f in level_of]
            if ids:
                new_values = self.importance.values[ids].tolist()
                for fid, new in zip(ids, new_values):
                    self._rescore(fid, touch, new)
            done += end - self._work_pos
            self._work_pos = end
        return bool(touches) or self._work_pos < len(self._work) or bool(self._queued_ids) or self._rescan

    def _next_work(self) -> bool:
        with self._qlock:
            if self._rescan:
                self._rescan = False
                self._work = range(len(self.importance)) if self.importance is not None else ()
                self._work_touch = False
            elif self._queued:
                self._work = self._queued.popleft()  # unique ids, ascending (sorted by the updater)
                self._queued_ids -= len(self._work)
                self._work_touch = True
            else:
                self._work = ()
            self._work_pos = 0
            return len(self._work) > 0

    # -- the policy contract -----------------------------------------------------------------------
    def on_hit(self, fid: int) -> None:
        lvl = self._level_of.get(fid)
        if lvl is not None:
            self._levels[lvl].move_to_end(fid)

    def on_insert(self, fid: int, size: int) -> None:
        self.on_remove(fid)
        if self.owns_sizes:
            self.sizes[fid] = int(size)
        self._place(fid, self._imp(fid))

    def on_remove(self, fid: int) -> None:
        if self.owns_sizes:
            self.sizes.pop(fid, None)
        lvl = self._level_of.pop(fid, None)
        if lvl is not None:
            level = self._levels[lvl]
            del level[fid]
            if not level:
                del self._levels[lvl]

    def victims(self, fid: int, size: int, free_bytes: int) -> Optional[List[int]]:
        if size > self.capacity_bytes:
            return None
        need = size - free_bytes
        if need <= 0:
            return []
        imp = self._imp(fid)
        out: List[int] = []
        freed = 0
        sizes = self.sizes
        for lvl, level in self._levels.items():
            if lvl >= imp:
                return None
            for victim in level:
                out.append(victim)
                freed += sizes[victim]
                if freed >= need:
                    return out
        return None

    def ranking(self) -> List[int]:
        """Resident file ids, first victim first, as ranked now (for tests and debugging; in deferred mode
        call :meth:`apply_pending` until it returns False first to see every queued update applied)."""
        return [fid for level in self._levels.values() for fid in level]

    def iter_ranking(self):
        """:meth:`ranking` lazily (a generator; do not change the policy while iterating it)."""
        for level in self._levels.values():
            yield from level
