"""Process helpers: the scan's forked children (:mod:`shadefs.namespace`, the posix listing), the daemon's
descriptor limit."""
from __future__ import annotations

import errno
import functools
import os
import resource
import signal
import threading
import time


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


# descriptors kept free below the soft RLIMIT_NOFILE for the daemon's transient needs: control connections
# (libzmq aborts the whole process when its ipc listener's accept fails with EMFILE), a disk tier write or
# entry check, a read of the source, a scan; the read path holds no descriptor across requests beyond it
FD_RESERVE = 64
# seconds between two counts of the open descriptors (``/proc/self/fd``); between counts the read path's
# own holds and releases are added exactly
FD_COUNT_EVERY_S = 0.5


class FdReserve:
    """A descriptor reserve: ``reserve`` descriptors kept free below the soft ``RLIMIT_NOFILE`` for what
    must never fail for lack of one (control connections, the tiers' writes, reads of the source).

    The read path asks :meth:`hold` before it keeps a descriptor across requests (an open NVMe hit's
    entry fd, the source file of a passthrough open). Past the reserve it is refused: the caller serves
    the open without a held descriptor (the bytes read into a buffer, or by ranges per read) and the
    refusal is counted. The limit is read at each check (``prlimit`` may lower or raise it while the
    daemon runs); the open descriptors are counted from ``/proc/self/fd`` at most every
    :data:`FD_COUNT_EVERY_S` s, the read path's holds and drops between counts added exactly.

    Thread-safe. ``reserve`` 0 turns the reserve off (every hold is granted; an open then fails with
    EMFILE only at the limit itself).
    """

    FULL = 1 << 40   # the count of a table with no descriptor free to list it with

    def __init__(self, reserve: int = FD_RESERVE, count_every_s: float = FD_COUNT_EVERY_S):
        if reserve < 0:
            raise ValueError(f"descriptor reserve {reserve}: must be >= 0")
        self.reserve = int(reserve)
        self.count_every_s = count_every_s
        self.held = 0        # descriptors the read path holds now (granted by hold, not yet dropped)
        self.refused = 0     # holds refused at the reserve (served without a held descriptor)
        self.failed = 0      # opens that failed for lack of a descriptor (EMFILE, ENFILE)
        self._lock = threading.Lock()
        self._others = 0     # open descriptors that are not the read path's holds, at the last count
        self._counted = -1.0  # time.monotonic() of the last count (< 0: never)

    @staticmethod
    def limit() -> int:
        """The soft ``RLIMIT_NOFILE`` now (``RLIM_INFINITY`` as ``/proc/sys/fs/nr_open``); -1 if unknown."""
        try:
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except (OSError, ValueError):
            return -1
        if soft == resource.RLIM_INFINITY:
            try:
                with open("/proc/sys/fs/nr_open") as f:
                    return int(f.read())
            except (OSError, ValueError):
                return 1 << 20
        return int(soft)

    @staticmethod
    def count() -> int:
        """The descriptors this process has open now (``/proc/self/fd``, less the listing's own); -1 when
        they cannot be counted (no ``/proc``, or no descriptor left to list them with)."""
        try:
            return len(os.listdir("/proc/self/fd")) - 1
        except OSError:
            return -1

    @staticmethod
    def _count_or_full() -> int:
        # count(), or FULL when not even the listing's descriptor could be opened (EMFILE, ENFILE)
        try:
            return len(os.listdir("/proc/self/fd")) - 1
        except OSError as e:
            return FdReserve.FULL if e.errno in (errno.EMFILE, errno.ENFILE) else -1

    def _estimate(self) -> int:
        # the open descriptors: counted again when the last count is older than count_every_s (one listing
        # per interval, whatever the rate of opens; listed outside the lock, which a listing of a large
        # table would hold for milliseconds), the read path's holds since then added exactly
        now = time.monotonic()
        with self._lock:
            due = self._counted < 0 or now - self._counted >= self.count_every_s
            if due:
                self._counted = now   # one thread lists; the others use the last count meanwhile
        if due:
            n = self._count_or_full()   # FULL: every hold refused until the next count
            with self._lock:
                self._others = max(0, n - self.held) if n >= 0 else -1
        with self._lock:
            return self._others + self.held if self._others >= 0 else -1

    def hold(self, fd: int) -> bool:
        """May the caller keep ``fd`` (just opened, already counted among the open descriptors) open across
        requests? True: it is counted held until :meth:`drop`. False (counted in ``refused``): keeping it
        would leave fewer than ``reserve`` descriptors free below the soft limit; the caller closes it and
        serves without it. Never raises."""
        if self.reserve == 0:
            with self._lock:
                self.held += 1
            return True
        limit = self.limit()
        now = time.monotonic()
        with self._lock:   # the common case: a recent count, one critical section
            if 0 <= self._counted and now - self._counted < self.count_every_s:
                return self._decide(limit, self._others + self.held if self._others >= 0 else -1, fd)
        est = self._estimate()
        with self._lock:
            return self._decide(limit, est, fd)

    def _decide(self, limit: int, est: int, fd: int) -> bool:
        # under self._lock: grant or refuse a hold of ``fd`` with ``est`` descriptors open (-1: unknown);
        # the kernel hands out the lowest free number, so every number below ``fd`` is in use
        in_use = max(est, fd + 1) if est >= 0 else fd + 1
        if limit < 0 or limit - in_use >= self.reserve:
            self.held += 1
            return True
        self.refused += 1
        return False

    def room(self) -> bool:
        """Is there room to open and hold one more descriptor without entering the reserve? (A check
        before an open, e.g. of the source file; not counted.) Never raises."""
        if self.reserve == 0:
            return True
        limit = self.limit()
        est = self._estimate()
        return limit < 0 or est < 0 or limit - est - 1 >= self.reserve

    def free(self) -> int:
        """Descriptors free below the soft limit now (the count at most :attr:`count_every_s` old, the read
        path's holds exact); 0 when they cannot be counted (none left to list them with). Never raises."""
        limit = self.limit()
        est = self._estimate()
        if limit < 0:
            return 1 << 20
        return max(0, limit - est) if est >= 0 else 0

    def refuse(self) -> None:
        """Count a hold refused by the caller after :meth:`room` said no."""
        with self._lock:
            self.refused += 1

    def drop(self) -> None:
        """A descriptor granted by :meth:`hold` was closed."""
        with self._lock:
            self.held = max(0, self.held - 1)

    def out_of_descriptors(self) -> None:
        """Count an open that failed for lack of a descriptor (EMFILE, ENFILE)."""
        with self._lock:
            self.failed += 1

    def stats(self) -> dict:
        """``{"open": int, "limit": int, "reserve": int, "held": int, "refused": int, "failed": int}``:
        descriptors open now (counted; -1 if they cannot be), the soft limit, the reserve, those the read
        path holds across requests, holds refused at the reserve (opens served without a held descriptor)
        and opens that failed for lack of one (EMFILE, ENFILE)."""
        n = self.count()
        with self._lock:
            if n >= 0:
                self._others, self._counted = max(0, n - self.held), time.monotonic()
            return {"open": n, "limit": self.limit(), "reserve": self.reserve, "held": self.held,
                    "refused": self.refused, "failed": self.failed}


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
