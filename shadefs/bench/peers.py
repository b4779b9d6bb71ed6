"""shadefs side by side with what users run instead: one training job over one S3 bucket, in the regime.

The job: ``torchvision``-style decoding (``PIL`` open + RGB, ``Resize(64)``, ``ToTensor``) of ``--files``
JPEGs of about 100 kB in 10 class folders, a ``DataLoader`` with ``--workers`` (2) workers and a small CNN,
``--epochs`` epochs from a cold cache. The storage: moto's S3 server on loopback behind the latency proxy
(``shadefs/testing/latency_proxy.py``, ``--delay-ms`` (5) each way, 1 Gbit/s). Every reader below reads the
same bucket through the same proxy, whose counters give each epoch's GETs and HEADs.

The readers (``--configs``; each a fresh training process, the same seed, so the same sample order):

- ``obstore``: no cache; a torch Dataset with one obstore GET per sample (``S3ImageFolder``).
- ``s3torch``: no cache; ``s3torchconnector.S3MapDataset.from_prefix`` (AWS's connector: the CRT client),
  ``S3ClientConfig(force_path_style=True)``.
- ``rclone``: ``rclone mount --vfs-cache-mode full --vfs-cache-max-size B``; ImageFolder on the mount.
- ``s3fs``: s3fs-fuse, ``-o use_cache=DIR -o ensure_diskfree=MB`` (s3fs has no cache size: it keeps
  ``ensure_diskfree`` MB free on the cache's filesystem, set at mount to the free space less B).
- ``transparent``: ``shadefs mount s3://... --disk-cache DIR --disk-cache-size B`` (policy ``static``),
  unmodified ImageFolder, ``shuffle=True``.
- ``plan``: the same mount, ``shadefs.hooks.PlanSampler`` (the same uniform permutations, announced).
- ``plan-nokc``: the same with ``--no-kernel-cache``. While a plan is active the daemon takes the files
  opened within the last quarter of its memory limit's bytes to be in the kernel's pages and neither
  prefetches nor fills them; on a machine whose memory is many times this dataset that is every file of the
  last epoch, which the dropping loader (below) has in fact dropped. A node whose memory the dataset
  outgrows gets what this row gets.
- ``shade``: ``--policy shade``, ``ShadeSampler`` + ``ScoreReporter``.

B, the cache budget, is ``--cache-fraction`` f of the dataset's bytes for every reader that has a cache (the
NVMe tier alone for shadefs: no RAM tier). The regime: every reader of a FUSE mount reads with
``pil_loader_dropping`` (``POSIX_FADV_DONTNEED`` after each file), so the kernel keeps none of a sample's
pages between opens, as for a dataset many times the node's memory (``shadefs.testing.regime``); the two
Dataset readers hold nothing between epochs anyway.

Per epoch: seconds, GETs and HEADs at the proxy, the most bytes on the cache device (``du`` of the cache
directory, sampled every 0.2 s during the epoch), the daemon's most RSS (rclone, s3fs, shadefs; sampled
likewise). Rounds are interleaved (``--rounds``: each round runs every reader once, in a rotated order); a
reader that cannot run here (not installed, fails to mount) is a row saying why.

Usage::

    python -m shadefs.bench peers [--files 1500] [--epochs 3] [--rounds 1] [--cache-fraction 0.2] [--delay-ms 5]
                   [--configs obstore,s3torch,rclone,s3fs,transparent,plan,plan-nokc,shade] [--workdir DIR]
                   [--json OUT.json] [--write-doc]
    python -m shadefs.bench peers --results OUT.json --write-doc      # re-render the report from a saved run

``--write-doc`` rewrites the section between ``<!-- bench_peers:start -->`` and ``<!-- bench_peers:end -->``
of docs/results/peers.md.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

from shadefs.bench.runner import ROOT
from shadefs.testing import docsection
from shadefs.testing.datasets import completed_tree, mark_complete
from shadefs.testing.training import train_step

REPO = ROOT

BUCKET, PREFIX = "shadefs-peers", "data"
CONFIGS = ("obstore", "s3torch", "rclone", "s3fs", "transparent", "plan", "plan-nokc", "shade")
LABELS = {"obstore": "obstore Dataset (no cache)", "s3torch": "s3torchconnector S3MapDataset (no cache)",
          "rclone": "rclone mount, vfs-cache full", "s3fs": "s3fs-fuse, use_cache",
          "transparent": "shadefs transparent (static)", "plan": "shadefs + PlanSampler",
          "plan-nokc": "shadefs + PlanSampler, --no-kernel-cache",
          "shade": "shadefs + ShadeSampler (shade)"}
MOUNTED = ("rclone", "s3fs", "transparent", "plan", "plan-nokc", "shade")
OUR_CONFIGS = ("transparent", "plan", "plan-nokc", "shade")
MEAN, STD = (0.5,) * 3, (0.29,) * 3


def log(msg: str) -> None:
    print(f"[bench_peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ================================================================================================ data
def build_dataset(root: str, n: int, seed: int = 0) -> Dict[str, Any]:
    """``root/train/c<k>/<i>.jpg``: ``n`` 320x320 RGB JPEGs of random pixels (about 100 kB each, quality 92),
    round-robin over 10 classes; reused when a complete tree of the same ``n`` is there. Returns
    ``{"files", "bytes"}``."""
    import numpy as np
    from PIL import Image

    done = completed_tree(root)
    if done is not None and done.get("files") == n:
        return done
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(seed)
    total = 0
    for i in range(n):
        d = os.path.join(root, "train", f"c{i % 10}")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"{i:06d}.jpg")
        Image.fromarray(rng.integers(0, 256, (320, 320, 3), dtype=np.uint8)).save(path, "JPEG", quality=92)
        total += os.path.getsize(path)
    done = {"files": n, "bytes": total}
    mark_complete(root, done)
    return done


# ========================================================================= the training child
def build_model():
    """A small CNN for 3x64x64 inputs."""
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, 16, 5, stride=2, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(32 * 8 * 8, 10))


class _S3TorchItem:
    """``S3MapDataset``'s transform: the object's bytes decoded like ImageFolder's, and its class (the key's
    first folder below the prefix)."""

    def __init__(self, transform, class_to_idx: Dict[str, int]):
        self.transform, self.class_to_idx = transform, class_to_idx

    def __call__(self, reader):
        from PIL import Image

        cls = reader.key.split("/")[-2]
        with Image.open(io.BytesIO(reader.read())) as img:
            return self.transform(img.convert("RGB")), self.class_to_idx[cls]


def make_dataset(cfg: Dict[str, Any]):
    from torchvision import datasets, transforms

    from shadefs.testing.regime import pil_loader_dropping

    transform = transforms.Compose([transforms.Resize(64), transforms.ToTensor(),
                                    transforms.Normalize(MEAN, STD)])
    root = f"{BUCKET}/{PREFIX}/train"
    if cfg["config"] == "obstore":
        from shadefs.testing.s3data import S3ImageFolder

        return S3ImageFolder(cfg["endpoint"], root, transform, client="obstore")
    if cfg["config"] == "s3torch":
        from s3torchconnector import S3ClientConfig, S3MapDataset

        classes = [f"c{k}" for k in range(10)]
        return S3MapDataset.from_prefix(f"s3://{root}/", region="us-east-1", endpoint=cfg["endpoint"],
                                        transform=_S3TorchItem(transform, {c: i for i, c in enumerate(classes)}),
                                        s3client_config=S3ClientConfig(force_path_style=True))
    return datasets.ImageFolder(os.path.join(cfg["mnt"], "train"), transform=transform,
                                loader=pil_loader_dropping)


def child_main(cfg: Dict[str, Any]) -> int:
    """One training run. Before and after each epoch it prints ``EPOCH_BEGIN`` / ``EPOCH_END`` and waits for a
    line on stdin (the parent reads its counters meanwhile); prints ``RESULT <json>`` last."""
    import warnings

    import torch
    from torch.utils.data import DataLoader

    warnings.filterwarnings("ignore", message="This DataLoader will create")
    torch.set_num_threads(1)
    torch.manual_seed(cfg["seed"])
    dataset = make_dataset(cfg)
    common = dict(batch_size=cfg["batch_size"], num_workers=cfg["workers"], persistent_workers=True)
    sampler = reporter = None
    if cfg["config"] in ("plan", "plan-nokc"):
        from shadefs.hooks import PlanSampler

        sampler = PlanSampler(dataset, seed=cfg["seed"], epochs=cfg["epochs"])
    elif cfg["config"] == "shade":
        from shadefs.hooks import ScoreReporter, ShadeSampler

        sampler = ShadeSampler(dataset, seed=cfg["seed"], epochs=cfg["epochs"])
        reporter = ScoreReporter(dataset, sampler=sampler)
    if sampler is not None:
        loader = DataLoader(dataset, sampler=sampler, **common)
    else:
        loader = DataLoader(dataset, shuffle=True, generator=torch.Generator().manual_seed(cfg["seed"]), **common)
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    epochs = []
    for epoch in range(cfg["epochs"]):
        print("EPOCH_BEGIN", flush=True)
        sys.stdin.readline()
        if sampler is not None:
            sampler.set_epoch(epoch)
        n = 0
        t0 = time.perf_counter()
        for x, y in loader:
            train_step(model, opt, x, y, reporter)
            n += len(y)
        epochs.append({"epoch": epoch + 1, "seconds": time.perf_counter() - t0, "samples": n})
        print("EPOCH_END", flush=True)
        sys.stdin.readline()
    del loader  # stop the workers: no file of a mount stays open
    print("RESULT " + json.dumps({"epochs": epochs, "n": len(dataset)}), flush=True)
    return 0


# ================================================================================ the parent side
def dir_bytes(path: str) -> int:
    """Bytes allocated on the device under ``path`` (``du``: blocks x 512; 0 when absent)."""
    total = 0
    for d, _, fs in os.walk(path):
        for name in fs:
            try:
                total += os.lstat(os.path.join(d, name)).st_blocks * 512
            except OSError:
                pass  # evicted while we walked
    return total


def rss_bytes(pid: Optional[int]) -> int:
    """Resident bytes of process ``pid`` now (0 when none or gone)."""
    if not pid:
        return 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Sampler(threading.Thread):
    """Every ``interval_s``: the bytes under ``cache_dir`` and the RSS of ``pid``; ``take()`` returns the
    most of each since the last ``take()`` and starts over."""

    def __init__(self, cache_dir: Optional[str], pid: Optional[int], interval_s: float = 0.2):
        super().__init__(daemon=True)
        self.cache_dir, self.pid, self.interval_s = cache_dir, pid, interval_s
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.max_bytes = self.max_rss = 0

    def sample(self) -> None:
        b = dir_bytes(self.cache_dir) if self.cache_dir else 0
        r = rss_bytes(self.pid)
        with self.lock:
            self.max_bytes, self.max_rss = max(self.max_bytes, b), max(self.max_rss, r)

    def run(self) -> None:
        while not self.stop_event.wait(self.interval_s):
            self.sample()

    def take(self) -> tuple:
        self.sample()
        with self.lock:
            out = (self.max_bytes, self.max_rss)
            self.max_bytes = self.max_rss = 0
        return out


def wait_mounted(mnt: str, proc: Optional[subprocess.Popen], timeout_s: float = 60.0) -> None:
    """Return once ``mnt`` is a mount point with the dataset's ``train`` folder; raises RuntimeError when the
    process exits first or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before mounting")
        if os.path.ismount(mnt) and os.path.isdir(os.path.join(mnt, "train")):
            return
        time.sleep(0.2)
    raise RuntimeError(f"no mount at {mnt} within {timeout_s:g} s")


