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
- ``nvme-hit``: the same mount's second pass: every open an NVMe hit (passthrough where the kernel has it);
- ``ram-hit`` (``--hits``): the ``ram-fill`` mount's second pass: every open a RAM hit (the compiled reader
  loop answers OPEN, READ and RELEASE of a resident file without the GIL where it is built);
- ``prefetch`` (``--hits``): ``--ram-cache 0``, the pass's order announced first as a plan (one epoch, no
  job: it follows every open): every open served from a prefetch (``prefetch.ready`` or ``.late``), the
  file read from the source by the prefetcher ahead of the readers.

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
call, so only its counts are kept). ``--cpus LIST`` pins the daemons to those CPUs (``taskset -c``);
several lists split by ``/`` (``--cpus 0/0,1``, with ``--baseline none``) make one side per list, the working
tree's package pinned each way, interleaved round after round like a baseline.

``--gil`` measures the daemon's serial time: ``py-spy record --gil --idle --nonblocking`` (PyPI ``py-spy``,
the ``bench`` extra; on PATH or beside this Python) samples the daemon during each measured pass at
``--gil-rate`` Hz and keeps only the samples in which one of its threads holds the GIL (py-spy reads the
interpreter's current thread state, which is unset while no thread holds it). GIL-held seconds = samples /
rate; per open, that is the time no other thread of the daemon can run Python, so ``1 / (GIL s per open)``
is one daemon's ceiling in files/s on any number of cores. It is wall time: a holder that waits for a core
or sleeps in a system call with the GIL counts, so it is measured least disturbed with the daemon on a core
of its own. User-mode CPU is printed beside it (the compiled reader loop, copies and hashing run in user
mode without the GIL).

    python -m shadefs.bench miss_cost --files 3000 --rounds 3
    python -m shadefs.bench miss_cost --files 2000 --rounds 1 --split --cpus 0 --baseline none
    python -m shadefs.bench miss_cost --files 3000 --rounds 3 --hits --gil --cpus 0/0,1 --baseline none
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

from shadefs.bench.runner import Side, median as med
from shadefs.testing import Mount, ctx_switches, proc_cpu_s, strace_counts
from shadefs.testing.datasets import random_tree

CASES = ("miss", "miss-passthrough", "ram-fill", "nvme-fill", "nvme-hit")
HIT_CASES = ("ram-hit", "prefetch")  # with --hits
MOUNT_ARGS = {
    "miss": ["--ram-cache", "0", "--policy", "static"],
    "miss-passthrough": ["--ram-cache", "0", "--source-passthrough", "untiered", "--policy", "static"],
    "ram-fill": ["--ram-cache", "100%", "--policy", "static"],
    "prefetch": ["--ram-cache", "0", "--policy", "static"],
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


def counts_of(m: Mount) -> Tuple[int, int, int, int, int]:
    """(opens, misses, RAM hits, disk hits, opens served from a prefetch) so far."""
    s = m.stats()
    hits, pf = s.get("hits", {}), s.get("prefetch", {})
    return (s["opens"], s["misses"], int(hits.get("ram", 0)), int(hits.get("disk", 0)),
            int(pf.get("ready", 0)) + int(pf.get("late", 0)))


def py_spy() -> str:
    """The py-spy executable (PATH, then beside this Python); SystemExit when there is none."""
    exe = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.access(exe, os.X_OK):
        raise SystemExit("--gil needs py-spy (pip install py-spy)")
    return exe


class GilProbe:
    """``py-spy record --gil`` on process ``pid`` from ``start()`` to ``stop()``: the samples (at ``rate``
    Hz) in which a thread of ``pid`` held the GIL. ``stop()`` returns the GIL-held seconds (samples / rate)."""

    def __init__(self, pid: int, rate: int, work: str):
        self.pid, self.rate = pid, rate
        self.out = os.path.join(work, f"gil-{pid}-{time.monotonic_ns()}.txt")
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "GilProbe":
        self.proc = subprocess.Popen([py_spy(), "record", "--gil", "--idle", "--nonblocking", "-r",
                                      str(self.rate), "--format", "raw", "-o", self.out, "-p", str(self.pid)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)  # py-spy attaches (reads the interpreter's layout) before it samples
        if self.proc.poll() is not None:
            raise SystemExit(f"py-spy failed: {self.proc.stderr.read().strip()}")
        return self

    def stop(self) -> float:
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its output and exits
        try:
            err = self.proc.communicate(timeout=30)[1]
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise SystemExit("py-spy did not stop")
        samples = 0
        try:
            with open(self.out) as f:  # raw (collapsed) stacks: "frame;frame;... COUNT"
                samples = sum(int(line.rsplit(" ", 1)[1]) for line in f if line.strip())
        except FileNotFoundError:
            if "Samples: 0" not in err:  # no sample at all writes no file
                raise SystemExit(f"py-spy wrote nothing: {err.strip()}")
        os.unlink(self.out) if os.path.exists(self.out) else None
        return samples / self.rate


def measure(m: Mount, files, procs: int, want: str, split: bool, gil: Optional[Tuple[int, str]] = None,
            before_pass=None) -> dict:
    """One pass over ``m``: CPU and context switches per open, files/s, the counters' outcome check;
    with ``gil`` = (rate, work folder), the daemon's GIL-held microseconds per open (:class:`GilProbe`).
    ``before_pass()`` runs after the first readings (the prefetch case announces its plan there)."""
    before = counts_of(m)
    probe = GilProbe(m.pid, gil[0], gil[1]).start() if gil else None
    cpu0, cs0, vol0, user0 = proc_cpu_s(m.pid), ctx_switches(m.pid), voluntary(m.pid), user_cpu(m.pid)
    th0 = thread_cpu(m.pid) if split else {}
    if before_pass:
        before_pass()
    n, secs = read_pass(m.path, files, procs)
    cpu1 = idle_cpu(m.pid)
    cs1, vol1, user1 = ctx_switches(m.pid), voluntary(m.pid), user_cpu(m.pid)
    gil_s = probe.stop() if probe else None
    after = counts_of(m)
    d = [a - b for a, b in zip(after, before)]
    col = {"miss": 1, "ram": 2, "disk": 3, "prefetch": 4}[want]
    if d[0] != n or d[col] != n:
        raise SystemExit(f"{m.path}: {n} opens, counters say opens {d[0]}, misses {d[1]}, RAM hits {d[2]}, "
                         f"disk hits {d[3]}, from a prefetch {d[4]}: not every open a {want}")
    r = {"us": (cpu1 - cpu0) * 1e6 / n, "user_us": (user1 - user0) * 1e6 / n, "files_s": n / secs, "ctx": (cs1 - cs0) / n, "vol": (vol1 - vol0) / n}
    if gil_s is not None:
        r["gil_us"] = gil_s * 1e6 / n
    if split:
        th1 = thread_cpu(m.pid)
        r["threads"] = {k: (v - th0.get(k, 0.0)) * 1e6 / n for k, v in th1.items() if v - th0.get(k, 0.0) > 0}
    return r


NVME_VARIANTS = {"packed": ["--disk-pack-below", "256KiB"], "first-hit": ["--verify-entries", "first-hit"]}


def announce(m: Mount, files) -> None:
    """Announce one epoch over ``files`` in their order as a plan of no job (it follows every open), and
    wait for the daemon to install it."""
    import numpy as np

    from shadefs.control.client import ControlClient, find_endpoint

    c = ControlClient(find_endpoint(m.path))
    try:
        handle, _ = c.register([p for p, _ in files])
        c.send_plan(handle, 0, 0, [len(files)], np.arange(len(files), dtype=np.uint32))
        end = time.monotonic() + 30
        while c.stats()["prefetch"]["plans_announced"] < 1:
            if time.monotonic() > end:
                raise SystemExit(f"{m.path}: the plan was not installed within 30 s")
            time.sleep(0.02)
    finally:
        c.close()


def run_side(side: Side, src: str, files, procs: int, work: str, split: bool, variants: bool = False,
             hits: bool = False, gil: Optional[Tuple[int, str]] = None) -> Dict[str, dict]:
    out: Dict[str, dict] = {}
    for case in ("miss", "miss-passthrough", "ram-fill"):
        args = MOUNT_ARGS[case]
        m = side.mount(src, os.path.join(work, f"mnt-{side.name}-{case}"), args)
        try:
            out[case] = measure(m, files, procs, "miss", split, gil)
            if hits and case == "ram-fill":
                out["ram-hit"] = measure(m, files, procs, "ram", split, gil)
            if split:
                out[case]["strace"] = strace_counts(m.pid, lambda: read_pass(m.path, files, procs)) \
                    if case == "miss" else {}
        finally:
            m.umount()
    if hits:
        m = side.mount(src, os.path.join(work, f"mnt-{side.name}-prefetch"), MOUNT_ARGS["prefetch"])
        try:
            out["prefetch"] = measure(m, files, procs, "prefetch", split, gil, lambda: announce(m, files))
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
            out["nvme-fill" + suffix] = measure(m, files, procs, "miss", split, gil)
            out["nvme-hit" + suffix] = measure(m, files, procs, "disk", split, gil)
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
    p.add_argument("--cpus", help="pin the daemons to these CPUs (taskset -c LIST); LIST/LIST...: one side "
                   "per list (the working tree's package; with --baseline none)")
    p.add_argument("--nvme-variants", action="store_true",
                   help="also the NVMe fill and hit with --disk-pack-below 256KiB, and with --verify-entries first-hit")
    p.add_argument("--hits", action="store_true", help="also the ram-hit and prefetch cases")
    p.add_argument("--gil", action="store_true", help="GIL-held us per open (py-spy record --gil)")
    p.add_argument("--gil-rate", type=int, default=250, help="py-spy samples per second (--gil)")
    p.set_defaults(rounds=3, baseline="main")


def cpu_sides(cpus: Optional[str]) -> List[Side]:
    """One working-tree :class:`Side` per CPU list of ``--cpus A/B/...`` (named ``cpuA``, commas as ``+``),
    or [] for a single list (or none): then the runner's sides, the tree and the baseline, pinned alike."""
    lists = (cpus or "").split("/")
    if len(lists) < 2:
        return []
    return [Side("cpu" + c.replace(",", "+"), None, c) for c in lists]


def run(args, bench) -> int:
    several = cpu_sides(args.cpus)
    if several and args.baseline not in (None, "none"):
        bench.error("--cpus with several lists compares the working tree with itself: add --baseline none")
    if args.gil:
        py_spy()
    src = os.path.join(args.source_dir, f"shadefs-miss-cost-{args.files}-{args.size}")
    files = random_tree(src, args.files, args.size, seed=7)
    total = sum(s for _, s in files)
    work = tempfile.mkdtemp(prefix="shadefs-miss-cost-")
    bench.on_close(lambda: shutil.rmtree(work, ignore_errors=True))
    sides: List[Side] = several or bench.sides(args.cpus)
    cases = CASES + (HIT_CASES if args.hits else ())
    gil = (args.gil_rate, work) if args.gil else None
    rounds: List[dict] = [{} for _ in range(args.rounds)]
    for r, side in bench.interleaved(["direct", *sides]):
        if side == "direct":
            rounds[r]["direct"] = read_pass(src, files, args.procs)
        else:
            rounds[r][side.name] = run_side(side, src, files, args.procs, work,
                                            args.split and side is sides[0] and side.is_tree,
                                            args.nvme_variants, args.hits, gil)
    bench.save_json(rounds)
    cases = cases + (tuple(f"nvme-{k} {v}" for v in NVME_VARIANTS for k in ("fill", "hit"))
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
        print(f"split ({names[0]}, last round): CPU us per open by thread (of it system time); voluntary ctx "
              "switches per open; "
              "syscalls per open (strace -c -f, one more pass)")
        last = rounds[-1][names[0]]
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
            us = med([rec[names[0]][case]["us"] for rec in rounds])
            user = med([rec[names[0]][case]["user_us"] for rec in rounds])
            print(f"- {case}: user {user:.0f} us/open -> GIL-serial ceiling {1e6 / user:,.0f} files/s; "
                  f"one core {1e6 / us:,.0f} files/s; {os.cpu_count()} cores {os.cpu_count() * 1e6 / us:,.0f} files/s")
    if args.gil:
        rows = []
        for case in cases:
            for n in names:
                g = med([rec[n][case]["gil_us"] for rec in rounds])
                user = med([rec[n][case]["user_us"] for rec in rounds])
                us = med([rec[n][case]["us"] for rec in rounds])
                rows.append([case, n, f"{g:.0f}", f"{user:.0f}", f"{us:.0f}",
                             f"{(1e6 / g if g > 0 else float('inf')):,.0f}", f"{1e6 / us:,.0f}"])
        bench.table("serial time (py-spy --gil, medians over rounds): the ceiling of one daemon on any number of "
                    "cores = 1 / GIL-held s per open; one core's files/s = 1 / CPU s per open",
                    ["case", "side", "GIL us/open", "user us/open", "CPU us/open", "ceiling files/s (1/GIL)",
                     "one core files/s"], rows)
    return 0
