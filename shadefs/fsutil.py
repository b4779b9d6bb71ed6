"""Atomic file writes, shared by the disk tier, its checkpoints, the namespace snapshot and the simulator's
scores file: a temporary file is written, then renamed over its final name; on any failure the temporary is
unlinked (never left behind), and the final name keeps its old content. Also the one check of a private
directory (:func:`private_dir`) under a shared temporary directory, where another user could have planted
a symlink or a directory of their own."""
from __future__ import annotations

import itertools
import os
import stat
from typing import Optional

__all__ = ["atomic_write", "removing_on_error", "rename_into", "private_dir"]

_seq = itertools.count()


def atomic_write(path: str, data: bytes, *, tmp_dir: Optional[str] = None, fsync: bool = False,
                 mtime_ns: Optional[int] = None, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` so that ``path`` holds either its old content or all of ``data``.

    The bytes go to a temporary file in ``tmp_dir`` (default: the directory of ``path``; it must be on the
    same filesystem), optionally stamped with ``mtime_ns`` and fsync'd, then renamed over ``path``;
    a missing parent directory of ``path`` is created (0700).

    Raises:
        OSError: the write failed (ENOSPC, EIO, ...); no temporary file is left behind.
    """
    d = tmp_dir or os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.{next(_seq)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with removing_on_error(tmp):
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if mtime_ns is not None:
                os.utime(fd, ns=(mtime_ns, mtime_ns))
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        rename_into(tmp, path)


class removing_on_error:
    """``with removing_on_error(tmp): ...`` unlinks the file ``tmp`` when the block raises, then re-raises.

    Any exception counts, ``BaseException`` included (a KeyboardInterrupt or SystemExit mid-write leaves no
    temporary either); a block that ends normally leaves ``tmp`` alone (it was renamed, or is the caller's to
    keep). Failing to unlink (``OSError``: already gone, a read-only or failing disk) is ignored, so the
    block's own exception is the one that propagates. ``as`` gives ``tmp``.
    """

    __slots__ = ("path",)

    def __init__(self, path: str):
        self.path = path

    def __enter__(self) -> str:
        return self.path

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass
        return False   # re-raise


def rename_into(tmp: str, path: str) -> None:
    """``os.rename(tmp, path)``, creating ``path``'s missing parent directory (0700) and retrying once.

    Raises:
        OSError: the rename failed (``tmp`` is left where it was: the caller's ``removing_on_error`` unlinks it).
    """
    try:
        os.rename(tmp, path)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
        os.rename(tmp, path)


def private_dir(path: str, what: str) -> str:
    """Create ``path`` (mode 0700), or check that the existing one is a directory (not a symlink) owned by
    this process's effective uid that group and others cannot reach; returns ``path``.

    ``what`` names what goes there, for the messages (``"the control socket"``, ``"the log"``).

    Raises:
        PermissionError: ``path`` is a symlink or not a directory, belongs to another uid, or has group or
            other permission bits; the message says which, and how to fix it.
        OSError: it cannot be created (a missing parent, a read-only file system...).
    """
    try:
        os.mkdir(path, 0o700)
        # mkdir's mode is filtered by the umask; fchmod on what we opened, never through a symlink
        # swapped in meanwhile
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{path} is not a directory (a symlink?); refusing to put {what} there")
    if st.st_uid != os.geteuid():
        raise PermissionError(f"{path} belongs to uid {st.st_uid}, not to us ({os.geteuid()}); "
                              f"refusing to put {what} there")
    if st.st_mode & 0o077:
        raise PermissionError(f"{path} has mode {stat.S_IMODE(st.st_mode):o}, which others can reach; "
                              f"run 'chmod 700 {path}' or remove it")
    return path
