"""The ``shadefs`` command: mount, umount, stats, endpoint, warm, simulate.

Every user error is one line on stderr and a non-zero exit, before anything is mounted: the mount
command validates the source, the mountpoint, /dev/fuse, fusermount, the cache directory, the sizes and
the policy, and only then forks the daemon and waits until the mount is ready.
"""
from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

from .config import ConfigError, MountConfig, format_bytes, parse_size

STATS_KEYS = ("policy", "uptime_s", "opens", "hits", "misses", "hit_ratio", "byte_hit_ratio",
              "backend_bytes", "tiers", "shared_errors", "namespace", "prefetch")  # shared_errors: only with --shared-tier


class UserError(Exception):
    """One line for the user; exit status 2."""


# -- helpers -------------------------------------------------------------------------------------------------
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


def _fusermount() -> Optional[str]:
    return shutil.which("fusermount3") or shutil.which("fusermount")


def _unmount(mountpoint: str, lazy: bool = False) -> None:
    tool = _fusermount()
    cmds = []
    if tool:
        cmds.append([tool, "-u"] + (["-z"] if lazy else []) + [mountpoint])
    cmds.append(["umount"] + (["-l"] if lazy else []) + [mountpoint])
    last = ""
    for cmd in cmds:
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
        except FileNotFoundError:
            continue
        if r.returncode == 0:
            return
        last = (r.stderr or r.stdout).strip()
    raise UserError(f"cannot unmount {mountpoint}: {last or 'no fusermount or umount available'}")


def _clear_stale(mountpoint: str) -> bool:
    """Unmount a FUSE mount whose daemon died ("Transport endpoint is not connected"). Returns True if done."""
    try:
        # statvfs, not stat: the kernel answers stat from its attribute cache (attr_timeout=3600) even
        # after the daemon died; STATFS always reaches the (dead) connection.
        os.statvfs(mountpoint)
        return False
    except OSError as e:
        # ENOTCONN once the connection is gone; ECONNABORTED for a request caught in the abort
        if e.errno not in (errno.ENOTCONN, errno.ECONNABORTED):
            return False
    _unmount(mountpoint, lazy=True)
    return True


def _parse_sizes(args) -> dict:
    out = {}
    for name in ("ram_cache", "disk_cache_size", "disk_min_free"):
        value = getattr(args, name, None)
        if value is not None:
            try:
                out[name] = parse_size(value)
            except ConfigError as e:
                raise UserError(f"--{name.replace('_', '-')}: {e}") from None
    return out


def _backend_options(pairs: List[str]) -> tuple:
    out = []
    for p in pairs or []:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise UserError(f"--backend-opt {p!r}: expected KEY=VALUE")
        out.append((key, value))
    return tuple(out)


def _shared_tier_config(args) -> dict:
    """The --shared-tier* flags (issue 13), validated; {} without --shared-tier."""
    shared_flags = ("shared_tier_size", "shared_tier_password_file")
    if not args.shared_tier:
        for name in shared_flags:
            if getattr(args, name, None) is not None:
                raise UserError(f"--{name.replace('_', '-')} needs --shared-tier URL")
        return {}
    try:
        from .cache.shared import SharedTierConfigError, parse_urls

        urls = parse_urls(args.shared_tier)
    except ImportError as e:
        raise UserError(f"--shared-tier needs the redis and xxhash packages: pip install 'shadefs[shared]' ({e})") \
            from None
    except SharedTierConfigError as e:
        raise UserError(str(e)) from None
    try:
        size = parse_size(args.shared_tier_size if args.shared_tier_size is not None else "0")
        max_file = parse_size(args.shared_max_file)
    except ConfigError as e:
        raise UserError(f"--shared-tier-size / --shared-max-file: {e}") from None
    if max_file.nbytes is None:
        raise UserError("--shared-max-file: give bytes or a unit (16MiB), not a percentage")
    if not 0 < args.shared_tier_timeout <= 60:
        raise UserError(f"--shared-tier-timeout {args.shared_tier_timeout:g}: seconds in (0, 60]")
    if not 0.05 <= args.shared_tier_heartbeat <= 600:
        raise UserError(f"--shared-tier-heartbeat {args.shared_tier_heartbeat:g}: seconds in [0.05, 600]")
    if not 1 <= args.shared_tier_partitions <= 16384:
        raise UserError(f"--shared-tier-partitions {args.shared_tier_partitions}: 1..16384")
    pw = None
    if args.shared_tier_password_file:
        pw = os.path.abspath(args.shared_tier_password_file)
        try:
            with open(pw):
                pass
        except OSError as e:
            raise UserError(f"--shared-tier-password-file {pw!r}: {e.strerror}") from None
    return dict(shared_tier=tuple(urls), shared_tier_size=size, shared_tier_password_file=pw,
                shared_tier_timeout_s=float(args.shared_tier_timeout), shared_max_file=max_file.nbytes,
                shared_tier_heartbeat_s=float(args.shared_tier_heartbeat),
                shared_tier_partitions=int(args.shared_tier_partitions))


