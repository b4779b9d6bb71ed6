"""Why ShadeSampler's accuracy per epoch trails uniform shuffling: the sampler alone, in memory.

Regime: in memory, no mount (the sampler alone). Limit: uniform shuffling's accuracy per epoch.

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

``--data`` is a ``make_fashion_mnist.py`` tree or the directory of the gzip'd IDX files (the full
60,000 training and 10,000 test images). Per epoch the JSON also keeps the CNN's compute alone
(forward, backward, step; s), the epoch's wall time with the sampler and the emulated cache, and the
evaluation's; the tables give the first epoch at each ``--target`` accuracy per seed.

    python -m shadefs.bench shade_accuracy --data /usr/share/datasets/fashion-mnist [--epochs 8]
        [--seeds 0,1,2] [--cache 0.1] [--configs "uniform;shade;shade:rep_factor=1;shade-nocache"]
        [--json out.json] [--target 85 ...] [--png acc.png]
    python -m shadefs.bench shade_accuracy --report out.json [--target 85 ...] [--png acc.png]
"""
from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np

from shadefs.bench.runner import example


IDX_FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
             "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}


def load(data: str, split: str):
    """(images float32 (n, 1, 28, 28) normalised, labels int64 (n,), train_fashion_mnist module) of
    ``split`` ("train" or "test"), decoded once. ``data``: a ``make_fashion_mnist.py`` tree (DATA/split,
    an ImageFolder) or a directory of the gzip'd IDX files (``/usr/share/datasets/fashion-mnist``: all
    60,000 / 10,000 images, the same pixels and normalisation, labels as in the IDX files)."""
    import torch

    tfm = example("train_fashion_mnist")
    images, labels = IDX_FILES[split]
    if os.path.exists(os.path.join(data, images)):
        read_idx = example("make_fashion_mnist").read_idx
        raw = read_idx(os.path.join(data, images)).astype(np.float32) / 255.0
        x = (torch.from_numpy(raw).unsqueeze(1) - tfm.MEAN[0]) / tfm.STD[0]
        return x.contiguous(), torch.from_numpy(read_idx(os.path.join(data, labels)).astype(np.int64)), tfm
    from torchvision import datasets

    ds = datasets.ImageFolder(os.path.join(data, split), transform=tfm.make_transform())
    xs, ys = zip(*(ds[i] for i in range(len(ds))))
    return torch.stack(xs), torch.tensor(ys), tfm


class EmulatedCache:
    """SHADE's cache over sample indices: admit while room, else evict the least important if the
    newcomer is more important (``importance``: the sampler's weights array, read at each decision;
    among equally unimportant members the one in the lowest slot goes)."""

    def __init__(self, capacity: int, importance: np.ndarray):
        self.capacity, self.importance = capacity, importance
        self.resident = np.zeros(len(importance), dtype=bool)  # membership by sample index
        self.slots = np.empty(max(capacity, 0), dtype=np.int64)  # the members, slots[:size]
        self.size = 0

    def access(self, i: int) -> None:
        if self.resident[i] or self.capacity <= 0:
            return
        if self.size < self.capacity:
            self.slots[self.size] = i
            self.size += 1
            self.resident[i] = True
            return
        k = int(np.argmin(self.importance[self.slots]))
        victim = int(self.slots[k])
        if self.importance[i] > self.importance[victim]:
            self.resident[victim] = False
            self.slots[k] = i
            self.resident[i] = True


def make_sampler(n, seed, kwargs, cache_frac):
    from shadefs.hooks import ShadeSampler

    class EmulatedShadeSampler(ShadeSampler):
        """ShadeSampler whose residency query asks the emulated cache."""

        def _resident(self, shard, resident=None):
            if self.cache is None:
                return None
            return self.cache.resident[np.asarray(shard, dtype=np.int64)]

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


