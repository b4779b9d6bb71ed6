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
import csv
import datetime
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

from shadefs import sim
from shadefs.bench.runner import ROOT
from shadefs.testing import Mount, docsection, unmount

SCRIPTS = os.path.join(ROOT, "scripts")  # the examples a user runs (train_fashion_mnist.py)
REPO = ROOT

TRAIN_SCRIPT = os.path.join(SCRIPTS, "train_fashion_mnist.py")
DOC = os.path.join(REPO, "docs", "results", "hit_ratio.md")
IMG_DIR = os.path.join(REPO, "docs", "img")
START, END = docsection.markers("bench_hit_ratio")
SAMPLERS = ("uniform", "importance", "plan", "importance-noplan", "importance-prev")
POLICIES = ("lru", "static", "shade")
# "all": both base samplers with every policy, plus the announced-plan modes (PlanSampler +
# static; ShadeSampler without its plan + shade, beside "importance", which announces its plan by default)
ALL_MODES = [(s, p) for s in SAMPLERS[:2] for p in POLICIES] + [("plan", "static"), ("importance-noplan", "shade")]
SAMPLER_LABEL = {"uniform": "uniform (shuffle=True)", "importance": "ShadeSampler (PADS, announces its plan)",
                 "plan": "PlanSampler (uniform, announced)", "importance-noplan": "ShadeSampler (PADS), no plan",
                 "importance-prev": "ShadeSampler, plan without lookahead (cdf draw)"}
SAMPLER_FLAGS = {"uniform": [], "importance": ["--hook"], "plan": ["--plan"],
                 "importance-noplan": ["--hook", "--no-plan"],
                 "importance-prev": ["--hook", "--no-lookahead", "--draw", "cdf"]}
HIT_OUTCOMES = ("ram", "disk", "shared")   # trace outcomes served by a tier; "prefetch" / "late" are backend reads
GOAL_SIZE = 10.0          # percent: where SHADE's headline (x LRU) is checked
GOAL_OPT = 0.95           # shade >= 95 % of OPT
GOAL_LRU = 4.5            # shade >= 4.5x LRU
GOAL_ACC = 1.0            # importance within 1 point of uniform accuracy

_T0 = time.monotonic()


def progress(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s] {msg}", flush=True)


# -- dataset layout -------------------------------------------------------------------------------------

def list_classes(train_dir: str) -> Dict[str, List[str]]:
    """{class: sorted file names} of an ImageFolder split."""
    out = {}
    for c in sorted(os.listdir(train_dir)):
        d = os.path.join(train_dir, c)
        if os.path.isdir(d):
            out[c] = sorted(f for f in os.listdir(d) if os.path.isfile(os.path.join(d, f)))
    if not out:
        raise SystemExit(f"error: {train_dir} has no class folders")
    return out


def prepare_source(data: str, workdir: str, limit: Optional[int]) -> Tuple[str, int, int]:
    """The directory to mount (class folders at its root), its file count and total bytes.

    Without ``limit``: DATA/train itself. With it: WORKDIR/subset-N, symlinks to the first files of each
    class (sorted names), N in all, spread as evenly as possible over the classes.
    """
    train = os.path.join(data, "train")
    classes = list_classes(train)
    if limit is None or limit >= sum(map(len, classes.values())):
        src = train
        files = [os.path.join(train, c, f) for c, fs in classes.items() for f in fs]
    else:
        src = os.path.join(workdir, f"subset-{limit}")
        shutil.rmtree(src, ignore_errors=True)
        names = list(classes)
        per = {c: limit // len(names) + (1 if i < limit % len(names) else 0) for i, c in enumerate(names)}
        files = []
        for c in names:
            if per[c] > len(classes[c]):
                raise SystemExit(f"error: class {c} has only {len(classes[c])} files, want {per[c]}")
            os.makedirs(os.path.join(src, c))
            for f in classes[c][:per[c]]:
                target = os.path.join(train, c, f)
                os.symlink(target, os.path.join(src, c, f))
                files.append(target)
    nbytes = sum(os.stat(f).st_size for f in files)
    return src, len(files), nbytes


# -- mount helpers --------------------------------------------------------------------------------------

def run_logged(cmd: List[str], logf, timeout_s: float, echo=None) -> int:
    """Run ``cmd`` in its own session, copying its output to ``logf`` (and lines matching ``echo`` to
    stdout); kill its process group after ``timeout_s``. Returns the exit status (-9 on timeout)."""
    logf.write("$ " + shlex.join(cmd) + "\n")
    logf.flush()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    timed_out = threading.Event()

    def kill():
        timed_out.set()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout_s, kill)
    timer.start()
    try:
        for line in proc.stdout:
            logf.write(line)
            if echo and echo.search(line):
                print("      | " + line.rstrip(), flush=True)
        rc = proc.wait()
    except BaseException:
        kill()
        proc.wait()
        raise
    finally:
        timer.cancel()
        logf.flush()
    return -9 if timed_out.is_set() else rc


# -- trace analysis -------------------------------------------------------------------------------------

