"""Clairvoyant caching over slow S3, the grid: epoch times, backend GETs counted by the proxy, vs OPT.

A real S3 server process (moto, one Python process) behind the latency proxy (``--delay-ms`` each way,
1 Gbit/s per direction), a Fashion-MNIST ImageFolder subset uploaded to it, and, side by side in one run,
each from a cold cache, for every cache size in ``--pcts`` (percent of the dataset's bytes, RAM tier only):

- ``local``: the files on local disk (page cache warm after its first epoch; no cache size);
- ``direct``: DataLoader workers GET each file from S3 themselves (s3fs), no mount (no cache size);
- ``shuffle+static``: a mount (``--policy static``), ``DataLoader(shuffle=True)``;
- ``plan+static``: the same mount, ``PlanSampler`` (the same uniform permutations, announced, one
  lookahead epoch);
- ``shade+shade``: ``--policy shade``, ``ShadeSampler(announce_plan=False)`` + ``ScoreReporter``;
- ``shadeplan+shade``: the same with ``ShadeSampler``'s default, announcing each epoch's PADS draw.

The reader does no training: per batch it only reports the losses (ShadeSampler modes) and sleeps
``--step-ms`` (the training step; ``auto`` = the step of a model that consumes ``--step-load`` (75 %) of
what the backend sustains: ``batch / (0.75 * limit GETs/s)``). The ShadeSampler modes report a fixed
synthetic loss per sample (lognormal, sigma 1, seeded): a stand-in for a model whose hard samples stay
hard, so importance is skewed and stable as in SHADE's traces; no model is trained here
(``shadefs.bench plan_tta`` trains one).

Per epoch: wall seconds; opens, hits, prefetch ready / late, misses (the daemon's stats); GETs and object
bytes **counted by the proxy** (``LatencyProxyProcess.snapshot``: every request that crossed the link,
prefetches included); OPT's misses on the run's own recorded trace (``sim.belady`` at the same cache
bytes, the whole run's future known). First it measures the physical limit: GETs/s that moto sustains
alone and through the proxy with 1 and with ``--concurrency`` (the prefetch concurrency, 32) clients in
parallel, no FUSE, no cache, and the link's byte rate.

    python -m shadefs.bench plan --data /tmp/plan-fm --n 1000 --delay-ms 1 --pcts 0,5,10,20,40 \\
        --epochs 3 --json /tmp/grid-1ms-a.json
    python -m shadefs.bench plan --render /tmp/grid-*.json [--write-doc]   # tables, plots, the doc section

The regime (``--regime``, printed first as :func:`shadefs.testing.regime.describe` words it): ``dontneed``
(default: the reader drops each file's pages after reading it, so the kernel keeps nothing between
epochs), ``cgroup`` (the reader, i.e. the DataLoader workers that open and read the files, in a
:class:`~shadefs.testing.regime.MemoryCgroup` of ``--cgroup-mib``) or ``pagecache`` (unbounded: not the
regime users have). Mounts keep the kernel cache on. ``--tier disk`` puts the cache on an NVMe tier
(``--ram-cache 0 --disk-cache DIR --disk-cache-size PCT%``) instead of RAM. Without ``--data`` the script
uploads ``--n`` random files of ``--file-kb`` kB. After the runs it prints one row per epoch (time, the
daemon's outcomes, the page probe's counters, proxy GETs)::

    python -m shadefs.bench plan --n 1200 --file-kb 60 --delay-ms 5 --tier disk --pcts 20 \
        --modes shuffle+static,plan+static --regime cgroup --cgroup-mib 160 --epochs 3

Each invocation appends its runs to ``--json`` after every run (so a grid can be run in chunks, one bench
lock hold each); ``--render`` merges several files (grouped by delay), prints the tables and with
``--write-doc`` writes the ``bench_plan`` section of docs/results/plan.md and docs/img/plan_grid_*.png.
"""
from __future__ import annotations

import concurrent.futures as cf
import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from shadefs import sim

from shadefs.bench.runner import ROOT

