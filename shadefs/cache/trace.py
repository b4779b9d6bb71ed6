"""The access trace (``shadefs mount --trace FILE``): one CSV row per file open.

Columns: ``time_s,path,size_bytes,outcome`` -- monotonic seconds since the mount, the path relative to
the mount root, the file size in bytes, and ``ram`` | ``disk`` | ``miss``. ``shadefs simulate`` replays
these files.

:meth:`TraceWriter.record` runs under the cache lock on every open, so it only appends a tuple to a
deque (~0.1 us): no formatting, no I/O. A writer thread (:meth:`TraceWriter.start`, started after the
mount exists) formats and writes the rows in blocks; without it (the simulator, tests) a block is
written inline once ``flush_every`` rows are buffered. The buffer is bounded (``max_rows``): rows beyond
it are dropped and counted (``dropped``, logged at close) rather than growing memory without bound.
:meth:`TraceWriter.flush` writes everything recorded so far; :meth:`TraceWriter.close` stops the thread
and flushes.
"""
from __future__ import annotations

import collections
import csv
import io
import logging
import threading
import time
from typing import Optional

__all__ = ["TraceWriter", "HEADER"]

HEADER = ("time_s", "path", "size_bytes", "outcome")

log = logging.getLogger("shadefs.trace")


class TraceWriter:
    """Append open events to ``path`` (truncated at start).

    Args:
        path: the CSV file.
        flush_every: rows per written block (and the wake-up threshold of the writer thread).
        clock: seconds, monotonic.
        max_rows: rows buffered at most while the writer lags; more are dropped and counted.
        interval_s: the writer thread writes at least this often (seconds) when rows are waiting.

    ``record`` may be called from any thread (it is cheap and thread-safe); ``flush`` and ``close``
    serialise on the writer's own lock, never the cache lock.
    """

    def __init__(self, path: str, flush_every: int = 4096, clock=time.monotonic, max_rows: int = 1 << 20,
                 interval_s: float = 0.2):
        self._f = open(path, "w", newline="", encoding="utf-8", errors="surrogateescape")
        self._rows: "collections.deque[tuple]" = collections.deque()
        self._io_lock = threading.Lock()
        self._f.write(",".join(HEADER) + "\n")
        self._flush_every = int(flush_every)
        self._max_rows = int(max_rows)
        self._interval_s = float(interval_s)
        self._clock = clock
        self._t0 = clock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.dropped = 0
        self.written = 0

    def record(self, path: str, size: int, outcome: str) -> None:
        """Buffer one row (O(1), no formatting)."""
        rows = self._rows
        n = len(rows)
        if n >= self._max_rows:
            self.dropped += 1
            return
        rows.append((self._clock() - self._t0, path, size, outcome))
        if n + 1 == self._flush_every:
            if self._thread is not None:
                self._wake.set()
            else:
                self.flush()

    def start(self) -> None:
        """Start the writer thread (after the daemon forked and mounted). Idempotent."""
        if self._thread is None and not self._f.closed:
            self._thread = threading.Thread(target=self._run, name="shadefs-trace", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._interval_s)
            self._wake.clear()
            if self._rows:
                self.flush()

    def flush(self) -> None:
        """Write every row recorded so far."""
        with self._io_lock:
            if self._f.closed:
                return
            rows = self._rows
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            n = 0
            while rows:
                try:
                    t, path, size, outcome = rows.popleft()
                except IndexError:
                    break
                w.writerow((f"{t:.6f}", path, size, outcome))
                n += 1
                if n % 65536 == 0:
                    self._f.write(buf.getvalue())
                    buf.seek(0)
                    buf.truncate()
            self._f.write(buf.getvalue())
            self._f.flush()
            self.written += n

    def close(self) -> None:
        """Stop the writer thread and write what is buffered. Idempotent."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(30)
        self._thread = None
        self.flush()
        with self._io_lock:
            if not self._f.closed:
                self._f.close()
                if self.dropped:
                    log.warning("trace: %d rows dropped (the writer fell %d rows behind)",
                                self.dropped, self._max_rows)
