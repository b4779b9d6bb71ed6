#!/usr/bin/env python3
"""The main job (``make demo``): train through shadefs over slow storage, side by side with the direct reader.

By default the dataset lies behind slow storage: a subset of Fashion-MNIST (``--train-images``,
``--test-images``) in an S3 bucket on a local S3 server (``python -m moto.server``), reached through a
latency proxy (``shadefs/testing/latency_proxy.py``, ``--delay-ms`` each way) that stands in for a remote
object store. Over the same bucket and the same cache size (RAM + NVMe = 20 % of the dataset's bytes by
default), each from a cold cache, it trains the same small CNN (``train_fashion_mnist.py``) in these modes:

1. direct: no shadefs; a torch Dataset reading each sample with one s3fs GET (``S3ImageFolder``,
   shadefs.testing.s3data), ``shuffle=True``;
2. transparent: ``shadefs mount s3://...`` + the ``static`` policy, unmodified ImageFolder, ``shuffle=True``;
3. plan: ``PlanSampler`` (the same uniform permutations, announced to the daemon, which prefetches ahead
   of the reader and evicts by Belady on the known future) + the ``static`` policy;
4. importance: ``ShadeSampler`` + ``ScoreReporter`` + the ``shade`` policy.

The training job runs in the regime of a dataset larger than memory (``shadefs.testing.regime``): on a
mount it reads each image with ``pil_loader_dropping`` (``train_fashion_mnist.py --drop-pages``: the pages
are dropped from the page cache after the read), so every epoch reads through to shadefs, as a job whose
dataset outgrows its memory does, and the direct reader holds nothing between epochs anyway; the demo prints
this regime line. (A subset small enough for the page cache would otherwise make the repeat epochs of every
mounted mode fast whatever the cache held.) The mounts keep the kernel's page cache on, as a user's do: before
a plan prefetches a file opened before, the daemon asks the kernel whether it still holds the file's pages
(``FUSE_NOTIFY_RETRIEVE``), finds them dropped, and prefetches it again.

It prints a line per phase and a progress bar per epoch (images/s, the live hit ratio from the daemon's
stats), then a table: per mode the epoch times, hit ratio and prefetched share of the training reads,
the GETs the proxy forwarded while the job ran (a mount's listing at mount time excluded), the test accuracy and the speed-up over the direct reader; and writes a
PNG of the epoch times and hit ratios (``--png``, default ``WORKDIR/demo.png``).

``--full`` is the run over all 60,000 local training images instead (``--data`` is then a full tree from
``make_fashion_mnist.py``; modes transparent, importance, plan; no S3, no proxy).

The work folder (``--workdir``) holds each run's mountpoint, NVMe cache directory, access trace and daemon
log. A run's cache and mountpoint are removed as soon as it is unmounted, and the traces and training JSON
at the end; the daemon logs (a few KB each: the record of the run, e.g. to ``grep -i corrupt``) and the
PNG stay, and a re-run replaces them. ``--keep`` keeps all of it (and prints how to replay the traces). A
run that fails keeps the folder. The converted dataset (``--data``) is kept; the closing line says how to
remove it.

Ctrl-C (SIGINT) or SIGTERM stops the training, unmounts, waits for the daemon to exit (killing it if it
does not), stops the S3 server and the proxy, and cleans up as above; the exit status is then 130 (143
for SIGTERM), with one line saying so.
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

    On Stop: an ``interruptible`` child (training, stats) and its DataLoader workers get SIGTERM, then
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
            if interruptible:  # SIGTERM: it stops without a word (the demo says what happened)
                for sig in (signal.SIGTERM, signal.SIGKILL):
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


#: mode -> (policy, sampler as the table names it, train_fashion_mnist.py flags); "direct" mounts nothing
MODES = {
    "direct": (None, "shuffle=True", []),
    "transparent": ("static", "shuffle=True", []),
    "plan": ("static", "PlanSampler", ["--plan"]),
    "importance": ("shade", "ShadeSampler", ["--hook"]),
}
BUCKET, PREFIX = "shadefs-demo", "fmnist"


def run_mode(args, name):
    """Train in mode ``name`` (a key of MODES) over ``args.source``; returns the run's record: ``mode``,
    ``policy``, ``sampler``, ``train`` (the trainer's JSON), ``stats`` (the daemon's stats JSON at the end;
    {} for direct), ``trace`` (None for direct), ``gets`` (GETs the proxy forwarded; None without one)."""
    policy, sampler, flags = MODES[name]
    out = os.path.join(args.workdir, f"{name}.train.json")
    args.created.append(out)
    cmd = [sys.executable, os.path.join(HERE, "train_fashion_mnist.py"), "--epochs", args.epochs,
           "--workers", args.workers, "--json", out, "--progress", *flags]
    if not args.full:
        cmd.append("--eval-last")  # the test set is in the bucket too: read it once, at the end
    if args.limit:
        cmd += ["--limit", args.limit]
    stats, trace, args.gets = {}, None, None
    if policy is None:
        gets0 = args.proxy.snapshot()["gets"]
        _run_child(cmd + ["--data", args.source, "--endpoint-url", args.proxy.endpoint])
        args.gets = args.proxy.snapshot()["gets"] - gets0
    else:
        stats, trace = mounted_run(args, name, policy, cmd + ["--drop-pages"])
    with open(out) as f:
        train = json.load(f)
    gets = args.gets
    return {"mode": name, "policy": policy, "sampler": sampler, "stats": stats, "train": train,
            "trace": trace, "gets": gets}


def mounted_run(args, name, policy, cmd) -> tuple:
    """Mount ``args.source`` for mode ``name``, run the trainer ``cmd`` on it, print ``shadefs stats``,
    unmount; returns (the stats JSON, the trace's path)."""
    mnt = os.path.join(args.workdir, f"mnt-{name}")
    cache = os.path.join(args.workdir, f"cache-{name}")
    shutil.rmtree(cache, ignore_errors=True)  # start cold
    log = os.path.join(args.workdir, f"{name}.log")
    if os.path.exists(log):
        os.unlink(log)  # the daemon appends: one run per log, so a grep of it sees this run only
    os.makedirs(mnt, exist_ok=True)
    trace = os.path.join(args.workdir, f"{name}.trace.csv")
    args.created += [mnt, cache, trace, trace + ".scores.csv"]  # not the log: it stays
    args.logs.append(log)
    backend = ["--backend-opt", f"endpoint_url={args.proxy.endpoint}"] if args.proxy else []
    phase(f"mounting {args.source} at {mnt} (RAM {args.ram_cache} + NVMe {args.disk_cache_size} of the "
          f"dataset, policy {policy})")
    try:
        _run_child(SHADEFS + ["mount", args.source, mnt, "--ram-cache", args.ram_cache, "--disk-cache", cache,
                              "--disk-cache-size", args.disk_cache_size, "--policy", policy, "--trace", trace,
                              "--trace-overwrite", "--log-file", log, *backend],
                   interruptible=False)
        gets0 = args.proxy.snapshot()["gets"] if args.proxy else None  # after the mount's listing
        _run_child(cmd + ["--data", mnt])
        if args.proxy:
            args.gets = args.proxy.snapshot()["gets"] - gets0
        print(STATS_NOTE, flush=True)
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
    if not args.keep:  # the cache is a share of the dataset: do not keep one per mode until the end
        shutil.rmtree(cache, ignore_errors=True)
        _rmdir(mnt)
    return stats, trace


def phase(text: str) -> None:
    print(f"\n--- {text}", flush=True)


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)  # only an empty directory: never what a failed unmount left mounted
    except OSError:
        pass


