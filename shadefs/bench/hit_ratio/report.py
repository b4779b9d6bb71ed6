"""The hit-ratio benchmark's report: the console table, the plots, the tables, goals and explanation
computed from the figures, and the section of docs/results/hit_ratio.md."""
from __future__ import annotations

import math
import os
from typing import Dict, List, Optional

import numpy as np

from shadefs.bench.hit_ratio.measure import ALL_MODES, POLICIES, SAMPLER_LABEL, SAMPLERS, find_run, ok, progress
from shadefs.bench.runner import ROOT
from shadefs.testing import docsection

DOC = os.path.join(ROOT, "docs", "results", "hit_ratio.md")
IMG_DIR = os.path.join(ROOT, "docs", "img")
START, END = docsection.markers("bench_hit_ratio")
GOAL_SIZE = 10.0          # percent: where SHADE's headline (x LRU) is checked
GOAL_OPT = 0.95           # shade >= 95 % of OPT
GOAL_LRU = 4.5            # shade >= 4.5x LRU
GOAL_ACC = 1.0            # importance within 1 point of uniform accuracy


def pct_s(x: Optional[float], digits: int = 2) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f} %"


def ratio_s(a: Optional[float], b: Optional[float], digits: int = 2) -> str:
    if a is None or b is None:
        return "–"
    if b <= 0:
        return "∞" if a > 0 else "–"
    return f"{a / b:.{digits}f}"


def lru_theory(f: float) -> float:
    """LRU hit ratio per epoch under uniform random permutations: f + (1 - f) ln(1 - f) (~ f^2 / 2)."""
    return f + (1 - f) * math.log(1 - f) if f < 1 else 1.0


def console_table(results: dict) -> str:
    lines = []
    E = results["meta"]["epochs"]
    head = (f"{'size':>5} {'sampler':<10} {'policy':<7} {'hit all':>8} {'hit warm':>9} {'OPT warm':>9} "
            f"{'/OPT':>5} {'xLRU':>6} {'replay':>8} {'acc':>6} {'epoch s':>8} {'run s':>6}")
    lines.append(head)
    for r in sorted(results["runs"], key=lambda r: (r["size_pct"], SAMPLERS.index(r["sampler"]),
                                                    POLICIES.index(r["policy"]) if r["policy"] in POLICIES
                                                    else 9, r["policy"])):
        if r.get("error"):
            lines.append(f"{r['size_pct']:>4g}% {r['sampler']:<10} {r['policy']:<7} ERROR {r['error']}")
            continue
        lru = find_run(results, r["sampler"], "lru", r["size_pct"])
        lines.append(
            f"{r['size_pct']:>4g}% {r['sampler']:<10} {r['policy']:<7} {pct_s(r['hit_ratio']):>8} "
            f"{pct_s(r['hit_ratio_warm']):>9} {pct_s(r['opt_hit_ratio_warm']):>9} "
            f"{ratio_s(r['hit_ratio_warm'], r['opt_hit_ratio_warm']):>5} "
            f"{ratio_s(r['hit_ratio_warm'], lru['hit_ratio_warm'] if ok(lru) else None, 1):>6} "
            f"{pct_s(r['replay_hit_ratio_warm']):>8} {r['test_acc']:>5.2f}% {r['mean_epoch_time_s']:>8.1f} "
            f"{r['run_time_s']:>6.0f}")
    lines.append(f"(hit ratios over all {E} epochs and over the warm {warm(E)}; replay = the run's policy replayed on "
                 f"its trace by shadefs.sim)")
    return "\n".join(lines)


# -- the doc section and the plots ---------------------------------------------------------------------
def warm(E: int) -> str:
    """The warm window's name: 'epoch 2' or 'epochs 2..E'."""
    return "epoch 2" if E == 2 else f"epochs 2..{E}"


