"""Where the daemon's CPU per open goes: RAM hit vs NVMe hit (kernel front end), counted per open.

Regime: **per open** (every timed open checked to be the outcome named; the files' pages warm on
purpose). Limit: the system calls a FUSE open costs the kernel, counted per open (strace).

One reader process opens, reads to EOF and closes every file of a dataset in a loop (``os.open`` /
``os.read(256 KiB)`` / ``os.close``) against one mount at a time; per case, for one timed run:

- the daemon's user and system CPU per open (``/proc/PID/stat``) and its context switches per open
  (voluntary + involuntary, summed over its threads in ``/proc/PID/task/*/status``): load on the shared
  machine inflates CPU time, the counts are exact;
- the daemon's system calls per open, by name (``strace -c -f`` attached for a second, shorter run:
  strace slows every call, so only the counts are reported, not its times);
- with ``--py-spy`` (if the ``py-spy`` binary is on PATH; not a dependency of shadefs), the daemon's
  Python time per open by function (``py-spy record --gil --nonblocking --format raw``: only samples of
  the thread holding the GIL, i.e. running Python; a system call releases the GIL, so its time is not in
  these figures), as microseconds per open: samples x (1 / rate) / opens, inclusive of callees, and by
  line (the innermost frame);
- with ``--perf`` (if ``perf`` is installed and allowed), the daemon's user and system CPU per open split
  from ``perf record -F 4999 -g -p PID`` (cpu-clock samples, all threads): system time by the system
  call it is spent in (``readv``/``writev`` on /dev/fuse, ``openat``, ``close``, ``futex``, ...; a
  wake-up on return to user mode counts for its call), user time by native function (the interpreter's
  loop, allocation, dict lookups, sha256 in libcrypto, ...). Python functions are not visible to perf on
  CPython 3.11 (no perf trampoline): ``--py-spy`` splits the interpreter's share.

Cases (``--cases``): ``ram`` (``--ram-cache 100%``), ``nvme-first`` (``--ram-cache 0 --disk-cache DIR
--verify-entries first-hit``, passthrough), ``nvme-every`` (the default ``every-open``), ``nvme-nopt``
(first-hit, ``--no-passthrough``), ``miss`` (``--ram-cache 0``, no disk tier: every open a miss of the
source, whose files sit in the page cache). Every case uses ``--policy static``, every mount's counters are
checked to show the outcome named for every timed open, and each pass must return the exact bytes.

``--baseline REV`` mounts the same cases with the ``shadefs`` package of git revision REV as well (its
daemon started with that package on PYTHONPATH). Every case of every side is mounted at once and timed in
a rotating order, round after round (``--rounds`` passes each, the median reported), so load that comes
and goes on a shared machine hits every case alike; the summary gives each side's NVMe-hit / RAM-hit
opens/s ratio.

    python -m shadefs.bench open_cost --files 500 --size 110000 --seconds 4 --py-spy --perf
    python -m shadefs.bench open_cost --cases ram nvme-first --procs 8 --baseline main --rounds 3
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

from shadefs.bench.runner import env_with
from shadefs.testing import Mount, ctx_switches, shadefs, strace_counts, unmount
from shadefs.testing.datasets import random_tree


CASES = {
    "ram": ["--ram-cache", "100%"],
    "nvme-first": ["--ram-cache", "0", "--verify-entries", "first-hit"],
    "nvme-every": ["--ram-cache", "0", "--verify-entries", "every-open"],
    "nvme-nopt": ["--ram-cache", "0", "--verify-entries", "first-hit", "--no-passthrough"],
    "miss": ["--ram-cache", "0"],
}
OUTCOME = {"ram": "ram", "nvme-first": "disk", "nvme-every": "disk", "nvme-nopt": "disk", "miss": "miss"}


def cpu(pid: int) -> Tuple[float, float]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tck, int(fields[12]) / tck



def stats(mnt: str) -> dict:
    import json
    return json.loads(shadefs("stats", mnt, "--json").stdout)


# how a reader reads one file: os.open/os.read/os.close (no isatty), or Python's buffered open() as
# torchvision's default loader does (one isatty() per open: a FUSE_IOCTL request)
_RAW_READ = (
    "        fd = os.open(p, os.O_RDONLY)\n"
    "        got = 0\n"
    "        while True:\n"
    "            b = os.read(fd, 262144)\n"
    "            if not b: break\n"
    "            got += len(b)\n"
    "        os.close(fd)\n")
_BUFFERED_READ = (
    "        with open(p, 'rb') as f:\n"
    "            got = len(f.read())\n")
BUFFERED = False  # --buffered-open


def read_loop(mnt: str, files: List[Tuple[str, int]], seconds: float, procs: int = 1) -> int:
    """``procs`` reader processes (disjoint shards) open, read whole and close their files in order until
    ``seconds`` passed; returns the opens done."""
    code = (
        "import os, sys, time\n"
        "mnt, seconds = sys.argv[1], float(sys.argv[2])\n"
        "files = [l.split() for l in sys.stdin.read().splitlines()]\n"
        "paths = [(os.path.join(mnt, p), int(s)) for p, s in files]\n"
        "n = 0; end = time.monotonic() + seconds\n"
        "while time.monotonic() < end:\n"
        "    for p, s in paths:\n"
        + (_BUFFERED_READ if BUFFERED else _RAW_READ) +
        "        assert got == s, (p, got, s)\n"
        "        n += 1\n"
        "print(n)\n")
    ps = []
    for i in range(procs):
        shard = files[i * len(files) // procs:(i + 1) * len(files) // procs]
        p = subprocess.Popen([sys.executable, "-c", code, mnt, str(seconds)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        p.stdin.write("\n".join(f"{q} {s}" for q, s in shard))
        p.stdin.close()
        ps.append(p)
    n = 0
    for p in ps:
        out = p.stdout.read()
        if p.wait() != 0:
            raise SystemExit("a reader failed")
        n += int(out.strip())
    return n


def pyspy_profile(pid: int, run, seconds: float, rate: int = 1000) -> Dict[str, float]:
    """Python time per open by function: ``{"incl NAME": us, "line FRAME": us, "total": us}`` from the
    samples of the GIL holder (``--gil``) during ``run()`` (which returns the opens it made)."""
    out = tempfile.mktemp(prefix="shadefs-pyspy-", suffix=".txt")
    p = subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--format", "raw", "--output", out, "--gil",
                          "--rate", str(rate), "--nonblocking", "--duration", str(int(seconds) + 2)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    opens = run()
    p.wait(60)  # it writes its file when the duration is over
    incl: Dict[str, int] = collections.Counter()
    line_: Dict[str, int] = collections.Counter()
    total = 0
    with open(out) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            if not stack:
                continue
            n = int(n)
            total += n
            frames = [re.sub(r" \((?:.*/)?([^/:]+):(\d+)\)$", r" (\1:\2)", fr) for fr in stack.split(";")]
            seen = set()
            for fr in frames:
                fn = re.sub(r" \(.*\)$", "", fr)
                if fn not in seen:
                    seen.add(fn)
                    incl[fn] += n
            line_[frames[-1]] += n
    os.unlink(out)
    per = 1e6 / rate / max(1, opens)
    res = {"total": total * per}
    res.update({"incl " + k: v * per for k, v in incl.most_common(40) if not k.startswith("Thread.")})
    res.update({"line " + k: v * per for k, v in line_.most_common(25)})
    return res


PERF_SYSCALLS = [("do_readv", "readv"), ("do_writev", "writev"), ("sys_openat", "openat"), ("sys_close", "close"),
                 ("sys_futex", "futex"), ("sys_ioctl", "ioctl"), ("sys_pread64", "pread64"), ("sys_poll", "poll"),
                 ("sys_newfstat", "fstat")]


def perf_profile(pid: int, run) -> Optional[Dict[str, float]]:
    """The daemon's CPU per open from ``perf record -F 4999 -g`` during ``run()`` (returns its opens):
    ``{"user": us, "sys": us, "sys CALL": us, "user FUNCTION": us}``; None if perf cannot record."""
    out = tempfile.mktemp(prefix="shadefs-perf-", suffix=".data")
    p = subprocess.Popen(["perf", "record", "-F", "4999", "-g", "-p", str(pid), "-o", out],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    opens = run()
    p.send_signal(2)
    p.wait(60)
    if not os.path.exists(out):
        return None
    text = subprocess.run(["perf", "script", "-i", out, "-F", "period,ip,sym,dso"], capture_output=True,
                          text=True).stdout
    os.unlink(out)
    res: Dict[str, float] = collections.Counter()
    for block in text.split("\n\n"):
        lines = [ln.strip() for ln in block.strip().splitlines() if ln.strip()]
        if len(lines) < 2:
            continue
        period = int(lines[0].split()[0])                 # ns of cpu-clock
        frames = [ln.split(None, 1)[1] if " " in ln else ln for ln in lines[1:]]
        if "[kernel.kallsyms]" in frames[0]:
            res["sys"] += period
            call = next((name for key, name in PERF_SYSCALLS for fr in frames if key in fr), None)
            res["sys " + (call or "other (interrupts, scheduler)")] += period
        else:
            res["user"] += period
            m = re.match(r"([^+ ]+)\S* \((?:.*/)?([^/)]+)\)", frames[0])
            fn, dso = (m.group(1), m.group(2)) if m else (frames[0], "?")
            if "libpython" in dso:
                fn = "_PyEval_EvalFrameDefault (the interpreter loop)" if fn == "_PyEval_EvalFrameDefault" \
                    else "libpython: other (objects, dicts, calls, GIL)"
            elif "libcrypto" in dso or "_hashlib" in dso:
                fn = "sha256 (libcrypto, _hashlib)"
            elif "libc.so" in dso:
                fn = "libc (syscall wrappers, malloc, memcpy)"
            else:
                fn = "other libraries (" + dso.split(".")[0] + ")"
            res["user " + fn] += period
    return {k: v / 1000 / max(1, opens) for k, v in sorted(res.items(), key=lambda kv: -kv[1])}


def timed_run(case: str, mnt: str, pid: int, files, seconds: float, procs: int) -> dict:
    """One timed pass: opens/s and the daemon's CPU and context switches per open, every open checked to
    be counted as the case's outcome."""
    before = stats(mnt)
    u0, s0 = cpu(pid)
    c0 = ctx_switches(pid)
    t0 = time.monotonic()
    n = read_loop(mnt, files, seconds, procs)
    wall = time.monotonic() - t0
    u1, s1 = cpu(pid)
    c1 = ctx_switches(pid)
    after = stats(mnt)
    count = (lambda st: st["misses"]) if OUTCOME[case] == "miss" else (lambda st: st["hits"][OUTCOME[case]])
    got = count(after) - count(before)
    if got != n or after["opens"] - before["opens"] != n:
        raise SystemExit(f"{case}: {n} opens timed, {got} counted as {OUTCOME[case]}")
    return {"opens": n, "opens_s": n / wall, "user_us": (u1 - u0) / n * 1e6, "sys_us": (s1 - s0) / n * 1e6,
            "ctx": (c1 - c0) / n, "load": os.getloadavg()[0]}


