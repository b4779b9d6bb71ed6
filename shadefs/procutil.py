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


def holders(mountpoint: str) -> list:
    """The processes that keep ``mountpoint`` busy, as ``fuser -vm`` finds them: each process whose open
    descriptors, working directory, root directory, executable or memory maps lie on it, read from
    /proc (processes this user may not inspect are left out). Returns a list of ``(pid, command,
    uses)`` sorted by pid: ``command`` is the command line (its first 80 characters; ``[comm]`` when it
    has none), ``uses`` the sorted distinct uses (``"open file PATH"``, ``"working directory"``,
    ``"root directory"``, ``"executable"``, ``"mapped PATH"``). Raises nothing."""
    mp = os.path.abspath(mountpoint)
    roots = {mp, os.path.join(os.path.realpath(os.path.dirname(mp)), os.path.basename(mp))}

    def on(path: str) -> bool:
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        base = f"/proc/{name}"
        uses = set()
        for link, what in (("cwd", "working directory"), ("root", "root directory"), ("exe", "executable")):
            try:
                if on(os.readlink(f"{base}/{link}")):
                    uses.add(what)
            except OSError:
                pass
        try:
            for fd in os.listdir(f"{base}/fd"):
                try:
                    target = os.readlink(f"{base}/fd/{fd}")
                except OSError:
                    continue
                if on(target):
                    uses.add(f"open file {target}")
        except OSError:
            pass
        try:
            with open(f"{base}/maps", encoding="utf-8", errors="replace") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and on(parts[5].strip()):
                        uses.add(f"mapped {parts[5].strip()}")
        except OSError:
            pass
        if not uses:
            continue
        try:
            with open(f"{base}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            if not command:
                with open(f"{base}/comm", encoding="utf-8", errors="replace") as f:
                    command = f"[{f.read().strip()}]"
        except OSError:
            command = "?"
        out.append((int(name), command[:80], sorted(uses)))
    return sorted(out)