def build_config(args) -> MountConfig:
    """Validate the mount arguments into a :class:`MountConfig` (raises UserError)."""
    from .policies.base import PolicyError, get_policy

    sizes = _parse_sizes(args)
    try:
        get_policy(args.policy)
    except PolicyError as e:
        raise UserError(str(e)) from None
    source = args.source
    if "://" not in source:
        source = os.path.abspath(source)
        if not os.path.isdir(source):
            raise UserError(f"source {args.source!r} is not a directory" if os.path.exists(source)
                            else f"source {args.source!r} does not exist")
    else:
        from .backends.base import BackendError, backend_for
        try:
            backend_for(source)
        except BackendError as e:
            raise UserError(str(e)) from None
    disk_dir = os.path.abspath(args.disk_cache) if args.disk_cache else None
    disk_size = sizes.get("disk_cache_size")
    if disk_size is not None and disk_dir is None and (disk_size.nbytes or disk_size.fraction):
        raise UserError("--disk-cache-size needs --disk-cache DIR")
    if disk_dir is not None and disk_size is None:
        raise UserError("--disk-cache DIR needs --disk-cache-size SIZE (for example 20% or 50GiB)")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise UserError(f"--metrics-port {args.metrics_port}: a port is 0-65535 (0 picks a free one)")
    if not 0 <= args.checkpoint_interval < float("inf"):
        raise UserError(f"--checkpoint-interval {args.checkpoint_interval:g}: seconds must be a finite number >= 0")
    if not 0 <= args.backend_timeout < float("inf"):
        raise UserError(f"--backend-timeout {args.backend_timeout:g}: seconds must be a finite number >= 0 "
                        "(0 = no deadline)")
    if args.score_transform not in ("rank", "raw"):
        raise UserError(f"--score-transform {args.score_transform!r}: choose rank or raw")
    kwargs = dict(
        source=source, mountpoint=os.path.abspath(args.mountpoint), policy=args.policy,
        disk_cache_dir=disk_dir, foreground=args.foreground, control=args.control,
        control_allow_remote=args.control_allow_remote, curve_server_secret=args.curve_secret_key,
        metrics_port=args.metrics_port, metrics_addr=args.metrics_addr, trace=args.trace and os.path.abspath(args.trace),
        log_level=args.log_level.upper(), log_file=args.log_file and os.path.abspath(args.log_file),
        allow_other=args.allow_other, kernel_cache=not args.no_kernel_cache,
        fuse_threads=args.fuse_loop == "multi", backend_options=_backend_options(args.backend_opt),
        score_transform=args.score_transform, checkpoint_interval_s=args.checkpoint_interval,
        follow_symlinks=args.follow_symlinks, rescan=args.rescan,
        backend_timeout_s=float(args.backend_timeout),
    )
    kwargs.update(_shared_tier_config(args))
    if "ram_cache" in sizes:
        kwargs["ram_cache"] = sizes["ram_cache"]
    if disk_size is not None:
        kwargs["disk_cache"] = disk_size
    if "disk_min_free" in sizes:
        kwargs["disk_min_free"] = sizes["disk_min_free"]
    # clairvoyant caching (issue 11)
    if args.prefetch_window is not None:
        try:
            pw = parse_size(args.prefetch_window)
        except ConfigError as e:
            raise UserError(f"--prefetch-window: {e}") from None
        if pw.fraction is not None:
            raise UserError("--prefetch-window: give bytes with a unit (256MiB); 0 turns prefetching off")
        kwargs["prefetch_window"] = pw
    if not 0 <= args.prefetch_concurrency <= 1024:
        raise UserError(f"--prefetch-concurrency {args.prefetch_concurrency}: choose 0..1024 (0: no prefetching)")
    kwargs["prefetch_concurrency"] = args.prefetch_concurrency
    if args.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise UserError(f"--log-level {args.log_level!r}: choose debug, info, warning or error")
    if args.control or args.curve_secret_key:
        from .control.server import validate_endpoint

        try:
            validate_endpoint(args.control, args.control_allow_remote,
                              curve_secret_key_file=args.curve_secret_key)
        except ValueError as e:
            raise UserError(f"--control: {e}") from None
    return MountConfig(**kwargs)