def clean_workdir(args) -> None:
    """Remove what the demo wrote in the work folder, and the folder if it made it and it is now empty."""
    for path in args.created:
        if os.path.isdir(path) and not os.path.islink(path):
            if os.path.basename(path).startswith("mnt-"):
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
            f"{disk / 2**20:.0f} MiB on disk), so the next run need not rebuild it; to remove it: "
            f"rm -rf {data} {data}.complete")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--full", action="store_true",
                   help="all 60,000 local training images instead of a subset over slow S3 (no direct mode)")
    p.add_argument("--data", default=None,
                   help="ImageFolder root with train/ and test/ (default data/fmnist-small, built here; "
                        "--full: data/fmnist, built with make_fashion_mnist.py)")
    p.add_argument("--workdir", default="/tmp/shadefs-demo", help="mountpoints, cache dirs, traces, logs, PNG")
    p.add_argument("--train-images", type=int, default=1500, metavar="N",
                   help="training images in the bucket (default %(default)s)")
    p.add_argument("--test-images", type=int, default=300, metavar="N",
                   help="test images in the bucket (default %(default)s)")
    p.add_argument("--delay-ms", type=float, default=10.0,
                   help="the proxy's one-way delay, ms (default %(default)g: a GET pays twice that on top of "
                        "the server's own time)")
    p.add_argument("--epochs", type=int, default=None, help="default 3 (--full: 2)")
    p.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    p.add_argument("--ram-cache", default="5%", help="RAM tier (default 5%% of the dataset)")
    p.add_argument("--disk-cache-size", default="30%",
                   help="NVMe tier, of what the whole subset would take there: its metadata and segment slack included (default 30%%: about 10%% of the images fit, the rest is this small subset's fixed overhead)")
    p.add_argument("--limit", type=int, default=None, help="train on N samples only (quick check)")
    p.add_argument("--modes", default=None,
                   help="which runs, comma-separated (default direct,transparent,plan,importance; --full: "
                        "transparent,importance,plan)")
    p.add_argument("--png", default=None, help="where to write the picture (default WORKDIR/demo.png)")
    p.add_argument("--keep", action="store_true",
                   help="keep the work folder's caches, traces and daemon logs (default: removed at the end)")
    args = p.parse_args(argv)
    args.modes = (args.modes or ("transparent,importance,plan" if args.full
                                 else "direct,transparent,plan,importance")).split(",")
    for mode in args.modes:
        if mode not in MODES:
            p.error(f"unknown mode {mode!r} (one of {', '.join(MODES)})")
    if args.full and "direct" in args.modes:
        p.error("--full reads the local disk: no direct S3 mode")
    if args.epochs is None:
        args.epochs = 2 if args.full else 3
    for name in ("epochs", "train_images", "test_images", "workers"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.delay_ms < 0:
        p.error("--delay-ms must be >= 0")
    args.data = os.path.abspath(args.data or ("data/fmnist" if args.full else "data/fmnist-small"))
    args.workdir = os.path.abspath(args.workdir)
    args.png = os.path.abspath(args.png or os.path.join(args.workdir, "demo.png"))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.made_workdir = not os.path.isdir(args.workdir)
    os.makedirs(args.workdir, exist_ok=True)
    args.created = []
    args.logs = []  # each mode's daemon log (kept)
    args.left = []  # mountpoints that could not be released
    args.proxy = None
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        runs = run_modes(args)
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


def run_modes(args) -> list:
    """Build or find the dataset, start the slow S3 storage (unless ``--full``), run every mode; stops
    the S3 server and the proxy on the way out, whatever happens."""
    from shadefs.testing.s3 import MotoServer

    args.t0 = time.monotonic()
    moto = None
    try:
        if args.full:
            if not os.path.isdir(os.path.join(args.data, "train")):
                raise SystemExit(f"demo: {args.data} has no train/: build it with make dataset "
                                 f"(scripts/make_fashion_mnist.py {args.data})")
            args.source = args.data
        else:
            moto = MotoServer(own_group=True)  # Ctrl-C reaches the demo, which stops it after the mounts
            args.source = slow_storage(args, moto)
        args.regime = regime_line(args)
        print(f"\n{args.regime}", flush=True)
        runs = []
        for i, mode in enumerate(args.modes):
            policy, sampler, _ = MODES[mode]
            reader = ("S3ImageFolder (s3fs, one GET per sample; no shadefs)" if policy is None
                      else f"ImageFolder on the mount, policy {policy}")
            print(f"\n=== mode {i + 1}/{len(args.modes)}: {mode}: {reader}, {sampler} ===", flush=True)
            runs.append(run_mode(args, mode))
        return runs
    finally:
        old = _quiet()
        try:
            if args.proxy is not None:
                args.proxy.stop()
            if moto is not None:
                moto.stop()
        finally:
            _restore(old)


def slow_storage(args, moto) -> str:
    """Build the subset, start moto, upload the subset to it, start the latency proxy in front (set as
    ``args.proxy``) and measure a GET through it; returns the source URL ``s3://BUCKET/PREFIX``."""
    from shadefs.testing.s3 import AWS_ENV_DROP, DUMMY_AWS_ENV, LatencyProxyProcess
    from shadefs.testing.s3data import probe, upload

    phase(f"building the dataset: {args.train_images:,} training + {args.test_images:,} test images of "
          f"Fashion-MNIST in {args.data}")
    _run_child([sys.executable, os.path.join(HERE, "make_fashion_mnist.py"), args.data, "--limit-train",
                args.train_images, "--limit-test", args.test_images])
    os.environ.update(DUMMY_AWS_ENV)  # the trainers and the shadefs daemons inherit them: moto only
    for k in AWS_ENV_DROP:
        os.environ.pop(k, None)
    phase("starting the S3 server (python -m moto.server) on loopback and uploading the dataset")
    moto.start()
    n = upload(moto.endpoint, BUCKET, PREFIX, args.data, splits=("train", "test"))
    print(f"{n:,} objects in s3://{BUCKET}/{PREFIX}/ on {moto.endpoint}", flush=True)
    phase(f"starting the latency proxy (shadefs/testing/latency_proxy.py), {args.delay_ms:g} ms each way")
    args.proxy = LatencyProxyProcess(moto.port, args.delay_ms, "1gbit", own_group=True)
    args.proxy.start()  # set first: a Ctrl-C while it starts still finds it to stop
    key = next(f"{BUCKET}/{PREFIX}/{os.path.relpath(os.path.join(d, f), args.data)}"
               for d, _, fs in sorted(os.walk(os.path.join(args.data, "train"))) for f in sorted(fs))
    got = probe({"moto": moto.endpoint, "proxy": args.proxy.endpoint}, key, n=20, warmup=2)
    print(f"slow storage: moto's S3 server behind a latency proxy at {args.proxy.endpoint}, "
          f"{args.delay_ms:g} ms each way: it stands in for a remote object store (S3 across a network); a GET "
          f"of one image takes {got['proxy']['median_ms']:.0f} ms through it (median of 20; "
          f"{got['moto']['median_ms']:.0f} ms straight to moto)", flush=True)
    return f"s3://{BUCKET}/{PREFIX}"


def regime_line(args) -> str:
    """The regime the training job runs in (``shadefs.testing.regime.describe``), over the training images'
    bytes."""
    from shadefs.testing.regime import describe

    train = os.path.join(args.data, "train")
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(train) for f in fs)
    return describe("dontneed", dataset_bytes=total)


