"""Logging helpers shared by the daemon's threads."""
from __future__ import annotations

import logging
import threading
import time

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    """Log at most one record per ``interval`` seconds; the next one says how many were suppressed.

    For errors that repeat at request rate (a full cache disk fails every write, a misbehaving client
    sends thousands of bad messages): the first is logged at once, the rest are counted, not lost.
    Thread-safe.
    """

    def __init__(self, logger: logging.Logger, interval: float = 1.0, clock=time.monotonic):
        self._logger, self._interval, self._clock = logger, interval, clock
        self._last = -float("inf")
        self._suppressed = 0
        self._lock = threading.Lock()

    def __call__(self, level: int, msg: str, *args, exc_info=False) -> None:
        now = self._clock()
        with self._lock:
            if now - self._last < self._interval:
                self._suppressed += 1
                return
            suppressed, self._suppressed, self._last = self._suppressed, 0, now
        if suppressed:
            msg += " (%d similar messages suppressed)"
            args = args + (suppressed,)
        self._logger.log(level, msg, *args, exc_info=exc_info)
