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
import signal
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

from .cmdutil import UserError, is_mounted, mount_client as _client  # noqa: F401  (shadefs.cli.* for callers)
from .cmdutil import check_daemon_alive as _check_daemon_alive, is_stale as _is_stale
from .config import ConfigError, MountConfig, format_bytes, parse_size, pause_point

STATS_KEYS = ("policy", "uptime_s", "opens", "hits", "misses", "hit_ratio", "byte_hit_ratio",
              "backend_bytes", "corrupt_entries", "tiers", "shared_errors", "shared_deadlines", "namespace", "prefetch",
              "descriptors", "memory")  # shared_*: only with --shared-tier


# -- helpers -------------------------------------------------------------------------------------------------
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


def _pack_below(args) -> int:
    try:
        size = parse_size(getattr(args, "disk_pack_below", None) or "64KiB")
    except ConfigError as e:
        raise UserError(f"--disk-pack-below: {e}") from None
    if size.nbytes is None or size.nbytes % 4096:
        raise UserError(f"--disk-pack-below {args.disk_pack_below!r}: a byte size, a multiple of 4 KiB "
                        f"(e.g. 64KiB, or 0)")
    return size.nbytes


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
    """The --shared-tier* flags, validated; {} without --shared-tier."""
    shared_flags = ("shared_tier_size", "shared_tier_password_file", "shared_tier_secret")
    if not args.shared_tier:
        for name in shared_flags + ("shared_tier_insecure",):
            if getattr(args, name, None) not in (None, False):
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
    secret = _shared_tier_secret(args)
    pw = None
    if args.shared_tier_password_file:
        pw = os.path.abspath(args.shared_tier_password_file)
        try:
            with open(pw):
                pass
        except OSError as e:
            raise UserError(f"--shared-tier-password-file {pw!r}: {e.strerror}") from None
    return dict(shared_tier=tuple(urls), shared_tier_size=size, shared_tier_password_file=pw,
                shared_tier_secret_file=secret, shared_tier_insecure=secret is None,
                shared_tier_timeout_s=float(args.shared_tier_timeout), shared_max_file=max_file.nbytes,
                shared_tier_heartbeat_s=float(args.shared_tier_heartbeat),
                shared_tier_partitions=int(args.shared_tier_partitions))


def _shared_tier_secret(args) -> Optional[str]:
    """The absolute path of a valid --shared-tier-secret, or None with --shared-tier-insecure."""
    from .cache.shared import SharedTierConfigError, read_secret

    if args.shared_tier_secret and args.shared_tier_insecure:
        raise UserError("--shared-tier-secret and --shared-tier-insecure: give one of them")
    if args.shared_tier_insecure:
        return None
    if not args.shared_tier_secret:
        raise UserError("--shared-tier needs --shared-tier-secret FILE (the group's secret, mode 0600, the same on "
                        "every member) or --shared-tier-insecure (anyone who can write to Redis can forge values)")
    path = os.path.abspath(args.shared_tier_secret)
    try:
        read_secret(path)
    except SharedTierConfigError as e:
        raise UserError(str(e)) from None
    return path


def _authorized_keys_file(args) -> Optional[str]:
    """``--control-authorized-keys``, checked (it is read again by the daemon at mount): the absolute path,
    or None. A ``--curve-secret-key`` needs it: a server key without a client list would admit any key
    pair (raises UserError)."""
    path = args.control_authorized_keys
    if path is None:
        if args.curve_secret_key:
            raise UserError("--curve-secret-key needs --control-authorized-keys FILE (the public keys of the "
                            "clients to answer, one a line): without it any key pair would be admitted")
        return None
    if not args.curve_secret_key:
        raise UserError("--control-authorized-keys needs --curve-secret-key FILE and a tcp:// --control")
    from .control.server import load_authorized_keys

    path = os.path.abspath(path)
    try:
        load_authorized_keys(path)
    except ValueError as e:
        raise UserError(f"--control-authorized-keys: {e}") from None
    return path


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
            backend_for(source, args.backend)
        except BackendError as e:
            raise UserError(str(e)) from None
    options = _backend_options(args.backend_opt)
    if args.backend != "auto" and ("://" not in source or source.startswith("file://")):
        raise UserError(f"--backend {args.backend}: chooses the client of an object-store URL (s3://, gs://, "
                        "az://), not of a local path")
    if "://" not in source or source.startswith("file://"):
        from .backends.base import BackendError
        from .backends.posix import PosixBackend

        try:  # cheap (no I/O): a bad option fails here, named, not in the daemon
            PosixBackend(source, **dict(options))
        except (BackendError, TypeError, ValueError) as e:
            raise UserError(f"--backend-opt: {e}") from None
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
    if not 0 <= args.fd_reserve <= 1 << 20:
        raise UserError(f"--fd-reserve {args.fd_reserve}: choose 0 (off) to 1048576 descriptors")
    if not 1 <= args.fuse_readers <= 64:
        raise UserError(f"--fuse-readers {args.fuse_readers}: choose 1-64 threads")
    if args.score_transform not in ("rank", "raw"):
        raise UserError(f"--score-transform {args.score_transform!r}: choose rank or raw")
    kwargs = dict(
        source=source, mountpoint=os.path.abspath(args.mountpoint), policy=args.policy,
        disk_cache_dir=disk_dir, foreground=args.foreground, control=args.control,
        control_allow_remote=args.control_allow_remote, curve_server_secret=args.curve_secret_key,
        control_insecure=args.control_insecure, control_authorized_keys=_authorized_keys_file(args),
        metrics_port=args.metrics_port, metrics_addr=args.metrics_addr, trace=args.trace and os.path.abspath(args.trace),
        log_level=args.log_level.upper(), log_file=args.log_file and os.path.abspath(args.log_file),
        allow_other=args.allow_other, kernel_cache=not args.no_kernel_cache,
        fuse_threads=args.fuse_loop == "multi", fuse_impl=args.fuse_impl, fuse_readers=args.fuse_readers,
        passthrough=not args.no_passthrough, source_passthrough=args.source_passthrough,
        verify_entries=args.verify_entries, backend_options=options,
        score_transform=args.score_transform, checkpoint_interval_s=args.checkpoint_interval,
        follow_symlinks=args.follow_symlinks, rescan=args.rescan,
        backend_timeout_s=float(args.backend_timeout), backend=args.backend,
        disk_pack_below=_pack_below(args), fd_reserve=args.fd_reserve,
    )
    kwargs.update(_shared_tier_config(args))
    if "ram_cache" in sizes:
        kwargs["ram_cache"] = sizes["ram_cache"]
    if disk_size is not None:
        kwargs["disk_cache"] = disk_size
    if "disk_min_free" in sizes:
        kwargs["disk_min_free"] = sizes["disk_min_free"]
    # clairvoyant caching
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
    if args.control_insecure and not (args.control or "").startswith("tcp://"):
        raise UserError("--control-insecure applies to tcp:// control endpoints only")
    if args.control_insecure and args.curve_secret_key:
        raise UserError("--control-insecure and --curve-secret-key exclude each other")
    if args.control or args.curve_secret_key:
        from .control.server import validate_endpoint

        try:
            validate_endpoint(args.control, args.control_allow_remote,
                              curve_secret_key_file=args.curve_secret_key)
        except ValueError as e:
            raise UserError(f"--control: {e}") from None
    return MountConfig(**kwargs)


