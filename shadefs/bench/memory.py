"""Daemon memory with files held open: resident set size (VmRSS of the daemon) before and after.

Regime: **counts** (the daemon's resident set; the page cache does not change it).

Two cases, each a real mount of a local source through the CLI:

- ``stream``: 8 files of 40 MiB that no tier holds (``--ram-cache 0``, no disk tier), all opened, read
  whole and held open at once. The bound: a file no tier admits is read by chunks of 8 MiB, never whole;
  an open handle keeps its last chunk as a loose buffer, and loose buffers are bounded at 64 MiB
  (``LOOSE_BUFFERS``; past it a read goes by ranges), so 8 files held open take one bound's worth.
- ``held``: 300 files of 96 KiB (28.1 MiB) opened, read whole and held open at once with a 4 MiB RAM tier
  (``--policy lru --no-kernel-cache``). The bound: the RAM tier's 4 MiB plus the loose buffers (victims
  of the tier that open handles still hold, 64 MiB at most); stats ``memory`` counts both.

``--baseline REV`` runs the same cases against the ``shadefs`` package of git revision REV (the daemon
is started with that package on PYTHONPATH), side by side in one run. The figure that matters is the
growth (after - before) against the bound, not the absolute RSS (the interpreter, numpy and zmq take
~30-60 MiB whatever is cached). Measured from /proc/PID/status (VmRSS, VmHWM).

    python -m shadefs.bench memory [--baseline REV] [--write-doc]
"""
from __future__ import annotations

import os
import tempfile
import time

from shadefs.testing import Mount, docsection, proc_vm
from shadefs.testing.datasets import random_file

MiB = 1 << 20


def make_source(root: str, n: int, size: int) -> str:
    os.makedirs(root, exist_ok=True)
    for i in range(n):
        d = os.path.join(root, f"c{i % 4}")
        os.makedirs(d, exist_ok=True)
        random_file(os.path.join(d, f"{i:04d}.bin"), size)
    return root


def hold_and_read(mnt: str) -> list:
    """Open every file under ``mnt``, read each whole, keep them all open; returns the fds."""
    fds = []
    for d, _, files in sorted(os.walk(mnt)):
        for name in sorted(files):
            fd = os.open(os.path.join(d, name), os.O_RDONLY)
            fds.append(fd)
            while os.read(fd, MiB):
                pass
    return fds


def one(case: str, src: str, work: str, env: dict) -> dict:
    mnt = tempfile.mkdtemp(prefix=f"mem-{case}-", dir=work)
    if case == "stream":
        args = ["--ram-cache", "0"]
    else:
        args = ["--ram-cache", "4MiB", "--policy", "lru", "--no-kernel-cache"]
    with Mount(src, mnt, args, log_file=os.path.join(work, f"{case}.log"), env=env) as m:
        time.sleep(0.5)
        before = proc_vm(m.pid)
        fds = hold_and_read(mnt)
        time.sleep(0.2)
        after = proc_vm(m.pid)
        s = m.stats()
        for fd in fds:
            os.close(fd)
    ram = s["tiers"]["ram"]
    return {"files": len(fds), "before": before["VmRSS"], "after": after["VmRSS"], "hwm": after["VmHWM"],
            "ram_used": ram["used_bytes"], "ram_cap": ram["capacity_bytes"], "opens": s["opens"]}


#: the runner's common options this benchmark honours
COMMON = ('baseline', 'write_doc')


def add_arguments(ap) -> None:
    ap.add_argument("--work", default="/tmp/shadefs-bench-memory", help="sources and mountpoints go here")


def run(args, bench):
    os.makedirs(args.work, exist_ok=True)
    os.chdir(args.work)  # ``python -m shadefs`` puts the cwd first on sys.path: not this tree's package
    sources = {"stream": make_source(os.path.join(args.work, "src-stream"), 8, 40 * MiB),
               "held": make_source(os.path.join(args.work, "src-held"), 300, 96 * 1024)}
    sides = []
    tmp = None
    if args.baseline:
        tmp, rev = bench.baseline()
        sides.append((f"before ({rev})", {**os.environ, "PYTHONPATH": tmp}))
    sides.append(("after" if args.baseline else "this tree", dict(os.environ)))
    rows = []
    for case in ("stream", "held"):
        for label, env in sides:
            r = one(case, sources[case], args.work, env)
            bound = "loose buffers 64 MiB" if case == "stream" else "RAM tier 4 MiB + loose buffers 64 MiB"
            rows.append([case, label, r["files"], f"{r['before'] / MiB:.1f}", f"{r['after'] / MiB:.1f}",
                         f"{(r['after'] - r['before']) / MiB:+.1f}", f"{r['hwm'] / MiB:.1f}", bound])
    load = os.getloadavg()
    headers = ["case", "code", "files held open", "RSS before (MiB)", "RSS after (MiB)", "growth (MiB)",
               "peak RSS (MiB)", "bound"]
    table = docsection.markdown_table(headers, rows, "llrrrrrl")
    cmd = "python -m shadefs.bench memory" + (f" --baseline {args.baseline}" if args.baseline else "")
    print(table)
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {cmd}")
    if args.write_doc:
        docsection.write_table_section(bench.results_path(), "memory", "Daemon memory with files held open", [
            f"`{cmd} --write-doc` (load average {load[0]:.2f}). VmRSS of the daemon after the mount (before) and",
            "with every file opened, read whole and still open (after). `stream`: 8 files of 40 MiB that no",
            "tier holds (`--ram-cache 0`, no disk tier): read by 8 MiB chunks, each open handle keeping its",
            "last chunk as a loose buffer, bounded at 64 MiB (past it, reads go by ranges). `held`: 300 files",
            "of 96 KiB (28.1 MiB) held open with `--ram-cache 4MiB --policy lru --no-kernel-cache`: the tier's",
            "4 MiB plus the victims open handles still hold (loose buffers, 64 MiB at most; docs/operations.md,",
            "\"The daemon's memory\"). Closing the files returns the loose buffers.",
        ], table)