def fuse_unmount(mnt: str, proc: Optional[subprocess.Popen]) -> None:
    """Unmount a peer's FUSE mount and wait for its process (killed after 20 s)."""
    for cmd in (["fusermount3", "-u", mnt], ["fusermount", "-u", mnt], ["umount", "-l", mnt]):
        if not os.path.ismount(mnt):
            break
        if shutil.which(cmd[0]):
            subprocess.run(cmd, capture_output=True, timeout=30)
    if proc is not None:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Peer:
    """One reader's set-up and tear-down around a training run: ``start()`` mounts (when it mounts),
    ``pid`` is its daemon, ``cache_dir`` its cache directory, ``stop()`` unmounts and removes the cache.
    ``unavailable()``: None, or why this reader cannot run here."""

    def __init__(self, name: str, a: argparse.Namespace, endpoint: str, budget: int, work: str):
        self.name, self.a, self.endpoint, self.budget = name, a, endpoint, budget
        self.mnt = os.path.join(work, f"mnt-{name}")
        self.cache_dir = os.path.join(work, f"cache-{name}") if name in MOUNTED else None
        self.log_file = os.path.join(work, f"{name}.log")
        self.proc: Optional[subprocess.Popen] = None
        self.mount = None
        self.pid: Optional[int] = None
        self.notes = ""

    def unavailable(self) -> Optional[str]:
        if self.name == "s3torch":
            try:
                import s3torchconnector  # noqa: F401
            except ImportError as e:
                return f"not installed: {e} (pip install s3torchconnector)"
        if self.name == "rclone" and not shutil.which("rclone"):
            return "not installed: no rclone on PATH (apt-get install rclone)"
        if self.name == "s3fs" and not shutil.which("s3fs"):
            return "not installed: no s3fs on PATH (apt-get install s3fs)"
        return None

    def start(self) -> None:
        if self.name not in MOUNTED:
            return
        shutil.rmtree(self.cache_dir, ignore_errors=True)  # start cold
        os.makedirs(self.cache_dir)
        os.makedirs(self.mnt, exist_ok=True)
        if self.name in OUR_CONFIGS:
            from shadefs.testing import Mount

            policy = "shade" if self.name == "shade" else "static"
            self.mount = Mount(f"s3://{BUCKET}/{PREFIX}", self.mnt,
                               ["--policy", policy, "--disk-cache", self.cache_dir, "--disk-cache-size",
                                str(self.budget), "--backend-opt", f"endpoint_url={self.endpoint}",
                                *(["--no-kernel-cache"] if self.name == "plan-nokc" else [])],
                               log_file=self.log_file, mount_timeout=300).start()
            self.pid = self.mount.pid
            return
        env = dict(os.environ)
        env.pop("AWS_CA_BUNDLE", None)
        out = open(self.log_file, "wb")
        try:
            if self.name == "rclone":
                env.update(RCLONE_CONFIG_PEER_TYPE="s3", RCLONE_CONFIG_PEER_PROVIDER="Other",
                           RCLONE_CONFIG_PEER_ENDPOINT=self.endpoint, RCLONE_CONFIG_PEER_REGION="us-east-1",
                           RCLONE_CONFIG_PEER_ACCESS_KEY_ID=env["AWS_ACCESS_KEY_ID"],
                           RCLONE_CONFIG_PEER_SECRET_ACCESS_KEY=env["AWS_SECRET_ACCESS_KEY"],
                           RCLONE_CONFIG_PEER_FORCE_PATH_STYLE="true")
                argv = ["rclone", "--config", "/dev/null", "mount", f"peer:{BUCKET}/{PREFIX}", self.mnt,
                        "--read-only", "--vfs-cache-mode", "full", "--vfs-cache-max-size", str(self.budget),
                        "--cache-dir", self.cache_dir]
                self.notes = f"--vfs-cache-max-size {self.budget}"
            else:
                free = shutil.disk_usage(self.cache_dir).free
                keep_mb = max(0, (free - self.budget) // 2**20)
                pw = os.path.join(os.path.dirname(self.mnt), "s3fs.passwd")
                with open(os.open(pw, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                    f.write(f"{env['AWS_ACCESS_KEY_ID']}:{env['AWS_SECRET_ACCESS_KEY']}\n")
                argv = ["s3fs", f"{BUCKET}:/{PREFIX}", self.mnt, "-f", "-o", f"url={self.endpoint}",
                        "-o", "use_path_request_style", "-o", f"use_cache={self.cache_dir}",
                        "-o", f"ensure_diskfree={keep_mb}", "-o", f"passwd_file={pw}", "-o", "ro",
                        # s3fs refuses to start unless multipart_size x parallel_count MB is free beyond
                        # ensure_diskfree (default 10 x 5): the smallest it takes, for a read-only mount
                        "-o", "multipart_size=5", "-o", "parallel_count=1"]
                self.notes = (f"ensure_diskfree={keep_mb} (MB; the free space less the budget at mount: s3fs has "
                              "no cache size), multipart_size=5, parallel_count=1")
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        finally:
            out.close()
        self.pid = self.proc.pid
        try:
            wait_mounted(self.mnt, self.proc)
        except RuntimeError as e:
            self.stop()
            raise RuntimeError(f"{self.name} did not mount: {e}; {self.tail()}") from None

    def tail(self) -> str:
        try:
            with open(self.log_file, errors="replace") as f:
                return " | ".join(f.read().strip().splitlines()[-3:])
        except OSError:
            return ""

    def stats(self) -> Optional[Dict[str, Any]]:
        return self.mount.stats() if self.mount is not None else None

    def stop(self) -> None:
        if self.mount is not None:
            self.mount.umount()
            self.mount = None
        elif self.name in MOUNTED:
            fuse_unmount(self.mnt, self.proc)
            self.proc = None
        if self.cache_dir:
            shutil.rmtree(self.cache_dir, ignore_errors=True)


def run_config(name: str, a: argparse.Namespace, proxy, budget: int, work: str) -> Dict[str, Any]:
    """Run reader ``name`` once from cold; returns ``{"config", "epochs": [...]}`` or ``{"config", "status"}``
    (why it did not run)."""
    peer = Peer(name, a, proxy.endpoint, budget, work)
    why = peer.unavailable()
    if why:
        return {"config": name, "status": why}
    try:
        peer.start()
    except Exception as e:  # a peer that fails to mount is a row saying why, not the end of the run
        return {"config": name, "status": f"failed to start: {e}"}
    cfg = {"config": name, "endpoint": proxy.endpoint, "mnt": peer.mnt, "seed": a.seed, "epochs": a.epochs,
           "workers": a.workers, "batch_size": a.batch_size}
    sampler = Sampler(peer.cache_dir, peer.pid)
    sampler.start()
    epochs, result, begin = [], None, None
    err_file = os.path.join(work, f"{name}.train.log")
    with open(err_file, "wb") as err:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", json.dumps(cfg)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
    timer = threading.Timer(a.run_timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            if line.startswith("EPOCH_BEGIN"):
                sampler.take()
                begin = (proxy.snapshot()["methods"], peer.stats())
            elif line.startswith("EPOCH_END"):
                methods = proxy.snapshot()["methods"]
                cache_bytes, rss = sampler.take()
                row = {"gets": methods.get("GET", 0) - begin[0].get("GET", 0),
                       "heads": methods.get("HEAD", 0) - begin[0].get("HEAD", 0),
                       "cache_bytes": cache_bytes, "rss": rss}
                now = peer.stats()
                if now is not None:
                    hits = lambda s: sum(s["hits"].values())  # noqa: E731
                    row.update(opens=now["opens"] - begin[1]["opens"], hits=hits(now) - hits(begin[1]),
                               misses=now["misses"] - begin[1]["misses"],
                               used_bytes=now["tiers"]["disk"]["used_bytes"])
                epochs.append(row)
            else:
                if line.startswith("RESULT "):
                    result = json.loads(line[len("RESULT "):])
                continue
            proc.stdin.write("\n")
            proc.stdin.flush()
        rc = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sampler.stop_event.set()
        peer.stop()
    if rc != 0 or result is None:
        with open(err_file, errors="replace") as f:
            last = (f.read().strip().splitlines() or ["(no output)"])[-1]
        return {"config": name, "status": f"training failed in epoch {len(epochs) + 1}: {last}"}
    for row, timing in zip(epochs, result["epochs"]):
        row.update(timing)
    return {"config": name, "epochs": epochs, "n": result["n"], "notes": peer.notes}


def run_benchmark(a: argparse.Namespace) -> Dict[str, Any]:
    from shadefs.testing.regime import describe
    from shadefs.testing.s3 import AWS_ENV_DROP, DUMMY_AWS_ENV, LatencyProxyProcess, MotoServer
    from shadefs.testing.s3data import upload

    os.environ.update(DUMMY_AWS_ENV)
    for k in AWS_ENV_DROP:
        os.environ.pop(k, None)
    work = a.workdir or tempfile.mkdtemp(prefix="bench-peers-")
    os.makedirs(work, exist_ok=True)
    data = build_dataset(os.path.join(work, "data"), a.files)
    budget = int(a.cache_fraction * data["bytes"])
    regime = describe("dontneed", dataset_bytes=data["bytes"])
    log(f"{data['files']} files, {data['bytes'] / 2**20:.1f} MiB; budget {budget / 2**20:.1f} MiB; {regime}")
    results: Dict[str, Any] = {"files": data["files"], "bytes": data["bytes"], "budget": budget,
                               "fraction": a.cache_fraction, "regime": regime, "delay_ms": a.delay_ms,
                               "epochs": a.epochs, "workers": a.workers, "runs": [], "loads": []}
    with MotoServer() as moto:
        upload(moto.endpoint, BUCKET, PREFIX, os.path.join(work, "data"))
        proxy = LatencyProxyProcess(moto.port, a.delay_ms, "1gbit").start()
        try:
            results["proxy"] = proxy.settings
            for rnd in range(a.rounds):
                order = a.configs[rnd % len(a.configs):] + a.configs[:rnd % len(a.configs)]
                for name in order:
                    log(f"round {rnd + 1}/{a.rounds}: {name}")
                    run = run_config(name, a, proxy, budget, work)
                    run.update(round=rnd + 1, load=os.getloadavg()[0])
                    results["runs"].append(run)
                    results["loads"].append(run["load"])
                    log("  " + ("; ".join(f"{e['seconds']:.1f} s, {e['gets']} GETs, {e['heads']} HEADs"
                                          for e in run["epochs"]) if "epochs" in run else run["status"]))
        finally:
            proxy.stop()
    if not a.workdir:
        shutil.rmtree(work, ignore_errors=True)
    results["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return results


# =============================================================================== the report
def _median(xs: List[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def per_config(results: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Per reader: ``status`` (when it never ran) or the medians over rounds of each epoch's seconds, GETs,
    HEADs, and the most cache bytes and RSS seen in any round."""
    out: Dict[str, Dict[str, Any]] = {}
    for name in [c for c in CONFIGS if any(r["config"] == c for r in results["runs"])]:
        runs = [r for r in results["runs"] if r["config"] == name]
        ran = [r for r in runs if "epochs" in r]
        if not ran:
            out[name] = {"status": runs[0]["status"]}
            continue
        E = min(len(r["epochs"]) for r in ran)
        col = lambda k: [_median([r["epochs"][e][k] for r in ran]) for e in range(E)]  # noqa: E731
        c = {"seconds": col("seconds"), "gets": col("gets"), "heads": col("heads"),
             "cache_bytes": max(e["cache_bytes"] for r in ran for e in r["epochs"]),
             "rss": max(e["rss"] for r in ran for e in r["epochs"]), "rounds": len(ran),
             "notes": ran[0].get("notes", "")}
        if "hits" in ran[0]["epochs"][0]:
            c["hit_ratio"] = [_median([r["epochs"][e]["hits"] / max(1, r["epochs"][e]["opens"]) for r in ran])
                              for e in range(E)]
        out[name] = c
    return out


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def table_rows(results: Dict[str, Any]) -> List[List[str]]:
    """The report's rows: reader, epoch seconds, speed-up over s3torchconnector per epoch, GETs and HEADs per
    epoch, most MiB on the cache device, most daemon RSS (MiB); or a row saying why the reader did not run."""
    cs = per_config(results)
    ref = cs.get("s3torch", {}).get("seconds")
    rows = []
    for name, c in cs.items():
        if "status" in c:
            rows.append([name, c["status"].split(" | ")[0][:200]] + ["-"] * 6)
            continue
        speed = ("/".join(f"{r / s:.2f}" for r, s in zip(ref, c["seconds"])) + "x") if ref else "-"
        hit = "/".join(f"{100 * h:.0f}" for h in c["hit_ratio"]) + "%" if "hit_ratio" in c else "-"
        rows.append([name, " / ".join(f"{s:.1f}" for s in c["seconds"]), speed,
                     " / ".join(f"{g:.0f}" for g in c["gets"]), " / ".join(f"{h:.0f}" for h in c["heads"]),
                     hit, _mib(c["cache_bytes"]) if name in MOUNTED else "-",
                     _mib(c["rss"]) if name in MOUNTED else "-"])
    return rows


HEADERS = ["reader", "epoch s", "vs s3torch", "GETs", "HEADs", "hit ratio", "cache MiB (max)", "daemon RSS MiB"]


def targets(results: Dict[str, Any]) -> List[str]:
    """The targets, each with its measured value and whether it is met."""
    cs, f = per_config(results), results["fraction"]
    ref = cs.get("s3torch", {}).get("seconds")
    out = []
    t = cs.get("transparent", {}).get("seconds")
    if ref and t:
        cold, warm = ref[0] / t[0], _median([r / s for r, s in zip(ref[1:], t[1:])])
        out.append(f"shadefs transparent vs s3torchconnector: cold {cold:.2f}x (target >= 1.0x: "
                   f"{'met' if cold >= 1.0 else 'NOT met'}), warm {warm:.2f}x (target >= 1/(1-f) = "
                   f"{1 / (1 - f):.2f}x: {'met' if warm >= 1 / (1 - f) else 'NOT met'})")
    for name in ("plan", "plan-nokc"):
        p = cs.get(name, {}).get("seconds")
        if ref and p:
            ratios = [r / s for r, s in zip(ref, p)]
            out.append(f"{LABELS[name]} vs s3torchconnector per epoch: {', '.join(f'{x:.2f}x' for x in ratios)} "
                       f"(target >= 2x in every epoch: {'met' if min(ratios) >= 2 else 'NOT met'})")
    over = {n: cs[n]["cache_bytes"] for n in OUR_CONFIGS if n in cs and "cache_bytes" in cs[n]}
    if over:
        worst = max(over.values())
        out.append(f"shadefs on the cache device: at most {_mib(worst)} MiB of a {_mib(results['budget'])} MiB "
                   f"budget (target never above: {'met' if worst <= results['budget'] else 'NOT met'})")
    return out


def render(results: Dict[str, Any]) -> str:
    start, end = docsection.markers("bench_peers")
    loads = results["loads"]
    title = (f"{results['files']} JPEGs, {_mib(results['bytes'])} MiB in S3 (moto, {results['delay_ms']:g} ms each "
             f"way); cache budget {results['fraction']:.0%} = {_mib(results['budget'])} MiB; "
             f"{results['workers']} workers; medians of {max(1, len(loads) // max(1, len(per_config(results))))} "
             f"round(s)")
    note = ("epoch s, vs s3torch, GETs, HEADs, hit ratio: per epoch (1 = cold); vs s3torch = s3torchconnector's "
            "epoch time / this reader's; cache MiB = most bytes on the cache device (du, sampled every 0.2 s); "
            "daemon RSS = the mount's process")
    table = docsection.Table(title, HEADERS, table_rows(results), note)
    lines = [start, "", f"Generated by `python -m shadefs.bench peers --write-doc`; {results['regime']}.", "",
             f"Proxy: {results.get('proxy', '')}. Load average over the runs {min(loads):.2f}-{max(loads):.2f} "
             f"(`uptime` at the end: {results.get('uptime', '')}).", "", table.markdown(), "",
             "Targets:", ""] + [f"- {t}" for t in targets(results)]
    notes = [f"- {n}: {LABELS[n]}" + (f"; {c['notes']}" if c.get("notes") else "")
             for n, c in per_config(results).items()]
    if notes:
        lines += ["", "Readers:", ""] + notes
    return "\n".join(lines + ["", end]) + "\n"


def print_report(results: Dict[str, Any]) -> None:
    text = render(results)
    table = docsection.Table("per epoch (1 = cold), medians over rounds", HEADERS, table_rows(results)).text()
    print(results["regime"])
    print(table)
    for t in targets(results):
        print(t)
    print(f"load average {min(results['loads']):.2f}-{max(results['loads']):.2f}; {results.get('uptime', '')}")
    return text


#: the runner's common options this benchmark honours
COMMON = ('rounds', 'write_doc', 'json')


def add_arguments(p) -> None:
    p.add_argument("--files", type=int, default=1500)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--cache-fraction", type=float, default=0.2, help="f: each cache's budget, of the dataset")
    p.add_argument("--delay-ms", type=float, default=5.0, help="the proxy's one-way delay (ms)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--run-timeout", type=float, default=900.0, help="seconds one reader's run may take")
    p.add_argument("--workdir", default=None, help="keep the dataset and the logs here (default: a temp dir)")
    p.add_argument("--results", default=None, help="render a saved --json instead of running")


def run(a, bench):
    a.configs = a.configs.split(",")
    for c in a.configs:
        if c not in CONFIGS:
            bench.error(f"unknown config {c!r} (one of {', '.join(CONFIGS)})")
    if not 0 < a.cache_fraction < 1:
        bench.error("--cache-fraction must be in (0, 1)")
    results = docsection.saved_or_measured(a.results, a.json, lambda: run_benchmark(a))
    text = print_report(results)
    if a.write_doc:
        bench.write_results(text, "bench_peers")
    return 0


if __name__ == "__main__":  # one reader's run (started by this file's parent with --child CONFIG)
    sys.exit(child_main(json.loads(sys.argv[sys.argv.index("--child") + 1])))
