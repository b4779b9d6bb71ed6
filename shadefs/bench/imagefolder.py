"""How long do ImageFolder's construction and a training job's cold epoch take over a shadefs mount vs on SOURCE directly?

Metadata (the default): mount time (the one-time scan) and ``ImageFolder(...)`` construction over a shadefs
mount vs on SOURCE directly.

Regime: metadata only (the kernel's dentry and inode caches of the source stay warm: nothing here drops them
machine-wide). Limit:
``ImageFolder`` on the source directly.

ImageFolder construction is pure metadata (a readdir and a stat per file); over the mount it is answered
from the in-memory snapshot, and with entry/attr timeouts of an hour the second construction does not
reach the daemon at all.

    python -m shadefs.bench imagefolder --data data/fmnist/train [--repeat 3] [--write-doc]

``--epochs E`` measures the data loading of a training job instead (the cold epoch): a ``DataLoader`` over
``ImageFolder`` (``--workers`` processes, default 4, ``--batch-size``, shuffled with a fixed seed), decoding
every image with PIL and resizing it to 64x64 (``transforms.Resize``, ``ToTensor``). Regime: the dropping
loader (each file's pages dropped on the same open, :func:`shadefs.testing.regime.pil_loader_dropping`).
Physical limit: the direct reader's epoch on the same tree. Configurations (``--configs``): ``direct``
(ImageFolder on SOURCE), ``shadefs`` (the default mount: no tier, every open a miss streamed from SOURCE),
``nvme`` (``--ram-cache 0 --disk-cache DIR``, its size twice the files' 4 KiB blocks and 64 MiB: room for
every file, metadata and slack included; ``100%`` held 1,992 of 2,000 ~110 kB images here): the first epoch
writes every file to the NVMe tier, the next ones, started once it holds every file, hit it), ``ram``
(``--ram-cache 100%``). Each round (``--rounds``, default 3) mounts afresh (a cold cache) and runs E epochs
per configuration, the order rotated by one each round. Per epoch: seconds, the CPU of the DataLoader's
workers (``RUSAGE_CHILDREN``: reaped at the epoch's end) and of the loading process, the daemon's CPU
(``/proc/PID/stat``) and its context switches, and the mount's counters (checked: every open of the first epoch a miss). ``--noise
N`` first writes SOURCE as N random-noise images of ImageNet size (~110 kB: 352x352 JPEG quality 90 and
192x192 PNG, alternating) in 10 classes, so that reading and decoding both weigh.

    python -m shadefs.bench imagefolder --data /dev/shm/noise --noise 2000 --epochs 2 --rounds 3
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Dict, List, Optional

from shadefs.bench.runner import ROOT
from shadefs.testing import Mount, ctx_switches, docsection, proc_cpu_s
from shadefs.testing.datasets import completed_tree, mark_complete

SCRIPTS = os.path.join(ROOT, "scripts")  # the examples a user runs (train_fashion_mnist.py)
START, END = docsection.markers("bench_imagefolder")
EPOCH_SECTION = "imagefolder_epoch"  # docs/results/imagefolder.md: one section per tree, imagefolder_epoch_NAME
EPOCH_CONFIGS = {"direct": None, "shadefs": [], "nvme": ["--ram-cache", "0"], "ram": ["--ram-cache", "100%"]}


def build(root: str) -> float:
    from torchvision.datasets import ImageFolder

    t0 = time.perf_counter()
    ds = ImageFolder(root)
    dt = time.perf_counter() - t0
    assert len(ds) > 0
    return dt


#: the runner's common options this benchmark honours (--rounds, --json: the cold-epoch runs, --epochs)
COMMON = ('write_doc', 'rounds', 'json')


def noise_tree(root: str, n: int, seed: int = 3) -> None:
    """Write ``n`` random-noise images under ``root`` in 10 class folders, alternately a 352x352 RGB JPEG
    (quality 90, ImageNet's mean pixels) and a 192x192 RGB PNG, ~110 kB each; a tree already complete (its
    marker) is kept."""
    import numpy as np
    from PIL import Image

    if (completed_tree(root) or {}).get("files") == n:
        return
    rng = np.random.default_rng(seed)
    for i in range(n):
        d = os.path.join(root, f"class{i % 10}")
        os.makedirs(d, exist_ok=True)
        if i % 2 == 0:
            Image.fromarray(rng.integers(0, 256, (352, 352, 3), dtype=np.uint8)).save(
                os.path.join(d, f"{i:06d}.jpg"), quality=90)
        else:
            Image.fromarray(rng.integers(0, 256, (192, 192, 3), dtype=np.uint8)).save(
                os.path.join(d, f"{i:06d}.png"))
    mark_complete(root, {"files": n})


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's reaped children."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def daemon_idle_cpu(pid: int) -> float:
    """The daemon's CPU seconds once two readings 0.2 s apart agree within a clock tick (its writes behind
    an epoch, to the NVMe tier, count), at most 5 s later."""
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    end = time.monotonic() + 5
    last = proc_cpu_s(pid)
    while True:
        time.sleep(0.2)
        now = proc_cpu_s(pid)
        if now - last <= tick or time.monotonic() > end:
            return now
        last = now


def loader_epochs(root: str, args, mount: Optional[Mount]) -> List[dict]:
    """``args.epochs`` epochs of the DataLoader over ``root``; per epoch: seconds, files, workers' CPU s,
    the loading process's own CPU s, and (with ``mount``) the daemon's CPU s and counters' deltas."""
    import resource

    import torch
    from torch.utils.data import DataLoader
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    from shadefs.testing.regime import pil_loader_dropping

    ds = ImageFolder(root, loader=pil_loader_dropping,
                     transform=transforms.Compose([transforms.Resize((64, 64)), transforms.ToTensor()]))
    dl = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                    persistent_workers=False, generator=torch.Generator().manual_seed(0))
    out = []
    for _ in range(args.epochs):
        if mount and out and "disk" in mount.stats().get("tiers", {}):
            # the NVMe tier writes each miss behind its reply: the next epoch starts once every file is on it
            end = time.monotonic() + 30
            while mount.stats()["tiers"]["disk"]["files"] < len(ds) and time.monotonic() < end:
                time.sleep(0.1)
        s0 = mount.stats() if mount else None
        d0 = proc_cpu_s(mount.pid) if mount else 0.0
        x0 = ctx_switches(mount.pid) if mount else 0
        w0 = children_cpu_s()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        n = 0
        for x, _ in dl:  # the workers are joined (reaped) when the epoch ends
            n += x.shape[0]
        secs = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        e = {"seconds": secs, "files": n, "workers_cpu_s": children_cpu_s() - w0,
             "main_cpu_s": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)}
        if mount:
            e["daemon_cpu_s"] = daemon_idle_cpu(mount.pid) - d0
            e["daemon_ctx"] = ctx_switches(mount.pid) - x0
            s1 = mount.stats()
            e["opens"] = s1["opens"] - s0["opens"]
            e["misses"] = s1["misses"] - s0["misses"]
            e["hits"] = sum(s1["hits"].values()) - sum(s0["hits"].values())
            e["stats"] = s1
        out.append(e)
    return out


