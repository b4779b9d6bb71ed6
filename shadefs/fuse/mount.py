"""Mounting a FUSE filesystem without libfuse: ``mount(2)`` as root, fusermount3's fd passing otherwise.

As root (CAP_SYS_ADMIN) :func:`mount_fuse` opens ``/dev/fuse`` and calls ``mount(2)`` with the options
the kernel's fuse filesystem takes (``fd=N,rootmode=40000,user_id=U,group_id=G,default_permissions
[,allow_other]``), filesystem type ``fuse.SUBTYPE`` and source FSNAME, flags ``ro,nosuid,nodev`` —
what libfuse does, so ``/proc/self/mounts`` shows the same line for both front ends. As another user it
runs ``fusermount3 -o OPTIONS -- MOUNTPOINT`` with ``_FUSE_COMMFD`` set to one end of a socketpair;
fusermount3 (setuid root) mounts and sends the ``/dev/fuse`` fd back with ``SCM_RIGHTS``.
"""
from __future__ import annotations

import array
import ctypes
import ctypes.util
import errno
import logging
import os
import shutil
import socket
import subprocess
from typing import Optional

__all__ = ["mount_fuse", "unmount_fuse", "MountError"]

log = logging.getLogger("shadefs.fuse")

MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
MNT_DETACH = 2

_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        _libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return _libc


class MountError(OSError):
    """The mount could not be made (the message says why: mount(2)'s errno or fusermount3's stderr)."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def _fusermount() -> Optional[str]:
    return shutil.which("fusermount3") or shutil.which("fusermount")


def _escape_opt(value: str) -> str:
    # mount options are comma-separated; libfuse escapes "," and "\" in fsname
    return value.replace("\\", "\\\\").replace(",", "\\,")


def mount_fuse(mountpoint: str, fsname: str, subtype: str = "shadefs", allow_other: bool = False) -> int:
    """Mount a read-only FUSE filesystem at ``mountpoint``; returns the ``/dev/fuse`` fd (close-on-exec)
    on which the kernel will send INIT first.

    Raises:
        MountError: mount(2) failed (as root), or fusermount3 failed or is missing (as another user).
    """
    mountpoint = os.path.abspath(mountpoint)
    if os.geteuid() == 0:
        try:
            return _mount_root(mountpoint, fsname, subtype, allow_other)
        except MountError as e:
            if e.errno != errno.EPERM:
                raise
            # root without CAP_SYS_ADMIN (a container): try fusermount3 as libfuse does; its message wins
    return _mount_fusermount(mountpoint, fsname, subtype, allow_other)


def _mount_root(mountpoint: str, fsname: str, subtype: str, allow_other: bool) -> int:
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    opts = f"fd={fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()},default_permissions"
    if allow_other:
        opts += ",allow_other"
    rc = _c().mount(fsname.encode("utf-8", "surrogateescape"), mountpoint.encode("utf-8", "surrogateescape"),
                    f"fuse.{subtype}".encode(), MS_RDONLY | MS_NOSUID | MS_NODEV, opts.encode())
    if rc != 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise MountError(err, f"mount(2) of {mountpoint}: {os.strerror(err)}")
    return fd


def _mount_fusermount(mountpoint: str, fsname: str, subtype: str, allow_other: bool) -> int:
    tool = _fusermount()
    if tool is None:
        raise MountError(0, "fusermount3 is missing; install it with: apt-get install fuse3")
    opts = f"ro,nosuid,nodev,default_permissions,fsname={_escape_opt(fsname)},subtype={subtype}"
    if allow_other:
        opts += ",allow_other"
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        env = dict(os.environ, _FUSE_COMMFD=str(theirs.fileno()))
        proc = subprocess.Popen([tool, "-o", opts, "--", mountpoint], env=env, pass_fds=(theirs.fileno(),),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        theirs.close()
        fds = array.array("i")
        _, ancdata, _, _ = ours.recvmsg(1, socket.CMSG_LEN(fds.itemsize))
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
        _, err = proc.communicate(timeout=30)
        if proc.returncode != 0 or not fds:
            for fd in fds:
                os.close(fd)
            msg = err.decode(errors="replace").strip() or "no fd received"
            if msg.startswith(tool + ":"):
                msg = os.path.basename(tool) + msg[len(tool):]  # "fusermount3: mount failed: ..."
            raise MountError(0, msg if msg.startswith("fusermount") else f"fusermount3: {msg}")
        for extra in fds[1:]:
            os.close(extra)
        os.set_inheritable(fds[0], False)
        return fds[0]
    finally:
        ours.close()
        if theirs.fileno() >= 0:
            theirs.close()


def unmount_fuse(mountpoint: str) -> bool:
    """Detach the mount (lazily, as libfuse does at exit); True when done. Never raises."""
    if os.geteuid() == 0:
        if _c().umount2(os.path.abspath(mountpoint).encode("utf-8", "surrogateescape"), MNT_DETACH) == 0:
            return True
        err = ctypes.get_errno()
        if err == 22:  # EINVAL: not a mount point (anymore)
            return False
    tool = _fusermount()
    if tool is None:
        return False
    try:
        return subprocess.run([tool, "-u", "-z", "-q", mountpoint], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