def train_run(cfg: str, seed: int, a, train, test, tfm) -> dict:
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
        t_start = time.monotonic()
        if sampler is None:
            order = torch.randperm(n, generator=gen).numpy()
            resident = 0
        else:
            sampler.set_epoch(epoch)
            order = np.fromiter(iter(sampler), dtype=np.int64)
            resident = sampler.plan.hits
        seen[order] = True
        model.train()
        compute = 0.0  # forward, backward and step only (the CNN's compute)
        for b in range(0, len(order), 64):
            idx = order[b:b + 64]
            t0 = time.monotonic()
            losses = F.cross_entropy(model(x[idx]), y[idx], reduction="none")
            compute += time.monotonic() - t0
            if sampler is not None:
                sampler.update_scores(idx, losses.detach().numpy())
                if sampler.cache is not None:
                    for i in idx.tolist():
                        sampler.cache.access(i)
            t0 = time.monotonic()
            opt.zero_grad(set_to_none=True)
            losses.mean().backward()
            opt.step()
            compute += time.monotonic() - t0
        t_train = time.monotonic()
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(test[0][i:i + 1000]).argmax(1) == test[1][i:i + 1000]).sum())
                          for i in range(0, len(test[1]), 1000))
            acc = 100.0 * correct / len(test[1])
        if sampler is not None:
            sampler.report_accuracy(acc)
        epochs.append({"epoch": epoch + 1, "test_acc": acc, "distinct": int(np.unique(order).size),
                       "seen": int(seen.sum()),
                       "resident_draws": int(resident),
                       "compute_s": round(compute, 3),
                       "train_s": round(t_train - t_start, 3),
                       "eval_s": round(time.monotonic() - t_train, 3),
                       "load1": os.getloadavg()[0]})
        print(f"  {cfg} seed {seed} epoch {epoch + 1}: acc {acc:.2f}, distinct {epochs[-1]['distinct']}, "
              f"compute {compute:.1f} s, epoch {t_train - t_start:.1f} s, load {os.getloadavg()[0]:.2f}",
              flush=True)
    return {"config": cfg, "seed": seed, "epochs": epochs}


def _stat(vals) -> str:
    return f"{statistics.mean(vals):.2f} ({min(vals):.2f}..{max(vals):.2f})"


def first_epoch_at(run: dict, target: float):
    """The first epoch (1-based) whose test accuracy is >= target %, or None."""
    return next((e["epoch"] for e in run["epochs"] if e["test_acc"] >= target), None)


def summarize(results: list, n_train: int, targets) -> None:
    """Print the per-epoch accuracy table and the per-configuration summary (markdown tables)."""
    cfgs = list(dict.fromkeys(r["config"] for r in results))
    by = {c: [r for r in results if r["config"] == c] for c in cfgs}
    seeds = sorted({r["seed"] for r in results})
    n_ep = min(len(r["epochs"]) for r in results)
    print(f"\nTest accuracy per epoch, % (mean (min..max) over seeds {', '.join(map(str, seeds))}):\n")
    print("| epoch | " + " | ".join(cfgs) + " |")
    print("|---" * (len(cfgs) + 1) + "|")
    for k in range(n_ep):
        print(f"| {k + 1} | " + " | ".join(_stat([r["epochs"][k]["test_acc"] for r in by[c]]) for c in cfgs) + " |")
    ref = statistics.mean(r["epochs"][n_ep - 1]["test_acc"] for r in by[cfgs[0]])
    targets = list(targets) + [round(ref, 2)]
    print(f"\nEpochs to a test accuracy: the first epoch that reached it, per seed ('-': not in {n_ep}); "
          f"the last target is {cfgs[0]}'s final mean. Distinct / resident draws: mean over epochs 2+, "
          f"% of the {n_train:,} training samples. Compute: forward + backward + step, s per epoch "
          "(mean over all epochs).\n")
    print("| config | final acc | mean of the last 3 epochs | "
          + " | ".join(f"epochs to {t:g} %" for t in targets)
          + " | distinct per epoch | resident draws per epoch | seen by the end | compute s/epoch | epoch s |")
    print("|---" * (8 + len(targets)) + "|")
    for c in cfgs:
        rs = by[c]
        fin = [r["epochs"][n_ep - 1]["test_acc"] for r in rs]
        last3 = [statistics.mean(e["test_acc"] for e in r["epochs"][n_ep - 3:n_ep]) for r in rs]
        later = [e for r in rs for e in r["epochs"][1:n_ep]] or [e for r in rs for e in r["epochs"][:n_ep]]
        reach = []
        for t in targets:
            eps = [first_epoch_at(r, t) for r in rs]
            reach.append(", ".join("-" if e is None else str(e) for e in eps))
        comp = [e.get("compute_s") for r in rs for e in r["epochs"][:n_ep] if e.get("compute_s") is not None]
        wall = [e.get("train_s") for r in rs for e in r["epochs"][:n_ep] if e.get("train_s") is not None]
        print(f"| {c} | {_stat(fin)} | {_stat(last3)} | " + " | ".join(reach)
              + f" | {statistics.mean(e['distinct'] for e in later) / n_train:.1%}"
              f" | {statistics.mean(e['resident_draws'] for e in later) / n_train:.1%}"
              f" | {statistics.mean(r['epochs'][n_ep - 1]['seen'] for r in rs) / n_train:.1%}"
              f" | {statistics.mean(comp) if comp else float('nan'):.1f}"
              f" | {statistics.mean(wall) if wall else float('nan'):.1f} |")


