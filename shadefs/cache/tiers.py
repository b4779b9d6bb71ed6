"""Where cached bytes live: :class:`MemoryTier` (RAM) and :class:`DiskTier` (an NVMe directory).

A tier stores and returns exact copies of source files keyed by file id. It never decides what to keep:
admission, eviction and the byte budget belong to :class:`shadefs.cache.index.TierIndex` and its policy.
Tier methods are called without the cache lock held, so they must be safe from several threads.

Disk entries are written atomically (a temporary file in the same filesystem, then ``rename``) under
names hashed from the source URL and the file's path, so two mounts of different sources can share a
cache directory without colliding, and a crash leaves either a whole entry or none under its final name.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import threading
from typing import Dict, Optional

__all__ = ["MemoryTier", "DiskTier", "CorruptEntry"]


class CorruptEntry(OSError):
    """A cached entry is missing, truncated or otherwise unreadable; the caller drops it."""


class MemoryTier:
    """Bytes in a dict, fid -> immutable ``bytes`` (shared with readers without copying)."""

    name = "ram"

    def __init__(self):
        self._data: Dict[int, bytes] = {}

    def get(self, fid: int) -> Optional[bytes]:
        return self._data.get(fid)

    def put(self, fid: int, data: bytes) -> None:
        self._data[fid] = data

    def pop(self, fid: int) -> Optional[bytes]:
        return self._data.pop(fid, None)

    def clear(self) -> None:
        self._data.clear()


class DiskTier:
    """Whole-file entries in a directory on local (NVMe) storage.

    Layout: ``DIR/<namespace>/<h[:2]>/<h>`` where ``namespace`` = sha256(source URL)[:16] and ``h`` =
    sha256(relative path) hex; temporary files go to ``DIR/<namespace>/tmp/``.

    Args:
        root: the cache directory (created if missing).
        source_url: the mounted source, which names this cache's namespace inside ``root``.
    """

    name = "disk"

    def __init__(self, root: str, source_url: str):
        self.root = os.path.abspath(root)
        ns = hashlib.sha256(source_url.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        self.dir = os.path.join(self.root, ns)
        self.tmp_dir = os.path.join(self.dir, "tmp")
        os.makedirs(self.tmp_dir, exist_ok=True)
        # leftovers of a crash mid-write are never valid entries
        for name in os.listdir(self.tmp_dir):
            try:
                os.unlink(os.path.join(self.tmp_dir, name))
            except OSError:
                pass
        self._seq = 0
        self._seq_lock = threading.Lock()

    @staticmethod
    def key(relpath: str) -> str:
        return hashlib.sha256(relpath.encode("utf-8", "surrogateescape")).hexdigest()

    def entry_path(self, relpath: str) -> str:
        h = self.key(relpath)
        return os.path.join(self.dir, h[:2], h)

    def get(self, relpath: str, size: int) -> bytes:
        """Read a whole entry of ``size`` bytes.

        Raises:
            CorruptEntry: missing, or not exactly ``size`` bytes.
        """
        path = self.entry_path(relpath)
        try:
            with open(path, "rb", buffering=0) as f:
                data = f.read(size + 1)
                while len(data) < size + 1:  # short reads are legal; loop until EOF
                    more = f.read(size + 1 - len(data))
                    if not more:
                        break
                    data += more
        except OSError as e:
            raise CorruptEntry(f"disk entry for {relpath!r}: {e.strerror or e}") from e
        if len(data) != size:
            raise CorruptEntry(f"disk entry for {relpath!r} has {len(data)} bytes, expected {size}")
        return data

    def put(self, relpath: str, data: bytes) -> None:
        """Write an entry atomically (temporary file + rename).

        Raises:
            OSError: the write failed (for example ENOSPC); no partial entry is left behind.
        """
        final = self.entry_path(relpath)
        with self._seq_lock:
            self._seq += 1
            tmp = os.path.join(self.tmp_dir, f"{os.getpid()}.{self._seq}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
            finally:
                os.close(fd)
            try:
                os.rename(tmp, final)
            except FileNotFoundError:
                os.makedirs(os.path.dirname(final), exist_ok=True)
                os.rename(tmp, final)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def delete(self, relpath: str) -> None:
        try:
            os.unlink(self.entry_path(relpath))
        except FileNotFoundError:
            pass

    def clear(self) -> None:
        """Remove every entry of this namespace (keeps the directory)."""
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.tmp_dir, exist_ok=True)
