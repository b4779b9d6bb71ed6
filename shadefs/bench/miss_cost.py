"""What does a miss cost the daemon (CPU per open, files/s against a direct reader) from a fast source?

The daemon's CPU per open when every open of a pass reaches a fast source.

A tree of ``--files`` random files (``--size`` bytes on average) on tmpfs (``--source-dir``, default
/dev/shm) is the source, so the source itself costs next to nothing and what is measured is the daemon.
``--procs`` reader processes (disjoint shards) open, read whole and close every file once per pass and drop
each file's pages on the same open (``POSIX_FADV_DONTNEED``, :func:`shadefs.testing.regime.read_dropping`'s
regime: the kernel keeps nothing between opens, so every open and every READ reaches the daemon).

Cases, each on a fresh mount (``--policy static``):

- ``miss``: no tier (``--ram-cache 0``): every open a miss, streamed from the source;
- ``miss-passthrough``: the same with ``--source-passthrough untiered``: the daemon opens and checks the
  source file and the kernel reads it (FUSE passthrough), no READ reaches the daemon;
- ``ram-fill``: ``--ram-cache 100%``, the first pass: every open a miss admitted to RAM;
- ``nvme-fill``: ``--ram-cache 0 --disk-cache DIR``, the first pass: every open a miss written to NVMe;
- ``nvme-hit``: the same mount's second pass: every open an NVMe hit (passthrough where the kernel has it).

``--nvme-variants`` adds the NVMe pair on two more mounts: ``packed`` (``--disk-pack-below 256KiB``: the
entries are records in segment files, no file created per fill; a hit is served by the daemon) and
``first-hit`` (``--verify-entries first-hit``: a hit of an entry verified once is not read again).

Per case and pass: the daemon's whole-process CPU per open (``/proc/PID/stat`` utime + stime, every
thread, ended threads included; taken when the daemon is idle again, so a fill's writes behind the
pass count), its context switches per open (voluntary + involuntary, ``/proc/PID/task/*/status``, the
threads alive at the end), the pass's files/s, and the mount's counters, checked to show the outcome the
case names for every open. The direct reader (the same readers on the source itself) gives the files/s
every side is compared with.

Regime: the dropping loader. Physical limit: the direct reader's files/s on the same tree (every figure
is also given as a fraction of it), and one core's 1 / (CPU per open).

``--baseline REV`` (default ``main``) runs every case with the ``shadefs`` package of git revision REV
as well (the runner's baseline: its daemon started with that package on PYTHONPATH), side by side with
the working tree: round after round (``--rounds``, default 3), each round runs the direct reader and
every case of both sides, the order rotated by one each round, so load that comes and goes on a shared machine hits
both alike. Each figure is the median over rounds; the table gives both sides and their ratio
(baseline / tree).

``--split`` adds, for the working tree's side, per case: CPU by thread (``/proc/PID/task/TID/stat``; the
threads are named by the daemon, ``PR_SET_NAME``, where it names them), voluntary context switches per
open, and system calls per open by name (``strace -c -f`` attached for one more pass: strace slows every
call, so only its counts are kept). ``--cpus LIST`` pins the daemons to those CPUs (``taskset -c``).

    python -m shadefs.bench miss_cost --files 3000 --rounds 3
    python -m shadefs.bench miss_cost --files 2000 --rounds 1 --split --cpus 0 --baseline none
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

from shadefs.bench.runner import Side, median as med
from shadefs.testing import Mount, ctx_switches, proc_cpu_s, strace_counts
from shadefs.testing.datasets import random_tree

CASES = ("miss", "miss-passthrough", "ram-fill", "nvme-fill", "nvme-hit")
MOUNT_ARGS = {
    "miss": ["--ram-cache", "0", "--policy", "static"],
    "miss-passthrough": ["--ram-cache", "0", "--source-passthrough", "untiered", "--policy", "static"],
    "ram-fill": ["--ram-cache", "100%", "--policy", "static"],
    "nvme": ["--ram-cache", "0", "--policy", "static"],  # plus --disk-cache DIR
}

# a reader process: open, read whole, drop the pages on the same open, close; prints its opens and bytes
READER = (
    "import os, sys, time\n"
    "mnt = sys.argv[1]\n"
    "files = [l.split() for l in sys.stdin.read().splitlines()]\n"
    "n = 0\n"
    "t0 = time.monotonic()\n"
    "for p, s in files:\n"
    "    fd = os.open(os.path.join(mnt, p), os.O_RDONLY)\n"
    "    got = 0\n"
    "    while True:\n"
    "        b = os.read(fd, 1 << 20)\n"
    "        if not b: break\n"
    "        got += len(b)\n"
    "    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)\n"
    "    os.close(fd)\n"
    "    assert got == int(s), (p, got, s)\n"
    "    n += 1\n"
    "print(n, t0, time.monotonic())\n")


def read_pass(root: str, files: List[Tuple[str, int]], procs: int) -> Tuple[int, float]:
    """``procs`` readers read every file of ``files`` under ``root`` once; returns (opens, seconds from the
    first reader's first open to the last reader's last close: the readers' start-up is not counted)."""
    ps = []
    for i in range(procs):
        shard = files[i::procs]
        p = subprocess.Popen([sys.executable, "-c", READER, root], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        p.stdin.write("\n".join(f"{q} {s}" for q, s in shard))
        p.stdin.close()
        ps.append(p)
    n, starts, ends = 0, [], []
    for p in ps:
        out = p.stdout.read()
        if p.wait() != 0:
            raise SystemExit(f"a reader of {root} failed")
        k, t0, t1 = out.split()
        n += int(k)
        starts.append(float(t0))
        ends.append(float(t1))
    return n, max(ends) - min(starts)


def idle_cpu(pid: int, settle_s: float = 0.2, limit_s: float = 5.0) -> float:
    """The daemon's CPU seconds once it has stopped working (two readings ``settle_s`` apart agree
    within one clock tick), at most ``limit_s`` later."""
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    end = time.monotonic() + limit_s
    last = proc_cpu_s(pid)
    while True:
        time.sleep(settle_s)
        now = proc_cpu_s(pid)
        if now - last <= tick or time.monotonic() > end:
            return now
        last = now


def user_cpu(pid: int) -> float:
    """User-mode CPU seconds of process ``pid`` (all threads, ended ones included)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[11]) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> Dict[str, float]:
    """CPU seconds by thread name (``comm``; threads of one name summed) of the threads alive now, and
    their system time under ``NAME sys``."""
    out: Dict[str, float] = {}
    tck = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                text = f.read()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tck
        out[name + " sys"] = out.get(name + " sys", 0.0) + int(fields[12]) / tck
    return out


def voluntary(pid: int) -> int:
    """Voluntary context switches of the threads of ``pid`` alive now (a thread that blocks: a wait on a
    lock, a condition, a queue, the GIL, or a system call that sleeps)."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                n += sum(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches:"))
        except OSError:
            pass
    return n


