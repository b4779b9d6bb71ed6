"""Time to accuracy over slow S3 at full scale: shuffle + static, PlanSampler + static, ShadeSampler + shade.

Regime: **regime** (``--no-kernel-cache``: every open the tiers do not serve reads S3). Limit: moto's
CPU per GET (about 2.8 ms on this machine) times the misses.

The training split of a ``make_fashion_mnist.py`` tree (60,000 PNGs) goes into a bucket on moto's S3 server
(``python -m moto.server``) behind ``shadefs/testing/latency_proxy.py`` (``--delay-ms`` each way), the
rig of ``make demo``. Per (seed, mode) the bucket is mounted fresh (``--ram-cache PCT``, cold) and
``train_fashion_mnist.py`` trains its small CNN (two conv + two FC layers, SGD lr 0.01 momentum 0.9,
batch 64; the same model and settings in every mode) through the mount for ``--epochs`` epochs. The test
set (10,000 images) is read from the local tree (``--test-data``) after every epoch, so that the
evaluation neither pays slow reads nor passes through the cache under test; the wall time counted is the
training epochs' (evaluation excluded).

Runs go seed by seed, every mode within a seed, so a grid stopped early still compares the modes on the
same seeds. The raw results (every run's per-epoch record: loss, epoch time, test accuracy, opens, hits,
prefetched; the proxy's GETs at the end of each epoch's record; the mount's seconds; ``/proc/loadavg``
before and after) are written to ``--json`` after each run; SIGINT/SIGTERM stops the current run,
unmounts, keeps the epochs it finished (marked ``partial``) and writes the JSON and the report.

Limits, so that a grid over a large bucket fits a time slot: ``--run-timeout SECONDS`` bounds each run,
mount included (moto lists 60,000 objects in minutes); ``--until HH:MM`` (UTC) bounds them all: each run
gets at most the time left, and none starts after it. A run stopped by either is killed (the training's
process group), unmounted, and kept with the epochs it finished (``partial``, ``stopped``).
``--stop-after N`` ends each run once N epochs are recorded, while the samplers are still told
``--epochs`` (the job they plan and announce is the longer one): the first N epochs of an
``--epochs``-epoch job.

It prints per mode and epoch the test accuracy (mean and min..max over seeds), the epoch time and hit
ratio, and per mode the wall time to ``--target`` % and to uniform's (shuffle + static) final mean
accuracy; and draws test accuracy against wall time (``--png``). ``--report JSON`` redoes the report and
the picture from a saved JSON without training.

    python -m shadefs.bench tta --data data/fmnist [--epochs 8] [--seeds 0,1,2] [--delay-ms 1]
        [--pct 10%] [--workers 2] [--json tta.json] [--png docs/img/tta.png] [--modes shuffle,plan,shade]
        [--target 85 [--target 75]] [--run-timeout SECONDS] [--until HH:MM] [--stop-after N]
    python -m shadefs.bench tta --report tta.json [--traces WORKDIR] [--png docs/img/tta.png]

Modes: ``shuffle`` (shuffle=True + static), ``plan`` (PlanSampler + static), ``shade`` (ShadeSampler +
ScoreReporter + shade, its defaults), ``shade-rep1`` (the same with ``rep_factor=1``: docs/hooks.md).
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from shadefs.bench.runner import ROOT

SCRIPTS = os.path.join(ROOT, "scripts")  # the examples a user runs (train_fashion_mnist.py)
SHADEFS = [sys.executable, "-m", "shadefs"]
BUCKET, PREFIX = "bench-tta", "fmnist"
#: mode -> (label, policy, train_fashion_mnist.py flags)
MODES = {
    "shuffle": ("shuffle=True + static", "static", []),
    "plan": ("PlanSampler + static", "static", ["--plan"]),
    "shade": ("ShadeSampler + shade", "shade", ["--hook"]),
    "shade-rep1": ("ShadeSampler(rep_factor=1) + shade", "shade", ["--hook", "--rep-factor", "1"]),
}
COLORS = {"shuffle": "tab:blue", "plan": "tab:purple", "shade": "tab:green", "shade-rep1": "tab:olive"}


class Stop(BaseException):
    pass


def _on_signal(signum, frame):
    raise Stop()




def until_epoch(hhmm: str, now: float) -> float:
    """The Unix time of the next ``HH:MM`` UTC after ``now`` (today's, or tomorrow's if today's has passed).

    Raises:
        ValueError: not ``HH:MM`` with 0 <= HH < 24, 0 <= MM < 60.
    """
    hh, sep, mm = hhmm.partition(":")
    if not sep or not hh.isdigit() or not mm.isdigit() or not (0 <= int(hh) < 24 and 0 <= int(mm) < 60):
        raise ValueError("expected HH:MM (UTC)")
    day = int(now // 86400) * 86400
    t = day + int(hh) * 3600 + int(mm) * 60
    return t if t > now else t + 86400


def run_limit(run_timeout: float, until, now: float):
    """Seconds a run starting at ``now`` (Unix time) may take: ``run_timeout`` (0: no limit), capped by the
    time left until ``until`` (Unix time or None); None when neither limits it."""
    limits = ([run_timeout] if run_timeout > 0 else []) + ([until - now] if until is not None else [])
    return min(limits) if limits else None


#: the runner's common options this benchmark honours
COMMON = ('json',)


def add_arguments(ap) -> None:
    ap.add_argument("--data", help="make_fashion_mnist.py tree (train/ goes to S3; test/ is read locally)")
    ap.add_argument("--report", metavar="JSON", help="only print the report and draw the PNG of a saved run")
    ap.add_argument("--delay-ms", type=float, default=1.0, help="the proxy's one-way delay (default %(default)g)")
    ap.add_argument("--pct", default="10%", help="RAM cache, of the training set's bytes (default %(default)s)")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--modes", default="shuffle,plan,shade", help=f"some of {','.join(MODES)}")
    ap.add_argument("--target", type=float, action="append",
                    help="test accuracy %% to reach; repeatable (default 85)")
    ap.add_argument("--png", default="tta.png", help="accuracy vs wall time (default %(default)s)")
    ap.add_argument("--traces", metavar="DIR", help="with --report: the run's work folder, whose mount traces "
                    "give the distinct images read per epoch")
    ap.add_argument("--workdir", default=None, help="mountpoints, run logs (default a new /tmp folder)")
    ap.add_argument("--run-timeout", type=float, default=0.0, metavar="SECONDS",
                    help="stop a (seed, mode) run, its mount included, after this long; its finished epochs are "
                    "kept, marked partial (default 0: no limit)")
    ap.add_argument("--until", metavar="HH:MM", help="UTC time by which every run ends (each gets at most the "
                    "time left; none starts after it)")
    ap.add_argument("--stop-after", type=int, default=0, metavar="N",
                    help="end each run after N epochs (the samplers still plan --epochs; default 0: all)")
    ap.set_defaults(json='tta.json')


def check_args(a, bench) -> None:
    """Turn the options' text into values (modes, seeds, targets, ``--until`` as a time); a bad one stops the
    run (:meth:`Bench.error`)."""
    a.modes = a.modes.split(",")
    for m in a.modes:
        if m not in MODES:
            bench.error(f"unknown mode {m!r}")
    a.seeds = [int(s) for s in a.seeds.split(",")]
    a.target = a.target or [85.0]
    if not a.report and not a.data:
        bench.error("--data or --report is needed")
    if a.run_timeout < 0 or a.stop_after < 0:
        bench.error("--run-timeout and --stop-after must be >= 0")
    try:
        a.until = None if a.until is None else until_epoch(a.until, time.time())
    except ValueError as e:
        bench.error(f"--until {a.until}: {e}")


def run(a, bench):
    check_args(a, bench)
    if a.report:
        with open(a.report) as f:
            saved = json.load(f)
        report(saved, a.target, a.png, a.traces)
        return 0
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    saved = {"setup": {"delay_ms": a.delay_ms, "pct": a.pct, "epochs": a.epochs, "workers": a.workers,
                       "seeds": a.seeds, "modes": a.modes, "data": os.path.abspath(a.data),
                       "run_timeout_s": a.run_timeout, "stop_after": a.stop_after,
                       "until": None if a.until is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(a.until))},
             "load_start": list(os.getloadavg()), "runs": []}
    try:
        grid(a, saved)
    except Stop:
        print("bench_tta: stopped; the runs so far are kept", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        saved["load_end"] = list(os.getloadavg())
        dump(a.json, saved)
    if saved["runs"]:
        report(saved, a.target, a.png, a.workdir)
    return 0


def dump(path: str, saved: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(saved, f, indent=1)
    os.replace(path + ".tmp", path)


def grid(a, saved) -> None:
    from shadefs.testing.s3 import AWS_ENV_DROP, DUMMY_AWS_ENV, LatencyProxyProcess, MotoServer
    from shadefs.testing.s3data import upload

    os.environ.update(DUMMY_AWS_ENV)
    for k in AWS_ENV_DROP:
        os.environ.pop(k, None)
    work = a.workdir = a.workdir or tempfile.mkdtemp(prefix="bench-tta-")
    os.makedirs(work, exist_ok=True)
    t0 = time.monotonic()
    with MotoServer(log_file=os.path.join(work, "moto.log")) as moto:
        n = upload(moto.endpoint, BUCKET, PREFIX, a.data, splits=("train",))
        saved["setup"]["train_images"] = n
        saved["setup"]["upload_s"] = round(time.monotonic() - t0, 1)
        print(f"{n:,} training images in s3://{BUCKET}/{PREFIX} ({time.monotonic() - t0:.0f} s)", flush=True)
        with LatencyProxyProcess(moto.port, delay_ms=a.delay_ms, rate="1gbit") as proxy:
            for seed in a.seeds:
                for mode in a.modes:
                    if a.until is not None and time.time() >= a.until:
                        print(f"... {MODES[mode][0]}, seed {seed}: not started, past --until", flush=True)
                        continue
                    one_run(a, work, proxy, mode, seed, saved["runs"])
                    dump(a.json, saved)


def loadavg() -> str:
    """``/proc/loadavg`` as it reads (1, 5, 15 min, runnable/threads, last pid)."""
    with open("/proc/loadavg") as f:
        return f.read().strip()


def _epochs_recorded(path: str, seen: list) -> int:
    """Epochs in the training's ``--json`` so far (re-read only when its mtime changed; ``seen`` caches
    ``[mtime_ns, count]``)."""
    try:
        mtime = os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return 0
    if mtime != seen[0]:
        try:
            with open(path) as f:
                seen[1] = len(json.load(f)["epochs"])
            seen[0] = mtime
        except (ValueError, KeyError, OSError):  # written atomically; a failed read is retried
            pass
    return seen[1]


def _kill_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM ``proc``'s process group (the training and its DataLoader workers), SIGKILL after ``grace_s``."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()


def _unmount(mnt: str) -> None:
    for _ in range(50):
        if not os.path.ismount(mnt):  # (a mount stopped while it listed the bucket never mounted)
            return
        if subprocess.run(SHADEFS + ["umount", mnt], capture_output=True).returncode == 0:
            return
        time.sleep(0.2)
    subprocess.run(SHADEFS + ["umount", "--force", mnt], capture_output=True)


def one_run(a, work, proxy, mode, seed, runs: list) -> None:
    """Mount, train ``a.epochs`` epochs in ``mode`` with ``seed`` (ended after ``a.stop_after`` epochs if set),
    unmount; appends the run's record to ``runs`` (also when stopped part-way, by a signal or the run's
    time limit: ``partial`` True, the epochs it finished, ``stopped`` says why)."""
    label, policy, flags = MODES[mode]
    name = f"{mode}-{seed}"
    mnt, out, log = (os.path.join(work, f"mnt-{name}"), os.path.join(work, f"{name}.json"),
                     os.path.join(work, f"{name}.log"))
    os.makedirs(mnt, exist_ok=True)
    if os.path.exists(out):
        os.unlink(out)
    load0, t_run = loadavg(), time.monotonic()
    limit = run_limit(a.run_timeout, a.until, time.time())
    deadline = None if limit is None else t_run + limit
    print(f"... {label}, seed {seed} ({time.strftime('%H:%M:%S', time.gmtime())} UTC, load {load0}"
          + (f", limit {limit:.0f} s" if limit is not None else "") + ")", flush=True)
    rec = {"mode": mode, "label": label, "policy": policy, "seed": seed, "epochs": [], "gets": 0,
           "gets_at_epoch": [], "partial": True, "stopped": None, "limit_s": limit, "mount_s": None,
           "loadavg_start": load0, "start_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    gets0, mounted = None, False
    try:
        # --no-kernel-cache: the kernel's page cache would otherwise keep every file read through the mount
        # (a snapshot) and serve later epochs from memory, whatever the tiers' size. read_timeout=60: moto
        # filters and sorts the whole bucket for every listing page (seconds per page at 60,000 objects on a
        # loaded machine, minutes for the listing), against 15 s per attempt by default; a GET of these
        # small objects takes milliseconds, so the reads are not changed by it.
        mount = subprocess.Popen(SHADEFS + ["mount", f"s3://{BUCKET}/{PREFIX}", mnt, "--ram-cache", a.pct,
                                            "--policy", policy, "--no-kernel-cache",
                                            "--trace", os.path.join(work, f"{name}.trace.csv"), "--trace-overwrite",
                                            "--log-file", os.path.join(work, f"{name}.daemon.log"),
                                            "--backend-opt", f"endpoint_url={proxy.endpoint}",
                                            "--backend-opt", "read_timeout=60"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            mout, _ = mount.communicate(timeout=None if deadline is None else max(1.0, deadline - time.monotonic()))
        except (subprocess.TimeoutExpired, Stop) as e:
            # the mount command stops its daemon on SIGINT, so nothing mounts later behind our back
            mount.send_signal(signal.SIGINT)
            mount.communicate(timeout=60)
            mounted = True  # whatever it got to: unmounted below
            if isinstance(e, Stop):
                raise
            rec["stopped"] = "run timeout (mounting)"
            return
        mounted = True
        if mount.returncode != 0:
            raise RuntimeError(f"shadefs mount exited {mount.returncode}: {mout.strip()}")
        rec["mount_s"] = round(time.monotonic() - t_run, 1)
        print(f"    mounted in {rec['mount_s']:.0f} s", flush=True)
        gets0 = proxy.snapshot()["gets"]
        with open(log, "w") as lf:
            proc = subprocess.Popen([sys.executable, os.path.join(SCRIPTS, "train_fashion_mnist.py"), "--data", mnt,
                                     "--test-data", os.path.abspath(a.data), "--epochs", str(a.epochs),
                                     "--workers", str(a.workers), "--seed", str(seed), "--json", out, *flags],
                                    stdout=lf, stderr=subprocess.STDOUT, process_group=0)
            seen = [None, 0]
            try:
                while True:
                    try:
                        rc = proc.wait(0.5)
                    except subprocess.TimeoutExpired:
                        rc = None
                    done = _epochs_recorded(out, seen)
                    while len(rec["gets_at_epoch"]) < done:  # the proxy's GETs when each epoch's record appeared
                        rec["gets_at_epoch"].append(proxy.snapshot()["gets"] - gets0)
                    if rc is not None:
                        break
                    if a.stop_after and done >= a.stop_after:
                        _kill_group(proc)
                        rec["stopped"] = f"after {done} epochs (--stop-after)"
                        rec["partial"] = False
                        return
                    if deadline is not None and time.monotonic() >= deadline:
                        _kill_group(proc)
                        rec["stopped"] = f"run timeout ({limit:.0f} s)"
                        return
            except Stop:
                _kill_group(proc)
                rec["stopped"] = "signal"
                raise
            if rc != 0:
                rec["stopped"] = f"training exited {rc}"
                raise subprocess.CalledProcessError(rc, "train_fashion_mnist.py (see %s)" % log)
            rec["partial"] = False
    finally:
        if gets0 is not None:
            rec["gets"] = proxy.snapshot()["gets"] - gets0
        if mounted:
            _unmount(mnt)
        if os.path.exists(out):
            with open(out) as f:
                rec["epochs"] = json.load(f)["epochs"]
        if a.stop_after:  # a record written after the stop (the kill came late) is not counted
            rec["epochs"] = rec["epochs"][:a.stop_after]
        rec["run_s"] = round(time.monotonic() - t_run, 1)
        rec["loadavg_end"] = loadavg()
        rec["load"] = [float(x) for x in rec["loadavg_end"].split()[:3]]
        runs.append(rec)
        accs = ", ".join(f"{e['test_acc']:.2f}" for e in rec["epochs"])
        times = ", ".join(f"{e['epoch_time_s']:.0f}" for e in rec["epochs"])
        print(f"    epochs {times} s; test acc {accs}; GETs {rec['gets']:,}"
              + (f"; stopped: {rec['stopped']}" if rec["stopped"] else "")
              + f" ({time.strftime('%H:%M:%S', time.gmtime())} UTC, load {rec['loadavg_end']})", flush=True)


def coverage(trace: str, n_train: int) -> list:
    """Per epoch of a mount's trace (``n_train`` training opens each; the test set is read elsewhere):
    ``{"opens", "distinct", "new", "seen", "hit_ratio"}``: distinct files opened, files opened for the
    first time in the run, files opened so far (all as counts)."""
    import csv

    with open(trace, newline="") as f:
        rows = [(r["path"], r["outcome"]) for r in csv.DictReader(f)]
    seen, out = set(), []
    for i in range(0, len(rows), n_train):
        ep = rows[i:i + n_train]
        paths = {p for p, _ in ep}
        new = len(paths - seen)
        seen |= paths
        out.append({"opens": len(ep), "distinct": len(paths), "new": new, "seen": len(seen),
                    "hit_ratio": sum(o != "miss" for _, o in ep) / max(1, len(ep))})
    return out


def cumulative(run) -> list:
    """(wall seconds of training so far, test accuracy) after each epoch of ``run``."""
    wall, pts = 0.0, []
    for e in run["epochs"]:
        wall += e["epoch_time_s"]
        pts.append((wall, e["test_acc"]))
    return pts


def time_to(run, target: float):
    """Training seconds until the first epoch whose test accuracy is >= ``target``; None if never."""
    return next((w for w, acc in cumulative(run) if acc >= target), None)


def spread(xs) -> str:
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.2f}"
    return f"{statistics.mean(xs):.2f} ({min(xs):.2f}..{max(xs):.2f})"


def report(saved: dict, target: list, png: str, traces: str = None) -> None:
    s = saved["setup"]
    runs = [r for r in saved["runs"] if r["epochs"]]
    modes = [m for m in s["modes"] if any(r["mode"] == m for r in runs)]
    print(f"\nFashion-MNIST, {s.get('train_images', 0):,} training images in S3 (moto) behind a {s['delay_ms']:g} ms each way latency "
          f"proxy; RAM cache {s['pct']}; {s['workers']} DataLoader workers, batch 64; load "
          f"{' '.join(f'{x:.2f}' for x in saved['load_start'])} at the start, "
          f"{' '.join(f'{x:.2f}' for x in saved.get('load_end', []))} at the end")
    for r in saved["runs"]:
        if r.get("partial"):
            print(f"note: {r['label']} seed {r['seed']} stopped after {len(r['epochs'])} epochs"
                  + (f" ({r['stopped']})" if r.get("stopped") else ""))
    if not runs:
        print("no run finished an epoch: nothing to report, no picture drawn")
        return
    print_runs(runs)
    print("\ntest accuracy per epoch, % (mean (min..max) over seeds)")
    n_ep = max(len(r["epochs"]) for r in runs)
    print("epoch | " + " | ".join(MODES[m][0] for m in modes))
    for i in range(n_ep):
        cells = []
        for m in modes:
            accs = [r["epochs"][i]["test_acc"] for r in runs if r["mode"] == m and len(r["epochs"]) > i]
            cells.append(spread(accs) + (f" [{len(accs)} seeds]" if 0 < len(accs) < len(s["seeds"]) else ""))
        print(f"{i + 1} | " + " | ".join(cells))
    print("\nepoch time, s (mean (min..max) over seeds and epochs 2+) and hit ratio of the training reads")
    uni_runs = [r for r in runs if r["mode"] == "shuffle" and len(r["epochs"]) == n_ep]
    uniform = statistics.mean(r["epochs"][-1]["test_acc"] for r in uni_runs) if uni_runs else None
    print(f"uniform's final accuracy (shuffle, epoch {n_ep}, mean): "
          + (f"{uniform:.2f} %" if uniform is not None else "-"))
    print("mode | seeds | epoch 1 s | epochs 2+ s | all epochs s | hit ratio 2+ | GETs per run | final acc | "
          + " | ".join(f"time to {t:g} % (s)" for t in target) + " | time to uniform's final (s)")
    for m in modes:
        rs = [r for r in runs if r["mode"] == m]
        full = [r for r in rs if len(r["epochs"]) == n_ep]
        e1 = [r["epochs"][0]["epoch_time_s"] for r in rs if r["epochs"]]
        later = [e["epoch_time_s"] for r in rs for e in r["epochs"][1:]]
        opens = sum(e.get("opens", 0) for r in rs for e in r["epochs"][1:])
        hits = sum(e.get("hits", 0) for r in rs for e in r["epochs"][1:])

        def tt(t):  # every run counts, also one stopped early that got there
            ok = [x for x in (time_to(r, t) for r in rs) if x is not None]
            return (f"{statistics.mean(ok):.0f} ({min(ok):.0f}..{max(ok):.0f}), {len(ok)}/{len(rs)} seeds"
                    if ok else f"not reached (0/{len(rs)})")
        totals = [sum(e["epoch_time_s"] for e in r["epochs"]) for r in full]
        early = len(rs) - len(full)
        seeds = f"{len(rs)} ({early} stopped early)" if early else f"{len(rs)}"
        gets = f"{statistics.mean(r['gets'] for r in full):,.0f}" if full else "-"  # (whole runs only)
        print(f"{MODES[m][0]} | {seeds} | {spread(e1)} | {spread(later)} | {spread(totals)} | "
              f"{100 * hits / opens if opens else 0:.1f}% | {gets} | "
              f"{spread([r['epochs'][-1]['test_acc'] for r in full])} | "
              + " | ".join(tt(t) for t in target) + " | "
              + (tt(uniform) if uniform is not None else "-"))
    if traces:
        n = s.get("train_images") or 0
        print(f"\ndistinct training images read per epoch (of {n:,}; from the mounts' traces, mean over seeds) "
              "/ images read at least once so far")
        print("epoch | " + " | ".join(MODES[m][0] for m in modes))
        cov = {}
        for m in modes:
            for r in runs:
                path = os.path.join(traces, f"{m}-{r['seed']}.trace.csv")
                if r["mode"] == m and os.path.exists(path):
                    cov.setdefault(m, []).append(coverage(path, n))
        for i in range(n_ep):
            cells = []
            for m in modes:
                eps = [c[i] for c in cov.get(m, []) if len(c) > i]
                cells.append(f"{statistics.mean(e['distinct'] for e in eps) / n:.1%} / "
                             f"{statistics.mean(e['seen'] for e in eps) / n:.1%}" if eps else "-")
            print(f"{i + 1} | " + " | ".join(cells))
        saved["coverage"] = cov
    try:
        plot(saved, runs, modes, target, png)
        print(f"\npicture: {png}")
    except ImportError as e:
        print(f"\nno picture: {e}")


def gets_per_epoch(run) -> list:
    """The proxy's GETs between the appearances of successive epochs' records (each epoch's reads, and
    whatever was prefetched during the evaluation before it); [] for runs without ``gets_at_epoch``."""
    at = run.get("gets_at_epoch") or []
    return [b - a for a, b in zip([0] + at[:-1], at)]


def print_runs(runs) -> None:
    """One row per run and epoch: seconds, the training reads' opens, hits, prefetched and hit ratio, the
    proxy's GETs, test accuracy; with the run's mount seconds and /proc/loadavg before and after."""
    print("\nper run and epoch: epoch s | opens | hits | prefetched | hit ratio | GETs | test acc %")
    print("mode | seed | epoch | epoch s | opens | hits | prefetched | hit ratio | GETs | test acc")
    for r in runs:
        gets = gets_per_epoch(r)
        for i, e in enumerate(r["epochs"]):
            print(f"{MODES[r['mode']][0]} | {r['seed']} | {e['epoch']} | {e['epoch_time_s']:.1f} | "
                  f"{e.get('opens', 0):,} | {e.get('hits', 0):,} | {e.get('prefetched', 0):,} | "
                  f"{100 * e.get('hit_ratio', 0):.1f} % | {gets[i] if i < len(gets) else '-'} | {e['test_acc']:.2f}")
        if r.get("mount_s") is not None or r.get("loadavg_start"):
            after = r["gets"] - (r["gets_at_epoch"][-1] if r.get("gets_at_epoch") else 0)
            print(f"    mount {r.get('mount_s')} s; run {r.get('run_s')} s; GETs after the last record "
                  f"{after:,}; load {r.get('loadavg_start')} -> {r.get('loadavg_end')}")


def plot(saved, runs, modes, target, png) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = saved["setup"]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for m in modes:
        for i, r in enumerate(r for r in runs if r["mode"] == m):
            pts = cumulative(r)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, color=COLORS[m],
                    alpha=0.8, linewidth=1, label=f"{MODES[m][0]}" if i == 0 else None)
    for t in target:
        ax.axhline(t, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("wall time of the training epochs, s (evaluation excluded)")
    ax.set_ylabel("test accuracy, %")
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"Fashion-MNIST {s.get('train_images', 0):,} images in S3 (moto + {s['delay_ms']:g} ms proxy), RAM cache {s['pct']}: "
                 f"one line per seed", fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
