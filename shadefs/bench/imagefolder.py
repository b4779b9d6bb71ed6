"""Metadata benchmark: mount time (the one-time scan) and ``ImageFolder(...)`` construction over a shadefs
mount vs on SOURCE directly.

Regime: metadata only (the kernel's dentry and inode caches warm unless ``--drop-caches``). Limit:
``ImageFolder`` on the source directly.

ImageFolder construction is pure metadata (a readdir and a stat per file); over the mount it is answered
from the in-memory snapshot, and with entry/attr timeouts of an hour the second construction does not
reach the daemon at all. ``--drop-caches`` (root) drops the kernel's dentry/inode caches before each cold
measurement, so the SOURCE numbers include its real metadata cost.

    python -m shadefs.bench imagefolder --data data/fmnist/train [--repeat 3] [--write-doc]
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time

from shadefs.bench.runner import ROOT
from shadefs.testing import Mount, docsection

SCRIPTS = os.path.join(ROOT, "scripts")  # the examples a user runs (train_fashion_mnist.py)
START, END = docsection.markers("bench_imagefolder")


def drop_caches(enabled: bool) -> None:
    if enabled:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2\n")


def build(root: str) -> float:
    from torchvision.datasets import ImageFolder

    t0 = time.perf_counter()
    ds = ImageFolder(root)
    dt = time.perf_counter() - t0
    assert len(ds) > 0
    return dt


#: the runner's common options this benchmark honours
COMMON = ('write_doc',)


def add_arguments(p) -> None:
    p.add_argument("--data", default="data/fmnist/train", help="an ImageFolder root (class folders)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--drop-caches", action="store_true", help="drop dentry/inode caches before cold runs (root)")


def run(args, bench):
    src = os.path.abspath(args.data)
    n_files = sum(len(fs) for _, _, fs in os.walk(src))
    rows = []
    cold_src, warm_src, mount_s, cold_mnt, warm_mnt = [], [], [], [], []
    for _ in range(args.repeat):
        drop_caches(args.drop_caches)
        cold_src.append(build(src))
        warm_src.append(build(src))
        with tempfile.TemporaryDirectory() as tmp:
            mnt = os.path.join(tmp, "mnt")
            os.mkdir(mnt)
            drop_caches(args.drop_caches)
            m = Mount(src, mnt, log_file=os.path.join(tmp, "log"))
            t0 = time.perf_counter()
            m.start()
            mount_s.append(time.perf_counter() - t0)
            try:
                cold_mnt.append(build(mnt))
                warm_mnt.append(build(mnt))
            finally:
                err = m.umount()  # and wait for the daemon to exit before the next round
                if err:
                    raise SystemExit(f"bench_imagefolder: {err}")
    med = statistics.median
    rows = [("SOURCE directly, first", med(cold_src)), ("SOURCE directly, again", med(warm_src)),
            ("shadefs mount (scan + fork + mount)", med(mount_s)),
            ("over the mount, first after mounting", med(cold_mnt)), ("over the mount, again", med(warm_mnt))]
    header = (f"ImageFolder over {n_files} files ({src}); median of {args.repeat}; "
              f"caches dropped: {'yes' if args.drop_caches else 'no'}; load average {os.getloadavg()[0]:.1f}")
    print(header)
    for name, s in rows:
        print(f"  {name:<40} {s:8.3f} s")
    if args.write_doc:
        md = [START, "## Metadata: mount and ImageFolder construction", "",
              f"`python -m shadefs.bench imagefolder --data {args.data} --repeat {args.repeat}"
              f"{' --drop-caches' if args.drop_caches else ''} --write-doc` — {header}.", "",
              "| what | seconds |", "|---|---:|"]
        md += [f"| {name} | {s:.3f} |" for name, s in rows]
        md += ["", "The mount scans the source once (parallel scandir); afterwards lookups and readdir are "
               "answered from the snapshot and cached by the kernel for an hour, so a second ImageFolder "
               "construction costs about what it costs on a local directory.", END]
        bench.write_results("\n".join(md), "bench_imagefolder")
    return 0