def counts_of(m: Mount) -> Tuple[int, int, int, int]:
    """(opens, misses, RAM hits, disk hits) so far."""
    s = m.stats()
    hits = s.get("hits", {})
    return s["opens"], s["misses"], int(hits.get("ram", 0)), int(hits.get("disk", 0))


def measure(m: Mount, files, procs: int, want: str, split: bool) -> dict:
    """One pass over ``m``: CPU and context switches per open, files/s, the counters' outcome check."""
    before = counts_of(m)
    cpu0, cs0, vol0, user0 = proc_cpu_s(m.pid), ctx_switches(m.pid), voluntary(m.pid), user_cpu(m.pid)
    th0 = thread_cpu(m.pid) if split else {}
    n, secs = read_pass(m.path, files, procs)
    cpu1 = idle_cpu(m.pid)
    cs1, vol1, user1 = ctx_switches(m.pid), voluntary(m.pid), user_cpu(m.pid)
    after = counts_of(m)
    d = [a - b for a, b in zip(after, before)]
    col = {"miss": 1, "ram": 2, "disk": 3}[want]
    if d[0] != n or d[col] != n:
        raise SystemExit(f"{m.path}: {n} opens, counters say opens {d[0]}, misses {d[1]}, RAM hits {d[2]}, "
                         f"disk hits {d[3]}: not every open a {want}")
    r = {"us": (cpu1 - cpu0) * 1e6 / n, "user_us": (user1 - user0) * 1e6 / n, "files_s": n / secs, "ctx": (cs1 - cs0) / n, "vol": (vol1 - vol0) / n}
    if split:
        th1 = thread_cpu(m.pid)
        r["threads"] = {k: (v - th0.get(k, 0.0)) * 1e6 / n for k, v in th1.items() if v - th0.get(k, 0.0) > 0}
    return r


NVME_VARIANTS = {"packed": ["--disk-pack-below", "256KiB"], "first-hit": ["--verify-entries", "first-hit"]}


def run_side(side: Side, src: str, files, procs: int, work: str, split: bool,
             variants: bool = False) -> Dict[str, dict]:
    out: Dict[str, dict] = {}
    for case in ("miss", "miss-passthrough", "ram-fill"):
        args = MOUNT_ARGS[case]
        m = side.mount(src, os.path.join(work, f"mnt-{side.name}-{case}"), args)
        try:
            out[case] = measure(m, files, procs, "miss", split)
            if split:
                out[case]["strace"] = strace_counts(m.pid, lambda: read_pass(m.path, files, procs)) \
                    if case == "miss" else {}
        finally:
            m.umount()
    for variant, extra in [("", [])] + (list(NVME_VARIANTS.items()) if variants else []):
        suffix = f" {variant}" if variant else ""
        disk = os.path.join(work, f"disk-{side.name}")
        shutil.rmtree(disk, ignore_errors=True)
        os.makedirs(disk)
        m = side.mount(src, os.path.join(work, f"mnt-{side.name}-nvme"),
                       MOUNT_ARGS["nvme"] + ["--disk-cache", disk, "--disk-cache-size", "2GiB"] + extra)
        try:
            out["nvme-fill" + suffix] = measure(m, files, procs, "miss", split)
            out["nvme-hit" + suffix] = measure(m, files, procs, "disk", split)
            if split and not variant:
                out["nvme-hit"]["strace"] = strace_counts(m.pid, lambda: read_pass(m.path, files, procs))
        finally:
            m.umount()
            shutil.rmtree(disk, ignore_errors=True)
    return out


