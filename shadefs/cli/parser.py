"""The ``shadefs`` command line: its parser (:func:`make_parser`), the argument types, and the small
commands that hand over to their modules (version, simulate, warm)."""
from __future__ import annotations

import argparse
from typing import List

from .mount import cmd_mount
from .stats import cmd_endpoint, cmd_stats
from .umount import cmd_umount


def cmd_version(args) -> int:
    from .. import __version__

    print(f"shadefs {__version__}")
    return 0


def cmd_simulate(args) -> int:
    from ..sim import main_simulate

    return main_simulate(args)


def cmd_warm(args) -> int:
    from ..warm import main_warm

    return main_warm(args)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the usage block stays behind --help)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


MOUNT_DESCRIPTION = """\
Serve SOURCE read-only at MOUNTPOINT through a cache: a RAM tier (--ram-cache), an NVMe tier
(--disk-cache DIR --disk-cache-size SIZE) and optionally a shared Redis tier (--shared-tier). Without
size flags nothing is cached. The daemon forks, scans SOURCE once (progress on stderr after 2 s; Ctrl-C
stops it), and the command returns once the mount serves, printing the tiers and the log file.

sizes: --ram-cache covers the cached files' bytes; a % is of the source's file bytes. --disk-cache-size
covers everything the NVMe tier writes (device bytes): its metadata, its segment slack and its entries;
a % is of what the whole source would take there (every entry, the metadata and the slack), so 100%
holds every file. The mount prints what the disk budget holds.

example: shadefs mount /nfs/imagenet /mnt/imagenet --ram-cache 16GiB --disk-cache /nvme/shadefs \\
             --disk-cache-size 80%
"""

SIZE_OPTIONS = ("--ram-cache", "--disk-cache-size", "--disk-min-free", "--shared-tier-size", "--shared-max-file")


def _attach_negative_sizes(argv: List[str]) -> List[str]:
    # argparse takes "--ram-cache -5MiB" for two options; pass it on as "--ram-cache=-5MiB", so the
    # size parser reports what is wrong with the value.
    out = []
    for a in argv:
        if out and out[-1] in SIZE_OPTIONS and a[:1] == "-" and a[1:2].isdigit():
            out[-1] = f"{out[-1]}={a}"
        else:
            out.append(a)
    return out


def _positive_seconds(text: str) -> float:
    """argparse type of a ``--timeout``: a finite number of seconds > 0 (0 or less would never wait)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text}: seconds must be a finite number > 0")
    return value


def _positive_int(text: str) -> int:
    """argparse type of a count: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be at least 1")
    return value


def _default_fuse_impl() -> str:
    from ..fuse import DEFAULT_IMPL

    return DEFAULT_IMPL


