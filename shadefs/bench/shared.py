"""The shared tier across "nodes": N mounts of one S3 source on this machine, each reading its
DistributedSampler shard of a per-epoch reshuffle, with and without a shared tier on Redis Cluster.

Regime: **counts** (hit ratio per node, backend GETs; the mounts run with ``--no-kernel-cache``).
Limit: f + s per node (its RAM fraction plus the group's shared fraction).

What runs, for every N in ``--nodes`` and every shared size in ``--shared`` (percent of the dataset's
bytes, the group's total; each member contributes 1/N of it):

- N mounts of ``s3://BUCKET/PREFIX`` (moto behind :mod:`shadefs.testing.latency_proxy`: a fixed one-way
  delay and a rate limit per direction), each ``--policy static --ram-cache F%`` (node-local cache f),
  and, when the shared size is above 0, ``--shared-tier <3-master Redis Cluster>``;
- ``--epochs`` epochs; in epoch e node r reads ``permutation(seed + e)[r::N]`` (DistributedSampler with
  ``shuffle=True``: a fresh permutation every epoch, each node a disjoint 1/N), ``--threads`` readers
  per node, all nodes at once; the Redis Cluster is emptied between configurations.

Per configuration it reports, over the epochs after the first (the first fills the caches): per-node hit
ratio (RAM and shared separately), backend GETs per epoch (all nodes), and epoch time (the slowest node).
Expected: without the shared tier each node hits about f (a static cache under uniform reshuffling:
docs/policies.md); with it about f + s, because a node offers the group only what its own tier refused, so the
group holds what the nodes do not.

Then the cost of one hit by tier, on one mount, single reader: open + read + close of a file served by
the NVMe tier, by the shared tier (Redis Cluster on loopback), and by the backend (a miss over the proxy).

Usage::

    python -m shadefs.bench shared [--files 2000] [--nodes 2,4] [--shared 0,20,40] [--ram 10] [--epochs 3]
                    [--delay-ms 1] [--rate 1gbit] [--json OUT.json] [--write-doc]
    python -m shadefs.bench shared --results OUT.json --write-doc      # re-render the doc from a saved run

``--write-doc`` replaces the section between ``<!-- bench_shared:start -->`` and
``<!-- bench_shared:end -->`` in docs/results/shared.md and writes docs/img/bench_shared.png.
"""
from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List

import numpy as np

from shadefs.bench.runner import ROOT
from shadefs.testing import Mount, docsection
from shadefs.testing.datasets import read_size
from shadefs.testing.docsection import markdown_table
from shadefs.testing.redis import RedisCluster
from shadefs.testing.s3 import DUMMY_AWS_ENV, LatencyProxyProcess, MotoServer

REPO = ROOT
BUCKET = "shadefs-bench"
PREFIX = "shared"
PLOT = os.path.join(REPO, "docs", "img", "bench_shared.png")