def plot_sampler(results: dict, sampler: str, path: str) -> bool:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    E = results["meta"]["epochs"]
    runs = [r for r in results["runs"] if r["sampler"] == sampler and ok(r)]
    if not runs:
        return False
    fig = Figure(figsize=(6.6, 4.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    style = {"lru": ("tab:red", "o", 7), "static": ("tab:blue", "s", 9), "shade": ("tab:green", "o", 5),
             "fifo": ("tab:orange", "^", 6)}
    sizes = sorted({r["size_pct"] for r in runs})
    opt_by_size: Dict[float, List[float]] = {}
    policies = [p for p in POLICIES if any(r["policy"] == p for r in runs)]
    policies += sorted({r["policy"] for r in runs} - set(policies))
    for p in policies:
        color, marker, ms = style.get(p, (None, "o", 6))
        pts = sorted((r["size_pct"], 100 * r["hit_ratio_warm"], 100 * r["opt_hit_ratio_warm"])
                     for r in runs if r["policy"] == p)
        for x, _, o in pts:
            opt_by_size.setdefault(x, []).append(o)
        ax.plot([q[0] for q in pts], [q[1] for q in pts], marker=marker, markersize=ms, color=color, label=p)
    spread = max((max(v) - min(v) for v in opt_by_size.values()), default=0.0)
    if spread < 0.25:  # the runs' traces give the same OPT: one line
        xs = sorted(opt_by_size)
        ax.plot(xs, [float(np.mean(opt_by_size[x])) for x in xs], "k--", marker="x",
                label="OPT (same traces)")
    else:
        for p in policies:
            pts = sorted((r["size_pct"], 100 * r["opt_hit_ratio_warm"]) for r in runs if r["policy"] == p)
            ax.plot([q[0] for q in pts], [q[1] for q in pts], linestyle="--", marker="x",
                    color=style.get(p, (None,))[0], alpha=0.8, label=f"OPT on {p}'s trace")
    if sampler == "uniform":
        xs = np.linspace(0, max(sizes), 100)
        ax.plot(xs, xs, color="grey", linestyle=":", label="theory: f")
        ax.plot(xs, [100 * lru_theory(x / 100) for x in xs], color="grey", linestyle="-.",
                label="theory LRU: f + (1-f) ln(1-f) ≈ f²/2")
    else:
        base = sorted((r["size_pct"], 100 * r["hit_ratio_warm"]) for r in results["runs"]
                      if ok(r) and r["sampler"] == "uniform" and r["policy"] == "lru")
        if base:
            ax.plot([q[0] for q in base], [q[1] for q in base], color="grey", linestyle=":", marker=".",
                    label="uniform sampler + lru (baseline)")
    ax.set_xlabel("RAM cache (% of the training set's bytes)")
    ax.set_ylabel(f"hit ratio, {warm(E)} (%)")
    m = results["meta"]
    ax.set_title(f"{SAMPLER_LABEL[sampler]}: Fashion-MNIST, {m['n_train']} images, {E} epochs", fontsize=10)
    ax.set_xlim(0, max(sizes) * 1.05)
    ax.set_ylim(bottom=0)
    ax.set_xticks(sizes)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    return True


def size_table(results: dict, pct: float) -> List[str]:
    E = results["meta"]["epochs"]
    w = warm(E)
    out = [f"| sampler | policy | hit ratio (all {E} epochs) | hit ratio ({w}) | OPT, same trace ({w}) | "
           f"÷ OPT | × LRU (same sampler) | × uniform LRU | hit ratio per epoch | test acc | mean epoch time |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = find_run(results, "uniform", "lru", pct)
    for s, p in ALL_MODES + sorted({(r["sampler"], r["policy"]) for r in results["runs"]} - set(ALL_MODES)):
        r = find_run(results, s, p, pct)
        if r is None:
            continue
        if not ok(r):
            out.append(f"| {s} | `{p}` | failed: {r.get('error') or 'no result'} |  |  |  |  |  |  |  |  |")
            continue
        lru = find_run(results, s, "lru", pct)
        per = " / ".join(f"{100 * e['hit_ratio']:.1f}" for e in r["measured_epochs"])
        out.append(
            f"| {s} | `{p}` | {pct_s(r['hit_ratio'])} | **{pct_s(r['hit_ratio_warm'])}** | "
            f"{pct_s(r['opt_hit_ratio_warm'])} | {ratio_s(r['hit_ratio_warm'], r['opt_hit_ratio_warm'])} | "
            f"{ratio_s(r['hit_ratio_warm'], lru['hit_ratio_warm'] if ok(lru) else None, 1)} | "
            f"{ratio_s(r['hit_ratio_warm'], base['hit_ratio_warm'] if ok(base) else None, 1)} | "
            f"{per} % | {r['test_acc']:.2f} % | {r['mean_epoch_time_s']:.1f} s |")
    return out


def phase_table(results: dict) -> List[str]:
    """ShadeSampler runs: the warm opens split into first reads of a file in its epoch and repeats."""
    E = results["meta"]["epochs"]
    runs = sorted((r for r in results["runs"] if ok(r) and r["sampler"] == "importance" and r.get("phases")),
                  key=lambda r: (r["size_pct"], POLICIES.index(r["policy"]) if r["policy"] in POLICIES else 9))
    if not runs:
        return []
    out = [f"Where the ShadeSampler hits come from ({warm(E)}): each open is either the first read of a file "
           f"in its epoch or a repeat of a file already read in that epoch (draws with replacement, and the "
           f"`rep_factor` repeats of resident draws). Hit ratio measured / OPT on the same trace; the last "
           f"column is the measured hit ratio per tenth of epoch {E}, in order.", "",
           "| cache | policy | first reads: share | hit ratio | OPT | repeats: share | hit ratio | OPT | "
           f"hit ratio by tenth of epoch {E} (%) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        f, rep = r["phases"]["first"], r["phases"]["repeat"]
        n = f["opens"] + rep["opens"]
        prof = " ".join("–" if v is None else f"{100 * v:.0f}" for v in r["profile"]["measured"])
        out.append(
            f"| {r['size_pct']:g} % | `{r['policy']}` | {pct_s(f['opens'] / n, 0)} | "
            f"{pct_s(f['hits'] / f['opens'] if f['opens'] else None, 1)} | "
            f"{pct_s(f['opt_hits'] / f['opens'] if f['opens'] else None, 1)} | {pct_s(rep['opens'] / n, 0)} | "
            f"{pct_s(rep['hits'] / rep['opens'] if rep['opens'] else None, 1)} | "
            f"{pct_s(rep['opt_hits'] / rep['opens'] if rep['opens'] else None, 1)} | {prof} |")
    return out + [""]


def crosscheck_line(results: dict) -> str:
    """Daemon vs simulator: the run's own policy replayed on its trace by shadefs.sim."""
    E = results["meta"]["epochs"]
    plain = [r for r in results["runs"] if ok(r) and r.get("replay_hit_ratio_warm") is not None
             and not r.get("replay_scores")]
    scored = [r for r in results["runs"] if ok(r) and r.get("replay_hit_ratio_warm") is not None
              and r.get("replay_scores") and r["sampler"] == "importance"]
    if not plain and not scored:
        return ""
    txt = "Cross-check, daemon vs simulator: each trace replayed through the run's own policy by `shadefs.sim`"
    if plain:
        d = max(abs(r["replay_hit_ratio_warm"] - r["hit_ratio_warm"]) for r in plain)
        txt += (f" gives the measured {warm(E)} hit ratio within {100 * d:.2f} points for every run without "
                f"importance scores ({len(plain)} runs)")
    if scored:
        txt += ("; for ShadeSampler + `shade` it cannot: the replay has only the final importance snapshot "
                "(`TRACE.scores.csv`), not the scores as they arrived, and the sampler's trace was shaped by "
                "the live cache (" + ", ".join(f"{r['size_pct']:g} %: replay {pct_s(r['replay_hit_ratio_warm'], 1)}"
                                               f" vs measured {pct_s(r['hit_ratio_warm'], 1)}" for r in scored) + ")")
    return txt + "."


def theory_line(results: dict, pct: float) -> str:
    E = results["meta"]["epochs"]
    f = pct / 100
    st = find_run(results, "uniform", "static", pct)
    lr = find_run(results, "uniform", "lru", pct)
    got = ""
    if ok(st) or ok(lr):
        parts = []
        if ok(st):
            parts.append(f"`static` {pct_s(st['hit_ratio_warm'])}")
        if ok(lr):
            parts.append(f"`lru` {pct_s(lr['hit_ratio_warm'])}")
        got = " Measured: " + ", ".join(parts) + "."
    return (f"Theory, uniform sampling at f = {pct:g} %: `static` = OPT = f = {100 * f:.2f} % per epoch "
            f"from epoch 2 on; `lru` ≈ f²/2 = {100 * f * f / 2:.2f} % (exactly f + (1−f) ln(1−f) = "
            f"{100 * lru_theory(f):.2f} %). Over all {E} epochs multiply by {E - 1}/{E}.{got}")


def goals(results: dict) -> List[str]:
    E = results["meta"]["epochs"]
    sizes = sorted({r["size_pct"] for r in results["runs"]})
    out = []
    # 1. shade within 5 % of OPT, both samplers
    for s in SAMPLERS:
        vals = []
        for pct in sizes:
            r = find_run(results, s, "shade", pct)
            if ok(r) and r["opt_hit_ratio_warm"]:
                vals.append((pct, r["hit_ratio_warm"] / r["opt_hit_ratio_warm"]))
        if not vals:
            continue
        met = all(v >= GOAL_OPT for _, v in vals)
        txt = ", ".join(f"{pct:g} %: {v:.2f}" for pct, v in vals)
        out.append(f"- **`shade` within 5 % of OPT, {SAMPLER_LABEL[s]}** (hit ratio ÷ OPT, {warm(E)}): "
                   f"{txt}. **{'Met' if met else 'Not met'}**.")
    # 2. 4.5x LRU at 10 %
    r = find_run(results, "importance", "shade", GOAL_SIZE)
    base = find_run(results, "uniform", "lru", GOAL_SIZE)
    same = find_run(results, "importance", "lru", GOAL_SIZE)
    if ok(r) and (ok(base) or ok(same)):
        parts, verdict = [], {}
        for key, label, b in (("base", "uniform sampler + `lru` (PyTorch's default loader on an LRU cache)", base),
                              ("same", "ShadeSampler + `lru`", same)):
            if ok(b):
                x = r["hit_ratio_warm"] / b["hit_ratio_warm"] if b["hit_ratio_warm"] > 0 else math.inf
                parts.append(f"{x:.1f}x {label}")
                verdict[key] = x >= GOAL_LRU
        if all(verdict.values()):
            v = "Met"
        elif verdict.get("base"):
            v = "Met against the uniform + `lru` baseline; not against `lru` under the same sampler"
        else:
            v = "Not met"
        out.append(f"- **ShadeSampler + `shade` ≥ {GOAL_LRU}x LRU at {GOAL_SIZE:g} %** ({warm(E)}): "
                   f"{pct_s(r['hit_ratio_warm'])}, i.e. " + "; ".join(parts) + f". **{v}**.")
    elif GOAL_SIZE not in sizes:
        out.append(f"- ≥ {GOAL_LRU}x LRU at {GOAL_SIZE:g} %: not measured (no {GOAL_SIZE:g} % run).")
    # 3. accuracy
    diffs = []
    for pct in sizes:
        for p in POLICIES:
            u, i = find_run(results, "uniform", p, pct), find_run(results, "importance", p, pct)
            if ok(u) and ok(i):
                diffs.append((pct, p, i["test_acc"] - u["test_acc"]))
    if diffs:
        worst = min(diffs, key=lambda d: d[2])
        mu = np.mean([r["test_acc"] for r in results["runs"] if ok(r) and r["sampler"] == "uniform"])
        mi = np.mean([r["test_acc"] for r in results["runs"] if ok(r) and r["sampler"] == "importance"])
        out.append(f"- **Test accuracy, ShadeSampler within {GOAL_ACC:g} point of uniform** (after {E} epochs, "
                   f"same policy and size): mean {mi:.2f} % vs {mu:.2f} %; worst difference {worst[2]:+.2f} "
                   f"points (`{worst[1]}` at {worst[0]:g} %). "
                   f"**{'Met' if all(d[2] >= -GOAL_ACC for d in diffs) else 'Not met'}**.")
    return out


def explanation(results: dict) -> List[str]:
    """The plain-words reading of the numbers; the parts that depend on the outcome are computed."""
    E = results["meta"]["epochs"]
    L = ["How to read the numbers, and why they come out this way:", "",
         "- **Uniform sampling.** Every image is read exactly once per epoch, in a fresh random order. From "
         "the second epoch on no cache can hit more than the fraction f of the dataset it holds: `static` "
         "(admit until full, never evict) reaches f and OPT does no better. `lru` evicts each file long before "
         "its next use (a whole epoch later, at a random position) and keeps only about f²/2. With no hook, no "
         "score ever reaches the daemon, every file weighs 1.0, and `shade` makes exactly the decisions of "
         "`static` (they differ by a few hits only because two DataLoader workers interleave their opens a "
         "little differently from run to run). Cache sizes are bytes and the files differ in size (160-880 B), "
         "so `static` holds about f of the *files*, and OPT (size-blind Belady, docs/simulator.md) lands "
         "slightly above or below f. Same seed, same sample order: the uniform runs train identically.",
         "- **ShadeSampler.** Each epoch draws N indices with replacement, weighted by importance (loss rank), "
         "and plays the draws that were resident at the epoch's start `rep_factor` = 3 times, first; the draws "
         "that were not resident follow, shuffled (at least 10 % of the epoch, `min_miss_fraction`). The hit "
         "ratio therefore exceeds f with *every* policy, `lru` and `static` included: the sampler produces the "
         "gain, and its residency query makes each policy's own cache content the thing that gets repeated. "
         "The policies differ only in what they keep for the next epoch and in whether they catch the repeats "
         "among the non-resident draws later in the same epoch. The per-tenth profile shows the shape: the "
         "opening part of a warm epoch hits 100 % with every policy, the rest far less."]
    gaps = []
    for r in sorted(results["runs"], key=lambda r: r["size_pct"]):
        if ok(r) and r["sampler"] == "importance" and r["policy"] == "shade" and r.get("phases") \
                and r["opt_hit_ratio_warm"] and r["hit_ratio_warm"] / r["opt_hit_ratio_warm"] < GOAL_OPT:
            ph = r["phases"]
            n = ph["first"]["opens"] + ph["repeat"]["opens"]
            gaps.append((r["size_pct"], 100 * (r["opt_hit_ratio_warm"] - r["hit_ratio_warm"]),
                         100 * (ph["repeat"]["opt_hits"] - ph["repeat"]["hits"]) / n,
                         100 * (ph["first"]["opt_hits"] - ph["first"]["hits"]) / n))
    if gaps:
        nums = "; ".join(f"{pct:g} %: {g:.1f} points, of which {rep:.1f} on repeats and {fst:.1f} on first reads"
                         for pct, g, rep, fst in gaps)
        L.append(
            "- **Why `shade` stays below OPT with ShadeSampler.** The gap has two parts (split with the table "
            f"above, {warm(E)}: {nums}). *Repeats:* once the opening part of an epoch has played the residents' "
            "repeats, those residents are not needed again in that epoch; but they were just scored, and `shade` "
            "admits a newcomer only if it outranks the least important resident (a never-scored file, weight "
            "1.0, never does), so it keeps the spent residents and turns away most of the files that the "
            "with-replacement draw reads again later in the same epoch. OPT sees those repeats coming, evicts "
            "the spent residents and catches them (compare the three policies' repeats columns: `lru` admits "
            "every miss, `static` nothing once full). An online policy could catch these. *First reads:* the "
            "sampler puts a draw "
            "in the miss part of an epoch precisely because the live cache did not hold it at the epoch's "
            "start, so no online cache can hit its first read; OPT, replaying the fixed trace, held those files "
            "instead of ones needed later or never. This part is out of reach for any policy behind a "
            "cache-aware sampler, and it dominates at large caches, where every policy sits at the sampler's "
            "cap (1 − `min_miss_fraction` = 90 % of an epoch planned as hits).")
    L += ["- **OPT** replays the run's whole trace knowing the future; its hits are counted in the warm epochs "
          "so that it compares with the measured warm hit ratio. With ShadeSampler the trace itself depends "
          "on the cache (the sampler repeats what was resident), so OPT on the same trace is a reference for "
          "that trace, not a bound on what another cache would have produced.",
          "- The first epoch is cold for every run: all misses under uniform sampling; with ShadeSampler it is "
          "a uniform draw with replacement (all weights 1.0), so only repeats of cached draws hit."]
    return L


def render_section(results: dict, imgs: Dict[str, bool]) -> str:
    m = results["meta"]
    E = m["epochs"]
    w = warm(E)
    subset = "a fixed subset: the first files of each class"
    sizes = sorted({r["size_pct"] for r in results["runs"]})
    L = [START, "## Hit ratio", "",
         "Real training through the mount, from a cold cache: `python -m shadefs.bench hit_ratio` trains the small CNN "
         "of `scripts/train_fashion_mnist.py` on Fashion-MNIST (CPU) with the training split mounted through "
         "shadefs (RAM tier only, no disk tier) and measures the hit ratio (`shadefs stats`; per epoch from "
         "the `--trace` file) against Belady's OPT replayed on the same recorded trace at the same cache "
         "bytes (`shadefs.sim`). Samplers: `uniform` = the unmodified `DataLoader(shuffle=True)` "
         "(transparent mode); `importance` = `--hook`, ShadeSampler (SHADE's PADS, cache-aware) + "
         "ScoreReporter sending per-sample losses to the daemon.", "",
         f"Setup: {m['n_train']} training images ({m['train_bytes'] / 1e6:.1f} MB; "
         f"{'the full training split' if m.get('train_limit') is None else subset}), "
         f"{E} epochs, batch {m['batch_size']}, {m['workers']} DataLoader workers, seed {m['seed']}, test accuracy "
         f"on the full {m.get('n_test', 10000)}-image test split read directly (not through the mount). "
         f"Cache sizes are percentages of the mounted training bytes. {m['cpus']} CPUs, {m['platform']}, "
         f"commit `{m.get('commit') or '?'}`, {m['date']}."
         + (" **Quick run (`--quick`): a smoke test, not the reference numbers.**" if m.get("quick") else ""),
         "", f"Reproduce: `{m['command']}`", "",
         f"Columns: hit ratio = hits / opens (a hit = an open served from the RAM tier); {w} leaves out the "
         f"cold first epoch; OPT = Belady's MIN with bypass replayed on this run's own whole trace, its hits "
         f"counted in {w}; ÷ OPT and × LRU compare the {w} hit ratios (× uniform LRU: against the uniform "
         f"sampler with `lru` at the same size, i.e. PyTorch's default loader on an LRU cache); test acc after "
         f"epoch {E}; epoch time = mean training time per epoch without evaluation (a shared 2-core machine: "
         f"only roughly comparable).", ""]
    for pct in sizes:
        L += [f"### Cache = {pct:g} % of the training set", ""]
        L += size_table(results, pct)
        L += ["", theory_line(results, pct), ""]
    if imgs.get("uniform") or imgs.get("importance"):
        L += [f"Hit ratio ({w}) vs cache size; dashed: OPT on the same traces.", ""]
        if imgs.get("uniform"):
            L += ["![hit ratio, uniform sampler](../img/hit_ratio_uniform.png)", ""]
        if imgs.get("importance"):
            L += ["![hit ratio, ShadeSampler](../img/hit_ratio_importance.png)", ""]
    L += phase_table(results)
    L += ["### Goals", ""] + goals(results) + [""]
    if results.get("notes"):
        L += [results["notes"].rstrip(), ""]
    L += explanation(results) + [""]
    cc = crosscheck_line(results)
    if cc:
        L += [cc, ""]
    failed = [r for r in results["runs"] if r.get("error")]
    if failed:
        L += ["Failed runs: " + "; ".join(f"{r['tag']}: {r['error']}" for r in failed) + ".", ""]
    warned = [(r["tag"], x) for r in results["runs"] for x in r.get("warnings", [])]
    if warned:
        L += ["Warnings: " + "; ".join(f"{t}: {x}" for t, x in warned) + ".", ""]
    L.append(END)
    return "\n".join(L) + "\n"


def write_outputs(results: dict, doc: str, img_dir: str) -> None:
    imgs = {}
    for s in SAMPLERS[:2]:
        p = os.path.join(img_dir, f"hit_ratio_{s}.png")
        try:
            imgs[s] = plot_sampler(results, s, p)
        except ImportError as e:
            progress(f"no plots: {e}")
            imgs[s] = False
        if imgs[s]:
            progress(f"wrote {p}")
    docsection.write_section(doc, "bench_hit_ratio", render_section(results, imgs))
    progress(f"wrote the '## Hit ratio' section of {doc}")
