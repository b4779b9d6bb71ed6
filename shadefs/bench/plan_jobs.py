"""Plans that many jobs share: what announcing costs under the cache lock, what a plan costs in memory,
and whether each job's plan follows its own opens over one mount.

Regime: **counts** (misses against Belady's OPT on the same trace; ``mount`` runs with
``--no-kernel-cache``). Limit: OPT's misses; for ``announce``, a RAM hit's lock hold without announcements.

``announce`` (in this process, no FUSE, no data): a namespace of ``--files`` ids, a RAM tier of
``--residents`` one-byte files under Belady-on-plan (``static`` inner policy), and ``--ranks`` streams that
announce at once, from one thread each, ``--epochs`` epochs of ``--samples`` samples each (two seeded
permutations per rank, split as ``DistributedSampler`` splits them when ``--shard``; else every rank
announces the whole dataset). Meanwhile an opener thread takes the lock as the daemon does for a RAM hit
(``observe`` + the tier's hit) in a loop. Reported: every hold of the lock by an announcing thread (max,
p99), the first victim search after the announcements (under the lock, as the cache calls it), the
opener's latency (lock wait + hold; p99) during the announcements and without them, and the process's
RSS growth per plan. The lock is the registry's ``lock`` attribute, replaced by a timing lock. With
``--confirm``, every rank then announces the same epochs again (a lookahead confirmed: the new plan carries
what the old one consumed of its first epoch) while the opener reads on as rank 0 for ``--confirm-after``
seconds before and during it: the holds of those announcements (``confirm_*``; rank 0's carries the
opens) and how many positions the new rank-0 plan holds as consumed.

``mount``: a real mount of ``--files`` files (``--min``..``--max`` bytes) with a RAM tier of ``--ram``
(% of the dataset) and ``--trace``; two jobs (``PlanSampler`` + a DataLoader with ``--workers`` forked
workers, ``--epochs`` epochs each, seeds 1 and 2) and one unplanned reader (every file once, shuffled)
run at once. Reported: plans retired, positions matched (``prefetch.plans_matched`` where the daemon
counts it, else from the log's retirement lines), backend bytes over OPT's miss bytes of the merged
trace at the same RAM size.

Run it with the interpreter whose shadefs is measured (a worktree's venv, or the main checkout's), e.g.

    python -m shadefs.bench plan_jobs announce --files 1281167 --samples 1281167 --ranks 8 --shard
    python -m shadefs.bench plan_jobs announce --ranks 8 --confirm
    python -m shadefs.bench plan_jobs mount --files 60000 --workers 2 --epochs 2
    python -m shadefs.bench plan_jobs split --files 60000

``split`` (in this process, no FUSE): the mount case's three readers replayed against the daemon's policy
classes, the reader unplanned and announced, to tell which part of backend reads over OPT comes from the
reader's unknown future (function ``split``); ``--references`` adds Belady with the jobs' future exact
and the reader's known, unknown, or modelled as a random scan (function ``reference``).
"""
from __future__ import annotations

