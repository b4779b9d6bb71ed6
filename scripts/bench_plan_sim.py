#!/usr/bin/env python3
"""Hit ratio of Belady on announced plans vs the policy alone vs OPT, on a recorded training trace.

Replays the ``train/`` opens of a ``shadefs mount --trace`` file (e.g. ``make demo``'s importance run:
ShadeSampler, which announces each epoch's PADS draw at the epoch's start) through one tier of each
cache size, three ways: the policy alone; the policy wrapped in ``PlanPolicy`` with each epoch's order
announced when the epoch starts, as ShadeSampler does (no lookahead: the next draw depends on scores not
yet reported); the same with an oracle lookahead (each epoch's plan announced together with the next
epoch's real draw, which ShadeSampler cannot know: it isolates what the missing lookahead costs); and
Belady's OPT with the whole future. Same classes as the daemon
(``shadefs.plan``); one reader's order. The ``live`` column is what the daemon that recorded the trace
served from its tiers (the trace's ``outcome`` column: ram, disk, shared), e.g. with ShadeSampler's
provisional next-epoch draws, which the replay does not model.

    python scripts/bench_plan_sim.py TRACE --epoch-len N [--policy shade] [--sizes 5,10,20] [--prefix train/]
"""
import argparse
import csv
import sys

import numpy as np

from shadefs import sim
from shadefs.cache.index import TierIndex
from shadefs.plan.plans import PlanRegistry
from shadefs.plan.policy import PlanPolicy
from shadefs.policies.base import Importance, get_policy


def epoch_plans(trace, policy, cache_bytes, epoch_len, importance=None, lookahead=0):
    rank = trace.namespace_ids
    fids = rank[trace.ids]
    sizes = np.empty_like(trace.sizes)
    sizes[rank] = trace.sizes
    sizes = sizes.tolist()
    imp = Importance(trace.distinct_files)
    if importance is not None:
        imp.values[rank] = importance.values
    plans = PlanRegistry(trace.distinct_files)
    h, _ = plans.register(None, np.arange(trace.distinct_files, dtype=np.int64))
    idx = TierIndex("ram", cache_bytes, PlanPolicy(get_policy(policy)(cache_bytes, imp), plans))
    hits = 0
    for i, f in enumerate(fids.tolist()):
        if i % epoch_len == 0:
            # this epoch's order, and with ``lookahead`` the next epochs' real draws too (an oracle:
            # ShadeSampler cannot know them, they depend on scores not yet reported)
            segs = [fids[j:j + epoch_len] for j in range(i, min(i + (lookahead + 1) * epoch_len, fids.size), epoch_len)]
            plans.announce(h, 0, i // epoch_len, [x.size for x in segs], np.concatenate(segs).astype(np.uint32))
        plans.observe(f)
        if f in idx:
            idx.hit(f)
            hits += 1
        else:
            idx.admit(f, sizes[f])
    return hits


HIT_OUTCOMES = ("ram", "disk", "shared")


def live_hits(path, prefix):
    """Opens under ``prefix`` the recording daemon served from a tier (None: no outcome column)."""
    with open(path, newline="") as f:
        rows = csv.reader(f)
        head = next(rows, None)
        if not head or "outcome" not in head:
            return None
        pi, oi = head.index("path"), head.index("outcome")
        return sum(1 for row in rows if row[pi].startswith(prefix) and row[oi] in HIT_OUTCOMES)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--epoch-len", type=int, required=True, help="train opens per epoch")
    ap.add_argument("--policy", default="shade")
    ap.add_argument("--sizes", default="5,10,20", help="cache sizes, %% of the distinct train bytes")
    ap.add_argument("--prefix", default="train/", help="replay only opens of paths under this prefix "
                    "(default train/, make demo's layout; '' = every open, e.g. a bench_plan.py trace)")
    ap.add_argument("--scores", help="importance per file (the trace's .scores.csv) for shade")
    a = ap.parse_args(argv)
    full = sim.read_trace(a.trace)
    live = live_hits(a.trace, a.prefix)
    paths = [full.paths[i] for i in full.ids.tolist()]
    keep = [p for p in paths if p.startswith(a.prefix)]
    sizes = [int(full.sizes[i]) for i, p in zip(full.ids.tolist(), paths) if p.startswith(a.prefix)]
    if not keep:
        raise SystemExit(f"error: no opens under {a.prefix!r} in {a.trace} (see --prefix)")
    t = sim.Trace.from_requests(keep, sizes)
    imp = sim.load_scores(a.scores, t) if a.scores else None
    print(f"{t.requests} train opens, {t.distinct_files} files, {a.epoch_len} per epoch; policy {a.policy}")
    print("cache %  policy alone  +epoch plans  +oracle lookahead  OPT     plans/OPT  oracle/OPT  "
          "lookahead gap")
    for pct in [float(x) for x in a.sizes.split(",")]:
        cap = int(t.distinct_bytes * pct / 100)
        alone = sim.simulate(t, a.policy, cap, imp).hits
        planned = epoch_plans(t, a.policy, cap, a.epoch_len, imp)
        oracle = epoch_plans(t, a.policy, cap, a.epoch_len, imp, lookahead=1)
        opt = sim.belady(t, cap).hits
        r = t.requests
        print(f"{pct:7g}  {alone / r:12.4f}  {planned / r:12.4f}  {oracle / r:17.4f}  {opt / r:.4f}"
              f"  {planned / opt if opt else float('nan'):9.4f}  {oracle / opt if opt else float('nan'):10.4f}"
              f"  {(oracle - planned) / r:.4f}")
    if live is not None:
        print(f"live (the recording daemon, at its own cache size): {live} of {t.requests} opens from a tier = "
              f"{live / t.requests:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
