"""What the commands and the front ends share without importing the CLI: the one-line user error, the
kernel's mount table, and the control client of a running mount.

:mod:`shadefs.cli` parses arguments and runs commands; :mod:`shadefs.warm` and the FUSE front ends
(:mod:`shadefs.fuse`) need a few of its helpers. They live here so that no module of the package imports
:mod:`shadefs.cli` (the import graph stays acyclic: ``cli`` imports everything, nothing imports ``cli``).
Must never import :mod:`shadefs.cli`, :mod:`shadefs.warm` or :mod:`shadefs.fuse`.
"""
from __future__ import annotations

import errno
import os

__all__ = ["UserError", "is_mounted", "is_stale", "check_daemon_alive", "mount_client"]


class UserError(Exception):
    """One line for the user; exit status 2."""


_MOUNTS_ESCAPES = (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\"))


def is_mounted(path) -> bool:
    """Whether ``path`` is a mountpoint listed in /proc/self/mounts (whatever its state: a dead FUSE
    daemon's mount, which ``os.path.ismount`` cannot stat, counts)."""
    path = os.path.realpath(str(path))
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 1:
                    mp = parts[1]
                    for esc, ch in _MOUNTS_ESCAPES:
                        mp = mp.replace(esc, ch)
                    if mp == path:
                        return True
    except OSError:
        pass
    return False


def is_stale(mountpoint: str) -> bool:
    """Whether ``mountpoint`` is a FUSE mount whose daemon died ("Transport endpoint is not connected")."""
    try:
        # statvfs, not stat: the kernel answers stat from its attribute cache (attr_timeout=3600) even
        # after the daemon died; STATFS always reaches the (dead) connection.
        os.statvfs(mountpoint)
        return False
    except OSError as e:
        # ENOTCONN once the connection is gone; ECONNABORTED for a request caught in the abort
        return e.errno in (errno.ENOTCONN, errno.ECONNABORTED)


def check_daemon_alive(path: str) -> None:
    """Refuse to wait for the daemon of the mount holding ``path`` when it has died (raises UserError):
    its registered pid is gone or a zombie, or, unregistered, its mount answers ENOTCONN."""
    from . import registry as reg

    e = reg.lookup_path_any(path)
    if e is not None and e.alive():
        return  # never stat a mount whose daemon runs: a stopped one would hang us
    info = reg.mount_entry_for(path)
    if e is None and not reg.is_shadefs(info):
        return  # not a shadefs mount (or found through $SHADEFS_ENDPOINT): the caller says so
    if e is not None and (info is None or info.mountpoint != e.mountpoint):
        return  # its mount is gone: the path is not inside a shadefs mount now
    mp = (e or info).mountpoint
    if e is None and not is_stale(mp):
        return
    who = f" (pid {e.pid})" if e is not None else ""
    raise UserError(f"the daemon of {mp}{who} has died; its mount is dead: run 'shadefs umount {mp}' to clear "
                    "it, then mount again")


def mount_client(path: str, timeout_s: float = 5.0):
    """A control client for the mount holding ``path``, found without touching the mount when the daemon
    registered itself (:mod:`shadefs.registry`), else from ``$SHADEFS_ENDPOINT`` or the mount's xattr.

    Raises:
        UserError: ``path`` is not inside a shadefs mount, its daemon has died, or its endpoint cannot be
            found.
    """
    from . import registry as reg
    from .config import Environment
    from .control.client import ControlClient, EndpointNotFound, find_endpoint

    check_daemon_alive(path)
    entry = reg.lookup_path(path)
    if entry is not None:
        return ControlClient(entry.endpoint, timeout_s=timeout_s, credentials=entry.credentials)
    if not Environment.from_env().endpoint and not reg.is_shadefs(reg.mount_entry_for(path)):
        raise UserError(f"{path!r} is not inside a shadefs mount")
    try:
        endpoint = find_endpoint(path)
    except EndpointNotFound as e:
        raise UserError(str(e)) from None
    return ControlClient(endpoint, timeout_s=timeout_s)