#: the runner's common options this benchmark honours
COMMON = ('rounds', 'baseline', 'json')


def add_arguments(p) -> None:
    p.add_argument("--files", type=int, default=3000)
    p.add_argument("--size", type=int, default=110_000, help="mean file size in bytes (+-30 %%)")
    p.add_argument("--procs", type=int, default=4, help="reader processes")
    p.add_argument("--source-dir", default="/dev/shm", help="where the source tree is made (tmpfs)")
    p.add_argument("--split", action="store_true", help="CPU by thread, syscalls per open (the tree's side)")
    p.add_argument("--cpus", help="pin the daemons to these CPUs (taskset -c LIST)")
    p.add_argument("--nvme-variants", action="store_true",
                   help="also the NVMe fill and hit with --disk-pack-below 256KiB, and with --verify-entries first-hit")
    p.set_defaults(rounds=3, baseline="main")


def run(args, bench) -> int:
    src = os.path.join(args.source_dir, f"shadefs-miss-cost-{args.files}-{args.size}")
    files = random_tree(src, args.files, args.size, seed=7)
    total = sum(s for _, s in files)
    work = tempfile.mkdtemp(prefix="shadefs-miss-cost-")
    bench.on_close(lambda: shutil.rmtree(work, ignore_errors=True))
    sides: List[Side] = bench.sides(args.cpus)
    rounds: List[dict] = [{} for _ in range(args.rounds)]
    for r, side in bench.interleaved(["direct", *sides]):
        if side == "direct":
            rounds[r]["direct"] = read_pass(src, files, args.procs)
        else:
            rounds[r][side.name] = run_side(side, src, files, args.procs, work, args.split and side.is_tree,
                                            args.nvme_variants)
    bench.save_json(rounds)
    cases = CASES + (tuple(f"nvme-{k} {v}" for v in NVME_VARIANTS for k in ("fill", "hit"))
                     if args.nvme_variants else ())

    direct = med([n / s for n, s in (rec["direct"] for rec in rounds)])
    bench.regime("dontneed", dataset_bytes=total)
    print(f"{args.files} files x {args.size / 1000:.0f} kB (mean) on tmpfs, {args.procs} reader processes, "
          f"{args.rounds} rounds (medians), daemon CPUs: {args.cpus or 'all'}")
    print(f"direct reader: {direct:,.0f} files/s")
    names = [s.name for s in sides]
    headers = ["case"] + [h for n in names for h in (f"{n} us/open", f"{n} files/s (x direct)", f"{n} ctx/open")]
    if len(names) == 2:
        headers.append(f"CPU {names[1]} / {names[0]}")
    rows = []
    for case in cases:
        cells = [case]
        us = {}
        for n in names:
            us[n] = med([rec[n][case]["us"] for rec in rounds])
            fs = med([rec[n][case]["files_s"] for rec in rounds])
            ctx = med([rec[n][case]["ctx"] for rec in rounds])
            cells += [f"{us[n]:.0f}", f"{fs:,.0f} ({fs / direct:.3f}x)", f"{ctx:.1f}"]
        if len(names) == 2:
            cells.append(f"{us[names[1]] / us[names[0]]:.2f}x")
        rows.append(cells)
    bench.table("daemon CPU per open, files/s, context switches per open (medians over rounds)", headers, rows)
    if args.split:
        print()
        print("split (working tree, last round): CPU us per open by thread (of it system time); voluntary ctx "
              "switches per open; "
              "syscalls per open (strace -c -f, one more pass)")
        last = rounds[-1]["tree"]
        for case in cases:
            c = last[case]
            t = c["threads"]
            th = ", ".join(f"{k} {v:.0f} (sys {t.get(k + ' sys', 0.0):.0f})"
                           for k, v in sorted(t.items(), key=lambda kv: -kv[1]) if not k.endswith(" sys"))
            print(f"- {case}: {c['us']:.0f} us/open = {th}; {c['vol']:.1f} voluntary switches/open")
            if c.get("strace"):
                n = args.files
                sc = ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(c["strace"].items(), key=lambda kv: -kv[1])[:10])
                print(f"  syscalls/open: {sc}")
        print("ceiling of one daemon (medians): user-mode time holds the GIL, so 1 / (user us per open) bounds "
              "the files/s of any number of cores; 1 / (CPU us per open) is one core's files/s, fully busy")
        for case in cases:
            us = med([rec["tree"][case]["us"] for rec in rounds])
            user = med([rec["tree"][case]["user_us"] for rec in rounds])
            print(f"- {case}: user {user:.0f} us/open -> GIL-serial ceiling {1e6 / user:,.0f} files/s; "
                  f"one core {1e6 / us:,.0f} files/s; {os.cpu_count()} cores {os.cpu_count() * 1e6 / us:,.0f} files/s")
    return 0
