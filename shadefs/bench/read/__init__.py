"""Read-path throughput of a shadefs mount: files/s and MB/s per open outcome, FUSE loop and reader count.

Regime: **per open** for hits (pages warm on purpose); misses with ``--no-kernel-cache`` and the
miss files' pages dropped before each round. Limit: ``direct`` (the page cache) and libfuse's loops.

Generates two synthetic datasets on local disk (``--files`` files of ~300 B and of ~110 KB, sizes spread
+-30 %, random content, 500 files per directory) and measures, for 1, 4 and 8 reader *processes* (each
reads a disjoint contiguous shard with ``os.open`` / ``os.read`` until EOF / ``os.close``: no buffered
``open()``, which costs one more FUSE round trip for ``isatty``):

- ``direct``: the source directory itself, page cache warm (the ceiling);
- ``RAM hit``: ``--ram-cache 100%``; every open is served from the RAM tier;
- ``NVMe hit``: ``--ram-cache 0 --disk-cache DIR --disk-cache-size`` twice the files' bytes and 64 MiB;
  every open is a disk-tier hit
  (the cache directory sits on the work directory's disk; its entries are in the page cache, so this
  measures the daemon's path, not the device);
- ``miss``: ``--ram-cache 0 --policy static --no-kernel-cache``; every open reads the source (page cache
  warm; without ``--no-kernel-cache`` a file no tier admits keeps its kernel pages between opens, and a
  repeat pass would not reach the daemon);

each with ``--fuse-loop multi`` (the default) and ``--fuse-loop single``; for RAM hits also with
``--no-kernel-cache`` and with ``--trace FILE``. All cases of one file size are mounted at once and
warmed with one pass; then, per reader count, ``--repeat`` rounds time every case once in a rotating
order (medians reported), so load that comes and goes on a shared machine touches every case alike.
Besides files/s and MB/s it reports the daemon's CPU time per open (from /proc) and, with strace, the
FUSE requests the daemon receives per open. Every mount's counters (``shadefs stats --json``) are
checked to show the outcome claimed (every timed open a RAM hit, a disk hit or a miss), every pass must
return the exact byte count, and a sample of files read through each mount is compared byte for byte
with the source (the run aborts on any difference).

A last experiment shows head-of-line blocking: the source is served by a small latency-injecting FUSE
passthrough (mfusepy, multithreaded, every READ sleeps ``--slow-ms``), shadefs is mounted on top with a
RAM tier that holds exactly half of the files (warmed first), and readers read hits and misses
interleaved (the misses' kernel pages dropped before each round, ``POSIX_FADV_DONTNEED``, so every miss
reaches the slow source). With ``--fuse-loop single`` a hit waits behind whichever miss the loop is serving.

    python -m shadefs.bench read                 # full run (~5 min on 2 cores)
    python -m shadefs.bench read --quick         # ~1 min smoke run
    python -m shadefs.bench read --write-doc     # also rewrite docs/results/read.md "Read path"
                                                           # and docs/img/bench_read.png

``--baseline REV`` also mounts every selected case with the ``shadefs`` package of git revision REV (its
daemon started with that package on PYTHONPATH; rows labelled ``[baseline REV]``), in the same rounds,
so the working tree and the baseline are timed side by side on the same files:

    python -m shadefs.bench read --sizes large --readers 8 --cases ram-kernel nvme-kernel \
        --no-slow --no-hung --baseline main

Only the part of docs/results/read.md between ``<!-- bench_read:start -->`` and
``<!-- bench_read:end -->`` is replaced. Every mount is unmounted in ``finally`` blocks (also on Ctrl-C).
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Dict

from shadefs.bench.read.measure import (CASES, DEFAULT_CASES, SLOW_LOOPS, add_baseline_cases, run_hung, run_size,
                                        run_slow)
from shadefs.bench.read.report import build_report, hung_table, machine_info, size_table, slow_table, write_plot
from shadefs.bench.read.rig import BenchError, Mounts, ReaderPool, make_dataset, progress
from shadefs.bench.runner import ROOT

# The package's parts: rig (datasets, reader processes, mounts, the checks of what a mount served),
# sources (the slow and the gated FUSE sources, each its own process), measure (the cases and the
# experiments), report (tables, what limits each path, the doc section, the plot).


#: the runner's common options this benchmark honours
COMMON = ('baseline', 'write_doc', 'json')


def add_arguments(p) -> None:
    p.add_argument("--files", type=int, default=4000, help="files per dataset (default 4000)")
    p.add_argument("--readers", type=int, nargs="+", default=[1, 4, 8], help="reader process counts (default 1 4 8)")
    p.add_argument("--repeat", type=int, default=3, help="timed passes per point; the median is reported (default 3)")
    p.add_argument("--min-pass-s", type=float, default=0.5, help="a timed pass shorter than this reads the files "
                   "several times instead (default 0.5 s)")
    p.add_argument("--sizes", nargs="*", choices=("small", "large"), default=["small", "large"],
                   help="datasets to run (none: only the slow- and hung-backend experiments)")
    p.add_argument("--slow-loops", nargs="+", choices=SLOW_LOOPS, default=list(SLOW_LOOPS),
                   help="front ends in the slow-backend experiment (default: kernel multi single)")
    p.add_argument("--small-size", type=int, default=300, help="mean size of the small files (default 300 B)")
    p.add_argument("--large-size", type=int, default=110_000, help="mean size of the large files (default 110 KB)")
    p.add_argument("--cases", nargs="+", choices=[c[0] for c in CASES] + ["all"], default=DEFAULT_CASES,
                   help="mount cases to run (default: " + " ".join(DEFAULT_CASES) + "; 'all': every case; "
                   "direct always runs)")
    p.add_argument("--slow-ms", type=float, nargs="+", default=[2.0, 20.0], help="latencies of each source READ "
                   "in the slow-backend experiment, one run each (default 2 20 ms)")
    p.add_argument("--slow-files", type=int, default=800, help="files in the slow-backend experiment (default 800)")
    p.add_argument("--slow-readers", type=int, default=4, help="readers in the slow-backend experiment (default 4)")
    p.add_argument("--no-slow", action="store_true", help="skip the slow-backend experiment")
    p.add_argument("--no-hung", action="store_true", help="skip the hung-backend experiment")
    p.add_argument("--hung", type=int, default=16, help="hung backend reads in the hung-backend experiment (default 16)")
    p.add_argument("--count-requests", type=int, default=200, metavar="N",
                   help="count the FUSE requests per open with strace over N files for a few cases (0: off; "
                   "default 200; needs strace and ptrace rights)")
    p.add_argument("--verify", type=int, default=48, help="files per mount compared byte for byte (plus first and last)")
    p.add_argument("--workdir", help="work directory on local disk (default: a new temporary directory, removed "
                   "at the end); datasets in it are reused")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--quick", action="store_true", help="smoke run (~1 min): 400 files, 1 and 8 readers, 1 pass")
    p.add_argument("--doc", default=os.path.join(ROOT, "docs", "results", "read.md"))
    p.add_argument("--plot", default=os.path.join(ROOT, "docs", "img", "bench_read.png"))
    p.add_argument("--quiet-machine", dest="noisy_note", action="store_false",
                   help="omit the 'machine was shared' caveat from the doc")


def run(args, bench):
    if args.quick:
        args.files = min(args.files, 400)
        args.readers = [1, 8] if args.readers == [1, 4, 8] else args.readers
        args.repeat = 1
        args.slow_files = min(args.slow_files, 200)
        args.verify = min(args.verify, 16)
        args.min_pass_s = min(args.min_pass_s, 0.2)
    args.readers = sorted(set(args.readers))
    if args.files < 2 or min(args.readers) < 1 or args.repeat < 1 or args.slow_files < 2:
        bench.error("--files, --slow-files >= 2; --readers, --repeat >= 1")
    command = bench.command
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    own_work = args.workdir is None
    work = os.path.abspath(args.workdir) if args.workdir else tempfile.mkdtemp(prefix="shadefs-bench-read-")
    for d in ("data", "mnt", "cache", "logs"):
        os.makedirs(os.path.join(work, d), exist_ok=True)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    info = machine_info(work)
    args.load_start = os.getloadavg()
    progress(f"bench_read: {info['nproc']} CPUs, kernel {info['kernel']}, libfuse {info.get('libfuse')} "
             f"({info.get('libfuse_path')}), workdir {work} on {info['workdir_fs']}, load {os.getloadavg()}")
    baseline_dir = None
    if args.baseline:
        baseline_dir, rev = bench.baseline()
        selected = [c[0] for c in CASES] if "all" in args.cases else list(args.cases)
        args.cases = selected + add_baseline_cases(selected, baseline_dir, rev)
        os.chdir(work)  # ``python -m shadefs`` puts the cwd first on sys.path: not this tree's package
    pool = mounts = None
    results: Dict[str, dict] = {}
    slow = hung = None
    t_start = time.monotonic()
    try:
        datasets = {}
        for name in args.sizes:
            mean = args.small_size if name == "small" else args.large_size
            progress(f"dataset {name}: {args.files} files of ~{mean} B")
            datasets[name] = (os.path.join(work, "data", name),
                              make_dataset(os.path.join(work, "data", name), args.files, mean, seed=1 if name == "small" else 2))
        pool = ReaderPool(max(max(args.readers), args.slow_readers))  # forked before any mount or thread
        mounts = Mounts()
        for name in args.sizes:
            src, files = datasets[name]
            label = f"~{args.small_size} B" if name == "small" else f"~{args.large_size // 1000} KB"
            results[label] = run_size(args, pool, mounts, name, src, files, work)
            print("\n" + size_table(label, results[label], args.readers).text() + "\n", flush=True)
        if not args.no_slow:
            slow = {}
            for delay in args.slow_ms:
                slow[f"{delay:g}"] = run_slow(args, pool, mounts, work, delay)
                print("\n" + slow_table(slow[f"{delay:g}"]).text() + "\n", flush=True)
        if not args.no_hung:
            hung = args.hung_result = run_hung(args, pool, mounts, work)
            print("\n" + hung_table(hung).text() + "\n", flush=True)
    except KeyboardInterrupt:
        print("bench_read: interrupted; unmounting", file=sys.stderr)
        return 130
    except BenchError as e:
        print(f"bench_read: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        if pool is not None:
            pool.close()
        if mounts is not None:
            mounts.unmount_all()
        if own_work and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    elapsed = time.monotonic() - t_start
    args.load_end = os.getloadavg()

    tables, section = build_report(args, info, results, slow, command, started, elapsed)
    print(f"machine: {info['nproc']} CPUs ({info.get('cpu')}), kernel {info['kernel']}, libfuse "
          f"{info.get('libfuse')} via mfusepy {info.get('mfusepy')}; workdir on {info['workdir_fs']}")
    print(f"command: {command}\n")
    for t in tables[len(results):]:
        print(t.text() + "\n")
    print(f"total {elapsed:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "results": results, "slow": slow, "hung": hung, "command": command}, f, indent=1, default=str)
    if args.write_doc:
        bench.write_results(section, "bench_read", args.doc)
        large = next((res for label, res in results.items() if "KB" in label), None)
        if large is not None and args.plot:
            write_plot(args.plot, large, args.readers,
                       f"shadefs read path, ~{args.large_size // 1000} KB files, {info['nproc']} CPUs "
                       f"(load {os.getloadavg()[0]:.1f})")
        print(f"wrote the 'Read path' section of {args.doc}" + (f" and {args.plot}" if large is not None else ""))
    return 0