REPO = ROOT
DOC = os.path.join(REPO, "docs", "results", "plan.md")
IMG_DIR = os.path.join(REPO, "docs", "img")
SHADEFS = [sys.executable, "-m", "shadefs"]
BUCKET = "bench-plan"
MOUNT_MODES = ("shuffle+static", "plan+static", "shade+shade", "shadeplan+shade")
ALL_MODES = ("local", "direct") + MOUNT_MODES
LABEL = {"local": "local disk", "direct": "direct S3 (s3fs in the workers)",
         "shuffle+static": "shuffle + static", "plan+static": "PlanSampler + static",
         "shade+shade": "ShadeSampler + shade (no plan)", "shadeplan+shade": "ShadeSampler with plan + shade"}


class Files:
    """ImageFolder-like: ``samples`` of (path, class) and ``root``; an item is ``(index, bytes read)``; with
    ``drop_pages`` each file's pages are dropped after reading it, on the same open (the dontneed regime)."""

    def __init__(self, root, rel=None, drop_pages=False):
        self.root = str(root)
        self.drop_pages = drop_pages
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
                    if self.drop_pages:
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    return i, n
                n += len(b)
        finally:
            os.close(fd)


class S3Files:
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
        return i, len(self._fs.cat_file(f"{BUCKET}/train/{self.rel[i]}"))


def limit_gets(endpoint, keys, concurrency):
    """GETs/s with ``concurrency`` boto3 clients in parallel, each reading its share of ``keys``."""
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


def stats_of(mnt):
    from shadefs.control.client import ControlClient, find_endpoint

    c = ControlClient(find_endpoint(mnt))
    try:
        return c.stats()
    finally:
        c.close()


def synthetic_losses(n, seed=0):
    """A fixed per-sample loss (lognormal, sigma 1): skewed, stable importance."""
    return np.random.default_rng(seed).lognormal(0.0, 1.0, n).astype(np.float32)


def run_epochs(ds, mode, args, proxy, mnt=None):
    """Run ``args.epochs`` epochs of a DataLoader over ``ds``; per epoch wall seconds, proxy GETs/bytes
    and (with ``mnt``) the daemon's counters. In the cgroup regime the DataLoader workers (the processes
    that open and read the files, so the kernel charges the pages to them) each enter a fresh
    :class:`MemoryCgroup` of ``--cgroup-mib`` as they start."""
    if args.regime != "cgroup":
        return _run_epochs(ds, mode, args, proxy, mnt, None)
    from shadefs.testing.regime import MemoryCgroup

    with MemoryCgroup(args.cgroup_mib << 20) as cg:
        return _run_epochs(ds, mode, args, proxy, mnt, cg)


def _enter_cgroup(cg, worker_id):
    cg.enter_self()  # DataLoader worker_init_fn (fork: not pickled)


def _run_epochs(ds, mode, args, proxy, mnt, cg):
    import functools

    import torch
    from torch.utils.data import DataLoader

    kw = dict(batch_size=args.batch_size, num_workers=args.workers, persistent_workers=True,
              multiprocessing_context="fork")
    if cg is not None:
        kw["worker_init_fn"] = functools.partial(_enter_cgroup, cg)
    sampler = reporter = None
    losses = None
    if mode == "plan+static":
        from shadefs.hooks import PlanSampler

        sampler = PlanSampler(ds, seed=0)
    elif mode in ("shade+shade", "shadeplan+shade"):
        from shadefs.hooks import ScoreReporter, ShadeSampler

        sampler = ShadeSampler(ds, seed=0, announce_plan=(mode == "shadeplan+shade"))
        reporter = ScoreReporter(ds, sampler=sampler)
        losses = synthetic_losses(len(ds))
    loader = DataLoader(ds, sampler=sampler, **kw) if sampler is not None else \
        DataLoader(ds, shuffle=True, generator=torch.Generator().manual_seed(0), **kw)
    out = []
    prev = stats_of(mnt) if mnt else None
    pprev = proxy.snapshot()
    for e in range(args.epochs):
        if sampler is not None:
            if e == args.epochs - 1 and hasattr(sampler, "lookahead_epochs") and args.no_final_lookahead:
                sampler.lookahead_epochs = 0  # a job that knows its epoch count announces nothing past it
            sampler.set_epoch(e)
        t0 = time.perf_counter()
        for idx, _ in loader:
            if reporter is not None:
                reporter.report(losses[idx.numpy()], indices=idx.numpy())
            if args.step_s:
                time.sleep(args.step_s)
        if reporter is not None:
            reporter.on_epoch_end()
        dt = time.perf_counter() - t0
        p = proxy.snapshot()
        ep = {"epoch": e + 1, "seconds": dt, "gets": p["gets"] - pprev["gets"],
              "get_bytes": p["get_body_bytes"] - pprev["get_body_bytes"]}
        pprev = p
        if cg is not None:
            ep["cgroup_cache_mib"] = cg.page_cache_bytes() / 2**20
            ep["cgroup_peak_mib"] = cg.peak_bytes() / 2**20
        if mnt:
            s = stats_of(mnt)
            pf, q = s["prefetch"], prev["prefetch"]
            for k in ("probed", "kernel_kept", "kernel_reads"):
                ep[k] = pf.get(k, 0) - q.get(k, 0)
            hits = sum(s["hits"].values()) - sum(prev["hits"].values())
            ep.update({"opens": s["opens"] - prev["opens"], "hits": hits,
                       "ready": pf["ready"] - q["ready"], "late": pf["late"] - q["late"],
                       "late_wait_s": pf["late_wait_s"] - q["late_wait_s"],
                       "misses": s["misses"] - prev["misses"],
                       "backend_bytes": s["backend_bytes"] - prev["backend_bytes"],
                       "wasted_bytes": pf["wasted_bytes"] - q["wasted_bytes"]})
            ep["daemon_reads"] = ep["ready"] + ep["late"] + ep["misses"]
            prev = s
        out.append(ep)
    del loader
    return out


