"""Where the CLI and the hooks find a mount's daemon without touching the mount.

Every daemon, once mounted, writes one small JSON file into the private runtime directory
(:func:`shadefs.control.server.runtime_dir`, mode 0700): ``<runtime>/mounts/<key>.json`` where ``key``
is a hash of the absolute mountpoint. It holds the mountpoint, the daemon's pid and its start time
(``/proc/PID/stat`` field 22, so a reused pid is not mistaken for the daemon), the control endpoint,
and for a ``tcp://`` endpoint the CURVE credentials a client needs (the file is 0600). The daemon removes
it at unmount; an entry whose pid is gone (or belongs to another process now, or is a zombie) is stale
and ignored, and removed with its control socket by the next daemon that starts (:func:`clear_dead`).

Each mountpoint also has a lock file there, ``<runtime>/mounts/<key>.lock`` (:func:`hold_mountpoint`,
keyed by the mountpoint's parent's real path and its name): ``shadefs mount`` takes an ``flock`` on it
before checking the mountpoint, and the daemon it forks keeps holding it until it exits, so two mounts
onto one directory started at the same instant cannot both pass the checks.

``shadefs stats``, ``shadefs umount`` and ``find_endpoint`` read it first, so a hung mount (a stopped or
wedged daemon) cannot hang them: nothing here stats, lists or reads an extended attribute of the mount.

Also the one reader of ``/proc/self/mountinfo`` (:func:`mount_entry`): which filesystem is mounted at a
path, to tell a shadefs mount (type ``fuse.shadefs``, source ``shadefs:...``) from anything else.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from typing import Iterator, List, Optional

__all__ = ["Entry", "MountInfo", "register", "unregister", "lookup", "lookup_path", "lookup_path_any", "entries",
           "remove", "remove_dead_socket", "clear_dead",
           "mount_entry", "mount_entry_for", "is_shadefs", "pid_start_time", "registry_dir",
           "MountpointBusy", "hold_mountpoint", "note_holder"]

FSTYPE = "fuse.shadefs"
FSNAME_PREFIX = "shadefs:"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One registered mount. ``credentials`` (tcp:// only): ``{"server_public", "client_public",
    "client_secret"}``, Z85 strings."""

    mountpoint: str
    pid: int
    start_time: Optional[int]
    endpoint: str
    source: str = ""
    credentials: Optional[dict] = None
    path: str = ""  # the registry file

    def alive(self) -> bool:
        """The registered daemon still runs (same pid, same start time)."""
        return self.start_time is not None and pid_start_time(self.pid) == self.start_time


def registry_dir(create: bool = False) -> str:
    """``<runtime_dir>/mounts`` (0700). Raises PermissionError/OSError as ``runtime_dir`` does."""
    from .control.server import runtime_dir

    path = os.path.join(runtime_dir(), "mounts")
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    return path


def _key(mountpoint: str) -> str:
    return hashlib.sha256(os.path.abspath(mountpoint).encode("utf-8", "surrogateescape")).hexdigest()[:24]


