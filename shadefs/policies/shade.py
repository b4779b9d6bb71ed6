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
- ties are broken deterministically (fewer accesses, then least recently used, then lower file id),
  so the live daemon and the simulator agree.

This module must never import torch.
"""
from __future__ import annotations

import collections
from typing import Callable, Dict, List, Optional

import numpy as np
from sortedcontainers import SortedList

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

    Victims are taken lowest importance first (ties: fewer accesses, then least recently accessed or
    inserted, then lower file id) until they free enough bytes; if that would need a victim whose
    importance is >= the newcomer's, the admission is refused and nothing is evicted. Importance is read
    from ``self.importance`` (1.0 for every file when there is none).

    Residents are kept in a :class:`sortedcontainers.SortedList` keyed by
    ``(importance, accesses, last access sequence, fid)``: O(log n) per hit, insert, removal and per
    re-ranked file. Importance callbacks may come from any thread (the control server's); they only
    queue the changed ids, and the re-ranking happens at the policy's next call, under the tier's lock.
    """

    name = "shade"

    def __init__(self, capacity_bytes, importance=None):
        super().__init__(capacity_bytes, importance)
        self._order = SortedList()
        self._key: Dict[int, tuple] = {}      # resident fid -> its key in _order
        self._size: Dict[int, int] = {}       # resident fid -> bytes
        self._seq = 0
        self._dirty: "collections.deque[np.ndarray]" = collections.deque()
        if importance is not None:
            importance.subscribe(self._dirty.append)

    def _imp(self, fid: int) -> float:
        return 1.0 if self.importance is None else float(self.importance.values[fid])

    def _rerank(self) -> None:
        while self._dirty:
            fids = self._dirty.popleft()
            if len(fids) > len(self._key):
                candidates = list(self._key)  # a huge update: walk the residents instead
            else:
                candidates = [f for f in np.unique(fids).tolist() if f in self._key]
            for fid in candidates:
                old = self._key[fid]
                imp = self._imp(fid)
                if old[0] != imp:
                    self._order.remove(old)
                    new = (imp,) + old[1:]
                    self._order.add(new)
                    self._key[fid] = new

    def _touch(self, fid: int, accesses: int) -> None:
        self._seq += 1
        key = (self._imp(fid), accesses, self._seq, fid)
        self._order.add(key)
        self._key[fid] = key

    def on_hit(self, fid: int) -> None:
        self._rerank()
        old = self._key.get(fid)
        if old is None:
            return
        self._order.remove(old)
        self._touch(fid, old[1] + 1)

    def on_insert(self, fid: int, size: int) -> None:
        self._rerank()
        old = self._key.get(fid)
        if old is not None:
            self._order.remove(old)
        self._size[fid] = int(size)
        self._touch(fid, 1)  # the miss that brought it in

    def on_remove(self, fid: int) -> None:
        self._rerank()
        old = self._key.pop(fid, None)
        if old is not None:
            self._order.remove(old)
            del self._size[fid]

    def victims(self, fid: int, size: int, free_bytes: int) -> Optional[List[int]]:
        self._rerank()  # re-ranking is not a decision: a refusal still leaves the ranking as it was
        if size > self.capacity_bytes:
            return None
        need = size - free_bytes
        if need <= 0:
            return []
        imp = self._imp(fid)
        out: List[int] = []
        freed = 0
        for key in self._order:
            if key[0] >= imp:
                return None
            out.append(key[3])
            freed += self._size[key[3]]
            if freed >= need:
                return out
        return None

    def ranking(self) -> List[int]:
        """Resident file ids, first victim first (for tests and ``shadefs stats`` debugging)."""
        self._rerank()
        return [k[3] for k in self._order]
