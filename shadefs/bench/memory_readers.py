"""Daemon memory under concurrent large reads: peak resident set size against the documented bound.

10 reader processes each read their own file of ``--file-mib`` MiB (cached by 8 MiB chunks) whole,
sequentially (1 MiB reads), through a real mount with ``--ram-cache 24MiB``, ``--passes`` times; each
reader drops the file's pages after each pass on the same open (the ``dontneed`` regime: no pass is served
by the kernel's page cache, every READ reaches the daemon). Two cases: the RAM tier alone (``ram``), and
with an NVMe tier of ``--disk-mib`` MiB (``ram+disk``); no plan is announced (``--prefetch-window 0``).
The daemon's VmRSS is sampled from /proc/PID/status every 20 ms; VmHWM is read at the end.

The bound the table compares with: ``--ram-cache`` + the daemon's documented working set outside the RAM
tier (docs/operations.md, "The daemon's memory": fill buffers + loose buffers + queues), above the RSS
of the idle daemon just after the mount (the interpreter, numpy, zmq: not part of the bound).

``--baseline REV`` runs the same cases against the ``shadefs`` package of git revision REV (or
``--baseline-tree DIR``: a checkout whose ``shadefs`` package is put first on PYTHONPATH), side by side,
the sides interleaved per round.

    python -m shadefs.bench memory_readers [--baseline main] [--rounds 1] [--write-doc]
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from shadefs.bench.runner import ROOT
from shadefs.testing import Mount, docsection, proc_vm
from shadefs.testing.datasets import random_file
from shadefs.testing.regime import describe

MiB = 1 << 20

READER = r"""
import os, sys
path, passes = sys.argv[1], int(sys.argv[2])
for _ in range(passes):
    fd = os.open(path, os.O_RDONLY)
    n = 0
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            break
        n += len(b)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
