"""A deadline on every backend read (``--backend-timeout SECONDS``).

:class:`TimeoutBackend` wraps any backend: each ``read``, ``read_range`` and ``stat`` runs on a worker
thread and the caller waits at most ``timeout_s``. At the deadline the caller gets
:class:`BackendError` (EIO), logged with the path, never a short or empty file. The worker may stay stuck
in the kernel (a hung NFS server, a FIFO with no writer: ``open()`` itself blocks and cannot be
interrupted from Python); it is *abandoned*: it no longer counts as a worker, a fresh thread serves the
next read, and when the stuck call finally returns its result is dropped and the thread exits.

A file whose read is stuck fails fast: while an abandoned read of a path has not returned, every
further read or stat of that same path fails at once with EIO (logged once per stuck episode) instead of
waiting out a deadline of its own behind the same hung server. So a streamed file (one no tier admits,
read by ranges: one backend call per kernel READ) answers all its readers EIO within one deadline, not one
deadline per READ the kernel issues or retries, and a dead file costs one stuck thread, not one per
attempt. When the stuck call returns, the path is tried normally again.

Abandoned threads are bounded overall too (``max_stuck``, default 64): with that many reads stuck, a
further read of any path fails at once with EIO, so a dead source costs a bounded number of threads. The listing (``walk``) is not bounded here (a big
listing takes long legitimately); the fsspec backend bounds each of its requests with its own
connect/read timeouts.

The hand-off to a worker costs ~20-50 us per read (a queue put and a future), paid only by misses.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import queue
import threading
import time
from typing import Callable, Dict, Iterator, List, Tuple, TypeVar

from ..procutil import name_thread
from .base import Backend, BackendError, Entry

__all__ = ["TimeoutBackend"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class _Worker:
    __slots__ = ("tasks", "abandoned", "started", "key")

    def __init__(self):
        self.tasks: "queue.SimpleQueue" = queue.SimpleQueue()
        self.abandoned = False
        self.started = 0.0
        self.key = ""


class TimeoutBackend(Backend):
    """``inner`` with a deadline of ``timeout_s`` seconds on every read (see the module docstring).

    Args:
        inner: the backend doing the reads.
        timeout_s: seconds (> 0) a read may take, retries of the inner backend included.
        max_stuck: abandoned reads still stuck at most; beyond, reads fail at once (EIO).
        max_idle: idle worker threads kept for reuse.

    Raises (constructor):
        ValueError: ``timeout_s`` <= 0 or ``max_stuck`` < 1.
    """

    def __init__(self, inner: Backend, timeout_s: float, max_stuck: int = 64, max_idle: int = 32):
        if not timeout_s > 0:
            raise ValueError(f"backend timeout must be > 0 seconds, got {timeout_s}")
        if max_stuck < 1:
            raise ValueError(f"max_stuck must be >= 1, got {max_stuck}")
        super().__init__(inner.url)
        self.inner = inner
        self.scheme = inner.scheme
        self.etags_are_versions = inner.etags_are_versions
        self.timeout_s = float(timeout_s)
        self.max_stuck = int(max_stuck)
        self.max_idle = int(max_idle)
        self._lock = threading.Lock()
        self._idle: List[_Worker] = []
        self.stuck = 0        # abandoned reads not returned yet
        self.timeouts = 0     # reads that hit the deadline (and were answered EIO)
        self.refused = 0      # reads failed at once (max_stuck reads stuck, or this path's read stuck)
        # path -> [abandoned calls of it not returned yet, monotonic time the first was started, logged]
        self._stuck_paths: Dict[str, list] = {}
        self.threads = 0      # worker threads alive (idle, busy or stuck)

    # -- the worker pool ---------------------------------------------------------------------------
    def _run(self, worker: _Worker) -> None:
        name_thread()
        while True:
            try:
                task = worker.tasks.get(timeout=60.0)
            except queue.Empty:
                with self._lock:  # idle for a minute: leave, unless a task is being handed over
                    if worker in self._idle and worker.tasks.empty():
                        self._idle.remove(worker)
                        self.threads -= 1
                        return
                continue
            fn, fut = task
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - handed to the waiting reader
                    fut.set_exception(e)
            with self._lock:
                if worker.abandoned:  # the reader got EIO long ago: drop the result, end the thread
                    self.stuck -= 1
                    self.threads -= 1
                    rec = self._stuck_paths.get(worker.key)
                    if rec is not None:
                        rec[0] -= 1
                        if rec[0] <= 0:  # the path answers again: its next read is tried normally
                            del self._stuck_paths[worker.key]
                    log.info("a backend read that timed out returned after %.1f s",
                             time.monotonic() - worker.started)
                    return
                if len(self._idle) >= self.max_idle:
                    self.threads -= 1
                    return
                self._idle.append(worker)

    def _call(self, fn: Callable[[], T], what: str, key: str) -> T:
        with self._lock:
            rec = self._stuck_paths.get(key)
            if rec is not None:
                self.refused += 1
                age = time.monotonic() - rec[1]
                first = not rec[2]
                rec[2] = True
            elif self.stuck >= self.max_stuck:
                self.refused += 1
                refused = True
            else:
                refused = False
                worker = self._idle.pop() if self._idle else None
                if worker is None:
                    worker = _Worker()
                    self.threads += 1
                    new = True
                else:
                    new = False
        if rec is not None:
            msg = (f"{what}: an earlier read of this file has been stuck in the backend for {age:.1f} s "
                   f"(past the {self.timeout_s:g} s --backend-timeout); failing at once")
            if first:  # once per stuck episode: a streamed file's every READ would land here
                log.error("%s (further reads of it fail the same way until it returns)", msg)
            raise BackendError(msg)
        if refused:
            msg = (f"{what}: {self.max_stuck} backend reads are stuck past the {self.timeout_s:g} s "
                   f"timeout; failing at once")
            log.error("%s", msg)
            raise BackendError(msg)
        if new:
            threading.Thread(target=self._run, args=(worker,), name="shadefs-backend", daemon=True).start()
        fut: cf.Future = cf.Future()
        worker.started = time.monotonic()
        worker.tasks.put((fn, fut))
        try:
            return fut.result(self.timeout_s)
        except cf.TimeoutError:
            pass
        with self._lock:
            if fut.done():  # it finished just now: the worker went back to the pool itself
                late = True
            else:
                late = False
                worker.abandoned = True
                worker.key = key
                self.stuck += 1
                self.timeouts += 1
                rec = self._stuck_paths.get(key)
                if rec is None:
                    self._stuck_paths[key] = [1, worker.started, False]
                else:
                    rec[0] += 1
        if late:
            return fut.result()
        msg = f"{what}: no answer from the backend within {self.timeout_s:g} s (--backend-timeout)"
        log.error("%s", msg)
        raise BackendError(msg)

    # -- the backend contract ----------------------------------------------------------------------
    def walk(self) -> Iterator[Entry]:
        return self.inner.walk()

    # the scan and the snapshot checks are the inner backend's own (posix: the safe view of the source,
    # its skip report, directory mtimes): the base class's generic versions would silently replace them
    def scan(self, follow_symlinks: bool = False):
        return self.inner.scan(follow_symlinks)

    def snapshot_key(self, follow_symlinks: bool):
        return self.inner.snapshot_key(follow_symlinks)

    def snapshot_changed(self, *args, **kwargs):
        return self.inner.snapshot_changed(*args, **kwargs)

    def read(self, path: str, size: int) -> bytes:
        return self._call(lambda: self.inner.read(path, size), f"read {path!r}", path)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        return self._call(lambda: self.inner.read_range(path, offset, length), f"read {path!r} at {offset}", path)

    def stat(self, path: str) -> Tuple[int, int]:
        return self._call(lambda: self.inner.stat(path), f"stat {path!r}", path)

    def identify(self, path: str) -> Tuple[int, int, int]:
        return self._call(lambda: self.inner.identify(path), f"stat {path!r}", path)

    def attach(self, namespace, follow_symlinks: bool = False) -> None:
        self.inner.attach(namespace, follow_symlinks)

    def describe(self) -> str:
        return self.inner.describe()

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name):
        # backend-specific attributes (root, fs, protocol, retry, ...) are the inner backend's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
