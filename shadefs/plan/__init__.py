"""Clairvoyant caching: announced sample orders (plans), their cursors, Belady on the plan, the prefetcher.

docs/architecture.md ("Plans") has the picture; docs/protocol.md the ``register`` / ``plan`` messages.
"""
from .plans import NOT_PLANNED, Plan, PlanError, PlanRegistry  # noqa: F401
from .policy import PlanPolicy  # noqa: F401
