"""The access trace (``shadefs mount --trace FILE``): one CSV row per file open.

Columns: ``time_s,path,size_bytes,outcome`` -- monotonic seconds since the mount, the path relative to
the mount root, the file size in bytes, and ``ram`` | ``disk`` | ``miss``. Rows are buffered in memory
and written in blocks; :meth:`TraceWriter.close` flushes. ``shadefs simulate`` replays these files.
"""
from __future__ import annotations

import csv
import io
import time

__all__ = ["TraceWriter", "HEADER"]

HEADER = ("time_s", "path", "size_bytes", "outcome")


class TraceWriter:
    """Append open events to ``path`` (truncated at start). Not thread-safe: the cache lock serialises."""

    def __init__(self, path: str, flush_every: int = 4096, clock=time.monotonic):
        self._f = open(path, "w", newline="", encoding="utf-8", errors="surrogateescape")
        self._buf = io.StringIO()
        self._w = csv.writer(self._buf, lineterminator="\n")
        self._w.writerow(HEADER)
        self._n = 0
        self._flush_every = flush_every
        self._clock = clock
        self._t0 = clock()

    def record(self, path: str, size: int, outcome: str) -> None:
        self._w.writerow((f"{self._clock() - self._t0:.6f}", path, size, outcome))
        self._n += 1
        if self._n >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        self._f.write(self._buf.getvalue())
        self._f.flush()
        self._buf.seek(0)
        self._buf.truncate()
        self._n = 0

    def close(self) -> None:
        if not self._f.closed:
            self.flush()
            self._f.close()
