#!/usr/bin/env python3
"""Train a small CNN on a Fashion-MNIST ImageFolder tree (shadefs demo job).

The data are read the way an ordinary training job reads them, through an
unmodified ``torchvision.datasets.ImageFolder`` and a ``DataLoader`` with
worker processes, so the same script measures training over a local directory
or over a shadefs mount. Build the tree with ``make_fashion_mnist.py``.

Each epoch prints the train loss, the epoch time, images/s and the test
accuracy; ``--json`` writes the same figures for other scripts to read::

    {"epochs": [{"epoch", "train_loss", "epoch_time_s", "test_acc", ...}],
     "final_test_acc": ...}

``DIR`` may also be ``s3://bucket/prefix`` with ``--endpoint-url URL``: the
direct reader, no shadefs (``shadefs.testing.s3data.S3ImageFolder``: one s3fs
``cat_file`` GET per sample, one client per DataLoader worker).
``--progress`` draws a tqdm bar per epoch (images/s; on a shadefs mount the
epoch's live hit ratio and prefetched share from the daemon's stats, read at
most twice a second; on S3 the GETs so far). On a shadefs mount every epoch's
JSON record also has ``opens``, ``hits``, ``prefetched`` and ``hit_ratio``
(that epoch's training reads); over S3, ``gets``.

The pieces are small and importable (``build_model``, ``make_loaders``,
``train_one_epoch``, ``evaluate``, ``main``). The loss is computed per sample
(``reduction="none"``) and handed to ``train_one_epoch``'s ``on_batch_loss``
callback before its mean is back-propagated, so an importance sampler or a
per-sample loss reporter can hook in without changing the loop.

Usage::

    train_fashion_mnist.py --data DIR [--epochs 2] [--batch-size 64]
        [--workers min(4, cores)] [--lr 0.01] [--limit N] [--device auto|cpu|cuda]
        [--seed 0] [--hook] [--plan] [--progress] [--eval-last]
        [--json OUT.json] [--endpoint-url URL] [--test-data DIR] [--drop-pages]

``--drop-pages`` reads every image with ``shadefs.testing.regime.pil_loader_dropping``
(its pages dropped from the page cache after the read), so that repeat epochs
read through to the files, as a job whose dataset outgrows its memory does.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Subset
from torchvision import datasets, transforms

MEAN, STD = (0.2860,), (0.3530,)
NUM_CLASSES = 10
EVAL_BATCH_SIZE = 256


def build_model() -> nn.Module:
    """Return a small CNN for 1x28x28 inputs: two conv layers and two FC."""
    return nn.Sequential(
        nn.Conv2d(1, 16, kernel_size=5),    # 16x24x24
        nn.ReLU(),
        nn.MaxPool2d(2),                    # 16x12x12
        nn.Conv2d(16, 32, kernel_size=5),   # 32x8x8
        nn.ReLU(),
        nn.MaxPool2d(2),                    # 32x4x4
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 128),
        nn.ReLU(),
        nn.Linear(128, NUM_CLASSES),
    )


def make_transform() -> transforms.Compose:
    """Return the image transform: grayscale tensor, normalised."""
    return transforms.Compose([
        transforms.Grayscale(1),
        transforms.ToTensor(),
        transforms.Normalize(MEAN, STD),
    ])


def _seed_worker(worker_id: int) -> None:
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def make_loaders(args: argparse.Namespace) -> tuple:
    """Return (train_loader, test_loader) over DIR/train and DIR/test.

    With ``args.limit`` the training set is a fixed random subset of that
    many samples, drawn with ``args.seed``.
    """
    transform = make_transform()
    if is_s3(args.data):
        from shadefs.testing.s3data import S3ImageFolder
        root = args.data[len("s3://"):].rstrip("/")
        train_set = S3ImageFolder(args.endpoint_url, root + "/train", transform)
        test_set = S3ImageFolder(args.endpoint_url, root + "/test", transform)
    else:
        # --drop-pages: the kernel keeps no page of a sample between opens (a dataset larger than memory)
        loader = {}
        if getattr(args, "drop_pages", False):
            from shadefs.testing.regime import pil_loader_dropping
            loader = {"loader": pil_loader_dropping}
        train_set = datasets.ImageFolder(os.path.join(args.data, "train"),
                                         transform=transform, **loader)
        test_set = datasets.ImageFolder(os.path.join(getattr(args, "test_data", None) or args.data, "test"),
                                        transform=transform, **loader)
    if train_set.classes != test_set.classes:
        raise ValueError(f"{args.data}: train and test class folders differ")
    if args.limit is not None and args.limit < len(train_set):
        gen = torch.Generator().manual_seed(args.seed)
        indices = torch.randperm(len(train_set), generator=gen)[:args.limit]
        train_set = Subset(train_set, indices.tolist())

    pin = resolve_device(str(args.device)).type == "cuda"
    common = dict(num_workers=args.workers, pin_memory=pin,
                  persistent_workers=args.workers > 0,
                  worker_init_fn=_seed_worker)
    if getattr(args, "hook", False):
        # importance mode: SHADE's PADS sampler, cache-aware (shadefs.hooks)
        from shadefs.hooks import ShadeSampler
        train_loader = DataLoader(
            train_set, batch_size=args.batch_size,
            sampler=ShadeSampler(train_set, seed=args.seed, announce_plan=not getattr(args, "no_plan", False),
                                 lookahead_at=None if getattr(args, "no_lookahead", False) else 0.0,
                                 draw=getattr(args, "draw", "stable"), epochs=args.epochs,
                                 rep_factor=getattr(args, "rep_factor", 3.0)),
            **common)
    elif getattr(args, "plan", False):
        # clairvoyant mode: the same uniform permutations, announced to the daemon (shadefs.hooks)
        from shadefs.hooks import PlanSampler
        train_loader = DataLoader(
            train_set, batch_size=args.batch_size,
            sampler=PlanSampler(train_set, seed=args.seed, epochs=args.epochs), **common)
    else:
        train_loader = DataLoader(
            train_set, batch_size=args.batch_size, shuffle=True,
            generator=torch.Generator().manual_seed(args.seed), **common)
    test_loader = DataLoader(
        test_set, batch_size=max(args.batch_size, EVAL_BATCH_SIZE),
        shuffle=False,
        generator=torch.Generator().manual_seed(args.seed + 1), **common)
    return train_loader, test_loader


def is_s3(data: str) -> bool:
    return str(data).startswith("s3://")


def train_one_epoch(model: nn.Module, loader: DataLoader,
                    opt: torch.optim.Optimizer, device: torch.device,
                    on_batch_loss: Optional[Callable] = None,
                    on_batch_end: Optional[Callable] = None) -> float:
    """Train for one pass over ``loader``; return the mean per-sample loss.

    ``on_batch_loss(losses)``, if given, is called once per batch, in loader
    order, with the detached per-sample losses (a 1-D tensor on ``device``).
    ``on_batch_end(n)``, if given, after each step with the batch's size.
    """
    model.train()
    total_loss = torch.zeros((), device=device, dtype=torch.float64)
    count = 0
    for x, y in loader:
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        losses = F.cross_entropy(model(x), y, reduction="none")
        if on_batch_loss is not None:
            on_batch_loss(losses.detach())
        opt.zero_grad(set_to_none=True)
        losses.mean().backward()
        opt.step()
        total_loss += losses.detach().sum()
        count += len(y)
        if on_batch_end is not None:
            on_batch_end(len(y))
    return total_loss.item() / max(count, 1)


class CacheCounters:
    """A shadefs mount's counters, read from its daemon over the control endpoint
    (what ``shadefs stats --json`` prints), for per-epoch and live figures.

    ``path``: any path inside the mount. :meth:`read` returns ``{"opens",
    "hits", "prefetched"}`` (counts since the mount; hits = RAM + NVMe (+
    shared) tier hits, prefetched = opens served from a prefetch, ready or
    late), or None when ``path`` is not on a shadefs mount or the daemon did
    not answer within ``timeout_s`` seconds.
    """

    def __init__(self, path: str, timeout_s: float = 2.0):
        from shadefs.control.client import (ControlClient, EndpointNotFound,
                                            find_endpoint)
        try:
            self.client = ControlClient(find_endpoint(path), timeout_s=timeout_s)
        except EndpointNotFound:
            self.client = None

    def read(self) -> Optional[dict]:
        if self.client is None:
            return None
        try:
            s = self.client.stats()
        except (TimeoutError, RuntimeError, ValueError):  # no answer, an error reply, a bad reply
            return None
        pf = s.get("prefetch", {})
        return {"opens": s["opens"], "hits": sum(s["hits"].values()),
                "prefetched": pf.get("ready", 0) + pf.get("late", 0)}

    @staticmethod
    def delta(now: Optional[dict], then: Optional[dict]) -> Optional[dict]:
        """``now - then`` per counter, with ``hit_ratio`` (hits / opens, 0
        without opens); None if either is None."""
        if now is None or then is None:
            return None
        d = {k: now[k] - then[k] for k in ("opens", "hits", "prefetched")}
        d["hit_ratio"] = d["hits"] / d["opens"] if d["opens"] else 0.0
        return d


class EpochBar:
    """A tqdm bar over one epoch's samples (images/s), with a live postfix:
    the epoch's hit ratio and prefetched share on a shadefs mount (``counters``
    polled at most every ``interval_s`` seconds), or the GETs of an
    ``S3ImageFolder`` (``dataset.gets``).

    ``start``: the counters at the epoch's start (default: read now). Give
    the snapshot the epoch's record is computed from, and the record's delta
    to :meth:`close`, and the bar's last figures are the record's (the JSON,
    the demo's table and picture): the live polls lag by up to
    ``interval_s``, which in a short epoch is a few points of hit ratio.
    """

    def __init__(self, desc: str, total: int, counters: Optional[CacheCounters],
                 dataset=None, interval_s: float = 0.5, start: Optional[dict] = None,
                 file=None):
        from tqdm import tqdm
        self.bar = tqdm(total=total, desc=desc, unit="img", mininterval=interval_s,
                        dynamic_ncols=True, file=file or sys.stderr)
        self.counters, self.interval_s = counters, interval_s
        self.gets = getattr(dataset, "gets", None)
        self.gets0 = self.gets.value if self.gets is not None else 0
        if start is None and counters is not None:
            start = counters.read()
        self.start = start
        self.polled = 0.0

    def update(self, n: int) -> None:
        self.bar.update(n)
        now = time.monotonic()
        if now - self.polled < self.interval_s:
            return
        self.polled = now
        d = CacheCounters.delta(self.counters.read(), self.start) if self.counters is not None else None
        self._show(d)

    def _show(self, d: Optional[dict], refresh: bool = False) -> None:
        if d is not None and d["opens"]:
            self.bar.set_postfix_str(postfix(d), refresh=refresh)
        elif self.gets is not None:
            self.bar.set_postfix_str(f"GETs {self.gets.value - self.gets0:.0f}", refresh=refresh)

    def close(self, final: Optional[dict] = None) -> None:
        """Close the bar; ``final`` (a :meth:`CacheCounters.delta`): the
        epoch's figures, drawn last."""
        if final is not None or self.gets is not None:
            self._show(final)
        self.bar.close()


def postfix(d: dict) -> str:
    """The bar's cache figures of a :meth:`CacheCounters.delta` ``d`` (opens > 0):
    ``hit ratio H%, prefetched P%`` (of the epoch's training reads), the same
    rounding as the demo's table."""
    return (f"hit ratio {100 * d['hit_ratio']:.1f}%, prefetched "
            f"{100 * d['prefetched'] / d['opens']:.1f}%")


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader,
             device: torch.device) -> float:
    """Return the accuracy of ``model`` on ``loader`` in percent."""
    model.eval()
    correct = torch.zeros((), device=device, dtype=torch.int64)
    count = 0
    for x, y in loader:
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        correct += (model(x).argmax(dim=1) == y).sum()
        count += len(y)
    return 100.0 * correct.item() / max(count, 1)