def run_mount(mode, pct, proxy, args, work, total_bytes):
    policy = mode.split("+")[1]
    name = f"{mode}-{pct:g}".replace("+", "_")
    mnt = os.path.join(work, f"mnt-{name}")
    os.makedirs(mnt, exist_ok=True)
    trace = os.path.join(work, f"{name}.trace.csv")
    cache_bytes = int(total_bytes * pct / 100)
    if args.tier == "disk":
        disk = os.path.join(work, f"disk-{name}")
        tier = ["--ram-cache", "0", "--disk-cache", disk, "--disk-cache-size", f"{pct:g}%"]
    else:
        tier = ["--ram-cache", str(cache_bytes)]
    subprocess.run(SHADEFS + ["mount", f"s3://{BUCKET}/train", mnt, *tier,
                              "--policy", policy, "--trace", trace,
                              "--log-file", os.path.join(work, f"{name}.log"),
                              "--backend-opt", f"endpoint_url={proxy.endpoint}"], check=True,
                   capture_output=True)
    try:
        epochs = run_epochs(Files(mnt, drop_pages=args.regime == "dontneed"), mode, args, proxy, mnt)
    finally:
        subprocess.run(SHADEFS + ["umount", mnt], capture_output=True)
    for _ in range(100):  # the trace is complete once the daemon exited
        if not os.path.ismount(mnt):
            break
        time.sleep(0.1)
    time.sleep(0.5)
    if args.keep_traces:
        os.makedirs(args.keep_traces, exist_ok=True)
        for f in (trace, trace + ".scores.csv"):
            if os.path.exists(f):
                shutil.copy(f, os.path.join(args.keep_traces, f"{args.delay_ms:g}ms-" + os.path.basename(f)))
    t = sim.read_trace(trace)
    mask = np.zeros(t.requests, dtype=bool)
    sim.belady(t, cache_bytes, hit_mask=mask)
    a = 0
    for ep in epochs:
        seg = mask[a:a + ep["opens"]]
        ep["opt_misses"] = int(seg.size - seg.sum())
        ep["distinct"] = int(np.unique(t.ids[a:a + ep["opens"]]).size)
        a += ep["opens"]
    return {"cache_bytes": cache_bytes, "trace_opens": int(t.requests), "opt_misses_total": int(t.requests - mask.sum()),
            "epochs": epochs}


def parse_step(text):
    return text if text == "auto" else float(text)


