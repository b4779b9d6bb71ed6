#!/usr/bin/env python3
"""The main job (``make demo``): train through a shadefs mount and print the cache figures.

Runs, on the same cache size (RAM + NVMe = 20 % of the dataset's bytes by default), from a cold cache:

1. transparent mode: uniform sampling (``shuffle=True``) + the ``static`` policy, unmodified training code;
2. importance mode: ``--hook`` (ShadeSampler + ScoreReporter) + the ``shade`` policy;
3. plan mode: ``--plan`` (PlanSampler: the same uniform permutations, announced to the daemon, which
   prefetches ahead of the reader and evicts by Belady on the known future) + the ``static`` policy.

For each run it mounts the dataset, trains ``--epochs`` epochs through the mount, prints the per-epoch
times and test accuracy, ``shadefs stats``, unmounts, and finally prints the runs side by side.

The work folder (``--workdir``) holds each run's mountpoint, NVMe cache directory (15 % of the dataset,
about 50 MB each), access trace and daemon log. A run's cache and mountpoint are removed as soon as it is
unmounted, and the traces and training JSON at the end; the three daemon logs (a few KB each: the record of
the run, e.g. to ``grep -i corrupt``) stay, and a re-run replaces them. ``--keep`` keeps all of it (and
prints how to replay the traces). A run that fails keeps the folder. Nothing there is needed to re-run fast: every run starts cold anyway. The converted dataset
(``--data``) is kept (rebuilding Fashion-MNIST's 70,000 PNGs took 28-43 s on this 2-core machine at load 4;
the closing line says how to remove it).

Ctrl-C (SIGINT) or SIGTERM stops the training, unmounts, waits for the daemon to exit (killing it if it
does not), and cleans up as above; the exit status is then 130 (143 for SIGTERM).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SHADEFS = [sys.executable, "-m", "shadefs"]


def sh(cmd, **kw):
    print("$ " + " ".join(map(str, cmd)).replace(sys.executable + " -m shadefs", "shadefs"), flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


class Stop(BaseException):
    """SIGINT/SIGTERM arrived: stop training, unmount, clean up (``code``: the exit status)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def _on_signal(signum, frame):
    raise Stop(128 + signum)


def _daemon_alive(mnt: str) -> bool:
    from shadefs import registry

    return registry.lookup(os.path.abspath(mnt)) is not None  # None also for a stale (dead) entry


def _mounted(mnt: str) -> bool:
    from shadefs import registry

    return registry.mount_entry(os.path.abspath(mnt)) is not None


def release(mnt: str, timeout: float = 30.0) -> bool:
    """Unmount ``mnt`` if it is mounted and wait until its daemon has exited (bounded).

    Retries while the mount is busy (the DataLoader workers of an interrupted training may still hold
    files for a moment), then falls back to ``shadefs umount --force`` (which kills a daemon that does not
    answer and detaches the mount). Returns True when neither a mount nor a daemon is left.
    """
    deadline = time.monotonic() + timeout
    forced = False
    while True:
        mounted, alive = _mounted(mnt), _daemon_alive(mnt)
        if not mounted and not alive:
            return True
        if time.monotonic() > deadline:
            if forced:
                print(f"demo: could not unmount {mnt}; run: shadefs umount --force {mnt}", file=sys.stderr)
                return False
            forced = True
            deadline = time.monotonic() + 10.0
            subprocess.run(SHADEFS + ["umount", "--force", mnt], capture_output=True, text=True)
        elif mounted:
            subprocess.run(SHADEFS + ["umount", mnt], capture_output=True, text=True)
        # else: a daemon without its mount yet (the mount was interrupted): it mounts, or exits, shortly
        time.sleep(0.2)


def _quiet():
    """Ignore SIGINT/SIGTERM (during cleanup: a second Ctrl-C must not cut it short); returns the old handlers."""
    return signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _restore(old) -> None:
    signal.signal(signal.SIGINT, old[0])
    signal.signal(signal.SIGTERM, old[1])


def _run_child(cmd, interruptible: bool = True) -> None:
    """Run ``cmd`` (printed) in its own process group, so Ctrl-C reaches only this script, which decides.

    On Stop: an ``interruptible`` child (training, stats) and its DataLoader workers get SIGINT, then
    SIGKILL if they linger; ``shadefs mount`` is waited for instead (up to 120 s): killed half-way it would
    leave a daemon that registers after we looked, so it finishes and the cleanup unmounts what it made.
    """
    print("$ " + " ".join(map(str, cmd)).replace(sys.executable + " -m shadefs", "shadefs"), flush=True)
    proc = subprocess.Popen([str(c) for c in cmd], process_group=0)
    try:
        rc = proc.wait()
    except Stop:
        old = _quiet()
        try:
            if interruptible:
                for sig in (signal.SIGINT, signal.SIGKILL):
                    if proc.poll() is not None:
                        break
                    try:
                        os.killpg(proc.pid, sig)
                    except ProcessLookupError:
                        pass
                    try:
                        proc.wait(10.0)
                    except subprocess.TimeoutExpired:
                        pass
            else:
                try:
                    proc.wait(120.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        finally:
            _restore(old)
        raise
    if rc != 0:
        raise subprocess.CalledProcessError(rc, cmd)


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
    args.created += [mnt, cache, trace, trace + ".scores.csv", out]  # not the log: it stays
    args.logs.append(log)
    try:
        _run_child(SHADEFS + ["mount", args.data, mnt, "--ram-cache", args.ram_cache, "--disk-cache", cache,
                              "--disk-cache-size", args.disk_cache_size, "--policy", policy, "--trace", trace,
                              "--trace-overwrite", "--log-file", log], interruptible=False)
        cmd = [sys.executable, os.path.join(HERE, "train_fashion_mnist.py"), "--data", mnt,
               "--epochs", args.epochs, "--workers", args.workers, "--json", out]
        if hook:
            cmd.append("--hook")
        if plan:
            cmd.append("--plan")
        if args.limit:
            cmd += ["--limit", args.limit]
        _run_child(cmd)
        _run_child(SHADEFS + ["stats", mnt])
        stats = json.loads(subprocess.run(SHADEFS + ["stats", mnt, "--json"], check=True, capture_output=True,
                                          text=True).stdout)
    finally:
        old = _quiet()
        try:
            if not release(mnt):
                args.left.append(mnt)
        finally:
            _restore(old)
    if not args.keep:  # the cache is 15 % of the dataset: do not keep one per mode until the end
        shutil.rmtree(cache, ignore_errors=True)
        _rmdir(mnt)
    with open(out) as f:
        train = json.load(f)
    return {"mode": name, "policy": policy,
            "sampler": "ShadeSampler" if hook else "PlanSampler" if plan else "uniform",
            "stats": stats, "train": train, "trace": trace}


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)  # only an empty directory: never what a failed unmount left mounted
    except OSError:
        pass