def read_outcomes(path: str, counts: Optional[Dict[str, int]] = None) -> np.ndarray:
    """Per open: True when the daemon served it from a cache tier (``outcome`` ram, disk or shared).

    ``prefetch`` (a completed prefetch) and ``late`` (waited on one) are not hits: the file came from
    the backend, as the stats JSON counts them (``prefetch.ready`` / ``prefetch.late``, not ``hits``), and as
    OPT counts them (a miss). ``counts``, if given, receives the number of opens per outcome.
    """
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
        reader = csv.reader(f)
        header = next(reader)
        col = header.index("outcome")
        outcomes = [row[col] for row in reader if row]
    if counts is not None:
        for o in outcomes:
            counts[o] = counts.get(o, 0) + 1
    return np.array([o in HIT_OUTCOMES for o in outcomes], dtype=bool)


def per_epoch(mask: np.ndarray, n_train: int, epochs: int) -> List[dict]:
    """Hits and opens per epoch; epoch k = opens [k*N, (k+1)*N) (the last takes any remainder)."""
    out = []
    for k in range(epochs):
        a = k * n_train
        b = (k + 1) * n_train if k < epochs - 1 else len(mask)
        seg = mask[a:b]
        out.append({"epoch": k + 1, "opens": int(seg.size), "hits": int(seg.sum()),
                    "hit_ratio": float(seg.mean()) if seg.size else 0.0})
    return out


def phases(ids: np.ndarray, measured: np.ndarray, opt: np.ndarray, n_train: int, epochs: int
           ) -> Tuple[dict, dict]:
    """Where the warm hits come from, over epochs 2..E.

    Splits each warm epoch's opens into the first read of a file in that epoch and the repeats of a file
    already read earlier in the same epoch (only ShadeSampler repeats: it draws with replacement and
    plays resident draws ``rep_factor`` times), with measured and OPT hits for each. Also returns the
    hit ratio per tenth of the last epoch (measured, OPT): PADS puts the resident draws first.
    """
    out = {k: {"opens": 0, "hits": 0, "opt_hits": 0} for k in ("first", "repeat")}
    for k in range(1, epochs):
        a, b = k * n_train, min((k + 1) * n_train if k < epochs - 1 else len(ids), len(ids))
        if b <= a:
            continue
        seg = ids[a:b]
        first = np.zeros(seg.size, dtype=bool)
        first[np.unique(seg, return_index=True)[1]] = True
        for name, sel in (("first", first), ("repeat", ~first)):
            out[name]["opens"] += int(sel.sum())
            out[name]["hits"] += int(measured[a:b][sel].sum())
            out[name]["opt_hits"] += int(opt[a:b][sel].sum())
    a = (epochs - 1) * n_train
    prof = {"measured": [], "opt": []}
    if len(ids) > a:
        for part_m, part_o in zip(np.array_split(measured[a:], 10), np.array_split(opt[a:], 10)):
            prof["measured"].append(float(part_m.mean()) if part_m.size else None)
            prof["opt"].append(float(part_o.mean()) if part_o.size else None)
    return out, prof


def warm_ratio(epochs: List[dict]) -> Optional[float]:
    """Hit ratio over epochs 2..E (None with a single epoch)."""
    w = epochs[1:]
    opens = sum(e["opens"] for e in w)
    return sum(e["hits"] for e in w) / opens if opens else None


def analyse(run: dict, trace_path: str, cache_bytes: int, n_train: int, epochs: int) -> None:
    """Fill ``run`` with the measured per-epoch hits, OPT on the same trace, and the policy's replay."""
    trace = sim.read_trace(trace_path)
    run["outcomes"] = {}
    measured = read_outcomes(trace_path, run["outcomes"])
    if measured.size != trace.requests:
        raise RuntimeError(f"{trace_path}: {measured.size} outcomes but {trace.requests} requests")
    run["trace_opens"] = trace.requests
    run["distinct_files"] = trace.distinct_files
    run["distinct_bytes"] = trace.distinct_bytes
    if trace.requests != n_train * epochs:
        run.setdefault("warnings", []).append(
            f"trace has {trace.requests} opens, expected {epochs} x {n_train}; epochs split at multiples of "
            f"{n_train}")
    run["measured_epochs"] = per_epoch(measured, n_train, epochs)
    run["hit_ratio_trace"] = float(measured.mean())
    run["hit_ratio_warm"] = warm_ratio(run["measured_epochs"])

    t = time.monotonic()
    mask = np.zeros(trace.requests, dtype=bool)
    ref = sim.belady(trace, cache_bytes, hit_mask=mask)
    run["opt_epochs"] = per_epoch(mask, n_train, epochs)
    run["phases"], run["profile"] = phases(trace.ids, measured, mask, n_train, epochs)
    run["opt_hit_ratio"] = ref.hit_ratio
    run["opt_hit_ratio_warm"] = warm_ratio(run["opt_epochs"])
    run["opt_time_s"] = time.monotonic() - t

    # the run's own policy replayed on the same trace (sequential; final importance snapshot for shade)
    scores = None
    scores_path = trace_path + ".scores.csv"
    if run["policy"] == "shade" and os.path.exists(scores_path):
        scores = sim.load_scores(scores_path, trace)
    full = sim.simulate(trace, run["policy"], cache_bytes, scores)
    first = sim.Trace(ids=trace.ids[:n_train], sizes=trace.sizes, paths=trace.paths)
    cold = sim.simulate(first, run["policy"], cache_bytes, scores)
    warm_opens = trace.requests - min(n_train, trace.requests)
    run["replay_hit_ratio"] = full.hit_ratio
    run["replay_hit_ratio_warm"] = (full.hits - cold.hits) / warm_opens if warm_opens else None
    run["replay_scores"] = scores is not None


