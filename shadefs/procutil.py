"""Process helpers: the scan's forked children (:mod:`shadefs.namespace`, the posix listing), the daemon's
descriptor limit."""
from __future__ import annotations

import functools
import os
import signal
import threading


@functools.lru_cache(maxsize=1)
def libc():
    """glibc through ctypes (one handle per process), or None where it cannot be loaded."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def can_fork() -> bool:
    """May this process fork a worker child? Linux (memfd), and no thread but this one (a fork copies
    only the calling thread: a lock another thread holds would stay locked in the child)."""
    return hasattr(os, "fork") and hasattr(os, "memfd_create") and threading.active_count() == 1


def die_with(parent: int) -> None:
    """In a forked child: be killed when ``parent`` exits (``PR_SET_PDEATHSIG``), or exit now if it has."""
    lib = libc()
    if lib is not None and hasattr(lib, "prctl"):
        lib.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def raise_nofile() -> tuple:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit (at most ``/proc/sys/fs/nr_open``):
    every open handle of a disk entry holds a descriptor. Returns (soft, hard) after; never raises."""
    import resource

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard
        if want == resource.RLIM_INFINITY:
            try:
                with open("/proc/sys/fs/nr_open") as f:
                    want = int(f.read())
            except (OSError, ValueError):
                want = 1 << 20
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        return resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return (-1, -1)


def name_thread() -> None:
    """Give the calling thread's Python name (``threading.current_thread().name``, its first 15 bytes) to
    the kernel as well (``PR_SET_NAME``), so ``top -H``, ``ps -L`` and ``/proc/PID/task/TID/comm`` tell
    the daemon's threads apart (CPython 3.11 does not). Never raises; a no-op where prctl is missing."""
    lib = libc()
    if lib is None:
        return
    try:
        lib.prctl(15, threading.current_thread().name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (AttributeError, OSError):
        pass
