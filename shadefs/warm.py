"""``shadefs warm MOUNTPOINT [PATH ...] [--list FILE]``: prefetch files into a running mount's cache.

The daemon reads each file from the backend and offers it to the tiers through the mount's policy, exactly
as a miss would, but without counting an open (the hit ratio stays about training). Paths are files or
directories inside the mount (relative to it, or absolute); directories are walked. A progress bar shows
files, bytes and rate; a summary says what was admitted where.
"""
from __future__ import annotations

import os
import sys
from typing import Iterator, List

from .config import format_bytes

CHUNK = 64  # files per request: progress granularity vs round trips


def add_warm_arguments(p):
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("paths", nargs="*", metavar="PATH", help="files or directories inside the mount (default: all)")
    p.add_argument("--list", metavar="FILE", help="a file with one path per line (relative to the mount)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _expand(mountpoint: str, items: List[str]) -> Iterator[str]:
    for item in items:
        full = item if os.path.isabs(item) else os.path.join(mountpoint, item)
        full = os.path.normpath(full)
        rel = os.path.relpath(full, mountpoint)
        if rel.startswith(".."):
            raise ValueError(f"{item!r} is not inside {mountpoint}")
        if os.path.isdir(full):
            for d, dirs, files in os.walk(full):
                dirs.sort()
                for f in sorted(files):
                    yield os.path.relpath(os.path.join(d, f), mountpoint)
        elif os.path.isfile(full):
            yield rel
        else:
            raise ValueError(f"{item!r}: no such file or directory in the mount")


#: the warm bar: bytes done, total and rate in binary units (KiB, MiB) like every other figure shadefs
#: prints; tqdm's own unit_scale writes the counts with a bare "k" and the rate in decimal kB/s
BAR_FORMAT = ("{desc}: {percentage:3.0f}%|{bar}| {n_iec}/{total_iec} [{elapsed}<{remaining}, "
              "{rate_iec}{postfix}]")


def _iec_bar(tqdm):
    """A subclass of ``tqdm`` whose format dict also has ``n_iec``, ``total_iec`` and ``rate_iec`` (bytes,
    bytes and bytes per second through :func:`~shadefs.config.format_bytes`), for :data:`BAR_FORMAT`."""

    class IECBar(tqdm):
        @property
        def format_dict(self):
            d = super().format_dict
            rate = d.get("rate")
            if rate is None and d.get("elapsed"):
                rate = d["n"] / d["elapsed"]
            d["n_iec"] = format_bytes(d["n"])
            d["total_iec"] = format_bytes(d["total"]) if d.get("total") is not None else "?"
            d["rate_iec"] = f"{format_bytes(rate)}/s" if rate else "? B/s"
            return d

    return IECBar


def main_warm(args) -> int:
    from tqdm import tqdm

    from .cmdutil import UserError, check_daemon_alive, mount_client

    mp = os.path.abspath(args.mountpoint)
    check_daemon_alive(mp)  # before walking a dead mount (ENOTCONN everywhere)
    items = list(args.paths)
    if args.list:
        try:
            with open(args.list, encoding="utf-8") as f:
                items += [line.strip() for line in f if line.strip()]
        except OSError as e:
            raise UserError(f"--list {args.list!r}: {e.strerror}") from None
    if not items:
        items = ["."]
    try:
        paths = list(_expand(mp, items))
    except ValueError as e:
        raise UserError(str(e)) from None
    sizes = {p: os.stat(os.path.join(mp, p)).st_size for p in paths}
    client = mount_client(mp)
    total = {"resident": 0, "ram": 0, "disk": 0, "rejected": 0, "failed": 0, "bytes": 0}
    bar = _iec_bar(tqdm)(total=sum(sizes.values()), desc="warm", bar_format=BAR_FORMAT, disable=args.quiet,
                         file=sys.stderr)
    try:
        for i in range(0, len(paths), CHUNK):
            chunk = paths[i:i + CHUNK]
            result = client.warm(chunk, timeout_s=600)
            for k in total:
                total[k] += int(result.get(k, 0))
            # one redraw per chunk, postfix and count together; the last is drawn once, by close()
            bar.set_postfix(files=f"{i + len(chunk)}/{len(paths)}", admitted=total["ram"] + total["disk"],
                            refresh=False)
            if i + CHUNK < len(paths):
                bar.update(sum(sizes[p] for p in chunk))
            else:
                bar.n += sum(sizes[p] for p in chunk)
    finally:
        bar.close()
        client.close()
    print(f"warm: {len(paths)} files: {total['ram']} admitted to RAM, {total['disk']} to disk, "
          f"{total['resident']} already cached, {total['rejected']} refused by the policy, "
          f"{total['failed']} failed; {format_bytes(total['bytes'])} read from the backend")
    return 1 if total["failed"] else 0