def report(row: dict, procs: int) -> None:
    print(f"{row['side']}: {row['case']}, {row['threads']} reader threads, {procs} readers: {row['opens_s']:,.0f} "
          f"opens/s, daemon user {row['user_us']:.0f} us + sys {row['sys_us']:.0f} us per open, "
          f"{row['ctx']:.2f} context switches per open (load {row['load']:.1f})", flush=True)
    if "syscalls" in row:
        print("  syscalls per open: " + ", ".join(f"{k} {v:.2f}" for k, v in row["syscalls"].items()
                                                 if v >= 0.05), flush=True)
    if row.get("perf"):
        print(f"  perf, us per open (load {os.getloadavg()[0]:.1f}):", flush=True)
        for k, v in row["perf"].items():
            if v >= 0.1:
                print(f"    {v:6.1f}  {k}", flush=True)
    if row.get("pyspy"):
        print(f"  py-spy --gil, Python us per open (load {os.getloadavg()[0]:.1f}):", flush=True)
        for k, v in row["pyspy"].items():
            if v >= 0.2:
                print(f"    {v:6.1f}  {k}", flush=True)


def summary(rows: List[dict], procs: int) -> None:
    """NVMe hit / RAM hit (opens/s) per side and reader-thread count, against the >= 0.8x target."""
    by = {(r["side"], r["threads"], r["case"]): r for r in rows}
    for (side, threads, case), r in sorted(by.items()):
        ram = by.get((side, threads, "ram"))
        if case == "ram" or ram is None:
            continue
        print(f"{side}, {threads} reader threads, {procs} readers: {case} / RAM hit = "
              f"{r['opens_s'] / ram['opens_s']:.2f}x opens/s ({r['opens_s']:,.0f} / {ram['opens_s']:,.0f}); "
              f"daemon CPU per open {r['user_us'] + r['sys_us']:.0f} / {ram['user_us'] + ram['sys_us']:.0f} us",
              flush=True)


