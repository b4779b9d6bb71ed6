"""What the cache decided for an open it could not serve at once: the decisions of
:meth:`OpenPath._decide <shadefs.cache.opens.OpenPath._decide>`, served by :meth:`OpenPath._serve
<shadefs.cache.opens.OpenPath._serve>` with one ``match``. (What an open is counted as: :class:`Outcome`,
of :mod:`shadefs.cache.counters`.)"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple, Union

from .counters import Outcome
from .movers import Victim
from .state import Fetch

__all__ = ["Outcome", "Decision", "DiskHit", "Join", "Lead", "Stream", "Ready", "Late", "AskKernel"]


@dataclass(frozen=True)
class DiskHit:
    """The file is resident(disk): serve generation ``gen`` of its entry, checksum ``csum``."""

    gen: int
    csum: int


@dataclass(frozen=True)
class Join:
    """The file is fetching: wait for that one read (counted by the fetch's source: ``JOINER_OUTCOME``)."""

    fetch: Fetch


@dataclass(frozen=True)
class Lead:
    """This open leads a new fetch of the file (already ``fetching``); ``demote``: the RAM victims its
    reservation evicted, already ``moving``, for the mover. A lead must be served (others may join it)."""

    fetch: Fetch
    demote: List[Victim]


@dataclass(frozen=True)
class Stream:
    """No tier takes the file (or the kernel holds its pages): served by ranges from the backend."""


@dataclass(frozen=True)
class Ready:
    """A completed read ahead was taken (already counted ``prefetch``): ``got`` is ``(bytes, source)``."""

    got: Tuple[bytes, str]


@dataclass(frozen=True)
class Late:
    """A read ahead of the file is in flight: wait for it (``future``, a
    :class:`~shadefs.plan.fill.PrefetchFuture`), then count ``late``."""

    future: object


@dataclass(frozen=True)
class AskKernel:
    """Ask the kernel for the file's pages first (the prefetcher's probe), then decide again."""


#: one of the decisions above
Decision = Union[DiskHit, Join, Lead, Stream, Ready, Late, AskKernel]

# the decisions that are answered at once, stateless
STREAM = Stream()
ASK_KERNEL = AskKernel()
