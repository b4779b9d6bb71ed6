"""Passthrough to the source file (``--source-passthrough``): which opens the kernel front end may answer with
a backing id of the source file itself, and how such an open is counted (the cache's part,
:class:`SourcePassthrough`); the handle of such an open, which serves the READs that still reach the
daemon from the source file (the front end's part, :class:`SourceReads`)."""
from __future__ import annotations

import errno
import logging
import os
from typing import Optional

from ..cache.chunks import ChunkedHandle
from ..cache.counters import MISS
from ..cache.handle import Handle


class SourcePassthrough:
    """Opens answered by FUSE passthrough to the source file (mixed into
    :class:`~shadefs.cache.core.TieredCache`; :attr:`source_passthrough` is set by the kernel front end)."""

    @property
    def opens_source(self) -> bool:
        """Whether the backend opens source files for passthrough to them (``open_source``: a directory
        source, the posix backend; a wrapper such as the deadline's forwards it)."""
        return getattr(self.backend, "open_source", None) is not None

    def source_fd(self, h) -> Optional[int]:
        """For an open ``h`` served from the source (a file no tier admits, streamed; or a chunked file),
        when :attr:`source_passthrough` allows it: an ``O_RDONLY`` fd of the source file, opened and
        checked as a read opens it (``backend.open_source``: beneath the root, no symlink, ``fstat``
        against the snapshot), for the kernel front end to answer the open by passthrough to it. None when
        the open is not served that way (the front end serves it as before). Counts nothing
        but the source file opened (``source_checks``; :meth:`source_opened` counts the open, once the
        kernel took it). The caller closes the fd.

        A streamed file goes to the source unless its open was left to the kernel's pages (``h.left``:
        the plan prefetcher found the file's pages in the mount's page cache and did not prefetch it; the
        open must read those pages, which passthrough to the source file would bypass).
        A chunked file goes to the source under ``"large"`` always; under ``"untiered"`` only when no
        tier would take any more of it: none of its chunks fetching or moving, not every chunk resident
        (a file the tiers hold whole is served from them), and every chunk that is not resident refused
        by both tiers' policies now (``would_admit``). Chunks already resident stay resident (an open
        that is not passthrough reads them; the policy evicts them as it decides) but this open does not
        read them: the kernel reads the whole file from the source.

        Raises:
            FileNotFoundError, StaleSource, BackendError: the source file is gone, refused (another file,
                a symlink) or changed (size, mtime): the open fails as a read of it would.
        """
        mode = self.source_passthrough
        if mode == "off" or not self.opens_source:
            return None
        fid = h.fid
        if type(h) is ChunkedHandle:
            if mode == "untiered":
                with self.lock:
                    if not self._chunks_untiered(fid):
                        return None
        elif not (type(h) is Handle and h.outcome == MISS and h.gen == 0 and h.source == "backend"
                  and not h.left):
            # an open left to the kernel's pages (the plan prefetcher found them in the mount's own page
            # cache and did not prefetch the file) reads those pages: through the mount, never the source
            return None
        if not self.fds.room():  # past the descriptor reserve: served by ranges, as without passthrough
            self.fds.refuse()
            self._fd_log(logging.WARNING, "descriptor reserve reached (soft limit %d, %d kept free for control, "
                         "the tiers and the source): files are served from the source without passthrough to "
                         "it (counted in stats 'descriptors', refused)", self.fds.limit(), self.fds.reserve)
            return None
        fd = self.backend.open_source(self.ns.path(fid), int(self.ns.size(fid)))
        with self.lock:
            self.counts.source_checks += 1
        return fd

    def _chunks_untiered(self, fid: int) -> bool:
        # under self.lock: no tier would take any chunk of chunked file ``fid`` now (source_fd)
        first, count = self.chunks.span(fid)
        ram, disk = self.ram_index, self.disk_index
        flags = self.resident_flags
        absent = 0
        for cid in range(first, first + count):
            if cid in self._flights:
                return False
            if flags[cid]:
                continue
            absent += 1
            size = int(self.ns.size(cid))
            if ram.would_admit(cid, size) or (disk is not None and disk.would_admit(cid, size)):
                return False
        return absent > 0

    def source_opened(self, h) -> None:
        """``h``'s open was answered by passthrough to the source file (:meth:`source_fd`): counted in
        ``source_opens``, and the file's size (bytes, the snapshot's, which its ``fstat`` matched at the
        open) in ``source_passthrough_bytes``: what the kernel may read from the source file for this
        open, none of it through the daemon (``backend_bytes`` counts only what the daemon read). A
        chunked file's open, which counted nothing (its READs would have opened its chunks, and none will
        reach the daemon now), is counted here as one miss of the file (streamed), and traced so; a
        streamed file's open was counted a miss already."""
        size = int(self.ns.size(h.fid))
        with self.lock:
            self.counts.source_opens += 1
            self.counts.source_passthrough_bytes += size
            if type(h) is ChunkedHandle:
                self.counts.count(MISS, size)
                self.counts.streamed += 1
                if self.trace is not None:
                    self.trace.record(self.ns.path(h.fid), size, MISS)


class SourceReads:
    """The handle of an open answered by passthrough to the source file. The kernel reads the source file
    itself; the READs that still reach the daemon are the kernel's read-ahead into the mount's own pages,
    which passthrough does not redirect (``posix_fadvise(POSIX_FADV_WILLNEED)``: pyarrow issues one per
    column chunk or row group it is about to read). They are served from the checked source file's fd,
    kept for the open: no chunk is opened or admitted for them. ``bytes_read`` counts them (all handles)."""

    __slots__ = ("h", "fd", "size", "fds")
    source = "source"
    bytes_read = 0

    def __init__(self, h, fd: int, fds):
        # ``fds``: the cache's descriptor reserve (shadefs.procutil.FdReserve), which granted holding ``fd``
        self.h, self.fd, self.size, self.fds = h, fd, h.size, fds

    def read(self, offset: int, length: int) -> bytes:
        end = min(self.size, offset + length)
        out = b""
        while offset + len(out) < end:
            piece = os.pread(self.fd, end - offset - len(out), offset + len(out))
            if not piece:
                raise OSError(errno.EIO, f"the source file ended at {offset + len(out)}, expected {end}")
            out += piece
        SourceReads.bytes_read += len(out)
        return out

    def release(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)
            self.fds.drop()
        self.h.release()
