"""RAM hits against the page cache and a native FUSE server, side by side in one run.

Regime: **per open** (every timed open a RAM hit, the files' pages warm on purpose). Limit: the page
cache's files/s (``direct``) and a native single-threaded libfuse server's (``--ramfs``).

Cases, all mounted at once and timed in interleaved rounds (every case once per round; the median of
``--rounds`` reported), 8 reader processes (``--procs``) reading every file ``--reps`` times (``os.open``,
``os.read(256 KiB)`` to EOF, ``os.close``), ~110 KB and ~300 B files (+-30 %):

- ``direct``: the source tree through the page cache;
- ``native ...``: a native libfuse3 low-level server holding the tree in RAM with keep_cache (``--ramfs``:
  the binary of ``shadefs/bench/ramfs.c``, built as its first comment says; ``mt`` its multi-threaded loop, ``single`` its
  single-threaded loop, ``single, no-open`` OPEN answered ENOSYS so the kernel sends neither OPEN nor
  RELEASE); skipped without ``--ramfs``. Each runs in a session of its own, as a FUSE daemon does (and as
  ``shadefs mount``'s daemon does: it calls setsid): on a kernel with ``CONFIG_SCHED_AUTOGROUP`` (and
  ``kernel.sched_autogroup_enabled=1``) a session is a scheduling group of its own, which the scheduler
  shares the CPU with as a whole, so a server in the readers' session competes with 8 readers for its
  group's share and one in its own session does not;
- with ``--readers-session``, ``native libfuse3 (single), readers' session`` (the same server started in
  this script's session) and ``shadefs, readers' session`` (``shadefs mount --foreground``, started in this
  script's session): both servers in the readers' scheduling group;
- ``shadefs``: this tree's daemon with default flags and ``--ram-cache 100%`` (the compiled reader loop
  where it is built; RAM hits answered in C), ``shadefs, Python loop`` the same with
  ``SHADEFS_FUSE_PYTHON_LOOP=1``, with ``--gil-opens`` ``shadefs, OPEN under the GIL``
  (``SHADEFS_FUSE_GIL_OPENS=1``: the compiled loop hands every OPEN to Python), with ``--readers N ...``
  ``shadefs, N reader threads`` (``--fuse-readers N``; the default is 2), and with ``--baseline REV``
  the daemon of git revision REV (its package on PYTHONPATH: the Python loop, its compiled module is not
  built there).

For each server (native or shadefs) the CPU (user + system, ``/proc/PID/stat``) and the context switches
(voluntary and involuntary, of all its threads: ``/proc/PID/task/*/status``) per open over the timed passes
are reported, and each shadefs daemon's counters must show every timed open as a RAM hit.

    python -m shadefs.bench hit_native --ramfs /tmp/ramfs [--baseline main] [--rounds 3]
"""
from __future__ import annotations

import multiprocessing as mp
import os
import random
import shutil
import subprocess
import tempfile
import time
from typing import Dict, List

from shadefs.bench.runner import env_with
from shadefs.testing import Mount, ctx_switches, proc_cpu_s, wait_for
from shadefs.testing.mounts import SHADEFS

SIZES = (("~110 KB", 2000, 110_000), ("~300 B", 4000, 300))


def make_tree(root: str, n: int, size: int, classes: int = 10, seed: int = 5) -> List[str]:
    """``n`` incompressible files of about ``size`` bytes (+-30 %) in ``classes`` folders; their paths."""
    rnd = random.Random(seed)
    rel = []
    for i in range(n):
        d = os.path.join(root, f"c{i % classes:02d}")
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, f"{i:06d}.png")
        if not os.path.exists(p):
            with open(p, "wb") as f:
                f.write(rnd.randbytes(int(size * rnd.uniform(0.7, 1.3))))
        rel.append(os.path.relpath(p, root))
    return sorted(rel)


def _reader(args) -> int:
    root, part = args
    for p in part:
        fd = os.open(os.path.join(root, p), os.O_RDONLY)
        while os.read(fd, 262144):
            pass
        os.close(fd)
    return len(part)



