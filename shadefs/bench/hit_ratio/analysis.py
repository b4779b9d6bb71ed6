"""The hit-ratio benchmark's trace analysis: the measured hits per epoch, Belady's OPT and the run's own
policy replayed on the same trace (:mod:`shadefs.sim`), and where the warm hits come from."""
from __future__ import annotations

import csv
import os
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

from shadefs import sim

HIT_OUTCOMES = ("ram", "disk", "shared")   # trace outcomes served by a tier; "prefetch" / "late" are backend reads


def read_outcomes(path: str, counts: Optional[Dict[str, int]] = None) -> np.ndarray:
    """Per open: True when the daemon served it from a cache tier (``outcome`` ram, disk or shared).

    ``prefetch`` (a completed prefetch) and ``late`` (waited on one) are not hits: the file came from
    the backend, as the stats JSON counts them (``prefetch.ready`` / ``prefetch.late``, not ``hits``), and as
    OPT counts them (a miss). ``counts``, if given, receives the number of opens per outcome.
    """
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
        reader = csv.reader(f)
        header = next(reader)
        col = header.index("outcome")
        outcomes = [row[col] for row in reader if row]
    if counts is not None:
        for o in outcomes:
            counts[o] = counts.get(o, 0) + 1
    return np.array([o in HIT_OUTCOMES for o in outcomes], dtype=bool)


def per_epoch(mask: np.ndarray, n_train: int, epochs: int) -> List[dict]:
    """Hits and opens per epoch; epoch k = opens [k*N, (k+1)*N) (the last takes any remainder)."""
    out = []
    for k in range(epochs):
        a = k * n_train
        b = (k + 1) * n_train if k < epochs - 1 else len(mask)
        seg = mask[a:b]
        out.append({"epoch": k + 1, "opens": int(seg.size), "hits": int(seg.sum()),
                    "hit_ratio": float(seg.mean()) if seg.size else 0.0})
    return out


def phases(ids: np.ndarray, measured: np.ndarray, opt: np.ndarray, n_train: int, epochs: int
           ) -> Tuple[dict, dict]:
    """Where the warm hits come from, over epochs 2..E.

    Splits each warm epoch's opens into the first read of a file in that epoch and the repeats of a file
    already read earlier in the same epoch (only ShadeSampler repeats: it draws with replacement and
    plays resident draws ``rep_factor`` times), with measured and OPT hits for each. Also returns the
    hit ratio per tenth of the last epoch (measured, OPT): PADS puts the resident draws first.
    """
    out = {k: {"opens": 0, "hits": 0, "opt_hits": 0} for k in ("first", "repeat")}
    for k in range(1, epochs):
        a, b = k * n_train, min((k + 1) * n_train if k < epochs - 1 else len(ids), len(ids))
        if b <= a:
            continue
        seg = ids[a:b]
        first = np.zeros(seg.size, dtype=bool)
        first[np.unique(seg, return_index=True)[1]] = True
        for name, sel in (("first", first), ("repeat", ~first)):
            out[name]["opens"] += int(sel.sum())
            out[name]["hits"] += int(measured[a:b][sel].sum())
            out[name]["opt_hits"] += int(opt[a:b][sel].sum())
    a = (epochs - 1) * n_train
    prof = {"measured": [], "opt": []}
    if len(ids) > a:
        for part_m, part_o in zip(np.array_split(measured[a:], 10), np.array_split(opt[a:], 10)):
            prof["measured"].append(float(part_m.mean()) if part_m.size else None)
            prof["opt"].append(float(part_o.mean()) if part_o.size else None)
    return out, prof


def warm_ratio(epochs: List[dict]) -> Optional[float]:
    """Hit ratio over epochs 2..E (None with a single epoch)."""
    w = epochs[1:]
    opens = sum(e["opens"] for e in w)
    return sum(e["hits"] for e in w) / opens if opens else None


def analyse(run: dict, trace_path: str, cache_bytes: int, n_train: int, epochs: int) -> None:
    """Fill ``run`` with the measured per-epoch hits, OPT on the same trace, and the policy's replay."""
    trace = sim.read_trace(trace_path)
    run["outcomes"] = {}
    measured = read_outcomes(trace_path, run["outcomes"])
    if measured.size != trace.requests:
        raise RuntimeError(f"{trace_path}: {measured.size} outcomes but {trace.requests} requests")
    run["trace_opens"] = trace.requests
    run["distinct_files"] = trace.distinct_files
    run["distinct_bytes"] = trace.distinct_bytes
    if trace.requests != n_train * epochs:
        run.setdefault("warnings", []).append(
            f"trace has {trace.requests} opens, expected {epochs} x {n_train}; epochs split at multiples of "
            f"{n_train}")
    run["measured_epochs"] = per_epoch(measured, n_train, epochs)
    run["hit_ratio_trace"] = float(measured.mean())
    run["hit_ratio_warm"] = warm_ratio(run["measured_epochs"])

    t = time.monotonic()
    mask = np.zeros(trace.requests, dtype=bool)
    ref = sim.belady(trace, cache_bytes, hit_mask=mask)
    run["opt_epochs"] = per_epoch(mask, n_train, epochs)
    run["phases"], run["profile"] = phases(trace.ids, measured, mask, n_train, epochs)
    run["opt_hit_ratio"] = ref.hit_ratio
    run["opt_hit_ratio_warm"] = warm_ratio(run["opt_epochs"])
    run["opt_time_s"] = time.monotonic() - t

    # the run's own policy replayed on the same trace (sequential; final importance snapshot for shade)
    scores = None
    scores_path = trace_path + ".scores.csv"
    if run["policy"] == "shade" and os.path.exists(scores_path):
        scores = sim.load_scores(scores_path, trace)
    full = sim.simulate(trace, run["policy"], cache_bytes, scores)
    first = sim.Trace(ids=trace.ids[:n_train], sizes=trace.sizes, paths=trace.paths)
    cold = sim.simulate(first, run["policy"], cache_bytes, scores)
    warm_opens = trace.requests - min(n_train, trace.requests)
    run["replay_hit_ratio"] = full.hit_ratio
    run["replay_hit_ratio_warm"] = (full.hits - cold.hits) / warm_opens if warm_opens else None
    run["replay_scores"] = scores is not None
