"""Cache hit ratio of real Fashion-MNIST training through a shadefs mount, against Belady's OPT.

Regime: **counts** (the tiers' hits; an open the kernel's pages served would count as a miss). Limit:
Belady's OPT replayed on the run's own trace at the same cache bytes.

For every cache size (``--sizes``, percent of the training set's bytes) and every mode (``--modes``):

- sampler ``uniform``: the unmodified ``DataLoader(shuffle=True)`` (transparent mode);
- sampler ``importance``: ``train_fashion_mnist.py --hook`` (ShadeSampler = SHADE's PADS, cache-aware,
  plus ScoreReporter sending per-sample losses to the daemon; it announces each epoch's draw);
- sampler ``importance-noplan``: the same with ``--no-plan`` (no announced draws: the policy alone);
- sampler ``importance-prev``: ShadeSampler as before its provisional lookahead (``--no-lookahead --draw
  cdf``): each epoch's draw announced at its start, nothing ahead;
- sampler ``plan``: ``train_fashion_mnist.py --plan`` (PlanSampler: uniform permutations, announced);

each with the policies ``lru``, ``static`` and ``shade`` (``--modes all``: uniform and importance with all
three, plus plan:static and importance-noplan:shade), it

1. mounts the training split alone with a RAM-only tier (``--ram-cache P%``, no disk tier) and
   ``--trace``, from a cold cache;
2. trains the small CNN of ``train_fashion_mnist.py`` for ``--epochs`` epochs (CPU) through the mount;
   the test split (10k images) is read directly from ``DATA/test``, not through the mount, so
   evaluation neither pollutes the trace nor counts in the cache percentage;
3. reads ``shadefs stats --json`` (the measured hit ratio), unmounts, and waits for the daemon to exit
   (it closes the trace and writes ``TRACE.scores.csv`` on the way out);
4. splits the trace into epochs (every epoch is exactly ``len(train set)`` opens, in both samplers),
   counts the measured hits (``outcome`` column) per epoch, and replays the same trace through Belady's
   OPT at the same cache bytes (the RAM tier's capacity from the stats). OPT sees the whole trace; its
   hits are counted per epoch, so "OPT, epochs 2..E" is OPT for the whole run, counted in the warm
   epochs (``shadefs.sim.belady(..., hit_mask=...)``). The same trace is also
   replayed through the run's own policy (``shadefs.sim.simulate``) as a daemon-vs-simulator check.

Layout of the mount: the daemon's source is the train directory itself (class folders at the mount
root), and each run gets a small data directory ``train -> MOUNTPOINT``, ``test -> DATA/test`` for the
training script. The hooks find the mount root lexically (the symlink ``.../data/train``), so the
paths they send ("Bag/00023.png") are the daemon's paths.

``--train-limit N`` trains on a fixed subset: the first N/10 files of each class (sorted by name), as a
tree of symlinks under WORKDIR that is mounted instead, so the cache percentage is of the bytes
actually trained on.

Usage::

    python -m shadefs.bench hit_ratio [--data data/fmnist] [--epochs 3] [--workers 2] [--sizes 5,10,20,40]
                       [--modes all|uniform|importance|SAMPLER:POLICY,...] [--train-limit N]
                       [--quick] [--workdir DIR] [--results FILE] [--resume] [--write-doc]
    python -m shadefs.bench hit_ratio --from-results [--results FILE] [--reanalyse] --write-doc   # no training

``--quick``: 6000 images, sizes 10,40, 2 epochs, 12 runs (about 5 min on 2 busy cores, 15-40 s a run).
A full-size run (60000 images x 3 epochs + 3 evaluations of 10000) took 5 min on 2 cores shared with
other jobs (600-800 images/s through the mount): budget 1-2 h for the default 24 runs.
``--reanalyse`` recomputes the trace analysis of saved runs from their traces (kept under WORKDIR/runs).
``--write-doc`` replaces the section between ``<!-- bench_hit_ratio:start -->`` and
``<!-- bench_hit_ratio:end -->`` of docs/results/hit_ratio.md and writes docs/img/hit_ratio_uniform.png and docs/img/hit_ratio_importance.png.
Results are saved to ``--results`` after every run (``--resume`` skips runs already there).
Every mount is unmounted in ``finally`` (also on Ctrl-C); a failed run is recorded and the next one
starts.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
from typing import List, Tuple

import numpy as np

from shadefs.bench.hit_ratio.analysis import analyse
from shadefs.bench.hit_ratio.measure import (ALL_MODES, POLICIES, SAMPLERS, find_run, list_classes, ok,
                                             prepare_source, progress, run_one, save_results)
from shadefs.bench.hit_ratio.report import DOC, IMG_DIR, console_table, pct_s, write_outputs
from shadefs.bench.runner import ROOT

# The package's parts: measure (the modes, the split to mount, one training run, the results file),
# analysis (the trace: hits per epoch, OPT and the policy's replay), report (tables, plots, goals, the
# doc section).


def parse_modes(text: str) -> List[Tuple[str, str]]:
    from shadefs.policies import policy_names

    out: List[Tuple[str, str]] = []
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            continue
        if tok == "all":
            modes = ALL_MODES
        elif tok in SAMPLERS:
            modes = [(tok, p) for p in POLICIES]
        else:
            s, sep, p = tok.partition(":")
            if not sep or s not in SAMPLERS or p not in policy_names():
                raise SystemExit(f"error: --modes {tok!r}: want all, uniform, importance or SAMPLER:POLICY "
                                 f"(samplers {', '.join(SAMPLERS)}; policies {', '.join(policy_names())})")
            modes = [(s, p)]
        out += [m for m in modes if m not in out]
    return out


def parse_sizes(text: str) -> List[float]:
    try:
        sizes = [float(t.strip().rstrip("%")) for t in text.split(",") if t.strip()]
    except ValueError:
        raise SystemExit(f"error: --sizes {text!r}: want percentages such as 5,10,20,40") from None
    if not sizes or any(not 0 < s <= 100 for s in sizes):
        raise SystemExit("error: --sizes: percentages in (0, 100]")
    return sizes


#: the runner's common options this benchmark honours
COMMON = ('write_doc',)


def add_arguments(p) -> None:
    p.add_argument("--data", default=os.path.join(ROOT, "data", "fmnist"),
                   help="ImageFolder root with train/ and test/ (default: %(default)s)")
    p.add_argument("--workdir", default="/tmp/shadefs-bench-hit-ratio",
                   help="mountpoints, traces, logs, subset trees (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=None, help="epochs per run (default 3; --quick 2)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the training script's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sizes", default=None, help="cache sizes, %% of the training bytes (default 5,10,20,40; "
                   "--quick 10,40)")
    p.add_argument("--modes", default="all", help="all, uniform, importance, or SAMPLER:POLICY, comma-separated "
                   "(default all: {uniform,importance} x {lru,static,shade})")
    p.add_argument("--train-limit", type=int, default=None, metavar="N",
                   help="train on the first N/10 images of each class (default: all; --quick 6000)")
    p.add_argument("--quick", action="store_true", help="smoke run: 6000 images, sizes 10,40, 2 epochs")
    p.add_argument("--run-timeout", type=float, default=3600, help="seconds per training run (default 3600)")
    p.add_argument("--results", default=None, help="results JSON (default WORKDIR/hit_ratio.json)")
    p.add_argument("--resume", action="store_true", help="keep successful runs already in --results")
    p.add_argument("--from-results", action="store_true", help="do not train: load --results (with --write-doc)")
    p.add_argument("--reanalyse", action="store_true",
                   help="with --from-results: recompute per-epoch hits and OPT from the saved traces")
    p.add_argument("--doc", default=DOC, help=argparse.SUPPRESS)
    p.add_argument("--img-dir", default=IMG_DIR, help=argparse.SUPPRESS)


def run(args, bench):
    args.workdir = os.path.abspath(args.workdir)

    def interrupt(signum, frame):  # Ctrl-C and SIGTERM: unmount in the finally blocks, save, exit
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    results_path = os.path.abspath(args.results or os.path.join(args.workdir, "hit_ratio.json"))

    if args.from_results:
        with open(results_path) as f:
            results = json.load(f)
        if args.reanalyse:
            m = results["meta"]
            for r in results["runs"]:
                if ok(r) and os.path.exists(r["trace"]):
                    analyse(r, r["trace"], r["cache_bytes"], m["n_train"], m["epochs"])
            save_results(results_path, results)
            progress(f"re-analysed the traces; saved {results_path}")
        print(console_table(results))
        if args.write_doc:
            write_outputs(results, args.doc, args.img_dir)
        else:
            progress("nothing written (add --write-doc)")
        return 0

    if args.quick:
        args.train_limit = args.train_limit if args.train_limit is not None else 6000
        args.sizes = args.sizes or "10,40"
        args.epochs = args.epochs or 2
    args.epochs = args.epochs or 3
    sizes = parse_sizes(args.sizes or "5,10,20,40")
    modes = parse_modes(args.modes)
    if args.epochs < 2 or args.workers < 0:
        bench.error("--epochs must be >= 2 (the first epoch is cold) and --workers >= 0")
    args.data = os.path.abspath(args.data)
    for split in ("train", "test"):
        if not os.path.isdir(os.path.join(args.data, split)):
            bench.error(f"{args.data}/{split} is not a directory (build it with scripts/make_fashion_mnist.py)")
    os.makedirs(args.workdir, exist_ok=True)

    src, n_train, train_bytes = prepare_source(args.data, args.workdir, args.train_limit)
    n_test = sum(len(v) for v in list_classes(os.path.join(args.data, "test")).values())
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or None
    except OSError:
        commit = None
    meta = {"n_train": n_train, "train_bytes": train_bytes, "n_test": n_test, "train_limit": args.train_limit,
            "epochs": args.epochs, "workers": args.workers, "batch_size": args.batch_size, "lr": args.lr,
            "seed": args.seed, "quick": args.quick, "source": src, "data": args.data,
            "cpus": os.cpu_count(), "platform": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "commit": commit,
            "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "command": bench.command}
    results = {"meta": meta, "runs": []}
    same_keys = ("n_train", "train_bytes", "epochs", "workers", "batch_size", "lr", "seed")
    if args.resume and os.path.exists(results_path):
        with open(results_path) as f:
            old = json.load(f)
        if all(old["meta"].get(k) == meta[k] for k in same_keys):
            results["runs"] = [r for r in old["runs"] if ok(r)]
            progress(f"resume: {len(results['runs'])} runs kept from {results_path}")
        else:
            progress(f"resume: {results_path} has another configuration; starting over")

    plan = [(s, pol, pct) for pct in sizes for (s, pol) in modes]
    progress(f"{len(plan)} runs: {n_train} images ({train_bytes / 1e6:.1f} MB) from {src}, {args.epochs} epochs, "
             f"{args.workers} workers, sizes {', '.join(f'{x:g}%' for x in sizes)}; results -> {results_path}")
    try:
        for k, (s, pol, pct) in enumerate(plan, 1):
            if find_run(results, s, pol, pct) is not None:
                progress(f"run {k}/{len(plan)}: {s}/{pol} @ {pct:g}%: kept from {results_path}")
                continue
            progress(f"run {k}/{len(plan)}: sampler {s}, policy {pol}, cache {pct:g}%")
            try:
                r = run_one(args, s, pol, pct, src, n_train)
            except KeyboardInterrupt:
                progress("interrupted; saving what is done")
                raise
            results["runs"].append(r)
            save_results(results_path, results)
            if ok(r):
                progress(f"  done in {r['run_time_s']:.0f} s: hit ratio {pct_s(r['hit_ratio'])} "
                         f"(warm {pct_s(r['hit_ratio_warm'])}, OPT {pct_s(r['opt_hit_ratio_warm'])}), "
                         f"test acc {r['test_acc']:.2f} %, epochs {', '.join(f'{t:.1f}' for t in r['epoch_times_s'])} s"
                         + (f"; warnings: {r['warnings']}" if r["warnings"] else ""))
    finally:
        save_results(results_path, results)
    print()
    print(console_table(results))
    done = [r for r in results["runs"] if r.get("run_time_s")]
    if done:
        progress(f"{len(done)} runs, mean {np.mean([r['run_time_s'] for r in done]):.0f} s per run; "
                 f"results in {results_path}")
    if args.write_doc:
        write_outputs(results, args.doc, args.img_dir)
    return 1 if any(r.get("error") for r in results["runs"]) else 0
