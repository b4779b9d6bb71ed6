"""The kernel's pages (``FUSE_NOTIFY_RETRIEVE``): whether the kernel still holds a file's first and last
page (one retrieve of one byte each; the kernel answers with a ``NOTIFY_REPLY`` request carrying the bytes
it found), which the plan prefetcher asks before reading ahead a file that was opened before."""
from __future__ import annotations

import errno
import logging
import os
import threading
from typing import Optional

from . import protocol as P

log = logging.getLogger("shadefs.fuse")

# seconds a page probe waits for the kernel's NOTIFY_REPLY before it takes the pages to be gone (the kernel
# queues the reply before the notify's write returns; a reader thread answers it within a request's time)
PROBE_TIMEOUT_S = 1.0
PAGE = 4096


class _Probe:
    """One :meth:`KernelFrontend.pages_held`: ``want`` retrieves, ``found`` of them answered with bytes."""

    __slots__ = ("want", "answered", "found", "done", "lock")

    def __init__(self, want: int):
        self.want, self.answered, self.found = want, 0, 0
        self.done = threading.Event()
        self.lock = threading.Lock()

    def answer(self, found: bool) -> None:
        with self.lock:
            self.answered += 1
            self.found += found
            if self.answered == self.want:
                self.done.set()


class KernelPages:
    """Asking the kernel which pages of a file it holds (mixed into
    :class:`~shadefs.fuse.kernel.KernelFrontend`: its fd, node ids and reply path)."""

    def pages_held(self, fid: int) -> Optional[bool]:
        """Whether the kernel holds the first and the last page of file ``fid`` now (``FUSE_NOTIFY_RETRIEVE``
        of one byte at each; module docstring). Blocks up to :data:`PROBE_TIMEOUT_S`; thread-safe; any
        thread but a reader's (a reader answers the kernel's NOTIFY_REPLY).

        Returns:
            True: the kernel returned both pages. False: it holds neither or only one of them, does not
            know the inode (``ENOENT``: never looked up, or forgotten), or did not answer in time. None:
            the mount cannot retrieve (not mounted, or a retrieve failed otherwise: logged once).
        """
        fd = self.fd
        if fd is None or not self.retrieve or self._stop.is_set():
            return None
        size = int(self.ns.attr(fid)[1])
        if size <= 0:
            return False
        offsets = [0] if size <= PAGE else [0, (size - 1) - (size - 1) % PAGE]
        probe = _Probe(len(offsets))
        ids = [next(self._probe_ids) for _ in offsets]
        for u in ids:
            self._probes[u] = probe
        nodeid = self.nodeid_of(fid)
        try:
            for u, off in zip(ids, offsets):
                try:
                    os.write(fd, P.encode_notify_retrieve(u, nodeid, off, 1))
                except OSError as e:
                    if e.errno != errno.ENOENT:
                        if self.retrieve:
                            self.retrieve = False
                            log.warning("FUSE_NOTIFY_RETRIEVE failed (%s): planned files are prefetched without "
                                        "asking the kernel for their pages", os.strerror(e.errno))
                        return None
                    return False  # the kernel has no inode for it: no pages
            if not probe.done.wait(PROBE_TIMEOUT_S):
                self.probe_timeouts += 1
                return False
        finally:
            for u in ids:
                self._probes.pop(u, None)
        self.probes += 1
        held = probe.found == len(offsets)
        self.probes_held += held
        return held

    def open_now(self, fid: int) -> bool:
        """Whether an open of file ``fid`` is under way or not yet released: its reader may still be reading
        it into the kernel's pages, so what the kernel holds of it is not settled. Every OPEN this front
        end handles in Python counts from its arrival (before the cache counts it) to its RELEASE (a
        RELEASE the compiled loop answered, until its batch is dropped: ~2 ms); RAM hits answered in C are
        not seen. O(opens under way + open files); thread-safe."""
        return fid in list(self._opening.values()) or any(entry[1] == fid for entry in list(self._files.values()))

    def _notify_reply(self, fd, unique, nodeid, buf, n) -> None:
        # the kernel's answer to a retrieve (no reply to it is expected): how many bytes it found
        probe = self._probes.pop(unique, None)
        if probe is None or n < P.IN_HEADER.size + P.NOTIFY_RETRIEVE_IN.size:
            return  # a probe that timed out, or a reply from before a restart: nobody waits for it
        size = P.NOTIFY_RETRIEVE_IN.unpack_from(buf, P.IN_HEADER.size)[2]
        probe.answer(size > 0)