def measure(args):
    for k, v in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                 ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_EC2_METADATA_DISABLED", "true"),
                 ("NO_PROXY", "127.0.0.1,localhost")):
        os.environ.setdefault(k, v)
    from shadefs.testing.s3 import LatencyProxyProcess, MotoServer

    modes = args.modes.split(",")
    bad = [m for m in modes if m not in ALL_MODES]
    if bad:
        raise SystemExit(f"error: unknown --modes {bad}; want some of {','.join(ALL_MODES)}")
    pcts = [float(x) for x in args.pcts.split(",")]
    work = tempfile.mkdtemp(prefix="plan-bench-")
    local = os.path.join(work, "local")
    if args.data:
        src = os.path.join(args.data, "train")
        rel = sorted(os.path.relpath(os.path.join(d, f), src) for d, _, fs in os.walk(src) for f in fs)[:args.n]
        for r in rel:
            os.makedirs(os.path.dirname(os.path.join(local, r)), exist_ok=True)
            shutil.copyfile(os.path.join(src, r), os.path.join(local, r))
    else:  # --n random files of --file-kb kB in 10 class folders
        rng = np.random.default_rng(0)
        rel = [f"c{i % 10}/{i:06d}.bin" for i in range(args.n)]
        for r in rel:
            os.makedirs(os.path.dirname(os.path.join(local, r)), exist_ok=True)
            with open(os.path.join(local, r), "wb") as f:
                f.write(rng.bytes(args.file_kb * 1000))
    total = sum(os.path.getsize(os.path.join(local, r)) for r in rel)
    from shadefs.testing.regime import describe

    regime_line = describe("page-cache" if args.regime == "pagecache" else args.regime,
                           args.cgroup_mib << 20, total)
    print(regime_line, flush=True)
    out = {"n": len(rel), "bytes": total, "delay_ms": args.delay_ms, "rate": args.rate,
           "workers": args.workers, "batch_size": args.batch_size, "epochs": args.epochs,
           "regime": regime_line, "tier": args.tier,
           "started": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"),
           "command": args.command,
           "load_start": list(os.getloadavg()), "runs": []}
    if args.json and os.path.exists(args.json):
        raise SystemExit(f"error: {args.json} exists (one file per chunk)")

    def save():
        if args.json:
            with open(args.json + ".tmp", "w") as f:
                json.dump(out, f, indent=1)
            os.replace(args.json + ".tmp", args.json)

    try:
        with MotoServer(log_file=os.path.join(work, "moto.log")) as moto:
            s3 = moto.client()
            s3.create_bucket(Bucket=BUCKET)
            for r in rel:
                with open(os.path.join(local, r), "rb") as f:
                    s3.put_object(Bucket=BUCKET, Key=f"train/{r}", Body=f.read())
            with LatencyProxyProcess(moto.port, delay_ms=args.delay_ms, rate=args.rate) as proxy:
                out["proxy"] = proxy.settings
                keys = [f"train/{r}" for r in rel]
                c = args.concurrency
                print("... physical limit", file=sys.stderr, flush=True)
                out["limit"] = {"load": list(os.getloadavg()),
                                "moto_alone": limit_gets(moto.endpoint, keys, c),
                                "proxy_1": limit_gets(proxy.endpoint, keys[:200], 1),
                                "proxy_c": limit_gets(proxy.endpoint, keys, c), "concurrency": c}
                lim = out["limit"]["proxy_c"]
                out["step_ms"] = (1e3 * args.batch_size / (args.step_load * lim) if args.step_ms == "auto"
                                  else float(args.step_ms))
                args.step_s = out["step_ms"] / 1e3
                save()
                for mode in modes:
                    for pct in (pcts if mode in MOUNT_MODES else [None]):
                        print(f"... {mode} {'' if pct is None else f'{pct:g} %'}", file=sys.stderr, flush=True)
                        run = {"mode": mode, "pct": pct, "step_ms": out["step_ms"], "load": list(os.getloadavg())}
                        t0 = time.monotonic()
                        if mode == "local":
                            run["epochs"] = run_epochs(Files(local, rel), mode, args, proxy)
                        elif mode == "direct":
                            run["epochs"] = run_epochs(S3Files(proxy.endpoint, rel), mode, args, proxy)
                        else:
                            run.update(run_mount(mode, pct, proxy, args, work, total))
                        run["wall_s"] = time.monotonic() - t0
                        out["runs"].append(run)
                        save()
            out["proxy_counters"] = proxy.counters
    finally:
        out["load_end"] = list(os.getloadavg())
        save()
        shutil.rmtree(work, ignore_errors=True)
    return out


# -- rendering ----------------------------------------------------------------------------------------

def _json_flag(command):
    """The ``--json`` path of a recorded command line ("" if none): names a chunk in the tables."""
    words = shlex.split(command)
    return words[words.index("--json") + 1] if "--json" in words[:-1] else ""


