"""The kernel front end's worker threads: what may block (a miss, a READ of a file streamed by ranges)
runs on a pool that grows with the work in flight and shrinks when idle."""
from __future__ import annotations

import logging
import queue
import threading

from ..procutil import name_thread

log = logging.getLogger("shadefs.fuse")


class Workers:
    """A thread pool that grows when every worker is busy (a miss never queues behind hung misses) and
    shrinks after ``idle_s`` seconds without work. At ``max_threads`` further work queues."""

    def __init__(self, max_threads: int = 256, idle_s: float = 30.0):
        self.max_threads, self.idle_s = max_threads, idle_s
        self._q: "queue.SimpleQueue" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0        # waiting threads not yet promised an item (negative: items queued at the cap)
        self.threads = 0
        self.peak = 0

    def submit(self, fn, *args) -> None:
        with self._lock:
            spawn = self._idle <= 0 and self.threads < self.max_threads
            if spawn:
                self.threads += 1
                self.peak = max(self.peak, self.threads)
            else:
                self._idle -= 1
        self._q.put((fn, args))
        if spawn:
            threading.Thread(target=self._run, name="fuse-worker", daemon=True).start()

    def _run(self) -> None:
        name_thread()
        while True:
            try:
                fn, args = self._q.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:
                        self._idle -= 1
                        self.threads -= 1
                        return
                continue
            try:
                fn(*args)
            except Exception:
                log.exception("FUSE worker: unexpected error")
            with self._lock:
                self._idle += 1
