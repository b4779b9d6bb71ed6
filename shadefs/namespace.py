"""The metadata snapshot: every directory and file of the source, scanned once at mount.

File ids are dense integers ``0..num_files-1`` (sorted by path), directories get ids after them.
Per-file attributes live in numpy arrays (size, mtime), so a million files cost tens of MB, not a Python
object each. lookup/getattr/readdir are answered from here and never touch the backend; the dataset
is taken to be immutable while mounted (the kernel is told so through long entry/attr timeouts).
"""
from __future__ import annotations

import logging
import operator
import os
import posixpath
import stat as stat_mod
import time
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from .backends.base import Entry

__all__ = ["Namespace", "normalize"]

log = logging.getLogger("shadefs.namespace")

ROOT = ""
_DIR_MODE = stat_mod.S_IFDIR | 0o555
_FILE_MODE = stat_mod.S_IFREG | 0o444


def normalize(path: str) -> Optional[str]:
    """Turn a FUSE path (``/a/b``) or a mount-relative path (``a/b``) into the snapshot key (``a/b``).

    Returns None for a path that is absolute after stripping one leading slash twice, contains
    ``..`` or ``.`` components, empty components, or NUL: such paths name nothing in the snapshot.
    """
    if "\x00" in path:
        return None
    p = path[1:] if path.startswith("/") else path
    if p == "":
        return ROOT
    parts = p.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            return None
    return p


