"""What announcing a plan costs the training loop: PlanSampler.__iter__ vs RandomSampler, ShadeSampler's
draw (stable vs cdf) and its provisional next-epoch draw, and the size and encoding time of one epoch's
plan message, for an ImageNet-sized epoch (1.28M samples).

Regime: in this process, no I/O. Limit: ``RandomSampler``'s ``__iter__`` (what a job pays without a plan).

    python -m shadefs.bench plan_hook [--n 1281167 60000] [--repeat 5]

Prints one table per N (median of --repeat runs, seconds). No daemon: the background send and the
provisional draw are not on the training loop's path (they run on the announcer's thread); their cost is
measured separately, without the residency query (one per draw, as the real draw's).
"""
import statistics
import time
import warnings

import numpy as np
import torch

from shadefs.control import protocol as P
from shadefs.hooks import PlanSampler, ShadeSampler


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


class NoSend:
    """Stands in for the announcer: takes the announcements and sends nothing (the loop's side only)."""

    def __init__(self):
        self.jobs = 0

    def announce(self, epoch, orders):
        self.jobs += 1


def shade(n, draw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = ShadeSampler(Sized(n), seed=0, client=False, mode="aggressive", draw=draw)
    rng = np.random.default_rng(0)
    s.weights[:] = np.log(10 + rng.integers(0, 64, n))  # every sample scored once (ranks of batches of 64)
    s.weights[rng.random(n) < 0.37] = 1.0              # ~1/e never drawn yet
    s.ls = 0.03
    return s


def shade_rows(n, repeat):
    rows = []
    for draw in ("cdf", "stable"):
        s = shade(n, draw)
        rows.append((f"ShadeSampler(draw={draw!r}): plan_epoch (the draw at iter, no residency)",
                     median_time(lambda: s.plan_epoch(1), repeat)))
    s = shade(n, "stable")
    rows.append(("ShadeSampler: provisional_plan (announcer's thread, no residency)",
                 median_time(lambda: s.provisional_plan(2), repeat)))
    plan = s.plan_epoch(1)
    order = plan.order.tolist()
    rows.append(("iterate one epoch's indices: iter(list)", median_time(lambda: sum(1 for _ in iter(order)), repeat)))
    s.announcer = NoSend()
    s.plan_epoch = lambda epoch, **kw: plan  # the draw at iter is timed above; here only the iteration
    rows.append(("iterate one epoch's indices: ShadeSampler iter with the lookahead trigger (chain)",
                 median_time(lambda: sum(1 for _ in s), repeat)))
    assert s.announcer.jobs == 2 * repeat  # the epoch's draw and the provisional job, each time
    t0 = time.perf_counter()
    for _ in range(1000):
        s._announce_provisional(s.generation, 1, plan.order)
    rows.append(("the trigger on the loop's thread (queue the provisional job), per epoch",
                 (time.perf_counter() - t0) / 1000))
    return rows


#: the runner's common options this benchmark honours
COMMON = ()


def add_arguments(ap) -> None:
    ap.add_argument("--n", type=int, nargs="+", default=[1_281_167])
    ap.add_argument("--repeat", type=int, default=5)


def run(a, bench):
    for n in a.n:
        table(n, a.repeat)
        print()


def table(n, repeat):
    class A:
        pass

    a = A()
    a.n, a.repeat = n, repeat
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
    rows += shade_rows(a.n, a.repeat)
    w = max(len(r[0]) for r in rows)
    print(f"| {'step (N = %d)' % a.n:<{w}} | seconds |")
    print(f"|{'-' * (w + 2)}|--:|")
    for name, sec in rows:
        print(f"| {name:<{w}} | {sec:.2g} |" if sec < 0.001 else f"| {name:<{w}} | {sec:.3f} |")