def pid_start_time(pid: int) -> Optional[int]:
    """Start time of ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22), None if no such pid
    or if it has exited and waits to be reaped (a zombie, state ``Z``, or ``X``): it serves nothing."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        fields = data[data.rindex(b")") + 2:].split()
        if fields[0] in (b"Z", b"X"):
            return None
        return int(fields[19])
    except (ValueError, IndexError):
        return None


class MountpointBusy(Exception):
    """Another process holds the lock of the mountpoint; ``holder`` is its pid as it wrote it (None if
    unreadable)."""

    def __init__(self, mountpoint: str, holder: Optional[int]):
        super().__init__(f"mountpoint {mountpoint!r} is in use by pid {holder if holder else '?'}")
        self.mountpoint, self.holder = mountpoint, holder


def _lock_key(mountpoint: str) -> str:
    # the parent's real path, not the mountpoint's: resolving a mounted (maybe hung) directory would
    # wait on its daemon; two spellings of one directory still meet on one key
    mp = os.path.abspath(mountpoint)
    real = os.path.join(os.path.realpath(os.path.dirname(mp)), os.path.basename(mp))
    return hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:24]


def hold_mountpoint(mountpoint: str, wait_s: float = 0.0, busy=None):
    """Take this user's exclusive lock on ``mountpoint`` (an ``flock`` on ``<runtime>/mounts/<key>.lock``,
    0600, opened without following symlinks) and write this pid into it.

    Returns the open lock file: the lock lasts while some process holds a descriptor of it (a forked
    daemon inherits it; call :func:`note_holder` there). Retries for up to ``wait_s`` seconds, every
    50 ms, while the holder may be exiting; ``busy()``, if given, is called between retries and stops
    them when it returns True.

    Raises:
        MountpointBusy: another process still holds it.
        OSError, PermissionError: the runtime directory is unusable (see ``runtime_dir``).
    """
    import fcntl
    import time

    path = os.path.join(registry_dir(create=True), _lock_key(mountpoint) + ".lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    f = os.fdopen(fd, "r+")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline or (busy is not None and busy()):
                f.seek(0)
                text = f.read().strip()
                f.close()
                raise MountpointBusy(os.path.abspath(mountpoint), int(text) if text.isdigit() else None) from None
            time.sleep(0.05)
    note_holder(f)
    return f


def note_holder(lock_file) -> None:
    """Write this process's pid into a lock file from :func:`hold_mountpoint` (after a fork, the child)."""
    lock_file.seek(0)
    lock_file.truncate()
    lock_file.write(str(os.getpid()))
    lock_file.flush()


def register(mountpoint: str, endpoint: str, source: str = "", credentials: Optional[dict] = None) -> str:
    """Write this process's entry for ``mountpoint`` (atomically, 0600); returns the file's path."""
    from .fsutil import atomic_write

    pid = os.getpid()
    doc = {"mountpoint": os.path.abspath(mountpoint), "pid": pid, "start_time": pid_start_time(pid),
           "endpoint": endpoint, "source": source}
    if credentials:
        doc["credentials"] = credentials
    path = os.path.join(registry_dir(create=True), _key(mountpoint) + ".json")
    atomic_write(path, json.dumps(doc).encode(), mode=0o600)
    return path


def unregister(mountpoint: str, pid: Optional[int] = None) -> None:
    """Remove the entry of ``mountpoint`` if it is ``pid``'s (default: this process's)."""
    e = lookup(mountpoint, alive_only=False)
    if e is not None and e.pid == (os.getpid() if pid is None else pid):
        try:
            os.unlink(e.path)
        except OSError:
            pass


def _read(path: str) -> Optional[Entry]:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        return Entry(mountpoint=str(doc["mountpoint"]), pid=int(doc["pid"]), start_time=doc.get("start_time"),
                     endpoint=str(doc["endpoint"]), source=str(doc.get("source", "")),
                     credentials=doc.get("credentials"), path=path)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lookup(mountpoint: str, alive_only: bool = True) -> Optional[Entry]:
    """The entry registered for exactly ``mountpoint`` (absolute, lexical), None if none (or stale)."""
    try:
        path = os.path.join(registry_dir(), _key(mountpoint) + ".json")
    except OSError:
        return None
    e = _read(path)
    if e is None or e.mountpoint != os.path.abspath(mountpoint):
        return None
    if alive_only and not e.alive():
        return None
    return e


def lookup_path(path: str) -> Optional[Entry]:
    """The live entry of the mount holding ``path``: the nearest lexical ancestor (``abspath``, no
    symlinks resolved, nothing on the mount touched) that is a registered mountpoint."""
    return _nearest(path, alive_only=True)


def lookup_path_any(path: str) -> Optional[Entry]:
    """As :func:`lookup_path`, but the nearest registered entry whether its daemon lives or not."""
    return _nearest(path, alive_only=False)


def _nearest(path: str, alive_only: bool) -> Optional[Entry]:
    p = os.path.abspath(os.fspath(path))
    while True:
        e = lookup(p, alive_only=alive_only)
        if e is not None:
            return e
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