def _inside(path: str, mountpoint: str) -> bool:
    """Whether ``path`` lies inside (or is) ``mountpoint``; resolves symlinks of existing parents only."""
    mp = os.path.realpath(mountpoint)
    p = os.path.realpath(path)
    return p == mp or p.startswith(mp.rstrip("/") + "/")


def _existing_ancestor(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def _check_writable_dir(path: str, what: str) -> None:
    """``path`` is a writable directory, or can be created as one; creates nothing (raises UserError)."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise UserError(f"{what} {path!r} is not writable (Not a directory)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UserError(f"{what} {path!r} is not writable (Permission denied)")
        return
    anc = _existing_ancestor(path)
    if not os.path.isdir(anc):
        raise UserError(f"{what} {path!r} is not writable (Not a directory: {anc!r})")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise UserError(f"{what} {path!r} is not writable (Permission denied on {anc!r})")


def _check_writable_file(path: str, option: str) -> None:
    """``path`` can be opened for appending; creates nothing (raises UserError)."""
    if os.path.isdir(path):
        raise UserError(f"{option} {path!r}: Is a directory")
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise UserError(f"{option} {path!r}: Permission denied")
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UserError(f"{option} {path!r}: directory {parent!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path!r}: Permission denied on {parent!r}")


FUSE_DEVICE = "/dev/fuse"
FUSE_MAJOR, FUSE_MINOR = 10, 229  # Documentation/admin-guide/devices.txt: misc 229 = /dev/fuse


def check_fuse_device(path: str = FUSE_DEVICE) -> None:
    """``path`` is the FUSE character device (10, 229) and opens read-write (raises UserError)."""
    import stat as stat_mod

    try:
        st = os.stat(path)
    except OSError as e:
        raise UserError(f"{path} is missing ({e.strerror}); load the fuse module (modprobe fuse), or in a "
                        f"container pass --device /dev/fuse") from None
    if not stat_mod.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != (FUSE_MAJOR,
                                                                                          FUSE_MINOR):
        kind = (f"character device {os.major(st.st_rdev)},{os.minor(st.st_rdev)}" if stat_mod.S_ISCHR(st.st_mode)
                else "block device" if stat_mod.S_ISBLK(st.st_mode) else "directory"
                if stat_mod.S_ISDIR(st.st_mode) else "regular file" if stat_mod.S_ISREG(st.st_mode) else "not a device")
        raise UserError(f"{path} is not the FUSE device (it is a {kind}; FUSE is character device "
                        f"{FUSE_MAJOR},{FUSE_MINOR}); in a container pass --device /dev/fuse")
    try:
        fd = os.open(path, os.O_RDWR)
        os.close(fd)
    except OSError as e:
        raise UserError(f"{path} is not usable ({e.strerror}); in a container pass --device /dev/fuse "
                        f"and CAP_SYS_ADMIN") from None


def _check_cache_dir_free(cfg: MountConfig) -> None:
    """Refuse a cache directory whose namespace for this source another live daemon holds (its flock)."""
    import fcntl

    from .cache.tiers import DiskTier

    lock = os.path.join(DiskTier.dir_for(cfg.disk_cache_dir, cfg.source), DiskTier.LOCK_FILE)
    try:
        f = open(lock, "r")
    except OSError:
        return  # no lock file: nobody holds it (and we create nothing here)
    with f:
        deadline = time.monotonic() + 5.0  # a daemon just unmounted may still be writing its checkpoint
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(f, fcntl.LOCK_UN)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    owner = f.read().strip() or "another process"
                    raise UserError(f"cache directory {cfg.disk_cache_dir!r} is in use for this source by "
                                    f"{owner}; give each mount of the same source its own --disk-cache") from None
                time.sleep(0.05)


def _source_dir(source: str) -> Optional[str]:
    """The local directory of a path or ``file://`` source; None for an object store."""
    if "://" not in source:
        return source
    return source[len("file://"):] if source.startswith("file://") else None


def _check_outside_source(cfg: MountConfig) -> None:
    """Refuse what shadefs writes, and the mountpoint, inside a local source (and the source inside the
    cache directory): the scan at the next mount would serve the cache's own files (``index.bin``,
    ``lock``, entries), the trace or the log as part of the dataset, and a mountpoint inside the source
    shows the mount in its own source. Real paths are compared (raises UserError)."""
    src = _source_dir(cfg.source)
    if src is None:
        return
    if _inside(cfg.mountpoint, src):
        raise UserError("the mountpoint must not be inside the source")
    for path, what in ((cfg.disk_cache_dir, "the cache directory"), (cfg.trace, "the --trace file"),
                       (cfg.log_file, "the --log-file")):
        if path and _inside(path, src):
            raise UserError(f"{what} must not be inside the source")
    if cfg.disk_cache_dir and _inside(src, cfg.disk_cache_dir):
        raise UserError("the source must not be inside the cache directory")


def preflight(cfg: MountConfig) -> None:
    """Check everything a mount needs before forking (raises UserError).

    Nothing is created or changed before every check passed: the only side effect, once they have, is
    clearing a dead shadefs mount at the mountpoint (a stale FUSE entry whose daemon died).
    """
    mp = cfg.mountpoint
    for path, what in ((cfg.disk_cache_dir, "the cache directory"), (cfg.trace, "the --trace file"),
                       (cfg.log_file, "the --log-file")):
        if path and _inside(path, mp):
            raise UserError(f"{what} must not be inside the mountpoint")
    _check_outside_source(cfg)
    if cfg.disk_cache_dir:
        parent = os.path.dirname(cfg.disk_cache_dir.rstrip("/")) or "/"
        if os.path.lexists(parent) and not os.path.isdir(parent):
            raise UserError(f"--disk-cache {cfg.disk_cache_dir!r}: not writable: {parent!r} is not a directory")
        if not os.path.isdir(parent):  # a typo must not become a tree of new folders (and a full disk)
            raise UserError(f"--disk-cache {cfg.disk_cache_dir!r}: its parent directory {parent!r} does not "
                            f"exist; create it first (shadefs creates only the last folder)")
        _check_writable_dir(cfg.disk_cache_dir, "cache directory")
        _check_cache_dir_free(cfg)
    for path, option in ((cfg.trace, "--trace"), (cfg.log_file, "--log-file")):
        if path:
            _check_writable_file(path, option)
            if os.path.islink(path):  # a link planted at the name must not redirect what a root daemon writes
                raise UserError(f"{option} {path!r} is a symlink; give the file it names")
    check_fuse_device()
    if _fusermount() is None:
        raise UserError("fusermount is missing; install it with: apt-get install fuse3")
    stale = _is_stale(mp)
    if stale and not _registry().is_shadefs(_registry().mount_entry(mp)):
        raise UserError(f"mountpoint {mp!r} is a dead mount that shadefs did not make; unmount it first")
    if not stale:
        if not os.path.isdir(mp):
            raise UserError(f"mountpoint {mp!r} is not a directory" if os.path.exists(mp)
                            else f"mountpoint {mp!r} does not exist")
        if os.path.ismount(mp) or is_mounted(mp):
            raise UserError(f"mountpoint {mp!r} is already mounted")
        if os.listdir(mp):
            raise UserError(f"mountpoint {mp!r} is not empty")
    else:
        _unmount(mp, lazy=True)
        print(f"shadefs: cleared a stale mount at {mp} (its daemon had died)", file=sys.stderr)
        _forget_dead(mp)
        if os.path.isdir(mp) and os.listdir(mp):
            raise UserError(f"mountpoint {mp!r} is not empty")


def check_trace_overwrite(cfg: MountConfig, overwrite: bool) -> None:
    """Refuse a ``--trace`` file that exists and holds something, unless ``overwrite`` (raises UserError):
    the daemon truncates it, and a trace is the record of a past run."""
    if cfg.trace and not overwrite:
        try:
            size = os.stat(cfg.trace).st_size
        except OSError:
            return  # absent (or not stat-able: the writability check names it)
        if size:
            raise UserError(f"--trace {cfg.trace!r} exists ({format_bytes(size)}); pass --trace-overwrite to "
                            "replace it, or choose another file")


def check_machine(cfg: MountConfig) -> None:
    """What the machine cannot give the mount, refused before the fork (raises UserError): a RAM tier
    larger than the memory this process may use, a cache directory on a pseudo filesystem."""
    from .sysinfo import memory_limit, pseudo_fs

    if cfg.ram_cache.nbytes:
        limit, what = memory_limit()
        if limit and cfg.ram_cache.nbytes > limit:
            raise UserError(f"--ram-cache {format_bytes(cfg.ram_cache.nbytes)} is more than {what} "
                            f"({format_bytes(limit)})")
    if cfg.disk_cache_dir:
        kind = pseudo_fs(cfg.disk_cache_dir)
        if kind:
            raise UserError(f"cache directory {cfg.disk_cache_dir!r} is on {kind}, a pseudo filesystem that "
                            "cannot hold a cache; choose a directory on a disk (NVMe) filesystem")


def _forget_dead(mountpoint: str) -> None:
    """Remove the registry entry and control socket a dead daemon of ``mountpoint`` left."""
    reg = _registry()
    known = reg.lookup(mountpoint, alive_only=False)
    if known is not None and not known.alive():
        reg.remove(known)


def _registry():
    from . import registry

    return registry


def _default_log_file(mountpoint: str) -> str:
    """``$TMPDIR/shadefs-<euid>/<mountpoint with / as _>.log``. The directory is created 0700, or refused
    (UserError) when another user could have planted it, or a symlink in it: a symlink or a directory
    not ours, group/other bits, or a log file that is a symlink (a root daemon would append to whatever it
    names)."""
    from .fsutil import private_dir

    try:
        d = private_dir(os.path.join(tempfile.gettempdir(), f"shadefs-{os.geteuid()}"), "the log")
    except OSError as e:
        raise UserError(f"log directory: {e.strerror or e} (or pass --log-file FILE)") from None
    slug = mountpoint.strip("/").replace("/", "_") or "root"
    path = os.path.join(d, f"{slug}.log")
    if os.path.islink(path):
        raise UserError(f"log file {path!r} is a symlink; remove it (or pass --log-file FILE)")
    return path


class _LogFileHandler(logging.FileHandler):
    """A FileHandler that never follows a symlink at the log's own name (``O_NOFOLLOW``: ELOOP instead)
    and creates the file 0600 (the log names source paths)."""

    def _open(self):
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)


