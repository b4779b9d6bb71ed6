"""Epoch time of a DataLoader(ImageFolder, num_workers=4) over slow storage, with and without shadefs.

Regime: **page cache** (the readers' memory is not bounded: the kernel may keep what a worker read).
Limit: ``local disk`` (ImageFolder on a local copy) and the GETs/s moto sustains through the proxy (the
physical-limit probe).

What runs (each a fresh training process, the same model, seed, batch size and sample order):

- ``direct S3``: no shadefs. A plain ImageFolder cannot read ``s3://``, so this is the FUSE-less
  reader a user would write: a torch Dataset listing the prefix once (s3fs ``find``) and reading each
  sample with ONE GET (s3fs ``cat_file``, ``max_concurrency=1``, the call shadefs's fsspec backend makes
  on a miss; the default obstore backend makes the same one GET), decoded like ImageFolder (``PIL.Image.open(...).convert("RGB")``). Each DataLoader
  worker opens its own s3fs client after the fork.
- ``direct S3, obstore`` (``--configs direct-obstore``): the same reader with obstore's ``get`` on an
  ``S3Store`` per worker instead of s3fs (the client shadefs's default backend uses).
- ``shadefs lru`` / ``shadefs static``: ``shadefs mount s3://... --policy P --ram-cache C%`` and an
  unmodified ImageFolder on the mount, ``shuffle=True``.
- ``shadefs shade + hook``: ``--policy shade`` and the training hook (``ShadeSampler`` +
  ``ScoreReporter`` from ``shadefs.hooks``, as ``train_fashion_mnist.py --hook``).
- ``local disk``: ImageFolder on the local copy of the same files (page cache warm: the limit).

at RAM-tier sizes of ``--sizes`` percent of the dataset's bytes. Every shadefs run mounts fresh (cold
cache), records ``shadefs stats --json`` after every epoch, and unmounts.

The slow storage: moto's S3 server (``python -m moto.server``) on loopback, behind
``shadefs/testing/latency_proxy.py``, a TCP proxy adding a fixed one-way delay per direction and a rate limit
per direction (the stand-in for ``tc qdisc ... netem delay 1ms rate 1gbit`` where the kernel lacks
``sch_netem``). The proxy settings and the GET latency measured through it are printed with the
results.

The data: the first ``--train-limit`` Fashion-MNIST training images, upscaled to 224x224 RGB, with
Gaussian pixel noise (``--noise``) and JPEG quality ``--quality``, so that files are tens of KB rather
than the 5.5 KB of a clean upscaled image (make_fashion_mnist.py ``--size 224 --format jpeg``).

The model: a small CNN on 64x64 inputs (``transforms.Resize(64)``); the point is I/O, not compute.

Usage::

    python -m shadefs.bench epoch [--quick] [--train-limit N] [--epochs E] [--sizes 10,20,40]
                   [--configs direct,local,lru,static,shade] [--delay-ms 1] [--rate 1gbit]
                   [--repeat N] [--no-limit] [--baseline REV]
                   [--workdir DIR] [--json OUT.json] [--write-doc]
    python -m shadefs.bench epoch --results OUT.json --write-doc      # re-render the doc from a saved run

``--write-doc`` replaces the section between ``<!-- bench_epoch:start -->`` and
``<!-- bench_epoch:end -->`` in docs/results/epoch.md and writes docs/img/bench_epoch.png.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import numpy as np

from shadefs.bench.runner import example
from shadefs.testing import Mount, docsection, proc_cpu_s, shadefs, unmount
from shadefs.testing.datasets import completed_tree, mark_complete
from shadefs.testing.docsection import markdown_table
from shadefs.testing.latency_proxy import parse_rate
from shadefs.testing.s3 import DUMMY_AWS_ENV, LatencyProxyProcess, MotoServer, free_port
from shadefs.testing.s3data import S3ImageFolder, probe, upload
from shadefs.testing.training import train_step

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPO = ROOT

BUCKET = "shadefs-bench"
DOC = os.path.join(REPO, "docs", "results", "epoch.md")
PLOT = os.path.join(REPO, "docs", "img", "bench_epoch.png")
START, END = docsection.markers("bench_epoch")
MEAN, STD = (0.2860,) * 3, (0.3530,) * 3
CONFIG_ORDER = ("direct", "direct-obstore", "local", "lru", "static", "shade", "plan", "shade-noplan",
                "lru-fsspec", "static-fsspec", "lru-base", "static-base")
DEFAULT_CONFIGS = ("direct",) + CONFIG_ORDER[2:8]
MOUNTED = CONFIG_ORDER[3:]
DIRECT = ("direct", "direct-obstore")  # the FUSE-less readers: s3fs or obstore in each DataLoader worker
LABELS = {"direct": "direct S3 (no shadefs)", "direct-obstore": "direct S3, obstore (no shadefs)", "local": "local disk (no shadefs)",
          "lru": "shadefs lru", "static": "shadefs static", "shade": "shadefs shade + hook",
          "plan": "shadefs static + PlanSampler", "shade-noplan": "shadefs shade + hook, no plan",
          "lru-fsspec": "shadefs lru, --backend fsspec", "static-fsspec": "shadefs static, --backend fsspec",
          "lru-base": "shadefs lru, --baseline", "static-base": "shadefs static, --baseline"}
# the mount's --policy per config; "shade" = ShadeSampler announcing its draws (its default),
# "shade-noplan" = ShadeSampler(announce_plan=False), "plan" = PlanSampler (uniform permutations, announced)
POLICY = {"lru": "lru", "static": "static", "shade": "shade", "plan": "static", "shade-noplan": "shade",
          "lru-fsspec": "lru", "static-fsspec": "static", "lru-base": "lru", "static-base": "static"}
# "-fsspec": this tree with s3fs as the client (--backend fsspec); "-base": the shadefs package of the
# --baseline revision (its default client), in the same run
def log(msg: str) -> None:
    print(f"[bench_epoch {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ================================================================================================ data
def build_dataset(root: str, n: int, noise: float, quality: int, seed: int) -> Dict[str, Any]:
    """Write ``root/train/<class>/<index>.jpg`` (224x224 RGB JPEG) for the first ``n`` Fashion-MNIST
    training images, unless a complete tree with the same parameters is there. Returns its summary
    (``files``, ``bytes``, ``mean_bytes``)."""
    from PIL import Image

    mfm = example("make_fashion_mnist")
    CLASSES, DEFAULT_SOURCE, SPLITS, file_name, read_idx = (mfm.CLASSES, mfm.DEFAULT_SOURCE, mfm.SPLITS,
                                                            mfm.file_name, mfm.read_idx)

    params = {"n": n, "noise": noise, "quality": quality, "seed": seed, "size": 224}
    done = completed_tree(root)
    if done is not None and done.get("params") == params:
        return done
    t0 = time.monotonic()
    images_file, labels_file = SPLITS["train"]
    x = read_idx(os.path.join(DEFAULT_SOURCE, images_file))[:n]
    y = read_idx(os.path.join(DEFAULT_SOURCE, labels_file))[:n]
    if len(x) < n:
        raise SystemExit(f"only {len(x)} training images available, --train-limit {n} asked")
    shutil.rmtree(root, ignore_errors=True)
    for c in CLASSES:
        os.makedirs(os.path.join(root, "train", c))
    total = 0
    for i in range(n):
        img = Image.fromarray(x[i]).convert("RGB").resize((224, 224), Image.Resampling.BICUBIC)
        if noise > 0:
            rng = np.random.default_rng((seed, i))
            a = np.asarray(img, dtype=np.float32) + rng.normal(0.0, noise, (224, 224, 3))
            img = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
        path = os.path.join(root, "train", CLASSES[int(y[i])], file_name(i, "jpeg"))
        img.save(path, format="JPEG", quality=quality)
        total += os.path.getsize(path)
    summary = {"params": params, "files": n, "bytes": total, "mean_bytes": total / n}
    mark_complete(root, summary)
    log(f"wrote {n} JPEGs ({total / 2**20:.1f} MiB, mean {total / n / 1e3:.1f} kB) to {root} "
        f"in {time.monotonic() - t0:.0f} s")
    return summary


# ============================================================================== moto, proxy, probes
def proc_cpu(pid: Optional[int]) -> float:
    """CPU seconds (user + system, all threads) a live process has used so far; 0.0 if unknown."""
    return proc_cpu_s(pid) or 0.0


def children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _limit_share(endpoint: str, keys: List[str], threads: int, start_at: float) -> tuple:
    # one probe process: ``threads`` boto3 clients (made before the clock starts), each GETting its share
    # of ``keys`` (whole objects) from ``start_at`` (time.monotonic(), the same clock in every process)
    import boto3

    clients = [boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1") for _ in range(threads)]

    def worker(k: int) -> int:
        for key in keys[k::threads]:
            clients[k].get_object(Bucket=BUCKET, Key=key)["Body"].read()
        return len(keys[k::threads])

    time.sleep(max(0.0, start_at - time.monotonic()))
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(threads) as pool:
        n = sum(pool.map(worker, range(threads)))
    return n, t0, time.monotonic()


def limit_gets(endpoint: str, keys: List[str], procs: int, threads: int) -> float:
    """Whole-object GETs/s of ``keys`` with ``procs`` processes x ``threads`` boto3 clients in parallel
    (no FUSE, no cache): what the backend sustains. Several processes, so that the probe's own CPU
    (boto3 under one GIL) is not what it measures. Raises whatever boto3 raises."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    start_at = time.monotonic() + 3.0  # every process has made its clients by then
    with cf.ProcessPoolExecutor(procs, mp_context=ctx) as pool:
        parts = list(pool.map(_limit_share, [endpoint] * procs, [keys[i::procs] for i in range(procs)],
                              [threads] * procs, [start_at] * procs))
    return sum(p[0] for p in parts) / (max(p[2] for p in parts) - min(p[1] for p in parts))


