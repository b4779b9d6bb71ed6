"""A deadline on every backend read (``--backend-timeout SECONDS``).

:class:`TimeoutBackend` wraps any backend: the caller of a ``read``, ``read_range`` or ``stat`` is answered
within ``timeout_s``. At the deadline it gets :class:`BackendError` (EIO), logged with the path, never a
short or empty file. A read may stay stuck in the kernel (a hung NFS server, a FIFO with no writer:
``open()`` itself blocks and cannot be interrupted from Python); its thread is *abandoned*, and when the
stuck call finally returns its result is dropped.

Two ways to wait, chosen per calling thread:

- **On the caller's thread, under a watchdog** (the caller registered what to do at the deadline with
  :func:`on_deadline`: the kernel front end's workers answer their request EIO, a fetch's leader fails
  the opens waiting on it). The read runs on the thread that asked for it; one watchdog thread per
  backend checks the deadlines of the reads in flight (it sleeps until the oldest one's deadline: all
  have the same ``timeout_s``) and, at a deadline, counts the read stuck and calls the thread's
  handlers with the :class:`BackendError`. The stuck thread is the caller's own (it is abandoned: its
  request is answered already); when its call returns it gets the same error, the result dropped. A
  read costs a dict insert and delete under a lock: no thread hand-off.
- **Handed to a worker thread** (any other caller: its thread must get the error itself at the
  deadline). The caller waits at most ``timeout_s`` on the worker's result; a worker past the deadline
  no longer counts as a worker, a fresh thread serves the next read. A hand-off costs ~20-50 us per read
  (a queue put, a future, two thread switches).

A file whose read is stuck fails fast: while an abandoned read of a path has not returned, every
further read or stat of that same path fails at once with EIO (logged once per stuck episode) instead of
waiting out a deadline of its own behind the same hung server. So a streamed file (one no tier admits,
read by ranges: one backend call per kernel READ) answers all its readers EIO within one deadline, not one
deadline per READ the kernel issues or retries, and a dead file costs one stuck thread, not one per
attempt. When the stuck call returns, the path is tried normally again.

Abandoned reads are bounded overall too (``max_stuck``, default 64): with that many reads stuck, a
further read of any path fails at once with EIO, so a dead source costs a bounded number of threads. The
listing (``walk``) is not bounded here (a big listing takes long legitimately); the fsspec backend bounds
each of its requests with its own connect/read timeouts.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import queue
import threading
import time
from typing import Callable, Dict, Iterator, List, Optional, Tuple, TypeVar

from ..procutil import name_thread
from .base import Backend, BackendError, Entry

__all__ = ["TimeoutBackend", "on_deadline"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_local = threading.local()  # .handlers: the calling thread's deadline handlers (on_deadline), innermost last


class on_deadline:
    """``with on_deadline(handler):`` reads of a :class:`TimeoutBackend` on this thread run on it, under the
    backend's watchdog: if one is still running at its deadline, the watchdog thread calls ``handler(err)``
    (``err``: the :class:`BackendError` the read will raise when it returns), then every handler of an
    enclosing ``with`` on this thread, innermost first. A handler answers the read's waiters in the
    thread's stead (the thread itself is stuck); it runs on the watchdog thread, must not block, and
    whatever it raises is logged, never propagated.

    ``answers=False``: the handler only joins those of an enclosing ``with`` (a fetch's leader telling
    its waiters); on a thread where no enclosing handler answers the caller, reads are still handed to a
    worker thread (the caller gets its error at the deadline itself)."""

    __slots__ = ("handler", "answers")

    def __init__(self, handler: Callable[[BaseException], None], answers: bool = True):
        self.handler, self.answers = handler, answers

    def __enter__(self) -> "on_deadline":
        stack = getattr(_local, "handlers", None)
        if stack is None:
            stack = _local.handlers = []
            _local.answering = 0
        stack.append(self.handler)
        _local.answering += self.answers
        return self

    def __exit__(self, *exc) -> None:
        _local.handlers.pop()
        _local.answering -= self.answers


class _InFlight:
    """A read running on its caller's thread, watched (``timed_out``: the watchdog counted it stuck)."""

    __slots__ = ("deadline", "started", "what", "key", "handlers", "timed_out")

    def __init__(self, started: float, deadline: float, what: str, key: str, handlers: tuple):
        self.started, self.deadline, self.what, self.key = started, deadline, what, key
        self.handlers = handlers
        self.timed_out = False


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
        self.watched = 0      # reads run on their caller's thread under the watchdog (on_deadline)
        # reads in flight on their callers' threads, oldest first (so earliest deadline first)
        self._inflight: Dict[_InFlight, None] = {}
        self._watchdog: Optional[threading.Thread] = None
        self._closing = threading.Event()

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
            fn, fut, drop = task
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - handed to the waiting reader
                    fut.set_exception(e)
            with self._lock:
                abandoned = worker.abandoned
                if abandoned:  # the reader got EIO long ago: drop the result, end the thread
                    self.threads -= 1
                    self._stuck_returned(worker.key)
            if abandoned:
                log.info("a backend read that timed out returned after %.1f s", time.monotonic() - worker.started)
                if drop is not None and fut.done() and fut.exception() is None:
                    drop(fut.result())
                return
            with self._lock:
                if len(self._idle) >= self.max_idle:
                    self.threads -= 1
                    return
                self._idle.append(worker)

    def _refuse(self, what: str, key: str) -> None:
        """Under self._lock: raise BackendError (counted in ``refused``) if ``key``'s read is stuck or
        ``max_stuck`` reads are; the caller logs nothing more."""
        rec = self._stuck_paths.get(key)
        if rec is not None:
            self.refused += 1
            age = time.monotonic() - rec[1]
            first = not rec[2]
            rec[2] = True
            msg = (f"{what}: an earlier read of this file has been stuck in the backend for {age:.1f} s "
                   f"(past the {self.timeout_s:g} s --backend-timeout); failing at once")
            if first:  # once per stuck episode: a streamed file's every READ would land here
                log.error("%s (further reads of it fail the same way until it returns)", msg)
            raise BackendError(msg)
        if self.stuck >= self.max_stuck:
            self.refused += 1
            msg = (f"{what}: {self.max_stuck} backend reads are stuck past the {self.timeout_s:g} s "
                   f"timeout; failing at once")
            log.error("%s", msg)
            raise BackendError(msg)

    def _call(self, fn: Callable[[], T], what: str, key: str, drop: Optional[Callable[[T], None]] = None) -> T:
        # ``drop``: called with the result of a call that returned after its deadline (dropped; e.g. an fd
        # to close)
        if getattr(_local, "answering", 0):
            return self._call_watched(fn, what, key, tuple(_local.handlers), drop)
        with self._lock:
            self._refuse(what, key)
            worker = self._idle.pop() if self._idle else None
            if worker is None:
                worker = _Worker()
                self.threads += 1
                new = True
            else:
                new = False
        if new:
            threading.Thread(target=self._run, args=(worker,), name="shadefs-backend", daemon=True).start()
        fut: cf.Future = cf.Future()
        worker.started = time.monotonic()
        worker.tasks.put((fn, fut, drop))
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

    # -- reads on the caller's thread, under the watchdog --------------------------------------------
    def _call_watched(self, fn: Callable[[], T], what: str, key: str, handlers: tuple,
                      drop: Optional[Callable[[T], None]] = None) -> T:
        now = time.monotonic()
        rec = _InFlight(now, now + self.timeout_s, what, key, handlers)
        with self._lock:
            self._refuse(what, key)
            self._inflight[rec] = None
            self.watched += 1
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watch, name="shadefs-deadline", daemon=True)
                self._watchdog.start()
        try:
            result = fn()
        except BaseException:
            if not self._returned(rec):
                raise
        else:
            if not self._returned(rec):
                return result
            if drop is not None:
                drop(result)
        # past its deadline: its waiters were answered EIO by the handlers; this late return gets the same
        raise BackendError(f"{what}: no answer from the backend within {self.timeout_s:g} s (--backend-timeout); "
                           f"answered after {time.monotonic() - rec.started:.1f} s, the result dropped")

    def _stuck_returned(self, key: str) -> None:
        """A read that timed out on path ``key`` returned (called under ``_lock``): one stuck read fewer,
        and the path is no longer marked stuck once none of its reads is."""
        self.stuck -= 1
        stuck = self._stuck_paths.get(key)
        if stuck is not None:
            stuck[0] -= 1
            if stuck[0] <= 0:  # the path answers again: its next read is tried normally
                del self._stuck_paths[key]

    def _returned(self, rec: _InFlight) -> bool:
        """A watched read returned: True if it had timed out (then it no longer counts as stuck)."""
        with self._lock:
            if not rec.timed_out:
                del self._inflight[rec]
                return False
            self._stuck_returned(rec.key)
        log.info("a backend read that timed out returned after %.1f s", time.monotonic() - rec.started)
        return True

    def _watch(self) -> None:
        """The watchdog: sleep until the oldest watched read's deadline (reads all have ``timeout_s``, so
        a read that starts while none is watched is due no sooner than ``timeout_s`` from now: nobody needs
        to wake the watchdog), then count every read past its deadline stuck and call its handlers."""
        name_thread()
        while True:
            due: List[_InFlight] = []
            with self._lock:
                now = time.monotonic()
                wait = self.timeout_s
                while self._inflight:
                    rec = next(iter(self._inflight))
                    if rec.deadline > now:
                        wait = rec.deadline - now
                        break
                    del self._inflight[rec]
                    rec.timed_out = True
                    self.stuck += 1
                    self.timeouts += 1
                    stuck = self._stuck_paths.get(rec.key)
                    if stuck is None:
                        self._stuck_paths[rec.key] = [1, rec.started, False]
                    else:
                        stuck[0] += 1
                    due.append(rec)
            for rec in due:
                msg = f"{rec.what}: no answer from the backend within {self.timeout_s:g} s (--backend-timeout)"
                log.error("%s", msg)
                err = BackendError(msg)
                for handler in reversed(rec.handlers):
                    try:
                        handler(err)
                    except Exception:  # noqa: BLE001 - a handler's bug must not stop the watchdog
                        log.exception("deadline handler of %s", rec.what)
            if self._closing.wait(wait):
                return

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

    @property
    def open_source(self) -> Optional[Callable[[str, int], int]]:
        """The inner backend's ``open_source(path, size)`` (an fd of the checked source file: passthrough to
        the source file) under the deadline, as a read: a source file whose open hangs (a FIFO with no
        writer, a hung NFS server) fails with BackendError (EIO) at ``timeout_s``, and the fd of an open
        that returns after it is closed. None where the inner backend opens no source file (object stores)."""
        inner = getattr(self.inner, "open_source", None)
        if inner is None:
            return None
        return lambda path, size: self._call(lambda: inner(path, size), f"open {path!r}", path, os.close)

    def attach(self, namespace, follow_symlinks: bool = False) -> None:
        self.inner.attach(namespace, follow_symlinks)

    def describe(self) -> str:
        return self.inner.describe()

    def close(self) -> None:
        self._closing.set()
        self.inner.close()

    def __getattr__(self, name):
        # backend-specific attributes (root, fs, protocol, retry, ...) are the inner backend's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