def _setup_logging(level: str, log_file: Optional[str]) -> None:
    handler = _LogFileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # object-store clients log whole responses at debug level: keep them to warnings
    for name in ("botocore", "aiobotocore", "s3fs", "fsspec", "urllib3", "aiohttp"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(level)))


def _is_refusal(e: BaseException) -> bool:
    """An error of the daemon's build step that is the user's to fix (exit 2, like the CLI's checks)."""
    from .backends.base import BackendError
    from .cache.tiers import CacheDirInUse

    return isinstance(e, (CacheDirInUse, ConfigError, BackendError, ValueError, PermissionError))


def _run_daemon(cfg: MountConfig, ready_fd: Optional[int], stderr_file=None) -> int:
    """Build and serve (in the forked daemon). A failure before the mount is reported on ``ready_fd``
    as ``refused: MESSAGE`` (the user's to fix: exit 2) or ``error: MESSAGE``; when the mount itself
    failed, what the FUSE library or fusermount wrote on stderr (``stderr_file``) is the message."""
    from .daemon import Daemon

    daemon = Daemon(cfg, ready_fd)
    try:
        daemon.build()
    except BaseException as e:
        logging.getLogger("shadefs").exception("daemon failed")
        daemon._notify(f"{'refused' if _is_refusal(e) else 'error'}: {e}")
        return 1
    try:
        daemon.run()
    except BaseException as e:  # report to the waiting parent, then exit
        logging.getLogger("shadefs").exception("daemon failed")
        daemon._notify(f"error: {_mount_error(e, stderr_file)}")
        return 1
    return 0


