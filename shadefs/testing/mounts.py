"""Real shadefs mounts for tests and benchmarks: start through the CLI, wait, unmount cleanly.

One implementation of "mount, find the daemon, unmount and wait until the daemon has exited" for the
test fixtures (tests/conftest.py) and the benchmark scripts (shadefs.bench)::

    from shadefs.testing import Mount
    with Mount(src, mnt, ["--ram-cache", "1GiB"], log_file="/tmp/x.log") as m:
        ...                       # m.pid, m.stats(), m.log(), m.tracebacks()
    # unmounted here; the daemon has exited (or was killed after ``exit_timeout`` seconds)

Every wait is bounded (seconds given per call); nothing here waits forever.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence

from shadefs.cmdutil import is_mounted

__all__ = ["SHADEFS", "ShadefsError", "shadefs", "pid_alive", "proc_cpu_s", "proc_vm", "ctx_switches",
           "strace_counts", "wait_for", "wait_pid_gone", "force_unmount", "unmount", "Mount", "tracebacks"]

SHADEFS = [sys.executable, "-m", "shadefs"]
_PID = re.compile(r"\(pid (\d+)")


class ShadefsError(RuntimeError):
    """A ``shadefs`` command failed; the message carries its exit status and output."""


def shadefs(*args, check: bool = True, timeout: float = 120, env: Optional[Dict[str, str]] = None
            ) -> subprocess.CompletedProcess:
    """Run ``python -m shadefs ARGS`` (this interpreter) and return the CompletedProcess (text).

    Raises ShadefsError on a non-zero exit when ``check``; subprocess.TimeoutExpired after ``timeout`` s."""
    r = subprocess.run(SHADEFS + [str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                       env=env)
    if check and r.returncode != 0:
        raise ShadefsError(f"shadefs {' '.join(map(str, args))} failed ({r.returncode}): {r.stderr}{r.stdout}")
    return r


def pid_alive(pid: Optional[int]) -> bool:
    """Whether process ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def proc_cpu_s(pid: Optional[int]) -> Optional[float]:
    """User + system CPU seconds process ``pid`` has used so far (all its threads), from /proc; None if
    unknown (no such process)."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def ctx_switches(pid: int) -> int:
    """Context switches (voluntary + involuntary) of the threads of process ``pid`` alive now, from
    /proc/PID/task/*/status (a thread that has ended no longer counts)."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                n += sum(int(line.split()[1]) for line in f if line.startswith(("voluntary_ctxt_switches:",
                                                                                  "nonvoluntary_ctxt_switches:")))
        except OSError:
            pass  # the thread ended meanwhile
    return n


def proc_vm(pid: int) -> Dict[str, int]:
    """``{"VmRSS": bytes, "VmHWM": bytes}`` of process ``pid`` from /proc/PID/status (resident set size
    now and its high-water mark); both 0 once the process has exited."""
    out = {"VmRSS": 0, "VmHWM": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in out:
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def strace_counts(pid: int, run: Callable[[], object]) -> Dict[str, int]:
    """System calls of every thread of ``pid`` by name (calls made) while ``run()`` runs (``strace -c -f``,
    attached 0.5 s before ``run()``). Raises FileNotFoundError where strace is not installed."""
    fd, out = tempfile.mkstemp(prefix="shadefs-strace-")
    os.close(fd)
    p = subprocess.Popen(["strace", "-c", "-f", "-o", out, "-p", str(pid)], stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # attached to every thread
    run()
    p.terminate()
    p.wait(30)
    counts: Dict[str, int] = {}
    with open(out) as f:
        for line in f:
            m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", line)
            if m:
                counts[m.group(2)] = int(m.group(1))
    os.unlink(out)
    return counts


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02,
             what: str = "condition"):
    """Poll ``predicate()`` every ``interval`` s until it is truthy; return its value.

    Raises AssertionError (``what`` not met) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout:g} s")
        time.sleep(interval)


def wait_pid_gone(pid: Optional[int], timeout: float = 10.0) -> bool:
    """Wait up to ``timeout`` s for ``pid`` to exit; True if it is gone."""
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _fusermount() -> str:
    return shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount"


def force_unmount(path) -> None:
    """Lazy unmount of ``path`` (``fusermount -uz``, then ``umount -l``); errors ignored."""
    subprocess.run([_fusermount(), "-u", "-z", str(path)], capture_output=True)
    if is_mounted(str(path)):
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def unmount(mnt, pid: Optional[int] = None, exit_timeout: float = 30.0, kill: bool = True,
            log: Optional[Callable[[str], None]] = None) -> Optional[str]:
    """Unmount ``mnt`` and wait for its daemon ``pid`` to exit; returns None, or what went wrong.

    ``shadefs umount`` first; if the mount is still there, ``fusermount -u``, then a lazy unmount.
    Then waits up to ``exit_timeout`` s for ``pid``; with ``kill`` a daemon still running is SIGKILLed
    (and a mount left behind lazily unmounted). Every problem is returned (and passed to ``log``);
    nothing is raised, so a caller can unmount all its mounts."""
    mnt = str(mnt)
    errors: List[str] = []
    if is_mounted(mnt):
        try:
            r = shadefs("umount", mnt, check=False, timeout=60)
            failed = r.returncode != 0 and is_mounted(mnt)
            msg = (r.stderr or r.stdout).strip()
        except subprocess.TimeoutExpired:
            failed, msg = is_mounted(mnt), "timed out after 60 s"
        if failed:
            errors.append(f"shadefs umount {mnt} failed: {msg}")
            subprocess.run([_fusermount(), "-u", mnt], capture_output=True)
            if is_mounted(mnt):
                force_unmount(mnt)
    if pid and not wait_pid_gone(pid, exit_timeout):
        errors.append(f"daemon pid {pid} still running {exit_timeout:g} s after unmount")
        if kill:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            wait_pid_gone(pid, 5)
            if is_mounted(mnt):
                force_unmount(mnt)
    err = "; ".join(errors) or None
    if err and log:
        log(err)
    return err


def tracebacks(text: str) -> List[str]:
    """The Python tracebacks in a daemon log: each from its ``Traceback (most recent call last):`` line
    to the exception line (the first unindented line after it)."""
    out, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if "Traceback (most recent call last):" in line:
            block = [line]
            for nxt in lines[i + 1:]:
                block.append(nxt)
                if nxt and not nxt.startswith((" ", "\t")):
                    break
            out.append("\n".join(block))
    return out


class Mount:
    """A shadefs mount started with the real CLI (``shadefs mount SOURCE MOUNTPOINT ARGS --log-file LOG``).

    ``start()`` returns once the CLI reports the mount (it waits for the daemon to answer); ``pid`` is
    the daemon's process id. ``umount()`` unmounts and waits for the daemon to exit (bounded). Usable as
    a context manager (start on enter if not started, unmount on exit)."""

    def __init__(self, source, mountpoint, args: Sequence[str] = (), log_file=None,
                 env: Optional[Dict[str, str]] = None, mount_timeout: float = 120):
        self.source = str(source)
        self.path = str(mountpoint)
        self.args = [str(a) for a in args]
        self.log_file = str(log_file) if log_file else f"{self.path}.log"
        self.env = env
        self.mount_timeout = mount_timeout
        self.pid: Optional[int] = None
        self.result: Optional[subprocess.CompletedProcess] = None  # of the last successful start()

    def start(self, *args) -> "Mount":
        """Mount (again, at the same mountpoint and log file); ``args`` replace the options if given.

        Raises ShadefsError with the CLI's message and the log's last lines if the mount fails."""
        if args:
            self.args = [str(a) for a in args]
        if not is_mounted(self.path):  # a dead mount's root cannot be stat'ed (the CLI clears it)
            os.makedirs(self.path, exist_ok=True)
        r = shadefs("mount", self.source, self.path, "--log-file", self.log_file, *self.args, check=False,
                    timeout=self.mount_timeout, env=self.env)
        m = _PID.search(r.stdout)
        if r.returncode != 0 or not m:
            tail = "".join(self.log().splitlines(True)[-10:])
            raise ShadefsError(f"shadefs mount {self.source} {self.path} {' '.join(self.args)} failed "
                               f"({r.returncode}): {(r.stderr or r.stdout).strip()}\n{tail}")
        self.pid = int(m.group(1))
        self.result = r
        return self

    def stats(self) -> dict:
        """``shadefs stats MOUNTPOINT --json`` as a dict."""
        return json.loads(shadefs("stats", self.path, "--json", timeout=60, env=self.env).stdout)

    def full_stats(self) -> dict:
        """The daemon's full stats message over the control socket (see docs/protocol.md)."""
        from shadefs.control.client import ControlClient, find_endpoint

        c = ControlClient(find_endpoint(self.path))
        try:
            return c.stats()
        finally:
            c.close()

    def log(self) -> str:
        """The daemon's log so far ("" if it has none yet)."""
        try:
            with open(self.log_file, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def tracebacks(self) -> List[str]:
        """The tracebacks the daemon logged (see :func:`tracebacks`)."""
        return tracebacks(self.log())

    def mounted(self) -> bool:
        return is_mounted(self.path)

    def umount(self, exit_timeout: float = 30.0, log=None) -> Optional[str]:
        """Unmount and wait for the daemon to exit (see :func:`unmount`); None or what went wrong."""
        return unmount(self.path, self.pid, exit_timeout=exit_timeout, log=log)

    def __enter__(self) -> "Mount":
        return self if self.pid is not None and self.mounted() else self.start()

    def __exit__(self, *exc) -> None:
        self.umount()
