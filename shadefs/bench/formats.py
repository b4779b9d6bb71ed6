"""Dataset formats through the mount vs direct: tar shards, HDF5, LMDB, Parquet, mmap'd .npy.

Regime: the first epoch is the daemon's; later ones **page cache** (the kernel keeps the files' pages
between opens). Limit: the bytes the client touches (a sequential reader whole 8 MiB chunks once, a random
reader the ranges it reads), against ``direct`` on the source.

The clients users run over a dataset mount, each on files built here (random bytes, fixed seeds):

- ``tar shards``: ``--shards`` WebDataset-style tar shards of ``--shard-size`` bytes (samples of ~100 kB);
  an epoch streams every shard whole with ``tarfile`` (mode ``r|``), in a new shard order each epoch.
  Tiers: ``tier < shard`` (``--ram-cache`` of half a shard) and ``tier = half`` (half the shards' bytes);
- ``hdf5`` (h5py), ``lmdb`` (the ``lmdb`` binding, read-only, no lock), ``npy mmap``
  (``np.load(mmap_mode='r')``): one file of ``--size`` bytes of ``--record``-byte records; an epoch opens
  it and reads ``--records`` random records (a fixed subset in a new order each epoch). Tiers:
  ``tier < file`` (a quarter of the file) and ``tier > file`` (twice the file);
- ``parquet column`` / ``parquet row group`` (pyarrow): one file of ``--size`` bytes, 8 float64 columns in
  16 row groups; an epoch reads 2 random columns whole, or 4 random row groups.

Each (workload, tier) is mounted fresh, for ``shadefs`` (this tree) and, with ``--baseline REV``, for that
revision side by side (its daemon run with its package on PYTHONPATH), RAM tier only, kernel page cache
on (the defaults). Epoch 0 warms (the direct side's page cache, the mounts' first reads); then
``--epochs`` timed epochs, the cases interleaved. Reported: epochs per second of the fastest timed epoch
and its ratio to ``direct``'s, the first read's milliseconds (right after the mount: an open of the
largest file and 4 KiB from its middle), the first epoch's seconds (what the first open and reads cost), what the
daemon read from the source over the whole run (``backend_bytes``), and the daemon's peak RSS
(``VmHWM`` of /proc/PID/status, read before unmounting). Every case must read the same bytes.

    python -m shadefs.bench formats [--size 256MiB] [--shards 4] [--shard-size 64MiB] [--epochs 3]
                                    [--baseline REV] [--only NAME ...] [--markdown]

Needs the ``bench`` extras (``pip install -e .[bench]``: h5py, lmdb, pyarrow); a workload whose module is
missing is reported as skipped.
"""
from __future__ import annotations

import io
import os
import random
import shutil
import tarfile
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from shadefs.bench.runner import ROOT, add_variant_option
from shadefs.config import parse_size
from shadefs.testing import Mount
from shadefs.testing.datasets import make_npy, npy_epoch

SAMPLE = 100_000  # bytes of a tar shard's samples (about)


# -- building the files ---------------------------------------------------------------------------