def merge(files):
    """{delay_ms: {"chunks": [...], "runs": [...]}}; a later run of the same (mode, pct, step) replaces an
    earlier one."""
    groups = {}
    for path in files:
        with open(path) as f:
            d = json.load(f)
        g = groups.setdefault(d["delay_ms"], {"chunks": [], "runs": {}})
        d = dict(d, json=d.get("json") or _json_flag(d.get("command", "")))
        g["chunks"].append(d)
        for r in d["runs"]:
            r = dict(r, chunk=len(g["chunks"]) - 1)
            r["n"] = d["n"]
            g["runs"][(r["mode"], r["pct"], round(r.get("step_ms", 0.0), 1), d["n"])] = r
    for g in groups.values():
        order = {m: i for i, m in enumerate(ALL_MODES)}
        g["runs"] = sorted(g["runs"].values(),
                           key=lambda r: (r.get("step_ms", 0) > 0, r["n"], order[r["mode"]], r["pct"] or 0))
    return groups


def warm(eps, key):
    w = [e[key] for e in eps[1:]]
    return sum(w) / len(w) if w else None


def fmt(x, spec=".2f"):
    return "" if x is None else format(x, spec)


def limit_s(gets, nbytes, chunk):
    """The physical limit of an epoch that made ``gets`` GETs of ``nbytes``: at the proxy's
    concurrent-GET rate, or the link's byte rate, whichever is slower."""
    link = 1e9 / 8  # bytes/s per direction (1gbit; the rate the runs use)
    return max(gets / chunk["limit"]["proxy_c"], nbytes / link)


