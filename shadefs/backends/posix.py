"""The posix backend: a local directory or an NFS / parallel-filesystem mount.

The listing is a parallel ``os.scandir`` over directories (metadata round trips dominate on NFS, so
several in flight at once). Reads are one ``open`` + ``readinto`` of exactly the snapshot size; a
file whose length changed since the scan is an error, never a short file. A missing file is ENOENT,
unless the whole source is gone (an empty or missing root: an NFS or bind mount went away), which is
an error (EIO) that heals when the source comes back.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import stat as stat_mod
from typing import Iterator, List, Tuple

from .base import Backend, BackendError, Entry

__all__ = ["PosixBackend"]


class PosixBackend(Backend):
    """Files under the directory ``url`` (a path, or ``file://`` + path).

    Options:
        scan_workers (int): directories listed in parallel (default 16).
    """

    scheme = "file"

    def __init__(self, url: str, scan_workers: int = 16, **options):
        super().__init__(url, **options)
        root = url[len("file://"):] if url.startswith("file://") else url
        self.root = os.path.abspath(root)
        self.scan_workers = int(scan_workers)

    def _full(self, path: str) -> str:
        return os.path.join(self.root, path)

    @staticmethod
    def _scan_dir(top: str, rel: str) -> Tuple[List[Entry], List[Tuple[str, str]]]:
        files: List[Entry] = []
        dirs: List[Tuple[str, str]] = []
        with os.scandir(top) as it:
            for de in it:
                name = de.name
                relname = f"{rel}/{name}" if rel else name
                try:
                    if de.is_dir(follow_symlinks=True):
                        dirs.append((de.path, relname))
                    elif de.is_file(follow_symlinks=True):
                        st = de.stat(follow_symlinks=True)
                        files.append(Entry(relname, st.st_size, st.st_mtime))
                except FileNotFoundError:
                    continue  # vanished during the scan (or a dangling symlink)
        return files, dirs

    def walk(self) -> Iterator[Entry]:
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"source {self.root!r} is not a directory")
        with cf.ThreadPoolExecutor(max_workers=self.scan_workers, thread_name_prefix="scan") as pool:
            pending = {pool.submit(self._scan_dir, self.root, "")}
            while pending:
                done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    try:
                        files, dirs = fut.result()
                    except OSError as e:
                        raise BackendError(f"listing {self.root!r} failed: {e}") from e
                    yield from files
                    for full, rel in dirs:
                        pending.add(pool.submit(self._scan_dir, full, rel))

    def read(self, path: str, size: int) -> bytes:
        full = self._full(path)
        try:
            with open(full, "rb", buffering=0) as f:
                buf = bytearray(size + 1)
                view = memoryview(buf)
                got = 0
                while got <= size:
                    n = f.readinto(view[got:])
                    if not n:
                        break
                    got += n
        except FileNotFoundError:
            if self._source_gone(full):
                raise BackendError(f"read {path!r}: the source {self.root!r} is unreachable (empty or "
                                   f"missing: an unmounted NFS or bind mount?)") from None
            raise
        except OSError as e:
            raise BackendError(f"read {path!r}: {e.strerror or e}") from e
        if got != size:
            raise BackendError(f"read {path!r}: {got if got <= size else 'more than'} bytes, "
                               f"the snapshot says {size} (the file changed under the mount)")
        del view
        buf = buf[:size]
        return bytes(buf)

    def _source_gone(self, full: str) -> bool:
        """For a missing file: is the whole source gone rather than this file? An unmounted NFS or bind
        mount leaves an empty directory (or none) where the dataset was; that is EIO, not ENOENT."""
        parent = os.path.dirname(full)
        try:
            if parent != self.root and os.path.isdir(parent):
                return False  # the file's directory is there: the file itself was removed
            with os.scandir(self.root) as it:
                return next(it, None) is None
        except OSError:
            return True

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        try:
            fd = os.open(self._full(path), os.O_RDONLY)
            try:
                return os.pread(fd, length, offset)
            finally:
                os.close(fd)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise BackendError(f"read {path!r} at {offset}: {e.strerror or e}") from e

    def stat(self, path: str) -> Tuple[int, float]:
        st = os.stat(self._full(path))
        if not stat_mod.S_ISREG(st.st_mode):
            raise FileNotFoundError(path)
        return st.st_size, st.st_mtime
