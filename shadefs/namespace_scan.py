"""Scanning a source into a namespace: in this process, or in a forked child that hands the finished
namespace back through a memfd in the snapshot format (:mod:`shadefs.namespace_snapshot`), so the
listing's heap never lives in the daemon (docs/performance.md, "Namespace"). ``cls`` is the class
built (:class:`shadefs.namespace.Namespace`, which calls these from :meth:`~shadefs.namespace.Namespace.scan`)."""
from __future__ import annotations

import json
import logging
import mmap
import os
import threading
import time
from typing import Any, Dict, Iterable, Iterator, Optional

import numpy as np

from .backends.base import BackendError, DirChunk
from .namespace_snapshot import from_buffer, write
from .procutil import can_fork, die_with, libc

__all__ = ["scan", "scan_here", "scan_in_child"]

log = logging.getLogger("shadefs.namespace")


def _one_heap() -> None:
    """Let every thread allocate from one glibc heap (M_ARENA_MAX = 1) before the scan's threads start
    (a network listing's 16 threads would otherwise each get an arena). No-op outside glibc.

    This does not make an in-process scan leave the heap as a restart does: freeing the build's
    temporary arrays (1-8 MiB each at 1M files, mmapped) raises glibc's dynamic mmap threshold to their
    size, so the next arrays of that size (the cache's per-file ``np.zeros`` tables) are carved from the
    freed heap and zeroed by ``calloc``, which makes them resident at once; after a restart they are
    fresh mmaps whose untouched pages cost nothing. Measured: ~39 MiB more daemon RSS at 1M files after
    an in-process scan (docs/performance.md, "Namespace"). Hence the daemon's isolated scan
    (:func:`scan` ``isolate``).
    """
    lib = libc()
    if lib is not None and hasattr(lib, "mallopt"):
        lib.mallopt(-8, 1)  # M_ARENA_MAX


def _counted(chunks: Iterable[DirChunk], progress) -> Iterator[DirChunk]:
    """``chunks`` as they come, telling ``progress(files, dirs)`` the counts so far after each."""
    files = dirs = 0
    for c in chunks:
        files += c.num_files
        dirs += 1
        progress(files, dirs)
        yield c


def _trim_heap() -> None:
    """Return the heap's free pages to the system after a build (glibc ``malloc_trim``; else no-op)."""
    import gc

    gc.collect()
    lib = libc()
    if lib is not None and hasattr(lib, "malloc_trim"):
        lib.malloc_trim(0)


def scan(cls, backend, follow_symlinks: bool = False, isolate: bool = False,
         snapshot_key: Optional[Dict[str, Any]] = None, progress=None):
    """:meth:`Namespace.scan <shadefs.namespace.Namespace.scan>` (``cls``: the class to build)."""
    if isolate and getattr(backend, "scan_in_child", False):
        if can_fork():
            return scan_in_child(cls, backend, follow_symlinks, snapshot_key or {}, progress)
        log.info("scanning in this process (%d threads running: a fork is not safe)", threading.active_count())
    ns = scan_here(cls, backend, follow_symlinks, progress)
    _trim_heap()
    return ns


def scan_here(cls, backend, follow_symlinks: bool, progress=None):
    """:func:`scan` in this process: list ``backend`` and build a ``cls`` from its chunks."""
    import gc

    _one_heap()
    # the listing allocates millions of short-lived objects (a DirEntry and a stat result per file) and
    # creates no reference cycles: the cyclic collector would only walk them (~925 young collections
    # per 1M files); it runs once at the end (_trim_heap)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        chunks, report = backend.scan(follow_symlinks=follow_symlinks)
        if progress is not None:
            chunks = _counted(chunks, progress)
        ns = cls.__new__(cls)
        ns._build(chunks, report)
    finally:
        if was_enabled:
            gc.enable()
    return ns

def scan_in_child(cls, backend, follow_symlinks: bool, key: Dict[str, Any], progress=None):
    """:func:`scan` in a forked child; the namespace comes back through a memfd (the snapshot format,
    tagged with ``key``: :meth:`Namespace.save` with that key writes it as it is), an exception pickled
    through a pipe. The child dies with this process (PDEATHSIG)."""
    import pickle
    import signal

    t0 = time.monotonic()
    fd = os.memfd_create("shadefs-namespace", os.MFD_CLOEXEC)
    r, w = os.pipe()
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        os.close(fd), os.close(r), os.close(w)
        raise
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(r)
            die_with(parent)
            try:
                ns = scan_here(cls, backend, follow_symlinks, progress)   # its heap dies with it: no trim
                with open(fd, "wb", closefd=False) as f:
                    write(ns, f, key)
                msg = b"ok"
            except BaseException as e:  # handed to the parent, which raises it
                try:
                    msg = b"E" + pickle.dumps(e, pickle.HIGHEST_PROTOCOL)
                except Exception:
                    msg = b"E" + pickle.dumps(BackendError(f"{type(e).__name__}: {e}"))
            with open(w, "wb", closefd=False) as f:
                f.write(msg)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    try:
        with open(r, "rb", closefd=False) as f:
            msg = f.read()   # EOF when the child has exited (or died)
        _, status = os.waitpid(pid, 0)
        child, pid = pid, 0
        if not msg:
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
            raise BackendError(f"listing {getattr(backend, 'root', '?')!r}: the scan process died "
                               f"({f'signal {signal.Signals(sig).name}' if sig else f'exit {os.WEXITSTATUS(status)}'})")
        if msg != b"ok":
            raise pickle.loads(msg[1:])
        size = os.fstat(fd).st_size
        # mapped, not copied: the memfd's pages become the arrays' (copy-on-write, so they stay
        # writable like a loaded snapshot's); the mapping outlives the fd
        image = np.frombuffer(mmap.mmap(fd, size, access=mmap.ACCESS_COPY), dtype=np.uint8)
        ns, why = from_buffer(cls, image, json.loads(json.dumps(key)), t0)
        if ns is None:
            raise BackendError(f"the scan process handed back an unreadable namespace ({why})")
        ns._image = (image, key)
        ns.from_snapshot = False
        ns.unchecked = None
        ns.scan_seconds = time.monotonic() - t0
        log.info("namespace scanned and built in a child process (pid %d) in %.2f s, handed back as %s",
                 child, ns.scan_seconds, f"{size / 2**20:.1f} MiB")
        return ns
    finally:
        if pid:  # interrupted while the child runs: it must not outlive the wait
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        os.close(r)
        os.close(fd)