def _mount_error(e: BaseException, stderr_file) -> str:
    """What to tell the user about a failed mount: the mount helper's own words if it left any."""
    said = ""
    if stderr_file is not None:
        try:
            stderr_file.flush()
            stderr_file.seek(0)
            lines = [ln.strip() for ln in stderr_file.read().decode("utf-8", "replace").splitlines() if ln.strip()]
            said = "; ".join(lines[-3:])
        except (OSError, ValueError):
            pass
    text = str(e)
    if said:
        return said if not text or text.isdigit() else f"{text} ({said})"
    if not text or text.isdigit():  # mfusepy raises RuntimeError(<fuse_main's status>)
        return f"the FUSE library could not mount (status {text or '?'}) and said nothing; check /dev/fuse, " \
               "fusermount and CAP_SYS_ADMIN"
    return text


def _stop_daemon(pid: int, grace_s: float = 3.0) -> None:
    """SIGTERM the daemon's process group, SIGKILL after ``grace_s``, and reap it."""
    import signal

    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return
            if done:
                return
            time.sleep(0.02)


# -- commands -------------------------------------------------------------------------------------------
def _hold_mountpoint(mountpoint: str):
    """This user's lock on ``mountpoint`` (:func:`shadefs.registry.hold_mountpoint`), taken before the
    mountpoint is checked and kept by the daemon for its life: of two mounts racing onto one directory,
    the second is refused here. Returns the lock file (raises UserError)."""
    reg = _registry()
    try:
        return reg.hold_mountpoint(mountpoint, wait_s=5.0, busy=lambda: is_mounted(mountpoint))
    except reg.MountpointBusy as e:
        if is_mounted(mountpoint):
            raise UserError(f"mountpoint {mountpoint!r} is already mounted") from None
        raise UserError(f"{e}: a shadefs mount there is starting, or its daemon has not exited "
                        f"(if it hangs: shadefs umount --force {mountpoint})") from None
    except OSError as e:
        raise UserError(f"cannot lock the mountpoint: {e}") from None


