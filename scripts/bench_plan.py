#!/usr/bin/env python3
"""Clairvoyant caching over slow S3: epoch times, backend reads vs OPT, opens served without waiting.

A real S3 server process (moto, one Python process) behind the latency proxy (``--delay-ms`` each way,
1 Gbit/s), a Fashion-MNIST ImageFolder subset uploaded to it, and, side by side in one run, from a cold
cache each:

- ``local``: the ImageFolder on local disk (page cache warm after its first epoch);
- ``direct``: DataLoader workers GET each file from S3 themselves (s3fs), no mount;
- ``shuffle+static``: a mount (``--ram-cache`` PCT %, ``static``), ``shuffle=True``;
- ``plan+static``: the same mount, ``PlanSampler`` (same uniform permutations, announced).

Per epoch: wall seconds, opens, hits, prefetch ready / late, misses, backend reads (files read from the
backend), and OPT's misses on the run's own recorded trace (``sim.belady`` at the same cache size). First
it measures the physical limit: GETs per second that the proxy + moto sustain with 1 and with
``--concurrency`` clients in parallel (no FUSE, no cache).

    python scripts/bench_plan.py --data /tmp/fm [--n 2000] [--delay-ms 1] [--pct 10] [--epochs 2]

The reader does no training (``--step-ms`` of sleep per batch stands in for it): this measures the
data path. Prints tables; ``--json OUT`` saves the numbers.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from shadefs import sim
from shadefs.testing.s3 import LatencyProxyProcess, MotoServer

SHADEFS = [sys.executable, "-m", "shadefs"]
BUCKET = "bench-plan"


class Files(Dataset):
    """ImageFolder-like: ``samples`` of (path, class); an item is its file's bytes (length)."""

    def __init__(self, root, rel=None):
        self.root = str(root)
        rel = rel or sorted(os.path.relpath(os.path.join(d, f), self.root)
                            for d, _, fs in os.walk(self.root) for f in fs)
        self.rel = rel
        self.samples = [(os.path.join(self.root, r), 0) for r in rel]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        fd = os.open(self.samples[i][0], os.O_RDONLY)
        try:
            n = 0
            while True:
                b = os.read(fd, 1 << 20)
                if not b:
                    return n
                n += len(b)
        finally:
            os.close(fd)


class S3Files(Dataset):
    """Each DataLoader worker GETs the objects itself (s3fs, one filesystem per process)."""

    def __init__(self, endpoint, rel):
        self.endpoint, self.rel = endpoint, rel
        self._fs = None

    def __len__(self):
        return len(self.rel)

    def __getitem__(self, i):
        if self._fs is None:
            import s3fs
            self._fs = s3fs.S3FileSystem(anon=False, client_kwargs={"endpoint_url": self.endpoint},
                                         skip_instance_cache=True)
        return len(self._fs.cat_file(f"{BUCKET}/train/{self.rel[i]}"))


