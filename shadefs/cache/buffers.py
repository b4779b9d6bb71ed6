"""The daemon's bound on fill buffers: bytes read from the source (or the shared tier) that are in flight.

Every backend read that brings bytes into the daemon (a fill into the RAM or disk tier, a piece of a disk
fill, a whole read into a transient buffer, a range streamed to a reader, a prefetch) takes its bytes
from :class:`FillBuffers` before the request and gives them back once the bytes reached where they are
counted next (a tier's budget, the loose buffers, the disk entry, the reply to the kernel). So the bytes
of reads in flight never exceed :data:`FILL_BUFFERS`, whatever the number of concurrent readers: past the
bound a fill waits for room, and a streamed read that asked for a whole chunk reads only the bytes the
kernel asked for (:meth:`FillBuffers.try_take`).

No deadlock: a thread holds at most one grant at a time (a disk fill gives a piece back before it takes
the next), no thread waits on another read while it holds a grant, and a grant larger than the bound is
given when nothing else is in flight (it then runs alone: ``used`` may exceed the bound by that one read,
counted in ``oversize``; while it waits for that, no other read starts).

Also here: :func:`tune_malloc`, glibc's allocator set so that freed read buffers go back to the system.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import threading

__all__ = ["FILL_BUFFERS", "FillBuffers", "tune_malloc", "MMAP_THRESHOLD", "ARENA_MAX"]

FILL_BUFFERS = 64 << 20
"""Bytes of backend reads in flight at most (their buffers); ``SHADEFS_FILL_BUFFERS`` lowers it (tests)."""

MMAP_THRESHOLD = 1 << 20
"""Allocations of this many bytes or more are mmap'd by glibc (and unmapped at free): fixed, so that glibc
does not raise it after freeing a large buffer and then serve the next 8 MiB read from an arena that
never shrinks."""
ARENA_MAX = 4
"""glibc malloc arenas at most (default 8 per core): each thread's arena keeps freed memory it cannot
trim; fewer arenas, less of it."""


class FillBuffers:
    """A byte bound on buffers of reads in flight (thread-safe).

    Args:
        bound: bytes (>= 1).

    Attributes (read under :attr:`cond`'s lock or racily for figures): ``used`` (bytes granted now),
    ``high_water`` (the most ``used`` ever was), ``waits`` (grants that waited for room), ``refused``
    (:meth:`try_take` calls refused: read as the kernel asked instead), ``oversize`` (grants larger than
    the bound, given alone).
    """

    def __init__(self, bound: int = FILL_BUFFERS):
        if bound < 1:
            raise ValueError(f"fill buffer bound {bound}: must be >= 1 byte")
        self.bound = int(bound)
        self.used = 0
        self.high_water = 0
        self.waits = 0
        self.refused = 0
        self.oversize = 0
        self._big_waiting = 0  # takes larger than the bound waiting to run alone: new grants wait behind them
        self.cond = threading.Condition(threading.Lock())

    def _grant(self, n: int) -> None:
        # under self.cond
        self.used += n
        if self.used > self.high_water:
            self.high_water = self.used
        if n > self.bound:
            self.oversize += 1

    def _fits(self, n: int) -> bool:
        # a read larger than the bound runs once nothing is in flight; while one waits for that, no other
        # read starts (else a steady stream of small reads could keep it waiting for ever)
        if self._big_waiting and n <= self.bound:
            return False
        return self.used == 0 or self.used + n <= self.bound

    def take(self, n: int) -> int:
        """Take ``n`` bytes (>= 0), waiting until they fit (or nothing else is in flight). Returns ``n``
        (the amount to :meth:`give` back)."""
        n = int(n)
        if n <= 0:
            return 0
        with self.cond:
            if not self._fits(n):
                self.waits += 1
                big = n > self.bound
                self._big_waiting += big
                try:
                    while not self._fits(n):
                        self.cond.wait()
                finally:
                    self._big_waiting -= big
            self._grant(n)
        return n

    def try_take(self, n: int) -> int:
        """Take ``n`` bytes if they fit now (never waits, never alone past the bound). Returns ``n``, or 0
        when refused (counted ``refused``)."""
        n = int(n)
        if n <= 0:
            return 0
        with self.cond:
            if self.used + n > self.bound or self._big_waiting:
                self.refused += 1
                return 0
            self._grant(n)
        return n

    def give(self, n: int) -> None:
        """Give back ``n`` bytes a :meth:`take` or :meth:`try_take` returned."""
        if n <= 0:
            return
        with self.cond:
            self.used -= n
            self.cond.notify_all()

    def snapshot(self) -> dict:
        """``{"bound_bytes", "used_bytes", "high_water_bytes", "waits", "refused", "oversize"}``."""
        with self.cond:
            return {"bound_bytes": self.bound, "used_bytes": self.used, "high_water_bytes": self.high_water,
                    "waits": self.waits, "refused": self.refused, "oversize": self.oversize}


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # glibc's malloc.h


def tune_malloc(mmap_threshold: int = MMAP_THRESHOLD, arena_max: int = ARENA_MAX) -> bool:
    """Set glibc's malloc so that freed large buffers return to the system: a fixed mmap threshold
    (``M_MMAP_THRESHOLD``; it also fixes the trim threshold at twice it) and at most ``arena_max`` arenas
    (``M_ARENA_MAX``). Returns False where there is no glibc ``mallopt`` (another libc: nothing set).
    Call once in the daemon, before its threads start."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold)))
    ok &= bool(mallopt(_M_TRIM_THRESHOLD, int(mmap_threshold) * 2))
    ok &= bool(mallopt(_M_ARENA_MAX, int(arena_max)))
    return ok
