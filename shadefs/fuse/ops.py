"""What both front ends answer alike: the control-plane xattr and the statfs figures."""
from __future__ import annotations

from typing import List, Optional, Tuple

__all__ = ["ENDPOINT_XATTR", "endpoint_of", "statfs_values", "listdir_slice"]

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
