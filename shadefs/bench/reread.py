"""Re-reads of files no tier admits: random 10 kB records, through the mount vs direct from a warm page cache.

Regime: **page cache**, on purpose: the question is whether the kernel keeps the file's pages between
opens so that the source is read once, not once per epoch. Limit: ``direct`` (the source file, warm).

What HDF5 and LMDB readers do (random records by ``pread`` on a file each epoch opens again) and what
``np.load(mmap_mode='r')`` does (page faults on a mapping made again each epoch), on one file each of
``--size`` bytes that is larger than the mount's only tier (``--ram-cache``, 16 MiB by default; no disk
tier), so no tier admits it and every byte the daemon serves comes from the source:

- ``pread``: ``records.bin`` (random bytes); an epoch opens it, ``os.pread`` s ``--records`` records of
  ``--record`` bytes (a fixed random subset of the file's records, in a new random order each epoch), and
  closes it;
- ``npy mmap``: ``rows.npy`` (float32 rows of ``--record`` bytes); an epoch ``np.load`` s it with
  ``mmap_mode='r'`` and sums the same subset of rows, in batches of 1000 (fancy indexing: page faults).

Cases: ``direct`` (the source file, its page cache warm), ``shadefs`` (this tree) and, with ``--baseline
REV``, ``shadefs REV`` (the package of that revision, its daemon started with it on PYTHONPATH), mounted
side by side over the same files; with ``--nvme``, also ``shadefs NVMe hit`` for reference: the same files
admitted by an NVMe tier (``--disk-cache`` of ``2 x --size`` under the work directory, ``--verify-entries
first-hit``), so that, where passthrough is on, the kernel reads the entry files' own page cache. Epoch 0 of every case warms (the source's page cache; a mount's first
reads go to the source); then ``--epochs`` timed epochs, the cases interleaved round by round. Reported:
records per second of the fastest timed epoch (the least disturbed on a shared machine) and the median,
the ratio of the fastest to ``direct``'s, and what the daemon read from the source per timed epoch
(``backend_bytes`` of ``shadefs stats``) with the opens it counted. With ``--direct-by-reads``, also
``direct, pages by reads``: a copy of the files whose pages are dropped before epoch 0, so that, like a
mount's, its page cache holds what the epochs read (``direct``'s holds each whole file, cached as it was
written).

    python -m shadefs.bench reread [--size 256MiB] [--records 20000] [--epochs 5] [--ram-cache 16MiB]
                                   [--baseline REV] [--markdown]
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from typing import Callable, Dict, List

import numpy as np

from shadefs.bench.runner import ROOT, add_variant_option
from shadefs.config import parse_size
from shadefs.testing import Mount
from shadefs.testing.datasets import make_npy, npy_epoch



def make_source(src: str, size: int, record: int) -> None:
    os.makedirs(src, exist_ok=True)
    with open(os.path.join(src, "records.bin"), "wb") as f:
        left = size
        while left:
            n = min(left, 16 << 20)
            f.write(os.urandom(n))
            left -= n
    make_npy(os.path.join(src, "rows.npy"), size, record)


def pread_epoch(path: str, offsets: np.ndarray, record: int) -> int:
    """One epoch of random records by pread; returns the bytes read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        got = 0
        pread = os.pread
        for off in offsets.tolist():
            got += len(pread(fd, record, off))
    finally:
        os.close(fd)
    return got