import gc
import inspect
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class TimingLock:
    """A lock that records how long each thread named in ``watch`` held it (seconds)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.holds = []
        self.cpu = []  # the holder's CPU time during each hold (no GIL waits, no descheduling)
        self.watch = set()
        self.by_thread = {}  # thread ident -> its holds: (seconds, CPU seconds)
        self._t0 = self._c0 = 0.0

    def acquire(self, *a, **k):
        ok = self._lock.acquire(*a, **k)
        self._t0 = time.perf_counter()
        self._c0 = time.thread_time()
        return ok

    def release(self):
        dt = time.perf_counter() - self._t0
        if threading.get_ident() in self.watch:
            self.holds.append(dt)
            self.cpu.append(time.thread_time() - self._c0)
            self.by_thread.setdefault(threading.get_ident(), []).append((dt, self.cpu[-1]))
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()

    def locked(self):
        return self._lock.locked()


def observer(plans, pid):
    """``observe(fid)`` of ``plans`` for the opens of process ``pid`` (None: no job named): the opener is
    ``observe``'s argument; a package from before that names it per thread (``set_opener``, on this one)."""
    try:
        from shadefs.plan.plans import set_opener
    except ImportError:
        return plans.observe if pid is None else (lambda fid: plans.observe(fid, pid))
    set_opener(pid)
    return plans.observe


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def announce(args) -> dict:
    import numpy as np

    from shadefs.cache.index import TierIndex
    from shadefs.plan.plans import PlanRegistry
    from shadefs.plan.policy import PlanPolicy
    from shadefs.policies.base import Importance, get_policy

    n = args.files
    lock = TimingLock()
    plans = PlanRegistry(n, lock, max_plans=max(64, args.ranks), announce_burst=64)
    pol = PlanPolicy(get_policy("static")(args.residents, Importance(n)), plans)
    idx = TierIndex("ram", args.residents, pol)
    rng = np.random.default_rng(0)
    residents = rng.choice(n, args.residents, replace=False)
    for f in residents.tolist():
        idx.admit(f, 1)
    h, _ = plans.register(None, np.arange(n, dtype=np.int64))
    ranks = args.ranks
    orders = []
    for r in range(ranks):
        eps = []
        for e in range(args.epochs):
            perm = np.random.default_rng(1000 + e).permutation(args.samples) if args.shard else \
                np.random.default_rng(1000 + 31 * r + e).permutation(args.samples)
            eps.append(perm[r::ranks] if args.shard else perm)
        orders.append(eps)
    has_job = "job" in inspect.signature(plans.announce).parameters
    # one process per rank (a sleeping child) owns its plan; the opener opens as rank 0, in its order
    owners = [subprocess.Popen(["sleep", "600"]) for _ in range(ranks)]
    if has_job:
        from shadefs.plan.plans import proc_start_time
    reads = np.concatenate(orders[0]).tolist()
    res_list = residents.tolist()

    read_at = [0]  # rank 0's next position to open (the opener goes on where the last one left off)

    def opener(stop, lat):
        observe = observer(plans, owners[0].pid if has_job else None)
        j = 0
        while not stop.is_set() and read_at[0] < len(reads):
            if (h, 0) in plans.plans:  # rank 0 reads its plan once it is there
                f = reads[read_at[0]]
                read_at[0] += 1
            else:                      # before: hits of residents
                f = res_list[j % len(res_list)]
                j += 1
            t0 = time.perf_counter()
            with lock:  # as the cache holds it for an open: the cursor, then a hit or the miss's admission
                observe(f)
                if f in idx:
                    idx.hit(f)
                else:
                    idx.admit(f, 1)
            lat.append(time.perf_counter() - t0)
            if (read_at[0] + j) % 64 == 0:
                time.sleep(0)

    def run_openers(seconds):
        stop, lat = threading.Event(), []
        t = threading.Thread(target=opener, args=(stop, lat))
        t.start()
        time.sleep(seconds)
        stop.set()
        t.join()
        return lat

    quiet = run_openers(2.0)  # before any plan: hits
    gc.collect()
    rss0 = rss_bytes()
    stop, during = threading.Event(), []
    op = threading.Thread(target=opener, args=(stop, during))
    op.start()

    def rank(r):
        lock.watch.add(threading.get_ident())
        segs = [len(o) for o in orders[r]]
        ids = np.concatenate(orders[r]).astype(np.uint32)
        kw = {"job": (owners[r].pid, proc_start_time(owners[r].pid))} if has_job else {}
        plans.announce(h, r, 0, segs, ids, **kw)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    stop.set()
    op.join()
    announce_holds, announce_cpu = list(lock.holds), list(lock.cpu)
    # the first victim search after the announcements: a miss of a planned file
    lock.watch = {threading.get_ident()}
    lock.holds = []
    r1 = min(1, ranks - 1)
    planned = np.concatenate(orders[r1])
    newcomer = next((int(f) for f in planned.tolist() if f not in idx), None)
    observe = observer(plans, owners[r1].pid if has_job else None)
    if newcomer is not None:
        with lock:
            observe(newcomer)
            idx.admit(newcomer, 1)
    else:  # every file of the plan is resident: a search for an unplanned newcomer
        lock.holds.append(0.0)
        lock.cpu.append(0.0)
    first_search, first_search_cpu = (lock.holds[-1], lock.cpu[-1]) if newcomer is not None else (None, None)
    confirm = {}
    if args.confirm:
        # every rank announces the same epochs again (a lookahead confirmed) while rank 0's job reads its
        # plan: what rank 0 consumed of the epoch is carried into the new plan
        stop, during_confirm = threading.Event(), []
        op = threading.Thread(target=opener, args=(stop, during_confirm))
        op.start()
        time.sleep(args.confirm_after)
        before = plans.plans[(h, 0)].matched
        lock.watch, lock.holds, lock.cpu, lock.by_thread = set(), [], [], {}
        idents = {}

        def confirm_rank(r):
            idents[r] = threading.get_ident()
            rank(r)

        threads = [threading.Thread(target=confirm_rank, args=(r,)) for r in range(ranks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        op.join()
        p0 = plans.plans.get((h, 0))
        mine = lock.by_thread.get(idents[0], [(0.0, 0.0)])
        confirm = {"confirm_hold_max_ms": round(1e3 * max(lock.holds), 3),
                   "confirm_hold_p99_ms": round(1e3 * pct(lock.holds, 0.99), 3),
                   "confirm_hold_cpu_max_ms": round(1e3 * max(lock.cpu), 3),
                   "confirm_rank0_hold_max_ms": round(1e3 * max(dt for dt, _ in mine), 3),
                   "confirm_rank0_hold_cpu_max_ms": round(1e3 * max(c for _, c in mine), 3),
                   "confirm_rank0_holds": len(mine),
                   "confirm_carried": None if p0 is None else p0.matched, "matched_before_confirm": before,
                   "open_p99_during_confirm_us": round(1e6 * pct(during_confirm, 0.99), 1),
                   "open_max_during_confirm_ms": round(1e3 * max(during_confirm), 3) if during_confirm else None}
    for o in owners:
        o.kill()
        o.wait()
    gc.collect()
    rss1 = rss_bytes()
    arrays = {id(v): v.nbytes for p in plans.plans.values() for v in vars(p).values() if isinstance(v, np.ndarray)}
    return {"files": n, "samples": args.samples, "epochs": args.epochs, "ranks": ranks, "shard": args.shard,
            "residents": args.residents, "positions_per_plan": int(sum(len(o) for o in orders[0])),
            "announce_wall_s": round(wall, 3),
            "announce_hold_max_ms": round(1e3 * max(announce_holds), 3),
            "announce_hold_p99_ms": round(1e3 * pct(announce_holds, 0.99), 3),
            "announce_holds": len(announce_holds),
            "announce_hold_cpu_max_ms": round(1e3 * max(announce_cpu), 3),
            "announce_hold_cpu_p99_ms": round(1e3 * pct(announce_cpu, 0.99), 3),
            "first_search_ms": None if first_search is None else round(1e3 * first_search, 3),
            "first_search_cpu_ms": None if first_search is None else round(1e3 * first_search_cpu, 3),
            "open_p99_quiet_us": round(1e6 * pct(quiet, 0.99), 1),
            "open_p99_during_us": round(1e6 * pct(during, 0.99), 1),
            "open_max_during_ms": round(1e3 * max(during), 3) if during else None,
            "opens_during": len(during),
            "rss_per_plan_mib": round((rss1 - rss0) / ranks / 2**20, 1),
            "plan_arrays_mib": round(sum(arrays.values()) / len(plans.plans) / 2**20, 1),
            "rebuilds": pol.rebuilds, "plans_active": len(plans.plans), **confirm}


JOB = textwrap.dedent("""
    import inspect, sys
    from torch.utils.data import DataLoader
    from shadefs.hooks import PlanSampler
    from shadefs.testing.datasets import FileDataset

    ds = FileDataset(sys.argv[1])
    epochs, workers = int(sys.argv[3]), int(sys.argv[4])
    kw = {"epochs": epochs} if "epochs" in inspect.signature(PlanSampler).parameters else {}
    sampler = PlanSampler(ds, seed=int(sys.argv[2]), lookahead_epochs=1, **kw)
    iter(sampler)
    assert sampler.flush()
    print("announced", flush=True)
    assert sys.stdin.readline() == "go\\n"
    kw = {"multiprocessing_context": "fork"} if workers else {}
    loader = DataLoader(ds, batch_size=32, sampler=sampler, num_workers=workers, **kw)
    total = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total += sum(int(b.sum()) for b in loader)
    sampler.close()
    print(total, flush=True)
    """)

READER = textwrap.dedent("""
    import os, random, sys
    paths = [os.path.join(d, f) for d, _, fs in os.walk(sys.argv[1]) for f in fs]
    random.Random(7).shuffle(paths)
    total = 0
    for p in paths:
        with open(p, "rb") as f:
            total += len(f.read())
    print(total, flush=True)
    """)


def mount(args) -> dict:
    import re

    from shadefs import sim
    from shadefs.testing.mounts import Mount

    work = tempfile.mkdtemp(prefix="bench-plan-jobs-")
    try:
        src = os.path.join(work, "src")
        rng = random.Random(5)
        total = 0
        for i in range(args.files):
            d = os.path.join(src, f"c{i % 100:03d}")
            os.makedirs(d, exist_ok=True)
            size = rng.randint(args.min, args.max)
            with open(os.path.join(d, f"{i:07d}.bin"), "wb") as f:
                f.write(os.urandom(size))
            total += size
        mnt = os.path.join(work, "mnt")
        os.mkdir(mnt)
        trace = os.path.join(work, "trace.csv")
        ram = int(total * args.ram / 100)
        t0 = time.monotonic()
        with Mount(src, mnt, ["--ram-cache", str(ram), "--no-kernel-cache", "--trace", trace],
                   os.path.join(work, "daemon.log")) as m:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
            jobs = [subprocess.Popen([sys.executable, "-c", JOB, mnt, str(seed), str(args.epochs), str(args.workers)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
                    for seed in range(1, args.jobs + 1)]
            for j in jobs:
                assert j.stdout.readline() == "announced\n"
            deadline = time.monotonic() + 60
            while m.full_stats()["prefetch"]["plans_announced"] < args.jobs:
                assert time.monotonic() < deadline, "the plans did not arrive"
                time.sleep(0.05)
            if args.reader and args.reader_plan:  # the reader announces its one pass (seed 7, no workers)
                reader = subprocess.Popen([sys.executable, "-c", JOB, mnt, "7", "1", "0"], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, text=True, env=env)
                assert reader.stdout.readline() == "announced\n"
                deadline = time.monotonic() + 60
                while m.full_stats()["prefetch"]["plans_announced"] < args.jobs + 1:
                    assert time.monotonic() < deadline, "the reader's plan did not arrive"
                    time.sleep(0.05)
                reader.stdin.write("go\n")
                reader.stdin.flush()
            else:
                reader = subprocess.Popen([sys.executable, "-c", READER if args.reader else "print(0)", mnt],
                                          stdout=subprocess.PIPE, text=True)
            for j in jobs:
                j.stdin.write("go\n")
                j.stdin.flush()
            outs = [j.communicate(timeout=args.timeout)[0].split() for j in jobs]
            got = reader.communicate(timeout=args.timeout)[0].split()
            wall = time.monotonic() - t0
            s = m.full_stats()
            log = m.log()
        assert outs == [[str(args.epochs * total)]] * args.jobs and got == [str(total if args.reader else 0)], (outs, got)
        p = s["prefetch"]
        planned_opens = args.jobs * args.epochs * args.files + (args.files if args.reader and args.reader_plan else 0)
        if "plans_matched" in p:
            matched = p["plans_matched"]
        else:  # plans retired before: their matches are in the retirement lines; finished ones matched all
            matched = sum(int(x) for x in re.findall(r"retired plan .*?, (\d+) matched", log))
        t = sim.read_trace(trace)
        opt = sim.belady(t, ram)
        opt_miss = t.request_bytes - opt.hit_bytes if hasattr(t, "request_bytes") else opt.request_bytes - opt.hit_bytes
        return {"files": args.files, "jobs": args.jobs, "reader": args.reader,
                "reader_plan": bool(args.reader and args.reader_plan), "bytes": total, "ram_bytes": ram, "epochs": args.epochs,
                "workers": args.workers, "opens": s["opens"], "planned_opens": planned_opens,
                "plans_retired": p["plans_retired"], "plans_finished": p["plans_finished"],
                "plans_withdrawn": p["plans_withdrawn"], "matched": matched,
                "matched_pct": round(100 * matched / planned_opens, 2),
                "unmatched": p.get("plans_unmatched"), "foreign_opens": p.get("plans_foreign_opens"),
                "backend_bytes": s["backend_bytes"], "opt_miss_bytes": int(opt_miss),
                "backend_over_opt": round(s["backend_bytes"] / max(1, opt_miss), 4),
                "wasted_bytes": p["wasted_bytes"], "ready": p["ready"], "late": p["late"],
                "misses": s["misses"], "wall_s": round(wall, 1)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def reference(ids, who, sizes, cap, rule, alpha=1.0):
    """Misses (bytes per stream: job 1, job 2, reader) of Belady with bypass on the merged trace (the
    jobs' next uses exact, in opens) when the reader's future is: ``"known"`` (OPT itself), ``"unknown"``
    (a file's next use is its next job use), or ``"scan"`` (a file the reader has not read yet is also
    used at ``alpha`` x the expected next read of a random pass over the files it has left: now + alpha x
    remaining / 2 x the mount's opens per reader open so far; one it read, only by the jobs)."""
    import heapq

    ids, wl, sz = list(ids), list(who), [int(x) for x in sizes]
    n, nf, inf = len(ids), len(sz), 1 << 60
    jn, rn = [0] * n, [0] * n
    lastj, lastr = [inf] * nf, [inf] * nf
    for i in range(n - 1, -1, -1):
        f = ids[i]
        jn[i], rn[i] = lastj[f], lastr[f]
        if wl[i] == 2:
            lastr[f] = i
        else:
            lastj[f] = i
    unread = [rule == "scan"] * nf
    left, ropens, live, free = nf, 0, {}, cap
    heaps = ([], [])  # residents the reader has read / not read: (-next job use, fid)
    miss = [0, 0, 0]
    for i in range(n):
        f, w = ids[i], wl[i]
        size = sz[f]
        if w == 2:
            ropens += 1
            if unread[f]:
                unread[f] = False
                left -= 1
        key = min(jn[i], rn[i]) if rule == "known" else jn[i]
        key = key if key < inf else inf + f
        c = i + alpha * left * (i + 1) / max(1, ropens) / 2 if rule == "scan" else inf
        if f in live:
            live[f] = key
            heapq.heappush(heaps[unread[f]], (-key, f))
            continue
        miss[w] += size
        mine = min(key, c) if unread[f] else key
        if size > free:
            if mine >= inf or size > cap:
                continue
            victims, taken, freed = [], set(), 0
            while free + freed < size:
                for u, h in enumerate(heaps):
                    while h and not (live.get(h[0][1]) == -h[0][0] and unread[h[0][1]] == bool(u)):
                        heapq.heappop(h)
                far = [(-h[0][0] if not u else min(-h[0][0], c), -u) for u, h in enumerate(heaps) if h]
                if not far or max(far)[0] < mine:
                    break
                h = heaps[-max(far)[1]]  # the furthest (a tie: one the reader has read)
                item = heapq.heappop(h)
                if item[1] not in taken:
                    taken.add(item[1])
                    victims.append((h, item))
                    freed += sz[item[1]]
            if free + freed < size:
                for h, item in victims:
                    heapq.heappush(h, item)
                continue
            for _, item in victims:
                del live[item[1]]
            free += freed
        live[f] = key
        heapq.heappush(heaps[unread[f]], (-key, f))
        free -= size
    return miss


def split(args) -> dict:
    """The mount case replayed in process, to split backend reads over OPT by cause: two planned jobs
    (``--epochs`` permutations each, one plan per job) and one reader of every file once (shuffled), their
    opens interleaved at random in the ratio 1 : 1 : ``--reader-speed``, a RAM tier of ``--ram`` % under
    Belady-on-plan (``static`` inner policy), files of ``--min``..``--max`` bytes. Misses (bytes) of the
    daemon's policy, the reader unplanned and with its order announced as a third plan, against OPT of the
    merged trace (``sim.belady``). No prefetching: it does not change the tier's decisions. Where the
    registry follows readers of no plan as scans, the unplanned case runs also with that off
    (``reader_unplanned_scan_off``)."""
    import numpy as np

    from shadefs import sim
    from shadefs.cache.index import TierIndex
    from shadefs.plan.plans import PlanRegistry, proc_start_time
    from shadefs.plan.policy import PlanPolicy
    from shadefs.policies.base import Importance, get_policy

    n, epochs = args.files, args.epochs
    rng = np.random.default_rng(args.seed)
    sizes = rng.integers(args.min, args.max + 1, n)
    cap = int(sizes.sum() * args.ram / 100)
    streams = [np.concatenate([np.random.default_rng(100 * s + e).permutation(n) for e in range(epochs)])
               for s in (1, 2)] + [rng.permutation(n)]
    weights = np.array([1.0, 1.0, args.reader_speed])
    ptr, order, who = [0, 0, 0], [], []
    draws = rng.random(sum(len(x) for x in streams))
    for u in draws.tolist():
        live = [i for i in range(3) if ptr[i] < len(streams[i])]
        w = np.cumsum(weights[live]) / weights[live].sum()
        i = live[int(np.searchsorted(w, u, side="right"))] if len(live) > 1 else live[0]
        order.append(int(streams[i][ptr[i]]))
        who.append(i)
        ptr[i] += 1
    trace = sim.Trace(ids=np.array(order, dtype=np.int64), sizes=sizes.astype(np.int64),
                      paths=[str(i) for i in range(n)])
    opt = trace.request_bytes - sim.belady(trace, cap).hit_bytes
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(3)]  # one process per job (plan owner)
    out = {"files": n, "epochs": epochs, "reader_speed": args.reader_speed, "ram_bytes": cap,
           "opens": len(order), "opt_miss_bytes": int(opt)}
    if args.references:  # what an online rule for the reader could gain, the jobs' future exact
        rules = [("known", 1.0), ("unknown", 1.0)] + [("scan", float(a)) for a in args.alphas.split(",")]
        for rule, alpha in rules:
            m = reference(order, who, sizes, cap, rule, alpha)
            out[f"reference_{rule}" + (f"_{alpha:g}" if rule == "scan" else "")] = {
                "over_opt": round(sum(m) / opt, 4), "miss_bytes_by_stream": m}
    try:
        scans = "max_scans" in inspect.signature(PlanRegistry).parameters
        cases = [("reader_unplanned", 2, {}), ("reader_planned", 3, {})]
        if scans:  # the reader's scan not followed (the daemon's rule for a reader of no plan off)
            cases.insert(1, ("reader_unplanned_scan_off", 2, {"max_scans": 0}))
        for case, planned, kw in cases:
            plans = PlanRegistry(n, **kw)
            pol = PlanPolicy(get_policy("static")(cap, Importance(n)), plans)
            idx = TierIndex("ram", cap, pol)
            h, _ = plans.register(None, np.arange(n))
            for j in range(planned):
                segs = [n] * (epochs if j < 2 else 1)
                plans.announce(h, j, 0, segs, streams[j].astype(np.uint32),
                               job=(procs[j].pid, proc_start_time(procs[j].pid)))
            miss = [0, 0, 0]
            for f, i in zip(order, who):
                observer(plans, procs[i].pid)(f)   # the daemon follows the open, then serves it
                if f in idx:
                    idx.hit(f)
                else:
                    miss[i] += int(sizes[f])
                    idx.admit(f, int(sizes[f]))
            out[case] = {"miss_bytes": sum(miss), "over_opt": round(sum(miss) / opt, 4),
                         "miss_bytes_by_stream": miss, "retired": plans.retired}
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return out


#: the runner's common options this benchmark honours
COMMON = ()


def add_arguments(ap) -> None:
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("announce")
    a.add_argument("--files", type=int, default=1_281_167)
    a.add_argument("--samples", type=int, default=1_281_167)
    a.add_argument("--epochs", type=int, default=2)
    a.add_argument("--ranks", type=int, default=8)
    a.add_argument("--shard", action="store_true", help="each rank announces its DistributedSampler shard")
    a.add_argument("--residents", type=int, default=200_000)
    a.add_argument("--confirm", action="store_true",
                   help="then every rank announces its epochs again while rank 0's job reads (a confirmation)")
    a.add_argument("--confirm-after", type=float, default=1.0, help="seconds of reading before it (default 1)")
    b = sub.add_parser("mount")
    b.add_argument("--files", type=int, default=60_000)
    b.add_argument("--min", type=int, default=200)
    b.add_argument("--max", type=int, default=1200)
    b.add_argument("--ram", type=float, default=20.0, help="RAM tier, %% of the dataset")
    b.add_argument("--epochs", type=int, default=2)
    b.add_argument("--workers", type=int, default=2)
    b.add_argument("--timeout", type=float, default=600)
    b.add_argument("--jobs", type=int, default=2, help="planned jobs (default 2)")
    b.add_argument("--no-reader", dest="reader", action="store_false", help="no unplanned reader")
    b.add_argument("--reader-plan", action="store_true",
                   help="the reader announces its pass (PlanSampler + DataLoader without workers) instead")
    c = sub.add_parser("split")
    c.add_argument("--files", type=int, default=60_000)
    c.add_argument("--min", type=int, default=200)
    c.add_argument("--max", type=int, default=1200)
    c.add_argument("--ram", type=float, default=20.0, help="RAM tier, %% of the dataset")
    c.add_argument("--epochs", type=int, default=2)
    c.add_argument("--reader-speed", type=float, default=1 / 3,
                   help="the reader's opens per open of one job (default 1/3, as in the mount run)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--references", action="store_true",
                   help="also Belady with the jobs' future exact and the reader's known / unknown / modelled "
                        "as a random scan (function reference)")
    c.add_argument("--alphas", default="0.25,0.5,1,1000",
                   help="with --references: scales of the scan model's expected next read (comma-separated)")


def run(args, bench):
    out = {"announce": announce, "mount": mount, "split": split}[args.cmd](args)
    with open("/proc/loadavg") as f:
        out["loadavg"] = f.read().split()[:3]
    print(json.dumps(out))