def cmd_mount(args) -> int:
    """Mount (see the module's docstring). Ctrl-C before the mount is reported ends with one line, status
    130 and nothing mounted: a daemon already forked is stopped (its process group), a mount it made is
    unmounted; Ctrl-C before the fork has changed nothing (:func:`main` says so)."""
    cfg = build_config(args)
    check_machine(cfg)
    mp_lock = _hold_mountpoint(cfg.mountpoint)  # held until the daemon exits (inherited by the fork)
    preflight(cfg)
    check_trace_overwrite(cfg, getattr(args, "trace_overwrite", False))
    if cfg.foreground:
        _setup_logging(cfg.log_level, cfg.log_file)
        try:
            return _run_daemon(cfg, None)
        except KeyboardInterrupt:  # during the build (once mounted, SIGINT unmounts: the front end's)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            print(f"shadefs: interrupted; nothing is mounted at {cfg.mountpoint}", file=sys.stderr, flush=True)
            return 130
    log_file = cfg.log_file or _default_log_file(cfg.mountpoint)
    pause_point("cli-checked")
    r, w = os.pipe()
    # SIGINT stays pending across the fork: the child starts with no KeyboardInterrupt of its parent's
    # (nor one inside the at-fork handlers, which would leave a lock held), and the parent takes it only
    # once the daemon's pid is known, inside the try below that stops it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    pid = os.fork()
    if pid == 0:  # the daemon
        code = 1
        try:
            os.close(r)
            _registry().note_holder(mp_lock)
            os.setsid()  # a terminal's Ctrl-C reaches the command, which stops the daemon
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            _setup_logging(cfg.log_level, log_file)
            devnull = os.open(os.devnull, os.O_RDWR)
            err = tempfile.TemporaryFile()  # what libfuse / fusermount say about a failed mount
            for fd in (0, 1):
                os.dup2(devnull, fd)
            os.dup2(err.fileno(), 2)
            code = _run_daemon(cfg, w, err)
        finally:
            os._exit(code)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        os.close(w)
        mp_lock.close()  # the daemon holds it now
        pause_point("cli-forked")
        line = _wait_ready(r, cfg.source)
        if line == "ok" or line.startswith("ok "):
            pause_point("cli-ready")
            _print_mounted(cfg, pid, log_file, line[3:])
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # reported mounted: it stays
            return 0
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(f"shadefs: interrupted; {_abort_start(cfg, pid)}", file=sys.stderr, flush=True)
        return 130
    os.waitpid(pid, 0)
    kind, sep, msg = line.partition(": ")
    if not sep or kind not in ("error", "refused"):
        kind, msg = "error", f"the daemon exited; see {log_file}"
    if kind == "refused":
        raise UserError(msg)
    print(f"shadefs: mount failed: {msg}", file=sys.stderr)
    return 1


def _abort_start(cfg: MountConfig, pid: int) -> str:
    """Undo a mount the user interrupted: stop the daemon ``pid`` (wherever its start is: its process
    group, SIGTERM then SIGKILL), unmount what it mounted, and say what was done (one phrase)."""
    _stop_daemon(pid)  # the daemon runs in its own session: the SIGINT did not reach it
    reg = _registry()
    if is_mounted(cfg.mountpoint) and reg.is_shadefs(reg.mount_entry(cfg.mountpoint)):
        try:
            _unmount(cfg.mountpoint, lazy=True)  # a daemon killed while mounted left its mount behind
        except UserError as e:
            return f"stopped the daemon (pid {pid}), {e}; run: shadefs umount --force {cfg.mountpoint}"
    left = reg.lookup(cfg.mountpoint, alive_only=False)
    if left is not None and left.pid == pid:  # killed after it registered: its entry and control socket
        reg.remove(left)
    return f"stopped the daemon (pid {pid}), nothing is mounted at {cfg.mountpoint}"


SCAN_QUIET_S = 2.0      # a scan done sooner says nothing
SCAN_REPORT_EVERY_S = 5.0


