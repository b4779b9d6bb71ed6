#!/usr/bin/env python3
"""Why ShadeSampler's accuracy per epoch trails uniform shuffling: the sampler alone, in memory.

Trains ``train_fashion_mnist.py``'s small CNN (same model, SGD lr 0.01 momentum 0.9, batch 64) on a
``make_fashion_mnist.py`` tree decoded once into memory, so that only the order of the samples differs
between configurations (no FUSE, no S3, no DataLoader workers). ShadeSampler runs with ``client=False``
and its residency comes from a SHADE cache emulated here: ``--cache`` of the training set's samples,
admitted on a miss while there is room, else only if the newcomer's importance (the sampler's own
weights, the daemon's rank transform) beats the least important cached sample, which is evicted (the
``shade`` policy's rule, counted in samples instead of bytes). Per configuration and seed: the test
accuracy after every epoch, the distinct samples trained on per epoch, and the share of an epoch's
draws that were resident (repeats included).

Configurations (``--configs``): ``uniform`` (a fresh permutation per epoch, ``shuffle=True``);
``shade`` (ShadeSampler's defaults); ``shade:KEY=VALUE,...`` (ShadeSampler keyword arguments, e.g.
``shade:rep_factor=1``, ``shade:unscored_weight=max``); ``shade-nocache`` (importance sampling only, no cache: nothing repeated). Separate configurations with
``;`` when one has several keyword arguments.

    python scripts/bench_shade_accuracy.py --data /tmp/fm3k [--epochs 8] [--seeds 0,1,2] [--cache 0.1]
        [--configs "uniform;shade;shade:rep_factor=1;shade-nocache"] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def load(data: str, split: str):
    """(images float32 (n, 1, 28, 28) normalised, labels int64 (n,)) of DATA/split, decoded once."""
    import importlib.util

    import torch
    from torchvision import datasets

    spec = importlib.util.spec_from_file_location("train_fashion_mnist", os.path.join(HERE, "train_fashion_mnist.py"))
    tfm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tfm)
    ds = datasets.ImageFolder(os.path.join(data, split), transform=tfm.make_transform())
    xs, ys = zip(*(ds[i] for i in range(len(ds))))
    return torch.stack(xs), torch.tensor(ys), tfm


class EmulatedCache:
    """SHADE's cache over sample indices: admit while room, else evict the least important if the
    newcomer is more important (``importance``: the sampler's weights array, read at each decision)."""

    def __init__(self, capacity: int, importance: np.ndarray):
        self.capacity, self.importance = capacity, importance
        self.members: set = set()

    def access(self, i: int) -> None:
        if i in self.members or self.capacity <= 0:
            return
        if len(self.members) < self.capacity:
            self.members.add(i)
            return
        victim = min(self.members, key=lambda j: self.importance[j])
        if self.importance[i] > self.importance[victim]:
            self.members.discard(victim)
            self.members.add(i)


def make_sampler(n, seed, kwargs, cache_frac):
    from shadefs.hooks import ShadeSampler

    class EmulatedShadeSampler(ShadeSampler):
        """ShadeSampler whose residency query asks the emulated cache."""

        def _resident(self, shard, resident=None):
            if self.cache is None:
                return None
            return np.fromiter((int(i) in self.cache.members for i in shard), dtype=bool, count=len(shard))

    s = EmulatedShadeSampler(range(n), seed=seed, client=False, announce_plan=False, **kwargs)
    s.cache = EmulatedCache(int(cache_frac * n), s.weights) if cache_frac > 0 else None
    return s


def parse_kwargs(spec: str) -> dict:
    out = {}
    for item in filter(None, spec.split(",")):
        k, v = item.split("=", 1)
        try:
            out[k] = float(v) if "." in v or k in ("rep_factor", "min_miss_fraction", "smoothing") else int(v)
        except ValueError:
            out[k] = v
    return out


def run(cfg: str, seed: int, a, train, test, tfm) -> dict:
    import torch
    import torch.nn.functional as F

    x, y = train
    n = len(y)
    torch.manual_seed(seed)
    model = tfm.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sampler = None
    if cfg.startswith("shade"):
        name, _, spec = cfg.partition(":")
        sampler = make_sampler(n, seed, parse_kwargs(spec), 0.0 if name == "shade-nocache" else a.cache)
    gen = torch.Generator().manual_seed(seed)
    epochs = []
    seen = np.zeros(n, dtype=bool)
    for epoch in range(a.epochs):
        if sampler is None:
            order = torch.randperm(n, generator=gen).numpy()
            resident = 0
        else:
            sampler.set_epoch(epoch)
            order = np.fromiter(iter(sampler), dtype=np.int64)
            resident = sampler.plan.hits
        seen[order] = True
        model.train()
        for b in range(0, len(order), 64):
            idx = order[b:b + 64]
            losses = F.cross_entropy(model(x[idx]), y[idx], reduction="none")
            if sampler is not None:
                sampler.update_scores(idx, losses.detach().numpy())
                if sampler.cache is not None:
                    for i in idx.tolist():
                        sampler.cache.access(i)
            opt.zero_grad(set_to_none=True)
            losses.mean().backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            acc = 100.0 * float((model(test[0]).argmax(1) == test[1]).float().mean())
        if sampler is not None:
            sampler.report_accuracy(acc)
        epochs.append({"epoch": epoch + 1, "test_acc": acc, "distinct": int(np.unique(order).size),
                       "seen": int(seen.sum()),
                       "resident_draws": int(resident)})
    return {"config": cfg, "seed": seed, "epochs": epochs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--cache", type=float, default=0.1, help="cache, fraction of the training samples")
    ap.add_argument("--configs", default="uniform,shade,shade:rep_factor=1,shade-nocache")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    t0 = time.monotonic()
    xtr, ytr, tfm = load(a.data, "train")
    xte, yte, _ = load(a.data, "test")
    print(f"{len(ytr):,} training and {len(yte):,} test images in memory ({time.monotonic() - t0:.0f} s); "
          f"cache {a.cache:.0%} of the training samples; load {os.getloadavg()[0]:.2f}", flush=True)
    results = []
    for cfg in a.configs.split(";" if ";" in a.configs else ","):
        for seed in (int(s) for s in a.seeds.split(",")):
            r = run(cfg, seed, a, (xtr, ytr), (xte, yte), tfm)
            results.append(r)
            print(f"{cfg} seed {seed}: acc " + ", ".join(f"{e['test_acc']:.2f}" for e in r["epochs"])
                  + "; distinct " + ", ".join(str(e["distinct"]) for e in r["epochs"])
                  + "; resident draws " + ", ".join(str(e["resident_draws"]) for e in r["epochs"])
                  + f"; seen by the end {r['epochs'][-1]['seen']}", flush=True)
    print(f"\nmean (min..max) over seeds; load {os.getloadavg()[0]:.2f}, {time.monotonic() - t0:.0f} s in all")
    print("config | final acc | mean acc of the last 3 epochs | distinct per epoch (mean over epochs 2+) | resident draws per epoch (2+) | "
          "seen by the end")
    cfgs = list(dict.fromkeys(r["config"] for r in results))
    for cfg in cfgs:
        rs = [r for r in results if r["config"] == cfg]
        fin = [r["epochs"][-1]["test_acc"] for r in rs]
        dist = [e["distinct"] for r in rs for e in r["epochs"][1:]]
        res = [e["resident_draws"] for r in rs for e in r["epochs"][1:]]
        seen = [r["epochs"][-1]["seen"] for r in rs]
        last3 = [statistics.mean(e["test_acc"] for e in r["epochs"][-3:]) for r in rs]
        print(f"{cfg} | {statistics.mean(fin):.2f} ({min(fin):.2f}..{max(fin):.2f}) | "
              f"{statistics.mean(last3):.2f} ({min(last3):.2f}..{max(last3):.2f}) | "
              f"{statistics.mean(dist) / len(ytr):.1%} | {statistics.mean(res) / len(ytr):.1%} | "
              f"{statistics.mean(seen) / len(ytr):.1%}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
