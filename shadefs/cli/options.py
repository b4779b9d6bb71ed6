"""``shadefs mount``'s options turned into a :class:`shadefs.config.MountConfig` (:func:`build_config`):
sizes, the backend's options, the shared tier and its secret, the authorized keys. Each bad value is a
UserError naming its option."""
from __future__ import annotations

import os
from typing import List, Optional

from ..cmdutil import UserError
from ..config import ConfigError, MountConfig, parse_size


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
        from ..cache.shared import SharedTierConfigError, parse_urls

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
    from ..cache.shared import SharedTierConfigError, read_secret

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
    from ..control.server import load_authorized_keys

    path = os.path.abspath(path)
    try:
        load_authorized_keys(path)
    except ValueError as e:
        raise UserError(f"--control-authorized-keys: {e}") from None
    return path


def build_config(args) -> MountConfig:
    """Validate the mount arguments into a :class:`MountConfig` (raises UserError)."""
    from ..policies.base import PolicyError, get_policy

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
        from ..backends.base import BackendError, backend_for
        try:
            backend_for(source, args.backend)
        except BackendError as e:
            raise UserError(str(e)) from None
    options = _backend_options(args.backend_opt)
    if args.backend != "auto" and ("://" not in source or source.startswith("file://")):
        raise UserError(f"--backend {args.backend}: chooses the client of an object-store URL (s3://, gs://, "
                        "az://), not of a local path")
    if "://" not in source or source.startswith("file://"):
        from ..backends.base import BackendError
        from ..backends.posix import PosixBackend

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
        from ..control.server import validate_endpoint

        try:
            validate_endpoint(args.control, args.control_allow_remote,
                              curve_secret_key_file=args.curve_secret_key)
        except ValueError as e:
            raise UserError(f"--control: {e}") from None
    return MountConfig(**kwargs)
