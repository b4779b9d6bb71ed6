#!/usr/bin/env python3
"""Time to accuracy over slow S3 at full scale: shuffle + static, PlanSampler + static, ShadeSampler + shade.

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
prefetched) are written to ``--json`` after each run; SIGINT/SIGTERM stops the current run, unmounts,
keeps the epochs it finished (marked ``partial``) and writes the JSON and the report.

It prints per mode and epoch the test accuracy (mean and min..max over seeds), the epoch time and hit
ratio, and per mode the wall time to ``--target`` % and to uniform's (shuffle + static) final mean
accuracy; and draws test accuracy against wall time (``--png``). ``--report JSON`` redoes the report and
the picture from a saved JSON without training.

    python scripts/bench_tta.py --data data/fmnist [--epochs 8] [--seeds 0,1,2] [--delay-ms 1]
        [--pct 10%] [--workers 2] [--json tta.json] [--png docs/img/tta.png] [--modes shuffle,plan,shade]
        [--target 85 [--target 75]]
    python scripts/bench_tta.py --report tta.json [--traces WORKDIR] [--png docs/img/tta.png]

Modes: ``shuffle`` (shuffle=True + static), ``plan`` (PlanSampler + static), ``shade`` (ShadeSampler +
ScoreReporter + shade, its defaults), ``shade-rep1`` (the same with ``rep_factor=1``: docs/hooks.md).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
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


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    ap.add_argument("--json", default="tta.json", help="raw results (default %(default)s)")
    ap.add_argument("--png", default="tta.png", help="accuracy vs wall time (default %(default)s)")
    ap.add_argument("--traces", metavar="DIR", help="with --report: the run's work folder, whose mount traces "
                    "give the distinct images read per epoch")
    ap.add_argument("--workdir", default=None, help="mountpoints, run logs (default a new /tmp folder)")
    a = ap.parse_args(argv)
    a.modes = a.modes.split(",")
    for m in a.modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}")
    a.seeds = [int(s) for s in a.seeds.split(",")]
    a.target = a.target or [85.0]
    if not a.report and not a.data:
        ap.error("--data or --report is needed")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.report:
        with open(a.report) as f:
            saved = json.load(f)
        report(saved, a.target, a.png, a.traces)
        return 0
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    saved = {"setup": {"delay_ms": a.delay_ms, "pct": a.pct, "epochs": a.epochs, "workers": a.workers,
                       "seeds": a.seeds, "modes": a.modes, "data": os.path.abspath(a.data)},
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
        print(f"{n:,} training images in s3://{BUCKET}/{PREFIX} ({time.monotonic() - t0:.0f} s)", flush=True)
        with LatencyProxyProcess(moto.port, delay_ms=a.delay_ms, rate="1gbit") as proxy:
            for seed in a.seeds:
                for mode in a.modes:
                    one_run(a, work, proxy, mode, seed, saved["runs"])
                    dump(a.json, saved)


def one_run(a, work, proxy, mode, seed, runs: list) -> None:
    """Mount, train ``a.epochs`` epochs in ``mode`` with ``seed``, unmount; appends the run's record to
    ``runs`` (also when stopped part-way: ``partial`` True, the epochs it finished)."""
    label, policy, flags = MODES[mode]
    name = f"{mode}-{seed}"
    mnt, out, log = (os.path.join(work, f"mnt-{name}"), os.path.join(work, f"{name}.json"),
                     os.path.join(work, f"{name}.log"))
    os.makedirs(mnt, exist_ok=True)
    print(f"... {label}, seed {seed} (load {os.getloadavg()[0]:.2f})", flush=True)
    # --no-kernel-cache: the kernel's page cache would otherwise keep every file read through the mount (a
    # snapshot) and serve later epochs from memory, whatever the tiers' size
    subprocess.run(SHADEFS + ["mount", f"s3://{BUCKET}/{PREFIX}", mnt, "--ram-cache", a.pct, "--policy", policy,
                              "--no-kernel-cache", "--trace", os.path.join(work, f"{name}.trace.csv"),
                              "--trace-overwrite",
                              "--log-file", os.path.join(work, f"{name}.daemon.log"),
                              "--backend-opt", f"endpoint_url={proxy.endpoint}"], check=True, capture_output=True)
    gets0 = proxy.snapshot()["gets"]
    partial = True
    try:
        with open(log, "w") as lf:
            proc = subprocess.Popen([sys.executable, os.path.join(HERE, "train_fashion_mnist.py"), "--data", mnt,
                                     "--test-data", os.path.abspath(a.data), "--epochs", str(a.epochs),
                                     "--workers", str(a.workers), "--seed", str(seed), "--json", out, *flags],
                                    stdout=lf, stderr=subprocess.STDOUT, process_group=0)
            try:
                rc = proc.wait()
            except Stop:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
                raise
            if rc != 0:
                raise subprocess.CalledProcessError(rc, "train_fashion_mnist.py (see %s)" % log)
            partial = False
    finally:
        gets = proxy.snapshot()["gets"] - gets0
        for _ in range(50):
            if subprocess.run(SHADEFS + ["umount", mnt], capture_output=True).returncode == 0:
                break
            time.sleep(0.2)
        train = {"epochs": []}
        if os.path.exists(out):
            with open(out) as f:
                train = json.load(f)
        rec = {"mode": mode, "label": label, "policy": policy, "seed": seed, "epochs": train["epochs"],
               "gets": gets, "partial": partial, "load": list(os.getloadavg())}
        runs.append(rec)
    accs = ", ".join(f"{e['test_acc']:.2f}" for e in rec["epochs"])
    times = ", ".join(f"{e['epoch_time_s']:.0f}" for e in rec["epochs"])
    print(f"    epochs {times} s; test acc {accs}; GETs {gets:,}", flush=True)


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
    for r in runs:
        if r.get("partial"):
            print(f"note: {r['label']} seed {r['seed']} stopped after {len(r['epochs'])} epochs")
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

        def tt(t):
            got = [time_to(r, t) for r in full]
            ok = [x for x in got if x is not None]
            return (f"{statistics.mean(ok):.0f} ({min(ok):.0f}..{max(ok):.0f}), {len(ok)}/{len(full)} seeds"
                    if ok else f"not reached (0/{len(full)})")
        totals = [sum(e["epoch_time_s"] for e in r["epochs"]) for r in full]
        print(f"{MODES[m][0]} | {len(full)} | {spread(e1)} | {spread(later)} | {spread(totals)} | "
              f"{100 * hits / opens if opens else 0:.1f}% | "
              f"{statistics.mean(r['gets'] for r in full) if full else 0:,.0f} | "
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


if __name__ == "__main__":
    sys.exit(main())
