"""What an open returns: a :class:`Handle` serving one file's bytes, and the :class:`OpenTicket` of an open
that must wait (:meth:`TieredCache.open_nowait <shadefs.cache.core.TieredCache.open_nowait>`)."""
from __future__ import annotations

import errno
import os
from typing import Optional

from .counters import MISS, Outcome
from .decision import Decision, DiskHit, Lead, Stream
from .state import Pin

__all__ = ["Handle", "OpenTicket"]

class Handle:
    """One open of one file: serves its bytes until :meth:`release`.

    Attributes:
        fid: the file id.
        size: the file's size in bytes (the snapshot's).
        outcome: what this open was counted as (an :class:`~shadefs.cache.counters.Outcome`, a ``str``):
            ``"ram"``, ``"disk"``, ``"shared"``, ``"miss"``, ``"prefetch"`` (a completed prefetch,
            ``ready``) or ``"late"`` (it waited for one).
        gen: the generation of the disk entry the handle serves (or served: an entry-less disk hit of
            :meth:`TieredCache.open_kept`), else 0.
        keep_pages: whether the kernel may keep the file's pages from earlier opens (FOPEN_KEEP_CACHE):
            True for a hit, and for an open of a file no tier holds (the mount is a snapshot: its pages
            are the bytes the backend would serve again); False for a miss that fills a tier (the
            kernel drops its pages, so the open sees the bytes the tier now holds) and for the first
            open after the file's disk entry was dropped as corrupt (pages read from it are dropped).
        left: the open was left to the kernel's pages (the plan prefetcher found them:
            :meth:`Prefetcher.kernel_holds <shadefs.plan.prefetch.Prefetcher.kernel_holds>`) and no READ of
            it has reached the daemon yet; the first one tells the prefetcher the pages were gone.

    The bytes come from exactly one source: the RAM tier's own ``bytes`` object (no copy; pinned, so
    that if the file is evicted while the handle is open its bytes are counted against
    :data:`LOOSE_BUFFERS`, or, when that has no room, stay counted in the RAM tier's budget, until the
    last handle on them is released), an fd of the file's verified disk entry (``pread``), a buffer
    counted against :data:`LOOSE_BUFFERS`, or the backend by ranges (a file no tier holds).

    :meth:`release` takes no lock: it queues its pin (``TieredCache._orphans``) and the cache's next
    critical section applies it, as it does for a handle dropped without release.
    """

    __slots__ = ("fid", "size", "outcome", "_cache", "_data", "_fd", "_released", "_pin", "_loose", "gen",
                 "keep_pages", "_chunk", "_csum", "left")

    def __init__(self, cache, fid: int, size: int, outcome: Outcome,
                 data: Optional[bytes] = None, fd: Optional[int] = None, pin: Optional[Pin] = None,
                 loose: int = 0, gen: int = 0, keep_pages: Optional[bool] = None):
        self.fid = fid
        self.gen = gen
        self.size = size
        self.outcome = outcome
        self.keep_pages = outcome != MISS if keep_pages is None else keep_pages
        self._cache = cache
        self._data = data
        self._fd = fd
        self._released = False
        self._pin = pin      # the Pin of the RAM tier buffer this handle holds
        self._loose = loose  # bytes of a buffer counted against LOOSE_BUFFERS
        self._chunk = None   # served by ranges: (offset, bytes, lock) of the last whole chunk read (loose)
        self._csum = None    # the checksum naming the entry file of generation gen (an entry fd's handle)
        self.left = False

    @property
    def source(self) -> str:
        """Where reads are served from: ``"memory"``, ``"entry"`` (a disk entry fd) or ``"backend"``."""
        return "memory" if self._data is not None else "entry" if self._fd is not None else "backend"

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (fewer only at EOF; ``b""`` at or past it).

        Raises:
            OSError: EBADF after :meth:`release`; EIO when the entry or the backend fails mid-read.
            ValueError: a negative offset or length.
        """
        end = read_end(self._released, self.size, offset, length)
        if end <= offset:
            return b""
        if self._data is not None:
            return self._data[offset:end]
        if self._fd is not None:
            return _pread_exact(self._fd, end - offset, offset)
        if self._csum is not None:  # its entry fd was closed (close_entry_fd): the entry opened per read
            piece = self._cache._entry_read(self, offset, end)
            if piece is not None:
                return piece
        return self._cache._stream_read(self, offset, end)

    def backing_fd(self) -> Optional[int]:
        """An ``O_RDONLY`` fd of the file's (checksum-verified or just written) disk entry, for FUSE
        passthrough; None when the bytes are served from memory or the backend. Owned by the handle."""
        return None if self._released else self._fd

    def __del__(self):
        # a handle dropped without release(): its pin is handed back at the cache's next open (never
        # here: this may run where the cache lock is held)
        if not self._released:
            self._released = True
            if self._pin is not None or self._loose:
                self._cache._orphans.append((self._pin, self._loose))
            if self._fd is not None:
                try:
                    os.close(self._fd)
                except OSError:
                    pass
                self._cache.fds.drop()

    def release(self) -> None:
        """Close the fd and drop the buffer. Idempotent. Lock-free: the pin is handed back at the
        cache's next critical section (every open, stats, audit and reservation applies it first)."""
        if self._released:
            return
        self._released = True
        self._data = None
        if self._chunk is not None:
            self._chunk = (0, b"", self._chunk[2])  # the chunk's bytes go; a READ racing release keeps the lock
        if self._pin is not None or self._loose:
            self._cache._orphans.append((self._pin, self._loose))
            self._pin, self._loose = None, 0
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
            self._cache.fds.drop()

    def close_entry_fd(self) -> None:
        """Close the disk entry fd of a handle whose bytes the kernel reads from its own reference to the
        entry file (a FUSE passthrough backing id): the open then holds no descriptor of the daemon. Call
        it before the handle is served. A READ that still reaches the daemon (the kernel's read-ahead
        into the mount's pages, ``POSIX_FADV_WILLNEED``) opens the entry for that read, or, when it was
        evicted or no descriptor is free, is served by ranges from the backend. No-op without an fd."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
            self._cache.fds.drop()


def read_end(released: bool, size: int, offset: int, length: int) -> int:
    """The end of a handle's read of ``length`` bytes at ``offset`` in a file of ``size`` bytes (``<= offset``:
    nothing to read, at or past EOF); the checks every handle's ``read`` makes first.

    Raises:
        OSError: EBADF when the handle is ``released``.
        ValueError: a negative offset or length.
    """
    if released:
        raise OSError(errno.EBADF, "read of a released handle")
    if offset < 0 or length < 0:
        raise ValueError(f"read at {offset} of {length} bytes")
    return min(size, offset + length)


def _pread_exact(fd: int, length: int, offset: int) -> bytes:
    out = os.pread(fd, length, offset)
    while len(out) < length:  # short reads are legal; an early EOF is not (the entry shrank)
        more = os.pread(fd, length - len(out), offset + len(out))
        if not more:
            raise OSError(errno.EIO, f"disk entry ended at {offset + len(out)}, expected {offset + length}")
        out += more
    return out


class OpenTicket:
    """An open :meth:`TieredCache.open_nowait` looked up but could not serve without waiting (a miss,
    or a file fetching): pass it to :meth:`TieredCache.open_ticket`, exactly once, on a thread that may
    block. ``fid``, ``size``: the file; ``decision``: what the lookup decided (:mod:`shadefs.cache.decision`);
    ``opener``: the process whose open it is (or None)."""

    __slots__ = ("fid", "size", "decision", "opener")

    def __init__(self, fid: int, size: int, decision: Decision, opener: Optional[int] = None):
        self.fid, self.size, self.decision, self.opener = fid, size, decision, opener

    @property
    def joins(self) -> bool:
        """Whether serving it waits on another thread's read (a fetch in flight, a prefetch), rather than
        on a read of its own or nothing (a file no tier admits)."""
        return not isinstance(self.decision, (DiskHit, Lead, Stream))
