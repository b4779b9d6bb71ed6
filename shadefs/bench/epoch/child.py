"""One training run of the epoch benchmark, as its own process (``python shadefs/bench/epoch/child.py
--child CONFIG``, started by :func:`shadefs.bench.epoch.measure.run_child`): a DataLoader over the mount,
the direct S3 reader or the local copy, a small CNN, one line of JSON per run."""
from __future__ import annotations

import json
import sys
import time
from typing import Any, Dict

import numpy as np

from shadefs.bench.epoch.configs import DIRECT
from shadefs.testing import shadefs
from shadefs.testing.s3data import S3ImageFolder
from shadefs.testing.training import train_step

MEAN, STD = (0.2860,) * 3, (0.3530,) * 3


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



if __name__ == "__main__":  # one training run (run_child starts this file with --child CONFIG)
    sys.exit(child_main(json.loads(sys.argv[sys.argv.index("--child") + 1])))