def preflight(cfg: MountConfig) -> None:
    """Check everything a mount needs before forking (raises UserError)."""
    mp = cfg.mountpoint
    if _clear_stale(mp):
        print(f"shadefs: cleared a stale mount at {mp} (its daemon had died)", file=sys.stderr)
    if not os.path.isdir(mp):
        raise UserError(f"mountpoint {mp!r} is not a directory" if os.path.exists(mp)
                        else f"mountpoint {mp!r} does not exist")
    if os.path.ismount(mp) or is_mounted(mp):
        raise UserError(f"mountpoint {mp!r} is already mounted")
    if os.listdir(mp):
        raise UserError(f"mountpoint {mp!r} is not empty")
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
        os.close(fd)
    except OSError as e:
        raise UserError(f"/dev/fuse is not usable ({e.strerror}); in a container pass --device /dev/fuse "
                        f"and CAP_SYS_ADMIN") from None
    if _fusermount() is None:
        raise UserError("fusermount is missing; install it with: apt-get install fuse3")
    if cfg.disk_cache_dir:
        try:
            os.makedirs(cfg.disk_cache_dir, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=cfg.disk_cache_dir):
                pass
        except OSError as e:
            raise UserError(f"cache directory {cfg.disk_cache_dir!r} is not writable ({e.strerror})") from None
        if os.path.realpath(cfg.disk_cache_dir).startswith(os.path.realpath(mp) + os.sep):
            raise UserError("the cache directory must not be inside the mountpoint")
    if cfg.trace:
        try:
            open(cfg.trace, "a").close()
        except OSError as e:
            raise UserError(f"--trace {cfg.trace!r}: {e.strerror}") from None


def _default_log_file(mountpoint: str) -> str:
    d = os.path.join(tempfile.gettempdir(), f"shadefs-{os.getuid()}")
    os.makedirs(d, mode=0o700, exist_ok=True)
    slug = mountpoint.strip("/").replace("/", "_") or "root"
    return os.path.join(d, f"{slug}.log")


def _setup_logging(level: str, log_file: Optional[str]) -> None:
    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # object-store clients log whole responses at debug level: keep them to warnings
    for name in ("botocore", "aiobotocore", "s3fs", "fsspec", "urllib3", "aiohttp"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(level)))


def _run_daemon(cfg: MountConfig, ready_fd: Optional[int]) -> int:
    from .daemon import Daemon

    daemon = Daemon(cfg, ready_fd)
    try:
        daemon.build()
        daemon.run()
    except BaseException as e:  # report to the waiting parent, then exit
        logging.getLogger("shadefs").exception("daemon failed")
        daemon._notify(f"error: {e}")
        return 1
    return 0


# -- commands -------------------------------------------------------------------------------------------
def cmd_mount(args) -> int:
    cfg = build_config(args)
    preflight(cfg)
    if cfg.foreground:
        _setup_logging(cfg.log_level, cfg.log_file)
        return _run_daemon(cfg, None)
    log_file = cfg.log_file or _default_log_file(cfg.mountpoint)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the daemon
        os.close(r)
        os.setsid()
        _setup_logging(cfg.log_level, log_file)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os._exit(_run_daemon(cfg, w))
    os.close(w)
    with os.fdopen(r) as f:
        line = f.readline().strip()
    if line == "ok":
        print(f"shadefs: mounted {cfg.source} at {cfg.mountpoint} (pid {pid}, policy {cfg.policy}, "
              f"log {log_file})")
        return 0
    os.waitpid(pid, 0)
    msg = line[len("error: "):] if line.startswith("error: ") else f"the daemon exited; see {log_file}"
    print(f"shadefs: mount failed: {msg}", file=sys.stderr)
    return 1


