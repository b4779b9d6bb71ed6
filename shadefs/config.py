"""Typed, validated configuration for a shadefs mount.

Everything the command line accepts is parsed here into frozen dataclasses, so the rest of the daemon
never sees a raw string. Parsing errors raise :class:`ConfigError` with one line a user can act on.
"""
from __future__ import annotations

import dataclasses
import re
import sys
from typing import Optional

__all__ = ["ConfigError", "Size", "parse_size", "MountConfig"]


class ConfigError(ValueError):
    """A configuration value is invalid; the message is one line meant for the user."""


_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_PCT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


@dataclasses.dataclass(frozen=True)
class Size:
    """A cache size: absolute bytes, or a fraction of a total resolved later.

    Exactly one of ``nbytes`` and ``fraction`` is set.
    """

    nbytes: Optional[int] = None
    fraction: Optional[float] = None

    def resolve(self, total_bytes: int) -> int:
        """Return the size in bytes; a fraction is taken of ``total_bytes`` (rounded down)."""
        if self.nbytes is not None:
            return self.nbytes
        return int(self.fraction * total_bytes)

    def __str__(self) -> str:
        if self.nbytes is not None:
            return format_bytes(self.nbytes)
        return f"{self.fraction * 100:g}%"


def parse_size(text: str) -> Size:
    """Parse ``'512KiB'``, ``'64MiB'``, ``'2GiB'``, ``'1000'`` (bytes), ``'20%'`` or ``'0'``.

    Decimal units (kB, MB, GB) are powers of 1000, binary units (KiB, MiB, GiB) powers of 1024.

    Raises:
        ConfigError: the text is not a size, is negative, is a fractional byte count (``1.5``), or a
            percentage above 100.
    """
    if not isinstance(text, str):
        raise ConfigError(f"invalid size {text!r}")
    m = _PCT_RE.match(text)
    if m:
        pct = float(m.group(1))
        if pct > 100:
            raise ConfigError(f"invalid size {text!r}: a percentage must be between 0% and 100%")
        return Size(fraction=pct / 100.0)
    if text.strip().startswith("-"):
        raise ConfigError(f"invalid size {text!r}: a size cannot be negative")
    m = _SIZE_RE.match(text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(
            f"invalid size {text!r}: use bytes or a unit (512KiB, 64MiB, 2GiB, 10GB) or a percentage (20%)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value != int(value) and m.group(2) == "":
        raise ConfigError(f"invalid size {text!r}: a plain byte count must be a whole number")
    return Size(nbytes=int(value))


def format_bytes(n: float) -> str:
    """Format a byte count with binary units, e.g. ``format_bytes(3 * 2**20) == '3.0 MiB'``."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@dataclasses.dataclass(frozen=True)
class MountConfig:
    """Everything a mount needs, validated by :func:`shadefs.cli` before the daemon forks.

    Sizes stay unresolved (:class:`Size`) until the source has been scanned, because ``20%`` is a
    fraction of the source's total file bytes.
    """

    source: str
    mountpoint: str
    ram_cache: Size = Size(nbytes=0)
    disk_cache_dir: Optional[str] = None
    disk_cache: Size = Size(nbytes=0)
    disk_min_free: Size = Size(fraction=0.0)
    policy: str = "static"
    score_transform: str = "rank"
    foreground: bool = False
    control: Optional[str] = None            # ZeroMQ endpoint URL; None = private ipc:// socket
    control_allow_remote: bool = False
    curve_server_secret: Optional[str] = None  # path of a CURVE secret key file (TCP only)
    control_insecure: bool = False            # tcp:// without CURVE (any local user may send scores/warm)
    control_authorized_keys: Optional[str] = None  # file of client public keys (Z85) a CURVE server key admits
    checkpoint_interval_s: float = 60.0       # importance + disk manifest checkpoints; 0 = at mount and unmount only
    metrics_port: Optional[int] = None
    metrics_addr: str = "127.0.0.1"
    trace: Optional[str] = None
    log_level: str = "INFO"
    log_file: Optional[str] = None
    allow_other: bool = False
    kernel_cache: bool = True                 # keep file pages in the kernel between opens of a hit
    fuse_threads: bool = True                 # libfuse front end: multithreaded loop (--fuse-loop multi)
    fuse_impl: str = "kernel" if sys.platform.startswith("linux") else "libfuse"  # --fuse-impl
    fuse_readers: int = 2                     # kernel front end: reader threads on /dev/fuse clones
    passthrough: bool = True                  # kernel front end: FUSE passthrough for NVMe hits when allowed
    source_passthrough: str = "off"           # ...and for opens served from the source: untiered, large, off
    verify_entries: str = "every-open"        # disk entry checksums: at every disk hit, or the first of each entry
    disk_pack_below: int = 64 << 10           # disk entries smaller than this (with a 64-byte header) go in segments
    backend_options: tuple = ()               # (key, value) pairs for fsspec backends
    backend: str = "auto"                     # --backend: auto (by URL scheme), obstore, fsspec
    scan_workers: Optional[int] = None        # posix listing threads; None: 1 on local filesystems, 16 on others
    backend_timeout_s: float = 60.0           # deadline of one backend read (EIO after); 0 = none
    fd_reserve: int = 64                      # descriptors kept free below the soft NOFILE (procutil.FdReserve)
    # the shared tier: None = off
    shared_tier: Optional[tuple] = dataclasses.field(default=None, repr=False)  # Redis URLs: may hold a password
    shared_tier_size: Size = Size(nbytes=0)   # this mount's contribution to the group's budget
    shared_tier_password_file: Optional[str] = None
    shared_tier_secret_file: Optional[str] = None   # the group secret that authenticates values
    shared_tier_insecure: bool = False              # no secret: values unauthenticated
    shared_tier_timeout_s: float = 0.05
    shared_max_file: int = 16 * 2**20
    shared_tier_heartbeat_s: float = 2.0
    shared_tier_partitions: int = 64
    follow_symlinks: bool = False             # serve symlinks whose target lies outside the source tree
    rescan: bool = False                      # ignore a persisted namespace snapshot: scan the source
    # clairvoyant caching: announced plans, Belady on the plan, the prefetcher
    prefetch_window: Optional[Size] = None    # None: min(256 MiB, 5 % of RAM); 0 disables prefetching
    prefetch_concurrency: int = 32            # prefetch reads in flight at most
    plan_window: int = 8192                   # positions ahead of a plan's cursor an open may match
