"""Helpers of the read-path stress tests: a real small tmpfs, an inotify counter of the backend's file opens,
and the exact on-disk bytes of a cache directory.

Measuring the disk budget: a scan (``os.scandir`` + ``st_size``, as ``du`` does) is not one instant: it can
count a victim before its unlink and the entry written in its place after it, or a temporary before and
after its rename, and report a total the directory never held. So :class:`EntryTimeline` follows the
cache directory's inotify events instead (every create, rename and unlink, in the order they happened)
and knows the entry bytes at every instant (``du --apparent-size`` of the entry files, a temporary counted
whole from its creation). The cache directory also lives on its own tmpfs, whose ``statvfs`` (one exact
counter in the kernel) gives what ``df`` sees: with file sizes that are multiples of the page size it
equals the files' bytes, plus the bytes of entries already unlinked but still open (a reader's handle,
or a passthrough backing file the kernel holds).
"""
from __future__ import annotations

import ctypes
import os
import select
import struct
import subprocess
import threading
from contextlib import contextmanager

PAGE = os.sysconf("SC_PAGE_SIZE")

IN_OPEN = 0x20
IN_CLOSE_WRITE = 0x08
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_Q_OVERFLOW = 0x4000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC


@contextmanager
def tmpfs(path, size: str):
    """Mount a real tmpfs of ``size`` (``"8m"``) at ``path`` (created) for the block; unmounted after."""
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield str(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def used_bytes(path) -> int:
    """Bytes in use on the filesystem of ``path`` (``statvfs``: one instant)."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def pages(n: int) -> int:
    """``n`` bytes rounded up to whole pages (what a tmpfs file of ``n`` bytes takes)."""
    return -(-n // PAGE) * PAGE


def non_entry_files(ns_dir) -> dict:
    """``{name: size}`` of the files of a cache namespace directory that are not entries (lock, manifest,
    namespace snapshot): everything outside the ``<h[:2]>/`` shards and ``tmp/``."""
    out = {}
    for e in os.scandir(ns_dir):
        if e.is_file(follow_symlinks=False):
            out[e.name] = e.stat(follow_symlinks=False).st_size
    return out


def entry_files(ns_dir) -> dict:
    """``{path: size}`` of every entry and temporary file of a cache namespace directory."""
    out = {}
    for e in os.scandir(ns_dir):
        if e.is_dir(follow_symlinks=False):
            for f in os.scandir(e.path):
                out[f.path] = f.stat(follow_symlinks=False).st_size
    return out


class Inotify:
    """One inotify instance watching ``dirs`` for ``mask``; ``on_event(dir, name, mask)`` is called for every
    event, in the order the kernel queued them (one queue for all the watches: the order the operations
    happened in, for operations ordered by the daemon's own locking). A queue overflow is an error."""

    def __init__(self, dirs, mask, on_event):
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.on_event = on_event
        self.fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.dirs = {}
        for d in dirs:
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(str(d)), mask)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {d}")
            self.dirs[wd] = str(d)
        self.overflow = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inotify", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            i = 0
            while i < len(buf):
                wd, mask, _cookie, n = struct.unpack_from("iIII", buf, i)
                name = buf[i + 16:i + 16 + n].rstrip(b"\0").decode()
                i += 16 + n
                if mask & IN_Q_OVERFLOW:
                    self.overflow = True
                elif wd in self.dirs:
                    self.on_event(self.dirs[wd], name, mask)

    def _run(self) -> None:
        while not self._stop.is_set():
            select.select([self.fd], [], [], 0.05)
            self._drain()

    def close(self) -> None:
        """Stop, deliver what is queued, close. Raises AssertionError if the kernel's queue overflowed."""
        self._stop.set()
        self._thread.join(5)
        self._drain()
        os.close(self.fd)
        assert not self.overflow, "inotify queue overflowed: the events are not complete"


class OpenCounter:
    """Counts opens of regular files in the directories watched (inotify ``IN_OPEN``), by anyone: the
    backend's reads of a posix source, counted outside the daemon."""

    def __init__(self, dirs):
        self.opens = {}          # path -> count
        self._lock = threading.Lock()
        self._ino = Inotify(dirs, IN_OPEN, self._event)

    def _event(self, d, name, mask):
        if mask & IN_OPEN and not mask & IN_ISDIR and name:
            p = os.path.join(d, name)
            with self._lock:
                self.opens[p] = self.opens.get(p, 0) + 1

    def total(self) -> int:
        """Opens counted so far (call :meth:`close` first for a final figure)."""
        with self._lock:
            return sum(self.opens.values())

    def close(self) -> None:
        self._ino.close()


class EntryTimeline:
    """The bytes of a cache namespace directory's entry files (entries and temporaries) at every instant,
    from its inotify events (not sampled: every create, rename and unlink, in order), the ``du`` of
    the entry files. A temporary counts its whole size from its creation on (what its fill reserved).

    Args:
        ns_dir: the namespace directory; its ``tmp/`` and the shard directories in ``shards`` must exist
            before the daemon writes (inotify cannot watch a directory before it exists).
        size_of: ``{sha256(relpath) hex: bytes}`` of the source's files.
    """

    def __init__(self, ns_dir, shards, size_of):
        self.size_of = size_of
        self.tmp = os.path.join(ns_dir, "tmp")
        self.now = 0
        self.peak = 0
        self.events = 0
        self.unknown = []        # names that are neither an entry nor a temporary of a source file
        self.live = {}           # (h, gen) -> bytes
        dirs = [self.tmp] + [os.path.join(ns_dir, s) for s in shards]
        self._ino = Inotify(dirs, IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO, self._event)

    def _event(self, d, name, mask):
        parts = name.split(".")
        if mask & IN_ISDIR or len(parts) not in (2, 3) or parts[0] not in self.size_of:
            if d != self.tmp:  # tmp/ also sees the mount's timestamp probe and the snapshot's temporary
                self.unknown.append((d, name, mask))
            return
        key = (parts[0], parts[1])
        self.events += 1
        if mask & IN_CREATE:
            assert d == self.tmp, f"an entry created outside tmp/: {name}"
            self.live[key] = self.size_of[parts[0]]
        elif mask & IN_DELETE:
            self.live.pop(key, None)
        else:
            return  # a rename tmp/ -> shard: the same bytes
        self.now = sum(self.live.values())
        self.peak = max(self.peak, self.now)

    def close(self) -> None:
        self._ino.close()