def cmd_umount(args) -> int:
    mp = os.path.abspath(args.mountpoint)
    if not (is_mounted(mp) or os.path.ismount(mp)):
        raise UserError(f"{mp!r} is not mounted")
    _unmount(mp)
    deadline = time.monotonic() + 10
    while is_mounted(mp) and time.monotonic() < deadline:
        time.sleep(0.05)
    return 0


def _client(mountpoint: str):
    from .control.client import ControlClient, EndpointNotFound, find_endpoint

    try:
        endpoint = find_endpoint(mountpoint)
    except EndpointNotFound as e:
        raise UserError(str(e)) from None
    return ControlClient(endpoint)


def format_stats(s: dict) -> str:
    """A short human table of the stats JSON."""
    hits = sum(s["hits"].values())
    per_tier = ", ".join(f"{k} {v}" for k, v in s["hits"].items())
    lines = [
        f"policy          {s['policy']}      uptime {s['uptime_s']:.0f} s",
        f"opens           {s['opens']}",
        f"hits            {hits}  ({per_tier})",
        f"misses          {s['misses']}",
        f"hit ratio       {s['hit_ratio'] * 100:.2f} %   (byte hit ratio {s['byte_hit_ratio'] * 100:.2f} %)",
        f"backend read    {format_bytes(s['backend_bytes'])}",
        "tier   used / capacity            files   evictions",
    ]
    for name in ("ram", "disk", "shared"):
        if name not in s["tiers"]:
            continue
        t = s["tiers"][name]
        lines.append(f"{name:<6} {format_bytes(t['used_bytes']):>10} / {format_bytes(t['capacity_bytes']):<10} "
                     f"{t['files']:>8} {t['evictions']:>11}")
    p = s.get("prefetch")
    if p:
        lines.append(f"prefetch        {p['ready']} ready, {p['late']} late ({p.get('late_wait_s', 0.0):.3f} s "
                     f"waited), {format_bytes(p['fetched_bytes'])} fetched, {format_bytes(p['wasted_bytes'])} wasted")
        lines.append(f"plans           {p['plans_active']} active, {p['plans_retired']} retired")
    if "scores_received" in s:
        rejected = sum(s.get("scores_rejected", {}).values())
        lines.append(f"score messages  {s['scores_received']} received, {rejected} rejected")
    return "\n".join(lines)


def cmd_stats(args) -> int:
    client = _client(args.mountpoint)
    try:
        s = client.stats()
    except TimeoutError:
        raise UserError(f"the daemon of {args.mountpoint} did not answer") from None
    finally:
        client.close()
    if args.json:
        print(json.dumps({k: s[k] for k in STATS_KEYS if k in s}, indent=2))
    else:
        print(format_stats(s))
    return 0


def cmd_endpoint(args) -> int:
    from .control.client import EndpointNotFound, find_endpoint

    try:
        print(find_endpoint(args.mountpoint))
    except EndpointNotFound as e:
        raise UserError(str(e)) from None
    return 0


def cmd_simulate(args) -> int:
    from .sim import main_simulate

    return main_simulate(args)


def cmd_warm(args) -> int:
    from .warm import main_warm

    return main_warm(args)


