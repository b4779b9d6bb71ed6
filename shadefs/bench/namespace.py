"""Namespace cost at 1M+ files: daemon RSS per file, scan time, restart time from the snapshot.

Regime: **counts** (bytes per file in the daemon; scan times with the source's metadata warm).

For each N, builds (once, kept with ``--keep``) a source of N empty files, 1000 per directory, with
ImageNet-like names (``n01440764/n01440764_10000.JPEG``), under ``--workdir``; with ``--bind K`` the
tree is K bind mounts of one N/K-file tree instead (N distinct paths over N/K inodes: creating 10M
files takes an hour on a shared disk). Then, side by side in one run:

- ``find SOURCE -printf '%s %T@'``: the same ``stat`` of every file in C, the physical floor of a scan
  (page cache warm: it runs first and warms it);
- the scan in this process (``Namespace.scan``): wall and CPU seconds, RSS grown, bytes of its arrays;
- per-call costs of ``lookup``, ``child``, ``attr``, ``path`` (CPU microseconds, 20k calls);
- the daemon through the real CLI with a disk tier (so it persists the snapshot): ``shadefs mount``
  wall time and daemon RSS (VmRSS) after a scan, then after a restart from the snapshot; and the RSS of a
  daemon serving a 1-file source (the fixed cost), so (RSS - that) / N is the per-file cost; with
  ``--baseline REV`` the daemon of commit REV too (its whole package, the runner's baseline, run through
  PYTHONPATH), interleaved with this tree's for ``--daemon-rounds`` rounds (``--daemon-only`` skips the
  in-process scan).

The machine is shared: the load average is printed beside every timed figure.

Reproduce: ``python -m shadefs.bench namespace --files 1000000 --workdir /tmp/shadefs-bench-ns --keep``
and ``--files 1000000 10000000:10``; before/after at the daemon level:
``--files 1000000 --workdir /tmp/fe2-ns --keep --daemon-only --baseline main --daemon-rounds 2``; ``--write-doc`` rewrites the "Namespace" section of
docs/results/namespace.md (the rows of every N measured in this run).
"""
from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time

from shadefs.bench.runner import ROOT
from shadefs.testing import docsection
from shadefs.testing.mounts import Mount

PER_DIR = 1000


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def rss_of(pid) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_of(pid) -> float:
    """CPU seconds of process ``pid`` and of its children it has reaped (user + system; the scan child
    and the helper processes of a scan), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def build_tree(root: str, n: int) -> None:
    """N empty files, PER_DIR per directory (idempotent: a finished tree has a marker file beside it)."""
    done = root + ".done"
    if os.path.exists(done):
        return
    t0 = time.monotonic()
    for d in range((n + PER_DIR - 1) // PER_DIR):
        syn = f"n{1440764 + d * 7919:08d}"
        dp = os.path.join(root, syn)
        os.makedirs(dp, exist_ok=True)
        for i in range(min(PER_DIR, n - d * PER_DIR)):
            os.close(os.open(os.path.join(dp, f"{syn}_{i + 10000}.JPEG"), os.O_CREAT | os.O_WRONLY, 0o644))
    open(done, "w").close()
    print(f"built {root}: {n} files in {time.monotonic() - t0:.0f} s", flush=True)


def mounted(path: str) -> bool:
    """Is ``path`` a mount point? (``os.path.ismount`` misses bind mounts within one file system.)"""
    return subprocess.run(["mountpoint", "-q", path]).returncode == 0


def bind_tree(root: str, part: str, k: int) -> None:
    os.makedirs(root, exist_ok=True)
    for i in range(k):
        p = os.path.join(root, f"part{i:02d}")
        os.makedirs(p, exist_ok=True)
        if not mounted(p):
            subprocess.run(["mount", "--bind", part, p], check=True)


def unbind(root: str, k: int) -> None:
    for i in range(k):
        p = os.path.join(root, f"part{i:02d}")
        if mounted(p):
            subprocess.run(["umount", p], check=True)


def timed(cmd) -> tuple:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


REF_CODE = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from shadefs_ref.backends.posix import PosixBackend
from shadefs_ref.namespace import Namespace
def rss():
    return int([l for l in open("/proc/self/status") if l.startswith("VmRSS:")][0].split()[1]) * 1024
before = rss()
t0, c0 = time.monotonic(), time.process_time()
ns = Namespace(PosixBackend(sys.argv[2]).walk())
wall, cpu = time.monotonic() - t0, time.process_time() - c0
paths = [ns.paths[i] for i in range(0, ns.num_files, max(1, ns.num_files // 20000))]
c = time.process_time()
for p in paths:
    ns.lookup(p)
lookup = (time.process_time() - c) / len(paths) * 1e6
print(json.dumps({"wall": wall, "cpu": cpu, "grown": rss() - before, "files": ns.num_files, "lookup": lookup}))
"""