def summary_rows(runs) -> list:
    """The table's rows: per run, the mode, reader, policy, epoch times (s), hit ratio and prefetched
    share of the training reads, GETs, final test accuracy and the speed-up over the direct run (its
    total epoch time over this run's)."""
    direct = next((r for r in runs if r["policy"] is None), None)
    total = lambda r: sum(e["epoch_time_s"] for e in r["train"]["epochs"])  # noqa: E731
    rows = []
    for r in runs:
        eps = r["train"]["epochs"]
        opens = sum(e.get("opens", 0) for e in eps)
        ratio = lambda k: f"{100 * sum(e[k] for e in eps) / opens:.1f}%" if opens else "-"  # noqa: E731
        rows.append([r["mode"], r["sampler"], r["policy"] or "(no shadefs)",
                     ", ".join(f"{e['epoch_time_s']:.1f}" for e in eps), ratio("hits"), ratio("prefetched"),
                     "-" if r["gets"] is None else f"{r['gets']:,}", f"{r['train']['final_test_acc']:.2f}%",
                     f"{total(direct) / total(r):.2f}x" if direct else "-"])
    return rows


#: printed above each mode's ``shadefs stats``: its hit ratio is not the table's
STATS_NOTE = ("the daemon's counters since the mount (shadefs stats): its \"hit ratio\" counts every open, the "
              "test set's too; the summary's \"train hit ratio\" and the progress bars count the training "
              "reads only")