def timed(pool, root: str, rel: List[str], procs: int, reps: int) -> float:
    """Files per second of one pass of ``procs`` readers over ``rel`` x ``reps``."""
    allp = rel * reps
    parts = [allp[i::procs] for i in range(procs)]
    t0 = time.monotonic()
    n = sum(pool.map(_reader, [(root, p) for p in parts]))
    return n / (time.monotonic() - t0)


#: the runner's common options this benchmark honours
COMMON = ('rounds', 'baseline')


def add_arguments(ap) -> None:
    ap.add_argument("--ramfs", help="the native anchor's binary (shadefs/bench/ramfs.c built with libfuse3)")
    ap.add_argument("--reps", type=int, default=3, help="passes over the files per timed round")
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--sizes", nargs="*", default=[s[0] for s in SIZES], choices=[s[0] for s in SIZES])
    ap.add_argument("--workdir")
    ap.add_argument("--gil-opens", action="store_true", help="also 'shadefs, OPEN under the GIL' "
                    "(SHADEFS_FUSE_GIL_OPENS=1: the compiled loop hands every OPEN to Python)")
    ap.add_argument("--no-python-loop", action="store_true", help="skip the 'shadefs, Python loop' case")
    ap.add_argument("--readers", type=int, nargs="*", default=[], metavar="N",
                    help="also 'shadefs, N reader threads' (--fuse-readers N) for each N")
    ap.add_argument("--readers-session", action="store_true",
                    help="also the single-threaded native server and shadefs (--foreground) in this script's "
                         "session, i.e. the readers' scheduling group")
    ap.set_defaults(rounds=3)