def make_parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = _Parser(prog="shadefs", description="Read-only caching FUSE filesystem for training data.")
    p.add_argument("--version", action="version", version=f"shadefs {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    m = sub.add_parser("mount", help="mount SOURCE (a directory or an fsspec URL) read-only at MOUNTPOINT",
                       description=MOUNT_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    m.add_argument("source", metavar="SOURCE",
                   help="the dataset: a directory (an NFS or local path) or an fsspec URL (s3://bucket/prefix)")
    m.add_argument("mountpoint", metavar="MOUNTPOINT", help="an empty directory; the files appear there read-only")
    m.add_argument("--ram-cache", metavar="SIZE", default="0",
                   help="RAM tier size, the cached files' bytes: 512KiB, 64MiB, 2GiB, or a %% of the source's "
                        "file bytes; 0 = off")
    m.add_argument("--disk-cache", metavar="DIR",
                   help="NVMe tier directory (created if missing; its parent must exist)")
    m.add_argument("--disk-cache-size", metavar="SIZE",
                   help="NVMe tier size in device bytes: its metadata, segment slack and entries (units, or a "
                        "%% of what the whole source would take there); 0 = off")
    m.add_argument("--disk-min-free", metavar="SIZE", help="keep this much free on the cache filesystem (e.g. 5%%)")
    m.add_argument("--disk-pack-below", metavar="SIZE", default="64KiB",
                   help="disk entries smaller than this (plus a 64-byte header) are packed into append-only "
                   "segment files, one pread per NVMe hit (default 64KiB; 0: one file per entry; a multiple "
                   "of 4 KiB)")
    m.add_argument("--checkpoint-interval", type=float, default=60.0, metavar="SECONDS",
                   help="checkpoint importance scores and the disk tier manifest every SECONDS "
                   "(default 60; 0 = only at mount and unmount)")
    m.add_argument("--policy", default="static", help="static (default), lru, fifo, shade")
    m.add_argument("--score-transform", default="rank", help="rank (SHADE: ln(10 + rank in batch)) or raw")
    m.add_argument("--foreground", "-f", action="store_true", help="stay attached; log to stderr")
    m.add_argument("--control", metavar="URL", help="control endpoint (default: a private ipc:// socket); "
                   "tcp://127.0.0.1:PORT for TCP")
    m.add_argument("--control-allow-remote", action="store_true", help="allow a non-loopback TCP control address")
    m.add_argument("--curve-secret-key", metavar="FILE", help="ZeroMQ CURVE secret key file for a TCP endpoint "
                   "(default: a key pair generated at mount)")
    m.add_argument("--control-authorized-keys", metavar="FILE",
                   help="with --curve-secret-key: the CURVE public keys (Z85, one a line; # comments) of the "
                   "clients this mount answers; required with --curve-secret-key")
    m.add_argument("--control-insecure", action="store_true",
                   help="serve a tcp:// control endpoint without CURVE: any local user could send scores and "
                   "warm requests (off by default)")
    m.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics on this port")
    m.add_argument("--metrics-addr", default="127.0.0.1", metavar="ADDR", help="metrics address (default loopback)")
    m.add_argument("--trace", metavar="FILE", help="record every open as CSV (time_s,path,size_bytes,outcome); "
                   "an existing non-empty FILE is refused unless --trace-overwrite")
    m.add_argument("--trace-overwrite", action="store_true", help="let --trace replace an existing FILE")
    m.add_argument("--log-level", default="info", help="debug, info, warning, error")
    m.add_argument("--log-file", metavar="FILE", help="log file (default: a file under the temp dir)")
    m.add_argument("--allow-other", action="store_true", help="let other users read the mount (off by default)")
    m.add_argument("--no-kernel-cache", action="store_true",
                   help="do not let the kernel keep file pages between opens of a hit")
    m.add_argument("--fuse-impl", choices=("kernel", "libfuse"), default=_default_fuse_impl(),
                   help="kernel (default on Linux): the FUSE kernel protocol spoken directly (hits inline, misses "
                   "asynchronous, passthrough); libfuse: mfusepy over libfuse 3")
    m.add_argument("--fuse-loop", choices=("multi", "single"), default="multi",
                   help="libfuse front end only: multi (default): a hit does not wait behind a miss; single: "
                   "fastest libfuse hits, misses block")
    m.add_argument("--fuse-readers", type=int, default=1, metavar="N",
                   help="kernel front end: threads reading /dev/fuse (default 1)")
    m.add_argument("--no-passthrough", action="store_true",
                   help="kernel front end: no FUSE passthrough at all (NVMe hits and files served from the source "
                   "go through the daemon)")
    m.add_argument("--source-passthrough", choices=("untiered", "large", "off"), default="untiered",
                   help="kernel front end, directory source: answer an open served from the source by FUSE "
                   "passthrough to the source file (checked at its open; the kernel reads it: a miss at the "
                   "source's speed, re-reads at its page-cache speed). untiered (default): files no tier would "
                   "take any part of; large: also every file above 8 MiB (cached by chunks) whatever the tiers "
                   "hold; off: through the daemon (every read checked). Object stores: always off")
    m.add_argument("--verify-entries", choices=("every-open", "first-hit"), default="every-open",
                   help="when a disk entry's checksum is verified: on every disk hit (default), or only at its "
                   "first hit after it was written or reloaded (later hits of it trust it; faster NVMe hits)")
    m.add_argument("--backend-opt", action="append", metavar="KEY=VALUE", help="backend option (repeatable)")
    m.add_argument("--backend", choices=("auto", "obstore", "fsspec"), default="auto",
                   help="the client of an object-store source: auto (default: obstore for s3://, gs://, az:// "
                   "when installed, fsspec for every other URL), obstore, or fsspec (s3fs, gcsfs, ...)")
    m.add_argument("--backend-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="a backend read that takes longer fails with EIO (default 60; 0 = no deadline)")
    m.add_argument("--fd-reserve", type=int, default=64, metavar="N",
                   help="file descriptors kept free below the soft NOFILE limit for control connections, the "
                   "tiers and the source: past it an NVMe hit is served without holding its entry's "
                   "descriptor (default 64; 0 = off)")
    # the shared tier (docs/operations.md, "A shared tier across nodes")
    m.add_argument("--shared-tier", metavar="URL[,URL...]",
                   help="a Redis Cluster (or one Redis server) shared by the mounts of this source on all "
                   "nodes: redis://[user:password@]host:port or rediss:// (TLS), seed nodes comma-separated")
    m.add_argument("--shared-tier-size", metavar="SIZE",
                   help="this mount's contribution to the group's shared budget (units or %% of the source)")
    m.add_argument("--shared-tier-password-file", metavar="FILE",
                   help="read the Redis password from FILE (instead of the URL)")
    m.add_argument("--shared-tier-secret", metavar="FILE",
                   help="the group's secret (at least 16 bytes, mode 0600, the same on every member): "
                   "authenticates every shared-tier value (required with --shared-tier)")
    m.add_argument("--shared-tier-insecure", action="store_true",
                   help="run the shared tier without a secret: anyone who can write to the Redis can make "
                   "members serve bytes of their choosing")
    m.add_argument("--shared-tier-timeout", type=float, default=0.05, metavar="SECONDS",
                   help="deadline of one shared-tier call (default 0.05; +10 ms per MiB of value)")
    m.add_argument("--shared-max-file", default="16MiB", metavar="SIZE",
                   help="files above SIZE bypass the shared tier (default 16MiB)")
    m.add_argument("--shared-tier-heartbeat", type=float, default=2.0, metavar="SECONDS",
                   help="membership heartbeat (default 2; a silent member drops out after 3 periods)")
    m.add_argument("--shared-tier-partitions", type=int, default=64, metavar="K",
                   help="hash-tagged partitions of the group (default 64; the same on every node)")
    m.add_argument("--follow-symlinks", action="store_true",
                   help="also serve symlinks whose target lies outside the source tree (off: skipped and "
                        "counted; docs/operations.md, Security)")
    m.add_argument("--rescan", action="store_true",
                   help="scan the source even when a namespace snapshot beside the disk tier is still valid")
    # clairvoyant caching
    m.add_argument("--prefetch-window", metavar="SIZE",
                   help="RAM for prefetched files not yet opened (default min(256MiB, 5%% of RAM); 0 = off)")
    m.add_argument("--prefetch-concurrency", type=int, default=32, metavar="N",
                   help="prefetch reads in flight ahead of announced plans (default 32; 0 = off)")
    m.set_defaults(func=cmd_mount)

    u = sub.add_parser("umount", help="unmount MOUNTPOINT (the daemon exits); refuses non-shadefs mounts")
    u.add_argument("mountpoint", metavar="MOUNTPOINT")
    u.add_argument("--force", action="store_true",
                   help="end a daemon that does not answer within --timeout, does not exit after the unmount, "
                   "or still runs without its mount (SIGTERM, SIGKILL after --timeout), and clear the mount")
    u.add_argument("--timeout", type=_positive_seconds, default=2.0, metavar="SECONDS",
                   help="how long --force waits for the daemon to answer, and after SIGTERM before SIGKILL "
                   "(default 2)")
    u.set_defaults(func=cmd_umount)

    s = sub.add_parser("stats", help="print the cache figures of a running mount")
    s.add_argument("mountpoint", metavar="MOUNTPOINT")
    s.add_argument("--timeout", type=_positive_seconds, default=5.0, metavar="SECONDS",
                   help="how long to wait for the daemon's answer (default 5)")
    s.add_argument("--json", action="store_true", help="print the stats JSON (docs/metrics.md); with --watch "
                   "one object a line")
    s.add_argument("--watch", type=_positive_seconds, nargs="?", const=2.0, default=None, metavar="SECONDS",
                   help="a live view: print again every SECONDS (default 2) with the last interval's opens/s, "
                        "hit ratio and backend bytes/s, until Ctrl-C")
    s.add_argument("--count", type=_positive_int, default=None, metavar="N",
                   help="with --watch: stop after N samples")
    s.set_defaults(func=cmd_stats)

    e = sub.add_parser("endpoint", help="print the control endpoint URL of a mount")
    e.add_argument("mountpoint", metavar="MOUNTPOINT")
    e.set_defaults(func=cmd_endpoint)

    from ..sim import add_simulate_arguments
    from ..warm import add_warm_arguments

    sm = sub.add_parser("simulate", help="replay an access trace against the policies and Belady's OPT")
    add_simulate_arguments(sm)
    sm.set_defaults(func=cmd_simulate)

    w = sub.add_parser("warm", help="prefetch files into the cache of a running mount")
    add_warm_arguments(w)
    w.set_defaults(func=cmd_warm)

    v = sub.add_parser("version", help="print the version")
    v.set_defaults(func=cmd_version)
    return p
