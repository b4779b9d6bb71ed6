#!/usr/bin/env python3
"""Time to accuracy at full scale, composed from two measurements.

The rig (``python -m shadefs.bench tta``: the training set in S3 behind a latency proxy, a shadefs mount per run) gives
each mode's seconds per epoch: epoch 1 cold (``cold``), the mean of its later epochs warm (``warm``),
over every rig run of that mode. The in-memory runs (``python -m shadefs.bench shade_accuracy``: the same model, the
sampler alone, no storage) give the test accuracy per epoch of every seed. The accuracy after epoch k is
then placed at the composed wall time ``cold + (k - 1) * warm``, and the time to a target accuracy is
that of the first epoch that reached it, per seed of the in-memory runs.

A mode takes the accuracies of the in-memory configuration that trains on the same order of samples:
``shuffle`` and ``plan`` (both uniform permutations) that of ``uniform``, ``shade`` that of ``shade``
(ShadeSampler's defaults), ``shade-rep1`` that of ``shade:rep_factor=1``. The targets are ``--target``
and uniform's final mean accuracy (the in-memory ``uniform`` runs' last epoch, mean over seeds, rounded
to 0.01 as ``python -m shadefs.bench shade_accuracy`` reports it).

It also sets the rig's own test accuracy per epoch beside the in-memory one of the same seed: both
trained the same model on the same images, so they should be close; the difference is the order of
the samples (the rig's DataLoader and samplers draw their own) and nothing else.

    python scripts/compose_tta.py --rig docs/data/bench_tta_60k.json
        --memory docs/data/bench_shade_accuracy_60k.json [--target 85 --target 89] [--png tta_60k.png]
        [--json composed.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Dict, List, Optional

#: rig mode -> the in-memory configuration that trains on the same order of samples
MEMORY_CONFIG = {"shuffle": "uniform", "plan": "uniform", "shade": "shade", "shade-rep1": "shade:rep_factor=1"}
LABELS = {"shuffle": "shuffle=True + static", "plan": "PlanSampler + static", "shade": "ShadeSampler + shade",
          "shade-rep1": "ShadeSampler(rep_factor=1) + shade"}
COLORS = {"shuffle": "tab:blue", "plan": "tab:purple", "shade": "tab:green", "shade-rep1": "tab:olive"}


def rig_seconds(rig: dict) -> Dict[str, dict]:
    """Per mode of the rig's runs (in the order the runs were made): ``cold`` (epoch 1's seconds, mean
    over runs), ``warm`` (the mean of all later epochs' seconds over runs; None with one epoch only),
    ``epochs`` (the epochs measured, per run), ``seeds``."""
    out: Dict[str, dict] = {}
    for r in rig["runs"]:
        if not r["epochs"]:
            continue
        m = out.setdefault(r["mode"], {"first": [], "later": [], "epochs": [], "seeds": []})
        m["first"].append(r["epochs"][0]["epoch_time_s"])
        m["later"] += [e["epoch_time_s"] for e in r["epochs"][1:]]
        m["epochs"].append(len(r["epochs"]))
        m["seeds"].append(r["seed"])
    return {mode: {"cold": statistics.mean(m["first"]),
                   "warm": statistics.mean(m["later"]) if m["later"] else None,
                   "epochs": m["epochs"], "seeds": m["seeds"]} for mode, m in out.items()}


def memory_accuracy(memory: dict, config: str) -> Dict[int, List[float]]:
    """``{seed: [test accuracy % after epoch 1, 2, ...]}`` of the in-memory runs of ``config``."""
    return {r["seed"]: [e["test_acc"] for e in r["epochs"]] for r in memory["results"] if r["config"] == config}


def uniform_final(memory: dict) -> float:
    """The in-memory ``uniform`` runs' last-epoch accuracy, mean over seeds, rounded to 0.01."""
    return round(statistics.mean(accs[-1] for accs in memory_accuracy(memory, "uniform").values()), 2)


def wall_after(k: int, cold: float, warm: Optional[float]) -> float:
    """Composed wall seconds of the first ``k`` epochs: ``cold + (k - 1) * warm``."""
    if k == 1:
        return cold
    if warm is None:
        raise ValueError("epochs after the first need a warm rate")
    return cold + (k - 1) * warm


def time_to(accs: List[float], target: float, cold: float, warm: Optional[float]):
    """``(epoch, seconds)`` of the first epoch of ``accs`` with accuracy >= ``target``; None if none."""
    k = next((i + 1 for i, acc in enumerate(accs) if acc >= target), None)
    return None if k is None else (k, wall_after(k, cold, warm))


def compose(rig: dict, memory: dict, targets: List[float]) -> dict:
    """Per rig mode: its seconds, and per target (``targets`` then uniform's final) the epoch and the
    composed seconds per in-memory seed (None: not reached) and their mean over the seeds that reached it.

    Returns ``{"uniform_final", "targets", "modes": {mode: {"config", "cold", "warm", "epochs",
    "to": [{"target", "per_seed": {seed: (epoch, s) | None}, "mean_s", "reached", "seeds"}],
    "all_epochs", "all_epochs_s"}}}``: ``all_epochs_s`` is the composed time of all the in-memory epochs (None with one rig epoch).
    """
    ref = uniform_final(memory)
    all_targets = list(targets) + [ref]
    modes = {}
    for mode, sec in rig_seconds(rig).items():
        config = MEMORY_CONFIG[mode]
        curves = memory_accuracy(memory, config)
        to = []
        for t in all_targets:
            per_seed = {seed: time_to(accs, t, sec["cold"], sec["warm"]) for seed, accs in sorted(curves.items())}
            ok = [v[1] for v in per_seed.values() if v is not None]
            to.append({"target": t, "per_seed": per_seed, "mean_s": statistics.mean(ok) if ok else None,
                       "reached": len(ok), "seeds": len(per_seed)})
        n = min(len(accs) for accs in curves.values())
        modes[mode] = {"config": config, "cold": sec["cold"], "warm": sec["warm"], "epochs": sec["epochs"], "to": to,
                       "all_epochs": n,
                       "all_epochs_s": None if sec["warm"] is None else wall_after(n, sec["cold"], sec["warm"])}
    return {"uniform_final": ref, "targets": all_targets, "modes": modes}


def seed_check(rig: dict, memory: dict, seed: int = 0) -> Dict[str, List[tuple]]:
    """Per rig mode, its run of ``seed`` against the in-memory run of the same configuration and seed:
    ``[(epoch, rig accuracy, in-memory accuracy, rig - in-memory)]`` over the epochs both have."""
    out = {}
    for r in rig["runs"]:
        if r["seed"] != seed or not r["epochs"]:
            continue
        mem = memory_accuracy(memory, MEMORY_CONFIG[r["mode"]]).get(seed)
        if mem is None:
            continue
        out[r["mode"]] = [(i + 1, e["test_acc"], mem[i], e["test_acc"] - mem[i])
                          for i, e in enumerate(r["epochs"]) if i < len(mem)]
    return out


def _cell(entry: dict) -> str:
    if entry["mean_s"] is None:
        return f"not reached (0/{entry['seeds']})"
    per = " / ".join("-" if v is None else f"{v[1]:,.0f}" for v in entry["per_seed"].values())
    return f"{entry['mean_s']:,.0f} s, {entry['reached']}/{entry['seeds']} ({per})"


def report(result: dict, check: Dict[str, List[tuple]], seed: int) -> None:
    targets = result["targets"]
    print(f"composed seconds per epoch (epoch 1 cold; warm = mean of the rig's later epochs), and the composed "
          f"wall time to each accuracy: mean over the in-memory seeds that reached it, how many did, and per "
          f"seed (-: not reached); the last target is uniform's final mean, {result['uniform_final']:.2f} %")
    print("| mode | accuracies of | epochs measured | epoch 1 (cold) | later epochs (warm) | "
          + " | ".join(f"to {t:g} %" for t in targets) + " | all epochs |")
    print("|---" * (6 + len(targets)) + "|")
    for mode, m in result["modes"].items():
        warm = "-" if m["warm"] is None else f"{m['warm']:.1f} s"
        print(f"| {LABELS[mode]} | `{m['config']}` | {', '.join(map(str, m['epochs']))} | {m['cold']:.1f} s | {warm} | "
              + " | ".join(_cell(e) for e in m["to"])
              + (" | - |" if m["all_epochs_s"] is None else f" | {m['all_epochs_s']:,.0f} s ({m['all_epochs']}) |"))
    print(f"\nthe rig's test accuracy against the in-memory run's, seed {seed}, % (rig - in-memory, points)")
    print("| mode | epoch | rig | in memory | difference |")
    print("|---|---|---|---|---|")
    for mode, rows in check.items():
        for ep, rig_acc, mem_acc, d in rows:
            print(f"| {LABELS[mode]} | {ep} | {rig_acc:.2f} | {mem_acc:.2f} | {d:+.2f} |")


def plot(result: dict, memory: dict, rig: dict, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    for mode, m in result["modes"].items():
        curves = list(memory_accuracy(memory, m["config"]).values())
        n = min(len(c) for c in curves)
        if m["warm"] is None:
            n = 1
        xs = [wall_after(k, m["cold"], m["warm"]) / 60 for k in range(1, n + 1)]
        mean = [statistics.mean(c[i] for c in curves) for i in range(n)]
        ax.plot(xs, mean, marker="o", markersize=3, color=COLORS[mode], linewidth=1.2,
                label=f"{LABELS[mode]} (in-memory accuracy of {m['config']}, mean of {len(curves)} seeds)")
        ax.fill_between(xs, [min(c[i] for c in curves) for i in range(n)],
                        [max(c[i] for c in curves) for i in range(n)], color=COLORS[mode], alpha=0.12, linewidth=0)
        for r in rig["runs"]:
            if r["mode"] == mode and r["epochs"]:
                wall, pts = 0.0, []
                for e in r["epochs"]:
                    wall += e["epoch_time_s"]
                    pts.append((wall / 60, e["test_acc"]))
                ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle="none", marker="x", markersize=6,
                        color=COLORS[mode])
    for t in result["targets"]:
        ax.axhline(t, color="grey", linestyle=":", linewidth=1)
    seeds = sorted({r["seed"] for r in rig["runs"] if r["epochs"]})
    ax.plot([], [], linestyle="none", marker="x", color="black",
            label=f"the rig's own runs (seed {', '.join(map(str, seeds))}): measured time and accuracy")
    ax.set_xlabel("wall time of the training epochs over the rig, min (composed; evaluation excluded)")
    ax.set_ylabel("test accuracy, %")
    ax.set_xlim(left=0)
    ax.set_ylim(84, 91)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    s = rig.get("setup", {})
    ax.set_title(f"Fashion-MNIST, {s.get('train_images', 0):,} images in S3 (moto + {s.get('delay_ms', 0):g} ms proxy), "
                 f"RAM cache {s.get('pct', '?')}: epoch seconds measured on the rig,\n"
                 "accuracy per epoch measured in memory (min..max over seeds shaded)", fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rig", required=True, help="``shadefs.bench tta``'s JSON (the seconds per epoch)")
    ap.add_argument("--memory", required=True, help="``shadefs.bench shade_accuracy``'s JSON (the accuracy per epoch)")
    ap.add_argument("--target", type=float, action="append", help="test accuracy %% to reach; repeatable "
                    "(default 85 and 89); uniform's final mean is always added")
    ap.add_argument("--seed", type=int, default=0, help="the seed whose rig and in-memory accuracies are set "
                    "side by side (default %(default)s)")
    ap.add_argument("--png", help="draw accuracy against composed wall time here")
    ap.add_argument("--json", help="write the composition here")
    a = ap.parse_args(argv)
    with open(a.rig) as f:
        rig = json.load(f)
    with open(a.memory) as f:
        memory = json.load(f)
    result = compose(rig, memory, a.target or [85.0, 89.0])
    check = seed_check(rig, memory, a.seed)
    report(result, check, a.seed)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"composition": result, "seed_check": check}, f, indent=1)
    if a.png:
        plot(result, memory, rig, a.png)
        print(f"\npicture: {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