print(n)
"""


def make_source(root: str, n: int, size: int) -> str:
    os.makedirs(root, exist_ok=True)
    for i in range(n):
        random_file(os.path.join(root, f"{i:02d}.bin"), size)
    return root


def one(case: str, src: str, work: str, env: dict, readers: int, passes: int, disk_mib: int) -> dict:
    mnt = tempfile.mkdtemp(prefix=f"memr-{case}-", dir=work)
    args = ["--ram-cache", "24MiB", "--prefetch-window", "0"]  # no plan is announced: no prefetch window
    disk = None
    if case == "ram+disk":
        disk = tempfile.mkdtemp(prefix="memr-disk-", dir=work)
        args += ["--disk-cache", disk, "--disk-cache-size", f"{disk_mib}MiB"]
    try:
        with Mount(src, mnt, args, log_file=os.path.join(work, f"{case}.log"), env=env) as m:
            time.sleep(0.5)
            idle = proc_vm(m.pid)["VmRSS"]
            peak = [idle]
            stop = threading.Event()

            def sample():
                while not stop.is_set():
                    peak[0] = max(peak[0], proc_vm(m.pid)["VmRSS"])
                    time.sleep(0.02)

            t = threading.Thread(target=sample, daemon=True)
            t.start()
            files = sorted(os.listdir(mnt))[:readers]
            t0 = time.monotonic()
            procs = [subprocess.Popen([sys.executable, "-c", READER, os.path.join(mnt, f), str(passes)],
                                      stdout=subprocess.PIPE, text=True) for f in files]
            outs = [p.communicate(timeout=600)[0] for p in procs]
            wall = time.monotonic() - t0
            stop.set()
            t.join()
            end = proc_vm(m.pid)
            s = m.stats()
            if any(p.returncode for p in procs) or any(int(o or 0) != os.path.getsize(os.path.join(src, f))
                                                       for o, f in zip(outs, files)):
                raise RuntimeError(f"{case}: a reader failed or read short: {outs}")
    finally:
        if disk:
            shutil.rmtree(disk, ignore_errors=True)
    mem = s.get("memory") or {}
    # the peak: VmHWM (the kernel's own high-water mark), or a sample above it (never, in practice)
    return {"idle": idle, "peak": max(peak[0], end["VmRSS"], end["VmHWM"]), "hwm": end["VmHWM"], "end": end["VmRSS"],
            "wall": wall, "bound": mem.get("bound_bytes"), "fill_hwm": (mem.get("fill_buffers") or {}).get(
                "high_water_bytes")}


#: the runner's common options this benchmark honours
COMMON = ('rounds', 'baseline', 'write_doc')


def add_arguments(ap) -> None:
    ap.add_argument("--baseline-tree", default=None, help="a checkout to compare against (its shadefs package)")
    ap.add_argument("--readers", type=int, default=10)
    ap.add_argument("--file-mib", type=int, default=48, help="MiB per reader's file (8 MiB chunks)")
    ap.add_argument("--passes", type=int, default=2, help="whole reads of its file per reader")
    ap.add_argument("--disk-mib", type=int, default=128, help="the NVMe tier's size in the ram+disk case")
    ap.add_argument("--work", default="/tmp/shadefs-bench-memory-readers")


def run(args, bench):
    os.makedirs(args.work, exist_ok=True)
    os.chdir(args.work)  # ``python -m shadefs`` puts the cwd first on sys.path: not this tree's package
    src = make_source(os.path.join(args.work, f"src-{args.file_mib}"), args.readers, args.file_mib * MiB)
    sides = []
    tmp = None
    if args.baseline:
        tmp, rev = bench.baseline()
        sides.append((f"before ({rev})", {**os.environ, "PYTHONPATH": tmp}))
    elif args.baseline_tree:
        sides.append((f"before ({os.path.basename(args.baseline_tree.rstrip('/'))})",
                      {**os.environ, "PYTHONPATH": os.path.abspath(args.baseline_tree)}))
    sides.append(("after" if sides else "this tree", {**os.environ, "PYTHONPATH": ROOT}))
    res = {}
    for _, (case, (label, env)) in bench.interleaved([(c, s) for c in ("ram", "ram+disk") for s in sides]):
        r = one(case, src, args.work, env, args.readers, args.passes, args.disk_mib)
        res.setdefault((case, label), []).append(r)
        print(case, label, {k: (round(v / MiB, 1) if isinstance(v, int) else v) for k, v in r.items()}, flush=True)
    load = os.getloadavg()
    rows = []
    for (case, label), rs in res.items():
        peak = max(r["peak"] for r in rs)
        idle = min(r["idle"] for r in rs)
        bound = rs[-1]["bound"]
        fill = max((r["fill_hwm"] or 0) for r in rs) if rs[-1]["fill_hwm"] is not None else None
        rows.append([case, label, f"{idle / MiB:.0f}", f"{peak / MiB:.0f}",
                     f"{(peak - idle) / MiB:+.0f}", "-" if bound is None else f"{bound / MiB:.0f}",
                     "-" if fill is None else f"{fill / MiB:.0f}"])
    headers = ["case", "code", "idle RSS (MiB)", "peak RSS (MiB)", "growth (MiB)",
               "bound (MiB)", "fill buffers peak (MiB)"]
    table = docsection.markdown_table(headers, rows, "llrrrrr")
    base = f" --baseline {args.baseline}" if args.baseline else (
        f" --baseline-tree {args.baseline_tree}" if args.baseline_tree else "")
    cmd = (f"python -m shadefs.bench memory_readers{base} --readers {args.readers} --file-mib {args.file_mib} "
           f"--passes {args.passes} --disk-mib {args.disk_mib} --rounds {args.rounds}")
    regime = describe("dontneed", dataset_bytes=args.readers * args.file_mib * MiB)
    print(table)
    print(regime)
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {cmd}")
    if args.write_doc:
        docsection.write_table_section(bench.results_path(), "memory-readers", "Daemon memory under concurrent large reads", [
            f"`{cmd} --write-doc` (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}).",
            f"{regime}.",
            f"{args.readers} reader processes each read their own {args.file_mib} MiB file (8 MiB chunks) whole,",
            f"{args.passes} times, through one mount with `--ram-cache 24MiB` (`ram+disk`: and a {args.disk_mib} MiB",
            "NVMe tier; `--prefetch-window 0`: no plan). Peak RSS: VmHWM (and VmRSS sampled every 20 ms); growth =",
            "peak - the idle daemon's RSS after the mount.",
            "The bound: `--ram-cache` + fill buffers + loose buffers + queues (the `memory` key of `shadefs",
            "stats`, docs/operations.md \"The daemon's memory\"); `-` where the code reports none.",
        ], table)