def clean_workdir(args) -> None:
    """Remove what the demo wrote in the work folder, and the folder if it made it and it is now empty."""
    for path in args.created:
        if os.path.isdir(path) and not os.path.islink(path):
            if path.endswith(tuple(f"mnt-{m}" for m in ("transparent", "importance", "plan"))):
                _rmdir(path)  # a mountpoint: only if empty (never delete through a mount)
            else:
                shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)
    if args.made_workdir:
        _rmdir(args.workdir)


def logs_note(logs, runs) -> str:
    """The closing line about the daemon logs the demo keeps: where, how many warnings and errors they hold,
    and the corrupt disk entries the stats counted (a checksum mismatch, dropped and re-read from the
    source: docs/operations.md)."""
    corrupt = sum(int(r["stats"].get("corrupt_entries", 0)) for r in runs)
    warnings = 0
    for log in logs:
        try:
            with open(log, errors="replace") as f:
                warnings += sum(1 for line in f if " WARNING " in line or " ERROR " in line)
        except OSError:
            pass
    return (f"daemon logs (kept): {' '.join(logs)}: {warnings} warnings or errors; "
            f"{corrupt} corrupt disk entries in the stats")


def dataset_note(data: str) -> str:
    """The closing line about the converted dataset, which the demo keeps (its size, and how to remove it)."""
    files = total = disk = 0
    for d, _, fs in os.walk(data):
        for f in fs:
            try:
                st = os.lstat(os.path.join(d, f))
            except OSError:
                continue
            files += 1
            total += st.st_size
            disk += st.st_blocks * 512
    return (f"the converted dataset stays in {data} ({files:,} images, {total / 2**20:.1f} MiB, "
            f"{disk / 2**20:.0f} MiB on disk), so the next run need not rebuild it (about half a minute to a "
            f"minute on a 2-core machine); to remove it: rm -rf {data} {data}.complete")


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
    p.add_argument("--keep", action="store_true",
                   help="keep the work folder's caches, traces and daemon logs (default: removed at the end)")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    for mode in modes:
        if mode not in ("transparent", "importance", "plan"):
            p.error(f"unknown mode {mode!r}")
    args.data = os.path.abspath(args.data)
    args.workdir = os.path.abspath(args.workdir)
    args.made_workdir = not os.path.isdir(args.workdir)
    os.makedirs(args.workdir, exist_ok=True)
    args.created = []
    args.logs = []  # each mode's daemon log (kept)
    args.left = []  # mountpoints that could not be released
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        runs = run_modes(args, modes)
    except Stop as e:
        _quiet()
        if not args.keep:
            clean_workdir(args)
        if args.left:
            print(f"\ndemo: interrupted; still mounted: {' '.join(args.left)}", file=sys.stderr, flush=True)
        else:
            print("\ndemo: interrupted; unmounted, no daemon left running"
                  + ("" if args.keep else f", the work folder {args.workdir} cleaned up"), file=sys.stderr,
                  flush=True)
        return e.code
    except BaseException:
        print(f"demo: failed; the work folder {args.workdir} is kept, with its daemon logs", file=sys.stderr)
        raise
    _quiet()
    if not args.keep:
        clean_workdir(args)
    print_summary(args, runs)
    return 0


def run_modes(args, modes) -> list:
    runs = []
    args.t0 = time.monotonic()
    for mode in modes:
        print(f"\n=== {mode} mode ===", flush=True)
        if mode == "transparent":
            runs.append(run_mode(args, mode, "static", hook=False))
        elif mode == "importance":
            runs.append(run_mode(args, mode, "shade", hook=True))
        else:
            runs.append(run_mode(args, mode, "static", hook=False, plan=True))
    return runs


def print_summary(args, runs) -> None:
    t0 = args.t0
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
    if args.keep:
        for line in replay_hint(runs):
            print(line)
        print(f"the work folder {args.workdir} keeps each run's NVMe cache, trace and daemon log (--keep)")
    else:
        print(f"the work folder {args.workdir} was cleaned up (mounts, caches, traces); --keep keeps them, "
              "e.g. to replay the traces with shadefs simulate")
    print(logs_note(args.logs, runs))
    print(dataset_note(args.data))


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
