"""Daemon CPU and backend GETs per S3 miss, side by side: this tree's obstore and fsspec clients and,
with ``--baseline REV``, the ``shadefs`` package of git revision REV (its only client, s3fs).

Regime: **counts** (GETs per miss: every open a miss, each file read once). Limit: one GET per miss,
and the client's CPU per GET measured alone (``python -m shadefs.bench s3_clients``).

The store: moto's S3 server on loopback behind ``shadefs.testing.latency_proxy`` (``--delay-ms`` one way,
``--rate``), which counts every GET. Each run mounts the bucket fresh and reads every file once, whole,
with ``--readers`` threads (``open``/``read(--read-size)``/``close``), with the tiers off (``--ram-cache 0``:
every open is a miss no tier admits) or ``static`` with a RAM tier of 10 % (full after the first tenth
of the files). Measured per run, over the reading only: the daemon's CPU (utime + stime of its process,
all threads), GETs counted by the proxy, and the daemon's misses; per miss: CPU in ms and GETs. Runs
are interleaved (``--rounds``), so load swings hit every variant alike.

``--local``: the same reading of a local directory of the same files instead of S3 (a local miss: the
daemon's own cost around a ``pread``), with the default ``--backend-timeout`` (every read handed to a
deadline thread) and with ``--backend-timeout 0`` (read on the FUSE worker itself), side by side. Also
per miss: context switches of the daemon's threads (``/proc/PID/task/*/status``, the threads alive at
the end of the reading).

Usage::

    bench_s3_miss.py [--files 300] [--size 40000] [--readers 4] [--rounds 2] [--baseline c9061c1]
                     [--tiers off,static10] [--local]
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List


from shadefs.bench.runner import ROOT
from shadefs.testing import ctx_switches  # noqa: E402
from shadefs.testing.s3 import LatencyProxyProcess, MotoServer  # noqa: E402

BUCKET = "bench-s3-miss"
TIERS = {"off": ["--ram-cache", "0"], "static10": ["--policy", "static", "--ram-cache", "10%"],
         "lru10": ["--policy", "lru", "--ram-cache", "10%"]}
LOCAL = {"local": [], "local-notimeout": ["--backend-timeout", "0"]}


def cli(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m shadefs ARGS`` with the package of ``code`` (a directory holding ``shadefs/``)."""
    return subprocess.run([sys.executable, "-m", "shadefs", *args], cwd=code, capture_output=True, text=True,
                          timeout=timeout, check=True)


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")



def read_all(mnt: str, names: List[str], readers: int, piece: int) -> int:
    def one(name: str) -> int:
        n = 0
        with open(os.path.join(mnt, name), "rb", buffering=0) as f:
            while True:
                b = f.read(piece)
                if not b:
                    return n
                n += len(b)

    with cf.ThreadPoolExecutor(readers) as pool:
        return sum(pool.map(one, names))


def run_one(code: str, backend: str, tiers: str, endpoint: str, proxy, names: List[str], a, work: str) -> Dict:
    mnt = tempfile.mkdtemp(prefix="mnt-", dir=work)
    if backend in LOCAL:
        args = ["mount", os.path.join(work, "src"), mnt, "--log-file", mnt + ".log", "--no-kernel-cache",
                "--prefetch-concurrency", "0", *LOCAL[backend], *TIERS[tiers]]
    else:
        args = ["mount", f"s3://{BUCKET}/ds", mnt, "--log-file", mnt + ".log", "--no-kernel-cache",
                "--prefetch-concurrency", "0", "--backend-opt", f"endpoint_url={endpoint}", *TIERS[tiers]]
    if backend not in LOCAL and backend != "baseline":
        args += ["--backend", backend]
    out = cli(code, *args).stdout
    pid = int(out.split("(pid ")[1].split(",")[0].split(")")[0])
    try:
        s0 = json.loads(cli(code, "stats", mnt, "--json").stdout)
        g0, x0, c0, t0 = proxy.snapshot()["gets"] if proxy else 0, ctx_switches(pid), cpu_s(pid), time.monotonic()
        got = read_all(mnt, names, a.readers, a.read_size)
        wall, c1, x1 = time.monotonic() - t0, cpu_s(pid), ctx_switches(pid)
        g1 = proxy.snapshot()["gets"] if proxy else 0
        s1 = json.loads(cli(code, "stats", mnt, "--json").stdout)
    finally:
        cli(code, "umount", mnt)
    assert got == a.files * a.size, got
    misses = s1["misses"] - s0["misses"]
    return {"misses": misses, "gets": g1 - g0, "cpu_s": c1 - c0, "wall_s": wall,
            "cpu_ms_per_miss": 1e3 * (c1 - c0) / max(1, misses), "gets_per_miss": (g1 - g0) / max(1, misses),
            "ctx_per_miss": (x1 - x0) / max(1, misses)}


