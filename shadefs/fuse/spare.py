"""Spare readers: a reader thread of the kernel front end that serves a miss itself is replaced when the
miss takes long, so a source that hangs never blocks the other opens of the mount.

A miss of a directory source is served on the reader thread that read its OPEN (no hand-off to a worker:
two thread switches fewer per miss). A read of a hung source (an NFS server that stops answering, a FIFO
where a file was) would then hold that reader, and with every reader in such a miss no request of the mount
would be read at all until ``--backend-timeout``. :class:`ReaderWatch` prevents that: a reader marks the
start and the end of each miss it serves (:meth:`ReaderWatch.begin`, :meth:`ReaderWatch.end`); one watch
thread looks at the misses in flight every ``after_s / 2`` while misses are being served and, for a miss
older than ``after_s`` (:data:`SPARE_AFTER_S`, a few ms: a miss of a local source takes ~0.1 ms), starts a
spare reader on the same ``/dev/fuse`` fd. The replaced reader finishes its miss (answered by it, by the
backend's deadline, or by an INTERRUPT on another reader) and then ends (:meth:`ReaderWatch.end` returns
True): the reader threads are the configured ones plus those still in a slow miss, never more.

The watch costs no thread switch per miss: a reader wakes it only when it is idle (no miss begun for
``idle_s``); while misses come it polls. Misses past ``max_replaced`` replaced readers still in flight are
not served on readers (:meth:`ReaderWatch.room`): the caller hands them to its workers.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Dict, List

from ..procutil import name_thread

__all__ = ["ReaderWatch", "SPARE_AFTER_S", "MAX_REPLACED"]

# seconds a miss may hold its reader thread before a spare reader is started in its place
SPARE_AFTER_S = 0.005
# replaced readers still in their miss at most; beyond, misses go to the workers until one returns
MAX_REPLACED = 64
# seconds without a miss begun after which the watch thread sleeps until the next one
IDLE_S = 1.0


class ReaderWatch:
    """Replaces reader threads held by a slow miss (module docstring).

    Args:
        start_spare: ``start_spare(fd)`` starts a reader thread on ``fd`` (called on the watch thread; must
            not block).
        after_s: seconds a miss may take before its reader is replaced (> 0).
        max_replaced: replaced readers in a miss at most before :meth:`room` says no (>= 1).
        idle_s: seconds without a miss begun before the watch thread stops polling.

    Raises:
        ValueError: ``after_s`` <= 0 or ``max_replaced`` < 1.

    Thread-safe. Counters: ``spares`` (spare readers started), ``replaced`` (replaced readers still in their
    miss), ``begun`` (misses marked).
    """

    def __init__(self, start_spare: Callable[[int], None], after_s: float = SPARE_AFTER_S,
                 max_replaced: int = MAX_REPLACED, idle_s: float = IDLE_S):
        if after_s <= 0:
            raise ValueError(f"after_s must be > 0, got {after_s}")
        if max_replaced < 1:
            raise ValueError(f"max_replaced must be >= 1, got {max_replaced}")
        self._start = start_spare
        self.after_s = float(after_s)
        self.max_replaced = int(max_replaced)
        self.idle_s = float(idle_s)
        self.spares = 0
        self.replaced = 0
        self.begun = 0
        self._lock = threading.Lock()
        self._inflight: Dict[int, list] = {}  # id(rec) -> rec: [started (monotonic s), fd, replaced]
        self._idle = True       # the watch thread sleeps (or is not started): begin wakes it
        self._wake = threading.Event()
        self._closed = False
        self._thread = None

    def room(self) -> bool:
        """May a miss be served on a reader now (fewer than ``max_replaced`` replaced readers in a miss)?"""
        return self.replaced < self.max_replaced

    def begin(self, fd: int) -> list:
        """A reader of ``fd`` starts serving a miss; returns the token for :meth:`end`."""
        rec = [time.monotonic(), fd, False]
        with self._lock:
            self._inflight[id(rec)] = rec
            self.begun += 1
            wake = self._idle
            self._idle = False
            if wake and self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._watch, name="fuse-spare-watch", daemon=True)
                self._thread.start()
                wake = False
        if wake:
            self._wake.set()
        return rec

    def end(self, rec: list) -> bool:
        """The miss of ``rec`` (:meth:`begin`) is over: True when its reader was replaced meanwhile (the
        caller's reader thread ends now: a spare serves in its place)."""
        with self._lock:
            self._inflight.pop(id(rec), None)
            if rec[2]:
                self.replaced -= 1
                return True
        return False

    def close(self) -> None:
        """Stop the watch thread (no more spares)."""
        with self._lock:
            self._closed = True
        self._wake.set()

    def _watch(self) -> None:
        name_thread()
        last_begun, last_busy = -1, time.monotonic()
        while True:
            due: List[list] = []
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                if self._inflight or self.begun != last_begun:
                    last_busy, last_begun = now, self.begun
                for rec in self._inflight.values():
                    if not rec[2] and now - rec[0] >= self.after_s:
                        rec[2] = True
                        self.replaced += 1
                        self.spares += 1
                        due.append(rec)
                idle = now - last_busy >= self.idle_s
                if idle:
                    self._idle = True
                    self._wake.clear()
            for rec in due:
                self._start(rec[1])
            if idle:
                self._wake.wait()
                last_busy = time.monotonic()
            else:
                time.sleep(self.after_s / 2)
