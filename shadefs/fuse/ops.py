"""What both front ends answer alike: the control-plane xattr, statfs figures, and the namespace calls
the kernel front end needs (``child/parent/listdir/attr/root/num_nodes``; a shim adds them to a
namespace that predates them)."""
from __future__ import annotations

import os
import posixpath
from typing import List, Optional, Tuple

__all__ = ["ENDPOINT_XATTR", "endpoint_of", "statfs_values", "ns_api", "listdir_slice"]

#: the extended attribute the control plane is discovered through (hooks, ``shadefs stats``)
ENDPOINT_XATTR = "user.shadefs.endpoint"


def endpoint_of(daemon) -> Optional[str]:
    """The control endpoint URL to serve as ``user.shadefs.endpoint``, or None before it exists."""
    return getattr(daemon, "endpoint", None) or None


def statfs_values(ns) -> dict:
    """``statvfs`` figures of the mount: the snapshot's bytes in 4 KiB blocks, nothing free."""
    return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": (ns.total_bytes + 4095) // 4096,
            "f_bfree": 0, "f_bavail": 0, "f_files": ns.num_files, "f_ffree": 0, "f_namemax": 255}


def listdir_slice(ns, node: int, start: int, stop: int) -> List[Tuple[str, int]]:
    """``ns.listdir(node)[start:stop]``, built from the snapshot for that range only where the namespace
    can (:meth:`~shadefs.namespace.Namespace.listdir_slice`)."""
    fn = getattr(ns, "listdir_slice", None)
    return fn(node, start, stop) if fn is not None else ns.listdir(node)[start:stop]


def ns_api(ns):
    """``ns`` itself when it has the node API, else a thin wrapper that adds it."""
    return ns if hasattr(ns, "attr") and hasattr(ns, "child") else _NodeAPI(ns)


class _NodeAPI:
    """The node API over an older :class:`~shadefs.namespace.Namespace` (paths and ``_ids``)."""

    def __init__(self, ns):
        self._ns = ns
        self.root = ns.num_files
        self.num_nodes = ns.num_files + len(ns.dir_paths)
        self._uid, self._gid = os.getuid(), os.getgid()

    def __getattr__(self, name):
        return getattr(self._ns, name)

    def _node_path(self, node: int) -> str:
        ns = self._ns
        return ns.paths[node] if node < ns.num_files else ns.dir_paths[node - ns.num_files]

    def child(self, parent: int, name: str) -> Optional[int]:
        ns = self._ns
        if parent < ns.num_files or parent >= self.num_nodes or name in ("", ".", "..") or "/" in name \
                or "\x00" in name:
            return None
        base = ns.dir_paths[parent - ns.num_files]
        return ns._ids.get(f"{base}/{name}" if base else name)

    def parent(self, node: int) -> int:
        if node == self.root:
            return self.root
        return self._ns._ids[posixpath.dirname(self._node_path(node))]

    def listdir(self, node: int) -> List[Tuple[str, int]]:
        ns = self._ns
        base = ns.dir_paths[node - ns.num_files]
        prefix = f"{base}/" if base else ""
        return [(n, ns._ids[prefix + n]) for n in ns.children(node)]

    def attr(self, node: int) -> Tuple[int, int, int, int, int, int]:
        st = self._ns.stat(node)
        nlink = st["st_nlink"]
        if node >= self._ns.num_files:
            nlink = 2 + sum(1 for _, i in self.listdir(node) if i >= self._ns.num_files)
        return st["st_mode"], st["st_size"], st["st_mtime"], self._uid, self._gid, nlink
