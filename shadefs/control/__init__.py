"""The control plane: a ZeroMQ endpoint per mount for scores, residency queries and stats.

``protocol`` is the pure codec (no sockets), shared by the daemon's ``server``, the training hook's
``client`` and ``shadefs stats``. Nothing here imports torch, and nothing creates a ZeroMQ context at
import time (contexts are not fork-safe; the daemon starts its server in FUSE ``init()``).
"""
from .protocol import ProtocolError, REASONS  # noqa: F401