def run(a, bench):
    work = os.path.abspath(a.workdir or tempfile.mkdtemp(prefix="shadefs-hitnative-"))
    os.makedirs(work, exist_ok=True)
    tmp = None
    # (label, environment, extra mount arguments)
    shadefs_cases = [("shadefs", env_with(SHADEFS_FUSE_PYTHON_LOOP="0"), [])]
    for n in a.readers:
        shadefs_cases.append((f"shadefs, {n} reader thread{'s' if n != 1 else ''}",
                              env_with(SHADEFS_FUSE_PYTHON_LOOP="0"), ["--fuse-readers", str(n)]))
    if a.gil_opens:
        shadefs_cases.append(("shadefs, OPEN under the GIL", env_with(SHADEFS_FUSE_PYTHON_LOOP="0",
                                                                  SHADEFS_FUSE_GIL_OPENS="1"), []))
    if not a.no_python_loop:
        shadefs_cases.append(("shadefs, Python loop", env_with(SHADEFS_FUSE_PYTHON_LOOP="1"), []))
    if a.baseline:
        tmp, rev = bench.baseline()
        shadefs_cases.append((f"shadefs {rev} (baseline)", dict(os.environ, PYTHONPATH=tmp), []))
    print(f"load at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    os.chdir(work)  # ``python -m shadefs`` puts the cwd first on sys.path: never this tree's package by accident
    try:
        for label, nfiles, size in SIZES:
            if label not in a.sizes:
                continue
            src = os.path.join(work, f"src{size}")
            rel = make_tree(src, nfiles, size)
            mnts: Dict[str, str] = {}
            natives, daemons, pids = [], {}, {}
            try:
                if a.ramfs:
                    anchors = [("native libfuse3 (mt)", [], True), ("native libfuse3 (single)", ["-s"], True),
                               ("native libfuse3 (single, no-open)", ["-s", "-n"], True)]
                    if a.readers_session:
                        anchors.append(("native libfuse3 (single), readers' session", ["-s"], False))
                    for name, flags, own in anchors:
                        m = os.path.join(work, f"m{len(mnts)}-{size}")
                        os.makedirs(m, exist_ok=True)
                        natives.append((m, subprocess.Popen([a.ramfs, src, m] + flags, stdout=subprocess.DEVNULL,
                                                            stderr=subprocess.DEVNULL, start_new_session=own)))
                        if not wait_for(lambda: os.path.ismount(m), timeout=20):
                            raise RuntimeError(f"{a.ramfs} did not mount {m}")
                        mnts[name] = m
                        pids[name] = natives[-1][1].pid
                for name, env, extra in shadefs_cases:
                    m = os.path.join(work, f"m{len(mnts)}-{size}")
                    daemons[name] = Mount(src, m, ["--ram-cache", "100%"] + extra, env=env,
                                          log_file=os.path.join(work, f"m{len(mnts)}-{size}.log")).start()
                    mnts[name] = m
                    pids[name] = daemons[name].pid
                if a.readers_session:  # the daemon in the foreground: this script's session
                    name = "shadefs, readers' session"
                    m = os.path.join(work, f"m{len(mnts)}-{size}")
                    os.makedirs(m, exist_ok=True)
                    log_file = os.path.join(work, f"m{len(mnts)}-{size}.log")
                    fg = subprocess.Popen(SHADEFS + ["mount", src, m, "--ram-cache", "100%",
                                           "--foreground", "--log-file", log_file],
                                          env=env_with(SHADEFS_FUSE_PYTHON_LOOP="0"),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    d = Mount(src, m, log_file=log_file)
                    d.pid = fg.pid
                    daemons[name] = d
                    if not wait_for(lambda: os.path.ismount(m), timeout=60):
                        raise RuntimeError(f"shadefs --foreground did not mount {m}")
                    mnts[name] = m
                    pids[name] = fg.pid
                res: Dict[str, list] = {k: [] for k in ["direct"] + list(mnts)}
                cpu = {k: 0.0 for k in pids}
                switches = {k: 0 for k in pids}
                opens = {k: 0 for k in pids}
                with mp.get_context("fork").Pool(a.procs) as pool:
                    for m in mnts.values():  # warm: every file resident, kernel caches filled; the second
                        timed(pool, m, rel, a.procs, 2)  # pass is shadefs' first RAM hit, which hands it to C
                    timed(pool, src, rel, a.procs, 1)
                    before = {k: d.stats() for k, d in daemons.items()}
                    for _ in range(a.rounds):
                        res["direct"].append(timed(pool, src, rel, a.procs, a.reps))
                        for k, m in mnts.items():
                            c0, x0 = proc_cpu_s(pids[k]), ctx_switches(pids[k])
                            res[k].append(timed(pool, m, rel, a.procs, a.reps))
                            if k in pids:
                                cpu[k] += proc_cpu_s(pids[k]) - c0
                                switches[k] += ctx_switches(pids[k]) - x0
                                opens[k] += len(rel) * a.reps
                    for k, d in daemons.items():
                        s = d.stats()
                        got = s["hits"]["ram"] - before[k]["hits"]["ram"]
                        if got != opens[k] or s["opens"] - before[k]["opens"] != opens[k]:
                            raise RuntimeError(f"{k}: {got} RAM hits for {opens[k]} timed opens ({s})")
            finally:
                for k, d in daemons.items():
                    d.umount(exit_timeout=15)
                for m, p in natives:
                    subprocess.run(["fusermount3", "-u", m], capture_output=True)
                    try:
                        p.wait(10)
                    except subprocess.TimeoutExpired:
                        p.kill()
            d = sorted(res["direct"])[a.rounds // 2]
            print(f"\n{label} files, {a.procs} readers, median of {a.rounds} rounds "
                  f"(load {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
            print("| case | files/s | x direct | server CPU us per open | server context switches per open |\n"
                  "|---|--:|--:|--:|--:|")
            print(f"| direct (page cache) | {d:,.0f} | 1.00 | | |")
            for k in mnts:
                v = sorted(res[k])[a.rounds // 2]
                c = f"{cpu[k] / opens[k] * 1e6:.1f}"
                x = "-" if k.endswith("(mt)") else f"{switches[k] / opens[k]:.2f}"  # (its workers come and go)
                print(f"| {k} | {v:,.0f} | {v / d:.2f} | {c} | {x} |", flush=True)
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nload at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0
