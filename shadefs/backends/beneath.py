"""Opening a file of a local source tree by its relative path without ever leaving the tree.

The scan decides once which paths the mount serves (symlinks inside the tree: yes; outside it: only with
``--follow-symlinks``); a reader's open comes later, and by then anyone who may write in the source can
have swapped a file or a directory for a symlink. So every open here resolves the path from a descriptor
of the root with no symlink followed at all: Linux ``openat2`` with ``RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS`` (kernel >= 5.6), or, where that syscall is missing (``ENOSYS``; a seccomp filter
that answers ``EPERM``), one ``openat(O_NOFOLLOW)`` per path component, walking down from the root's
descriptor. A symlink on the way fails with ``ELOOP``: the caller then resolves the symlink the way the
scan did (:meth:`~shadefs.backends.posix.PosixBackend.read`) and opens the resolved path the same way.
``SHADEFS_NO_OPENAT2=1`` in the environment makes a process use the per-component walk even where the
kernel has ``openat2`` (tests of the fallback through a real mount; the daemon logs which one it uses).

Must never: follow a symlink, or return a descriptor of anything but the final component's own inode.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import stat as stat_mod
import threading
from typing import Optional

__all__ = ["open_beneath", "walk_open", "have_openat2"]

SYS_OPENAT2 = 437                    # the same number on every Linux architecture (added in 5.6)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
_O_PATH = getattr(os, "O_PATH", 0)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_lock = threading.Lock()
_syscall = None        # libc's syscall(), once probed
_have: Optional[bool] = None
log = logging.getLogger("shadefs.backends")


def _probe() -> bool:
    global _syscall, _have
    with _lock:
        if _have is None:
            _have = False
            from ..config import Environment

            if Environment.from_env().no_openat2:
                log.info("SHADEFS_NO_OPENAT2=1: source files are opened one O_NOFOLLOW component at a time")
                return False
            try:
                lib = ctypes.CDLL(None, use_errno=True)
                fn = lib.syscall
                fn.restype = ctypes.c_long
                how = _OpenHow(os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, 0, _RESOLVE)
                fd = fn(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(-100), ctypes.c_char_p(b"."),
                        ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
                if fd >= 0:
                    os.close(fd)
                    _syscall = fn
                    _have = True
            except (OSError, AttributeError):
                pass
            if not _have:
                log.info("openat2 is not available: source files are opened one O_NOFOLLOW component at a time")
    return bool(_have)


def have_openat2() -> bool:
    """Whether this kernel (and its seccomp filter) lets the process call ``openat2``."""
    return _have if _have is not None else _probe()


def _openat2(dir_fd: int, rel: bytes, flags: int) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, 0, _RESOLVE)
    fd = _syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dir_fd), ctypes.c_char_p(rel), ctypes.byref(how),
                  ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), rel.decode("utf-8", "surrogateescape"))
    return fd


def walk_open(dir_fd: int, rel: str, flags: int) -> int:
    """Open ``rel`` below the directory ``dir_fd`` one component at a time, none of them followed if it is
    a symlink (``O_NOFOLLOW``; the fallback of :func:`open_beneath`). Returns the new descriptor.

    Raises:
        OSError: ``ELOOP`` when a component is a symlink, ``EXDEV`` for a ``..`` or absolute path,
            ``ENOTDIR`` when a middle component is no directory, or the failing ``openat``'s own error.
    """
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts:
        raise OSError(errno.EXDEV, "path leaves the source tree", rel)
    parts = [p for p in parts if p not in ("", ".")]
    if not parts:
        raise OSError(errno.EISDIR, "the source root is no file", rel)
    cur = dir_fd
    try:
        for name in parts[:-1]:
            nxt = os.open(name, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=cur)
            try:
                mode = os.fstat(nxt).st_mode
            except OSError:
                os.close(nxt)
                raise
            if not stat_mod.S_ISDIR(mode):
                os.close(nxt)
                raise OSError(errno.ELOOP if stat_mod.S_ISLNK(mode) else errno.ENOTDIR,
                              "a symlink on the path" if stat_mod.S_ISLNK(mode) else os.strerror(errno.ENOTDIR), rel)
            if cur != dir_fd:
                os.close(cur)
            cur = nxt
        fd = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=cur)
        if flags & _O_PATH:  # O_PATH | O_NOFOLLOW opens a symlink itself instead of failing
            try:
                if stat_mod.S_ISLNK(os.fstat(fd).st_mode):
                    raise OSError(errno.ELOOP, "a symlink on the path", rel)
            except OSError:
                os.close(fd)
                raise
        return fd
    finally:
        if cur != dir_fd:
            os.close(cur)


def open_beneath(dir_fd: int, rel: str, flags: int) -> int:
    """Open ``rel`` (relative, ``/``-separated) below the directory ``dir_fd`` with ``flags`` and without
    following any symlink or leaving the tree: ``openat2`` where the kernel has it, else :func:`walk_open`.

    Raises:
        OSError: ``ELOOP`` when a component (the last included) is a symlink, ``EXDEV`` when the path
            would leave the tree, ``ENOENT`` and the rest as ``openat`` raises them.
    """
    if have_openat2():
        return _openat2(dir_fd, rel.encode("utf-8", "surrogateescape"), flags)
    return walk_open(dir_fd, rel, flags)