def make_shards(src: str, shards: int, shard_size: int) -> None:
    rng = random.Random(3)
    for s in range(shards):
        with tarfile.open(os.path.join(src, f"shard-{s:04d}.tar"), "w", format=tarfile.USTAR_FORMAT) as tf:
            written, i = 0, 0
            while written + SAMPLE + 1536 <= shard_size:
                n = rng.randint(SAMPLE // 2, SAMPLE * 3 // 2)
                for ext, data in (("jpg", os.urandom(n)), ("cls", str(i % 1000).encode())):
                    info = tarfile.TarInfo(f"{s:04d}{i:06d}.{ext}")
                    info.size, info.mtime = len(data), 1_000_000_000
                    tf.addfile(info, io.BytesIO(data))
                    written += 512 + -(-len(data) // 512) * 512
                i += 1


def make_h5(path: str, size: int, record: int) -> None:
    import h5py

    n = size // record
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", shape=(n, record), dtype=np.uint8)
        rng = np.random.default_rng(2)
        for i in range(0, n, 2048):
            d[i:i + 2048] = rng.integers(0, 256, size=(min(2048, n - i), record), dtype=np.uint8)


def make_lmdb(path: str, size: int, record: int) -> None:
    import lmdb

    n = size // record
    env = lmdb.open(path, map_size=size * 2 + (64 << 20), subdir=False, lock=False)
    rng = np.random.default_rng(4)
    with env.begin(write=True) as txn:
        for i in range(n):
            txn.put(f"{i:08d}".encode(), rng.integers(0, 256, size=record, dtype=np.uint8).tobytes())
    env.sync()
    env.close()
    lock = path + "-lock"
    if os.path.exists(lock):
        os.unlink(lock)


def make_parquet(path: str, size: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = size // (8 * 8)
    rng = np.random.default_rng(5)
    table = pa.table({f"c{j}": rng.random(rows) for j in range(8)})
    pq.write_table(table, path, row_group_size=-(-rows // 16), compression="none", use_dictionary=False)


# -- one epoch of each workload (returns a number every case must agree on) -------------------------

def tar_epoch(root: str, order: List[str]) -> int:
    total = 0
    for name in order:
        with open(os.path.join(root, name), "rb") as f, tarfile.open(fileobj=f, mode="r|") as tf:
            for m in tf:
                data = tf.extractfile(m).read()
                total += len(data) + data[0] if data else 0
    return total


def h5_epoch(root: str, idx: np.ndarray) -> int:
    import h5py

    with h5py.File(os.path.join(root, "data.h5"), "r") as f:
        d = f["x"]
        return sum(int(d[i, :8].sum()) + int(d[i, -1]) for i in idx.tolist())


def lmdb_epoch(root: str, idx: np.ndarray) -> int:
    import lmdb

    env = lmdb.open(os.path.join(root, "data.lmdb"), subdir=False, readonly=True, lock=False, readahead=False)
    try:
        total = 0
        with env.begin(buffers=True) as txn:
            for i in idx.tolist():
                v = txn.get(f"{i:08d}".encode())
                total += v[0] + v[-1] + len(v)
        return total
    finally:
        env.close()


def pq_column_epoch(root: str, cols: List[str]) -> float:
    import pyarrow.parquet as pq

    t = pq.read_table(os.path.join(root, "data.parquet"), columns=cols, memory_map=False)
    return round(sum(float(np.asarray(t.column(c)).sum()) for c in cols), 6)


def pq_group_epoch(root: str, groups: List[int]) -> float:
    import pyarrow.parquet as pq

    f = pq.ParquetFile(os.path.join(root, "data.parquet"), memory_map=False)
    return round(sum(float(np.asarray(f.read_row_group(g).column(0)).sum()) for g in groups), 6)


# -- the run ----------------------------------------------------------------------------------------

def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def run_case(src: str, work: str, envs: Dict[str, Optional[dict]], ram: int, epochs: int,
             fn: Callable[[str, object], object], plans: List[object],
             extra: Optional[Dict[str, List[str]]] = None) -> Dict[str, dict]:
    """Mount every side with ``--ram-cache ram`` (and its ``extra`` arguments), run epoch 0 then ``epochs``
    timed epochs interleaved."""
    mounts: Dict[str, Mount] = {}
    extra = extra or {}
    try:
        roots = {"direct": src}
        for name, env in envs.items():
            mnt = os.path.join(work, f"mnt-{len(os.listdir(work))}")
            mounts[name] = Mount(src, mnt, ["--ram-cache", str(ram)] + extra.get(name, []), log_file=f"{mnt}.log",
                                 env=env).start()
            roots[name] = mnt
        times = {c: [] for c in roots}
        answers = {c: set() for c in roots}
        # the first read after the mount: 4 KiB in the middle of the largest file (what an open of it and
        # one record cost before anything of it is cached)
        big = max(os.listdir(src), key=lambda n: os.path.getsize(os.path.join(src, n)))
        first_read = {}
        for c, root in roots.items():
            t = time.perf_counter()
            fd = os.open(os.path.join(root, big), os.O_RDONLY)
            try:
                os.pread(fd, 4096, os.path.getsize(os.path.join(src, big)) // 2)
            finally:
                os.close(fd)
            first_read[c] = time.perf_counter() - t
        source = {c: [] for c in roots}  # per epoch: bytes the daemon read from the source

        def one(c: str, e: int) -> None:
            b0 = mounts[c].stats()["backend_bytes"] if c in mounts else None
            t = time.perf_counter()
            answers[c].add(repr(fn(roots[c], plans[e])))
            times[c].append(time.perf_counter() - t)
            if b0 is not None:
                source[c].append(mounts[c].stats()["backend_bytes"] - b0)

        for c in roots:
            one(c, 0)
        for e in range(1, epochs + 1):
            names = list(roots)
            names = names[e % len(names):] + names[:e % len(names)]
            for c in names:
                one(c, e)
        ref = answers["direct"]
        for c in roots:
            assert answers[c] == ref, (c, answers[c], ref)  # every case read the same bytes
        out = {}
        for c, root in roots.items():
            row = {"best": min(times[c][1:]), "first": times[c][0], "first_read": first_read[c], "backend": None,
                   "rss": None, "epochs": times[c], "epoch_source": source[c]}
            if c in mounts:
                row["backend"] = mounts[c].stats()["backend_bytes"]
                row["rss"] = peak_rss(mounts[c].pid)
            out[c] = row
        return out
    finally:
        for m in mounts.values():
            m.umount()


#: the runner's common options this benchmark honours
COMMON = ('baseline',)


def add_arguments(ap) -> None:
    ap.add_argument("--size", default="256MiB", help="bytes of the HDF5, LMDB, .npy and Parquet files")
    ap.add_argument("--record", default="10000", help="bytes per record (default 10000)")
    ap.add_argument("--records", type=int, default=5000, help="random records per epoch (default 5000)")
    ap.add_argument("--shards", type=int, default=4, help="tar shards (default 4)")
    ap.add_argument("--shard-size", default="64MiB", help="bytes per tar shard (default 64MiB)")
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs per case (default 3)")
    ap.add_argument("--only", nargs="*", help="run only these workloads (names as in the table)")
    ap.add_argument("--work", default=None, help="directory for the files and mounts (default: a temp dir)")
    add_variant_option(ap, "large=--source-passthrough large")
    ap.add_argument("--per-epoch", action="store_true",
                    help="also print every epoch's seconds and the source MiB the daemon read in it, per case")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")


def run(args, bench):
    size, record = parse_size(args.size).nbytes, parse_size(args.record).nbytes
    shard_size = parse_size(args.shard_size).nbytes
    work = tempfile.mkdtemp(prefix="bench-formats-", dir=args.work)
    skipped = []
    results: List[Tuple[str, str, Dict[str, dict]]] = []
    try:
        variants = bench.mount_variants()
        envs: Dict[str, Optional[dict]] = {k: env for k, (env, _) in variants.items()}
        extra: Dict[str, List[str]] = {k: more for k, (_, more) in variants.items()}
        os.chdir(work)  # ``python -m shadefs`` puts the cwd first on sys.path: not this tree's package
        rng = np.random.default_rng(7)
        nrec = size // record
        subset = rng.choice(nrec, size=min(args.records, nrec), replace=False)
        rand_plans = [rng.permutation(subset) for _ in range(args.epochs + 1)]
        small, big = size // 4, 2 * size
        workloads = []  # (name, module needed, builder(src), fn, plans, [(tier label, ram bytes)])
        shard_names = [f"shard-{s:04d}.tar" for s in range(args.shards)]
        workloads.append(("tar shards", None, lambda s: make_shards(s, args.shards, shard_size), tar_epoch,
                          [random.Random(e).sample(shard_names, len(shard_names)) for e in range(args.epochs + 1)],
                          [("tier < shard", shard_size // 2), ("tier = half", shard_size * args.shards // 2)]))
        workloads.append(("hdf5", "h5py", lambda s: make_h5(os.path.join(s, "data.h5"), size, record), h5_epoch,
                          rand_plans, [("tier < file", small), ("tier > file", big)]))
        workloads.append(("lmdb", "lmdb", lambda s: make_lmdb(os.path.join(s, "data.lmdb"), size, record),
                          lmdb_epoch, rand_plans, [("tier < file", small), ("tier > file", big)]))
        workloads.append(("npy mmap", None, lambda s: make_npy(os.path.join(s, "rows.npy"), size, record),
                          lambda root, idx: round(npy_epoch(os.path.join(root, "rows.npy"), idx), 3), rand_plans,
                          [("tier < file", small), ("tier > file", big)]))
        cols = [sorted(random.Random(e).sample([f"c{j}" for j in range(8)], 2)) for e in range(args.epochs + 1)]
        groups = [random.Random(100 + e).sample(range(16), 4) for e in range(args.epochs + 1)]
        workloads.append(("parquet column", "pyarrow", lambda s: make_parquet(os.path.join(s, "data.parquet"), size),
                          pq_column_epoch, cols, [("tier < file", small), ("tier > file", big)]))
        workloads.append(("parquet row group", "pyarrow",
                          lambda s: make_parquet(os.path.join(s, "data.parquet"), size),
                          pq_group_epoch, groups, [("tier < file", small), ("tier > file", big)]))
        load0 = open("/proc/loadavg").read().split()[:3]
        for name, module, build, fn, plans, tiers in workloads:
            if args.only and name not in args.only:
                continue
            if module is not None:
                try:
                    __import__(module)
                except ImportError:
                    skipped.append(f"{name} (no {module}: pip install -e .[bench])")
                    continue
            src = os.path.join(work, "src-" + name.replace(" ", "-"))
            os.makedirs(src)
            build(src)
            for label, ram in tiers:
                results.append((name, label, run_case(src, work, envs, ram, args.epochs, fn, plans, extra)))
                print(f"  done: {name}, {label}", flush=True)
            shutil.rmtree(src, ignore_errors=True)
        load1 = open("/proc/loadavg").read().split()[:3]
        head = ["workload", "tier", "case", "epochs/s (fastest)", "vs direct", "first read ms", "first epoch s",
                "source MiB", "daemon peak RSS MiB"]
        lines = []
        if args.markdown:
            lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        else:
            lines.append(f"{head[0]:18s}{head[1]:14s}{head[2]:18s}" + "".join(f"{h:>20s}" for h in head[3:]))
        for name, label, rows in results:
            direct = rows["direct"]["best"]
            for c, r in rows.items():
                cells = [f"{1 / r['best']:.2f}", f"{direct / r['best']:.2f}x", f"{r['first_read'] * 1000:.1f}",
                         f"{r['first']:.2f}",
                         "-" if r["backend"] is None else f"{r['backend'] / 2**20:.0f}",
                         "-" if r["rss"] is None else f"{r['rss'] / 2**20:.0f}"]
                if args.markdown:
                    lines.append("| " + " | ".join([name, label, c] + cells) + " |")
                else:
                    lines.append(f"{name:18s}{label:14s}{c:18s}" + "".join(f"{x:>20s}" for x in cells))
        print(f"files {size / 2**20:.0f} MiB ({args.records} random records of {record} B per epoch), "
              f"{args.shards} tar shards of {shard_size / 2**20:.0f} MiB, {args.epochs} timed epochs; "
              f"load {' '.join(load0)} -> {' '.join(load1)}")
        print("\n".join(lines))
        if args.per_epoch:
            print("per epoch (epoch 0 first): seconds; source MiB the daemon read in it")
            for name, label, rows in results:
                for c, r in rows.items():
                    secs = " ".join(f"{t:.3f}" for t in r["epochs"])
                    mib = " ".join(f"{b / 2**20:.0f}" for b in r["epoch_source"]) or "-"
                    print(f"  {name}, {label}, {c}: {secs}; {mib}")
        for s in skipped:
            print(f"skipped: {s}")
    finally:
        os.chdir(ROOT)
        shutil.rmtree(work, ignore_errors=True)