def resolve_device(name: str) -> torch.device:
    """Map ``auto|cpu|cuda`` to a device; ``cuda`` must be available."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda requested but CUDA is not "
                         "available")
    return torch.device(name)


def default_workers() -> int:
    """DataLoader workers by default: min(4, cores); more than the cores only contend for them."""
    return min(4, os.cpu_count() or 1)


def default_threads(workers: int) -> int:
    """Return the intra-op thread count for the main process: 1 or 2.

    The model is small, so more threads barely help, and on a 2-core box
    the DataLoader workers need the cores: with 2 workers and 2 threads an
    epoch of 60k images took 21 s, with 1 thread 14 s.
    """
    return max(1, min(2, (os.cpu_count() or 1) - workers))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train a small CNN on a Fashion-MNIST ImageFolder tree "
                    "(DIR/train, DIR/test).")
    parser.add_argument("--data", required=True, metavar="DIR",
                        help="directory holding train/ and test/")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=default_workers(),
                        help="DataLoader worker processes (default: "
                             "min(4, cores) = %(default)s)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="train on a fixed random subset of N samples")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"),
                        default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads in the main process "
                             "(default: the cores the workers leave free, "
                             "1 to 2)")
    parser.add_argument("--hook", action="store_true",
                        help="importance mode: ShadeSampler + ScoreReporter "
                             "(shadefs.hooks) instead of shuffle=True")
    parser.add_argument("--plan", action="store_true",
                        help="announce each epoch's order with shadefs.hooks.PlanSampler (uniform permutations "
                             "the daemon prefetches ahead of) instead of shuffle=True")
    parser.add_argument("--no-plan", action="store_true",
                        help="with --hook: ShadeSampler does not announce its draws (announce_plan=False)")
    parser.add_argument("--no-lookahead", action="store_true",
                        help="with --hook: no provisional next-epoch draw (lookahead_at=None)")
    parser.add_argument("--draw", choices=("stable", "cdf"), default="stable",
                        help="with --hook: ShadeSampler's draw (default stable; cdf = the draw before the "
                             "provisional lookahead)")
    parser.add_argument("--rep-factor", type=float, default=3.0,
                        help="with --hook: ShadeSampler's rep_factor, how many times each cached draw is "
                             "repeated (default 3, SHADE's; docs/hooks.md: fewer repeats, more distinct "
                             "samples per epoch)")
    parser.add_argument("--json", metavar="OUT.json",
                        help="write per-epoch results as JSON")
    parser.add_argument("--eval-last", action="store_true",
                        help="test only after the last epoch (the other epochs' "
                             "test_acc is null): over slow storage the test set's "
                             "reads cost time too")
    parser.add_argument("--test-data", metavar="DIR",
                        help="read the test set from DIR/test instead of the "
                             "--data tree (e.g. a local copy, so that evaluating "
                             "after every epoch neither costs slow reads nor "
                             "passes through the cache under test)")
    parser.add_argument("--progress", action="store_true",
                        help="a progress bar per epoch (images/s; the live hit "
                             "ratio on a shadefs mount, GETs over S3)")
    parser.add_argument("--drop-pages", action="store_true",
                        help="read each image with shadefs.testing.regime.pil_loader_dropping: its pages are "
                             "dropped from the page cache after the read (POSIX_FADV_DONTNEED), so every "
                             "epoch reads through to the mount, as with a dataset larger than memory")
    parser.add_argument("--endpoint-url", metavar="URL",
                        help="with --data s3://bucket/prefix: the S3 endpoint "
                             "(read directly, no shadefs)")
    args = parser.parse_args(argv)
    if args.threads is None:
        args.threads = default_threads(args.workers)
    for name in ("epochs", "batch_size", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.workers < 0:
        parser.error("--workers must be >= 0")
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be >= 1")
    if args.drop_pages and is_s3(args.data):
        parser.error("--drop-pages reads files (a directory or a mount), not s3://")
    if is_s3(args.data) != bool(args.endpoint_url):
        parser.error("--endpoint-url goes with --data s3://bucket/prefix "
                     "(and only there)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    args.device = resolve_device(args.device)

    train_loader, test_loader = make_loaders(args)
    model = build_model().to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    n_train = len(train_loader.dataset)
    print(f"training on {n_train} images ({len(test_loader.dataset)} test) "
          f"from {args.data}, device {args.device}, {args.workers} workers, "
          f"{args.threads} threads, batch {args.batch_size}", flush=True)

    reporter = None
    if args.hook:
        from shadefs.hooks import ScoreReporter
        reporter = ScoreReporter(train_loader.dataset, sampler=train_loader.sampler)
        print("importance mode: ShadeSampler + ScoreReporter", flush=True)

    counters = None if is_s3(args.data) else CacheCounters(args.data)
    gets = getattr(train_loader.dataset, "gets", None)
    results = []
    t_start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        if reporter is not None or args.plan:
            train_loader.sampler.set_epoch(epoch - 1)
        before = counters.read() if counters is not None else None
        gets0 = gets.value if gets is not None else 0
        bar = None
        if args.progress:
            bar = EpochBar(f"epoch {epoch}/{args.epochs}", len(train_loader.sampler), counters,
                           train_loader.dataset, start=before)
        t0 = time.perf_counter()
        cache = None
        try:
            loss = train_one_epoch(model, train_loader, opt, args.device,
                                   on_batch_loss=reporter and reporter.report,
                                   on_batch_end=bar and bar.update)
            epoch_time = time.perf_counter() - t0
            # the epoch's record; the bar's last frame shows the same figures
            cache = CacheCounters.delta(counters.read() if counters is not None else None, before)
        finally:
            if bar is not None:
                bar.close(cache)
        t1 = time.perf_counter()
        acc = None
        if epoch == args.epochs or not args.eval_last:
            acc = evaluate(model, test_loader, args.device)
            if reporter is not None:
                reporter.report_accuracy(acc)
        eval_time = time.perf_counter() - t1
        rate = n_train / epoch_time
        results.append({"epoch": epoch, "train_loss": loss,
                        "epoch_time_s": epoch_time, "images_per_s": rate,
                        "eval_time_s": eval_time, "test_acc": acc,
                        **(cache or {}),
                        **({"gets": int(gets.value - gets0)} if gets is not None else {})})
        if args.json:  # after every epoch: a run stopped part-way keeps the epochs it finished
            write_json(args.json, results, n_train, time.perf_counter() - t_start)
        print(f"epoch {epoch}/{args.epochs}: train_loss {loss:.4f}  "
              f"time {epoch_time:.1f} s  {rate:.0f} img/s  "
              + (f"test_acc {acc:.2f}% (eval {eval_time:.1f} s)" if acc is not None else "(no eval)"),
              flush=True)
    total = time.perf_counter() - t_start
    final_acc = results[-1]["test_acc"]
    print(f"done: {args.epochs} epochs in {total:.1f} s, final train_loss "
          f"{results[-1]['train_loss']:.4f}, final test_acc {final_acc:.2f}%")

    if args.json:
        write_json(args.json, results, n_train, total)
    return 0


def write_json(path: str, results: list, n_train: int, total: float) -> None:
    """Write the per-epoch ``results`` so far (``final_test_acc``: the last epoch's), atomically."""
    with open(path + ".tmp", "w") as f:
        json.dump({"epochs": results, "final_test_acc": results[-1]["test_acc"],
                   "n_train": n_train, "total_time_s": total}, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C: stop quietly (the demo, or the user, unmounts)
        print("interrupted", file=sys.stderr)
        sys.exit(128 + 2)
