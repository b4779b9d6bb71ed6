"""shadefs training hooks: importance sampling (SHADE's PADS) and score reporting for a shadefs mount.

The whole change to a training loop (docs/hooks.md)::

    sampler = ShadeSampler(dataset)                          # DataLoader(..., sampler=sampler)
    reporter = ScoreReporter(dataset, sampler=sampler)
    reporter.report(loss)                                    # per step, loss with reduction="none"

or, to let the daemon prefetch and evict by the known future (any sampler's order)::

    sampler = PlanSampler(dataset, seed=0)                   # instead of shuffle=True

Importing this package never imports torch: the names below load on first use, and only
``ShadeSampler`` (a ``torch.utils.data.Sampler``) needs torch. Otherwise depends on numpy and pyzmq.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["Client", "ScoreReporter", "ShadeSampler", "PlanSampler"]

_WHERE = {"Client": ".client", "ScoreReporter": ".reporter", "ShadeSampler": ".sampler", "PlanSampler": ".plan"}

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client
    from .reporter import ScoreReporter
    from .sampler import ShadeSampler
    from .plan import PlanSampler


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