def log(msg: str) -> None:
    print(f"[bench_shared {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_files(n: int, mean: int, seed: int) -> Dict[str, bytes]:
    """``n`` files of random bytes, sizes uniform in [mean/2, 3 mean/2], in 10 class folders."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(mean // 2, mean * 3 // 2 + 1, n)
    return {f"c{i % 10}/{i:05d}.bin": rng.bytes(int(s)) for i, s in enumerate(sizes)}


def upload(endpoint: str, files: Dict[str, bytes]) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda kv: s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{kv[0]}", Body=kv[1]),
                      files.items()))


def flush(cluster: RedisCluster) -> None:
    for s in cluster.masters:
        s.cli("flushall")


def run_config(a, files: List[str], sizes: Dict[str, int], endpoint: str, cluster: RedisCluster,
               nodes: int, shared_pct: int, workdir: str) -> Dict[str, Any]:
    """One configuration: N mounts, ``a.epochs`` epochs; per-epoch per-node stats deltas and times."""
    flush(cluster)
    total = sum(sizes.values())
    mounts = []
    for r in range(nodes):
        args = ["--policy", "static", "--ram-cache", f"{a.ram}%", "--backend-opt", f"endpoint_url={endpoint}"]
        if shared_pct:
            args += ["--shared-tier", cluster.urls, "--shared-tier-size", str(total * shared_pct // 100 // nodes),
                     "--shared-tier-heartbeat", "0.5", "--shared-tier-partitions", str(a.partitions), *a.auth]
        mnt = os.path.join(workdir, f"n{nodes}-s{shared_pct}-r{r}")
        mounts.append(Mount(f"s3://{BUCKET}/{PREFIX}", mnt, args, log_file=mnt + ".log", mount_timeout=300).start())
    try:
        if shared_pct:  # every member joined: the group's budget is the total
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and any(
                    m.stats()["tiers"]["shared"]["group_capacity_bytes"] != total * shared_pct // 100 // nodes * nodes
                    for m in mounts):
                time.sleep(0.2)
        epochs = []
        prev = [m.stats() for m in mounts]
        for e in range(a.epochs):
            perm = np.random.default_rng(a.seed + e).permutation(len(files))
            barrier = threading.Barrier(nodes)
            times = [0.0] * nodes

            def node(r):
                shard = [files[i] for i in perm[r::nodes]]
                barrier.wait()
                t0 = time.perf_counter()
                with cf.ThreadPoolExecutor(a.threads) as pool:
                    got = list(pool.map(lambda p: read_size(os.path.join(mounts[r].path, p)), shard))
                times[r] = time.perf_counter() - t0
                assert got == [sizes[p] for p in shard], "short read"

            with cf.ThreadPoolExecutor(nodes) as pool:
                list(pool.map(node, range(nodes)))
            if shared_pct:
                time.sleep(1.0)  # the last offers reach Redis before the next epoch
            now = [m.stats() for m in mounts]
            per = []
            for r in range(nodes):
                d = {k: now[r]["hits"].get(k, 0) - prev[r]["hits"].get(k, 0) for k in ("ram", "disk", "shared")}
                opens = now[r]["opens"] - prev[r]["opens"]
                misses = now[r]["misses"] - prev[r]["misses"]
                assert opens == sum(d.values()) + misses
                per.append({"opens": opens, "ram": d["ram"], "shared": d["shared"], "misses": misses,
                            "time_s": times[r]})
            shared = now[0]["tiers"].get("shared")
            epochs.append({"nodes": per, "time_s": max(times), "gets": sum(p["misses"] for p in per),
                           "shared_used": shared["group_used_bytes"] if shared else 0,
                           "shared_errors": sum(s.get("shared_errors", 0) for s in now)})
            log(f"N={nodes} shared={shared_pct}% epoch {e}: {max(times):.2f} s, "
                f"hit {[round((p['ram'] + p['shared']) / p['opens'], 3) for p in per]}, GETs {epochs[-1]['gets']}")
            prev = now
    finally:
        for m in mounts:
            m.umount()
    steady = epochs[1:] or epochs
    opens = sum(p["opens"] for e in steady for p in e["nodes"])
    return {
        "nodes": nodes, "shared_pct": shared_pct, "ram_pct": a.ram, "epochs": epochs,
        "hit": sum(p["ram"] + p["shared"] for e in steady for p in e["nodes"]) / opens,
        "hit_ram": sum(p["ram"] for e in steady for p in e["nodes"]) / opens,
        "hit_shared": sum(p["shared"] for e in steady for p in e["nodes"]) / opens,
        "node_hits": [round(sum(e["nodes"][r]["ram"] + e["nodes"][r]["shared"] for e in steady)
                            / sum(e["nodes"][r]["opens"] for e in steady), 3) for r in range(nodes)],
        "gets": statistics.mean(e["gets"] for e in steady),
        "time_s": statistics.mean(e["time_s"] for e in steady),
        "shared_used_pct": 100.0 * epochs[-1]["shared_used"] / total,
        "shared_errors": epochs[-1]["shared_errors"],
    }


def per_hit_cost(a, files: List[str], endpoint: str, cluster: RedisCluster, workdir: str) -> Dict[str, Any]:
    """Median / p90 latency of open+read+close, one reader, by the tier that served it."""
    n = min(a.probe_files, len(files))
    sample = files[:n]
    base = ["--policy", "static", "--backend-opt", f"endpoint_url={endpoint}", "--no-kernel-cache"]
    out: Dict[str, Any] = {}

    def timed(m, label):
        ts = []
        for p in sample:
            t0 = time.perf_counter()
            read_size(os.path.join(m.path, p))
            ts.append(time.perf_counter() - t0)
        ts.sort()
        out[label] = {"median_ms": 1e3 * statistics.median(ts), "p90_ms": 1e3 * ts[int(0.9 * (len(ts) - 1))]}

    flush(cluster)
    disk = os.path.join(workdir, "probe-nvme")
    nv = Mount(f"s3://{BUCKET}/{PREFIX}", os.path.join(workdir, "probe-a"),
               base + ["--disk-cache", disk, "--disk-cache-size", "100%"], mount_timeout=300).start()
    try:
        timed(nv, "miss")         # cold: every open a backend GET over the proxy
        timed(nv, "nvme")         # every open an NVMe-tier hit
        assert nv.stats()["hits"]["disk"] == n, nv.stats()
    finally:
        nv.umount()
    shutil.rmtree(disk, ignore_errors=True)
    sh_args = base + ["--shared-tier", cluster.urls, "--shared-tier-size", "100%", "--shared-tier-heartbeat", "0.5",
                      "--shared-tier-partitions", str(a.partitions), *a.auth]
    w = Mount(f"s3://{BUCKET}/{PREFIX}", os.path.join(workdir, "probe-w"), sh_args, mount_timeout=300).start()
    r = Mount(f"s3://{BUCKET}/{PREFIX}", os.path.join(workdir, "probe-r"), sh_args, mount_timeout=300).start()
    try:
        for p in sample:
            read_size(os.path.join(w.path, p))  # node W's misses fill the group
        deadline = time.monotonic() + 30
        while w.stats()["tiers"]["shared"]["files"] < n and time.monotonic() < deadline:
            time.sleep(0.2)
        timed(r, "shared")
        assert r.stats()["hits"]["shared"] == n, r.stats()
    finally:
        w.umount()
        r.umount()
    return out


def render(res: Dict[str, Any]) -> str:
    env = res["env"]
    rows = []
    for c in res["configs"]:
        rows.append([c["nodes"], f"{c['ram_pct']} %", f"{c['shared_pct']} %",
                     f"{100 * c['hit']:.1f} %", f"{100 * c['hit_ram']:.1f} % + {100 * c['hit_shared']:.1f} %",
                     " / ".join(f"{100 * h:.1f}" for h in c["node_hits"]),
                     f"{c['gets']:.0f}", f"{c['time_s']:.2f} s", f"{c['shared_used_pct']:.1f} %",
                     c["shared_errors"]])
    table = markdown_table(["nodes", "f (RAM, each)", "shared (total)", "hit ratio per node",
                            "RAM + shared", "per node (%)", "backend GETs / epoch", "epoch time",
                            "shared tier used", "shared errors"], rows, align="rrrrrrrrrr")
    cost = res["cost"]
    crow = [[k, f"{v['median_ms']:.2f} ms", f"{v['p90_ms']:.2f} ms"] for k, v in
            (("NVMe tier hit", cost["nvme"]), ("shared tier hit (Redis Cluster, loopback)", cost["shared"]),
             ("miss (S3 GET over the proxy)", cost["miss"]))]
    ctable = markdown_table(["open + read + close of one file, one reader", "median", "p90"], crow, align="lrr")
    start, end = docsection.markers("bench_shared")
    return f"""{start}
## Shared tier across nodes (`python -m shadefs.bench shared`)

{env['files']} files ({env['mib']:.1f} MiB, mean {env['mean_kb']:.1f} kB) in S3 (moto behind the latency
proxy: {env['proxy']}), N mounts of that source on this machine ("nodes"), each `--policy static
--ram-cache {env['ram']}%`, each reading its DistributedSampler shard (`permutation(seed + epoch)[rank::N]`,
{env['threads']} reader threads per node, all nodes at once) for {env['epochs']} epochs; figures are the
means of the epochs after the first. Shared tier: a 3-master Redis Cluster (redis-server
{env['redis']}) on loopback, `--shared-tier-size` = (shared total) / N per member,
`--shared-tier-partitions {env['partitions']}`, {'`--shared-tier-insecure`' if env.get('auth') == 'insecure'
else 'values authenticated (`--shared-tier-secret`, HMAC-SHA256)'}. Machine: {env['machine']};
{env['load']}. Command: `{env['command']}` ({env['date']}).

{table}

The physical limit is the backend: every miss is one GET over the proxy, so epoch time follows the
GETs. Without the shared tier each node hits about f whatever N (static cache, uniform reshuffle); with
it about f + s: a node offers the group only what its own RAM tier refused, so the group holds files no
node holds, once. Epoch times are noisy on this shared machine ({env['load']}); the hit ratios and GETs
are the robust figures. `shared errors` are shared-tier calls that failed or ran past their deadline (50 ms) on the
overloaded cores (summed over the nodes and epochs): each cost one hit, none an error. SHADE's own Redis
design (per-process priority queues, occupancy estimated from one node's `dbsize`) is not run here; its
differences are in docs/architecture.md, "The shared tier".

Cost of a hit by tier (one mount, one reader, {env['probe_files']} files, kernel page cache off for the
mount):

{ctable}

A shared hit cost {cost['shared']['median_ms'] / cost['nvme']['median_ms']:.1f}x an NVMe hit at the median
(+{cost['shared']['median_ms'] - cost['nvme']['median_ms']:.2f} ms) and {cost['miss']['median_ms'] / cost['shared']['median_ms']:.0f}x less than a miss. It costs a Redis round trip (here loopback: no network; across real nodes add the network
RTT, ~0.05-0.2 ms in one rack, plus size / bandwidth) and a copy through the daemon, against an NVMe
hit served from a local file; both are far below a miss. The shared tier pays off when its hit replaces a
backend GET, not an NVMe hit: size the NVMe tier first, then share what no node can hold.

![bench_shared](../img/bench_shared.png)
{end}"""


def plot(res: Dict[str, Any]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no plot")
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for n in sorted({c["nodes"] for c in res["configs"]}):
        cs = [c for c in res["configs"] if c["nodes"] == n]
        xs = [c["shared_pct"] for c in cs]
        axes[0].plot(xs, [100 * c["hit"] for c in cs], "o-", label=f"{n} nodes: measured")
        axes[1].plot(xs, [c["gets"] for c in cs], "o-", label=f"{n} nodes")
    xs = sorted({c["shared_pct"] for c in res["configs"]})
    axes[0].plot(xs, [res["env"]["ram"] + x for x in xs], "k--", label="f + s (expected)")
    axes[0].set_xlabel("shared tier, % of the dataset (group total)")
    axes[0].set_ylabel("hit ratio per node, %")
    axes[0].legend(fontsize=8)
    axes[1].set_xlabel("shared tier, % of the dataset (group total)")
    axes[1].set_ylabel("backend GETs per epoch (all nodes)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(PLOT), exist_ok=True)
    fig.savefig(PLOT, dpi=110)


#: the runner's common options this benchmark honours
COMMON = ('write_doc', 'json')


def add_arguments(p) -> None:
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--mean-kb", type=int, default=16)
    p.add_argument("--nodes", default="2,4")
    p.add_argument("--shared", default="0,20,40")
    p.add_argument("--ram", type=int, default=10, help="node-local RAM tier, %% of the dataset (each node)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--delay-ms", type=float, default=1.0)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--probe-files", type=int, default=300)
    p.add_argument("--partitions", type=int, default=16,
                   help="--shared-tier-partitions (a partition's budget should hold many files: at 2,000 "
                   "files of 16 kB, 20%% is 6.4 MB, 400 kB per partition at K=16)")
    p.add_argument("--insecure", action="store_true",
                   help="run the shared tier with --shared-tier-insecure (no group secret) instead of a secret")
    p.add_argument("--workdir")
    p.add_argument("--results", help="render the doc from a saved --json run instead of measuring")


def run(a, bench):
    a.command = bench.command
    res = docsection.saved_or_measured(a.results, a.json, lambda: measure(a))
    for c in res["configs"]:
        print(f"N={c['nodes']} f={c['ram_pct']}% shared={c['shared_pct']}%: hit {100 * c['hit']:.1f}% "
              f"(ram {100 * c['hit_ram']:.1f}% + shared {100 * c['hit_shared']:.1f}%), per node {c['node_hits']}, "
              f"GETs/epoch {c['gets']:.0f}, epoch {c['time_s']:.2f} s, errors {c['shared_errors']}")
    for k, v in res["cost"].items():
        print(f"cost of a {k} open: median {v['median_ms']:.2f} ms, p90 {v['p90_ms']:.2f} ms")
    if a.write_doc:
        bench.write_results(render(res), "bench_shared")
        plot(res)
    return 0


def measure(a) -> Dict[str, Any]:
    os.environ.update(DUMMY_AWS_ENV)
    workdir = a.workdir or tempfile.mkdtemp(prefix="bench-shared-")
    files = make_files(a.files, a.mean_kb * 1000, a.seed)
    if a.insecure:
        a.auth = ["--shared-tier-insecure"]
    else:  # the group's secret: random, mode 0600, the same file for every member
        secret = os.path.join(workdir, "group.secret")
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(32).hex().encode())
        a.auth = ["--shared-tier-secret", secret]
    sizes = {k: len(v) for k, v in files.items()}
    names = sorted(files)
    load0 = os.getloadavg()
    moto = MotoServer().start()
    proxy = cluster = None
    try:
        upload(moto.endpoint, files)
        proxy = LatencyProxyProcess(moto.port, a.delay_ms, a.rate).start()
        cluster = RedisCluster(workdir, masters=3)
        configs = []
        for n in [int(x) for x in a.nodes.split(",")]:
            for s in [int(x) for x in a.shared.split(",")]:
                configs.append(run_config(a, names, sizes, proxy.endpoint, cluster, n, s, workdir))
        cost = per_hit_cost(a, names, proxy.endpoint, cluster, workdir)
        import subprocess

        redis_v = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
        load1 = os.getloadavg()
        env = {"files": a.files, "mib": sum(sizes.values()) / 2**20, "mean_kb": sum(sizes.values()) / a.files / 1e3,
               "proxy": proxy.settings, "ram": a.ram, "threads": a.threads, "epochs": a.epochs,
               "redis": redis_v, "partitions": a.partitions, "auth": "insecure" if a.insecure else "secret", "probe_files": min(a.probe_files, a.files),
               "machine": f"{os.cpu_count()} cores, {platform.machine()}, Linux {platform.release()}",
               "load": f"load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end (shared with other "
                       f"jobs)",
               "command": a.command,
               "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
        return {"env": env, "configs": configs, "cost": cost}
    finally:
        if cluster is not None:
            cluster.stop()
        if proxy is not None:
            proxy.stop()
        moto.stop()
        if not a.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