def remove(e: Entry) -> None:
    """Remove a dead daemon's entry and its control socket (an ``ipc://`` path no process listens on)."""
    cur = _read(e.path) if e.path else None
    if cur is not None and (cur.pid, cur.start_time) == (e.pid, e.start_time):  # not a newer daemon's now
        try:
            os.unlink(e.path)
        except OSError:
            pass
    if e.endpoint.startswith("ipc://"):
        remove_dead_socket(e.endpoint[len("ipc://"):])


def remove_dead_socket(path: str) -> bool:
    """Unlink the Unix socket file ``path`` if no process listens on it (connect refused); returns whether
    it did. Anything else (not a socket, a listener, even a stopped one, whose backlog takes the connect)
    is left alone."""
    import socket
    import stat

    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.5)
    try:
        s.connect(path)
        return False
    except ConnectionRefusedError:
        pass
    except OSError:
        return False  # a timeout or a full backlog: someone listens
    finally:
        s.close()
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


_SOCKET_NAME = re.compile(r"^[0-9a-f]{16}\.sock$")


def clear_dead() -> int:
    """Remove every entry whose daemon is gone, and every default control socket (``<16 hex>.sock`` in
    the runtime directory) no process listens on: what daemons killed, or failed after binding, left.
    Returns how many files were removed."""
    n = 0
    for e in list(entries(alive_only=False)):
        if not e.alive():
            remove(e)
            n += 1
    try:
        d = os.path.dirname(registry_dir())
        names = os.listdir(d)
    except OSError:
        return n
    for name in names:
        if _SOCKET_NAME.match(name) and remove_dead_socket(os.path.join(d, name)):
            n += 1
    return n


def entries(alive_only: bool = True) -> Iterator[Entry]:
    """Every registered mount of this user."""
    try:
        d = registry_dir()
        names = sorted(os.listdir(d))
    except OSError:
        return
    for name in names:
        if name.endswith(".json"):
            e = _read(os.path.join(d, name))
            if e is not None and (e.alive() or not alive_only):
                yield e


# -- /proc/self/mountinfo ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MountInfo:
    """One line of /proc/self/mountinfo: ``mountpoint``, ``fstype`` (``fuse.shadefs``, ``tmpfs``, ...),
    ``source`` (the fsname: ``shadefs:/data/x``, ``tmpfs``, ...)."""

    mountpoint: str
    fstype: str
    source: str


def _unescape(s: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo (octal)
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def _mountinfo() -> List[MountInfo]:
    out = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                left, sep, right = line.rstrip("\n").partition(" - ")
                fields, tail = left.split(" "), right.split(" ")
                if not sep or len(fields) < 5 or len(tail) < 2:
                    continue
                out.append(MountInfo(_unescape(fields[4]), _unescape(tail[0]), _unescape(tail[1])))
    except OSError:
        pass
    return out


def mount_entry(mountpoint: str) -> Optional[MountInfo]:
    """The filesystem mounted at exactly ``mountpoint`` (the top one if several are stacked), or None.

    ``mountpoint`` is taken lexically (``abspath``) and also with symlinks resolved, without stat-ing it.
    """
    wanted = {os.path.abspath(mountpoint)}
    try:
        wanted.add(os.path.realpath(os.path.dirname(os.path.abspath(mountpoint))) + "/" +
                   os.path.basename(os.path.abspath(mountpoint)))  # resolves the parents, not the mount
    except OSError:
        pass
    found = None
    for m in _mountinfo():
        if m.mountpoint in wanted or (m.mountpoint == "/" and "/" in wanted):
            found = m  # later lines are mounted on top
    return found


def mount_entry_for(path: str) -> Optional[MountInfo]:
    """The mount holding ``path`` (the longest mountpoint prefix of its absolute path)."""
    p = os.path.abspath(path)
    best = None
    for m in _mountinfo():
        mp = m.mountpoint
        if p == mp or p.startswith(mp.rstrip("/") + "/"):
            if best is None or len(mp) >= len(best.mountpoint):
                best = m
    return best


def is_shadefs(m: Optional[MountInfo]) -> bool:
    """Whether a mountinfo entry is a shadefs mount (type ``fuse.shadefs``, fsname ``shadefs:...``)."""
    return m is not None and m.fstype == FSTYPE and m.source.startswith(FSNAME_PREFIX)
