#!/usr/bin/env python3
"""The main job (``make demo``): train through a shadefs mount and print the cache figures.

Runs, on the same cache size (RAM + NVMe = 20 % of the dataset's bytes by default), from a cold cache:

1. transparent mode: uniform sampling (``shuffle=True``) + the ``static`` policy, unmodified training code;
2. importance mode: ``--hook`` (ShadeSampler + ScoreReporter) + the ``shade`` policy;
3. plan mode: ``--plan`` (PlanSampler: the same uniform permutations, announced to the daemon, which
   prefetches ahead of the reader and evicts by Belady on the known future) + the ``static`` policy.

For each run it mounts the dataset, trains ``--epochs`` epochs through the mount, prints the per-epoch
times and test accuracy, ``shadefs stats``, unmounts, and finally prints both runs side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SHADEFS = [sys.executable, "-m", "shadefs"]


def sh(cmd, **kw):
    print("$ " + " ".join(map(str, cmd)).replace(sys.executable + " -m shadefs", "shadefs"), flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def run_mode(args, name, policy, hook, plan=False):
    mnt = os.path.join(args.workdir, f"mnt-{name}")
    cache = os.path.join(args.workdir, f"cache-{name}")
    shutil.rmtree(cache, ignore_errors=True)  # start cold
    log = os.path.join(args.workdir, f"{name}.log")
    if os.path.exists(log):
        os.unlink(log)  # the daemon appends: one run per log, so a grep of it sees this run only
    os.makedirs(mnt, exist_ok=True)
    trace = os.path.join(args.workdir, f"{name}.trace.csv")
    out = os.path.join(args.workdir, f"{name}.train.json")
    sh(SHADEFS + ["mount", args.data, mnt, "--ram-cache", args.ram_cache, "--disk-cache", cache,
                  "--disk-cache-size", args.disk_cache_size, "--policy", policy, "--trace", trace,
                  "--log-file", log])
    try:
        cmd = [sys.executable, os.path.join(HERE, "train_fashion_mnist.py"), "--data", mnt,
               "--epochs", args.epochs, "--workers", args.workers, "--json", out]
        if hook:
            cmd.append("--hook")
        if plan:
            cmd.append("--plan")
        if args.limit:
            cmd += ["--limit", args.limit]
        sh(cmd)
        sh(SHADEFS + ["stats", mnt])
        stats = json.loads(subprocess.run(SHADEFS + ["stats", mnt, "--json"], check=True, capture_output=True,
                                          text=True).stdout)
    finally:
        subprocess.run(SHADEFS + ["umount", mnt])
    with open(out) as f:
        train = json.load(f)
    return {"mode": name, "policy": policy,
            "sampler": "ShadeSampler" if hook else "PlanSampler" if plan else "uniform",
            "stats": stats, "train": train, "trace": trace}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/fmnist", help="ImageFolder root with train/ and test/")
    p.add_argument("--workdir", default="/tmp/shadefs-demo", help="mountpoints, cache dirs, traces, logs")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    p.add_argument("--ram-cache", default="5%", help="RAM tier (default 5%% of the dataset)")
    p.add_argument("--disk-cache-size", default="15%", help="NVMe tier (default 15%%; 20%% in all)")
    p.add_argument("--limit", type=int, default=None, help="train on N samples only (quick check)")
    p.add_argument("--modes", default="transparent,importance,plan", help="which runs, comma-separated")
    args = p.parse_args(argv)
    args.data = os.path.abspath(args.data)
    os.makedirs(args.workdir, exist_ok=True)
    runs = []
    t0 = time.monotonic()
    for mode in args.modes.split(","):
        print(f"\n=== {mode} mode ===", flush=True)
        if mode == "transparent":
            runs.append(run_mode(args, mode, "static", hook=False))
        elif mode == "importance":
            runs.append(run_mode(args, mode, "shade", hook=True))
        elif mode == "plan":
            runs.append(run_mode(args, mode, "static", hook=False, plan=True))
        else:
            p.error(f"unknown mode {mode!r}")
    print(f"\n=== summary: cache = RAM {args.ram_cache} + NVMe {args.disk_cache_size} of the dataset, "
          f"{args.epochs} epochs ({time.monotonic() - t0:.0f} s) ===")
    print(f"{'mode':<12} {'sampler':<13} {'policy':<7} {'opens':>7} {'hit ratio':>10} {'byte hit':>9} "
          f"{'ram hits':>9} {'disk hits':>9} {'prefetched':>10} {'test acc':>9}  epoch times (s)")
    for r in runs:
        s, t = r["stats"], r["train"]
        times = ", ".join(f"{e['epoch_time_s']:.1f}" for e in t["epochs"])
        print(f"{r['mode']:<12} {r['sampler']:<13} {r['policy']:<7} {s['opens']:>7} "
              f"{s['hit_ratio'] * 100:>9.1f}% {s['byte_hit_ratio'] * 100:>8.1f}% {s['hits']['ram']:>9} "
              f"{s['hits']['disk']:>9} {s['prefetch']['ready'] + s['prefetch']['late']:>10} "
              f"{t['final_test_acc']:>8.2f}%  {times}")
    print("prefetched = opens served from a prefetch (ready or late): neither hits nor backend waits")
    print()
    for line in replay_hint(runs):
        print(line)
    return 0


def replay_hint(runs) -> list:
    """Lines telling the user how to replay each run's trace at the mount's real cache bytes.

    ``runs``: dicts with ``mode``, ``policy``, ``trace`` and ``stats`` (the stats JSON: the tiers'
    ``capacity_bytes``). The simulator models one cache, so it gets RAM + NVMe bytes (the live tiers are
    exclusive: together they hold at most that many bytes); ``shade`` gets the importance the daemon
    wrote at unmount (``TRACE.scores.csv``).
    """
    lines = ["replay a run's trace against every policy and Belady's OPT at the mount's real cache size:"]
    for r in runs:
        tiers = r["stats"]["tiers"]
        ram, disk = tiers["ram"]["capacity_bytes"], tiers["disk"]["capacity_bytes"]
        scores = f" --scores {r['trace']}.scores.csv" if r["policy"] == "shade" else ""
        lines.append(f"  shadefs simulate {r['trace']} --cache-size {ram + disk} --policy all{scores}"
                     f"   # {r['mode']}: RAM {ram} + NVMe {disk} bytes")
    lines.append("  (it reproduces the opens' order and each policy's admission and eviction over one cache of "
                 "RAM + NVMe bytes; not the split between the tiers, the timing of importance updates (shade "
                 "replays the final scores), the sampler's reaction to residency, or time)")
    return lines


if __name__ == "__main__":
    sys.exit(main())
