"""Handles for tests: reading through :class:`shadefs.cache.core.TieredCache` in process (the unit tests),
and a Handle over bytes in memory (the stand-in caches behind an in-process kernel front end)."""
from __future__ import annotations

from typing import Optional, Tuple

__all__ = ["open_read", "memory_handle", "MemoryHandle"]


def open_read(cache, fid: int) -> Tuple[bytes, str]:
    """Open file id ``fid`` through ``cache``, read it whole, release the handle.

    Returns ``(bytes of the file, the open's outcome)``; errors of ``open``/``read`` (``OSError``) propagate.
    """
    h = cache.open(fid)
    try:
        return bytes(h.read(0, h.size)), h.outcome
    finally:
        h.release()


class MemoryHandle:
    """The read API of :class:`shadefs.cache.core.Handle` over a whole file's bytes in memory."""

    __slots__ = ("data", "outcome", "size")
    source = "memory"  # reads never wait on the backend
    keep_pages = True  # the bytes never change: the kernel may keep their pages

    def __init__(self, data: bytes, outcome: str):
        self.data, self.outcome, self.size = data, outcome, len(data)

    def read(self, offset: int, length: int):
        return memoryview(self.data)[offset:offset + length]

    def backing_fd(self) -> Optional[int]:
        return None

    def release(self) -> None:
        self.data = b""


def memory_handle(data: bytes, outcome: str = "miss") -> MemoryHandle:
    """A front end's Handle over ``data`` (the whole file, in memory), counted as ``outcome`` ("miss" or
    "ram"): no backing file (``backing_fd()`` is None), so the kernel front end serves its READs itself.

    Raises:
        ValueError: ``outcome`` is "disk" (a disk hit's Handle names an entry file of a real disk tier).
    """
    if outcome == "disk":
        raise ValueError("a disk hit needs a real disk tier: use TieredCache")
    return MemoryHandle(data, outcome)