def folio_census(path: str, pages: int = 4096) -> Dict[str, int]:
    """How the page cache holds the first ``pages`` pages of ``path`` (read first): ``large`` (pages in
    folios larger than one page: compound head or tail) and ``small`` (order-0 pages), from the page frames
    of a mapping (``/proc/self/pagemap``) and their flags (``/proc/kpageflags``; root only)."""
    import mmap
    import struct

    with open(path, "rb", buffering=0) as f:
        f.read(pages * 4096)
        mm = mmap.mmap(f.fileno(), pages * 4096, prot=mmap.PROT_READ)
    try:
        for i in range(pages):
            mm[i * 4096]  # fault every page in
        addr = next(int(line.split("-", 1)[0], 16) for line in open("/proc/self/maps")
                    if line.rstrip().endswith(" " + os.path.realpath(path)))
        out = {"large": 0, "small": 0}
        with open("/proc/self/pagemap", "rb") as pm, open("/proc/kpageflags", "rb") as kf:
            for i in range(pages):
                pm.seek((addr // 4096 + i) * 8)
                entry = struct.unpack("<Q", pm.read(8))[0]
                kf.seek((entry & ((1 << 55) - 1)) * 8)
                flags = struct.unpack("<Q", kf.read(8))[0]
                out["large" if flags & (3 << 15) else "small"] += 1  # KPF_COMPOUND_HEAD, KPF_COMPOUND_TAIL
        return out
    finally:
        mm.close()


#: the runner's common options this benchmark honours
COMMON = ('baseline',)


def add_arguments(ap) -> None:
    ap.add_argument("--size", default="256MiB", help="bytes of each file (default 256MiB)")
    ap.add_argument("--record", default="10000", help="bytes per record (default 10000)")
    ap.add_argument("--records", type=int, default=20000, help="records read per epoch (default 20000)")
    ap.add_argument("--epochs", type=int, default=5, help="timed epochs per case (default 5)")
    ap.add_argument("--ram-cache", default="16MiB", help="the mounts' RAM tier (default 16MiB)")
    ap.add_argument("--work", default=None, help="directory for the files and mounts (default: a temp dir)")
    ap.add_argument("--nvme", action="store_true", help="also an NVMe-tier mount holding both files (reference)")
    ap.add_argument("--folios", action="store_true",
                    help="also count how the page cache holds records.bin's first 16 MiB, direct and through "
                         "each mount (root: /proc/kpageflags)")
    ap.add_argument("--direct-by-reads", action="store_true",
                    help="also a direct case whose page cache the epochs build, as a mount's is: a copy of the "
                         "files with their pages dropped (posix_fadvise DONTNEED) before epoch 0")
    add_variant_option(ap, "daemon=--source-passthrough off")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")


def run(args, bench):
    size, record = parse_size(args.size).nbytes, parse_size(args.record).nbytes
    work = tempfile.mkdtemp(prefix="bench-reread-", dir=args.work)
    mounts: List[Mount] = []
    try:
        src = os.path.join(work, "src")
        make_source(src, size, record)
        cases: Dict[str, str] = {"direct": src}
        if args.direct_by_reads:
            cold = os.path.join(work, "src-by-reads")
            shutil.copytree(src, cold)
            for name in os.listdir(cold):
                fd = os.open(os.path.join(cold, name), os.O_RDONLY)
                try:
                    os.fsync(fd)  # written back first: DONTNEED drops clean pages only
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            cases["direct, pages by reads"] = cold
        variants = bench.mount_variants()
        envs = {k: env for k, (env, _) in variants.items()}
        extra = {k: more for k, (_, more) in variants.items()}
        if args.nvme:
            envs["shadefs NVMe hit"] = None
            extra["shadefs NVMe hit"] = ["--disk-cache", os.path.join(work, "nvme"), "--disk-cache-size",
                                         str(2 * size), "--verify-entries", "first-hit"]
        os.chdir(work)  # ``python -m shadefs`` puts the cwd first on sys.path: not this tree's package
        for name, env in envs.items():
            mnt = os.path.join(work, f"mnt{len(mounts)}")
            m = Mount(src, mnt, ["--ram-cache", args.ram_cache] + extra[name], log_file=f"{mnt}.log",
                      env=env).start()
            mounts.append(m)
            cases[name] = mnt
        rng = np.random.default_rng(7)
        nrec = size // record
        subset = rng.choice(nrec, size=min(args.records, nrec), replace=False)
        orders = [rng.permutation(subset) for _ in range(args.epochs + 1)]
        want = {off: None for off in (subset[:50] * record).tolist()}
        with open(os.path.join(src, "records.bin"), "rb") as f:
            for off in want:
                f.seek(off)
                want[off] = f.read(record)
        work_fns: Dict[str, Callable[[str, np.ndarray], object]] = {
            "pread": lambda root, order: pread_epoch(os.path.join(root, "records.bin"), order * record, record),
            "npy mmap": lambda root, order: npy_epoch(os.path.join(root, "rows.npy"), order),
        }
        load0 = open("/proc/loadavg").read().split()[:3]
        results = {}
        for wname, fn in work_fns.items():
            times = {c: [] for c in cases}
            answers = {c: set() for c in cases}
            for c, root in cases.items():  # epoch 0: warm, and check bytes
                answers[c].add(repr(fn(root, orders[0])))
                if wname == "pread":
                    with open(os.path.join(root, "records.bin"), "rb", buffering=0) as f:
                        for off, data in want.items():
                            f.seek(off)
                            assert f.read(record) == data, (c, off)
            before = {m.path: m.stats() for m in mounts}
            for e in range(1, args.epochs + 1):
                names = list(cases)
                names = names[e % len(names):] + names[:e % len(names)]
                for c in names:
                    t = time.perf_counter()
                    answers[c].add(repr(fn(cases[c], orders[e])))
                    times[c].append(time.perf_counter() - t)
            after = {m.path: m.stats() for m in mounts}
            sums = [float(x) for x in set().union(*answers.values())]
            assert max(sums) - min(sums) <= 1e-9 * abs(max(sums)), (wname, sums)  # every case read the same
            direct = min(times["direct"])
            for c in cases:
                best, med = min(times[c]), statistics.median(times[c])
                row = {"records_s": len(subset) / best, "median_s": len(subset) / med, "vs_direct": direct / best,
                       "backend": None, "opens": None}
                if cases[c] in before:
                    b, a = before[cases[c]], after[cases[c]]
                    row["backend"] = (a["backend_bytes"] - b["backend_bytes"]) / args.epochs
                    row["opens"] = (a["opens"] - b["opens"]) / args.epochs
                results[(wname, c)] = row
        load1 = open("/proc/loadavg").read().split()[:3]
        head = ["workload", "case", "records/s (fastest epoch)", "(median)", "vs direct", "source MiB per epoch",
                "opens per epoch"]
        lines = []
        if args.markdown:
            lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        else:
            lines.append(f"{head[0]:10s}{head[1]:18s}" + "".join(f"{h:>26s}" for h in head[2:]))
        for (w, c), r in results.items():
            cells = [f"{r['records_s']:,.0f}", f"{r['median_s']:,.0f}", f"{r['vs_direct']:.2f}x",
                     "-" if r["backend"] is None else f"{r['backend'] / 2**20:.1f}",
                     "-" if r["opens"] is None else f"{r['opens']:g}"]
            if args.markdown:
                lines.append("| " + " | ".join([w, c] + cells) + " |")
            else:
                lines.append(f"{w:10s}{c:18s}" + "".join(f"{x:>26s}" for x in cells))
        print(f"files {size / 2**20:.0f} MiB each, {len(subset)} records of {record} B per epoch, "
              f"{args.epochs} timed epochs, --ram-cache {args.ram_cache}; load {' '.join(load0)} -> "
              f"{' '.join(load1)}")
        print("\n".join(lines))
        if args.folios:
            for c, root in cases.items():
                got = folio_census(os.path.join(root, "records.bin"))
                print(f"page cache of records.bin's first 16 MiB, {c}: {got['large']} pages in large folios, "
                      f"{got['small']} order-0 pages")
    finally:
        for m in mounts:
            m.umount()
        os.chdir(ROOT)
        shutil.rmtree(work, ignore_errors=True)
