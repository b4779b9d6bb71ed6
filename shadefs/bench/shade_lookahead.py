"""ShadeSampler's provisional next-epoch draw, measured in a closed loop: hit ratio ÷ OPT by when the
provisional draw is announced (``lookahead_at``) and by draw (stable vs cdf), and how close the
provisional draw is to the real one.

Regime: **counts**, simulated (no mount). Limit: Belady's OPT on the same trace.

The loop is the daemon's classes without a mount: one ``TierIndex`` running ``PlanPolicy`` around
``shade`` (as every tier of a mount with a plan), a ``PlanRegistry`` that gets each epoch's real draw at its
start and, at ``lookahead_at``, ``[this epoch, provisional next epoch]`` (as the hook announces them), and a
real :class:`ShadeSampler` whose residency query asks that tier. One reader, batches of ``--batch``; the
losses of a batch are reported ``--lag`` batches after it is read (the batches a DataLoader has in
flight), to the sampler and to the daemon's importance. Synthetic losses: each sample has a difficulty
(lognormal), a loss is difficulty x lognormal noise, and a trained sample's difficulty shrinks by 3 %.
OPT: ``shadefs.sim.belady`` on the loop's own trace, counted from epoch 2 on (the warm epochs).

    python -m shadefs.bench shade_lookahead [--n 2000] [--epochs 3] [--sizes 5,10] [--seeds 0,1,2]
                                            [--at none,1.0,0.5,0.0] [--draws stable,cdf]

Also prints the overlap of two draws from the same seed whose weights differ in a fraction of the
samples (``--rescore``): the share of positions that agree and the set Jaccard of the distinct samples.
"""
import math

import numpy as np

from shadefs import sim
from shadefs.cache.index import TierIndex
from shadefs.hooks.sampler import ShadeSampler, _stream_key, race_draw
from shadefs.plan.plans import PlanRegistry
from shadefs.plan.policy import PlanPolicy
from shadefs.policies.base import Importance, get_policy
from shadefs.policies.shade import rank_transform


def jaccard(a, b):
    sa, sb = set(np.asarray(a).tolist()), set(np.asarray(b).tolist())
    return len(sa & sb) / max(1, len(sa | sb))


def closed_loop(n, pct, epochs, batch, lag, at, seed, draw):
    """Returns (warm hits, OPT's warm hits, [Jaccard of provisional vs real draw per epoch])."""
    rng = np.random.default_rng(seed + 100)
    difficulty = rng.lognormal(0, 1, n)
    s = ShadeSampler(list(range(n)), seed=seed, client=False, announce_plan=False, draw=draw)
    cap = max(1, int(n * pct / 100))  # files of 1 byte
    imp = Importance(n)
    plans = PlanRegistry(n)
    handle, _ = plans.register(None, np.arange(n))
    tier = TierIndex("ram", cap, PlanPolicy(get_policy("shade")(cap, imp), plans))
    s._resident = lambda shard, resident=None: np.fromiter((int(f) in tier for f in shard), bool, len(shard))
    trace, hit = [], []
    provisional, overlap = {}, []

    def report(done):
        loss = difficulty[done] * np.exp(rng.normal(0, 0.3, done.size))
        difficulty[done] *= 0.97
        s.update_scores(done, loss)
        imp.update(done, rank_transform(loss.astype(np.float32)))

    for e in range(epochs):
        s.set_epoch(e)
        order = np.array(list(iter(s)), dtype=np.int64)
        if e in provisional:
            overlap.append(jaccard(provisional[e].global_order, s.plan.global_order))
        plans.announce(handle, 0, e, [order.size], order.astype(np.uint32))
        pending = []
        sent = False
        for b in range(math.ceil(order.size / batch)):
            if at is not None and not sent and b * batch >= at * order.size and e + 1 < epochs:
                p = s.provisional_plan(e + 1)
                provisional[e + 1] = p
                plans.announce(handle, 0, e, [order.size, p.order.size],
                               np.concatenate([order, p.order]).astype(np.uint32))
                sent = True
            ids = order[b * batch:(b + 1) * batch]
            for f in ids.tolist():
                plans.observe(f)
                trace.append(f)
                if f in tier:
                    tier.hit(f)
                    hit.append(True)
                else:
                    tier.admit(f, 1)
                    hit.append(False)
            pending.append(ids)
            if len(pending) > lag:
                report(pending.pop(0))
        for done in pending:
            report(done)
    t = sim.Trace.from_requests([str(f) for f in trace], [1] * len(trace))
    mask = np.zeros(len(trace), dtype=bool)
    sim.belady(t, cap, hit_mask=mask)
    warm = slice(n, None)  # every epoch is n opens
    return int(np.sum(hit[warm])), int(mask[warm].sum()), overlap