def _wait_ready(fd: int, source: str) -> str:
    """Read the daemon's pipe (``fd``, closed here) until its last line (``ok ...``, ``error: ...``,
    ``refused: ...``; "" if it exited without one), which is returned. Until the daemon says
    ``scanned FILES DIRS``, its ``scan FILES DIRS`` lines say how far the scan is: after SCAN_QUIET_S, and
    then every SCAN_REPORT_EVERY_S, one line on stderr (also while nothing comes: a source that hangs
    shows 0 files)."""
    import select

    t0 = time.monotonic()
    buf, files, dirs = b"", 0, 0
    scanning, reported = True, None  # reported: when the last progress line was printed
    try:
        while True:
            timeout = None
            if scanning:
                due = t0 + SCAN_QUIET_S if reported is None else reported + SCAN_REPORT_EVERY_S
                timeout = due - time.monotonic()
                if timeout <= 0:
                    reported = time.monotonic()
                    print(f"shadefs: scanning {source}: {files} files in {dirs} directories so far "
                          f"({reported - t0:.0f} s; Ctrl-C stops the mount)", file=sys.stderr, flush=True)
                    continue
            if not select.select([fd], [], [], timeout)[0]:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                return buf.decode("utf-8", "replace").strip()
            buf += chunk
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                line = raw.decode("utf-8", "replace").strip()
                kind, _, rest = line.partition(" ")
                if kind not in ("scan", "scanned"):
                    return line
                try:
                    files, dirs = (int(x) for x in rest.split())
                except ValueError:
                    continue
                if kind == "scanned" and scanning:
                    scanning = False
                    if reported is not None:
                        print(f"shadefs: scanned {source}: {files} files in {dirs} directories in "
                              f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    finally:
        os.close(fd)


def _print_mounted(cfg: MountConfig, pid: int, log_file: str, summary_json: str) -> None:
    """The "mounted" line (stdout): tiers, policy, log; the metrics URL; the daemon's warnings (stderr)."""
    try:
        info = json.loads(summary_json) if summary_json.strip() else {}
    except ValueError:
        info = {}
    tiers = [f"RAM tier {format_bytes(info['ram_bytes']) if info.get('ram_bytes') else 'off'}"]
    if "disk_bytes" in info:
        tiers.append(f"disk tier {format_bytes(info['disk_bytes'])} in {info['disk_dir']}" if info["disk_bytes"]
                     else "disk tier off")
    if info.get("shared_bytes"):
        tiers.append(f"shared tier {format_bytes(info['shared_bytes'])}")
    print(f"shadefs: mounted {cfg.source} at {cfg.mountpoint} (pid {pid}, policy {cfg.policy}, "
          f"{', '.join(tiers)}, log {log_file})")
    if info.get("disk_tier"):
        print(f"shadefs: {tier_budget('disk', info['disk_tier'])}")
    if info.get("metrics_url"):
        print(f"shadefs: Prometheus metrics on {info['metrics_url']}")
    for w in info.get("warnings", ()):
        print(f"shadefs: warning: {w}", file=sys.stderr)


def _wait_gone(pid: Optional[int], mountpoint: str, timeout_s: float = 10.0) -> None:
    from .registry import pid_start_time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_mounted(mountpoint) and (pid is None or pid_start_time(pid) is None):
            return
        time.sleep(0.05)


#: how long ``shadefs umount`` waits for the daemon to exit after its mount is gone (it writes its last
#: checkpoint first); a daemon stopped (SIGSTOP) for STOPPED_S seconds is reported at once
EXIT_WAIT_S = 30.0
STOPPED_S = 1.0


def _pid_state(pid: int) -> str:
    """The state letter of ``/proc/PID/stat`` (R, S, D, T (stopped), t, Z (zombie)...); "" if gone."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""


def _daemon_runs(entry) -> bool:
    """The registered daemon still runs: same pid and start time, not a zombie."""
    return entry.alive() and _pid_state(entry.pid) not in ("", "Z")


def _wait_exit(entry, timeout_s: float = EXIT_WAIT_S) -> Optional[str]:
    """Wait for the registered daemon ``entry`` (None: unknown, nothing to wait for) to exit after its
    unmount. Returns None once it has, else why not: ``"is stopped (SIGSTOP)"`` or ``"did not exit within
    N s"``."""
    if entry is None:
        return None
    deadline = time.monotonic() + timeout_s
    stopped_since = None
    while _daemon_runs(entry):
        now = time.monotonic()
        if _pid_state(entry.pid) in ("T", "t"):
            stopped_since = stopped_since or now
            if now - stopped_since >= STOPPED_S:
                return "is stopped (SIGSTOP)"
        else:
            stopped_since = None
        if now >= deadline:
            return f"did not exit within {timeout_s:g} s"
        time.sleep(0.05)
    return None


def _terminate(entry, grace_s: float) -> bool:
    """End the registered daemon ``entry``: SIGTERM and SIGCONT (a stopped daemon then runs its handler:
    it unmounts and writes its last checkpoint), SIGKILL after ``grace_s`` seconds, then up to 5 s for it
    to go. Never signals a pid that is no longer the daemon's (gone, or reused). Returns whether it is gone."""
    import signal

    for sigs, wait_s in (((signal.SIGTERM, signal.SIGCONT), grace_s), ((signal.SIGKILL,), 5.0)):
        if not _daemon_runs(entry):
            return True
        for sig in sigs:
            try:
                os.kill(entry.pid, sig)
            except ProcessLookupError:
                return True
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _daemon_runs(entry):
                return True
            time.sleep(0.02)
    return not _daemon_runs(entry)


def _unmount_if_mounted(mountpoint: str) -> None:
    """Lazily unmount ``mountpoint`` unless it is gone already (a daemon ending unmounts itself)."""
    try:
        if is_mounted(mountpoint):
            _unmount(mountpoint, lazy=True)
    except UserError:
        if is_mounted(mountpoint):
            raise


def cmd_umount(args) -> int:
    """Unmount a shadefs mount; refuse anything else. A daemon that does not exit after its unmount is an
    error (exit 1). ``--force``: a daemon that does not answer its control endpoint within ``--timeout``,
    or does not exit after the unmount, or still runs after its mount is gone, is ended (SIGTERM, SIGKILL
    after ``--timeout`` seconds) and its mount cleared."""
    reg = _registry()
    mp = os.path.abspath(args.mountpoint)
    info = reg.mount_entry(mp)
    known = reg.lookup(mp, alive_only=False)
    entry = known if known is not None and known.alive() else None
    if info is None:
        if entry is not None:  # the daemon runs but its mount is gone (unmounted by hand, or it hung)
            if not args.force:
                raise UserError(f"{mp!r} is not mounted, but its daemon (pid {entry.pid}) still runs; end it "
                                f"with: shadefs umount --force {mp}")
            return _end_daemon(entry, mp, args.timeout, "its mount was already gone")
        raise UserError(f"{mp!r} is not mounted")
    if not reg.is_shadefs(info):
        raise UserError(f"{mp!r} is a {info.fstype} mount ({info.source}), not a shadefs mount; refusing to "
                        "unmount it")
    # A registered live daemon means the mount is not stale: never stat a mount that may hang.
    if entry is None and ((known is not None and not known.alive()) or _is_stale(mp)):
        _unmount(mp, lazy=True)
        print(f"shadefs: cleared a stale mount at {mp} (its daemon had died)", file=sys.stderr)
        if known is not None:
            reg.remove(known)  # its entry and its control socket
        return 0
    if args.force and (entry is None or not _answers(entry, args.timeout)):
        if entry is not None:
            print(f"shadefs: the daemon (pid {entry.pid}) did not answer within {args.timeout:g} s; "
                  "killing it", file=sys.stderr)
            _terminate(entry, args.timeout)
        _unmount_if_mounted(mp)
        _wait_gone(entry.pid if entry else None, mp)
        if entry is not None:
            reg.remove(entry)  # its entry and its control socket
        return 0
    try:
        _unmount(mp)
    except UserError as e:
        busy = _busy_text(mp, str(e))
        if busy is None:
            raise
        if not args.force:
            raise UserError(f"{busy}; close or end them and run again, or run: shadefs umount --force {mp} "
                            f"(detaches the mount at once and ends its daemon: those processes' next access to "
                            f"it fails, ENOTCONN)") from None
        _unmount(mp, lazy=True)
        print(f"shadefs: {busy}; detached it", file=sys.stderr)
        if entry is None:
            return 0
        return _end_daemon(entry, mp, args.timeout, "its mount was busy, and is detached")
    why = _wait_exit(entry)
    if why is None:
        return 0
    if args.force:
        return _end_daemon(entry, mp, args.timeout, f"it {why} after the unmount")
    print(f"shadefs: error: unmounted {mp}, but its daemon (pid {entry.pid}) {why}; a new mount there is "
          f"refused until it exits: end it with: shadefs umount --force {mp}", file=sys.stderr)
    return 1


def _busy_text(mp: str, error: str) -> Optional[str]:
    """``MP is busy: held by pid N (COMMAND: USES), ...`` when the unmount failed because processes use the
    mount (fusermount's "Device or resource busy", umount's "target is busy"), else None."""
    from .procutil import holders

    if "busy" not in error.lower():
        return None
    found = holders(mp)
    if not found:
        return f"{mp} is busy (no process that this user may inspect holds it: {error})"
    named = [f"pid {pid} ({command}: {', '.join(uses)})" for pid, command, uses in found[:10]]
    more = f" and {len(found) - 10} more" if len(found) > 10 else ""
    return f"{mp} is busy: held by {'; '.join(named)}{more}"


def _end_daemon(entry, mp: str, grace_s: float, why: str) -> int:
    """``umount --force`` of a daemon whose mount is gone: end it (:func:`_terminate`), drop its entry."""
    print(f"shadefs: ending the daemon of {mp} (pid {entry.pid}): {why}", file=sys.stderr)
    if not _terminate(entry, grace_s):
        print(f"shadefs: error: the daemon (pid {entry.pid}) survived SIGKILL", file=sys.stderr)
        return 1
    _registry().remove(entry)  # its entry and its control socket
    return 0


def _answers(entry, timeout_s: float) -> bool:
    from .control.client import ControlClient

    c = ControlClient(entry.endpoint, timeout_s=timeout_s, credentials=entry.credentials)
    try:
        c.stats()
        return True
    except Exception:
        return False
    finally:
        c.close()


def tier_budget(name: str, t: dict) -> str:
    """One line saying what a tier's budget holds, from its stats entry ``t`` (docs/metrics.md), e.g.
    ``disk 9.1 MiB: 6.4 MiB metadata, 192.0 KiB segment slack, 2.5 MiB entries (2.4 MiB used), full``.
    ``full``: less than 1 % of the entries' budget is left (a miss is then admitted only by evicting);
    otherwise how much is free."""
    cap = t["capacity_bytes"]
    entries = t.get("entry_bytes", cap)
    parts = []
    if "metadata_bytes" in t:
        parts.append(f"{format_bytes(t['metadata_bytes'])} metadata")
        if t.get("slack_bytes"):
            parts.append(f"{format_bytes(t['slack_bytes'])} segment slack")
    parts.append(f"{format_bytes(entries)} entries ({format_bytes(t['used_bytes'])} used)")
    left = entries - t["used_bytes"] - t.get("dying_bytes", 0)
    parts.append("full" if left < max(1, entries // 100) else f"{format_bytes(left)} free")
    return f"{name} {format_bytes(cap)}: {', '.join(parts)}"


def format_stats(s: dict) -> str:
    """A short human table of the stats JSON."""
    hits = sum(s["hits"].values())
    per_tier = ", ".join(f"{k} {v}" for k, v in s["hits"].items())
    p = s.get("prefetch") or {}
    prefetched = p.get("ready", 0) + p.get("late", 0)
    lines = [
        f"policy          {s['policy']}      uptime {s['uptime_s']:.0f} s",
        f"opens           {s['opens']}  (= hits + prefetched + misses: {hits} + {prefetched} + {s['misses']})",
        f"hits            {hits}  ({per_tier})",
        f"misses          {s['misses']}",
        f"hit ratio       {s['hit_ratio'] * 100:.2f} %   (byte hit ratio {s['byte_hit_ratio'] * 100:.2f} %)",
        f"backend read    {format_bytes(s['backend_bytes'])}",
        f"corrupt entries {s.get('corrupt_entries', 0)}  (dropped and read from the backend)",
        "tier   used / capacity            files   evictions",
    ]
    for name in ("ram", "disk", "shared"):
        if name not in s["tiers"]:
            continue
        t = s["tiers"][name]
        lines.append(f"{name:<6} {format_bytes(t['used_bytes']):>10} / {format_bytes(t['capacity_bytes']):<10} "
                     f"{t['files']:>8} {t['evictions']:>11}")
    for name in ("ram", "disk"):  # what each budget holds
        t = s["tiers"].get(name)
        if t and t.get("capacity_bytes"):
            lines.append(tier_budget(name, t))
    if p:
        lines.append(f"prefetch        {p['ready']} ready, {p['late']} late ({p.get('late_wait_s', 0.0):.3f} s "
                     f"waited), {format_bytes(p['fetched_bytes'])} fetched, {format_bytes(p['wasted_bytes'])} wasted")
        lines.append(f"plans           {p['plans_active']} active, {p.get('plans_announced', 0)} announced, "
                     f"{p.get('plans_withdrawn', 0)} withdrawn, {p['plans_retired']} retired")
    if "scores_received" in s:
        rejected = sum(s.get("scores_rejected", {}).values())
        lines.append(f"score messages  {s['scores_received']} received, {rejected} rejected")
    d = s.get("descriptors")
    if d:
        lines.append(f"descriptors     {d['open']} open of {d['limit']} (reserve {d['reserve']}), {d['held']} held "
                     f"by open files, {d['refused']} opens served without one, {d['failed']} failed")
    return "\n".join(lines)


def _interval_line(prev: dict, cur: dict, seconds: float) -> str:
    """What happened between two stats samples ``seconds`` apart: opens per second, the hit ratio of
    those opens, backend bytes per second (the live view's last line)."""
    opens = cur["opens"] - prev["opens"]
    hits = sum(cur["hits"].values()) - sum(prev["hits"].values())
    ratio = f"{hits / opens * 100:.2f} %" if opens > 0 else "-"
    rate = format_bytes(max(0, cur["backend_bytes"] - prev["backend_bytes"]) / seconds)
    return (f"last {seconds:.1f} s     {opens / seconds:.1f} opens/s, hit ratio {ratio}, backend read "
            f"{rate}/s")


def cmd_stats(args) -> int:
    """Print the stats once, or with ``--watch SECONDS`` every SECONDS until Ctrl-C (or ``--count N``
    samples): a table with the last interval's rates (redrawn in place on a terminal), or with ``--json``
    one JSON object a line."""
    if args.count is not None and args.watch is None:
        raise UserError("--count needs --watch")
    client = _client(args.mountpoint, args.timeout)
    live = args.watch is not None and not args.json and sys.stdout.isatty()
    prev, n = None, 0
    try:
        while True:
            t = time.monotonic()
            try:
                s = client.stats()
            except TimeoutError:
                raise UserError(f"the daemon of {args.mountpoint} did not answer within {args.timeout:g} s "
                                f"(if it hangs: shadefs umount --force)") from None
            n += 1
            if args.json:
                doc = {k: s[k] for k in STATS_KEYS if k in s}
                print(json.dumps(doc) if args.watch is not None else json.dumps(doc, indent=2), flush=True)
            else:
                text = format_stats(s)
                if args.watch is not None:
                    last = _interval_line(prev[1], s, t - prev[0]) if prev else "last -        (first sample)"
                    head = f"{args.mountpoint}  {time.strftime('%H:%M:%S')}  every {args.watch:g} s (Ctrl-C ends)"
                    text = ("\x1b[H\x1b[2J" if live else ("" if n == 1 else "\n")) + f"{head}\n{text}\n{last}"
                print(text, flush=True)
            if args.watch is None or (args.count is not None and n >= args.count):
                return 0
            prev = (t, s)
            time.sleep(max(0.0, t + args.watch - time.monotonic()))
    except KeyboardInterrupt:  # the way a watch ends
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return 0
    finally:
        client.close()


def cmd_endpoint(args) -> int:
    client = _client(args.mountpoint)
    print(client.endpoint)
    client.close()
    return 0


def cmd_version(args) -> int:
    from . import __version__

    print(f"shadefs {__version__}")
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
    from .fuse import DEFAULT_IMPL

    return DEFAULT_IMPL


def make_parser() -> argparse.ArgumentParser:
    from . import __version__

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
    m.add_argument("--fuse-readers", type=int, default=2, metavar="N",
                   help="kernel front end: threads reading /dev/fuse (default 2)")
    m.add_argument("--no-passthrough", action="store_true",
                   help="kernel front end: no FUSE passthrough at all (NVMe hits and files served from the source "
                   "go through the daemon)")
    m.add_argument("--source-passthrough", choices=("untiered", "large", "off"), default="off",
                   help="kernel front end, directory source: answer an open served from the source by FUSE "
                   "passthrough to the source file (the kernel reads it: re-reads at the source's page-cache "
                   "speed). untiered: files no tier would take any part of; large: also every file "
                   "above 8 MiB (cached by chunks) whatever the tiers hold; off (default): through the daemon")
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

    from .sim import add_simulate_arguments
    from .warm import add_warm_arguments

    sm = sub.add_parser("simulate", help="replay an access trace against the policies and Belady's OPT")
    add_simulate_arguments(sm)
    sm.set_defaults(func=cmd_simulate)

    w = sub.add_parser("warm", help="prefetch files into the cache of a running mount")
    add_warm_arguments(w)
    w.set_defaults(func=cmd_warm)

    v = sub.add_parser("version", help="print the version")
    v.set_defaults(func=cmd_version)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = make_parser().parse_args(_attach_negative_sizes(sys.argv[1:] if argv is None else list(argv)))
    try:
        return args.func(args)
    except UserError as e:
        print(f"shadefs: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # one the command did not handle itself: it had changed nothing yet
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("shadefs: interrupted" + ("; nothing is mounted" if args.func is cmd_mount else ""), file=sys.stderr,
              flush=True)
        return 130
    except BrokenPipeError:  # `shadefs stats MNT | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