# -- one run --------------------------------------------------------------------------------------------

def run_one(args, sampler: str, policy: str, pct: float, src: str, n_train: int) -> dict:
    tag = f"{sampler}-{policy}-{pct:g}"
    rdir = os.path.join(args.workdir, "runs", tag)
    shutil.rmtree(rdir, ignore_errors=True)
    mnt = os.path.join(rdir, "mnt")
    data = os.path.join(rdir, "data")
    os.makedirs(mnt)
    os.makedirs(data)
    os.symlink(mnt, os.path.join(data, "train"))
    os.symlink(os.path.join(args.data, "test"), os.path.join(data, "test"))
    trace = os.path.join(rdir, "trace.csv")
    train_json = os.path.join(rdir, "train.json")
    run = {"sampler": sampler, "policy": policy, "size_pct": pct, "tag": tag, "trace": trace,
           "error": None, "warnings": []}
    t_run = time.monotonic()
    daemon_pid = None
    logf = open(os.path.join(rdir, "run.log"), "w")

    def log(msg):
        progress(msg)
        logf.write(msg + "\n")

    try:
        # --follow-symlinks: a --train-limit subset is a tree of symlinks into DATA/train
        m = Mount(src, mnt, ["--ram-cache", f"{pct:g}%", "--policy", policy, "--trace", trace, "--follow-symlinks"],
                  log_file=os.path.join(rdir, "daemon.log"))
        logf.write(f"$ shadefs mount {shlex.join([m.source, m.path, '--log-file', m.log_file, *m.args])}\n")
        m.start()
        logf.write(m.result.stdout + m.result.stderr)
        daemon_pid = m.pid
        try:
            tcmd = [sys.executable, TRAIN_SCRIPT, "--data", data, "--epochs", str(args.epochs),
                    "--workers", str(args.workers), "--batch-size", str(args.batch_size),
                    "--seed", str(args.seed), "--device", "cpu", "--json", train_json]
            if args.lr is not None:
                tcmd += ["--lr", str(args.lr)]
            tcmd += SAMPLER_FLAGS[sampler]
            rc = run_logged(tcmd, logf, args.run_timeout, echo=re.compile(r"^epoch |Warning|Error"))
            if rc != 0:
                raise RuntimeError("training timed out" if rc == -9 else f"training exited with status {rc}"
                                   f" (see {os.path.join(rdir, 'run.log')})")
            run["stats"] = m.stats()
        finally:
            err = unmount(mnt, daemon_pid, exit_timeout=60, kill=False, log=lambda e: log(f"    ! {e}"))
            if err:
                run["warnings"].append(err)
        with open(train_json) as f:
            tr = json.load(f)
        if tr["n_train"] != n_train:
            raise RuntimeError(f"trained on {tr['n_train']} images, the mount holds {n_train}")
        run["train_epochs"] = tr["epochs"]
        run["test_acc"] = tr["final_test_acc"]
        run["epoch_times_s"] = [e["epoch_time_s"] for e in tr["epochs"]]
        run["mean_epoch_time_s"] = float(np.mean(run["epoch_times_s"]))
        st = run["stats"]
        run["cache_bytes"] = int(st["tiers"]["ram"]["capacity_bytes"])
        run["hit_ratio"] = st["hit_ratio"]
        run["byte_hit_ratio"] = st["byte_hit_ratio"]
        run["opens"] = st["opens"]
        with open(os.path.join(rdir, "run.log")) as f:
            text = f.read()
        for w in sorted(set(re.findall(r"\w*Warning: [^\n]*", text))):
            run["warnings"].append(w)
        analyse(run, trace, run["cache_bytes"], n_train, args.epochs)
        hits = sum(st["hits"].values())
        pf = st.get("prefetch", {})
        oc = run["outcomes"]
        if (run["trace_opens"] != st["opens"] or round(run["hit_ratio_trace"] * st["opens"]) != hits
                or oc.get("prefetch", 0) != pf.get("ready", 0) or oc.get("late", 0) != pf.get("late", 0)):
            run["warnings"].append(f"trace ({run['trace_opens']} opens, outcomes {oc}) and stats "
                                   f"({st['opens']} opens, {hits} hits, prefetch ready {pf.get('ready')} / late "
                                   f"{pf.get('late')}) disagree")
    except KeyboardInterrupt:
        run["error"] = "interrupted"
        raise
    except Exception as e:  # one failed run must not stop the benchmark
        run["error"] = f"{type(e).__name__}: {e}"
        log(f"    ! {tag} failed: {run['error']}")
    finally:
        run["run_time_s"] = time.monotonic() - t_run
        logf.close()
    return run