def overlap_table(n, fractions, seed=0):
    rng = np.random.default_rng(seed)
    w = np.log(10 + rng.integers(0, 64, n)).astype(np.float64)
    w[rng.random(n) < 0.3] = 1.0
    key = _stream_key(seed, 1, 2)
    u = np.random.default_rng(seed + 1).random(n)
    print(f"overlap of two draws of {n} from the same seed, a fraction of the weights rescored:")
    print("| rescored | stable: positions equal | stable: Jaccard | cdf: positions equal | cdf: Jaccard |")
    print("|--:|--:|--:|--:|--:|")
    for frac in fractions:
        w2 = w.copy()
        k = int(frac * n)
        idx = rng.choice(n, k, replace=False)
        w2[idx] = np.log(10 + rng.integers(0, 64, k))
        a, b = race_draw(w, n, key), race_draw(w2, n, key)
        c1, c2 = np.cumsum(w), np.cumsum(w2)
        x = np.minimum(np.searchsorted(c1, u * c1[-1], side="right"), n - 1)
        y = np.minimum(np.searchsorted(c2, u * c2[-1], side="right"), n - 1)
        print(f"| {100 * frac:g} % | {np.mean(a == b):.3f} | {jaccard(a, b):.3f} | {np.mean(x == y):.3f} | "
              f"{jaccard(x, y):.3f} |")


#: the runner's common options this benchmark honours
COMMON = ()


def add_arguments(ap) -> None:
    ap.add_argument("--n", type=int, default=2000, help="samples (= opens per epoch)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lag", type=int, default=4, help="batches between a batch's read and its loss report")
    ap.add_argument("--sizes", default="5,10", help="cache sizes, %% of the samples")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--at", default="none,1.0,0.5,0.0", help="lookahead_at values; none = no provisional draw")
    ap.add_argument("--draws", default="stable,cdf")
    ap.add_argument("--rescore", default="0.01,0.05,0.13,0.25", help="fractions for the overlap table")


def run(a, bench):
    seeds = [int(x) for x in a.seeds.split(",")]
    print(f"closed loop: {a.n} samples, {a.epochs} epochs, batch {a.batch}, reports {a.lag} batches late, "
          f"seeds {seeds}; hits and OPT summed over the seeds, warm epochs")
    print("| draw | lookahead_at | cache | hits | OPT | ÷ OPT | provisional vs real draw (Jaccard, mean) |")
    print("|---|---|--:|--:|--:|--:|--:|")
    for draw in a.draws.split(","):
        for at_s in a.at.split(","):
            at = None if at_s == "none" else float(at_s)
            if at is None and draw != a.draws.split(",")[0]:
                continue  # without a provisional draw the draw choice only changes the sample
            for pct in [float(x) for x in a.sizes.split(",")]:
                runs = [closed_loop(a.n, pct, a.epochs, a.batch, a.lag, at, sd, draw) for sd in seeds]
                h, o = sum(r[0] for r in runs), sum(r[1] for r in runs)
                ov = [x for r in runs for x in r[2]]
                print(f"| {draw} | {at_s} | {pct:g} % | {h} | {o} | {h / o:.4f} | "
                      f"{np.mean(ov):.3f} |" if ov else f"| {draw} | {at_s} | {pct:g} % | {h} | {o} | "
                      f"{h / o:.4f} | |", flush=True)
    print()
    overlap_table(a.n, [float(x) for x in a.rescore.split(",")])
    return 0