HEADERS = ["mode", "sampler", "policy", "epoch times (s)", "train hit ratio", "prefetched", "GETs", "test acc",
           "speed-up"]


def print_summary(args, runs) -> None:
    from shadefs.testing.docsection import Table

    where = ("all 60,000 local training images" if args.full
             else f"{args.train_images:,} training images in S3, {args.delay_ms:g} ms each way")
    title = (f"=== summary: {where}; cache = RAM {args.ram_cache} + NVMe {args.disk_cache_size} of the dataset, "
             f"{args.epochs} epochs ({time.monotonic() - args.t0:.0f} s, load {os.getloadavg()[0]:.2f}) ===")
    print()
    print(args.regime)
    print(Table(title, HEADERS, summary_rows(runs),
                "train hit ratio, prefetched = of the training reads: served by the RAM/NVMe tiers; served from a "
                "prefetch (read ahead, not waited for)\nGETs = requests the proxy forwarded to the S3 "
                "server while the job ran (training and test reads; the direct reader's listing; a mount lists "
                "at mount time, before); speed-up = the direct reader's training time "
                "(all epochs) / this mode's").text())
    try:
        plot(args, runs)
        print(f"\npicture: {args.png}")
    except ImportError as e:  # matplotlib is in the test extra, which make demo installs
        print(f"\nno picture: {e} (pip install matplotlib)")
    print()
    if args.keep:
        for line in replay_hint(runs):
            print(line)
        print(f"the work folder {args.workdir} keeps each run's NVMe cache, trace and daemon log (--keep)")
    else:
        print(f"the work folder {args.workdir} was cleaned up (mounts, caches, traces); --keep keeps them, "
              "e.g. to replay the traces with shadefs simulate")
    if args.logs:
        print(logs_note(args.logs, runs))
    print(dataset_note(args.data))