# ================================================================================== shadefs mounts
def mount(source: str, mnt: str, policy: str, size_pct: int, endpoint: str, log_file: str,
          metrics_port: int, extra=(), code: Optional[str] = None) -> int:
    """Mount ``source`` at ``mnt`` (RAM tier only, ``size_pct`` % of the dataset); returns the daemon pid.
    ``code``: a directory holding another ``shadefs`` package to run (a --baseline revision)."""
    env = None
    if code:  # that package first; PYTHONSAFEPATH: ``-m`` must not put the working directory before it
        env = dict(os.environ, PYTHONPATH=code, PYTHONSAFEPATH="1")
    return Mount(source, mnt, ["--policy", policy, "--ram-cache", f"{size_pct}%", "--backend-opt",
                               f"endpoint_url={endpoint}", "--metrics-port", str(metrics_port), *extra],
                 log_file=log_file, mount_timeout=300, env=env).start().pid


def backend_read_latency(metrics_port: int) -> Dict[str, float]:
    """The daemon's ``shadefs_backend_read_seconds`` histogram: ``{"count", "mean_ms"}`` (misses)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
    values = {}
    for line in text.splitlines():
        for name in ("shadefs_backend_read_seconds_sum", "shadefs_backend_read_seconds_count"):
            if line.startswith(name + " "):
                values[name.rsplit("_", 1)[1]] = float(line.split()[1])
    if not values.get("count"):
        return {}
    return {"count": values["count"], "mean_ms": 1e3 * values["sum"] / values["count"]}


# ============================================================================ the training child
def build_model():
    """A small CNN for 3x64x64 inputs (about 0.2 M parameters)."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, kernel_size=5, stride=2, padding=2),   # 16x32x32
        nn.ReLU(),
        nn.MaxPool2d(2),                                        # 16x16x16
        nn.Conv2d(16, 32, kernel_size=3, padding=1),            # 32x16x16
        nn.ReLU(),
        nn.MaxPool2d(2),                                        # 32x8x8
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 96),
        nn.ReLU(),
        nn.Linear(96, 10),
    )


def stats_json(mnt: str) -> Dict[str, Any]:
    return json.loads(shadefs("stats", "--json", mnt, timeout=60).stdout)


def child_main(cfg: Dict[str, Any]) -> int:
    """One training run; prints ``RESULT <json>`` as its last stdout line."""
    import torch
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    import warnings

    warnings.filterwarnings("ignore", message="This DataLoader will create")  # 4 workers, 2 cores: meant
    torch.set_num_threads(1)
    torch.manual_seed(cfg["seed"])
    transform = transforms.Compose([transforms.Resize(cfg["image_size"]), transforms.ToTensor(),
                                    transforms.Normalize(MEAN, STD)])
    if cfg["config"] in DIRECT:
        dataset = S3ImageFolder(cfg["endpoint"], cfg["s3_root"], transform,
                                client="obstore" if cfg["config"] == "direct-obstore" else "s3fs")
    else:
        dataset = datasets.ImageFolder(cfg["data"], transform=transform)
    common = dict(batch_size=cfg["batch_size"], num_workers=cfg["workers"],
                  persistent_workers=cfg["workers"] > 0)
    reporter = sampler = None
    if cfg["config"] in ("shade", "shade-noplan"):
        from shadefs.hooks import ScoreReporter, ShadeSampler

        sampler = ShadeSampler(dataset, seed=cfg["seed"], announce_plan=cfg["config"] == "shade")
        loader = DataLoader(dataset, sampler=sampler, **common)
        reporter = ScoreReporter(dataset, sampler=sampler)
    elif cfg["config"] == "plan":
        from shadefs.hooks import PlanSampler

        sampler = PlanSampler(dataset, seed=cfg["seed"])
        loader = DataLoader(dataset, sampler=sampler, **common)
    else:
        loader = DataLoader(dataset, shuffle=True,
                            generator=torch.Generator().manual_seed(cfg["seed"]), **common)
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    epochs = []
    prev = stats_json(cfg["mnt"]) if cfg.get("mnt") else None
    for epoch in range(cfg["epochs"]):
        if sampler is not None:
            sampler.set_epoch(epoch)
        model.train()
        n = 0
        wait = 0.0
        loss_sum = 0.0
        t0 = time.perf_counter()
        it = iter(loader)
        while True:
            tw = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            wait += time.perf_counter() - tw
            loss_sum += float(train_step(model, opt, x, y, reporter).sum())
            n += len(y)
        seconds = time.perf_counter() - t0
        if cfg.get("epoch_sync"):
            # the parent snapshots the proxy's GET counters now (this epoch's backend GETs and bytes), then
            # answers; the next epoch (and its plan announcement) starts only after that
            print("EPOCH_END", flush=True)
            sys.stdin.readline()
        row = {"epoch": epoch + 1, "seconds": seconds, "samples": n, "images_per_s": n / seconds,
               "data_wait_s": wait, "train_loss": loss_sum / max(n, 1)}
        if cfg.get("mnt"):
            now = stats_json(cfg["mnt"])
            hits = lambda s: s["hits"]["ram"] + s["hits"]["disk"]  # noqa: E731
            opens = now["opens"] - prev["opens"]
            row.update(opens=opens, hits=hits(now) - hits(prev), misses=now["misses"] - prev["misses"],
                       hit_ratio=(hits(now) - hits(prev)) / opens if opens else 0.0,
                       backend_bytes=now["backend_bytes"] - prev["backend_bytes"], stats=now)
            pf, q = now.get("prefetch", {}), prev.get("prefetch", {})
            row.update(ready=pf.get("ready", 0) - q.get("ready", 0), late=pf.get("late", 0) - q.get("late", 0))
            prev = now
        if getattr(sampler, "plan", None) is not None:
            row["planned_hits"] = int(sampler.plan.hits)
            row["distinct"] = int(np.unique(sampler.plan.order).size)
        else:
            row["distinct"] = len(dataset)
        epochs.append(row)
        extra = f"  hit ratio {row['hit_ratio']:.3f}" if "hit_ratio" in row else ""
        print(f"  epoch {epoch + 1}: {seconds:.1f} s, {n / seconds:.0f} img/s, data wait "
              f"{wait:.1f} s{extra}", file=sys.stderr, flush=True)
    del it, loader  # stop the workers: no file of the mount stays open
    out = {"epochs": epochs, "n_train": len(dataset)}
    if isinstance(dataset, S3ImageFolder) and dataset.gets.value:
        out["backend_read"] = {"count": dataset.gets.value,
                               "mean_ms": 1e3 * dataset.get_s.value / dataset.gets.value}
    print("RESULT " + json.dumps(out), flush=True)
    return 0


