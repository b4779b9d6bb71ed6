"""Where cached bytes live: :class:`MemoryTier` (RAM) and :class:`DiskTier` (an NVMe directory).

A tier stores and returns exact copies of source files keyed by file id. It never decides what to keep:
admission, eviction and the byte budget belong to :class:`shadefs.cache.index.TierIndex` and its policy.
Tier methods are called without the cache lock held, so they must be safe from several threads.

Disk entries are written atomically (a temporary file in the same filesystem, then ``rename``) under
names hashed from the source URL and the file's path, so two mounts of different sources can share a
cache directory without colliding, and a crash leaves either a whole entry or none under its final name.
Each entry carries the source file's mtime (set before the rename), so a restarted daemon can tell a
valid entry from a stale one with one ``stat`` and without reading data (:mod:`shadefs.cache.persist`).
One daemon at a time owns a namespace: an ``flock`` on ``<namespace>/lock``, released by the kernel
when the daemon dies, however it dies.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import time
from typing import Dict, Optional

from ..fsutil import atomic_write

__all__ = ["MemoryTier", "DiskTier", "CorruptEntry", "DiskFloorReached", "CacheDirInUse"]


class CorruptEntry(OSError):
    """A cached entry is missing, truncated or otherwise unreadable; the caller drops it."""


class DiskFloorReached(OSError):
    """A write was refused because it would leave less than ``--disk-min-free`` on the cache filesystem."""

    def __init__(self, message: str):
        super().__init__(message)
        self.errno = errno.ENOSPC


class CacheDirInUse(OSError):
    """Another live daemon owns this cache namespace (same source, same cache directory)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.errno = errno.EBUSY


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
    sha256(relative path) hex; temporary files go to ``DIR/<namespace>/tmp/`` (emptied at start: a
    leftover there is a write a crash interrupted). The namespace directory is 0700 and entries 0600:
    cached training data is as private as the daemon's user.

    Args:
        root: the cache directory (created if missing).
        source_url: the mounted source, which names this cache's namespace inside ``root``.
        min_free: bytes to keep free on the cache filesystem; a write that would go below is refused
            with :class:`DiskFloorReached` (0: no floor).
        lock: take the namespace lock (a second daemon on the same source and directory fails).
        lock_wait_s: how long to wait for the lock (a daemon that was just unmounted may still be
            writing its last checkpoint).

    Raises:
        CacheDirInUse: ``lock`` and another process holds the namespace after ``lock_wait_s``.
        OSError: the directory cannot be created.
    """

    name = "disk"
    LOCK_FILE = "lock"

    @staticmethod
    def dir_for(root: str, source_url: str) -> str:
        """The namespace directory of ``source_url`` inside the cache directory ``root``."""
        ns = hashlib.sha256(source_url.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        return os.path.join(os.path.abspath(root), ns)

    def __init__(self, root: str, source_url: str, min_free: int = 0, lock: bool = True,
                 lock_wait_s: float = 5.0):
        self.root = os.path.abspath(root)
        self.dir = self.dir_for(root, source_url)
        self.tmp_dir = os.path.join(self.dir, "tmp")
        os.makedirs(self.tmp_dir, mode=0o700, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self._lock_file = None
        if lock:
            self._lock_file = open(os.path.join(self.dir, self.LOCK_FILE), "a+")
            deadline = time.monotonic() + lock_wait_s  # a daemon just unmounted may still be checkpointing
            while True:
                try:
                    fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() < deadline:
                        time.sleep(0.05)
                        continue
                    self._lock_file.seek(0)
                    owner = self._lock_file.read().strip() or "another process"
                    self._lock_file.close()
                    raise CacheDirInUse(f"cache directory {self.root!r} is in use for this source "
                                        f"by {owner}; give each mount of the same source its own --disk-cache")
            self._lock_file.seek(0)
            self._lock_file.truncate()
            self._lock_file.write(f"pid {os.getpid()}\n")
            self._lock_file.flush()
        # leftovers of a crash mid-write are never valid entries
        self.tmp_leftovers = 0
        for name in os.listdir(self.tmp_dir):
            try:
                os.unlink(os.path.join(self.tmp_dir, name))
                self.tmp_leftovers += 1
            except OSError:
                pass
        self.min_free = int(min_free)

    @staticmethod
    def key(relpath: str) -> str:
        return hashlib.sha256(relpath.encode("utf-8", "surrogateescape")).hexdigest()

    def entry_path(self, relpath: str) -> str:
        h = self.key(relpath)
        return os.path.join(self.dir, h[:2], h)

    def free_bytes(self) -> int:
        """Bytes available to us on the cache filesystem now (``statvfs``)."""
        st = os.statvfs(self.dir)
        return st.f_bavail * st.f_frsize

    def total_bytes(self) -> int:
        """Size of the cache filesystem in bytes (``statvfs``)."""
        st = os.statvfs(self.dir)
        return st.f_blocks * st.f_frsize

    def mtime_tolerance_ns(self) -> int:
        """How far an entry's mtime may be from the one we set (the filesystem's timestamp granularity).

        Probed with one temporary file: ext4/xfs/btrfs/tmpfs keep nanoseconds (tolerance 1 us, for float
        rounding); a filesystem that keeps seconds gets 1 s.
        """
        probe = os.path.join(self.tmp_dir, f"probe.{os.getpid()}")
        want = 1_600_000_000_123_456_789
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.utime(fd, ns=(want, want))
            diff = abs(os.fstat(fd).st_mtime_ns - want)
        finally:
            os.close(fd)
            os.unlink(probe)
        return 1000 if diff < 1000 else 10 ** len(str(diff))

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

    def put(self, relpath: str, data: bytes, mtime_ns: Optional[int] = None) -> None:
        """Write an entry atomically (temporary file + rename), stamped with the source's ``mtime_ns``.

        Raises:
            DiskFloorReached: the write would leave less than ``min_free`` bytes free (nothing written).
            OSError: the write failed (for example ENOSPC); no partial entry is left behind.
        """
        if self.min_free:
            free = self.free_bytes()
            if free - len(data) < self.min_free:
                raise DiskFloorReached(f"{free} bytes free on the cache filesystem, writing {len(data)} "
                                       f"would go below --disk-min-free ({self.min_free} bytes)")
        atomic_write(self.entry_path(relpath), data, tmp_dir=self.tmp_dir, mtime_ns=mtime_ns)

    def delete(self, relpath: str) -> None:
        self.delete_entry(self.entry_path(relpath))

    @staticmethod
    def delete_entry(path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            pass  # a failing cache disk: the entry is out of the index already, the reload drops it

    def clear(self) -> None:
        """Remove every entry of this namespace (keeps the directory, the lock and the tmp folder)."""
        for name in os.listdir(self.dir):
            if len(name) == 2:
                shutil.rmtree(os.path.join(self.dir, name), ignore_errors=True)

    def close(self) -> None:
        """Release the namespace lock. Idempotent."""
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None