def plot(args, runs) -> None:
    """Write ``args.png``: epoch time per mode and epoch (left), the training reads' hit ratio (solid)
    and prefetched share (dashed) per mode and epoch (right). Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"direct": "tab:red", "transparent": "tab:blue", "plan": "tab:purple", "importance": "tab:green"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in runs:
        eps = r["train"]["epochs"]
        x = [e["epoch"] for e in eps]
        label = f"{r['mode']} ({r['sampler']}" + (f", {r['policy']})" if r["policy"] else ", no shadefs)")
        left.plot(x, [e["epoch_time_s"] for e in eps], marker="o", color=colors[r["mode"]], label=label)
        if r["policy"] is not None:
            right.plot(x, [100 * e.get("hit_ratio", 0) for e in eps], marker="o", color=colors[r["mode"]],
                       label=f"{r['mode']}: hit ratio")
            right.plot(x, [100 * e.get("prefetched", 0) / max(1, e.get("opens", 0)) for e in eps], marker="s",
                       linestyle="--", color=colors[r["mode"]], label=f"{r['mode']}: prefetched")
    for ax, ylabel in ((left, "epoch time, s"), (right, "% of the epoch's reads")):
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.set_xticks(range(1, args.epochs + 1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    left.set_ylim(bottom=0)
    right.set_ylim(0, 100)
    left.set_title("epoch time (lower is better)")
    right.set_title("served from the cache (solid) or a prefetch (dashed)")
    where = ("60,000 local images" if args.full else f"{args.train_images:,} images in S3 (moto) behind a "
             f"{args.delay_ms:g} ms each way latency proxy")
    fig.suptitle(f"shadefs demo: {where}; cache RAM {args.ram_cache} + NVMe {args.disk_cache_size}\n"
                 "the job drops each image's pages after reading it (a dataset larger than memory)", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(args.png), exist_ok=True)
    fig.savefig(args.png, dpi=100)
    plt.close(fig)


def replay_hint(runs) -> list:
    """Lines telling the user how to replay each run's trace at the mount's real cache bytes.

    ``runs``: dicts with ``mode``, ``policy``, ``trace`` and ``stats`` (the stats JSON: the tiers'
    ``capacity_bytes``). The simulator models one cache, so it gets RAM + NVMe bytes (the live tiers are
    exclusive: together they hold at most that many bytes); ``shade`` gets the importance the daemon
    wrote at unmount (``TRACE.scores.csv``).
    """
    lines = ["replay a run's trace against every policy and Belady's OPT at the mount's real cache size:"]
    for r in runs:
        if not r.get("trace"):
            continue  # the direct reader: no mount, no trace
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
