"""The epoch benchmark's measurement: the dataset, moto behind the latency proxy, the physical-limit
probe, the mounts, and the training runs (each a child process, :mod:`shadefs.bench.epoch.child`) with
the proxy's counts per epoch."""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np

from shadefs.bench.epoch import child
from shadefs.bench.epoch.configs import BUCKET, CONFIG_ORDER, DIRECT, LABELS, MOUNTED, POLICY, log
from shadefs.bench.runner import example
from shadefs.testing import Mount, proc_cpu_s, unmount
from shadefs.testing.datasets import completed_tree, mark_complete
from shadefs.testing.latency_proxy import parse_rate
from shadefs.testing.s3 import DUMMY_AWS_ENV, LatencyProxyProcess, MotoServer, free_port
from shadefs.testing.s3data import probe, upload


# -- data ----------------------------------------------------------------------------------------------
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


# -- moto, proxy, probes -------------------------------------------------------------------------------
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


# -- shadefs mounts ------------------------------------------------------------------------------------
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


# -- the training child, the runs ----------------------------------------------------------------------
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
    proc = subprocess.Popen([sys.executable, os.path.abspath(child.__file__), "--child", json.dumps(cfg)],
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