# ================================================================================ the parent side
def run_child(cfg: Dict[str, Any], timeout_s: float, on_epoch=None) -> Dict[str, Any]:
    """Run one training process; adds ``train_cpu_s``: CPU of it and its DataLoader workers.

    ``on_epoch()``, if given, is called at the end of every epoch while the child waits (the proxy's
    counters are read there); its results are returned as ``out["epoch_marks"]``, one per epoch.

    Raises:
        RuntimeError: the child failed or printed no result; subprocess.TimeoutExpired after ``timeout_s``.
    """
    import threading

    cpu0 = children_cpu()
    cfg = dict(cfg, epoch_sync=on_epoch is not None)
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", json.dumps(cfg)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    timer = threading.Timer(timeout_s, proc.kill)
    timer.start()
    marks, result = [], None
    try:
        for line in proc.stdout:
            if line.startswith("EPOCH_END"):
                marks.append(on_epoch())
                proc.stdin.write("\n")
                proc.stdin.flush()
            elif line.startswith("RESULT "):
                result = line[len("RESULT "):]
        rc = proc.wait()
    finally:
        timed_out = not timer.is_alive() and proc.returncode not in (0, None) and result is None
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if timed_out:
        raise subprocess.TimeoutExpired(proc.args, timeout_s)
    if rc != 0 or result is None:
        raise RuntimeError(f"run {cfg['config']} failed (exit {rc})")
    out = json.loads(result)
    out["train_cpu_s"] = children_cpu() - cpu0
    if on_epoch is not None:
        out["epoch_marks"] = marks
    return out


def summarize(run: Dict[str, Any]) -> Dict[str, Any]:
    eps = run["epochs"]
    warm = eps[1:] or eps
    out = {"cold_s": eps[0]["seconds"], "warm_s": statistics.mean(e["seconds"] for e in warm),
           "warm_img_s": statistics.mean(e["images_per_s"] for e in warm),
           "cold_wait_s": eps[0]["data_wait_s"],
           "warm_wait_s": statistics.mean(e["data_wait_s"] for e in warm)}
    if "gets" in eps[0]:
        out.update(cold_gets=eps[0]["gets"], warm_gets=statistics.mean(e["gets"] for e in warm),
                   cold_get_bytes=eps[0]["get_bytes"],
                   warm_get_bytes=statistics.mean(e["get_bytes"] for e in warm))
    if "ready" in eps[0]:
        nowait = lambda es: (100.0 * sum(e["hits"] + e["ready"] for e in es)  # noqa: E731
                             / max(1, sum(e["opens"] for e in es)))
        out.update(cold_nowait=nowait(eps[:1]), warm_nowait=nowait(warm))
    if "hit_ratio" in eps[0]:
        final = eps[-1]["stats"]
        w_opens = sum(e["opens"] for e in warm)
        out.update(cold_hit=eps[0]["hit_ratio"],
                   warm_hit=sum(e["hits"] for e in warm) / w_opens if w_opens else 0.0,
                   hit_ratio=final["hit_ratio"], byte_hit_ratio=final["byte_hit_ratio"],
                   backend_bytes=final["backend_bytes"], opens=final["opens"])
    return out




def merge_results(paths: List[str]) -> Dict[str, Any]:
    """One results dict from the JSON files of several chunks (one bench lock hold each) of one grid:
    the runs of all of them (a later run of the same config and size replaces an earlier one), each
    tagged with its chunk, the chunks' commands, loads and physical limits kept (``chunks``,
    ``limits``). Raises ValueError if the chunks differ in data, epochs, workers or proxy settings."""
    chunks = []
    for path in paths:
        with open(path) as f:
            chunks.append(json.load(f))
    base = dict(chunks[0])
    same = ("train_limit", "epochs", "workers", "batch_size", "delay_ms", "rate", "noise", "quality")
    for c in chunks[1:]:
        diff = [k for k in same if c["args"].get(k) != base["args"].get(k)]
        if diff:
            raise ValueError(f"chunks differ in {diff}: not one grid")
    runs: Dict[tuple, Dict[str, Any]] = {}
    for i, c in enumerate(chunks):
        for r in c["runs"]:
            runs[(r["config"], r["size_pct"], r.get("round", 0))] = dict(r, chunk=i, summary=summarize(r))
    order = {c: i for i, c in enumerate(CONFIG_ORDER)}
    base["runs"] = sorted(runs.values(), key=lambda r: (r.get("round", 0), r["size_pct"] is not None,
                                                        r["size_pct"] or 0, order[r["config"]]))
    base["chunks"] = [{k: c.get(k) for k in ("command", "started", "load_start", "load_end", "total_s",
                                             "limit", "probe")} for c in chunks]
    base["limits"] = {i: c.get("limit") for i, c in enumerate(chunks)}
    base["load_end"] = chunks[-1]["load_end"]
    base["total_s"] = sum(c["total_s"] for c in chunks)
    base["args"] = dict(base["args"], sizes=sorted({s for c in chunks for s in c["args"]["sizes"]}))
    return base


def save_partial(results: Dict[str, Any], a: argparse.Namespace, t_start: float) -> None:
    """Write the runs so far to ``--json`` (after every run: a chunk cut short by its time limit keeps
    what it measured; ``--results`` renders it like a complete one)."""
    if not a.json:
        return
    out = dict(results, load_start=results.get("load_start") or list(os.getloadavg()),
               load_end=list(os.getloadavg()), total_s=time.monotonic() - t_start, partial=True)
    with open(a.json + ".tmp", "w") as f:
        json.dump(out, f, indent=1)
    os.replace(a.json + ".tmp", a.json)


