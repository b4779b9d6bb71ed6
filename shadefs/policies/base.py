"""The policy contract: the one place that decides admission and eviction for one cache tier.

A policy sees file ids (dense ints from the namespace), sizes in bytes, access events and importance
updates; it answers "which victims, in which order, make room for this file" or "do not admit".
It never holds data and never enforces the byte budget itself: :class:`shadefs.cache.index.TierIndex`
does that, and refuses an admission whose victims would not free enough bytes.

The same classes drive the live daemon and the trace simulator (:mod:`shadefs.sim`), so a policy
must be deterministic given the same sequence of calls. Policies are not thread-safe; the caller
(the tier index) serialises calls.
"""
from __future__ import annotations

import abc
from typing import ClassVar, Dict, Iterable, List, Mapping, Optional, Type

import numpy as np

__all__ = ["Policy", "Importance", "register", "get_policy", "policy_names", "PolicyError"]


class PolicyError(ValueError):
    """Unknown policy name or invalid policy parameters."""


class Importance:
    """Per-file importance scores in one dense float32 array indexed by file id.

    Memory is 4 bytes per file, independent of how many were ever scored. Files never scored weigh
    ``default`` (1.0, as in SHADE's sampler, ``init_fac``). Policies that care subscribe with
    :meth:`subscribe` and are told which file ids changed.

    Args:
        num_files: number of file ids (the namespace size).
        default: the importance of a file never scored.
    """

    def __init__(self, num_files: int, default: float = 1.0):
        self.values = np.full(int(num_files), default, dtype=np.float32)
        self.default = float(default)
        self._listeners: List = []
        # ids whose value follows others' (the chunks of a chunked file: shadefs.cache.chunks):
        # ``follower(fids, values) -> (ids, their values)``, applied by every update
        self.follower = None

    def __len__(self) -> int:
        return len(self.values)

    def subscribe(self, callback) -> None:
        """Call ``callback(fids: np.ndarray[int64])`` after every :meth:`update` (in the updating thread).

        The callback must be cheap and must not keep ``fids`` unboundedly: a policy queues at most a
        bounded number of ids (:class:`shadefs.policies.shade.ShadePolicy`)."""
        self._listeners.append(callback)

    def update(self, fids: np.ndarray, values: np.ndarray) -> None:
        """Set the importance of ``fids`` (shape (n,), int) to ``values`` (shape (n,), float32).

        A file id repeated in one update takes its last value.

        Raises:
            ValueError: shapes differ, an id is out of range, or a value is not finite.
        """
        fids = np.asarray(fids, dtype=np.int64)
        values = np.asarray(values, dtype=np.float32)
        if fids.shape != values.shape or fids.ndim != 1:
            raise ValueError(f"importance update: {fids.shape} ids vs {values.shape} values")
        if fids.size == 0:
            return
        if fids.min() < 0 or fids.max() >= len(self.values):
            raise ValueError("importance update: file id out of range")
        if not np.all(np.isfinite(values)):
            raise ValueError("importance update: values must be finite")
        self.values[fids] = values
        if self.follower is not None:
            ids, vals = self.follower(fids, values)
            if len(ids):
                self.values[ids] = vals
                fids = np.concatenate([fids, ids])
        for cb in self._listeners:
            cb(fids)

    def get(self, fid: int) -> float:
        return float(self.values[fid])


class Policy(abc.ABC):
    """Admission and eviction for one tier of ``capacity_bytes``.

    Subclasses set ``name`` and implement :meth:`victims`; they override the ``on_*`` hooks to keep
    whatever order they need. Every method is O(log n) or better per call except :meth:`victims`,
    which may return several ids; :meth:`on_hit` runs on every cache hit under the cache lock and should
    be O(1) (see docs/performance.md, "Lock hold").

    Args:
        capacity_bytes: the tier's budget (bytes); a file larger than this is never admitted.
        importance: shared per-file importance (only importance-aware policies read it).
    """

    name: ClassVar[str] = ""

    def __init__(self, capacity_bytes: int, importance: Optional[Importance] = None):
        self.capacity_bytes = int(capacity_bytes)
        self.importance = importance
        # resident id -> bytes: the tier index's own table once it shares it (share_sizes: one size per
        # resident in the daemon), else this policy's (a policy used alone keeps them in on_insert)
        self.sizes: Mapping[int, int] = {}
        self.owns_sizes = True

    def share_sizes(self, sizes: Mapping[int, int]) -> None:
        """Read residents' sizes from ``sizes`` (``{id: bytes}``, kept by the caller: the tier index sets
        its entry before ``on_insert`` and removes it before ``on_remove``) instead of keeping a copy."""
        self.sizes = sizes
        self.owns_sizes = False

    def on_hit(self, fid: int) -> None:
        """A resident file was read."""

    def on_insert(self, fid: int, size: int) -> None:
        """``fid`` (``size`` bytes) became resident after :meth:`victims` allowed it."""

    def on_remove(self, fid: int) -> None:
        """``fid`` left the tier (evicted, promoted or dropped as corrupt)."""

    def defer(self, wake=None) -> bool:
        """Switch to deferred bookkeeping: from now on hits and importance updates only queue work, which
        :meth:`apply_pending` applies in bounded slices (the daemon's background thread, under the tier's
        lock). ``wake()`` is called, without the lock, whenever work is queued. Returns whether this
        policy has such work at all (False here: nothing to defer)."""
        return False

    def apply_pending(self, limit: int = 256) -> bool:
        """Apply at most ``limit`` queued items (tier's lock held). Returns True while work remains."""
        return False

    @abc.abstractmethod
    def victims(self, fid: int, size: int, free_bytes: int) -> Optional[List[int]]:
        """Decide whether to admit ``fid`` of ``size`` bytes when ``free_bytes`` are free.

        Returns:
            ``None`` to refuse admission, else the resident ids to evict, in eviction order
            (an empty list when the file fits as is). The victims must free at least
            ``size - free_bytes`` bytes; the tier refuses the admission otherwise.
        """


_REGISTRY: Dict[str, Type[Policy]] = {}


def register(cls: Type[Policy]) -> Type[Policy]:
    """Class decorator: add a policy to the registry under ``cls.name``."""
    if not cls.name:
        raise PolicyError(f"{cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def policy_names() -> List[str]:
    """Names of the registered policies, sorted."""
    _load_builtin()
    return sorted(_REGISTRY)


def get_policy(name: str) -> Type[Policy]:
    """Return the policy class registered as ``name``.

    Raises:
        PolicyError: no such policy (the message lists the valid names).
    """
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PolicyError(f"unknown policy {name!r}; choose one of: {', '.join(sorted(_REGISTRY))}") from None


def _load_builtin() -> None:
    # Importing the package registers the built-in policies (one line each in policies/__init__.py).
    import shadefs.policies  # noqa: F401


def sizes_to_free(order: Iterable[int], sizes: Mapping[int, int], need: int) -> Optional[List[int]]:
    """Take ids from ``order`` until their sizes sum to ``need`` bytes; None if they never do."""
    out: List[int] = []
    freed = 0
    if need <= 0:
        return out
    for fid in order:
        out.append(fid)
        freed += sizes[fid]
        if freed >= need:
            return out
    return None