def grid_rows(g):
    """One row per run: cold and warm epoch, x local, x limit, GETs (proxy), OPT misses, no-wait %."""
    runs = g["runs"]
    n0 = g["chunks"][0]["n"]
    local = next((r for r in runs if r["mode"] == "local" and r["n"] == n0), None)
    loc_c = local["epochs"][0]["seconds"] if local else None
    loc_w = warm(local["epochs"], "seconds") if local else None
    rows = []
    for r in runs:
        ch = g["chunks"][r["chunk"]]
        eps = r["epochs"]
        c, w = eps[0], eps[1:]
        cold_s, warm_s = c["seconds"], warm(eps, "seconds")
        same_n = r["n"] == n0  # x local only against a local run over the same files
        tag = os.path.splitext(os.path.basename(ch.get("json") or ""))[0]
        row = {"run": LABEL[r["mode"]] + (f", step {r['step_ms']:.0f} ms" if r.get("step_ms") else "")
               + ("" if same_n else f", {r['n']} files") + (f" ({tag})" if tag and r.get("step_ms") else ""),
               "mode": r["mode"], "pct": r["pct"], "load": r["load"][0], "cold_s": cold_s, "warm_s": warm_s,
               "x_local_cold": cold_s / loc_c if loc_c and same_n else None,
               "x_local_warm": warm_s / loc_w if loc_w and warm_s and same_n else None,
               "gets_cold": c["gets"], "gets_warm": warm(eps, "gets"),
               "mib_cold": c["get_bytes"] / 2**20, "mib_warm": warm(eps, "get_bytes") / 2**20 if w else None,
               "step_ms": r.get("step_ms", 0.0)}
        # distance to the physical limit: the epoch's own GETs at the limit rate (plus the training steps
        # it has to take anyway when --step-ms is set)
        n_open = c.get("opens") or ch["n"]
        steps = -(-n_open // ch["batch_size"]) * row["step_ms"] / 1e3
        lc = limit_s(c["gets"], c["get_bytes"], ch)
        row["x_limit_cold"] = cold_s / max(lc, steps) if max(lc, steps) > 0 else None
        if w:
            lw = [max(limit_s(e["gets"], e["get_bytes"], ch), steps) for e in w]
            row["x_limit_warm"] = warm_s / (sum(lw) / len(lw)) if sum(lw) > 0 else None
        if "opens" in c:
            row["opt_cold"] = c["opt_misses"]
            row["opt_warm"] = warm(eps, "opt_misses")
            row["gets_per_opt"] = (sum(e["gets"] for e in eps) / r["opt_misses_total"]
                                   if r["opt_misses_total"] else None)
            opens = sum(e["opens"] for e in eps)
            row["hit_ratio_warm"] = (sum(e["hits"] for e in w) / sum(e["opens"] for e in w)) if w else None
            row["opt_hit_ratio_warm"] = (1 - sum(e["opt_misses"] for e in w) / sum(e["opens"] for e in w)) if w else None
            row["nowait_cold"] = 100.0 * (c["hits"] + c["ready"]) / c["opens"] if c["opens"] else None
            row["nowait_warm"] = (100.0 * sum(e["hits"] + e["ready"] for e in w) / sum(e["opens"] for e in w)
                                  if w else None)
            row["late_wait_s"] = sum(e["late_wait_s"] for e in eps) / len(eps)
            row["opens"] = opens
            row["daemon_reads"] = sum(e["daemon_reads"] for e in eps)
            row["unused_gets"] = sum(e["gets"] for e in eps) - row["daemon_reads"]
            row["used_per_opt"] = row["daemon_reads"] / r["opt_misses_total"] if r["opt_misses_total"] else None
            row["distinct_warm"] = warm(eps, "distinct")
        rows.append(row)
    return rows


def limit_line(g):
    out = []
    for ch in g["chunks"]:
        L = ch["limit"]
        out.append(f"moto alone {L['moto_alone']:.0f} GETs/s with {L['concurrency']} clients; through the proxy "
                   f"{L['proxy_1']:.0f}/s with 1 client, **{L['proxy_c']:.0f}/s with {L['concurrency']}** "
                   f"(load {L['load'][0]:.2f}); an epoch of {ch['n']} cold files at that limit: "
                   f"{ch['n'] / L['proxy_c']:.2f} s; the link (1 Gbit/s) would carry the "
                   f"{ch['bytes'] / 2**20:.2f} MiB in {ch['bytes'] * 8 / 1e9 * 1e3:.0f} ms")
    return out


def table_md(rows):
    from shadefs.testing.docsection import markdown_table

    head = ["run", "cache %", "load", "epoch 1 s", "warm s", "x local (1 / warm)", "x limit (1 / warm)",
            "GETs (1 / warm)", "MiB (1 / warm)", "OPT misses (1 / warm)", "GETs ÷ OPT", "unused GETs", "used reads ÷ OPT", "warm hit ratio (÷ OPT)",
            "no wait % (1 / warm)"]
    body = []
    for r in rows:
        def pair(a, b, spec):
            return f"{fmt(r.get(a), spec)} / {fmt(r.get(b), spec)}" if r.get(a) is not None else ""
        hr = ""
        if r.get("hit_ratio_warm") is not None:
            opt = r["opt_hit_ratio_warm"]
            hr = f"{r['hit_ratio_warm']:.3f} ({r['hit_ratio_warm'] / opt:.3f})" if opt else f"{r['hit_ratio_warm']:.3f}"
        body.append([r["run"], fmt(r["pct"], "g"), fmt(r["load"], ".1f"), fmt(r["cold_s"]), fmt(r["warm_s"]),
                     pair("x_local_cold", "x_local_warm", ".0f"), pair("x_limit_cold", "x_limit_warm", ".2f"),
                     pair("gets_cold", "gets_warm", ".0f"), pair("mib_cold", "mib_warm", ".2f"),
                     pair("opt_cold", "opt_warm", ".0f"), fmt(r.get("gets_per_opt"), ".4f"), fmt(r.get("unused_gets"), "d"), fmt(r.get("used_per_opt"), ".4f"), hr,
                     pair("nowait_cold", "nowait_warm", ".1f")])
    return markdown_table(head, body, "lrrrrrrrrrrrrrr")


def plot(g, delay, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in grid_rows(g) if not r["step_ms"] and r["run"] == LABEL[r["mode"]]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ch = g["chunks"][0]
    lim = ch["n"] / ch["limit"]["proxy_c"]
    for ax, key, title in ((axes[0], "cold_s", "epoch 1 (cold)"), (axes[1], "warm_s", "warm epochs (mean)")):
        for mode in MOUNT_MODES:
            pts = sorted((r["pct"], r[key]) for r in rows if r["mode"] == mode and r[key] is not None)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=LABEL[mode])
        for mode, style in (("direct", "--"), ("local", ":")):
            r = next((r for r in rows if r["mode"] == mode), None)
            if r and r[key] is not None:
                ax.axhline(r[key], ls=style, color="gray", label=LABEL[mode])
        ax.axhline(lim, ls="-.", color="red", label=f"backend limit, {ch['n']} GETs")
        ax.set_yscale("log")
        ax.set_xlabel("RAM cache, % of the dataset")
        ax.set_ylabel("seconds")
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    ax = axes[2]
    for mode in MOUNT_MODES:
        pts = sorted((r["pct"], r["gets_warm"]) for r in rows if r["mode"] == mode and r["gets_warm"] is not None)
        if pts:
            line, = ax.plot(*zip(*pts), marker="o", label=LABEL[mode] + " (proxy GETs)")
            opt = sorted((r["pct"], r["opt_warm"]) for r in rows if r["mode"] == mode and r.get("opt_warm") is not None)
            ax.plot(*zip(*opt), ls="--", color=line.get_color(), alpha=0.6)
    ax.set_xlabel("RAM cache, % of the dataset")
    ax.set_ylabel("backend GETs per warm epoch")
    ax.set_title("backend GETs per warm epoch (dashed: OPT's misses)")
    ax.legend(fontsize=7)
    fig.suptitle(f"{ch['n']} files over moto behind the proxy, {delay:g} ms each way")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def render(files, write_doc):
    from shadefs.testing import docsection

    groups = merge(files)
    L = [docsection.markers("bench_plan")[0], "## Clairvoyant caching: the grid over slow S3", "",
         "*Generated by `python -m shadefs.bench plan --render ... --write-doc` from the runs below (one "
         "bench lock hold per command). Timed figures are noisy (a 2-core machine shared with other "
         "jobs: see each row's load); GET counts (the proxy's) and OPT's misses are exact.*", "",
         "Columns: epoch 1 = cold (empty cache, workers starting); warm = mean of epochs 2..E; x local = "
         "÷ the local-disk epoch of the same run; **x limit** = ÷ the time the backend needs for the GETs that "
         "epoch made, at the proxy's measured concurrent-GET rate (or the training steps it must take, if "
         "slower): 1.00 = at the physical limit; GETs and MiB = requests and object bytes **counted by the "
         "proxy** (everything that crossed the link: misses and prefetches); OPT misses = Belady's MIN on the "
         "run's own trace at the same cache bytes; GETs ÷ OPT = the whole run's proxy GETs ÷ OPT's misses; unused GETs = proxy GETs that no open used "
         "(prefetched, then evicted or never opened, e.g. the lookahead into an epoch the run never starts; proxy "
         "GETs − (ready + late + misses); −1: two concurrent opens of one file, a repeat of a with-replacement draw, "
         "shared one GET and both count as misses); used reads ÷ OPT = (ready + late + misses) ÷ OPT's misses; "
         "warm hit ratio = hits (RAM) ÷ opens in the warm epochs (a prefetched open is a backend read, not a "
         "hit), ÷ OPT's; no wait = (hits + prefetch ready) ÷ opens.", ""]
    print_out = []
    for delay in sorted(groups):
        g = groups[delay]
        ch = g["chunks"][0]
        rows = grid_rows(g)
        L += [f"### {2 * delay:g} ms RTT ({delay:g} ms each way)", "",
              f"{ch['n']} files ({ch['bytes'] / 2**20:.2f} MiB, 28x28 PNGs from "
              f"`scripts/make_fashion_mnist.py`), {ch['epochs']} epochs per run, {ch['workers']} DataLoader "
              f"workers, batch {ch['batch_size']}; {ch.get('proxy', '')}.", "", "Commands (one bench lock hold each):", ""]
        for c in g["chunks"]:
            L.append(f"- `{c['command']}` ({c['started']}, load {c['load_start'][0]:.2f} -> "
                     f"{c.get('load_end', [float('nan')])[0]:.2f})")
        L += ["", "Physical limit, measured first in each command:", ""]
        L += [f"- {x}" for x in limit_line(g)]
        L += ["", table_md(rows), ""]
        img = f"plan_grid_{2 * delay:g}ms_rtt.png".replace(".", "_", 1).replace("_png", ".png")
        if write_doc:
            try:
                plot(g, delay, os.path.join(IMG_DIR, img))
                L += [f"![epoch time and GETs vs cache size, {2 * delay:g} ms RTT](../img/{img})", ""]
            except ImportError as e:
                print(f"no plot: {e}", file=sys.stderr)
        print_out.append(f"== {delay:g} ms each way ==\n" + "\n".join(limit_line(g)) + "\n" + table_md(rows))
    L.append(docsection.markers("bench_plan")[1])
    print("\n\n".join(print_out))
    if write_doc:
        docsection.write_section(DOC, "bench_plan", "\n".join(L))
        print(f"wrote the bench_plan section of {DOC}", file=sys.stderr)
    return groups


def epoch_rows(out):
    """Markdown: one row per (run, epoch) of a measured ``out``: seconds, the daemon's outcomes, the page
    probe's counters, proxy GETs, and the plan run's epoch ÷ the shuffle run's at the same cache size."""
    from shadefs.testing.docsection import markdown_table

    base = {(r["pct"], e["epoch"]): e["seconds"] for r in out["runs"] if r["mode"] == "shuffle+static"
            for e in r["epochs"]}
    body = []
    for r in out["runs"]:
        for e in r["epochs"]:
            b = base.get((r["pct"], e["epoch"]))
            body.append([LABEL[r["mode"]], fmt(r["pct"], "g"), str(e["epoch"]), fmt(r["load"][0], ".1f"),
                         fmt(e["seconds"]), fmt(e["seconds"] / b) if b and r["mode"] != "shuffle+static" else "",
                         *(str(e.get(k, "")) for k in ("opens", "hits", "ready", "late", "misses", "probed",
                                                       "kernel_kept", "kernel_reads", "gets")),
                         fmt(e.get("cgroup_cache_mib"), ".0f")])
    head = ["run", "cache %", "epoch", "load", "s", "÷ shuffle", "opens", "hits", "ready", "late", "misses",
            "probed", "kernel kept", "kernel reads", "GETs", "cgroup cache MiB"]
    return markdown_table(head, body, "lrrrrrrrrrrrrrrr")


#: the runner's common options this benchmark honours
COMMON = ('write_doc', 'json')


def add_arguments(ap) -> None:
    ap.add_argument("--data", help="a make_fashion_mnist.py tree (its train/ is used); default: random files")
    ap.add_argument("--n", type=int, default=1000, help="files uploaded (default 1000)")
    ap.add_argument("--file-kb", type=int, default=60, help="without --data: size of each random file (kB)")
    ap.add_argument("--regime", choices=("dontneed", "cgroup", "pagecache"), default="dontneed",
                    help="what the reader's kernel keeps between epochs (module docstring; default dontneed)")
    ap.add_argument("--cgroup-mib", type=int, default=160,
                    help="--regime cgroup: the reader's memory cgroup limit (MiB)")
    ap.add_argument("--tier", choices=("ram", "disk"), default="ram",
                    help="the cache's tier: RAM (--ram-cache) or NVMe (--disk-cache, no RAM tier)")
    ap.add_argument("--delay-ms", type=float, default=1.0, help="one-way delay of the proxy (default 1: 2 ms RTT)")
    ap.add_argument("--rate", default="1gbit", help="link rate per direction (default 1gbit)")
    ap.add_argument("--pcts", default="0,5,10,20,40", help="RAM cache sizes, %% of the dataset")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--step-ms", type=parse_step, default=0.0,
                    help="sleep per batch, the training step (ms), or 'auto' (see --step-load)")
    ap.add_argument("--step-load", type=float, default=0.75,
                    help="with --step-ms auto: the reader consumes this fraction of the backend's limit")
    ap.add_argument("--concurrency", type=int, default=32, help="clients for the physical-limit probe "
                    "(the daemon's --prefetch-concurrency)")
    ap.add_argument("--modes", default=",".join(ALL_MODES))
    ap.add_argument("--no-final-lookahead", action="store_true",
                    help="PlanSampler announces no lookahead in the last epoch (default: it does, as a job that "
                         "does not know its epoch count; those reads count as unused GETs)")
    ap.add_argument("--keep-traces", metavar="DIR", help="copy each mount run's trace (and scores) here")
    ap.add_argument("--render", nargs="+", metavar="JSON", help="render saved runs instead of measuring")


def run(args, bench):
    args.command = bench.command
    if args.render:
        render(args.render, args.write_doc)
        return 0
    out = measure(args)
    print(out["regime"])
    print(epoch_rows(out))
    if args.json:
        render([args.json], False)
    else:
        path = tempfile.mktemp(prefix="bench-plan-", suffix=".json")
        with open(path, "w") as f:
            json.dump(out, f)
        render([path], False)
    return 0
