"""The read benchmark's experiments: the mount cases and their options, the interleaved timed passes of
every case of one file size, the in-process costs, the slow-backend and the hung-backend experiments."""
from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import time
from typing import Dict, List, Optional, Sequence, Tuple

from shadefs.bench.read.rig import (BenchError, Mounts, READ_CHUNK, ReaderPool, count_requests, drop_pages,
                                    make_dataset, progress, shadefs_stats, verify_sample)
from shadefs.testing import proc_cpu_s

CASES = [
    # key, label, tier, front end ("kernel", "kernel-nopt": --no-passthrough, or a libfuse loop), kernel cache, trace
    ("ram-kernel", "RAM hit, kernel", "ram", "kernel", True, False),
    ("ram-kernel-nokc", "RAM hit, kernel, no kernel cache", "ram", "kernel", False, False),
    ("ram-multi", "RAM hit, libfuse multi", "ram", "multi", True, False),
    ("ram-single", "RAM hit, libfuse single", "ram", "single", True, False),
    ("ram-multi-nokc", "RAM hit, libfuse multi, no kernel cache", "ram", "multi", False, False),
    ("ram-single-nokc", "RAM hit, libfuse single, no kernel cache", "ram", "single", False, False),
    ("ram-multi-trace", "RAM hit, libfuse multi, --trace", "ram", "multi", True, True),
    ("ram-single-trace", "RAM hit, libfuse single, --trace", "ram", "single", True, True),
    ("nvme-kernel", "NVMe hit, kernel, passthrough, --verify-entries first-hit", "nvme", "kernel-first", True,
     False),
    ("nvme-kernel-nopt", "NVMe hit, kernel, no passthrough, --verify-entries first-hit", "nvme", "kernel-nopt", True,
     False),
    ("nvme-kernel-every", "NVMe hit, kernel, passthrough, --verify-entries every-open", "nvme", "kernel-every", True,
     False),
    ("nvme-multi", "NVMe hit, libfuse multi", "nvme", "multi", True, False),
    ("nvme-single", "NVMe hit, libfuse single", "nvme", "single", True, False),
    ("miss-kernel", "miss, kernel", "miss", "kernel", True, False),
    ("miss-kernel-ram", "miss admitted to RAM, kernel", "miss-ram", "kernel", True, False),
    ("ram-kernel-r4", "RAM hit, kernel, --fuse-readers 4", "ram", "kernel-r4", True, False),
    ("miss-multi", "miss, libfuse multi", "miss", "multi", True, False),
    ("miss-single", "miss, libfuse single", "miss", "single", True, False),
]
#: the cases of the default run (the targets: the default front end against libfuse's loops)
DEFAULT_CASES = ["ram-kernel", "ram-kernel-r4", "ram-multi", "nvme-kernel", "nvme-kernel-every", "nvme-kernel-nopt",
                 "miss-kernel", "miss-kernel-ram", "miss-multi"]
LABELS = {"direct": "direct (page cache)", **{c[0]: c[1] for c in CASES}}
BASELINE_ENV: Dict[str, str] = {}   # case key -> PYTHONPATH of a baseline revision's package (--baseline)

#: the cases whose FUSE requests per open are counted with strace (``--count-requests``)
COUNT_CASES = ("ram-kernel", "nvme-kernel", "nvme-kernel-every", "nvme-kernel-nopt", "miss-kernel", "miss-kernel-ram", "ram-multi", "ram-multi-nokc",
               "nvme-multi", "miss-multi")

#: the front ends of the slow-backend experiment
SLOW_LOOPS = ("kernel", "multi", "single")


def add_baseline_cases(keys: Sequence[str], package_dir: str, rev: str) -> List[str]:
    """``--baseline``: a copy of each case in ``keys`` (key ``KEY-base``) whose daemon runs the package in
    ``package_dir`` (git revision ``rev``); returns the new keys."""
    new = []
    for c in [c for c in CASES if c[0] in keys]:
        key = c[0] + "-base"
        CASES.append((key, f"{c[1]} [baseline {rev}]") + tuple(c[2:]))
        LABELS[key] = CASES[-1][1]
        BASELINE_ENV[key] = package_dir
        new.append(key)
    return new