#: the runner's common options this benchmark honours
COMMON = ('rounds', 'baseline')


def add_arguments(ap) -> None:
    ap.add_argument("--files", type=int, default=500)
    ap.add_argument("--size", type=int, default=110_000, help="mean file size, bytes (+-30 %%)")
    ap.add_argument("--seconds", type=float, default=4.0, help="timed run per case")
    ap.add_argument("--cases", nargs="*", choices=list(CASES), default=list(CASES))
    ap.add_argument("--fuse-readers", type=int, nargs="+", default=[2], help="the daemon's reader threads")
    ap.add_argument("--procs", type=int, default=1, help="reader processes")
    ap.add_argument("--py-spy", action="store_true", help="also profile the daemon with py-spy (if installed)")
    ap.add_argument("--perf", action="store_true", help="also split the daemon's user/system CPU with perf")
    ap.add_argument("--no-strace", action="store_true")
    ap.add_argument("--workdir")
    ap.add_argument("--gil-opens", action="store_true", help="also this tree with SHADEFS_FUSE_GIL_OPENS=1 (the "
                    "compiled loop hands every OPEN to Python, as before RAM hits were answered in C)")
    ap.add_argument("--python-loop", action="store_true", help="also this tree with SHADEFS_FUSE_PYTHON_LOOP=1 "
                    "(the Python reader loop where the compiled one is built), side by side")
    ap.add_argument("--buffered-open", action="store_true", help="readers use Python's buffered open(p, 'rb') "
                    "(one isatty(), i.e. one FUSE_IOCTL, per open) instead of os.open/os.read")


