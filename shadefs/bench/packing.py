"""What does a sample cost on the NVMe tier's device: bytes and inodes per sample, packed or in a file?

Regime: **counts** (the device's bytes and inodes after one pass; the page cache does not change them).
Limit: the samples' own bytes (a packed sample adds its 64-byte record header; an entry file rounds up to
the file system's blocks and takes an inode).

Per ``--samples N:SIZE`` (N files of SIZE bytes +-30 %, random content, under one source tree), for the
working tree (and ``--baseline REV`` side by side): a private tmpfs of ``--tmpfs-mib`` holds only the
NVMe tier's directory; one mount with ``--ram-cache 0 --disk-cache-size 100% --no-kernel-cache`` reads
every sample once, whole, and unmounts (the namespace snapshot, path digests and manifest written); then
``statvfs`` of the tmpfs gives the device bytes and inodes the tier left there. Samples under
``--disk-pack-below`` (default 4 KiB) are packed into segment files; larger ones are one entry file each.
Needs root (``mount -t tmpfs``).

    python -m shadefs.bench packing
    python -m shadefs.bench packing --samples 5000:300 2000:20000 500:110000 --baseline main
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from typing import List, Tuple

from shadefs.testing.datasets import random_tree, read_size

#: the runner's common options this benchmark honours
COMMON = ("baseline", "json")


def _spec(text: str) -> Tuple[int, int]:
    n, _, size = text.partition(":")
    return int(n), int(size)


def add_arguments(p) -> None:
    p.add_argument("--samples", nargs="+", type=_spec, default=[(5000, 300), (2000, 20_000), (500, 110_000)],
                   metavar="N:SIZE", help="N samples of SIZE bytes +-30 %% each (default 5000:300 2000:20000 "
                   "500:110000)")
    p.add_argument("--tmpfs-mib", type=int, default=512, help="the tmpfs holding the NVMe tier (MiB)")
    p.add_argument("--workdir", help="where the source trees are made (default: a new temporary directory)")


def device_use(path: str) -> Tuple[int, int]:
    """(bytes, inodes) in use on the file system of ``path`` (``statvfs``)."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_files - st.f_ffree


def one_pass(side, src: str, files: List[Tuple[str, int]], work: str, tmpfs_mib: int) -> Tuple[int, int]:
    """A fresh tmpfs, one pass over ``files`` through ``side``'s mount with the NVMe tier on it, unmounted;
    returns the tmpfs's (bytes, inodes) in use, less those of the empty tmpfs."""
    dev = tempfile.mkdtemp(prefix="dev-", dir=work)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={tmpfs_mib}m", "tmpfs", dev], check=True)
    try:
        empty = device_use(dev)
        mnt = tempfile.mkdtemp(prefix="mnt-", dir=work)
        m = side.mount(src, mnt, ["--ram-cache", "0", "--disk-cache", os.path.join(dev, "cache"),
                                  "--disk-cache-size", "100%", "--no-kernel-cache"],
                       log_file=os.path.join(work, f"{side.name}-{len(files)}.log"))
        try:
            for rel, size in files:
                got = read_size(os.path.join(mnt, rel))
                if got != size:
                    raise SystemExit(f"{rel}: read {got} bytes through the mount, the source has {size}")
            st = m.stats()
            if st["opens"] != len(files):
                raise SystemExit(f"{side.name}: {st['opens']} opens counted for {len(files)} reads")
        finally:
            m.umount()
        used = device_use(dev)
        return used[0] - empty[0], used[1] - empty[1]
    finally:
        subprocess.run(["umount", dev], check=False)
        os.rmdir(dev)


def run(args, bench):
    work = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="shadefs-bench-packing-"))
    os.makedirs(work, exist_ok=True)
    if not args.workdir:
        bench.on_close(lambda: shutil.rmtree(work, ignore_errors=True))
    sides = bench.sides()
    results, rows = [], []
    total = 0
    for n, size in args.samples:
        src = os.path.join(work, f"src-{n}-{size}")
        files = random_tree(src, n, size, seed=3)
        source = sum(s for _, s in files)
        total += source
        for side in sides:
            dev_bytes, inodes = one_pass(side, src, files, work, args.tmpfs_mib)
            results.append({"samples": n, "size": size, "side": side.name, "source_bytes": source,
                            "device_bytes": dev_bytes, "inodes": inodes})
            rows.append([f"{n:,} x ~{size:,} B", side.name, f"{source:,}",
                         f"{dev_bytes:,} ({dev_bytes / n:,.0f} B)", f"{inodes:,}"])
    print(f"regime: counts (the device's bytes and inodes after one pass, --no-kernel-cache), dataset "
          f"{total / 2**20:.0f} MiB in all")
    bench.table("device bytes and inodes the NVMe tier left after one pass (statvfs of its tmpfs)",
                ["samples", "code", "source bytes", "device bytes (per sample)", "inodes"], rows)
    bench.save_json(results)
    return 0
