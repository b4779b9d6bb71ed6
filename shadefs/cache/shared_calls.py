"""A shared-tier member's calls to Redis with a deadline: each runs on a worker thread and is waited for
at most its deadline (the timeout plus 10 ms per MiB of value); a failure costs one hit, is counted and
logged (rate-limited), and repeated failures close a partition's breaker, or the whole tier's, for a
back-off (doubling to its maximum). :class:`DeadlineCalls` is a part of :class:`shadefs.cache.shared.SharedTier`."""
from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from typing import Optional

__all__ = ["Breaker", "DeadlineCalls", "SKIP", "PER_MIB_S", "SOCKET_MARGIN_S"]

PER_MIB_S = 0.010         # the deadline grows by 10 ms per MiB of value (a 16 MiB value: 210 ms)
# the client's socket timeout exceeds every call's deadline by this much: a thread woken late still finds
# the call past its deadline, not failed by the socket's timeout
SOCKET_MARGIN_S = 0.25


class Breaker:
    """Consecutive-failure circuit breaker: after ``threshold`` failures in a row, closed for a back-off
    (``base_s``, doubling on every failed retry up to ``max_s``); then one call goes through."""

    __slots__ = ("threshold", "base_s", "max_s", "fails", "until", "backoff")

    def __init__(self, threshold: int, base_s: float, max_s: float):
        self.threshold, self.base_s, self.max_s = threshold, base_s, max_s
        self.fails, self.until, self.backoff = 0, 0.0, base_s

    def open(self, now: float) -> bool:
        return now < self.until

    def ok(self) -> None:
        self.fails, self.backoff = 0, self.base_s

    def fail(self, now: float) -> bool:
        """Record a failure; True when this one opened the breaker."""
        self.fails += 1
        if self.fails >= self.threshold:
            self.until = now + self.backoff
            self.backoff = min(self.max_s, self.backoff * 2)
            self.fails = self.threshold - 1  # the retry after the back-off re-opens on one failure
            return True
        return False


#: what a call that was not made, failed or ran past its deadline returns
SKIP = object()


class DeadlineCalls:
    """Calls with a deadline and back-off, for :class:`~shadefs.cache.shared.SharedTier` (which holds the
    worker pool, the breakers, the counters and the lock they use)."""

    def _run(self, fn, partition: Optional[int], deadline_s: float, wait: bool = True):
        """Run ``fn(client)`` on a worker, waiting at most ``deadline_s`` (no longer than the client's socket
        timeout less :data:`SOCKET_MARGIN_S`). Returns its result or SKIP."""
        deadline_s = min(deadline_s, self.socket_timeout_s - SOCKET_MARGIN_S)
        now = time.monotonic()
        with self._lock:
            if self._global.open(now) or (partition is not None and self._breakers[partition].open(now)):
                self.skipped += 1
                return SKIP
        fut = self._pool.submit(lambda: fn(self._client()))
        try:
            out = fut.result(timeout=deadline_s if wait else None)
        except Exception as e:  # TimeoutError, redis errors, a broken cluster map: all cost one hit
            now = time.monotonic()
            with self._lock:
                self.errors += 1
                self.deadlines += isinstance(e, cf.TimeoutError)
                opened = self._global.fail(now)
                if partition is not None:
                    opened = self._breakers[partition].fail(now) or opened
            kind = "deadline" if isinstance(e, cf.TimeoutError) else f"{type(e).__name__}: {e}"
            self._err_log(logging.WARNING, "shared tier %s: %s%s", self.redacted, kind,
                          "; backing off" if opened else "")
            return SKIP
        with self._lock:
            self._global.ok()
            if partition is not None:
                self._breakers[partition].ok()
        return out

    def _deadline(self, nbytes: int) -> float:
        return self.timeout_s + nbytes / 2**20 * PER_MIB_S

    def _script(self, client, src: str, keys, args):
        return client.execute_command("EVAL", src, len(keys), *keys, *args)