# -- results --------------------------------------------------------------------------------------------

def save_results(path: str, results: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def find_run(results: dict, sampler: str, policy: str, pct: float) -> Optional[dict]:
    for r in results["runs"]:
        if r["sampler"] == sampler and r["policy"] == policy and r["size_pct"] == pct:
            return r
    return None


def ok(r: Optional[dict]) -> bool:
    return r is not None and not r.get("error") and r.get("hit_ratio_warm") is not None


def pct_s(x: Optional[float], digits: int = 2) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f} %"


def ratio_s(a: Optional[float], b: Optional[float], digits: int = 2) -> str:
    if a is None or b is None:
        return "–"
    if b <= 0:
        return "∞" if a > 0 else "–"
    return f"{a / b:.{digits}f}"


def lru_theory(f: float) -> float:
    """LRU hit ratio per epoch under uniform random permutations: f + (1 - f) ln(1 - f) (~ f^2 / 2)."""
    return f + (1 - f) * math.log(1 - f) if f < 1 else 1.0


def console_table(results: dict) -> str:
    lines = []
    E = results["meta"]["epochs"]
    head = (f"{'size':>5} {'sampler':<10} {'policy':<7} {'hit all':>8} {'hit warm':>9} {'OPT warm':>9} "
            f"{'/OPT':>5} {'xLRU':>6} {'replay':>8} {'acc':>6} {'epoch s':>8} {'run s':>6}")
    lines.append(head)
    for r in sorted(results["runs"], key=lambda r: (r["size_pct"], SAMPLERS.index(r["sampler"]),
                                                    POLICIES.index(r["policy"]) if r["policy"] in POLICIES
                                                    else 9, r["policy"])):
        if r.get("error"):
            lines.append(f"{r['size_pct']:>4g}% {r['sampler']:<10} {r['policy']:<7} ERROR {r['error']}")
            continue
        lru = find_run(results, r["sampler"], "lru", r["size_pct"])
        lines.append(
            f"{r['size_pct']:>4g}% {r['sampler']:<10} {r['policy']:<7} {pct_s(r['hit_ratio']):>8} "
            f"{pct_s(r['hit_ratio_warm']):>9} {pct_s(r['opt_hit_ratio_warm']):>9} "
            f"{ratio_s(r['hit_ratio_warm'], r['opt_hit_ratio_warm']):>5} "
            f"{ratio_s(r['hit_ratio_warm'], lru['hit_ratio_warm'] if ok(lru) else None, 1):>6} "
            f"{pct_s(r['replay_hit_ratio_warm']):>8} {r['test_acc']:>5.2f}% {r['mean_epoch_time_s']:>8.1f} "
            f"{r['run_time_s']:>6.0f}")
    lines.append(f"(hit ratios over all {E} epochs and over the warm {warm(E)}; replay = the run's policy replayed on "
                 f"its trace by shadefs.sim)")
    return "\n".join(lines)


# -- the doc section and the plots ----------------------------------------------------------------------

def warm(E: int) -> str:
    """The warm window's name: 'epoch 2' or 'epochs 2..E'."""
    return "epoch 2" if E == 2 else f"epochs 2..{E}"


