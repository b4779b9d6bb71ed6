#!/usr/bin/env python3
"""What announcing a plan costs the training loop: PlanSampler.__iter__ vs RandomSampler, and the size and
encoding time of one epoch's plan message, for an ImageNet-sized epoch (1.28M samples).

    python scripts/bench_plan_hook.py [--n 1281167] [--repeat 5]

Prints one table (median of --repeat runs, seconds). No daemon: the background send is not on the
training loop's path; its encoding cost is measured separately.
"""
import argparse
import statistics
import time

import numpy as np
import torch

from shadefs.control import protocol as P
from shadefs.hooks import PlanSampler


class Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def median_time(fn, repeat):
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=1_281_167)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    ds = Sized(a.n)
    g = torch.Generator().manual_seed(0)
    rs = torch.utils.data.RandomSampler(ds, generator=g)
    rows = [("RandomSampler: iter + consume", median_time(lambda: sum(1 for _ in rs), a.repeat))]
    for la in (0, 1):
        ps = PlanSampler(ds, seed=0, lookahead_epochs=la, client=False)
        rows.append((f"PlanSampler(lookahead_epochs={la}): iter + consume",
                     median_time(lambda: sum(1 for _ in ps), a.repeat)))
    ids = np.random.default_rng(0).permutation(a.n).astype(np.uint32)
    t = median_time(lambda: P.encode_plan(b"\0" * 8, 0, 0, [a.n], ids), a.repeat)
    size = sum(len(f) for f in P.encode_plan(b"\0" * 8, 0, 0, [a.n], ids))
    rows.append((f"encode one epoch's plan ({size / 2**20:.1f} MiB message), background thread", t))
    w = max(len(r[0]) for r in rows)
    print(f"{'step (N = %d)' % a.n:<{w}}  seconds")
    for name, sec in rows:
        print(f"{name:<{w}}  {sec:.3f}")


if __name__ == "__main__":
    main()
