"""Atomic file writes, shared by the disk tier, its checkpoints and the simulator's scores file."""
from __future__ import annotations

import itertools
import os
from typing import Optional

__all__ = ["atomic_write"]

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
    try:
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
        try:
            os.rename(tmp, path)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
            os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