class Namespace:
    """An immutable tree of files and directories.

    Attributes:
        paths: file paths (``list[str]``, index = file id), relative to the root.
        sizes: ``np.ndarray[int64]`` of shape (num_files,), bytes.
        mtimes: ``np.ndarray[float64]`` of shape (num_files,), seconds since the epoch.
        total_bytes: sum of ``sizes``.
    """

    def __init__(self, entries: Iterable[Entry]):
        t0 = time.monotonic()
        items = sorted(entries, key=operator.itemgetter(0))  # Entry is a (path, size, mtime) tuple
        # An object store may hold both "a" and "a/b": the directory wins, the file is skipped.
        prefixes = set()
        for parent in {posixpath.dirname(p) for p, _, _ in items}:
            while parent and parent not in prefixes:
                prefixes.add(parent)
                parent = posixpath.dirname(parent)
        self.skipped = [p for p, _, _ in items if p in prefixes]
        if self.skipped:
            log.warning("skipping %d files that are also directory prefixes (first: %r)",
                        len(self.skipped), self.skipped[0])
            items = [t for t in items if t[0] not in prefixes]
        self.paths: List[str] = [p for p, _, _ in items]
        self.sizes = np.fromiter((s for _, s, _ in items), dtype=np.int64, count=len(items))
        self.mtimes = np.fromiter((m for _, _, m in items), dtype=np.float64, count=len(items))
        self.num_files = len(self.paths)
        self.total_bytes = int(self.sizes.sum()) if self.num_files else 0
        # path -> id for files and directories (directories: id >= num_files)
        self._ids: Dict[str, int] = {p: i for i, p in enumerate(self.paths)}
        self.dir_paths: List[str] = [ROOT]
        self._ids[ROOT] = self.num_files
        children: Dict[int, List[str]] = {self.num_files: []}
        for i, p in enumerate(self.paths):
            parent, name = posixpath.split(p)
            pid = self._ensure_dir(parent, children)
            children[pid].append(name)
        # readdir answers: names per directory id, kept as a tuple (sorted, immutable)
        self._children: Dict[int, Tuple[str, ...]] = {d: tuple(sorted(c)) for d, c in children.items()}
        self.root = self.num_files
        self.num_nodes = self.num_files + len(self.dir_paths)
        self._uid, self._gid = os.getuid(), os.getgid()
        self.scan_seconds = time.monotonic() - t0
        self.mount_time = time.time()

    def _ensure_dir(self, path: str, children: Dict[int, List[str]]) -> int:
        did = self._ids.get(path)
        if did is not None:
            if did < self.num_files:
                raise ValueError(f"{path!r} is both a file and a directory")
            return did
        did = self.num_files + len(self.dir_paths)
        self.dir_paths.append(path)
        self._ids[path] = did
        children[did] = []
        parent, name = posixpath.split(path)
        pid = self._ensure_dir(parent, children)
        children[pid].append(name)
        return did

    # -- queries ---------------------------------------------------------------------------------
    def lookup(self, path: str) -> Optional[int]:
        """Return the id of ``path`` (FUSE ``/a/b`` or relative ``a/b``), or None if absent."""
        key = normalize(path)
        if key is None:
            return None
        return self._ids.get(key)

    def file_id(self, relpath: str) -> Optional[int]:
        """Return the file id of a relative file path, or None (directories and bad paths: None)."""
        fid = self._ids.get(relpath)
        return fid if fid is not None and fid < self.num_files else None

    def is_dir(self, node: int) -> bool:
        return node >= self.num_files

    def children(self, node: int) -> Tuple[str, ...]:
        """Names directly below directory ``node``, sorted."""
        return self._children[node]

    def entries(self, node: int) -> List[Tuple[str, int, int]]:
        """``(name, st_mode, 0)`` for each entry directly below directory ``node``, sorted by name.

        readdir reports each entry's type (d_type) from this, so a directory walk (ImageFolder) needs no
        LOOKUP round trip per file. Built per call: a readdir is rare next to opens.
        """
        base = self.dir_paths[node - self.num_files]
        prefix = f"{base}/" if base else ""
        ids, nf = self._ids, self.num_files
        return [(n, _DIR_MODE if ids[prefix + n] >= nf else _FILE_MODE, 0) for n in self._children[node]]

    def _node_path(self, node: int) -> str:
        return self.paths[node] if node < self.num_files else self.dir_paths[node - self.num_files]

    def child(self, parent: int, name: str) -> Optional[int]:
        """Return the id of entry ``name`` directly below directory ``parent``, or None.

        ``name`` is one path component (no ``/``); ``.``, ``..``, ``""`` and a file ``parent`` give None.
        """
        if parent < self.num_files or parent >= self.num_nodes or name in ("", ".", "..") \
                or "/" in name or "\x00" in name:
            return None
        base = self.dir_paths[parent - self.num_files]
        return self._ids.get(f"{base}/{name}" if base else name)

    def parent(self, node: int) -> int:
        """Return the id of the directory holding ``node``; the root is its own parent."""
        if node == self.root:
            return self.root
        return self._ids[posixpath.dirname(self._node_path(node))]

    def listdir(self, node: int) -> List[Tuple[str, int]]:
        """``(name, node_id)`` for each entry directly below directory ``node``, sorted by name."""
        base = self.dir_paths[node - self.num_files]
        prefix = f"{base}/" if base else ""
        ids = self._ids
        return [(n, ids[prefix + n]) for n in self._children[node]]

    def attr(self, node: int) -> Tuple[int, int, int, int, int, int]:
        """``(st_mode, size in bytes, mtime in ns, uid, gid, nlink)`` of ``node`` (for the kernel front end)."""
        if node >= self.num_files:
            nsub = sum(1 for _, i in self.listdir(node) if i >= self.num_files)
            return _DIR_MODE, 0, int(self.mount_time * 1e9), self._uid, self._gid, 2 + nsub
        return (_FILE_MODE, int(self.sizes[node]), int(self.mtimes[node] * 1e9), self._uid, self._gid, 1)

    def path(self, fid: int) -> str:
        return self.paths[fid]

    def size(self, fid: int) -> int:
        return int(self.sizes[fid])

    def stat(self, node: int) -> dict:
        """A ``struct stat`` as the dict fusepy expects (times in integer nanoseconds, ``use_ns``)."""
        if node >= self.num_files:
            t = int(self.mount_time * 1e9)
            return {"st_mode": _DIR_MODE, "st_nlink": 2, "st_size": 0,
                    "st_mtime": t, "st_ctime": t, "st_atime": t}
        t = int(self.mtimes[node] * 1e9)
        size = int(self.sizes[node])
        return {"st_mode": _FILE_MODE, "st_nlink": 1, "st_size": size,
                "st_blocks": (size + 511) // 512, "st_mtime": t, "st_ctime": t, "st_atime": t}
