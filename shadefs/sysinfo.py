"""What the machine offers a mount: how much memory this process may use, and whether a directory lies on
a pseudo filesystem (``/proc``, ``/sys``, ``/dev``, cgroups...) where a cache cannot live.

Only reads (``sysconf``, ``/sys/fs/cgroup``, ``statfs``, ``/proc/self/mountinfo``); creates nothing.
"""
from __future__ import annotations

import ctypes
import os
from typing import Optional, Tuple

__all__ = ["memory_limit", "pseudo_fs"]

# statfs f_type magic numbers (linux/magic.h) of filesystems that hold no regular files of ours
_PSEUDO_MAGIC = {
    0x9FA0: "proc", 0x62656572: "sysfs", 0x1CD1: "devpts", 0x27E0EB: "cgroup", 0x63677270: "cgroup2",
    0x64626720: "debugfs", 0x74726163: "tracefs", 0x73636673: "securityfs", 0x6165676C: "pstore",
    0xCAFE4A11: "bpf", 0x62656570: "configfs", 0x19800202: "mqueue", 0x65735543: "fusectl",
    0x42494E4D: "binfmt_misc", 0xDE5E81E4: "efivarfs", 0xF97CFF8C: "selinuxfs", 0x6E736673: "nsfs",
    0x50495045: "pipefs", 0x534F434B: "sockfs",
}
# by name (/proc/self/mountinfo): devtmpfs reports tmpfs's magic number, so only its name tells it apart
_PSEUDO_NAMES = set(_PSEUDO_MAGIC.values()) | {"devtmpfs", "autofs", "hugetlbfs", "rpc_pipefs", "nfsd"}


def memory_limit() -> Tuple[int, str]:
    """``(bytes, what)``: the memory this process may use at most, and what sets it: ``"this machine's
    RAM"`` (physical pages) or ``"the cgroup memory limit"`` (``memory.max`` of cgroup v2, when lower)."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        ram = 0
    best = (ram, "this machine's RAM")
    limit = _cgroup_limit()
    if limit is not None and (not ram or limit < ram):
        best = (limit, "the cgroup memory limit")
    return best


def _cgroup_limit() -> Optional[int]:
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            rel = next((ln.split(":", 2)[2].strip() for ln in f if ln.startswith("0::")), None)
        if rel is None:
            return None
        with open(os.path.join("/sys/fs/cgroup", rel.lstrip("/"), "memory.max"), encoding="utf-8") as f:
            text = f.read().strip()
        return int(text) if text.isdigit() else None
    except (OSError, ValueError, IndexError):
        return None


class _Statfs(ctypes.Structure):
    # struct statfs on 64-bit Linux: f_type first (__fsword_t, a long); the rest is not read
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 112)]


def pseudo_fs(path: str) -> Optional[str]:
    """The name of the pseudo filesystem (``proc``, ``sysfs``, ``devtmpfs``, ``cgroup2``...) that
    ``path``, or its nearest existing ancestor, lies on; None for a filesystem that stores files."""
    p = os.path.abspath(path)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    from .procutil import libc

    lib = libc()
    if lib is not None:
        buf = _Statfs()
        if lib.statfs(os.fsencode(p), ctypes.byref(buf)) == 0:
            name = _PSEUDO_MAGIC.get(buf.f_type & 0xFFFFFFFF)
            if name:
                return name
    from .registry import mount_entry_for

    m = mount_entry_for(os.path.realpath(p))
    return m.fstype if m is not None and m.fstype in _PSEUDO_NAMES else None