def run_benchmark(a: argparse.Namespace, bench) -> Dict[str, Any]:
    t_start = time.monotonic()
    load_start = os.getloadavg()
    os.makedirs(a.workdir, exist_ok=True)
    data_root = os.path.join(a.workdir, f"data-{a.train_limit}-n{a.noise:g}-q{a.quality}")
    data = build_dataset(data_root, a.train_limit, a.noise, a.quality, a.seed)
    os.environ.update(DUMMY_AWS_ENV)  # the children and the shadefs daemons inherit them
    prefix = f"fmnist224-{a.train_limit}"
    source = f"s3://{BUCKET}/{prefix}"
    results: Dict[str, Any] = {
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "python": platform.python_version()},
        "args": {k: v for k, v in vars(a).items() if k not in ("child", "results")},
        "command": bench.command,
        "load_start": list(load_start),
        "data": data, "runs": [],
    }
    try:
        import torch
        import torchvision
        results["machine"].update(torch=torch.__version__, torchvision=torchvision.__version__)
    except ImportError:
        pass
    moto = MotoServer()
    proxy: Optional[LatencyProxyProcess] = None
    base_code = None
    if bench.baseline():
        base_code, rev = bench.baseline()
        results["baseline"] = rev
    try:
        moto.start()
        t0 = time.monotonic()
        n = upload(moto.endpoint, BUCKET, prefix, data_root)
        log(f"uploaded {n} objects to {source} in {time.monotonic() - t0:.0f} s")
        proxy = LatencyProxyProcess(moto.port, a.delay_ms, a.rate, a.proxy_mode).start()
        log(proxy.settings)
        probe_file = sorted(os.listdir(os.path.join(data_root, "train", "Bag")))[0]
        probe_key = f"{BUCKET}/{prefix}/train/Bag/{probe_file}"
        probe_kb = os.path.getsize(os.path.join(data_root, "train", "Bag", probe_file)) / 1e3
        results["probe"] = probe({"moto": moto.endpoint, "proxy": proxy.endpoint}, probe_key)
        results["probe"]["object_kb"] = probe_kb
        results["proxy"] = {"settings": proxy.settings, "delay_ms": a.delay_ms, "rate": a.rate,
                            "mode": a.proxy_mode}
        log(f"GET latency (s3fs cat_file, one {probe_kb:.0f} kB object, median): moto alone "
            f"{results['probe']['moto']['median_ms']:.1f} ms, through the proxy "
            f"{results['probe']['proxy']['median_ms']:.1f} ms")
        # the physical limit: whole-object GETs/s that moto sustains alone and through the proxy with
        # --limit-clients in parallel (the prefetcher's default concurrency), no FUSE, no cache
        keys = sorted(f"{prefix}/{os.path.relpath(os.path.join(d, f), data_root)}"
                      for d, _, fs in os.walk(os.path.join(data_root, "train")) for f in fs)
        c = a.limit_clients
        log(f"physical limit: GETs/s with {c} clients (1 process; 4 processes), moto alone and through "
            "the proxy")
        if not a.no_limit:
            L = {"load": list(os.getloadavg()), "concurrency": c,
                 "moto_alone": limit_gets(moto.endpoint, keys, 4, max(1, c // 4)),
                 "proxy_1proc": limit_gets(proxy.endpoint, keys, 1, c),
                 "proxy_4proc": limit_gets(proxy.endpoint, keys, 4, max(1, c // 4))}
            L["proxy_c"] = max(L["proxy_1proc"], L["proxy_4proc"])
            L["link_Bps"] = parse_rate(a.rate) / 8 if parse_rate(a.rate) else None
            results["limit"] = L
            log(f"  moto alone {L['moto_alone']:.0f}/s; through the proxy {L['proxy_1proc']:.0f}/s "
                f"(1 process), {L['proxy_4proc']:.0f}/s (4 processes)")
        one = [(c, None) for c in ("direct", "direct-obstore", "local") if c in a.configs]
        one += [(c, s) for s in a.sizes for c in MOUNTED if c in a.configs]
        plan = [(c, s, k) for k in range(a.repeat) for c, s in one]
        base = {"epochs": a.epochs, "batch_size": a.batch_size, "workers": a.workers,
                "image_size": a.image_size, "seed": a.seed}
        for i, (config, size, rnd) in enumerate(plan):
            name = config if size is None else f"{config}-{size}"
            cfg = dict(base, config=config)
            load = os.getloadavg()
            log(f"run {i + 1}/{len(plan)}: {LABELS[config]}" + (f", cache {size} %" if size else "")
                + (f", round {rnd + 1}" if a.repeat > 1 else "")
                + f"  (load average {load[0]:.2f})")
            t_run = time.monotonic()
            cpu_moto, cpu_proxy = proc_cpu(moto.pid), proc_cpu(proxy.pid)
            gets0 = proxy.snapshot()
            daemon_cpu = None
            if config in DIRECT:
                cfg.update(endpoint=proxy.endpoint, s3_root=f"{BUCKET}/{prefix}/train")
                run = run_child(cfg, a.run_timeout, proxy.snapshot)
            elif config == "local":
                cfg.update(data=os.path.join(data_root, "train"))
                run = run_child(cfg, a.run_timeout)
            else:
                mnt = os.path.join(a.workdir, "mnt", f"{name}-{os.getpid()}")
                shutil.rmtree(mnt, ignore_errors=True)
                os.makedirs(mnt)
                logs = os.path.join(a.workdir, "logs")
                os.makedirs(logs, exist_ok=True)
                pid = 0
                metrics_port = free_port()
                try:
                    pid = mount(source, mnt, POLICY[config], size, proxy.endpoint,
                                os.path.join(logs, f"{name}.log"), metrics_port,
                                ["--backend", "fsspec"] if config.endswith("-fsspec") else (),
                                base_code if config.endswith("-base") else None)
                    cfg.update(data=os.path.join(mnt, "train"), mnt=mnt)
                    mount_cpu = proc_cpu(pid)  # start-up: imports, the listing, the scan
                    run = run_child(cfg, a.run_timeout, proxy.snapshot)
                    daemon_cpu = proc_cpu(pid) - mount_cpu  # the training run's: the reads
                    run["daemon_mount_cpu_s"] = mount_cpu
                    run["backend_read"] = backend_read_latency(metrics_port)
                finally:
                    unmount(mnt, pid, exit_timeout=20, log=log)
                    try:
                        os.rmdir(mnt)
                    except OSError:
                        pass
            prev = gets0  # per epoch: the GETs and object bytes the proxy carried during it
            for ep, mark in zip(run["epochs"], run.pop("epoch_marks", [])):
                ep["gets"] = mark["gets"] - prev["gets"]
                ep["get_bytes"] = mark["get_body_bytes"] - prev["get_body_bytes"]
                prev = mark
            gets1 = proxy.snapshot()  # backend GETs and object bytes of the whole run, counted by the proxy
            run["proxy_gets"] = gets1["gets"] - gets0["gets"]
            run["proxy_get_bytes"] = gets1["get_body_bytes"] - gets0["get_body_bytes"]
            run.update(config=config, size_pct=size, round=rnd, load_before=list(load),
                       wall_s=time.monotonic() - t_run, daemon_cpu_s=daemon_cpu,
                       moto_cpu_s=proc_cpu(moto.pid) - cpu_moto,
                       proxy_cpu_s=proc_cpu(proxy.pid) - cpu_proxy)
            run["summary"] = summarize(run)
            results["runs"].append(run)
            save_partial(results, a, t_start)
    finally:
        if proxy is not None:
            proxy.stop()
            results["proxy_counters"] = proxy.counters
        moto.stop()
    results["load_start"] = list(load_start)
    results["load_end"] = list(os.getloadavg())
    results["total_s"] = time.monotonic() - t_start
    return results


# ============================================================================== table, plot, doc
def _pct(x: Optional[float]) -> str:
    return "" if x is None else f"{100 * x:.1f} %"


def limit_of(results: Dict[str, Any], run: Dict[str, Any]) -> Optional[Dict[str, float]]:
    """The physical limit of ``run``'s epochs, seconds: the slowest of (its proxy-counted GETs at the
    measured concurrent-GET rate of its chunk, its object bytes at the link's rate, the local-disk run's
    epoch: decoding and the model need that much anyway). ``{"cold", "warm"}`` or None (no probe)."""
    L = results.get("limits", {}).get(run.get("chunk", 0)) or results.get("limit")
    if not L or "gets" not in run["epochs"][0]:
        return None
    local = next((r for r in results["runs"] if r["config"] == "local"), None)
    loc = [e["seconds"] for e in local["epochs"]] if local else []

    def one(i: int, e: Dict[str, Any]) -> float:
        t = e["gets"] / L["proxy_c"]
        if L.get("link_Bps"):
            t = max(t, e["get_bytes"] / L["link_Bps"])
        if loc:
            t = max(t, loc[min(i, len(loc) - 1)] if i == 0 else statistics.mean(loc[1:] or loc))
        return t

    lims = [one(i, e) for i, e in enumerate(run["epochs"])]
    return {"cold": lims[0], "warm": statistics.mean(lims[1:] or lims)}


def _label(r: Dict[str, Any], results: Dict[str, Any]) -> str:
    rounds = results["args"].get("repeat", 1)
    return LABELS[r["config"]] + (f", round {r.get('round', 0) + 1}" if rounds > 1 else "")


def _direct_of(r: Dict[str, Any], runs: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The s3fs direct reader's run of ``r``'s round (the reference of "vs direct S3")."""
    return next((d for d in runs if d["config"] == "direct" and d.get("round", 0) == r.get("round", 0)),
                next((d for d in runs if d["config"] == "direct"), None))


def table(results: Dict[str, Any]) -> str:
    runs = results["runs"]
    e = results["args"]["epochs"]
    warm_label = f"epochs 2..{e} (mean)" if e > 2 else ("epoch 2" if e == 2 else "epoch 1")
    head = ["run", "cache", "load", "epoch 1 (cold)", warm_label, "warm img/s", "warm vs direct S3",
            "hit ratio (1 / warm)", "no wait % (1 / warm)", "GETs (1 / warm)", "MiB (1 / warm)",
            "limit s (1 / warm)", "x limit (1 / warm)"]
    rows = []
    for r in runs:
        s = r["summary"]
        direct = _direct_of(r, runs)
        ref = direct["summary"]["warm_s"] if direct else None
        lim = limit_of(results, r)
        two = lambda a, b, f: (f"{format(s[a], f)} / {format(s[b], f)}" if a in s else "")  # noqa: E731
        rows.append([
            _label(r, results), "" if r["size_pct"] is None else f"{r['size_pct']} %",
            f"{r['load_before'][0]:.1f}",
            f"{s['cold_s']:.1f} s", f"{s['warm_s']:.1f} s", f"{s['warm_img_s']:.0f}",
            f"{ref / s['warm_s']:.2f}x" if ref else "",
            f"{_pct(s['cold_hit'])} / {_pct(s['warm_hit'])}" if "cold_hit" in s else "",
            two("cold_nowait", "warm_nowait", ".1f"), two("cold_gets", "warm_gets", ".0f"),
            (f"{s['cold_get_bytes'] / 2**20:.1f} / {s['warm_get_bytes'] / 2**20:.1f}"
             if "cold_get_bytes" in s else ""),
            f"{lim['cold']:.1f} / {lim['warm']:.1f}" if lim else "",
            f"{s['cold_s'] / lim['cold']:.2f} / {s['warm_s'] / lim['warm']:.2f}" if lim else "",
        ])
    return markdown_table(head, rows)


def cpu_table(results: Dict[str, Any]) -> str:
    """Where the CPU went, per run (all epochs, the stats calls between them included)."""
    head = ["run", "cache", "epochs, sum", "training + workers", "shadefs daemon", "moto", "proxy",
            "CPU per image", "GETs", "mean GET"]
    rows = []
    for r in results["runs"]:
        if "train_cpu_s" not in r:
            continue
        epoch_s = sum(e["seconds"] for e in r["epochs"])
        images = sum(e["samples"] for e in r["epochs"])
        parts = [r["train_cpu_s"], r.get("daemon_cpu_s") or 0.0, r["moto_cpu_s"], r["proxy_cpu_s"]]
        rows.append([
            _label(r, results), "" if r["size_pct"] is None else f"{r['size_pct']} %",
            f"{epoch_s:.1f} s", f"{parts[0]:.1f} s",
            "" if r.get("daemon_cpu_s") is None else f"{parts[1]:.1f} s",
            f"{parts[2]:.1f} s", f"{parts[3]:.1f} s", f"{1e3 * sum(parts) / max(images, 1):.1f} ms",
            f"{r['backend_read']['count']:.0f}" if r.get("backend_read") else "",
            f"{r['backend_read']['mean_ms']:.1f} ms" if r.get("backend_read") else ""])
    return markdown_table(head, rows)


def plot(results: Dict[str, Any], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    sizes = sorted({r["size_pct"] for r in runs if r["size_pct"] is not None})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    axes[1].sharey(axes[0])  # cold and warm on one scale
    colors = {"direct": "tab:red", "direct-obstore": "tab:pink", "local": "tab:gray", "lru": "tab:orange", "static": "tab:blue",
              "shade": "tab:green", "plan": "tab:purple", "shade-noplan": "tab:olive"}
    e = results["args"]["epochs"]
    for ax, key, title in ((axes[0], "cold_s", "epoch 1 (cold cache)"),
                           (axes[1], "warm_s", f"epochs 2..{e}, mean (warm)" if e > 2 else "epoch 2")):
        for r in runs:
            if r["size_pct"] is None:
                ax.axhline(r["summary"][key], color=colors.get(r["config"]), linestyle="--",
                           label=LABELS[r["config"]])
        for c in MOUNTED:
            pts = [(r["size_pct"], r["summary"][key]) for r in runs if r["config"] == c]
            if pts:
                ax.plot(*zip(*pts), marker="o", color=colors.get(c), label=LABELS[c])
        ax.set_title(title)
        ax.set_xlabel("RAM tier, % of dataset bytes")
        ax.set_ylabel("epoch time, s")
        ax.set_xticks(sizes)
        ax.grid(alpha=0.3)
    top = max(r["summary"][k] for r in runs for k in ("cold_s", "warm_s"))
    axes[0].set_ylim(0, 1.08 * top)  # shared with axes[1]
    ax = axes[2]
    for c in MOUNTED:
        pts = [(r["size_pct"], 100 * r["summary"]["warm_hit"]) for r in runs if r["config"] == c]
        if pts:
            ax.plot(*zip(*pts), marker="o", color=colors.get(c), label=LABELS[c])
    if sizes:
        ax.plot(sizes, sizes, color="black", linestyle=":", label="cache fraction")
    ax.set_title("hit ratio, warm epochs")
    ax.set_xlabel("RAM tier, % of dataset bytes")
    ax.set_ylabel("hit ratio, %")
    ax.set_xticks(sizes)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, loc="best")
    axes[2].legend(fontsize=8, loc="best")
    d = results["data"]
    fig.suptitle(f"DataLoader(ImageFolder, num_workers={results['args']['workers']}) epoch time, "
                 f"{d['files']} JPEGs ({d['bytes'] / 2**20:.0f} MiB), moto S3 behind "
                 f"{results['proxy']['delay_ms']:g} ms each way + {results['proxy']['rate']}", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def findings(results: Dict[str, Any]) -> List[str]:
    """Sentences computed from the numbers (so the section stays true when regenerated)."""
    runs = results["runs"]
    by = {(r["config"], r["size_pct"]): r["summary"] for r in runs}
    out = []
    direct, local = by.get(("direct", None)), by.get(("local", None))
    if direct and local:
        out.append(f"The slow path costs {direct['warm_s'] / local['warm_s']:.1f}x the local-disk epoch "
                   f"({direct['warm_s']:.1f} s vs {local['warm_s']:.1f} s); the DataLoader waited on data "
                   f"for {direct['warm_wait_s']:.1f} s of it (local disk: {local['warm_wait_s']:.1f} s).")
    sizes = sorted({r["size_pct"] for r in runs if r["size_pct"] is not None})
    for s in sizes:
        parts = []
        for c in MOUNTED:
            x = by.get((c, s))
            if x and direct:
                parts.append(f"{c} {direct['warm_s'] / x['warm_s']:.2f}x at {100 * x['warm_hit']:.0f} % hits")
        if parts:
            out.append(f"At {s} % cache, warm epochs vs direct S3: " + ", ".join(parts) + ".")
    if direct:
        slow = [(c, s) for (c, s), x in by.items() if s is not None and x["warm_s"] > direct["warm_s"]]
        slow_cold = [(c, s) for (c, s), x in by.items() if s is not None and x["cold_s"] > direct["cold_s"]]
        if slow_cold:
            out.append("Cold epochs slower than the direct reader: "
                       + ", ".join(f"{c} {s} % (+{100 * (by[(c, s)]['cold_s'] / direct['cold_s'] - 1):.0f} %)"
                                   for c, s in sorted(slow_cold, key=lambda t: (t[1], t[0])))
                       + " (every open is a miss: the FUSE round trips and the daemon's CPU come on top "
                         "of the same GET).")
        else:
            out.append("No shadefs cold epoch was slower than the direct reader's (whose first epoch "
                       "also creates one botocore client per worker).")
        if slow:
            out.append("Warm epochs slower than the direct reader: "
                       + ", ".join(f"{c} {s} % (+{100 * (by[(c, s)]['warm_s'] / direct['warm_s'] - 1):.0f} %)"
                                   for c, s in sorted(slow, key=lambda t: (t[1], t[0]))) + ".")
        else:
            out.append("No shadefs warm epoch was slower than the direct reader's.")
    gets = {k: r["backend_read"] for r in runs for k in [(r["config"], r["size_pct"])]
            if r.get("backend_read")}
    daemon_gets = [g["mean_ms"] for (c, s), g in gets.items() if s is not None]
    if ("direct", None) in gets and daemon_gets:
        cpu_miss = [r["daemon_cpu_s"] / r["backend_read"]["count"] for r in runs
                    if r["config"] in ("lru", "static") and r.get("daemon_cpu_s") and r.get("backend_read")]
        extra = (f"; the daemon's CPU divided by its misses was {1e3 * min(cpu_miss):.1f}-"
                 f"{1e3 * max(cpu_miss):.1f} ms in the lru/static runs (FUSE requests, the S3 client, admission)"
                 if cpu_miss else "")
        out.append(f"A GET took {gets[('direct', None)]['mean_ms']:.0f} ms on average inside the direct "
                   f"reader's workers and {min(daemon_gets):.0f}-{max(daemon_gets):.0f} ms inside the shadefs "
                   f"daemon, both with 4 readers in flight against the same server (sequential, alone: "
                   f"{results['probe']['proxy']['median_ms']:.0f} ms): moto is one Python process (threads "
                   f"under one GIL), so concurrent GETs largely queue there{extra}.")
    def cpu_per_image(r: Dict[str, Any]) -> float:
        total = r["train_cpu_s"] + (r.get("daemon_cpu_s") or 0.0) + r["moto_cpu_s"] + r["proxy_cpu_s"]
        return 1e3 * total / max(1, sum(e["samples"] for e in r["epochs"]))

    d_run = next((r for r in runs if r["config"] == "direct" and "train_cpu_s" in r), None)
    low = [r for r in runs if r["config"] == "lru" and "train_cpu_s" in r and r["summary"]["warm_hit"] < 0.05]
    if d_run and low and direct:
        worse = [r for r in low if cpu_per_image(r) > cpu_per_image(d_run)]
        if worse:
            out.append("CPU per image, all processes together: direct S3 "
                       f"{cpu_per_image(d_run):.1f} ms, lru at under 5 % hits "
                       + ", ".join(f"{cpu_per_image(r):.1f} ms ({r['size_pct']} %)" for r in worse)
                       + ". The box is CPU-bound (two cores for moto, the proxy, the decoding workers and "
                         "the daemon), so the miss path's extra CPU (the daemon's Python FUSE handlers and "
                         "cache bookkeeping, plus the FUSE system calls in the workers, against one s3fs "
                         "call in each worker for the direct reader) shows up as wall time when almost "
                         "every open is a miss.")
    shade = [(r["size_pct"], [e.get("distinct") for e in r["epochs"]]) for r in runs if r["config"] == "shade"]
    shade = [(sz, d) for sz, d in shade if all(x is not None for x in d)]
    if shade:
        n = results["data"]["files"]
        out.append("Distinct files per epoch in the shade runs: "
                   + "; ".join(f"{sz} %: " + ", ".join(map(str, d)) for sz, d in shade)
                   + f" of {n} (every other run reads all {n} each epoch). Part of its speed-up is reading "
                     "fewer distinct samples: a different training schedule (SHADE's point), not only a "
                     "better cache.")
    if local:
        quick = [(c, s) for (c, s), x in by.items() if s is not None and x["warm_s"] < local["warm_s"]]
        if quick:
            lr = next(r for r in runs if r["config"] == "local")
            fastest = min(e["seconds"] for e in lr["epochs"])
            below = [(c, s) for c, s in quick if by[(c, s)]["warm_s"] < fastest]
            out.append("Warm epochs faster than the local-disk run's warm mean, which should be the limit: "
                       + ", ".join(f"{c} {s} %" for c, s in quick)
                       + ". The local epochs took " + ", ".join(f"{e['seconds']:.1f}" for e in lr["epochs"])
                       + f" s (load {lr['load_before'][0]:.1f} before the run): "
                       + ("below even its fastest epoch: " + ", ".join(f"{c} {s} %" for c, s in below)
                          + "; shade decodes the same cached files repeatedly and reads fewer distinct "
                            "files. " if below else "none beats its fastest epoch, so this is load "
                                                    "noise. ")
                       + "Rerun on a quiet machine before reading anything into it.")
    for c in MOUNTED:
        pts = sorted((s, x["warm_s"]) for (cc, s), x in by.items() if cc == c and s is not None)
        bumps = [(a, b) for a, b in zip(pts, pts[1:]) if b[1] > 1.15 * a[1]]
        if bumps:
            out.append(f"{c}: warm epochs got slower with more cache ("
                       + ", ".join(f"{a[0]} % {a[1]:.1f} s -> {b[0]} % {b[1]:.1f} s" for a, b in bumps)
                       + "): noise from the other jobs on the machine (see the load column), not an effect "
                         "of the cache size.")
    return out


def render_section(results: Dict[str, Any]) -> str:
    a, d, p = results["args"], results["data"], results["probe"]
    m = results["machine"]
    cmd = "python -m shadefs.bench epoch --write-doc"
    extra = []
    if a["train_limit"] != 2000:
        extra.append(f"--train-limit {a['train_limit']}")
    if a["epochs"] != 3:
        extra.append(f"--epochs {a['epochs']}")
    if a["sizes"] != [10, 20, 40]:
        extra.append("--sizes " + ",".join(map(str, a["sizes"])))
    if a["delay_ms"] != 1.0 or a["rate"] != "1gbit":
        extra.append(f"--delay-ms {a['delay_ms']:g} --rate {a['rate']}")
    if a.get("proxy_mode", "http") != "http":
        extra.append(f"--proxy-mode {a['proxy_mode']}")
    if extra:
        cmd += " " + " ".join(extra)
    ls, le = results["load_start"], results["load_end"]
    loads = [r["load_before"][0] for r in results["runs"]]
    pc = results.get("proxy_counters") or {}
    late = ""
    if pc:
        reqs = f"{pc['requests']} requests over " if pc.get("mode") == "http" else ""
        late = (f" Over the whole benchmark the proxy carried {reqs}{pc['connections']} client "
                f"connections; its timers delivered response chunks a mean {pc['late_down']['mean_ms']:.2f} ms "
                f"(p99 {pc['late_down']['p99_ms']:.2f} ms) after their due time (CPU contention), on top "
                "of the configured delay.")
    chunks = results.get("chunks") or [{k: results.get(k) for k in ("command", "started", "load_start",
                                                                     "load_end", "total_s", "limit")}]
    if len(chunks) > 1 or chunks[0].get("command"):
        head = (f"*Generated by `python -m shadefs.bench epoch` from {len(chunks)} command(s), one bench lock hold "
                f"each (about {results['total_s'] / 60:.0f} min in all), rendered with `python "
                f"python -m shadefs.bench epoch --results CHUNK.json ... --write-doc`:*")
        cmds = [f"- `{c['command']}` ({c['started']}, {c['total_s'] / 60:.1f} min, load "
                f"{c['load_start'][0]:.2f} -> {c['load_end'][0]:.2f})" for c in chunks]
    else:
        head = (f"*Generated by `python -m shadefs.bench epoch` on {results['started']}; regenerate with `{cmd}`"
                f" (about {results['total_s'] / 60:.0f} min here).*")
        cmds = []
    lim_lines = []
    for c in chunks:
        L = c.get("limit")
        if L:
            lim_lines.append(
                f"- moto alone {L['moto_alone']:.0f} GETs/s (4 processes x {max(1, L['concurrency'] // 4)} "
                f"clients); through the proxy {L['proxy_1proc']:.0f}/s with {L['concurrency']} clients in one "
                f"process, {L['proxy_4proc']:.0f}/s in 4 processes: **limit {L['proxy_c']:.0f} GETs/s** (load "
                f"{L['load'][0]:.2f}); an epoch of {d['files']} cold files at that rate: "
                f"{d['files'] / L['proxy_c']:.1f} s; the link ({a['rate']}) carries the "
                f"{d['bytes'] / 2**20:.1f} MiB in {d['bytes'] / L['link_Bps']:.2f} s" if L.get("link_Bps") else "")
    lines = [
        START,
        "## Epoch time over slow storage",
        "",
        head,
        "",
    ] + (cmds + [""] if cmds else []) + [
        "**The physical limit**, measured first in each command (whole-object GETs of all the dataset's "
        "objects, no FUSE, no cache):",
        "",
    ] + lim_lines + [
        "",
        "Per-epoch columns: GETs and MiB = requests and object bytes **counted by the proxy** during "
        "that epoch (misses, prefetches, the lookahead into the next epoch; warm = mean of epochs "
        "2..E); no wait = (RAM hits + opens served by a completed prefetch) / opens; **limit** = the "
        "slowest of that epoch's own GETs at the measured GETs/s, its bytes at the link rate, and the "
        "local-disk run's epoch (decoding and the model take that long anyway); x limit = epoch / limit "
        "(1.00 = at the physical limit).",
        "",
        f"**What is timed.** One pass of `DataLoader(dataset, batch_size={a['batch_size']}, "
        f"num_workers={a['workers']}, persistent_workers=True)` with a training step per batch, "
        f"{a['epochs']} epochs per run, each run a fresh process. Epoch 1 is shown apart (cold: empty "
        f"cache, workers starting) from the mean of epochs 2..{a['epochs']} (warm).",
        "",
        "**Runs.**",
        "",
        "- *direct S3 (no shadefs)*: a plain ImageFolder cannot open `s3://`, so this is the FUSE-less "
        "reader one would write: a torch `Dataset` that lists the prefix once (s3fs `find`) and reads "
        "each sample with one GET (s3fs `cat_file`, `max_concurrency=1`: the same one GET shadefs makes on "
        "a miss), through the same proxy, decoded as ImageFolder does (`PIL.Image.open(...)."
        "convert(\"RGB\")`), one s3fs client per worker. Same classes, sample order and shuffle seed as "
        "ImageFolder.",
        "- *shadefs lru / static*: `shadefs mount s3://... MNT --policy P --ram-cache C% --backend-opt "
        "endpoint_url=<proxy>` (RAM tier only), an unmodified `ImageFolder(MNT/train)`, `shuffle=True`.",
        "- *shadefs shade + hook*: `--policy shade` with `ShadeSampler` + `ScoreReporter` from "
        "`shadefs.hooks` (as `train_fashion_mnist.py --hook`; no validation, so PADS stays in its "
        "aggressive mode after epoch 0). Epochs draw N samples with replacement, cached ones first and "
        "repeated `rep_factor`=3 times.",
        "- *shadefs shade + hook* announces each epoch's PADS draw to the daemon (`ShadeSampler`'s "
        "default); *shade + hook, no plan* is the same with `announce_plan=False`.",
        "- *shadefs static + PlanSampler*: `--policy static`, `PlanSampler(dataset, seed=0)` instead of "
        "`shuffle=True` (the same uniform permutations, each epoch announced with one lookahead epoch): "
        "the daemon prefetches in plan order and evicts by the known future (Belady on the plan).",
        "- *local disk (no shadefs)*: ImageFolder on the local copy of the same files, page cache warm: "
        "the limit.",
        "",
        "Every shadefs run mounts fresh (empty RAM tier), reads `shadefs stats --json` after every epoch "
        "(hit ratio per epoch = hits / opens of that epoch; \"stats\" columns = the whole run) and "
        "unmounts.",
        "",
        f"**Data.** The first {d['files']} Fashion-MNIST training images, upscaled to 224x224 RGB, "
        f"Gaussian pixel noise sigma={a['noise']:g} added, JPEG quality {a['quality']}: "
        f"mean {d['mean_bytes'] / 1e3:.1f} kB per file, {d['bytes'] / 2**20:.1f} MiB in all (without "
        "the noise the files are ~5.5 kB, which no storage finds slow; ImageNet's full-size JPEGs "
        f"average ~110 kB). Transform: `Resize({a['image_size']})`, `ToTensor`, `Normalize`. Model: a "
        f"small CNN for 3x{a['image_size']}x{a['image_size']} (conv 5x5/2 16ch, pool, conv 3x3 32ch, "
        "pool, FC 96, FC 10), SGD, 1 torch thread in the main process: compute is small on purpose.",
        "",
        f"**Slow storage.** moto's S3 server (`python -m moto.server`) on loopback, behind "
        f"`shadefs/testing/latency_proxy.py`: {results['proxy']['settings'].split(': ', 1)[1]}. This is the "
        "stand-in for `tc qdisc add dev lo root netem delay "
        f"{a['delay_ms']:g}ms rate {a['rate']}`, which this kernel lacks (no `sch_netem`): a threaded "
        "proxy that delivers every chunk a fixed delay after it arrived (a delay line per direction), "
        "after serialising it at the rate (one link per direction, shared by all connections). moto's "
        "werkzeug server closes the connection after every response, which S3 never does; so the "
        "proxy keeps the client's connections alive (as an S3 front end does) and talks to moto over "
        "a fresh, undelayed loopback connection per request. The client side (obstore, or s3fs with "
        "`--backend fsspec`, in the shadefs daemon; s3fs in each DataLoader worker for the direct reader) therefore sees pooled "
        "keep-alive connections with a 2 ms RTT, as against a nearby object store. "
        f"Measured GET of one {p.get('object_kb', d['mean_bytes'] / 1e3):.0f} kB object (s3fs "
        f"`cat_file`, sequential, interleaved, median / p90): moto alone {p['moto']['median_ms']:.1f} / "
        f"{p['moto']['p90_ms']:.1f} ms, through the proxy {p['proxy']['median_ms']:.1f} / "
        f"{p['proxy']['p90_ms']:.1f} ms. moto is a Python server: most of a GET's time is its own "
        f"service time (and CPU on the same {m['cpus']} cores), like a busy object store a few ms "
        f"away.{late}",
        "",
        f"**Machine.** {m['cpus']} cores, Linux {m['kernel']}, Python {m['python']}, torch "
        f"{m.get('torch', '?')}. {a['workers']} DataLoader workers on {m['cpus']} cores (plus moto, "
        "the proxy and the shadefs daemon) oversubscribe the CPU: as the issue asks, but the decode "
        "and the daemon compete for the same cores. Load average (1 min) at start "
        f"{ls[0]:.2f}, before each run {min(loads):.2f}..{max(loads):.2f}, at the end {le[0]:.2f} "
        "(other jobs were running: treat differences under ~15 % as noise).",
        "",
        table(results),
        "",
        "![epoch time and hit ratio](../img/bench_epoch.png)",
        "",
        f"Where the time went, per run ({m['cpus']} cores). \"epochs, sum\" is wall time; the CPU "
        "columns are CPU seconds of the whole run; \"training + workers\" is the training process and "
        "its DataLoader workers (process start, decoding, the model and, for direct S3, the s3fs "
        "clients). \"mean GET\" is the whole-object GET as its caller saw it: the daemon's "
        "`shadefs_backend_read_seconds` histogram (misses), or `cat_file` timed inside the direct "
        "reader's workers:",
        "",
        cpu_table(results),
        "",
        "**Findings (computed from the table).**",
        "",
    ]
    lines += [f"- {s}" for s in findings(results)]
    lines += [
        "",
        "**Reading it.** With `shuffle=True` every file is read once per epoch, so `static` can hit at "
        "most the cache fraction and `lru` about (fraction)^2/2 (docs/policies.md): their warm epochs are "
        "still mostly misses, and their time is set by the miss path (the GET, plus the FUSE round "
        "trips and the daemon's CPU) more than by the hits. The shade run changes the access pattern "
        "instead (importance sampling with replacement, cached samples first and repeated), which is "
        "what lets it beat the cache fraction. The \"load\" column is the 1-minute load average just "
        "before each run.",
        END,
    ]
    return "\n".join(lines)


def write_doc(results: Dict[str, Any], doc: str = DOC, png: str = PLOT) -> None:
    section = render_section(results)
    docsection.write_section(doc, "bench_epoch", section)
    plot(results, png)


#: the runner's common options this benchmark honours
COMMON = ('baseline', 'write_doc', 'json')


def add_arguments(p) -> None:
    p.add_argument("--train-limit", type=int, default=None, metavar="N",
                   help="training images (default 2000; --quick: 400)")
    p.add_argument("--epochs", type=int, default=None, help="epochs per run (default 3; --quick: 2)")
    p.add_argument("--sizes", default=None, help="RAM-tier sizes, %% of the dataset (default 10,20,40; "
                                                 "--quick: 20)")
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                   help="which runs: direct,local,lru,static,shade,plan,shade-noplan (default), and "
                   "direct-obstore (the direct reader on obstore instead of s3fs), "
                   "lru-fsspec,static-fsspec (--backend fsspec), lru-base,static-base (--baseline REV)")
    p.add_argument("--quick", action="store_true", help="a ~2 minute validation run")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run the whole list of configs N times, round after round (load swings hit all)")
    p.add_argument("--no-limit", action="store_true", help="skip the physical-limit probe (about a minute)")
    p.add_argument("--delay-ms", type=float, default=1.0, help="proxy: one-way delay per direction")
    p.add_argument("--rate", default="1gbit", help="proxy: rate per direction (0 = unlimited)")
    p.add_argument("--proxy-mode", choices=("http", "tcp"), default="http",
                   help="proxy: http keeps client connections alive (default; moto closes every "
                        "connection, S3 does not); tcp: plain pipe")
    p.add_argument("--noise", type=float, default=32.0,
                   help="std of the Gaussian pixel noise added before JPEG encoding (default 32)")
    p.add_argument("--quality", type=int, default=95, help="JPEG quality (default 95)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers (default 4)")
    p.add_argument("--image-size", type=int, default=64, help="transforms.Resize target (default 64)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "shadefs-bench-epoch"))
    p.add_argument("--limit-clients", type=int, default=32,
                   help="clients of the physical-limit probe (default 32, the prefetch concurrency)")
    p.add_argument("--run-timeout", type=float, default=1800, help="seconds per training run")
    p.add_argument("--results", metavar="IN.json", nargs="+",
                   help="render from saved results (several: chunks of one grid, merged); run nothing")


def run(a, bench):
    a.train_limit = a.train_limit or (400 if a.quick else 2000)
    a.epochs = a.epochs or (2 if a.quick else 3)
    a.sizes = [int(s) for s in (a.sizes or ("20" if a.quick else "10,20,40")).split(",") if s]
    a.configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    bad = set(a.configs) - set(CONFIG_ORDER)
    if bad:
        bench.error(f"--configs: unknown {sorted(bad)}")
    if any(c.endswith("-base") for c in a.configs) and not a.baseline:
        bench.error("--configs lru-base/static-base need --baseline REV")
    if a.epochs < 1 or a.train_limit < 1 or not a.sizes or any(not 0 < s <= 100 for s in a.sizes):
        bench.error("--epochs, --train-limit must be >= 1 and --sizes in 1..100")

    def _term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    if a.results:
        results = merge_results(a.results)
    else:
        try:
            results = run_benchmark(a, bench)
        except KeyboardInterrupt:
            log("interrupted: mounts unmounted, moto and the proxy stopped")
            return 130
        out = a.json or os.path.join(a.workdir, "results.json")
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
        log(f"results in {out}")
    print(results["proxy"]["settings"])
    p = results["probe"]
    print(f"GET latency median: moto {p['moto']['median_ms']:.1f} ms, via proxy {p['proxy']['median_ms']:.1f} ms")
    print(table(results))
    print()
    print(cpu_table(results))
    for s in findings(results):
        print("- " + s)
    print(f"load average: start {results['load_start'][0]:.2f}, end {results['load_end'][0]:.2f}; "
          f"total {results['total_s']:.0f} s")
    if a.write_doc:
        write_doc(results)
        log(f"wrote {DOC} and {PLOT}")
    return 0


if __name__ == "__main__":  # one training run (run_child starts this file with --child CONFIG)
    sys.exit(child_main(json.loads(sys.argv[sys.argv.index("--child") + 1])))