# -- argument parsing -------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the usage block stays behind --help)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="shadefs", description="Read-only caching FUSE filesystem for training data.")
    sub = p.add_subparsers(dest="command", required=True)

    m = sub.add_parser("mount", help="mount SOURCE (a directory or an fsspec URL) read-only at MOUNTPOINT")
    m.add_argument("source", metavar="SOURCE")
    m.add_argument("mountpoint", metavar="MOUNTPOINT")
    m.add_argument("--ram-cache", metavar="SIZE", default="0",
                   help="RAM tier size: bytes, 512KiB, 64MiB, 2GiB, or a %% of the source's bytes; 0 = off")
    m.add_argument("--disk-cache", metavar="DIR", help="NVMe tier directory")
    m.add_argument("--disk-cache-size", metavar="SIZE", help="NVMe tier size (units or %%); 0 = off")
    m.add_argument("--disk-min-free", metavar="SIZE", help="keep this much free on the cache filesystem (e.g. 5%%)")
    m.add_argument("--checkpoint-interval", type=float, default=60.0, metavar="SECONDS",
                   help="checkpoint importance scores and the disk tier manifest every SECONDS "
                   "(default 60; 0 = only at mount and unmount)")
    m.add_argument("--policy", default="static", help="static (default), lru, fifo, shade")
    m.add_argument("--score-transform", default="rank", help="rank (SHADE: ln(10 + rank in batch)) or raw")
    m.add_argument("--foreground", "-f", action="store_true", help="stay attached; log to stderr")
    m.add_argument("--control", metavar="URL", help="control endpoint (default: a private ipc:// socket); "
                   "tcp://127.0.0.1:PORT for TCP")
    m.add_argument("--control-allow-remote", action="store_true", help="allow a non-loopback TCP control address")
    m.add_argument("--curve-secret-key", metavar="FILE", help="ZeroMQ CURVE secret key file for a TCP endpoint")
    m.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics on this port")
    m.add_argument("--metrics-addr", default="127.0.0.1", metavar="ADDR", help="metrics address (default loopback)")
    m.add_argument("--trace", metavar="FILE", help="record every open as CSV (time_s,path,size_bytes,outcome)")
    m.add_argument("--log-level", default="info", help="debug, info, warning, error")
    m.add_argument("--log-file", metavar="FILE", help="log file (default: a file under the temp dir)")
    m.add_argument("--allow-other", action="store_true", help="let other users read the mount (off by default)")
    m.add_argument("--no-kernel-cache", action="store_true",
                   help="do not let the kernel keep file pages between opens of a hit")
    m.add_argument("--fuse-loop", choices=("multi", "single"), default="multi",
                   help="multi (default): a hit never waits behind a miss; single: fastest hits, misses block")
    m.add_argument("--backend-opt", action="append", metavar="KEY=VALUE", help="backend option (repeatable)")
    m.add_argument("--backend-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="a backend read that takes longer fails with EIO (default 60; 0 = no deadline)")
    # the shared tier (issue 13; docs/operations.md, "A shared tier across nodes")
    m.add_argument("--shared-tier", metavar="URL[,URL...]",
                   help="a Redis Cluster (or one Redis server) shared by the mounts of this source on all "
                   "nodes: redis://[user:password@]host:port or rediss:// (TLS), seed nodes comma-separated")
    m.add_argument("--shared-tier-size", metavar="SIZE",
                   help="this mount's contribution to the group's shared budget (units or %% of the source)")
    m.add_argument("--shared-tier-password-file", metavar="FILE",
                   help="read the Redis password from FILE (instead of the URL)")
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
    # clairvoyant caching (issue 11)
    m.add_argument("--prefetch-window", metavar="SIZE",
                   help="RAM for prefetched files not yet opened (default min(256MiB, 5%% of RAM); 0 = off)")
    m.add_argument("--prefetch-concurrency", type=int, default=32, metavar="N",
                   help="prefetch reads in flight ahead of announced plans (default 32; 0 = off)")
    m.set_defaults(func=cmd_mount)

    u = sub.add_parser("umount", help="unmount MOUNTPOINT (the daemon exits)")
    u.add_argument("mountpoint", metavar="MOUNTPOINT")
    u.set_defaults(func=cmd_umount)

    s = sub.add_parser("stats", help="print the cache figures of a running mount")
    s.add_argument("mountpoint", metavar="MOUNTPOINT")
    s.add_argument("--json", action="store_true", help="print the stats JSON (docs/metrics.md)")
    s.set_defaults(func=cmd_stats)

    e = sub.add_parser("endpoint", help="print the control endpoint URL of a mount")
    e.add_argument("mountpoint", metavar="MOUNTPOINT")
    e.set_defaults(func=cmd_endpoint)

    from .sim import add_simulate_arguments
    from .warm import add_warm_arguments

    sm = sub.add_parser("simulate", help="replay an access trace against the policies and Belady's OPT")
    add_simulate_arguments(sm)
    sm.set_defaults(func=cmd_simulate)

    w = sub.add_parser("warm", help="prefetch files into the cache of a running mount")
    add_warm_arguments(w)
    w.set_defaults(func=cmd_warm)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = make_parser().parse_args(_attach_negative_sizes(sys.argv[1:] if argv is None else list(argv)))
    try:
        return args.func(args)
    except UserError as e:
        print(f"shadefs: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `shadefs stats MNT | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