def plot(results: list, path: str, title: str) -> None:
    """Test accuracy against the epoch: mean over seeds per configuration, min..max shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for c in dict.fromkeys(r["config"] for r in results):
        rs = [r for r in results if r["config"] == c]
        n_ep = min(len(r["epochs"]) for r in rs)
        accs = np.array([[e["test_acc"] for e in r["epochs"][:n_ep]] for r in rs])
        ep = np.arange(1, n_ep + 1)
        line, = ax.plot(ep, accs.mean(0), marker="o", ms=3, label=c)
        ax.fill_between(ep, accs.min(0), accs.max(0), color=line.get_color(), alpha=0.2)
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy, % (mean; min..max over seeds shaded)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


#: the runner's common options this benchmark honours
COMMON = ('json',)


def add_arguments(ap) -> None:
    ap.add_argument("--data", help="a make_fashion_mnist.py tree, or a directory of the gzip'd IDX files "
                    "(/usr/share/datasets/fashion-mnist: the full 60,000 / 10,000 images)")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--cache", type=float, default=0.1, help="cache, fraction of the training samples")
    ap.add_argument("--configs", default="uniform,shade,shade:rep_factor=1,shade-nocache")
    ap.add_argument("--target", type=float, action="append",
                    help="test accuracy %% whose first epoch is reported (repeatable; default 85)")
    ap.add_argument("--report", metavar="JSON", help="print the tables of an earlier --json, train nothing")
    ap.add_argument("--png", help="plot test accuracy per epoch and configuration to this PNG")


def run(a, bench):
    targets = a.target or [85.0]
    if a.report:
        with open(a.report) as f:
            doc = json.load(f)
        results = doc["results"]
        n_train = doc.get("n_train") or max(e["seen"] for r in results for e in r["epochs"])
        summarize(results, n_train, targets)
        if a.png:
            plot(results, a.png, f"{n_train:,} training images, cache {doc['args']['cache']:.0%} emulated")
        return 0
    if not a.data:
        bench.error("--data is required (or --report)")
    import torch

    torch.set_num_threads(1)
    t0 = time.monotonic()
    xtr, ytr, tfm = load(a.data, "train")
    xte, yte, _ = load(a.data, "test")
    print(f"{len(ytr):,} training and {len(yte):,} test images in memory ({time.monotonic() - t0:.0f} s); "
          f"cache {a.cache:.0%} of the training samples; load {os.getloadavg()[0]:.2f}", flush=True)
    doc = {"args": vars(a), "n_train": len(ytr), "n_test": len(yte),
           "load_start": os.getloadavg(), "results": []}
    results = doc["results"]
    for cfg in a.configs.split(";" if ";" in a.configs else ","):
        for seed in (int(s) for s in a.seeds.split(",")):
            r = train_run(cfg, seed, a, (xtr, ytr), (xte, yte), tfm)
            results.append(r)
            doc["load_end"] = os.getloadavg()
            if a.json:  # after every run, so that an interrupted grid keeps what it finished
                with open(a.json, "w") as f:
                    json.dump(doc, f, indent=1)
            print(f"{cfg} seed {seed}: acc " + ", ".join(f"{e['test_acc']:.2f}" for e in r["epochs"])
                  + "; distinct " + ", ".join(str(e["distinct"]) for e in r["epochs"])
                  + "; resident draws " + ", ".join(str(e["resident_draws"]) for e in r["epochs"])
                  + f"; seen by the end {r['epochs'][-1]['seen']}", flush=True)
    print(f"\nload {os.getloadavg()[0]:.2f}, {time.monotonic() - t0:.0f} s in all")
    summarize(results, len(ytr), targets)
    if a.png:
        plot(results, a.png, f"{len(ytr):,} training images, cache {a.cache:.0%} emulated")
    return 0
