#!/usr/bin/env python3
"""What Belady-on-plan costs under the cache lock: the lock hold of one miss (the cursor's ``observe`` plus
the tier's admission, i.e. ``PlanPolicy.victims`` and the eviction) and of one hit, at ``--residents``
residents, in this process, no FUSE, no data.

A RAM tier of ``--residents`` one-byte files (the ``static`` inner policy, full) over a namespace of
``--files`` ids; a plan of two epochs (two seeded permutations of every file id, as ``PlanSampler`` with
``lookahead_epochs=1`` announces) is followed open by open in plan order. Every open is timed as the
daemon holds the lock for it: ``plans.observe(fid)`` then ``index.hit`` (a hit) or ``index.admit``
(a miss: the victim choice, the eviction, the insertion). The first miss after the announcement is
reported apart (``first miss``: with the heaps, the one rebuild per announcement happens there). With
``--streams 2`` the plan is two DDP ranks' shards (each epoch's permutation split in two, one plan per
rank), opened alternately: Belady over two cursors.

The physical limit to compare with: a dict lookup, a few heap operations and a lock round trip in CPython,
a few microseconds; anything O(residents) per miss grows with the tier.

``--baseline REV`` runs the same measurement against the ``shadefs`` package of git revision REV (``git
archive`` into a temporary directory, one subprocess each, alternately for ``--rounds`` rounds; each
figure is the best round's) side by side with the working tree.

    python scripts/bench_plan_victims.py --residents 100000 1000000 --streams 1 2 --misses 100 --baseline main [--markdown]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def child(residents: int, files: int, misses: int, hits: int, streams: int) -> dict:
    import numpy as np

    from shadefs.cache.index import TierIndex
    from shadefs.plan.plans import PlanRegistry
    from shadefs.plan.policy import PlanPolicy
    from shadefs.policies.base import Importance, get_policy

    plans = PlanRegistry(files, window=8192)
    h, _ = plans.register(None, np.arange(files, dtype=np.int64))
    index = TierIndex("ram", residents, PlanPolicy(get_policy("static")(residents, Importance(files)), plans))
    rng = np.random.default_rng(0)
    for f in rng.permutation(files)[:residents].tolist():
        index.admit(f, 1)
    epochs = [rng.permutation(files), rng.permutation(files)]
    t0 = time.perf_counter()
    if streams == 1:
        plans.announce(h, 0, 0, [files, files], np.concatenate(epochs).astype(np.uint32))
        order = np.concatenate(epochs)
    else:
        half = files // 2
        shards = [np.concatenate([e[:half] for e in epochs]), np.concatenate([e[half:] for e in epochs])]
        plans.announce(h, 0, 0, [half, half], shards[0].astype(np.uint32))
        plans.announce(h, 1, 0, [files - half, files - half], shards[1].astype(np.uint32))
        order = np.empty(2 * half, dtype=np.int64)
        order[0::2], order[1::2] = shards[0][:half], shards[1][:half]
    announce_s = time.perf_counter() - t0
    miss_t, hit_t, first = [], [], None
    pc = time.perf_counter
    for f in order.tolist():
        t = pc()
        plans.observe(f)
        if f in index:
            index.hit(f)
            dt = pc() - t
            if len(hit_t) < hits:
                hit_t.append(dt)
        else:
            index.admit(f, 1)
            dt = pc() - t
            if first is None:
                first = dt
            else:
                miss_t.append(dt)
        if len(miss_t) >= misses:
            break  # (the hits timed are those among the opens so far, at most ``hits``)
    miss_t.sort()
    hit_t.sort()

    def q(xs, p):
        return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")

    return {"residents": residents, "files": files, "streams": streams, "announce_s": announce_s,
            "first_miss_s": first, "misses": len(miss_t), "miss_median_s": q(miss_t, 0.5),
            "miss_p99_s": q(miss_t, 0.99), "miss_max_s": miss_t[-1] if miss_t else float("nan"),
            "hits": len(hit_t), "hit_median_s": q(hit_t, 0.5), "hit_p99_s": q(hit_t, 0.99)}


def run_child(pythonpath: str, args: list) -> dict:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *map(str, args)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def fmt_s(x: float) -> str:
    if x != x:
        return "-"
    return f"{x * 1e6:.1f} us" if x < 1e-3 else f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--residents", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--files-factor", type=float, default=1.25, help="namespace = residents x this")
    ap.add_argument("--misses", type=int, default=200, help="timed misses per run")
    ap.add_argument("--hits", type=int, default=20_000, help="timed hits per run at most (those before the "
                    "last timed miss)")
    ap.add_argument("--streams", type=int, nargs="+", default=[1], choices=[1, 2])
    ap.add_argument("--baseline", help="git revision to compare with (side by side)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--child", nargs=5, type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(*a.child)))
        return
    trees = [("this tree", ROOT)]
    tmp = None
    if a.baseline:
        from shadefs.testing import baseline  # here, not at the top: a child imports the baseline's tree

        tmp, _ = baseline.extract(ROOT, a.baseline, prefix="bench-plan-victims-")
        trees.insert(0, (a.baseline, tmp))
    try:
        rows = []
        for streams in a.streams:
            for n in a.residents:
                args = [n, int(n * a.files_factor), a.misses, a.hits, streams]
                best = {}
                for _ in range(a.rounds):
                    for label, path in trees:
                        r = run_child(path, args)
                        b = best.get(label)
                        if b is None or r["miss_median_s"] < b["miss_median_s"]:
                            best[label] = r
                rows.append((streams, n, best))
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    load = os.getloadavg()
    head = ["plans", "residents", "tree", "miss median", "miss p99", "miss max", "first miss", "hit median",
            "hit p99", "announce"]
    lines = []
    for streams, n, best in rows:
        for label, _ in trees:
            r = best[label]
            lines.append([str(streams), f"{n:,}", label, fmt_s(r["miss_median_s"]), fmt_s(r["miss_p99_s"]),
                          fmt_s(r["miss_max_s"]), fmt_s(r["first_miss_s"]), fmt_s(r["hit_median_s"]),
                          fmt_s(r["hit_p99_s"]), fmt_s(r["announce_s"])])
        if a.baseline:
            b, t = best[a.baseline], best["this tree"]
            lines.append(["", "", "ratio (before / after)", f"{b['miss_median_s'] / t['miss_median_s']:.0f}x",
                          f"{b['miss_p99_s'] / t['miss_p99_s']:.0f}x", "", "",
                          f"{b['hit_median_s'] / t['hit_median_s']:.2f}x", "", ""])
    if a.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---" if i < 3 else "--:" for i in range(len(head))) + "|")
        for l in lines:
            print("| " + " | ".join(l) + " |")
    else:
        w = [max(len(x[i]) for x in [head] + lines) for i in range(len(head))]
        for l in [head] + lines:
            print("  ".join(x.rjust(w[i]) for i, x in enumerate(l)))
    print(f"\n{a.misses} timed misses per run, and the hits among those opens; load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
