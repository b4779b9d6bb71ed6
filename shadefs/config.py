"""Typed, validated configuration for a shadefs mount.

Everything the command line accepts is parsed here into frozen dataclasses, so the rest of the daemon
never sees a raw string. Parsing errors raise :class:`ConfigError` with one line a user can act on.
"""
from __future__ import annotations

import dataclasses
import os
import re
import sys
import time
from typing import Mapping, Optional

__all__ = ["ConfigError", "Size", "parse_size", "MountConfig", "Environment", "ENV_VARS", "pause_point"]


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
    fuse_readers: int = 1                     # kernel front end: reader threads on /dev/fuse clones
    passthrough: bool = True                  # kernel front end: FUSE passthrough for NVMe hits when allowed
    source_passthrough: str = "untiered"      # ...and for opens served from the source: untiered, large, off
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


# -- the environment ---------------------------------------------------------------------------------------
#: every ``SHADEFS_*`` variable shadefs reads, and how far it is to be relied on (docs/configuration.md,
#: "Environment"): ``stable`` (a user's switch), ``experimental`` (for measurements; may go), ``testing``
#: (the test suite's; never needed in use). No other module reads a ``SHADEFS_*`` variable.
ENV_VARS = {
    "SHADEFS_ENDPOINT": "stable",              # the control endpoint of the hooks and `shadefs stats`
    "SHADEFS_CREDENTIALS": "stable",           # the control credentials file that goes with it
    "SHADEFS_NO_OPENAT2": "stable",            # 1: open source files one O_NOFOLLOW component at a time
    "SHADEFS_FUSE_PYTHON_LOOP": "experimental",  # 1: the kernel front end's Python reader loop
    "SHADEFS_FUSE_GIL_OPENS": "experimental",  # 1: the compiled loop hands every OPEN to Python
    "SHADEFS_FUSE_READER_MISSES": "experimental",  # 0: misses of a directory source go to workers
    "SHADEFS_FUSE_CHECK_REPLIES": "testing",   # 1: check every FUSE reply's length against its opcode
    "SHADEFS_AUDIT": "testing",                # 1: the state machine's audit in the stats JSON
    "SHADEFS_LOOSE_BUFFERS": "testing",        # with SHADEFS_AUDIT=1: a smaller loose-buffer bound
    "SHADEFS_FILL_BUFFERS": "testing",         # with SHADEFS_AUDIT=1: a smaller bound on reads in flight
    "SHADEFS_TESTING_PAUSE": "testing",        # POINT:FILE: stop at a start-up point (pause_point)
}


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "") == "1"


@dataclasses.dataclass(frozen=True)
class Environment:
    """The ``SHADEFS_*`` environment switches, read in one place (:meth:`from_env`).

    ``endpoint`` / ``credentials``: strings, "" when unset. ``loose_buffers``, ``fill_buffers``: bytes or None. The flags
    are True only for the value ``1``, except ``fuse_reader_misses``, True unless the value is ``0``. ``testing_pause``: ``(point, file)`` or None."""

    endpoint: str = ""
    credentials: str = ""
    no_openat2: bool = False
    fuse_python_loop: bool = False
    fuse_gil_opens: bool = False
    fuse_reader_misses: bool = True
    fuse_check_replies: bool = False
    audit: bool = False
    loose_buffers: Optional[int] = None
    fill_buffers: Optional[int] = None
    testing_pause: Optional[tuple] = None

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "Environment":
        """Read the switches from ``environ`` (default ``os.environ``) now. A malformed value
        (``SHADEFS_LOOSE_BUFFERS=lots``, a pause without ``:FILE``) counts as unset; raises nothing."""
        env = os.environ if environ is None else environ
        loose = env.get("SHADEFS_LOOSE_BUFFERS", "").strip()
        fill = env.get("SHADEFS_FILL_BUFFERS", "").strip()
        point, sep, path = env.get("SHADEFS_TESTING_PAUSE", "").partition(":")
        return cls(endpoint=env.get("SHADEFS_ENDPOINT", "").strip(),
                   credentials=env.get("SHADEFS_CREDENTIALS", "").strip(),
                   no_openat2=_flag(env, "SHADEFS_NO_OPENAT2"),
                   fuse_python_loop=_flag(env, "SHADEFS_FUSE_PYTHON_LOOP"),
                   fuse_gil_opens=_flag(env, "SHADEFS_FUSE_GIL_OPENS"),
                   fuse_reader_misses=env.get("SHADEFS_FUSE_READER_MISSES", "") != "0",
                   fuse_check_replies=_flag(env, "SHADEFS_FUSE_CHECK_REPLIES"),
                   audit=_flag(env, "SHADEFS_AUDIT"),
                   loose_buffers=int(loose) if loose.isdigit() else None,
                   fill_buffers=int(fill) if fill.isdigit() else None,
                   testing_pause=(point, path) if point and sep and path else None)


#: the start-up points :func:`pause_point` knows, in the order a mount passes them
PAUSE_POINTS = ("cli-start", "cli-checked", "cli-forked", "daemon-build", "daemon-mounted", "cli-ready")
PAUSE_MAX_S = 60.0


def pause_point(name: str) -> None:
    """Testing only: with ``SHADEFS_TESTING_PAUSE=NAME:FILE`` in the environment, write this process's pid
    to FILE and wait there (up to PAUSE_MAX_S seconds; a signal handler that raises ends it), so that a
    test can signal the start at a known point (tests/integration/test_cli_interrupt.py). Without the
    variable, or at another point, returns at once. ``name`` is one of PAUSE_POINTS."""
    pause = Environment.from_env().testing_pause
    if pause is None or pause[0] != name:
        return
    with open(pause[1] + ".tmp", "w") as f:  # renamed into place: the test never reads half a pid
        f.write(f"{os.getpid()}\n")
    os.replace(pause[1] + ".tmp", pause[1])
    deadline = time.monotonic() + PAUSE_MAX_S
    while time.monotonic() < deadline:
        time.sleep(0.01)
