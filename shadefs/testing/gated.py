"""A FUSE source whose backend reads hang on demand: the hung-backend test and benchmark.

:class:`GatedCache` stands in for the cache behind shadefs' own kernel front end
(:class:`shadefs.fuse.kernel.KernelFrontend`), so that front end serves a local tree as a FUSE source that
a shadefs mount under test reads as its backend. Its files are served whole from memory; opening a file
below ``hang/`` first blocks in the caller's ``wait()`` (in the kernel, for the process that opened it:
what an NFS server that stops answering or a stalled S3 GET does to a backend read), until the test or
benchmark opens its gate::

    gate = threading.Event()
    cache = GatedCache(ns, root, lambda: gate.wait(60))
    KernelFrontend(ns, cache, None, mountpoint=mp, passthrough=False).run()

Used by tests/integration/test_hung_backend.py and ``python -m shadefs.bench read`` (the hung-backend experiment).
"""
from __future__ import annotations

import os
import threading
from typing import Callable

from shadefs.cache.api import BareCache
from shadefs.testing.handles import MemoryHandle, memory_handle

__all__ = ["GatedCache"]


class GatedCache(BareCache):
    """The read API of the cache (``open_nowait``/``open``; the rest of it a :class:`BareCache`'s), over the files of ``root`` as named by ``ns``
    (a :class:`shadefs.namespace.Namespace` of that tree).

    ``open_nowait(fid)`` serves every file whose path does not start with ``prefix`` (its bytes read whole,
    as a miss); a file below ``prefix`` gets None, so the front end calls ``open(fid)`` on a worker, which
    calls ``wait()`` first (blocking) and then serves it. ``waiting``: the opens blocked in ``wait()`` now.
    Whatever ``wait`` raises fails that open (the front end answers EIO).
    """

    def __init__(self, ns, root: str, wait: Callable[[], object], prefix: str = "hang/"):
        super().__init__()
        self.ns, self.root, self.wait, self.prefix = ns, root, wait, prefix
        self.waiting = 0
        self.lock = threading.Lock()

    def _load(self, fid: int) -> MemoryHandle:
        with open(os.path.join(self.root, self.ns.path(fid)), "rb") as f:
            return memory_handle(f.read())

    def open_nowait(self, fid: int, ticket: bool = False, opener=None):
        return None if self.ns.path(fid).startswith(self.prefix) else self._load(fid)

    def open(self, fid: int, opener=None) -> MemoryHandle:
        with self.lock:
            self.waiting += 1
        try:
            self.wait()
        finally:
            with self.lock:
                self.waiting -= 1
        return self._load(fid)
