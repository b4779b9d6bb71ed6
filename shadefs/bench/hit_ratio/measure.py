"""The hit-ratio benchmark's runs: the modes (sampler and policy), the training split to mount, one
training run through a fresh mount with its trace, and the results file."""
from __future__ import annotations

import json
import os
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

from shadefs.bench.hit_ratio.analysis import analyse
from shadefs.bench.runner import ROOT
from shadefs.testing import Mount, unmount

TRAIN_SCRIPT = os.path.join(ROOT, "scripts", "train_fashion_mnist.py")  # the example a user runs
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

_T0 = time.monotonic()


def progress(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s] {msg}", flush=True)


# -- dataset layout ------------------------------------------------------------------------------------
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


# -- mount helpers -------------------------------------------------------------------------------------
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


# -- one run -------------------------------------------------------------------------------------------
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


# -- results -------------------------------------------------------------------------------------------
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
