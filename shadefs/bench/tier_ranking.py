"""Does a tier keep the most important files? Residents in the top of the importance ranking, per tier.

Limit: the residents a tier can hold, all of them among the most important (share 100 %), and
``shadefs simulate`` replaying the same trace.

A Fashion-MNIST tree (``make_fashion_mnist.py``: train and test splits) is mounted with ``--policy shade
--score-transform raw``; every training file gets a distinct importance (a seeded permutation of
10 .. 10 + n - 1) sent with ``ControlClient.send_scores``; then one shuffled pass reads every training
file once (the reader drops each file's pages: the regime users have). The tier's residents are asked
with ``ControlClient.resident`` and counted among the top ``1.2 x residents`` training files by
importance. The same trace is replayed by ``shadefs simulate``'s replay (:func:`shadefs.sim.simulate`,
with the disk tier's packing modelled by ``pack_below`` and its budget for entries) and its resident set
compared with the daemon's.

Tiers (``--tiers``): ``ram`` (``--ram-cache SIZE``) and ``disk`` (``--ram-cache 0 --disk-cache-size
SIZE``, small files packed into segments, the default ``--disk-pack-below``). Sizes (``--sizes``) are of
the source's bytes (both splits), as the mount takes them.

    python -m shadefs.bench tier_ranking --data /tmp/fm [--sizes 25%,40%] [--tiers ram,disk] [--seed 0]
        [--trees /tmp/main-worktree] [--json out.json]
"""
from __future__ import annotations

import itertools
import json
import math
import os
import random
import tempfile
import time

import numpy as np


from shadefs import sim  # noqa: E402
from shadefs.control.client import ControlClient, find_endpoint  # noqa: E402
from shadefs.testing import Mount  # noqa: E402
from shadefs.testing.regime import describe, read_dropping  # noqa: E402


def train_files(data: str) -> list:
    """Mount-relative paths of the training files, sorted."""
    out = []
    for top, _, files in os.walk(os.path.join(data, "train")):
        out += [os.path.relpath(os.path.join(top, f), data) for f in files]
    return sorted(out)


def top_count(paths, values, resident) -> tuple:
    """(residents, residents among the top ceil(1.2 x residents) by importance)."""
    n = int(np.sum(resident))
    k = min(len(paths), math.ceil(1.2 * n))
    order = np.argsort(-np.asarray(values), kind="stable")
    top = np.zeros(len(paths), dtype=bool)
    top[order[:k]] = True
    return n, int(np.sum(resident & top))


def run_one(data: str, tier: str, size: str, seed: int, work: str, tree: str = "") -> dict:
    paths = train_files(data)
    rng = random.Random(seed)
    values = np.arange(10, 10 + len(paths), dtype=np.float32)
    values = values[np.random.default_rng(seed).permutation(len(paths))]
    order = list(range(len(paths)))
    rng.shuffle(order)
    tag = f"{os.path.basename(tree or 'this')}-{tier}-{size.rstrip('%')}"
    mnt = os.path.join(work, f"mnt-{tag}")
    os.makedirs(mnt, exist_ok=True)
    trace = os.path.join(work, f"trace-{tag}.csv")
    args = ["--policy", "shade", "--score-transform", "raw", "--trace", trace, "--trace-overwrite"]
    if tier == "ram":
        args += ["--ram-cache", size]
    else:
        cache = os.path.join(work, f"cache-{tag}")
        os.makedirs(cache, exist_ok=True)
        args += ["--ram-cache", "0", "--disk-cache", cache, "--disk-cache-size", size]
    env = None
    here = os.getcwd()
    if tree:  # the daemon of another checkout (a side-by-side run against it): ``-m shadefs`` finds the
        # package in the working directory first, then PYTHONPATH
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
        os.chdir(tree)
    try:
        m = Mount(data, mnt, args, log_file=mnt + ".log", env=env).start()
    finally:
        os.chdir(here)
    with m:
        with ControlClient(find_endpoint(m.path)) as c:
            for i in range(0, len(paths), 64):  # minibatches of 64, as a training step reports them
                c.send_scores(paths[i:i + 64], values[i:i + 64])
            c.stats()  # a round trip: every score was applied before it
            for i in order:
                read_dropping(os.path.join(m.path, paths[i]))
            resident = c.resident(paths)
        st = m.stats()
    n, in_top = top_count(paths, values, resident)
    t = st["tiers"][tier]
    out = {"tree": tree or "this", "tier": tier, "size": size, "residents": n, "in_top": in_top,
           "capacity_bytes": t["capacity_bytes"], "used_bytes": t["used_bytes"],
           "overhead_bytes": t.get("overhead_bytes", 0)}
    # the simulator on the same trace and scores: its residents against the daemon's
    tr = sim.read_trace(trace)
    scores = os.path.join(work, "scores.csv")
    sim.write_scores(scores, paths, values)
    imp = sim.load_scores(scores, tr)
    if tier == "disk" and "entry_bytes" not in t:
        return out  # a tier without an entry budget in its stats: no replay of its packing to compare
    if tier == "ram":
        r = sim.simulate(tr, "shade", t["capacity_bytes"], imp, residents=True)
    else:
        r = sim.simulate(tr, "shade", t["entry_bytes"], imp, pack_below=t["pack_below"], residents=True)
    daemon_set = {p for p, f in zip(paths, resident) if f}
    out["sim_residents"] = len(r.residents)
    out["sim_equal"] = set(r.residents) == daemon_set
    return out


#: the runner's common options this benchmark honours
COMMON = ('json',)


def add_arguments(ap) -> None:
    ap.add_argument("--data", required=True, help="a make_fashion_mnist.py tree (train/ and test/)")
    ap.add_argument("--sizes", default="25%,40%")
    ap.add_argument("--tiers", default="ram,disk")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trees", default="",
                    help="comma-separated checkouts whose daemons run too, interleaved with this one's "
                         "(e.g. a worktree of main); empty: this checkout only")


def run(a, bench):
    nbytes = sum(os.path.getsize(os.path.join(a.data, p)) for p in train_files(a.data))
    print(describe("dontneed", dataset_bytes=nbytes))
    print(f"load: {open('/proc/loadavg').read().split()[:3]}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="tier-ranking-") as work:
        trees = [""] + [t for t in a.trees.split(",") if t]
        # interleaved: one run of each checkout per configuration, in turn
        for size, tier, tree in itertools.product(a.sizes.split(","), a.tiers.split(","), trees):
            t0 = time.monotonic()
            row = run_one(a.data, tier, size, a.seed, work, tree)
            row["seconds"] = round(time.monotonic() - t0, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"load: {open('/proc/loadavg').read().split()[:3]}")
    print(f"{'tree':16} {'tier':5} {'size':>5} {'residents':>9} {'in top 1.2x':>11} {'share':>6} {'sim == daemon':>13}")
    for r in rows:
        print(f"{r['tree'][-16:]:16} {r['tier']:5} {r['size']:>5} {r['residents']:>9} {r['in_top']:>11} "
              f"{100 * r['in_top'] / max(1, r['residents']):5.1f}% {str(r.get('sim_equal')):>13}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0