#: the runner's common options this benchmark honours
COMMON = ('rounds', 'baseline')


def add_arguments(p) -> None:
    p.add_argument("--files", type=int, default=300)
    p.add_argument("--size", type=int, default=40_000, help="bytes per file")
    p.add_argument("--readers", type=int, default=4)
    p.add_argument("--read-size", type=int, default=1 << 20, help="bytes per read() call")
    p.add_argument("--tiers", default="off,static10", help="off, static10, lru10 (comma-separated)")
    p.add_argument("--delay-ms", type=float, default=1.0)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--local", action="store_true",
                   help="a local directory instead of S3: --backend-timeout 60 (default) vs 0")
    p.set_defaults(rounds=2)


def run(a, bench):
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    work = tempfile.mkdtemp(prefix="bench-s3-miss-")
    codes = {"obstore": ROOT, "fsspec": ROOT}
    if a.local:
        codes = {"local": ROOT, "local-notimeout": ROOT}
        a.baseline = None
    base = None
    if a.baseline:
        base, rev = bench.baseline()
        codes["baseline"] = base
    results: Dict[tuple, List[Dict]] = {}
    names = [f"c{i % 10}/{i:05d}.jpg" for i in range(a.files)]

    def rounds(endpoint: str, proxy) -> None:
        cases = [(tiers, bc) for tiers in a.tiers.split(",") for bc in codes.items()]
        for r, (tiers, (backend, code)) in bench.interleaved(cases):
            res = run_one(code, backend, tiers, endpoint, proxy, names, a, work)
            results.setdefault((tiers, backend), []).append(res)
            print(f"round {r} tiers={tiers} {backend}: {json.dumps(res)}", file=sys.stderr, flush=True)

    try:
        if a.local:
            for n in names:
                os.makedirs(os.path.join(work, "src", os.path.dirname(n)), exist_ok=True)
                with open(os.path.join(work, "src", n), "wb") as f:
                    f.write(os.urandom(a.size))
            rounds("", None)
        else:
            with MotoServer() as moto:
                s3 = moto.client()
                s3.create_bucket(Bucket=BUCKET)
                with cf.ThreadPoolExecutor(8) as pool:
                    list(pool.map(lambda n: s3.put_object(Bucket=BUCKET, Key=f"ds/{n}", Body=os.urandom(a.size)),
                                  names))
                with LatencyProxyProcess(moto.port, a.delay_ms, a.rate) as proxy:
                    rounds(proxy.endpoint, proxy)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    label = {"obstore": "this tree, obstore (default)", "fsspec": "this tree, --backend fsspec",
             "baseline": f"{a.baseline} (its default client)", "local": "local directory, --backend-timeout 60 (default)",
             "local-notimeout": "local directory, --backend-timeout 0"}
    rows = ["| tiers | client | misses | GETs per miss | daemon CPU per miss (ms) | context switches per miss "
            "| wall (s) |", "|---|---|---|---|---|---|---|"]
    for (tiers, backend), runs in results.items():
        def span(key, fmt):
            vals = sorted(x[key] for x in runs)
            return fmt.format(vals[0]) if vals[0] == vals[-1] else (fmt + "-" + fmt).format(vals[0], vals[-1])
        gets = "-" if backend in LOCAL else span("gets_per_miss", "{:.2f}")
        rows.append(f"| {tiers} | {label[backend]} | {runs[0]['misses']} | {gets} | "
                    f"{span('cpu_ms_per_miss', '{:.2f}')} | {span('ctx_per_miss', '{:.1f}')} | "
                    f"{span('wall_s', '{:.1f}')} |")
    print("\n".join(rows))
    return 0
