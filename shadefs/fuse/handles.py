"""The one place the front ends meet the cache's read API.

The core's API (docs/architecture.md, "The read path"): ``cache.open(fid) -> Handle`` (counts one outcome,
may block on the backend) and ``cache.open_nowait(fid) -> Optional[Handle]`` (a hit served without
waiting, else None and nothing counted). A Handle has ``outcome``, ``size``, ``read(offset, length)``,
``keep_pages``, ``backing_fd()`` and ``release()``. For a cache that still returns ``(data, outcome)`` from ``open``,
:class:`BytesHandle` provides the same surface, so the front ends are written against one API.
"""
from __future__ import annotations

import os
from typing import Optional

__all__ = ["open_handle", "open_handle_nowait", "BytesHandle", "may_block"]


class BytesHandle:
    """A Handle over the whole content (``bytes``), or over a streamed file (``data`` None: read by
    ranges from the backend through ``cache.read_range``)."""

    __slots__ = ("cache", "fid", "data", "outcome", "size", "_fd", "keep_pages")

    def __init__(self, cache, fid: int, data, outcome: str):
        self.cache, self.fid, self.data, self.outcome = cache, fid, data, outcome
        self.size = len(data) if data is not None else cache.ns.size(fid)
        self.keep_pages = outcome != "miss" or data is None  # a hit, or a streamed (untiered) file
        self._fd = None

    def read(self, offset: int, length: int):
        if self.data is None:
            return self.cache.read_range(self.fid, offset, length)
        return memoryview(self.data)[offset:offset + length]

    def backing_fd(self) -> Optional[int]:
        """The disk tier's entry file of a disk hit (O_RDONLY, exactly ``size`` bytes), else None."""
        if self.outcome != "disk" or self.cache.disk is None:
            return None
        if self._fd is None:
            try:
                fd = os.open(self.cache.disk.entry_path(self.cache.ns.path(self.fid)), os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            if os.fstat(fd).st_size != self.size:
                os.close(fd)
                return None
            self._fd = fd
        return self._fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        self.data = None


def open_handle(cache, fid: int):
    """``cache.open(fid)`` as a Handle (counts one outcome; may block on the backend)."""
    if hasattr(cache, "open_nowait"):
        return cache.open(fid)
    data, outcome = cache.open(fid)
    return BytesHandle(cache, fid, data, outcome)


def open_handle_nowait(cache, fid: int):
    """A Handle when the open is a hit served without waiting on the backend, else None (nothing counted)."""
    if hasattr(cache, "open_nowait"):
        return cache.open_nowait(fid)
    with cache.lock:
        resident = fid in cache.ram_index or fid in cache._moving or (
            cache.disk_index is not None and fid in cache.disk_index)
    if not resident:
        return None
    return open_handle(cache, fid)  # a race with an eviction makes this one a (blocking) miss: rare


def may_block(cache, h) -> bool:
    """Whether ``h.read`` may wait on the backend (a file streamed by ranges): such reads go to a worker."""
    if isinstance(h, BytesHandle):
        return h.data is None
    source = getattr(h, "source", None)  # the core's Handle says where its reads come from
    if source is not None:
        return source == "backend"
    return h.outcome == "miss" and h.size > getattr(cache, "stream_threshold", 1 << 62)