REF_SCAN_CODE = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from shadefs_ref.backends.posix import PosixBackend
from shadefs_ref.namespace import Namespace
t0, c0 = time.monotonic(), time.process_time()
ns = Namespace.scan(PosixBackend(sys.argv[2], scan_workers=1))
print(json.dumps({"wall": time.monotonic() - t0, "cpu": time.process_time() - c0, "files": ns.num_files}))
"""


def ref_package(rev: str, work: str) -> str:
    """Commit ``rev``'s namespace.py, fsutil.py (where it has one) and backends/ as package shadefs_ref."""
    pkg = os.path.join(work, f"ref-{rev}")
    if not os.path.isdir(os.path.join(pkg, "shadefs_ref")):
        os.makedirs(pkg, exist_ok=True)
        paths = [p for p in ("shadefs/__init__.py", "shadefs/namespace.py", "shadefs/fsutil.py", "shadefs/backends")
                 if subprocess.run(["git", "-C", ROOT, "cat-file", "-e", f"{rev}:{p}"]).returncode == 0]
        tar = subprocess.run(["git", "-C", ROOT, "archive", rev, *paths], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", pkg], input=tar, check=True)
        os.rename(os.path.join(pkg, "shadefs"), os.path.join(pkg, "shadefs_ref"))
    return pkg


def reference(rev: str, src: str, work: str, code: str = REF_CODE) -> dict:
    """The namespace of commit ``rev`` (its namespace.py and backends/, as package shadefs_ref), scanning
    ``src`` in a fresh process: the "before" of this run."""
    import json

    pkg = ref_package(rev, work)
    r = subprocess.run([sys.executable, "-c", code, pkg, src], capture_output=True, text=True, check=True)
    out = json.loads(r.stdout)
    out["load"] = load()
    return out


def in_process(src: str, n: int) -> dict:
    """Scan in this process; returns seconds, RSS growth and per-call costs."""
    from shadefs.backends.posix import PosixBackend
    from shadefs.namespace import Namespace

    before = rss_of(os.getpid())
    t0, c0 = time.monotonic(), time.process_time()
    ns = Namespace.scan(PosixBackend(src))
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    grown = rss_of(os.getpid()) - before
    arrays = len(ns._blob) + sum(getattr(ns, a).nbytes for a in ns._ARRAYS)
    assert ns.num_files == n, (ns.num_files, n)
    step = max(1, n // 20000)
    fids = list(range(0, n, step))
    paths = [ns.path(i) for i in fids]
    pairs = [(ns.parent(i), p.rsplit("/", 1)[1]) for i, p in zip(fids, paths)]
    costs = {}
    for name, fn, args in (("lookup", ns.lookup, paths), ("attr", ns.attr, fids), ("path", ns.path, fids)):
        c = time.process_time()
        for a in args:
            fn(a)
        costs[name] = (time.process_time() - c) / len(args) * 1e6
    c = time.process_time()
    for parent, name in pairs:
        ns.child(parent, name)
    costs["child"] = (time.process_time() - c) / len(pairs) * 1e6
    assert all(ns.lookup(p) == i for i, p in zip(fids[:1000], paths[:1000]))
    out = {"wall": wall, "cpu": cpu, "grown": grown, "arrays": arrays, "load": load(), **costs}
    del ns
    return out


def daemon_runs(src: str, work: str, n: int, side) -> dict:
    """``shadefs mount`` of ``src`` (a scan, then a restart from the snapshot) with the daemon of ``side``
    (a runner Side: this tree or the baseline), run from ``work``: mount-ready wall, the daemon's scan seconds
    and VmRSS 2 s later."""
    cache = os.path.join(work, f"cache-{n}")
    shutil.rmtree(cache, ignore_errors=True)
    mnt = os.path.join(work, f"mnt-{n}")
    args = ["--disk-cache", cache, "--disk-cache-size", "1MiB", "--ram-cache", "0"]
    env = side.env
    out = {}
    here = os.getcwd()
    os.chdir(work)  # python -m puts the working directory first on sys.path
    try:
        for run in ("scan", "snapshot"):
            out[run] = _daemon_run(src, mnt, args, os.path.join(work, f"daemon-{n}-{side.name}-{run}.log"), env,
                                   n, run)
    finally:
        os.chdir(here)
    snap = [os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs if f == "namespace.bin"]
    out["snapshot_bytes"] = os.path.getsize(snap[0]) if snap else 0
    shutil.rmtree(cache, ignore_errors=True)
    return out


def _daemon_run(src, mnt, args, log_file, env, n, run) -> dict:
    m = Mount(src, mnt, args, log_file=log_file, env=env, mount_timeout=1800)
    t0 = time.monotonic()
    m.start()
    try:
        ready = time.monotonic() - t0
        time.sleep(2)
        ns = m.stats()["namespace"]
        assert ns["files"] == n and ns["from_snapshot"] == (run == "snapshot"), ns
        return {"ready": ready, "rss": rss_of(m.pid), "load": load(), "scan_s": ns["scan_seconds"],
                "cpu": cpu_of(m.pid)}
    finally:
        m.umount()


def baseline_rss(work: str) -> int:
    src = os.path.join(work, "one")
    os.makedirs(os.path.join(src, "c"), exist_ok=True)
    open(os.path.join(src, "c", "x.JPEG"), "w").close()
    m = Mount(src, os.path.join(work, "mnt-one"), ["--disk-cache", os.path.join(work, "cache-one"),
                                                   "--disk-cache-size", "1MiB"],
              log_file=os.path.join(work, "daemon-one.log"))
    m.start()
    time.sleep(2)
    rss = rss_of(m.pid)
    m.umount()
    return rss


def _cpu_s() -> float:
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def _walk_py(src: str, stat: bool) -> int:
    """os.scandir over the tree, d_type only (``stat`` False) or one ``DirEntry.stat()`` per file."""
    n, stack = 0, [src]
    while stack:
        with os.scandir(stack.pop()) as it:
            for de in it:
                if de.is_dir(follow_symlinks=False):
                    stack.append(de.path)
                else:
                    if stat:
                        de.stat(follow_symlinks=False)
                    n += 1
    return n


def _processes() -> int:
    """The listing processes a local scan uses by default (PosixBackend ``scan_processes``)."""
    from shadefs.backends import posix

    return min(getattr(posix, "SCAN_PROCESSES", 1), os.cpu_count() or 1)


def _scan(src: str, workers: int) -> int:
    from shadefs.backends.posix import PosixBackend
    from shadefs.namespace import Namespace

    b = PosixBackend(src, scan_workers=workers)
    return Namespace.scan(b).num_files


def floors(src: str, n: int, work: str, ref: str = "", rounds: int = 2, threads=(1,)) -> "docsection.Table":
    """The warm scan against its floors, one after the other on the same tree (dentries and inodes warm):
    C without and with a stat per file (find), Python without and with (os.scandir), then ``rounds``
    times shadefs' scan with each of ``threads`` listing threads (1: the default on a local disk; with the
    default helper processes, which take over after 1 s: PosixBackend ``scan_processes``) and,
    with ``ref``, commit ``ref``'s 1-thread scan in a fresh process right after it (before/after)."""
    def find(fmt):
        subprocess.run(["find", src, "-type", "f", "-printf", fmt], stdout=subprocess.DEVNULL, check=True)
        return n
    cases = [("find -printf '%f' (getdents and d_type, no stat), C", lambda: find("%f\n")),
             ("find -printf '%s %T@ %m %U %G' (one stat per file), C", lambda: find("%s %T@ %m %U %G\n")),
             ("os.scandir, d_type only (no stat), Python", lambda: _walk_py(src, False)),
             ("os.scandir + DirEntry.stat() per file, Python", lambda: _walk_py(src, True))]
    for r in range(rounds):
        for k in threads:
            cases.append((f"Namespace.scan, posix, {k} thread{'s' if k > 1 else ''}"
                          f"{', ' + str(_processes()) + ' processes' if _processes() > 1 else ''}, this tree "
                          f"(round {r + 1})", lambda k=k: _scan(src, k)))
        if ref:
            cases.append((f"Namespace.scan, posix, 1 thread, commit {ref} (round {r + 1}; fresh process)",
                          lambda: reference(ref, src, work, REF_SCAN_CODE)))
    find("%f\n")  # warm
    rows = []
    for label, fn in cases:
        c, t = _cpu_s(), time.monotonic()
        got = fn()
        wall, cpu = time.monotonic() - t, _cpu_s() - c
        if isinstance(got, dict):  # a fresh process's own figures (without its start and imports)
            got, wall, cpu = got["files"], got["wall"], got["cpu"]
        assert got == n, (label, got, n)
        rows.append([label, f"{wall:.2f}", f"{cpu:.2f}", f"{cpu / n * 1e6:.1f}", load()])
        print(rows[-1], flush=True)
    return docsection.Table(f"Warm scan of {n:,} files against its floors (one run, in this order)",
                            ["what", "wall s", "CPU s", "CPU us/file", "load"], rows)


#: the runner's common options this benchmark honours
COMMON = ('rounds', 'baseline', 'write_doc')


def add_arguments(ap) -> None:
    ap.add_argument("--files", nargs="+", default=["1000000"], metavar="N[:K]",
                    help="file counts; N:K serves N files as K bind mounts of one N/K-file tree (root)")
    ap.add_argument("--workdir", default="/tmp/shadefs-bench-ns")
    ap.add_argument("--keep", action="store_true", help="keep the trees for the next run")
    ap.add_argument("--no-daemon", action="store_true", help="only the in-process figures")
    ap.add_argument("--ref", default="362a0bd", metavar="REV",
                    help="also scan with the namespace of commit REV, side by side ('' = skip)")
    ap.add_argument("--section", default="bench_namespace", help="the doc section to write (its markers' name)")
    ap.add_argument("--title", default="Namespace", help="the section's heading")
    ap.add_argument("--floors", action="store_true",
                    help="only the warm scan of the first --files tree against find and os.scandir (and --ref)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1], help="--floors: listing threads (default 1)")
    ap.add_argument("--daemon-rounds", type=int, default=1, help="rounds of the daemon runs (default 1)")
    ap.add_argument("--daemon-only", action="store_true", help="skip the in-process scan (and --ref)")
    ap.set_defaults(rounds=2)


def run(a, bench):
    if a.daemon_only:
        a.ref = ""
    os.makedirs(a.workdir, exist_ok=True)
    if a.floors:
        n = int(a.files[0].partition(":")[0])
        src = os.path.join(a.workdir, f"tree-{n}")
        build_tree(src, n)
        t = floors(src, n, a.workdir, a.ref, a.rounds, a.threads)
        print(t.text(), flush=True)
        if a.write_doc:
            start, end = docsection.markers(a.section)
            body = [start, f"## {a.title}", "",
                    "Reproduce: `" + bench.command + "`", "",
                    t.markdown(), "", end]
            bench.write_results("\n".join(body), a.section)
        return 0
    base = None if a.no_daemon else baseline_rss(a.workdir)
    rows, rows2 = [], []
    for spec in a.files:
        n, _, k = spec.partition(":")
        n, bind = int(n), int(k or 1)
        if bind > 1:
            part = os.path.join(a.workdir, f"tree-{n // bind}")
            build_tree(part, n // bind)
            src = os.path.join(a.workdir, f"bind-{n}")
            bind_tree(src, part, bind)
        else:
            src = os.path.join(a.workdir, f"tree-{n}")
            build_tree(src, n)
        try:
            timed(["find", src, "-printf", "%s %T@\n"])  # warm the page cache
            fwall, fcpu = timed(["find", src, "-printf", "%s %T@\n"])
            floa = load()
            label = f"{n:,}" + (f" ({bind} bind mounts)" if bind > 1 else "")
            if a.ref:
                r = reference(a.ref, src, a.workdir)
                rows.append([f"{label}, before ({a.ref})", f"{fwall:.2f} / {fcpu:.2f}", floa,
                             f"{r['wall']:.2f} / {r['cpu']:.2f}", r["load"], f"{r['grown'] / n:.0f}", "-",
                             f"{r['lookup']:.1f}", "-", "-", "-"])
            if not a.daemon_only:
                p = in_process(src, n)
                rows.append([label, f"{fwall:.2f} / {fcpu:.2f}", floa, f"{p['wall']:.2f} / {p['cpu']:.2f}",
                             p["load"], f"{p['grown'] / n:.0f}", f"{p['arrays'] / n:.0f}", f"{p['lookup']:.1f}",
                             f"{p['child']:.1f}", f"{p['attr']:.2f}", f"{p['path']:.2f}"])
            if base is not None:
                # the --baseline daemon (its whole package) and this tree's, interleaved
                for rnd, side in bench.interleaved(bench.sides(tree="this tree")[::-1], a.daemon_rounds):
                    d = daemon_runs(src, a.workdir, n, side)
                    s, r = d["scan"], d["snapshot"]
                    who = f"{label}, {side.name}" + (f" (round {rnd + 1})" if a.daemon_rounds > 1 else "")
                    rows2.append([who, f"{s['ready']:.2f}", f"{s['scan_s']:.2f}", f"{s['cpu']:.2f}",
                                  f"{s['rss'] / 2**20:.0f}",
                                  f"{(s['rss'] - base) / n:.0f}", s["load"], f"{r['ready']:.2f}",
                                  f"{r['scan_s']:.2f}", f"{r['rss'] / 2**20:.0f}", f"{(r['rss'] - base) / n:.0f}",
                                  r["load"], f"{d['snapshot_bytes'] / n:.0f}"])
                    print(rows2[-1], flush=True)
        finally:
            if bind > 1:
                unbind(src, bind)
            elif not a.keep:
                shutil.rmtree(src, ignore_errors=True)
                os.unlink(src + ".done")
    t1 = docsection.Table(
        "Scan in process (page cache warm)",
        ["files", "find wall / CPU s", "load", "scan wall / CPU s", "load", "RSS grown B/file", "arrays B/file",
         "lookup us", "child us", "attr us", "path us"], rows,
        "find = the same stat() of every file, in C (the floor); costs per call are CPU microseconds.")
    tables = [t1] if rows else []
    if rows2:
        tables.append(docsection.Table(
            "The daemon: shadefs mount with a disk tier, then a restart from the snapshot",
            ["files", "mount ready s", "scan s", "daemon CPU s", "RSS MiB", "B/file", "load", "restart ready s",
             "load s", "RSS MiB", "B/file", "load", "snapshot B/file"], rows2,
            f"B/file = (daemon RSS - {base / 2**20:.0f} MiB, a daemon serving 1 file) / files. "
            "'mount ready' = `shadefs mount` wall time until it returns (the mount serves). 'daemon CPU' = "
            "user + system seconds of the daemon and the scan processes it reaped, 2 s after the mount."))
    for t in tables:
        print(t.text(), flush=True)
        print()
    if a.write_doc:
        start, end = docsection.markers(a.section)
        body = [start, f"## {a.title}", "",
                "Reproduce: `" + bench.command + "`", ""]
        for t in tables:
            body += [t.markdown(), ""]
        body.append(end)
        bench.write_results("\n".join(body), a.section)
    return 0