def limit_gets(endpoint, keys, concurrency):
    """GETs/s with ``concurrency`` boto3 clients in parallel (the physical limit of proxy + moto)."""
    import boto3

    clients = [boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1") for _ in range(concurrency)]

    def worker(k):
        c = clients[k]
        for key in keys[k::concurrency]:
            c.get_object(Bucket=BUCKET, Key=key)["Body"].read()

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    return len(keys) / (time.perf_counter() - t0)


def read_epochs(ds, sampler_factory, args):
    """Per epoch wall seconds of a DataLoader over ``ds``."""
    sampler = sampler_factory()
    kw = dict(batch_size=args.batch_size, num_workers=args.workers, persistent_workers=True,
              multiprocessing_context="fork")
    loader = DataLoader(ds, sampler=sampler, **kw) if sampler is not None else \
        DataLoader(ds, shuffle=True, generator=torch.Generator().manual_seed(0), **kw)
    out = []
    for e in range(args.epochs):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(e)
        t0 = time.perf_counter()
        for _ in loader:
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
        out.append(time.perf_counter() - t0)
    return out


def stats_of(mnt):
    from shadefs.control.client import ControlClient, find_endpoint

    c = ControlClient(find_endpoint(mnt))
    try:
        return c.stats()
    finally:
        c.close()


def run_mount(name, proxy, args, work, use_plan, n_files, total_bytes):
    mnt = os.path.join(work, f"mnt-{name}")
    os.makedirs(mnt, exist_ok=True)
    trace = os.path.join(work, f"{name}.trace.csv")
    cache_bytes = int(total_bytes * args.pct / 100)
    subprocess.run(SHADEFS + ["mount", f"s3://{BUCKET}/train", mnt, "--ram-cache", str(cache_bytes),
                              "--policy", "static", "--trace", trace, "--no-kernel-cache",
                              "--log-file", os.path.join(work, f"{name}.log"),
                              "--backend-opt", f"endpoint_url={proxy.endpoint}"], check=True,
                   capture_output=True)
    try:
        ds = Files(mnt)
        from shadefs.hooks import PlanSampler

        epochs = []
        factory = (lambda: PlanSampler(ds, seed=0)) if use_plan else (lambda: None)
        sampler = factory()
        kw = dict(batch_size=args.batch_size, num_workers=args.workers, persistent_workers=True,
                  multiprocessing_context="fork")
        loader = DataLoader(ds, sampler=sampler, **kw) if sampler is not None else \
            DataLoader(ds, shuffle=True, generator=torch.Generator().manual_seed(0), **kw)
        prev = stats_of(mnt)
        for e in range(args.epochs):
            if sampler is not None:
                sampler.set_epoch(e)
            t0 = time.perf_counter()
            for _ in loader:
                if args.step_ms:
                    time.sleep(args.step_ms / 1000)
            dt = time.perf_counter() - t0
            s = stats_of(mnt)
            p, q = s["prefetch"], prev["prefetch"]
            hits = s["hits"]["ram"] + s["hits"]["disk"] - prev["hits"]["ram"] - prev["hits"]["disk"]
            ep = {"epoch": e + 1, "seconds": dt, "opens": s["opens"] - prev["opens"], "hits": hits,
                  "ready": p["ready"] - q["ready"], "late": p["late"] - q["late"],
                  "misses": s["misses"] - prev["misses"],
                  "backend_bytes": s["backend_bytes"] - prev["backend_bytes"],
                  "wasted_bytes": p["wasted_bytes"] - q["wasted_bytes"]}
            ep["backend_reads"] = ep["ready"] + ep["late"] + ep["misses"]
            epochs.append(ep)
            prev = s
        del loader
    finally:
        subprocess.run(SHADEFS + ["umount", mnt], capture_output=True)
    # OPT on this run's own trace, per epoch
    t = sim.read_trace(trace)
    mask = np.zeros(t.requests, dtype=bool)
    sim.belady(t, cache_bytes, hit_mask=mask)
    for i, ep in enumerate(epochs):
        seg = mask[i * n_files:(i + 1) * n_files]
        ep["opt_misses"] = int(seg.size - seg.sum())
    return epochs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a make_fashion_mnist.py tree (its train/ is used)")
    ap.add_argument("--n", type=int, default=2000, help="files uploaded (default 2000)")
    ap.add_argument("--delay-ms", type=float, default=1.0, help="one-way delay of the proxy (default 1: 2 ms RTT)")
    ap.add_argument("--pct", type=float, default=10.0, help="RAM cache, %% of the dataset (default 10)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--step-ms", type=float, default=0.0, help="sleep per batch (stands in for training)")
    ap.add_argument("--concurrency", type=int, default=32, help="clients for the physical-limit probe")
    ap.add_argument("--modes", default="local,direct,shuffle+static,plan+static")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    for k, v in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                 ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_EC2_METADATA_DISABLED", "true"),
                 ("NO_PROXY", "127.0.0.1,localhost")):
        os.environ.setdefault(k, v)
    work = tempfile.mkdtemp(prefix="plan-bench-")
    src = os.path.join(args.data, "train")
    rel = sorted(os.path.relpath(os.path.join(d, f), src) for d, _, fs in os.walk(src) for f in fs)[:args.n]
    local = os.path.join(work, "local")
    for r in rel:
        os.makedirs(os.path.dirname(os.path.join(local, r)), exist_ok=True)
        shutil.copyfile(os.path.join(src, r), os.path.join(local, r))
    total = sum(os.path.getsize(os.path.join(local, r)) for r in rel)
    out = {"n": len(rel), "bytes": total, "delay_ms": args.delay_ms, "pct": args.pct, "runs": {}}
    with MotoServer(log_file=os.path.join(work, "moto.log")) as moto:
        s3 = moto.client()
        s3.create_bucket(Bucket=BUCKET)
        for r in rel:
            with open(os.path.join(local, r), "rb") as f:
                s3.put_object(Bucket=BUCKET, Key=f"train/{r}", Body=f.read())
        with LatencyProxyProcess(moto.port, delay_ms=args.delay_ms, rate="1gbit") as proxy:
            keys = [f"train/{r}" for r in rel]
            out["limit_gets_per_s"] = {1: limit_gets(proxy.endpoint, keys[:300], 1),
                                       args.concurrency: limit_gets(proxy.endpoint, keys, args.concurrency)}
            out["limit_gets_per_s_no_proxy"] = {args.concurrency: limit_gets(moto.endpoint, keys, args.concurrency)}
            for mode in args.modes.split(","):
                print(f"... {mode}", file=sys.stderr, flush=True)
                if mode == "local":
                    ds = Files(local, rel)
                    out["runs"][mode] = [{"epoch": i + 1, "seconds": t}
                                         for i, t in enumerate(read_epochs(ds, lambda: None, args))]
                elif mode == "direct":
                    ds = S3Files(proxy.endpoint, rel)
                    out["runs"][mode] = [{"epoch": i + 1, "seconds": t}
                                         for i, t in enumerate(read_epochs(ds, lambda: None, args))]
                elif mode in ("shuffle+static", "plan+static"):
                    out["runs"][mode] = run_mount(mode, proxy, args, work, mode == "plan+static", len(rel), total)
    print(f"n = {len(rel)} files, {total / 2**20:.2f} MiB, S3 = moto behind the proxy at {args.delay_ms:g} ms "
          f"each way, 1 Gbit/s; cache {args.pct:g} %; {args.workers} DataLoader workers, batch {args.batch_size}")
    lim = out["limit_gets_per_s"]
    print(f"physical limit: {lim[1]:.0f} GETs/s with 1 client, {lim[args.concurrency]:.0f} GETs/s with "
          f"{args.concurrency} (moto alone, no proxy: {out['limit_gets_per_s_no_proxy'][args.concurrency]:.0f}); "
          f"an epoch at the {args.concurrency}-client limit: {len(rel) / lim[args.concurrency]:.2f} s")
    head = ("mode", "epoch", "seconds", "x local", "files/s", "opens", "hits", "ready", "late", "misses",
            "backend reads", "OPT misses", "no wait %")
    print("  ".join(head))
    local_t = {e["epoch"]: e["seconds"] for e in out["runs"].get("local", [])}
    for mode, eps in out["runs"].items():
        for e in eps:
            row = [mode, str(e["epoch"]), f"{e['seconds']:.2f}",
                   f"{e['seconds'] / local_t[e['epoch']]:.2f}" if e["epoch"] in local_t else "",
                   f"{len(rel) / e['seconds']:.0f}"]
            if "opens" in e:
                nowait = 100.0 * (e["hits"] + e["ready"]) / e["opens"] if e["opens"] else 0.0
                row += [str(e["opens"]), str(e["hits"]), str(e["ready"]), str(e["late"]), str(e["misses"]),
                        str(e["backend_reads"]), str(e["opt_misses"]), f"{nowait:.1f}"]
            print("  ".join(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