def run_epochs(args, bench) -> int:
    """The cold-epoch benchmark (``--epochs``): every configuration of ``--configs``, ``--rounds`` times,
    interleaved; prints (and with ``--write-doc`` writes) the medians."""
    src = os.path.abspath(args.data)
    if args.noise:
        noise_tree(src, args.noise)
    files = [os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs
             if f.lower().endswith((".png", ".jpg", ".jpeg"))]
    total = sum(os.path.getsize(f) for f in files)
    blocks = sum(-(-os.path.getsize(f) // 4096) * 4096 for f in files)
    configs = args.configs.split(",")
    for c in configs:
        if c not in EPOCH_CONFIGS:
            raise SystemExit(f"unknown configuration {c!r}; one of {', '.join(EPOCH_CONFIGS)}")
    runs: Dict[str, List[List[dict]]] = {c: [] for c in configs}
    for _, c in bench.interleaved(configs):
        if EPOCH_CONFIGS[c] is None:
            runs[c].append(loader_epochs(src, args, None))
            continue
        with tempfile.TemporaryDirectory(dir=args.disk_dir) as tmp:
            mnt = os.path.join(tmp, "mnt")
            os.mkdir(mnt)
            extra = EPOCH_CONFIGS[c] + (["--disk-cache", os.path.join(tmp, "nvme"), "--disk-cache-size",
                                         str(2 * blocks + (64 << 20))] if c == "nvme" else [])
            m = Mount(src, mnt, extra, log_file=os.path.join(tmp, "log")).start()
            try:
                eps = loader_epochs(mnt, args, m)
            finally:
                err = m.umount()
            if err:
                raise SystemExit(f"imagefolder: {err}")
            first = eps[0]
            if (first["opens"], first["misses"]) != (first["files"], first["files"]):
                raise SystemExit(f"{c}: the first epoch's {first['files']} files made {first['opens']} opens, "
                                 f"{first['misses']} misses: not a cold epoch")
            runs[c].append(eps)
    bench.save_json(runs)

    med = statistics.median
    cores = len(os.sched_getaffinity(0))
    bench.regime("dontneed", dataset_bytes=total)
    head = (f"{len(files)} images, {total / len(files) / 1000:.1f} kB mean, on {src}; DataLoader: "
            f"{args.workers} workers, batch {args.batch_size}, PIL decode + Resize(64) + ToTensor; "
            f"{args.rounds} rounds (medians), interleaved; {cores} cores")
    print(head)
    headers = ["configuration", "epoch", "seconds", "x direct", "loader CPU ms/file", "daemon CPU us/file",
               "daemon ctx/file", "daemon share of CPU", "CPU busy (of all cores)", "hits/opens"]
    rows = []
    for e in range(args.epochs):
        base = med([run[e]["seconds"] for run in runs["direct"]]) if "direct" in runs else None
        for c in configs:
            eps = [run[e] for run in runs[c]]
            secs = med([x["seconds"] for x in eps])
            n = eps[0]["files"]
            wk = med([x["workers_cpu_s"] + x["main_cpu_s"] for x in eps])
            dm = med([x.get("daemon_cpu_s", 0.0) for x in eps])
            ctx = med([x.get("daemon_ctx", 0) for x in eps])
            hits = f"{eps[0]['hits']}/{eps[0]['opens']}" if "opens" in eps[0] else "-"
            rows.append([c, e + 1, f"{secs:.2f}", f"{secs / base:.2f}x" if base else "-", f"{wk * 1e3 / n:.2f}",
                         f"{dm * 1e6 / n:.0f}", f"{ctx / n:.1f}", f"{dm / (wk + dm):.0%}", f"{(wk + dm) / (secs * cores):.0%}", hits])
    note = ("loader CPU: the DataLoader's workers and the loading process (read, decode, resize, collate); daemon "
            "share = daemon CPU / (loader + daemon CPU); CPU busy = both / (seconds x cores); hits/opens: of "
            "the first round. Epoch 1 of every mount is every open a miss (checked).")
    t = bench.table("cold epoch (medians over rounds)", headers, rows, note)
    name = f"{EPOCH_SECTION}_{os.path.basename(src.rstrip('/'))}"
    start, end = docsection.markers(name)
    bench.write_results("\n".join([start, f"## Cold epoch from a tmpfs source: {os.path.basename(src)}", "",
                                    f"`{bench.command}`", "", bench.regime_line, head + "; " + bench.load() + ".",
                                    "", t.markdown(), end]), marker=name)
    return 0


def add_arguments(p) -> None:
    p.add_argument("--data", default="data/fmnist/train", help="an ImageFolder root (class folders)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--epochs", type=int, default=0, help="measure E loading epochs (the cold epoch) instead")
    p.add_argument("--configs", default="direct,shadefs,nvme", help="--epochs: of direct,shadefs,nvme,ram")
    p.add_argument("--workers", type=int, default=4, help="--epochs: DataLoader workers")
    p.add_argument("--batch-size", type=int, default=64, help="--epochs: batch size")
    p.add_argument("--noise", type=int, default=0, metavar="N",
                   help="--epochs: first write --data as N random-noise images (~110 kB)")
    p.add_argument("--disk-dir", default=None, help="--epochs: where the mounts and the NVMe tier go "
                   "(default: the temporary folder)")
    p.set_defaults(rounds=3)


def run(args, bench):
    if args.epochs:
        return run_epochs(args, bench)
    src = os.path.abspath(args.data)
    n_files = sum(len(fs) for _, _, fs in os.walk(src))
    rows = []
    cold_src, warm_src, mount_s, cold_mnt, warm_mnt = [], [], [], [], []
    for _ in range(args.repeat):
        cold_src.append(build(src))
        warm_src.append(build(src))
        with tempfile.TemporaryDirectory() as tmp:
            mnt = os.path.join(tmp, "mnt")
            os.mkdir(mnt)
            m = Mount(src, mnt, log_file=os.path.join(tmp, "log"))
            t0 = time.perf_counter()
            m.start()
            mount_s.append(time.perf_counter() - t0)
            try:
                cold_mnt.append(build(mnt))
                warm_mnt.append(build(mnt))
            finally:
                err = m.umount()  # and wait for the daemon to exit before the next round
                if err:
                    raise SystemExit(f"bench_imagefolder: {err}")
    med = statistics.median
    rows = [("SOURCE directly, first", med(cold_src)), ("SOURCE directly, again", med(warm_src)),
            ("shadefs mount (scan + fork + mount)", med(mount_s)),
            ("over the mount, first after mounting", med(cold_mnt)), ("over the mount, again", med(warm_mnt))]
    header = (f"ImageFolder over {n_files} files ({src}); median of {args.repeat}; "
              f"the source's dentries warm; load average {os.getloadavg()[0]:.1f}")
    print(header)
    for name, s in rows:
        print(f"  {name:<40} {s:8.3f} s")
    if args.write_doc:
        md = [START, "## Metadata: mount and ImageFolder construction", "",
              f"`python -m shadefs.bench imagefolder --data {args.data} --repeat {args.repeat}"
              " --write-doc` — {header}.", "",
              "| what | seconds |", "|---|---:|"]
        md += [f"| {name} | {s:.3f} |" for name, s in rows]
        md += ["", "The mount scans the source once (parallel scandir); afterwards lookups and readdir are "
               "answered from the snapshot and cached by the kernel for an hour, so a second ImageFolder "
               "construction costs about what it costs on a local directory.", END]
        bench.write_results("\n".join(md), "bench_imagefolder")
    return 0
