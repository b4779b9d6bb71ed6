"""Daemon memory for NVMe hits: what a disk hit holds in the daemon, with a RAM tier that refuses it and
with one that promotes it.

Regime: **counts** (the daemon's memory: the page cache does not change it). Limit: a refused hit holds
no more than the chunk it reads (8 MiB); a promoted file is held once, its own size.

One file of ``--size`` bytes (random, cached by 8 MiB chunks) is read whole through a first mount, which
writes its chunks to an NVMe tier (``--ram-cache 0``). Then, per case, a fresh mount of the same NVMe tier
reads it whole again: every chunk is a disk hit.

- ``ram refuses``: ``--ram-cache`` of 1.5 chunks (12 MiB), static policy: the RAM tier holds the first
  chunk it is offered and refuses every later one (it never evicts), so 31 of 32 hits are served from
  their entries;
- ``ram promotes``: ``--ram-cache`` of twice the file: every hit is promoted (read into memory, then the
  RAM tier's).

Reported per case and package (``shadefs``, and ``--baseline REV`` side by side, its daemon run with its
package on ``PYTHONPATH``): the disk hits and promotions (``shadefs stats``), the entries read whole
(``entry_loads``, where the package counts them), and the daemon's ``VmRSS`` before the read, after it, and
its peak (``VmHWM``), in MiB. Each case reads the same bytes as the source (checked). The NVMe tier is
rebuilt for each mount (a promotion moves the chunks out of it).

    python -m shadefs.bench disk_hit_memory [--size 256MiB] [--baseline REV] [--verify-entries every-open]
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from typing import Dict, Optional

from shadefs.bench.runner import ROOT, env_with
from shadefs.config import parse_size
from shadefs.testing import Mount, proc_vm


CHUNK = 8 << 20




def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)


def run_case(src: str, work: str, env: Optional[dict], ram: int, policy: str, verify: str, want: str) -> dict:
    cache = os.path.join(work, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    size = os.path.getsize(os.path.join(src, "big.bin"))
    common = ["--disk-cache", cache, "--disk-cache-size", str(2 * size + (64 << 20)), "--verify-entries", verify]
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    with Mount(src, mnt, ["--ram-cache", "0"] + common, log_file=os.path.join(work, "fill.log"), env=env) as m:
        assert _digest(os.path.join(mnt, "big.bin")) == want
    with Mount(src, mnt, ["--ram-cache", str(ram), "--policy", policy] + common,
               log_file=os.path.join(work, "hit.log"), env=env_with(env, SHADEFS_AUDIT="1")) as m:
        before = proc_vm(m.pid)
        assert _digest(os.path.join(mnt, "big.bin")) == want
        after = proc_vm(m.pid)
        s = m.stats()
        counters = m.full_stats().get("audit", {}).get("counters", {})
    return {"disk hits": s["hits"]["disk"], "promotions": counters.get("promotions"),
            "entry_loads": counters.get("entry_loads"), "rss before": before["VmRSS"],
            "rss after": after["VmRSS"], "peak": after["VmHWM"]}


#: the runner's common options this benchmark honours
COMMON = ('baseline',)


def add_arguments(ap) -> None:
    ap.add_argument("--size", default="256MiB", help="bytes of the file (default 256MiB)")
    ap.add_argument("--verify-entries", default="every-open", choices=["every-open", "first-hit"])
    ap.add_argument("--work", help="directory for the file, the NVMe tier and the mounts (default: a temp dir)")


def run(args, bench):
    size = parse_size(args.size).nbytes
    work = tempfile.mkdtemp(prefix="bench-disk-hit-memory-", dir=args.work)
    baseline_dir = None
    try:
        envs: Dict[str, Optional[dict]] = {"shadefs": None}
        if args.baseline:
            baseline_dir, rev = bench.baseline()
            envs[f"shadefs {rev}"] = dict(os.environ, PYTHONPATH=baseline_dir)
        os.chdir(work)  # ``python -m shadefs`` puts the cwd first on sys.path: not this tree's package
        src = os.path.join(work, "src")
        os.makedirs(src)
        with open(os.path.join(src, "big.bin"), "wb") as f:
            for _ in range(size >> 20):
                f.write(os.urandom(1 << 20))
            f.write(os.urandom(size & ((1 << 20) - 1)))
        want = _digest(os.path.join(src, "big.bin"))
        load0 = open("/proc/loadavg").read().split()[:3]
        cases = [("ram refuses", CHUNK + CHUNK // 2, "static"), ("ram promotes", 2 * size, "lru")]
        rows = []
        for label, ram, policy in cases:
            for name, env in envs.items():
                rows.append((label, name, run_case(src, work, env, ram, policy, args.verify_entries, want)))
        load1 = open("/proc/loadavg").read().split()[:3]
        mib = 1 << 20
        print(f"file {size / mib:.0f} MiB ({-(-size // CHUNK)} chunks), --verify-entries {args.verify_entries}; "
              f"load {' '.join(load0)} -> {' '.join(load1)}")
        print("| case | package | disk hits | promotions | entries read whole | RSS before MiB | RSS after MiB "
              "| peak RSS MiB | peak - before MiB |")
        print("|---|---|---|---|---|---|---|---|---|")
        for label, name, r in rows:
            loads = "-" if r["entry_loads"] is None else r["entry_loads"]
            print(f"| {label} | {name} | {r['disk hits']} | {r['promotions']} | {loads} | "
                  f"{r['rss before'] / mib:.0f} | {r['rss after'] / mib:.0f} | {r['peak'] / mib:.0f} | "
                  f"{(r['peak'] - r['rss before']) / mib:.0f} |")
    finally:
        os.chdir(ROOT)
        shutil.rmtree(work, ignore_errors=True)