def plot_sampler(results: dict, sampler: str, path: str) -> bool:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    E = results["meta"]["epochs"]
    runs = [r for r in results["runs"] if r["sampler"] == sampler and ok(r)]
    if not runs:
        return False
    fig = Figure(figsize=(6.6, 4.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    style = {"lru": ("tab:red", "o", 7), "static": ("tab:blue", "s", 9), "shade": ("tab:green", "o", 5),
             "fifo": ("tab:orange", "^", 6)}
    sizes = sorted({r["size_pct"] for r in runs})
    opt_by_size: Dict[float, List[float]] = {}
    policies = [p for p in POLICIES if any(r["policy"] == p for r in runs)]
    policies += sorted({r["policy"] for r in runs} - set(policies))
    for p in policies:
        color, marker, ms = style.get(p, (None, "o", 6))
        pts = sorted((r["size_pct"], 100 * r["hit_ratio_warm"], 100 * r["opt_hit_ratio_warm"])
                     for r in runs if r["policy"] == p)
        for x, _, o in pts:
            opt_by_size.setdefault(x, []).append(o)
        ax.plot([q[0] for q in pts], [q[1] for q in pts], marker=marker, markersize=ms, color=color, label=p)
    spread = max((max(v) - min(v) for v in opt_by_size.values()), default=0.0)
    if spread < 0.25:  # the runs' traces give the same OPT: one line
        xs = sorted(opt_by_size)
        ax.plot(xs, [float(np.mean(opt_by_size[x])) for x in xs], "k--", marker="x",
                label="OPT (same traces)")
    else:
        for p in policies:
            pts = sorted((r["size_pct"], 100 * r["opt_hit_ratio_warm"]) for r in runs if r["policy"] == p)
            ax.plot([q[0] for q in pts], [q[1] for q in pts], linestyle="--", marker="x",
                    color=style.get(p, (None,))[0], alpha=0.8, label=f"OPT on {p}'s trace")
    if sampler == "uniform":
        xs = np.linspace(0, max(sizes), 100)
        ax.plot(xs, xs, color="grey", linestyle=":", label="theory: f")
        ax.plot(xs, [100 * lru_theory(x / 100) for x in xs], color="grey", linestyle="-.",
                label="theory LRU: f + (1-f) ln(1-f) ≈ f²/2")
    else:
        base = sorted((r["size_pct"], 100 * r["hit_ratio_warm"]) for r in results["runs"]
                      if ok(r) and r["sampler"] == "uniform" and r["policy"] == "lru")
        if base:
            ax.plot([q[0] for q in base], [q[1] for q in base], color="grey", linestyle=":", marker=".",
                    label="uniform sampler + lru (baseline)")
    ax.set_xlabel("RAM cache (% of the training set's bytes)")
    ax.set_ylabel(f"hit ratio, {warm(E)} (%)")
    m = results["meta"]
    ax.set_title(f"{SAMPLER_LABEL[sampler]}: Fashion-MNIST, {m['n_train']} images, {E} epochs", fontsize=10)
    ax.set_xlim(0, max(sizes) * 1.05)
    ax.set_ylim(bottom=0)
    ax.set_xticks(sizes)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    return True


def size_table(results: dict, pct: float) -> List[str]:
    E = results["meta"]["epochs"]
    w = warm(E)
    out = [f"| sampler | policy | hit ratio (all {E} epochs) | hit ratio ({w}) | OPT, same trace ({w}) | "
           f"÷ OPT | × LRU (same sampler) | × uniform LRU | hit ratio per epoch | test acc | mean epoch time |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = find_run(results, "uniform", "lru", pct)
    for s, p in ALL_MODES + sorted({(r["sampler"], r["policy"]) for r in results["runs"]} - set(ALL_MODES)):
        r = find_run(results, s, p, pct)
        if r is None:
            continue
        if not ok(r):
            out.append(f"| {s} | `{p}` | failed: {r.get('error') or 'no result'} |  |  |  |  |  |  |  |  |")
            continue
        lru = find_run(results, s, "lru", pct)
        per = " / ".join(f"{100 * e['hit_ratio']:.1f}" for e in r["measured_epochs"])
        out.append(
            f"| {s} | `{p}` | {pct_s(r['hit_ratio'])} | **{pct_s(r['hit_ratio_warm'])}** | "
            f"{pct_s(r['opt_hit_ratio_warm'])} | {ratio_s(r['hit_ratio_warm'], r['opt_hit_ratio_warm'])} | "
            f"{ratio_s(r['hit_ratio_warm'], lru['hit_ratio_warm'] if ok(lru) else None, 1)} | "
            f"{ratio_s(r['hit_ratio_warm'], base['hit_ratio_warm'] if ok(base) else None, 1)} | "
            f"{per} % | {r['test_acc']:.2f} % | {r['mean_epoch_time_s']:.1f} s |")
    return out


def phase_table(results: dict) -> List[str]:
    """ShadeSampler runs: the warm opens split into first reads of a file in its epoch and repeats."""
    E = results["meta"]["epochs"]
    runs = sorted((r for r in results["runs"] if ok(r) and r["sampler"] == "importance" and r.get("phases")),
                  key=lambda r: (r["size_pct"], POLICIES.index(r["policy"]) if r["policy"] in POLICIES else 9))
    if not runs:
        return []
    out = [f"Where the ShadeSampler hits come from ({warm(E)}): each open is either the first read of a file "
           f"in its epoch or a repeat of a file already read in that epoch (draws with replacement, and the "
           f"`rep_factor` repeats of resident draws). Hit ratio measured / OPT on the same trace; the last "
           f"column is the measured hit ratio per tenth of epoch {E}, in order.", "",
           "| cache | policy | first reads: share | hit ratio | OPT | repeats: share | hit ratio | OPT | "
           f"hit ratio by tenth of epoch {E} (%) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        f, rep = r["phases"]["first"], r["phases"]["repeat"]
        n = f["opens"] + rep["opens"]
        prof = " ".join("–" if v is None else f"{100 * v:.0f}" for v in r["profile"]["measured"])
        out.append(
            f"| {r['size_pct']:g} % | `{r['policy']}` | {pct_s(f['opens'] / n, 0)} | "
            f"{pct_s(f['hits'] / f['opens'] if f['opens'] else None, 1)} | "
            f"{pct_s(f['opt_hits'] / f['opens'] if f['opens'] else None, 1)} | {pct_s(rep['opens'] / n, 0)} | "
            f"{pct_s(rep['hits'] / rep['opens'] if rep['opens'] else None, 1)} | "
            f"{pct_s(rep['opt_hits'] / rep['opens'] if rep['opens'] else None, 1)} | {prof} |")
    return out + [""]


def crosscheck_line(results: dict) -> str:
    """Daemon vs simulator: the run's own policy replayed on its trace by shadefs.sim."""
    E = results["meta"]["epochs"]
    plain = [r for r in results["runs"] if ok(r) and r.get("replay_hit_ratio_warm") is not None
             and not r.get("replay_scores")]
    scored = [r for r in results["runs"] if ok(r) and r.get("replay_hit_ratio_warm") is not None
              and r.get("replay_scores") and r["sampler"] == "importance"]
    if not plain and not scored:
        return ""
    txt = "Cross-check, daemon vs simulator: each trace replayed through the run's own policy by `shadefs.sim`"
    if plain:
        d = max(abs(r["replay_hit_ratio_warm"] - r["hit_ratio_warm"]) for r in plain)
        txt += (f" gives the measured {warm(E)} hit ratio within {100 * d:.2f} points for every run without "
                f"importance scores ({len(plain)} runs)")
    if scored:
        txt += ("; for ShadeSampler + `shade` it cannot: the replay has only the final importance snapshot "
                "(`TRACE.scores.csv`), not the scores as they arrived, and the sampler's trace was shaped by "
                "the live cache (" + ", ".join(f"{r['size_pct']:g} %: replay {pct_s(r['replay_hit_ratio_warm'], 1)}"
                                               f" vs measured {pct_s(r['hit_ratio_warm'], 1)}" for r in scored) + ")")
    return txt + "."


def theory_line(results: dict, pct: float) -> str:
    E = results["meta"]["epochs"]
    f = pct / 100
    st = find_run(results, "uniform", "static", pct)
    lr = find_run(results, "uniform", "lru", pct)
    got = ""
    if ok(st) or ok(lr):
        parts = []
        if ok(st):
            parts.append(f"`static` {pct_s(st['hit_ratio_warm'])}")
        if ok(lr):
            parts.append(f"`lru` {pct_s(lr['hit_ratio_warm'])}")
        got = " Measured: " + ", ".join(parts) + "."
    return (f"Theory, uniform sampling at f = {pct:g} %: `static` = OPT = f = {100 * f:.2f} % per epoch "
            f"from epoch 2 on; `lru` ≈ f²/2 = {100 * f * f / 2:.2f} % (exactly f + (1−f) ln(1−f) = "
            f"{100 * lru_theory(f):.2f} %). Over all {E} epochs multiply by {E - 1}/{E}.{got}")


def goals(results: dict) -> List[str]:
    E = results["meta"]["epochs"]
    sizes = sorted({r["size_pct"] for r in results["runs"]})
    out = []
    # 1. shade within 5 % of OPT, both samplers
    for s in SAMPLERS:
        vals = []
        for pct in sizes:
            r = find_run(results, s, "shade", pct)
            if ok(r) and r["opt_hit_ratio_warm"]:
                vals.append((pct, r["hit_ratio_warm"] / r["opt_hit_ratio_warm"]))
        if not vals:
            continue
        met = all(v >= GOAL_OPT for _, v in vals)
        txt = ", ".join(f"{pct:g} %: {v:.2f}" for pct, v in vals)
        out.append(f"- **`shade` within 5 % of OPT, {SAMPLER_LABEL[s]}** (hit ratio ÷ OPT, {warm(E)}): "
                   f"{txt}. **{'Met' if met else 'Not met'}**.")
    # 2. 4.5x LRU at 10 %
    r = find_run(results, "importance", "shade", GOAL_SIZE)
    base = find_run(results, "uniform", "lru", GOAL_SIZE)
    same = find_run(results, "importance", "lru", GOAL_SIZE)
    if ok(r) and (ok(base) or ok(same)):
        parts, verdict = [], {}
        for key, label, b in (("base", "uniform sampler + `lru` (PyTorch's default loader on an LRU cache)", base),
                              ("same", "ShadeSampler + `lru`", same)):
            if ok(b):
                x = r["hit_ratio_warm"] / b["hit_ratio_warm"] if b["hit_ratio_warm"] > 0 else math.inf
                parts.append(f"{x:.1f}x {label}")
                verdict[key] = x >= GOAL_LRU
        if all(verdict.values()):
            v = "Met"
        elif verdict.get("base"):
            v = "Met against the uniform + `lru` baseline; not against `lru` under the same sampler"
        else:
            v = "Not met"
        out.append(f"- **ShadeSampler + `shade` ≥ {GOAL_LRU}x LRU at {GOAL_SIZE:g} %** ({warm(E)}): "
                   f"{pct_s(r['hit_ratio_warm'])}, i.e. " + "; ".join(parts) + f". **{v}**.")
    elif GOAL_SIZE not in sizes:
        out.append(f"- ≥ {GOAL_LRU}x LRU at {GOAL_SIZE:g} %: not measured (no {GOAL_SIZE:g} % run).")
    # 3. accuracy
    diffs = []
    for pct in sizes:
        for p in POLICIES:
            u, i = find_run(results, "uniform", p, pct), find_run(results, "importance", p, pct)
            if ok(u) and ok(i):
                diffs.append((pct, p, i["test_acc"] - u["test_acc"]))
    if diffs:
        worst = min(diffs, key=lambda d: d[2])
        mu = np.mean([r["test_acc"] for r in results["runs"] if ok(r) and r["sampler"] == "uniform"])
        mi = np.mean([r["test_acc"] for r in results["runs"] if ok(r) and r["sampler"] == "importance"])
        out.append(f"- **Test accuracy, ShadeSampler within {GOAL_ACC:g} point of uniform** (after {E} epochs, "
                   f"same policy and size): mean {mi:.2f} % vs {mu:.2f} %; worst difference {worst[2]:+.2f} "
                   f"points (`{worst[1]}` at {worst[0]:g} %). "
                   f"**{'Met' if all(d[2] >= -GOAL_ACC for d in diffs) else 'Not met'}**.")
    return out


def explanation(results: dict) -> List[str]:
    """The plain-words reading of the numbers; the parts that depend on the outcome are computed."""
    E = results["meta"]["epochs"]
    L = ["How to read the numbers, and why they come out this way:", "",
         "- **Uniform sampling.** Every image is read exactly once per epoch, in a fresh random order. From "
         "the second epoch on no cache can hit more than the fraction f of the dataset it holds: `static` "
         "(admit until full, never evict) reaches f and OPT does no better. `lru` evicts each file long before "
         "its next use (a whole epoch later, at a random position) and keeps only about f²/2. With no hook, no "
         "score ever reaches the daemon, every file weighs 1.0, and `shade` makes exactly the decisions of "
         "`static` (they differ by a few hits only because two DataLoader workers interleave their opens a "
         "little differently from run to run). Cache sizes are bytes and the files differ in size (160-880 B), "
         "so `static` holds about f of the *files*, and OPT (size-blind Belady, docs/simulator.md) lands "
         "slightly above or below f. Same seed, same sample order: the uniform runs train identically.",
         "- **ShadeSampler.** Each epoch draws N indices with replacement, weighted by importance (loss rank), "
         "and plays the draws that were resident at the epoch's start `rep_factor` = 3 times, first; the draws "
         "that were not resident follow, shuffled (at least 10 % of the epoch, `min_miss_fraction`). The hit "
         "ratio therefore exceeds f with *every* policy, `lru` and `static` included: the sampler produces the "
         "gain, and its residency query makes each policy's own cache content the thing that gets repeated. "
         "The policies differ only in what they keep for the next epoch and in whether they catch the repeats "
         "among the non-resident draws later in the same epoch. The per-tenth profile shows the shape: the "
         "opening part of a warm epoch hits 100 % with every policy, the rest far less."]
    gaps = []
    for r in sorted(results["runs"], key=lambda r: r["size_pct"]):
        if ok(r) and r["sampler"] == "importance" and r["policy"] == "shade" and r.get("phases") \
                and r["opt_hit_ratio_warm"] and r["hit_ratio_warm"] / r["opt_hit_ratio_warm"] < GOAL_OPT:
            ph = r["phases"]
            n = ph["first"]["opens"] + ph["repeat"]["opens"]
            gaps.append((r["size_pct"], 100 * (r["opt_hit_ratio_warm"] - r["hit_ratio_warm"]),
                         100 * (ph["repeat"]["opt_hits"] - ph["repeat"]["hits"]) / n,
                         100 * (ph["first"]["opt_hits"] - ph["first"]["hits"]) / n))
    if gaps:
        nums = "; ".join(f"{pct:g} %: {g:.1f} points, of which {rep:.1f} on repeats and {fst:.1f} on first reads"
                         for pct, g, rep, fst in gaps)
        L.append(
            "- **Why `shade` stays below OPT with ShadeSampler.** The gap has two parts (split with the table "
            f"above, {warm(E)}: {nums}). *Repeats:* once the opening part of an epoch has played the residents' "
            "repeats, those residents are not needed again in that epoch; but they were just scored, and `shade` "
            "admits a newcomer only if it outranks the least important resident (a never-scored file, weight "
            "1.0, never does), so it keeps the spent residents and turns away most of the files that the "
            "with-replacement draw reads again later in the same epoch. OPT sees those repeats coming, evicts "
            "the spent residents and catches them (compare the three policies' repeats columns: `lru` admits "
            "every miss, `static` nothing once full). An online policy could catch these. *First reads:* the "
            "sampler puts a draw "
            "in the miss part of an epoch precisely because the live cache did not hold it at the epoch's "
            "start, so no online cache can hit its first read; OPT, replaying the fixed trace, held those files "
            "instead of ones needed later or never. This part is out of reach for any policy behind a "
            "cache-aware sampler, and it dominates at large caches, where every policy sits at the sampler's "
            "cap (1 − `min_miss_fraction` = 90 % of an epoch planned as hits).")
    L += ["- **OPT** replays the run's whole trace knowing the future; its hits are counted in the warm epochs "
          "so that it compares with the measured warm hit ratio. With ShadeSampler the trace itself depends "
          "on the cache (the sampler repeats what was resident), so OPT on the same trace is a reference for "
          "that trace, not a bound on what another cache would have produced.",
          "- The first epoch is cold for every run: all misses under uniform sampling; with ShadeSampler it is "
          "a uniform draw with replacement (all weights 1.0), so only repeats of cached draws hit."]
    return L


def render_section(results: dict, imgs: Dict[str, bool]) -> str:
    m = results["meta"]
    E = m["epochs"]
    w = warm(E)
    subset = "a fixed subset: the first files of each class"
    sizes = sorted({r["size_pct"] for r in results["runs"]})
    L = [START, "## Hit ratio", "",
         "Real training through the mount, from a cold cache: `python -m shadefs.bench hit_ratio` trains the small CNN "
         "of `scripts/train_fashion_mnist.py` on Fashion-MNIST (CPU) with the training split mounted through "
         "shadefs (RAM tier only, no disk tier) and measures the hit ratio (`shadefs stats`; per epoch from "
         "the `--trace` file) against Belady's OPT replayed on the same recorded trace at the same cache "
         "bytes (`shadefs.sim`). Samplers: `uniform` = the unmodified `DataLoader(shuffle=True)` "
         "(transparent mode); `importance` = `--hook`, ShadeSampler (SHADE's PADS, cache-aware) + "
         "ScoreReporter sending per-sample losses to the daemon.", "",
         f"Setup: {m['n_train']} training images ({m['train_bytes'] / 1e6:.1f} MB; "
         f"{'the full training split' if m.get('train_limit') is None else subset}), "
         f"{E} epochs, batch {m['batch_size']}, {m['workers']} DataLoader workers, seed {m['seed']}, test accuracy "
         f"on the full {m.get('n_test', 10000)}-image test split read directly (not through the mount). "
         f"Cache sizes are percentages of the mounted training bytes. {m['cpus']} CPUs, {m['platform']}, "
         f"commit `{m.get('commit') or '?'}`, {m['date']}."
         + (" **Quick run (`--quick`): a smoke test, not the reference numbers.**" if m.get("quick") else ""),
         "", f"Reproduce: `{m['command']}`", "",
         f"Columns: hit ratio = hits / opens (a hit = an open served from the RAM tier); {w} leaves out the "
         f"cold first epoch; OPT = Belady's MIN with bypass replayed on this run's own whole trace, its hits "
         f"counted in {w}; ÷ OPT and × LRU compare the {w} hit ratios (× uniform LRU: against the uniform "
         f"sampler with `lru` at the same size, i.e. PyTorch's default loader on an LRU cache); test acc after "
         f"epoch {E}; epoch time = mean training time per epoch without evaluation (a shared 2-core machine: "
         f"only roughly comparable).", ""]
    for pct in sizes:
        L += [f"### Cache = {pct:g} % of the training set", ""]
        L += size_table(results, pct)
        L += ["", theory_line(results, pct), ""]
    if imgs.get("uniform") or imgs.get("importance"):
        L += [f"Hit ratio ({w}) vs cache size; dashed: OPT on the same traces.", ""]
        if imgs.get("uniform"):
            L += ["![hit ratio, uniform sampler](../img/hit_ratio_uniform.png)", ""]
        if imgs.get("importance"):
            L += ["![hit ratio, ShadeSampler](../img/hit_ratio_importance.png)", ""]
    L += phase_table(results)
    L += ["### Goals", ""] + goals(results) + [""]
    if results.get("notes"):
        L += [results["notes"].rstrip(), ""]
    L += explanation(results) + [""]
    cc = crosscheck_line(results)
    if cc:
        L += [cc, ""]
    failed = [r for r in results["runs"] if r.get("error")]
    if failed:
        L += ["Failed runs: " + "; ".join(f"{r['tag']}: {r['error']}" for r in failed) + ".", ""]
    warned = [(r["tag"], x) for r in results["runs"] for x in r.get("warnings", [])]
    if warned:
        L += ["Warnings: " + "; ".join(f"{t}: {x}" for t, x in warned) + ".", ""]
    L.append(END)
    return "\n".join(L) + "\n"


def write_outputs(results: dict, doc: str, img_dir: str) -> None:
    imgs = {}
    for s in SAMPLERS[:2]:
        p = os.path.join(img_dir, f"hit_ratio_{s}.png")
        try:
            imgs[s] = plot_sampler(results, s, p)
        except ImportError as e:
            progress(f"no plots: {e}")
            imgs[s] = False
        if imgs[s]:
            progress(f"wrote {p}")
    docsection.write_section(doc, "bench_hit_ratio", render_section(results, imgs))
    progress(f"wrote the '## Hit ratio' section of {doc}")


# -- main -----------------------------------------------------------------------------------------------

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
    p.add_argument("--data", default=os.path.join(REPO, "data", "fmnist"),
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
        commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
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