def run(a, bench):
    global BUFFERED
    BUFFERED = a.buffered_open
    work = os.path.abspath(a.workdir or tempfile.mkdtemp(prefix="shadefs-opencost-"))
    os.makedirs(work, exist_ok=True)
    src = os.path.join(work, f"src-{a.size}")
    files = random_tree(src, a.files, a.size, seed=12)
    print(f"{a.files} files of ~{a.size} B; load {os.getloadavg()}", flush=True)
    rows = []
    sides = [("this tree", env_with(SHADEFS_FUSE_PYTHON_LOOP="0"))]
    tmp = None
    if a.baseline:
        tmp, rev = bench.baseline()
        sides.insert(0, (f"baseline {rev}", env_with(PYTHONPATH=tmp)))
    if a.gil_opens:
        sides.append(("this tree, OPEN under the GIL", env_with(SHADEFS_FUSE_PYTHON_LOOP="0",
                                                                SHADEFS_FUSE_GIL_OPENS="1")))
    if a.python_loop:
        sides.append(("this tree, Python loop", env_with(SHADEFS_FUSE_PYTHON_LOOP="1")))
    os.chdir(work)  # ``python -m shadefs`` puts the cwd first on sys.path: never this tree's package by accident
    try:
        for nthreads in a.fuse_readers:
            # every case and side mounted at once and timed in rotation, round after round: load that comes and
            # goes on a shared machine hits every case alike, so their ratios (NVMe hit / RAM hit) hold
            mounted = []
            try:
                for case in a.cases:
                    for k, (label, env) in enumerate(sides):
                        mnt = os.path.join(work, f"mnt-{case}-{k}")
                        cache = os.path.join(work, f"cache-{case}-{k}")
                        shutil.rmtree(cache, ignore_errors=True)
                        opts = (["--policy", "static", "--fuse-impl", "kernel", "--fuse-readers", str(nthreads)]
                                + CASES[case])
                        if case not in ("ram", "miss"):  # twice the files' bytes and 64 MiB: the budget
                            # counts device bytes and a slack for packed segments; 100 % would leave files out
                            budget = 2 * sum(s for _, s in files) + (64 << 20)
                            opts += ["--disk-cache", cache, "--disk-cache-size", str(budget)]
                        m = Mount(src, mnt, opts, log_file=os.path.join(work, f"{case}-{k}.log"), env=env).start()
                        mounted.append((case, label, mnt, m))
                        read_loop(mnt, files, 0.01)     # one pass: fills the tier
                        read_loop(mnt, files, 0.01)     # warm: every open the outcome named
                timed: Dict[Tuple[str, str], list] = collections.defaultdict(list)
                for rnd in range(a.rounds):
                    order = mounted[rnd % len(mounted):] + mounted[:rnd % len(mounted)]  # a rotating order
                    for case, label, mnt, m in order:
                        timed[case, label].append(timed_run(case, mnt, m.pid, files, a.seconds, a.procs))
                for case, label, mnt, m in mounted:
                    runs = sorted(timed[case, label], key=lambda r: r["opens_s"])
                    row = dict(runs[len(runs) // 2], case=case, threads=nthreads, side=label)   # the median
                    if not a.no_strace and shutil.which("strace"):
                        box = []
                        counts = strace_counts(m.pid, lambda: box.append(read_loop(mnt, files, 1.5, a.procs)))
                        row["syscalls"] = {k: v / box[0] for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}
                    if a.py_spy and shutil.which("py-spy"):
                        row["pyspy"] = pyspy_profile(m.pid, lambda: read_loop(mnt, files, a.seconds, a.procs),
                                                     a.seconds)
                    if a.perf and shutil.which("perf"):
                        row["perf"] = perf_profile(m.pid, lambda: read_loop(mnt, files, a.seconds, a.procs))
                    rows.append(row)
                    report(row, a.procs)
            finally:
                for case, label, mnt, m in mounted:
                    unmount(mnt, m.pid, exit_timeout=15)
        summary(rows, a.procs)
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"end load {os.getloadavg()}")
    return 0
