#!/usr/bin/env python3
"""What a miss pays to open a posix source file: ``PosixBackend.read(path, size)`` per file, in process,
with the namespace attached (the daemon's setup: the path resolved beneath the root with no symlink
followed, then ``fstat`` checked against the snapshot's inode, size and mtime), through ``openat2`` and
through its per-component ``O_NOFOLLOW`` fallback, side by side with a baseline revision's plain
``open`` (``--baseline REV``), interleaved round by round. Prints one table: microseconds per read
(median of ``--rounds``; wall clock and this process's CPU), page cache warm.

    python scripts/bench_source_open.py --files 2000 --baseline c9061c1
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import os, sys, time, json
mode, src, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
from shadefs.backends.posix import PosixBackend
from shadefs.namespace import Namespace
b = PosixBackend(src)
ns = Namespace.scan(b)
if hasattr(b, "attach"):
    b.attach(ns, False)
if mode == "walk":
    from shadefs.backends import beneath
    beneath._have = False
paths = list(ns.paths)
sizes = [int(ns.size(i)) for i in range(ns.num_files)]
for p, s in zip(paths, sizes):   # warm: page cache, dentries, code paths
    b.read(p, s)
out = []
for _ in range(rounds):
    w0, c0 = time.perf_counter(), time.process_time()
    for p, s in zip(paths, sizes):
        b.read(p, s)
    w1, c1 = time.perf_counter(), time.process_time()
    out.append(((w1 - w0) / len(paths) * 1e6, (c1 - c0) / len(paths) * 1e6))
print(json.dumps(out))
"""


def make_tree(src: str, files: int, size: int, depth: int) -> None:
    data = os.urandom(size)
    for i in range(files):
        d = os.path.join(src, *[f"d{(i // 50) % 7}{k}" for k in range(depth)])
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:06d}.bin"), "wb") as f:
            f.write(data)


def run(side_path: str, mode: str, src: str, rounds: int) -> list:
    import json

    env = dict(os.environ, PYTHONPATH=side_path)
    r = subprocess.run([sys.executable, "-c", CHILD, mode, src, str(rounds)], env=env, check=True,
                       capture_output=True, text=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--sizes", type=int, nargs="+", default=[300, 110_000], help="file sizes, bytes")
    ap.add_argument("--depth", type=int, default=3, help="directories between the root and each file")
    ap.add_argument("--rounds", type=int, default=5, help="timed passes per side (the median is reported)")
    ap.add_argument("--baseline", metavar="REV", help="also the plain open of the shadefs of git revision REV")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="shadefs-bench-open-")
    sides = [("this tree, openat2", ROOT, "openat2"), ("this tree, O_NOFOLLOW walk", ROOT, "walk")]
    base_dir = None
    try:
        if a.baseline:
            from shadefs.testing.baseline import extract

            base_dir, short = extract(ROOT, a.baseline)
            sides.insert(0, (f"baseline {short} (plain open)", base_dir, "plain"))
        with open("/proc/loadavg") as f:
            print(f"load: {f.read().strip()}")
        print(f"{'files':>6} {'size B':>8}  {'side':<32} {'wall us/read':>12} {'CPU us/read':>12}")
        for size in a.sizes:
            src = os.path.join(work, f"src{size}")
            make_tree(src, a.files, size, a.depth)
            res = {name: [] for name, _, _ in sides}
            for _ in range(a.rounds):    # interleaved: one pass of each side per round
                for name, path, mode in sides:
                    res[name].extend(run(path, mode, src, 1))
            for name, _, _ in sides:
                wall = statistics.median(w for w, _ in res[name])
                cpu = statistics.median(c for _, c in res[name])
                print(f"{a.files:>6} {size:>8}  {name:<32} {wall:>12.2f} {cpu:>12.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if base_dir:
            shutil.rmtree(base_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