def frontend_options(loop: str) -> List[str]:
    """CLI flags of a front end: ``kernel``, ``kernel-nopt`` (no passthrough) or a libfuse loop."""
    if loop == "kernel":
        return ["--fuse-impl", "kernel"]
    if loop == "kernel-nopt":
        return ["--fuse-impl", "kernel", "--no-passthrough", "--verify-entries", "first-hit"]
    if loop == "kernel-r4":
        return ["--fuse-impl", "kernel", "--fuse-readers", "4"]
    if loop == "kernel-every":
        return ["--fuse-impl", "kernel", "--verify-entries", "every-open"]   # the default, said explicitly
    if loop == "kernel-first":
        return ["--fuse-impl", "kernel", "--verify-entries", "first-hit"]
    return ["--fuse-impl", "libfuse", "--fuse-loop", loop]


def mount_options(tier: str, loop: str, kernel_cache: bool, trace: Optional[str], cache_dir: str,
                  ram_bytes: int = 0) -> List[str]:
    """``miss-ram``: misses that are admitted: an LRU RAM tier of 1/32 of the files' bytes, read in a cycle
    larger than it (every open a miss that fills RAM and evicts a victim; readers running at different
    speeds may re-open a file while it is still resident: at most 2 % hits are accepted)."""
    if tier == "miss-ram":
        return frontend_options(loop) + ["--policy", "lru", "--ram-cache", str(max(1, ram_bytes // 32))]
    opts = frontend_options(loop) + ["--policy", "static"]
    if tier == "ram":
        opts += ["--ram-cache", "100%"]
    elif tier == "nvme":
        # twice the files' bytes (``ram_bytes``) and 64 MiB: the tier's budget counts device bytes (blocks,
        # record headers) and keeps a slack for packed segments, so 100 % of the files' bytes does not hold
        # every file, and an open of one left out is a miss
        opts += ["--ram-cache", "0", "--disk-cache", cache_dir, "--disk-cache-size", str(2 * ram_bytes + (64 << 20))]
    else:  # the daemon's miss path: a file no tier admits would be re-read from the kernel's pages
        opts += ["--ram-cache", "0"]
        kernel_cache = False
    if not kernel_cache:
        opts.append("--no-kernel-cache")
    if trace:
        opts += ["--trace", trace, "--trace-overwrite"]
    return opts


def interleaved_passes(pool: ReaderPool, targets: Dict[str, str], files, readers_list: List[int], repeat: int,
                       min_pass_s: float, pids: Optional[Dict[str, int]] = None
                       ) -> Tuple[Dict[str, dict], Dict[str, int]]:
    """Time every target (key -> root directory) round-robin: for each reader count, one calibration pass per
    target (a target whose pass is shorter than ``min_pass_s`` reads its files several times per timed pass),
    then ``repeat`` rounds, each one pass of every target in a rotating order. Load that comes and goes
    (a shared machine) then hits every case alike, and the comparisons between rows stay meaningful.

    With ``pids`` (key -> daemon pid), also the daemon's CPU time per open (``cpu_us``, median of the passes).

    Returns ({key: {readers: {files_s, mb_s, runs, loops, cpu_us}}}, {key: opens made}).
    """
    pids = pids or {}
    keys = list(targets)
    out: Dict[str, dict] = {k: {} for k in keys}
    opens = {k: 0 for k in keys}
    for readers in readers_list:
        loops, runs = {}, {k: [] for k in keys}
        for k in keys:
            first = pool.run(targets[k], files, readers)
            opens[k] += first["opens"]
            loops[k] = 1 if first["wall_s"] >= min_pass_s else \
                min(100, int(min_pass_s / max(first["wall_s"], 1e-3)) + 1)
        for rnd in range(repeat):
            for k in keys[rnd % len(keys):] + keys[:rnd % len(keys)]:
                c0 = proc_cpu_s(pids.get(k))
                r = pool.run(targets[k], files, readers, loops=loops[k])
                c1 = proc_cpu_s(pids.get(k))
                r["cpu_us"] = (c1 - c0) / r["opens"] * 1e6 if c0 is not None and c1 is not None else None
                opens[k] += r["opens"]
                runs[k].append(r)
        for k in keys:
            rates = [r["files_s"] for r in runs[k]]
            out[k][readers] = {"files_s": statistics.median(rates),
                               "mb_s": statistics.median(r["mb_s"] for r in runs[k]), "runs": rates,
                               "loops": loops[k]}
            cpu = [r["cpu_us"] for r in runs[k] if r["cpu_us"] is not None]
            if cpu:
                out[k][readers]["cpu_us"] = statistics.median(cpu)
            progress(f"  {LABELS[k]:<34} {readers} reader(s): {out[k][readers]['files_s']:>9,.0f} files/s "
                     f"{out[k][readers]['mb_s']:>8,.1f} MB/s  (passes: {', '.join(f'{x:,.0f}' for x in rates)}"
                     f"{f'; files read {loops[k]}x per pass' if loops[k] > 1 else ''})"
                     + (f"; daemon CPU {out[k][readers]['cpu_us']:.0f} us/open" if "cpu_us" in out[k][readers] else ""))
    return out, opens


def inprocess_costs(src: str, files, k: int = 400, rounds: int = 3) -> Dict[str, float]:
    """CPU microseconds per file, in this process, page cache warm, best of ``rounds``: the entry check of an
    NVMe hit (``DiskTier.verify``: open, pread whole, xxh3_64, close; what ``--verify-entries every-open``
    adds to every NVMe hit and ``first-hit`` to the first one of each entry) and the posix backend's whole-file
    read (``PosixBackend.read``: what a miss's daemon CPU includes for the backend)."""
    import xxhash

    from shadefs.backends.posix import PosixBackend
    from shadefs.cache.tiers import DiskTier

    sample = files[:k]
    sums = {}
    for rel, _ in sample:
        with open(os.path.join(src, rel), "rb") as f:
            sums[rel] = xxhash.xxh3_64_intdigest(f.read())
    backend = PosixBackend(src)
    best = {"verify_us": float("inf"), "backend_read_us": float("inf")}
    for _ in range(rounds):
        c = time.process_time()
        for rel, size in sample:
            fd = os.open(os.path.join(src, rel), os.O_RDONLY | os.O_CLOEXEC)
            try:
                DiskTier.verify(fd, size, sums[rel], keep=False)
            finally:
                os.close(fd)
        best["verify_us"] = min(best["verify_us"], (time.process_time() - c) / len(sample) * 1e6)
        c = time.process_time()
        for rel, size in sample:
            backend.read(rel, size)
        best["backend_read_us"] = min(best["backend_read_us"], (time.process_time() - c) / len(sample) * 1e6)
    backend.close()
    return best


def run_size(args, pool: ReaderPool, mounts: Mounts, size_name: str, src: str, files, work: str) -> dict:
    """Every case for one dataset, all mounted at once and measured round-robin.

    Returns {case key: {readers: {files_s, mb_s, runs}}, "_load": [...], "_requests": {...}}.
    """
    n = len(files)
    load0 = os.getloadavg()
    cases = [c for c in CASES if "all" in args.cases or c[0] in args.cases]
    targets = {"direct": src}
    setup = {}
    try:
        for key, label, tier, loop, kc, trace in cases:
            mnt = os.path.join(work, "mnt", f"{size_name}-{key}")
            cache_dir = os.path.join(work, "cache", f"{size_name}-{key}")
            trace_file = os.path.join(work, "trace", f"{size_name}-{key}.csv") if trace else None
            if trace_file:
                os.makedirs(os.path.dirname(trace_file), exist_ok=True)
            opts = mount_options(tier, loop, kc, trace_file, cache_dir, sum(size for _, size in files))
            progress(f"{size_name}: {label}: shadefs mount {' '.join(opts)}")
            env = None
            if key in BASELINE_ENV:
                env = dict(env or os.environ, PYTHONPATH=BASELINE_ENV[key])
            mounts.mount_shadefs(src, mnt, opts, os.path.join(work, "logs", f"{size_name}-{key}.log"), env=env)
            setup[key] = (mnt, cache_dir, trace_file, tier)
            targets[key] = mnt
        progress(f"{size_name}: warming (one pass each; direct: the source's page cache)")
        for key, root in targets.items():
            pool.run(root, files, max(args.readers))
        s0 = {}
        for key, (mnt, _, _, tier) in setup.items():
            s0[key] = shadefs_stats(mnt)
            ram, disk = s0[key]["tiers"]["ram"]["files"], s0[key]["tiers"]["disk"]["files"]
            if (tier == "ram" and ram != n) or (tier == "nvme" and (disk != n or ram != 0)):
                raise BenchError(f"{LABELS[key]}: tiers hold ram={ram} disk={disk} files after warming")
        progress(f"{size_name}: timing {len(targets)} cases round-robin, {args.repeat} passes each")
        pids = {key: mounts.pid_of(mnt) for key, (mnt, *_) in setup.items()}
        res, opens = interleaved_passes(pool, targets, files, args.readers, args.repeat, args.min_pass_s, pids)
        for key, (mnt, _, trace_file, tier) in setup.items():
            s1 = shadefs_stats(mnt)
            delta = {"ram": s1["hits"]["ram"] - s0[key]["hits"]["ram"],
                     "disk": s1["hits"]["disk"] - s0[key]["hits"]["disk"],
                     "miss": s1["misses"] - s0[key]["misses"], "opens": s1["opens"] - s0[key]["opens"]}
            want_kind = {"ram": "ram", "nvme": "disk", "miss": "miss", "miss-ram": "miss"}[tier]
            need = opens[key] if tier != "miss-ram" else int(opens[key] * 0.98)
            if delta["opens"] != opens[key] or delta[want_kind] < need:
                raise BenchError(f"{LABELS[key]}: the daemon counted {delta} during {opens[key]} timed opens; "
                                 f"expected every one to be a {want_kind} outcome")
            checked = verify_sample(mnt, src, files, args.verify, seed=len(s0))
            if trace_file:
                with open(trace_file) as f:
                    rows = sum(1 for _ in f) - 1
                if rows < opens[key]:  # ``shadefs stats`` flushed the trace
                    raise BenchError(f"{LABELS[key]}: the trace has {rows} rows after {opens[key]} timed opens")
            progress(f"  {LABELS[key]}: counters OK ({delta['opens']} timed opens, all {want_kind}), "
                     f"{checked} files byte-identical")
            if args.count_requests and key in COUNT_CASES:
                counts = count_requests(pool, mounts.pid_of(mnt), mnt, files[:args.count_requests], work)
                if counts is not None:
                    res.setdefault("_requests", {})[key] = counts
                    progress(f"  {LABELS[key]}: FUSE requests per open (strace): "
                             + ", ".join(f"{k} {v:.2f}" for k, v in counts.items()))
    finally:
        for key, (mnt, cache_dir, trace_file, _) in setup.items():
            mounts.unmount(mnt)
            shutil.rmtree(cache_dir, ignore_errors=True)
            if trace_file and os.path.exists(trace_file):
                os.unlink(trace_file)
    res["_load"] = [load0, os.getloadavg()]
    res["_inproc"] = inprocess_costs(src, files)
    progress(f"{size_name}: in process, per file: entry check {res['_inproc']['verify_us']:.1f} us, posix backend "
             f"read {res['_inproc']['backend_read_us']:.1f} us (CPU)")
    return res


def run_slow(args, pool: ReaderPool, mounts: Mounts, work: str, delay_ms: float) -> dict:
    """Hits interleaved with misses on a slow source; every front end mounted at once, measured in turn."""
    n = args.slow_files - args.slow_files % 2
    src = os.path.join(work, "data", "slow")
    files = make_dataset(src, n, args.large_size, seed=3)
    hits = files[0::2]   # warmed: the RAM tier holds exactly these bytes
    misses = files[1::2]
    mixed = [f for pair in zip(hits, misses) for f in pair]
    is_hit = [i % 2 == 0 for i in range(len(mixed))]
    ram_bytes = sum(size for _, size in hits)
    slow_mnt = os.path.join(work, "mnt", f"slowfs-{delay_ms:g}")
    out = {"_load": [os.getloadavg()], "files": n, "delay_ms": delay_ms, "readers": args.slow_readers}
    progress(f"slow backend: passthrough with {delay_ms:g} ms per READ at {slow_mnt}")
    stats_file = os.path.join(work, f"slowfs-stats-{delay_ms:g}.json")
    mounts.mount_slowfs(src, slow_mnt, delay_ms, stats_file, os.path.join(work, "logs", f"slowfs-{delay_ms:g}.log"))
    loops = tuple(getattr(args, "slow_loops", SLOW_LOOPS))
    mnts = {loop: os.path.join(work, "mnt", f"slow-{delay_ms:g}-{loop}") for loop in loops}
    try:
        r = pool.run(slow_mnt, misses, args.slow_readers)
        out["backend_direct"] = r["files_s"]
        progress(f"  slow source read directly, {args.slow_readers} readers: {r['files_s']:,.0f} files/s")
        s0 = {}
        for loop in loops:
            opts = frontend_options(loop) + ["--policy", "static", "--ram-cache", str(ram_bytes)]
            progress(f"slow backend: shadefs mount {' '.join(opts)}")
            mounts.mount_shadefs(slow_mnt, mnts[loop], opts, os.path.join(work, "logs", f"slow-{delay_ms:g}-{loop}.log"))
            pool.run(mnts[loop], hits, args.slow_readers)  # warm: half of the files
            s0[loop] = shadefs_stats(mnts[loop])
            if s0[loop]["tiers"]["ram"]["files"] != len(hits):
                raise BenchError(f"slow {loop}: RAM tier holds {s0[loop]['tiers']['ram']['files']} files, "
                                 f"expected {len(hits)}")
        hit_only = {loop: [] for loop in loops}
        mix = {loop: [] for loop in loops}
        hit_lat = {loop: [] for loop in loops}
        miss_lat = {loop: [] for loop in loops}
        dropped = {loop: 0 for loop in loops}
        for rnd in range(args.repeat):
            for loop in loops[rnd % len(loops):] + loops[:rnd % len(loops)]:
                hit_only[loop].append(pool.run(mnts[loop], hits, args.slow_readers)["files_s"])
                dropped[loop] += drop_pages(mnts[loop], misses)
                r = pool.run(mnts[loop], mixed, args.slow_readers, latency=True)
                mix[loop].append(r["files_s"])
                # latencies come back shard by shard, i.e. in ``mixed`` order
                hit_lat[loop] += [x for x, h in zip(r["latency"], is_hit) if h]
                miss_lat[loop] += [x for x, h in zip(r["latency"], is_hit) if not h]
        for loop in loops:
            s1 = shadefs_stats(mnts[loop])
            want_hits = args.repeat * 2 * len(hits)
            want_misses = args.repeat * len(misses) + dropped[loop]
            got_hits = s1["hits"]["ram"] - s0[loop]["hits"]["ram"]
            got_misses = s1["misses"] - s0[loop]["misses"]
            if got_hits != want_hits or got_misses != want_misses:
                raise BenchError(f"slow {loop}: counted {got_hits} hits / {got_misses} misses, "
                                 f"expected {want_hits} / {want_misses}")
            checked = verify_sample(mnts[loop], src, files, args.verify, seed=7)
            rate = statistics.median(mix[loop])
            o = out[loop] = {
                "hits_only_files_s": statistics.median(hit_only[loop]),
                "mixed_files_s": rate, "mixed_hits_s": rate / 2,
                "hit_ms_p50": _pct(hit_lat[loop], 50) * 1e3, "hit_ms_p90": _pct(hit_lat[loop], 90) * 1e3,
                "hit_ms_p99": _pct(hit_lat[loop], 99) * 1e3,
                "miss_ms_p50": _pct(miss_lat[loop], 50) * 1e3, "miss_ms_p99": _pct(miss_lat[loop], 99) * 1e3,
            }
            progress(f"  {loop:<6} hits alone {o['hits_only_files_s']:,.0f} files/s; mixed {rate:,.0f} files/s, "
                     f"hit p50 {o['hit_ms_p50']:.2f} ms p99 {o['hit_ms_p99']:.2f} ms, miss p50 "
                     f"{o['miss_ms_p50']:.2f} ms; counters OK, {checked} files byte-identical")
    finally:
        for loop in loops:
            mounts.unmount(mnts[loop])
        mounts.unmount(slow_mnt)
    try:
        with open(stats_file) as f:
            out["slowfs"] = json.load(f)
    except (OSError, ValueError):
        pass
    out["_load"].append(os.getloadavg())
    return out


def _hang_reader(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    while os.read(fd, READ_CHUNK):
        pass
    os.close(fd)
    os._exit(0)


def run_hung(args, pool: ReaderPool, mounts: Mounts, work: str) -> dict:
    """Hits and misses through the kernel front end before and while ``--hung`` backend reads hang."""
    src = os.path.join(work, "data", "hung")
    n = 400
    files = make_dataset(src, n, args.large_size, seed=4)
    hang_dir = os.path.join(src, "hang")
    os.makedirs(hang_dir, exist_ok=True)
    for i in range(args.hung):
        with open(os.path.join(hang_dir, f"h{i:03d}.bin"), "wb") as f:
            f.write(os.urandom(1000))
    hits, misses = files[: n // 2], files[n // 2:]
    gate = os.path.join(work, "hung-gate")
    for p in (gate, gate + ".fifo"):
        if os.path.exists(p):
            os.unlink(p)
    os.mkfifo(gate + ".fifo", 0o600)
    gmnt = os.path.join(work, "mnt", "gatedfs")
    mnt = os.path.join(work, "mnt", "hung-kernel")
    out = {"_load": [os.getloadavg()], "hung": args.hung, "readers": args.slow_readers}
    children = []
    mounts.mount_gatedfs(src, gmnt, gate, os.path.join(work, "logs", "gatedfs.log"))
    try:
        ram = sum(size for _, size in hits)
        opts = frontend_options("kernel") + ["--policy", "static", "--ram-cache", str(ram)]
        progress(f"hung backend: shadefs mount {' '.join(opts)} over the gated source")
        mounts.mount_shadefs(gmnt, mnt, opts, os.path.join(work, "logs", "hung-kernel.log"))
        pool.run(mnt, hits, args.slow_readers)  # warm: RAM hits from now on

        def measure(tag):
            h = pool.run(mnt, hits, args.slow_readers, latency=True)
            half = misses[: len(misses) // 2] if tag == "before" else misses[len(misses) // 2:]
            m = pool.run(mnt, half, args.slow_readers, latency=True)  # each miss file read once: a real miss
            out[tag] = {"hit_files_s": h["files_s"], "hit_ms_p50": _pct(h["latency"], 50) * 1e3,
                        "hit_ms_p99": _pct(h["latency"], 99) * 1e3, "miss_files_s": m["files_s"],
                        "miss_ms_p50": _pct(m["latency"], 50) * 1e3, "miss_ms_p99": _pct(m["latency"], 99) * 1e3}
            progress(f"  {tag}: hits {h['files_s']:,.0f} files/s p99 {out[tag]['hit_ms_p99']:.2f} ms; misses "
                     f"{m['files_s']:,.0f} files/s p99 {out[tag]['miss_ms_p99']:.2f} ms")

        measure("before")
        for i in range(args.hung):
            pid = os.fork()
            if pid == 0:
                _hang_reader(os.path.join(mnt, "hang", f"h{i:03d}.bin"))
            children.append(pid)
        time.sleep(1.0)
        states = []
        for pid in children:
            with open(f"/proc/{pid}/stat") as f:
                states.append(f.read().rsplit(") ", 1)[1][0])
        out["hung_states"] = "".join(sorted(states))
        measure("during")
        s = shadefs_stats(mnt)
        out["in_flight_misses"] = args.hung  # their readers are still blocked (checked below)
        alive = sum(1 for pid in children if os.waitpid(pid, os.WNOHANG) == (0, 0))
        out["still_blocked"] = alive
        os.kill(children[0], signal.SIGKILL)
        t0 = time.monotonic()
        os.waitpid(children[0], 0)
        out["kill_exit_ms"] = (time.monotonic() - t0) * 1e3
        children.pop(0)
        progress(f"  {alive} of {args.hung} readers still blocked on hung misses (states {out['hung_states']}); "
                 f"one killed: gone in {out['kill_exit_ms']:.1f} ms; opens counted {s['opens']}")
    finally:
        open(gate, "w").close()
        wake = os.open(gate + ".fifo", os.O_RDWR | os.O_NONBLOCK)  # wakes every blocked open of the FIFO
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        mounts.unmount(mnt)
        mounts.unmount(gmnt)
        os.close(wake)
    out["_load"].append(os.getloadavg())
    return out


def _pct(xs: List[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]
