"""Read-path throughput of a shadefs mount: files/s and MB/s per open outcome, FUSE loop and reader count.

Regime: **per open** for hits (pages warm on purpose); misses with ``--no-kernel-cache`` and the
miss files' pages dropped before each round. Limit: ``direct`` (the page cache) and libfuse's loops.

Generates two synthetic datasets on local disk (``--files`` files of ~300 B and of ~110 KB, sizes spread
+-30 %, random content, 500 files per directory) and measures, for 1, 4 and 8 reader *processes* (each
reads a disjoint contiguous shard with ``os.open`` / ``os.read`` until EOF / ``os.close``: no buffered
``open()``, which costs one more FUSE round trip for ``isatty``):

- ``direct``: the source directory itself, page cache warm (the ceiling);
- ``RAM hit``: ``--ram-cache 100%``; every open is served from the RAM tier;
- ``NVMe hit``: ``--ram-cache 0 --disk-cache DIR --disk-cache-size`` twice the files' bytes and 64 MiB;
  every open is a disk-tier hit
  (the cache directory sits on the work directory's disk; its entries are in the page cache, so this
  measures the daemon's path, not the device);
- ``miss``: ``--ram-cache 0 --policy static --no-kernel-cache``; every open reads the source (page cache
  warm; without ``--no-kernel-cache`` a file no tier admits keeps its kernel pages between opens, and a
  repeat pass would not reach the daemon);

each with ``--fuse-loop multi`` (the default) and ``--fuse-loop single``; for RAM hits also with
``--no-kernel-cache`` and with ``--trace FILE``. All cases of one file size are mounted at once and
warmed with one pass; then, per reader count, ``--repeat`` rounds time every case once in a rotating
order (medians reported), so load that comes and goes on a shared machine touches every case alike.
Besides files/s and MB/s it reports the daemon's CPU time per open (from /proc) and, with strace, the
FUSE requests the daemon receives per open. Every mount's counters (``shadefs stats --json``) are
checked to show the outcome claimed (every timed open a RAM hit, a disk hit or a miss), every pass must
return the exact byte count, and a sample of files read through each mount is compared byte for byte
with the source (the run aborts on any difference).

A last experiment shows head-of-line blocking: the source is served by a small latency-injecting FUSE
passthrough (mfusepy, multithreaded, every READ sleeps ``--slow-ms``), shadefs is mounted on top with a
RAM tier that holds exactly half of the files (warmed first), and readers read hits and misses
interleaved (the misses' kernel pages dropped before each round, ``POSIX_FADV_DONTNEED``, so every miss
reaches the slow source). With ``--fuse-loop single`` a hit waits behind whichever miss the loop is serving.

    python -m shadefs.bench read                 # full run (~5 min on 2 cores)
    python -m shadefs.bench read --quick         # ~1 min smoke run
    python -m shadefs.bench read --write-doc     # also rewrite docs/results/read.md "Read path"
                                                           # and docs/img/bench_read.png

``--baseline REV`` also mounts every selected case with the ``shadefs`` package of git revision REV (its
daemon started with that package on PYTHONPATH; rows labelled ``[baseline REV]``), in the same rounds,
so the working tree and the baseline are timed side by side on the same files:

    python -m shadefs.bench read --sizes large --readers 8 --cases ram-kernel nvme-kernel \
        --no-slow --no-hung --baseline main

Only the part of docs/results/read.md between ``<!-- bench_read:start -->`` and
``<!-- bench_read:end -->`` is replaced. Every mount is unmounted in ``finally`` blocks (also on Ctrl-C).
"""
from __future__ import annotations

import datetime
import json
import multiprocessing as mp
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

from shadefs.cmdutil import is_mounted
from shadefs.testing import Mount, ShadefsError, docsection, force_unmount, proc_cpu_s, shadefs, unmount
from shadefs.testing.datasets import random_tree
from shadefs.testing.docsection import Table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC_START, DOC_END = docsection.markers("bench_read")
PER_DIR = 500
READ_CHUNK = 1 << 18   # 256 KiB: one os.read() returns a whole ~110 KB file, the next one EOF
TARGET = 0.3           # hit path with 8 readers >= 0.3 x the direct page-cache rate

_T0 = time.monotonic()


def progress(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


class BenchError(RuntimeError):
    """A check failed (wrong bytes, wrong outcome counters, a mount that does not come up)."""


# -- datasets ---------------------------------------------------------------------------------------------
def make_dataset(root: str, n: int, mean_size: int, seed: int) -> List[Tuple[str, int]]:
    """``n`` files of ``mean_size`` +-30 % random bytes, PER_DIR to a directory (reused if already there)."""
    return random_tree(root, n, mean_size, seed, per_dir=PER_DIR)


# -- reader processes --------------------------------------------------------------------------------------
def _reader_main(conn) -> None:
    """One reader process: read the shard it is sent, report (start, end, bytes, files, latencies)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent cleans up and terminates us
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        root, rels, loops, start_at, want_latency = msg
        try:
            while True:
                d = start_at - time.monotonic()
                if d <= 0:
                    break
                time.sleep(min(d, 0.002))
            lat = []
            nbytes = 0
            t0 = time.monotonic()
            o_rdonly, read, osopen, close, clock = os.O_RDONLY, os.read, os.open, os.close, time.monotonic
            for rel in rels * loops:
                t = clock()
                fd = osopen(root + rel, o_rdonly)
                try:
                    while True:
                        b = read(fd, READ_CHUNK)
                        if not b:
                            break
                        nbytes += len(b)
                finally:
                    close(fd)
                if want_latency:
                    lat.append(clock() - t)
            conn.send((t0, clock(), nbytes, len(rels) * loops, lat))
        except BaseException as e:  # report, keep serving
            conn.send(f"{type(e).__name__}: {e}")


class ReaderPool:
    """``n`` forked reader processes, reused across passes (forked before any mount or thread exists)."""

    def __init__(self, n: int):
        ctx = mp.get_context("fork")
        self.procs, self.conns = [], []
        for _ in range(n):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_reader_main, args=(child,), daemon=True)
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)

    def run(self, root: str, files: Sequence[Tuple[str, int]], readers: int, latency: bool = False,
            loops: int = 1, timeout: float = 600.0) -> dict:
        """One pass over ``files`` below ``root`` by ``readers`` processes (contiguous disjoint shards; each
        reader reads its shard ``loops`` times, so that a fast case runs long enough to be measured).

        Returns files/s, MB/s, wall seconds, opens and (with ``latency``) per-open seconds in ``files`` order.

        Raises:
            BenchError: a reader failed, or the bytes read differ from the file sizes.
        """
        root = root.rstrip("/") + "/"
        n = len(files)
        bounds = [n * i // readers for i in range(readers + 1)]
        shards = [files[bounds[i]:bounds[i + 1]] for i in range(readers)]
        start_at = time.monotonic() + 0.05 + 0.005 * readers
        for conn, shard in zip(self.conns, shards):
            conn.send((root, [rel for rel, _ in shard], loops, start_at, latency))
        results, errors = [], []
        for conn in self.conns[:readers]:
            if not conn.poll(timeout):
                raise BenchError(f"a reader did not finish within {timeout:.0f} s (hung mount?)")
            r = conn.recv()
            (errors if isinstance(r, str) else results).append(r)
        if errors:
            raise BenchError(f"reader failed under {root}: {errors[0]}")
        want = sum(size for _, size in files) * loops
        got = sum(r[2] for r in results)
        if got != want or sum(r[3] for r in results) != n * loops:
            raise BenchError(f"read {got} bytes under {root}, expected {want}")
        wall = max(r[1] for r in results) - start_at
        lat = [x for r in results for x in r[4]]
        return {"files_s": n * loops / wall, "mb_s": want / wall / 1e6, "wall_s": wall, "opens": n * loops,
                "latency": lat}

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 2
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(1)


# -- mounts -----------------------------------------------------------------------------------------------
_FUSERMOUNT = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount"


class Mounts:
    """Every FUSE mount this run made, unmounted in reverse order by :meth:`unmount_all` (idempotent)."""

    def __init__(self):
        self.active: List[Tuple[str, Optional[int], str]] = []  # (mountpoint, daemon pid, kind)
        self.slowfs: Dict[str, subprocess.Popen] = {}

    def mount_shadefs(self, source: str, mnt: str, options: Sequence[str], log_file: str,
                      env: Optional[Dict[str, str]] = None) -> int:
        try:
            pid = Mount(source, mnt, options, log_file=log_file, env=env).start().pid
        except ShadefsError as e:
            raise BenchError(str(e)) from None
        self.active.append((mnt, pid, "shadefs"))
        return pid

    def mount_slowfs(self, source: str, mnt: str, delay_ms: float, stats_file: str, log_file: str) -> None:
        self._spawn_source("_slowfs", [source, mnt, str(delay_ms), stats_file], mnt, log_file,
                           "latency-injecting FUSE did not mount")

    def mount_gatedfs(self, source: str, mnt: str, gate_file: str, log_file: str) -> None:
        """The hung-backend source: opens of files below ``hang/`` block until ``gate_file`` exists."""
        self._spawn_source("_gatedfs", [source, mnt, gate_file], mnt, log_file, "gated FUSE source did not mount")

    def _spawn_source(self, mode: str, args: Sequence[str], mnt: str, log_file: str, failed: str) -> None:
        """Run this script's ``mode`` (a FUSE source serving ``mnt``) as a child, and wait up to 30 s until
        ``mnt`` is mounted; raises BenchError with ``failed`` and the log's tail if it exits or times out."""
        os.makedirs(mnt, exist_ok=True)
        with open(log_file, "w") as log:
            p = subprocess.Popen([sys.executable, "-m", "shadefs.bench.read", mode, *args], stdout=log,
                                 stderr=subprocess.STDOUT,
                                 start_new_session=True)  # Ctrl-C must not kill it before shadefs is off it
        self.slowfs[mnt] = p
        self.active.append((mnt, p.pid, "slowfs"))
        deadline = time.monotonic() + 30
        while not is_mounted(mnt):
            if p.poll() is not None or time.monotonic() > deadline:
                with open(log_file) as f:
                    raise BenchError(f"{failed}: {f.read()[-2000:]}")
            time.sleep(0.05)

    def pid_of(self, mnt: str) -> Optional[int]:
        return next((pid for m, pid, _ in self.active if m == mnt), None)

    def unmount(self, mnt: str) -> None:
        for i, (m, pid, kind) in enumerate(self.active):
            if m == mnt:
                del self.active[i]
                self._unmount(m, pid, kind)
                return

    def _unmount(self, mnt: str, pid: Optional[int], kind: str) -> None:
        if kind == "shadefs":  # and let the daemon exit before the next measurement (frees its RAM and CPU)
            unmount(mnt, pid, exit_timeout=15, log=lambda e: print(f"bench_read: {e}", file=sys.stderr))
            return
        if is_mounted(mnt) and subprocess.run([_FUSERMOUNT, "-u", mnt], capture_output=True).returncode != 0:
            print(f"bench_read: {mnt} is busy; lazy unmount", file=sys.stderr)
            force_unmount(mnt)
        proc = self.slowfs.pop(mnt, None)
        if proc is not None:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def unmount_all(self) -> None:
        while self.active:
            mnt, pid, kind = self.active.pop()
            try:
                self._unmount(mnt, pid, kind)
            except Exception as e:  # keep unmounting the others
                print(f"bench_read: unmounting {mnt} failed: {e}", file=sys.stderr)


def shadefs_stats(mnt: str) -> dict:
    r = shadefs("stats", mnt, "--json", timeout=60, check=False)
    if r.returncode != 0:
        raise BenchError(f"shadefs stats {mnt} failed: {(r.stderr or r.stdout).strip()}")
    return json.loads(r.stdout)


def drop_pages(mnt: str, files: Sequence[Tuple[str, int]]) -> int:
    """Drop the kernel's pages of ``files`` under the mount ``mnt`` (``POSIX_FADV_DONTNEED``): a file no tier
    admits keeps them between opens, so a pass meant to time misses drops them first. Returns the opens it
    made (the daemon counts each as a miss; none reads the source)."""
    for rel, _ in files:
        fd = os.open(os.path.join(mnt, rel), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return len(files)


def verify_sample(mnt: str, src: str, files: Sequence[Tuple[str, int]], k: int, seed: int) -> int:
    """Compare every byte of ``k`` files read through ``mnt`` with the source; raise BenchError if any differs."""
    rng = random.Random(seed)
    sample = rng.sample(list(files), min(k, len(files)))
    sample += [files[0], files[-1]]
    for rel, size in sample:
        got = _read_all(os.path.join(mnt, rel))
        want = _read_all(os.path.join(src, rel))
        if got != want or len(want) != size:
            raise BenchError(f"{rel}: {len(got)} bytes read through {mnt} differ from the source's {len(want)} "
                             f"(expected size {size})")
    return len(sample)


def _read_all(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            b = os.read(fd, READ_CHUNK)
            if not b:
                return b"".join(chunks)
            chunks.append(b)
    finally:
        os.close(fd)


FUSE_OPCODES = {1: "LOOKUP", 2: "FORGET", 3: "GETATTR", 14: "OPEN", 15: "READ", 17: "STATFS", 18: "RELEASE",
                20: "GETXATTR", 22: "LISTXATTR", 25: "FLUSH", 27: "OPENDIR", 28: "READDIR", 29: "RELEASEDIR",
                34: "ACCESS", 42: "BATCH_FORGET", 44: "READDIRPLUS", 46: "LSEEK", 52: "STATX"}
COUNT_CASES = ("ram-kernel", "nvme-kernel", "nvme-kernel-every", "nvme-kernel-nopt", "miss-kernel", "miss-kernel-ram", "ram-multi", "ram-multi-nokc",
               "nvme-multi", "miss-multi")


def count_requests(pool: "ReaderPool", pid: Optional[int], mnt: str, files, work: str) -> Optional[Dict[str, float]]:
    """FUSE requests the daemon receives per open: strace every thread's read() of /dev/fuse during one
    1-reader pass over ``files`` and decode the opcode of each request header. None if strace is unusable."""
    strace = shutil.which("strace")
    if strace is None or pid is None:
        return None
    try:
        fuse_fds = {fd for fd in os.listdir(f"/proc/{pid}/fd") if os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/fuse"}
        tids = [a for t in os.listdir(f"/proc/{pid}/task") for a in ("-p", t)]
    except OSError:
        return None
    out = os.path.join(work, "logs", f"strace-{pid}.txt")
    proc = subprocess.Popen([strace, "-f", "-xx", "-s", "8", "-e", "trace=read,readv", "-o", out, *tids],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10  # wait until every thread is attached
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/status") as f:
                    if re.search(r"^TracerPid:\s*[1-9]", f.read(), re.M):
                        break
            except OSError:
                break
            time.sleep(0.05)
        time.sleep(0.3)
        pool.run(mnt, files, 1)
        time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    counts: Dict[str, int] = {}
    pending: Dict[str, str] = {}
    try:
        with open(out) as f:
            for line in f:
                tid = line.split(" ", 1)[0]
                fd = hexs = None
                m = re.search(r'readv?\((\d+), (?:\[\{iov_base=)?"((?:\\x[0-9a-f]{2}){8})', line)
                if m:
                    fd, hexs = m.group(1), m.group(2)
                else:
                    m = re.search(r"readv?\((\d+),\s*<unfinished", line)
                    if m:
                        pending[tid] = m.group(1)
                        continue
                    m = re.search(r'<\.\.\. readv? resumed>\s*(?:\[\{iov_base=)?"((?:\\x[0-9a-f]{2}){8})', line)
                    if m:
                        fd, hexs = pending.pop(tid, None), m.group(1)
                if fd in fuse_fds and hexs:
                    op = int.from_bytes(bytes.fromhex(hexs.replace("\\x", ""))[4:8], "little")
                    name = FUSE_OPCODES.get(op, str(op))
                    counts[name] = counts.get(name, 0) + 1
        os.unlink(out)
    except OSError:
        return None
    if not counts:
        return None
    return {k: v / len(files) for k, v in counts.items()}


# -- the latency-injecting passthrough (runs as its own process: ``python -m shadefs.bench.read _slowfs ...``)
def slowfs_main(source: str, mnt: str, delay_ms: float, stats_file: str) -> int:
    """A read-only passthrough of ``source`` at ``mnt`` whose every READ sleeps ``delay_ms`` (multithreaded loop)."""
    import threading

    from mfusepy import FUSE

    delay = delay_ms / 1000.0

    class SlowPassthrough:
        use_ns = True

        def __init__(self):
            self.reads = 0
            self.opens = 0
            self.lock = threading.Lock()

        def getattr(self, path, fh=None):
            st = os.lstat(source + path)
            return {"st_mode": st.st_mode, "st_nlink": st.st_nlink, "st_size": st.st_size, "st_uid": st.st_uid,
                    "st_gid": st.st_gid, "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns,
                    "st_ctime": st.st_ctime_ns}

        def readdir(self, path, fh):
            return [".", "..", *os.listdir(source + path)]

        def open(self, path, flags):
            with self.lock:
                self.opens += 1
            return os.open(source + path, os.O_RDONLY)

        def read(self, path, size, offset, fh):
            time.sleep(delay)
            with self.lock:
                self.reads += 1
            return os.pread(fh, size, offset)

        def release(self, path, fh):
            os.close(fh)
            return 0

        def destroy(self, path):
            with open(stats_file, "w") as f:
                json.dump({"reads": self.reads, "opens": self.opens}, f)

    FUSE(SlowPassthrough(), mnt, foreground=True, ro=True, fsname="bench_read_slowfs",
         attr_timeout=3600, entry_timeout=3600, negative_timeout=3600)
    return 0


def gatedfs_main(source: str, mnt: str, gate_file: str) -> int:
    """A read-only FUSE view of ``source`` (shadefs' kernel front end over a tiny "cache") whose opens of
    files below ``hang/`` block, in the kernel, until ``gate_file`` exists: hung backend reads on demand."""
    import logging

    from shadefs.backends.posix import PosixBackend
    from shadefs.fuse.kernel import KernelFrontend
    from shadefs.namespace import Namespace
    from shadefs.testing.gated import GatedCache

    logging.basicConfig(level=logging.INFO)
    ns = Namespace(PosixBackend(source).walk())

    def wait_for_the_gate_file() -> None:
        # block without using CPU: opening a FIFO for reading waits for a writer (the release)
        while not os.path.exists(gate_file):
            os.close(os.open(gate_file + ".fifo", os.O_RDONLY))

    KernelFrontend(ns, GatedCache(ns, source, wait_for_the_gate_file), None, mountpoint=mnt,
                   fsname="bench_read_gatedfs", passthrough=False).run()
    return 0


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


def targets_table(results: Dict[str, dict], slow: Optional[dict], hung: Optional[dict], readers: List[int]) -> Table:
    """The read-path targets for the default front end (kernel, default flags), all from this run."""
    top = max(readers)
    rows = []

    def row(what, value, target, ok):
        rows.append([what, value, target, "yes" if ok else "no"])

    for size_label, res in results.items():
        small = "B" in size_label and "KB" not in size_label
        if "ram-kernel" in res:
            q = res["ram-kernel"][top]["files_s"] / res["direct"][top]["files_s"]
            want = 0.2 if small else 0.4
            row(f"{size_label}: RAM hit / direct, {top} readers", _ratio(q), f">= {want}", q >= want)
        if "nvme-kernel" in res and "ram-kernel" in res:
            q = res["nvme-kernel"][top]["files_s"] / res["ram-kernel"][top]["files_s"]
            row(f"{size_label}: NVMe hit (passthrough) / RAM hit, {top} readers", _ratio(q), ">= 0.8", q >= 0.8)
        inproc = res.get("_inproc", {})
        for key, what, limit in (("ram-kernel", "daemon CPU per RAM hit", 20), ("nvme-kernel", "daemon CPU per NVMe hit", 20),
                                 ("miss-kernel-ram", "daemon CPU per miss (posix backend read included)", None)):
            if key in res:
                for r in sorted({min(readers), top}):
                    cpu = res[key][r].get("cpu_us")
                    if cpu is None:
                        continue
                    if limit is not None:
                        row(f"{size_label}: {what}, {r} rd", f"{cpu:.0f} us", f"<= {limit} us", cpu <= limit)
                    elif "backend_read_us" in inproc:
                        b = inproc["backend_read_us"]
                        row(f"{size_label}: daemon CPU per miss excluding the backend read ({cpu:.0f} - {b:.0f} us "
                            f"in process), {r} rd", f"{cpu - b:.0f} us", "<= 50 us", cpu - b <= 50)
        if "verify_us" in inproc:
            extra = ""
            if "nvme-kernel-every" in res and "nvme-kernel" in res:
                a, b = res["nvme-kernel-every"][top].get("cpu_us"), res["nvme-kernel"][top].get("cpu_us")
                if a is not None and b is not None:
                    extra = f"; daemon CPU every-open - first-hit, {top} rd: {a - b:+.0f} us"
            rows.append([f"{size_label}: entry checksum per NVMe hit (in process: open, pread, xxh3, close)",
                         f"{inproc['verify_us']:.1f} us{extra}", "measured", "-"])
    for one in (slow or {}).values():
        if "kernel" in one:
            p99 = one["kernel"]["hit_ms_p99"]
            row(f"slow backend +{one['delay_ms']:g} ms: hit p99 with misses in flight", f"{p99:.2f} ms", "<= 1 ms",
                p99 <= 1.0)
    if hung and "before" in hung and "during" in hung:
        b, d = hung["before"], hung["during"]
        row(f"{hung['hung']} hung backend reads: hit p99 during / before", f"{d['hit_ms_p99']:.2f} / "
            f"{b['hit_ms_p99']:.2f} ms", "normal", d["hit_ms_p99"] <= max(1.0, 2 * b["hit_ms_p99"]))
        row(f"{hung['hung']} hung backend reads: miss p99 during / before", f"{d['miss_ms_p99']:.2f} / "
            f"{b['miss_ms_p99']:.2f} ms", "normal", d["miss_ms_p99"] <= max(2.0, 2 * b["miss_ms_p99"]))
    return Table("Targets, kernel front end with default flags (same run)", ["target", "measured",
                 "target", "meets"], rows)


def hung_table(h: dict) -> Table:
    rows = [[tag, _f(h[tag]["hit_files_s"]), f"{h[tag]['hit_ms_p50']:.2f}", f"{h[tag]['hit_ms_p99']:.2f}",
             _f(h[tag]["miss_files_s"]), f"{h[tag]['miss_ms_p50']:.2f}", f"{h[tag]['miss_ms_p99']:.2f}"]
            for tag in ("before", "during") if tag in h]
    return Table(f"Hung backend, kernel front end: {h['hung']} backend reads that never return (opens of the "
                 f"source block in its FUSE daemon), {h['readers']} readers of ~110 KB hits / misses on other "
                 f"files (load average {_load_str(h['_load'])})",
                 ["", "hits files/s", "hit p50 ms", "hit p99 ms", "misses files/s", "miss p50 ms", "miss p99 ms"],
                 rows, note=f"While hung: {h['still_blocked']} of {h['hung']} readers still blocked (process states "
                            f"{h['hung_states']}: S = interruptible); one killed with SIGKILL exited after "
                            f"{h['kill_exit_ms']:.1f} ms (shadefs answered the kernel's INTERRUPT).")


# -- experiments ------------------------------------------------------------------------------------------
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


SLOW_LOOPS = ("kernel", "multi", "single")


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


def _pct(xs: List[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


# -- reporting --------------------------------------------------------------------------------------------
def _load_str(loads) -> str:
    return " -> ".join("/".join(f"{x:.2f}" for x in l) for l in loads)


def _ratio(q: float) -> str:
    """Two decimals, rounded down, so that a ratio shown as 0.30 never misses a 0.3 target."""
    return f"{int(q * 100) / 100:.2f}"


def _f(x: float) -> str:
    return f"{x:,.0f}"


def size_table(size_label: str, res: dict, readers: List[int]) -> Table:
    top = max(readers)
    direct_top = res["direct"][top]["files_s"]
    headers = ["case"] + [f"files/s, {r} rd" for r in readers] + [f"MB/s, {r} rd" for r in readers] + \
              [f"x direct, {top} rd"]
    rows = []
    for key in ["direct"] + [c[0] for c in CASES]:
        if key not in res:
            continue
        row = [LABELS[key]] + [_f(res[key][r]["files_s"]) for r in readers] + \
              [f"{res[key][r]['mb_s']:,.1f}" for r in readers] + [f"{res[key][top]['files_s'] / direct_top:.2f}"]
        rows.append(row)
    return Table(f"{size_label} files: median of the timed passes (load average 1/5/15 min: "
                 f"{_load_str(res['_load'])})", headers, rows)


def cpu_table(results: Dict[str, dict], readers: List[int]) -> Optional[Table]:
    rows = []
    for size_label, res in results.items():
        for key in [c[0] for c in CASES]:
            if key in res and all("cpu_us" in res[key][r] for r in readers):
                rows.append([size_label, LABELS[key]] + [f"{res[key][r]['cpu_us']:.0f}" for r in readers])
    if not rows:
        return None
    return Table("Daemon CPU time per open, us (user + system of the daemon process, median of the timed passes; "
                 f"clock tick {1e3 / os.sysconf('SC_CLK_TCK'):g} ms, less sensitive to other load than files/s)",
                 ["files", "case"] + [f"{r} rd" for r in readers], rows)


def ratio_table(title: str, results: Dict[str, dict], pairs: List[Tuple[str, str, str]], readers: List[int],
                pct: bool = False) -> Table:
    """Rows: (size, label) for each pair (a, b, label): a / b per reader count (or (a / b - 1) as a %)."""
    headers = ["files", "comparison"] + [f"{r} rd" for r in readers]
    rows = []
    for size_label, res in results.items():
        for a, b, label in pairs:
            if a not in res or b not in res:
                continue
            cells = []
            for r in readers:
                q = res[a][r]["files_s"] / res[b][r]["files_s"]
                cells.append(f"{(q - 1) * 100:+.0f} %" if pct else f"{q:.2f}x")
            rows.append([size_label, label] + cells)
    return Table(title, headers, rows)


def target_table(results: Dict[str, dict], readers: List[int]) -> Tuple[Table, List[str]]:
    top = max(readers)
    rows, lines = [], []
    for size_label, res in results.items():
        d = res["direct"][top]["files_s"]
        for key, label, tier, *_ in CASES:
            if tier.startswith("miss") or key not in res:
                continue
            x = res[key][top]["files_s"]
            ok = x >= TARGET * d
            rows.append([size_label, label, _f(x), _f(d), _ratio(x / d), "yes" if ok else "no"])
    t = Table(f"Target: hit path with {top} readers >= {TARGET} x direct (same run)",
              ["files", "case", f"files/s, {top} rd", f"direct, {top} rd", "ratio", "meets"], rows)
    return t, lines


def requests_table(results: Dict[str, dict], n: int) -> Optional[Table]:
    cols = ["LOOKUP", "GETATTR", "OPEN", "READ", "FLUSH", "RELEASE"]
    rows = []
    for size_label, res in results.items():
        for key, counts in res.get("_requests", {}).items():
            other = sum(v for k, v in counts.items() if k not in cols)
            rows.append([size_label, LABELS[key]] + [f"{counts.get(c, 0):.2f}" for c in cols] + [f"{other:.2f}"])
    if not rows:
        return None
    return Table(f"FUSE requests received by the daemon per open (strace of its reads of /dev/fuse, 1 reader, "
                 f"{n} files after the timed passes; the loop mode does not change them)",
                 ["files", "case"] + cols + ["other"], rows)


def slow_table(slow: dict) -> Table:
    rows = []
    for loop in SLOW_LOOPS:
        if loop not in slow:
            continue
        o = slow[loop]
        rows.append([loop, _f(o["hits_only_files_s"]), _f(o["mixed_files_s"]), _f(o["mixed_hits_s"]),
                     f"{o['hit_ms_p50']:.2f}", f"{o['hit_ms_p90']:.2f}", f"{o['hit_ms_p99']:.2f}",
                     f"{o['miss_ms_p50']:.2f}"])
    return Table(f"Slow backend: {slow['files']} files of ~110 KB, half in RAM, every READ of the source "
                 f"+{slow['delay_ms']:g} ms, {slow['readers']} readers (load average {_load_str(slow['_load'])})",
                 ["FUSE loop", "hits alone, files/s", "mixed, files/s", "hits/s in mixed", "hit p50 ms",
                  "hit p90 ms", "hit p99 ms", "miss p50 ms"], rows,
                 note=f"The slow source read directly by the same readers (the miss half): "
                      f"{_f(slow['backend_direct'])} files/s"
                      + (f"; the passthrough served {slow['slowfs']['reads']:,} READs for "
                         f"{slow['slowfs']['opens']:,} opens ({slow['slowfs']['reads'] / max(1, slow['slowfs']['opens']):.2f} "
                         f"per open)" if slow.get('slowfs') else "") + ".")


def per_open_us(res: dict, key: str, readers: int = 1) -> float:
    return 1e6 / res[key][readers]["files_s"]


def kernel_limits_text(results: Dict[str, dict], readers: List[int]) -> str:
    """The remaining gap of the kernel front end to a direct page-cache read, and what it is made of."""
    top = max(readers)
    one = 1 if 1 in readers else min(readers)
    bits = []
    for size_label, res in results.items():
        if "ram-kernel" not in res:
            continue
        d1, r1 = per_open_us(res, "direct", one), per_open_us(res, "ram-kernel", one)
        cpu = res["ram-kernel"][one].get("cpu_us")
        b = (f"{size_label} files, {one} reader: direct {d1:.0f} us per file, kernel front end RAM hit {r1:.0f} us "
             f"(+{r1 - d1:.0f} us" + (f", of which {cpu:.0f} us daemon CPU" if cpu is not None else "") + ")")
        req = res.get("_requests", {}).get("ram-kernel")
        if req:
            b += (f"; requests per open: OPEN {req.get('OPEN', 0):.2f}, RELEASE {req.get('RELEASE', 0):.2f}, "
                  f"READ {req.get('READ', 0):.2f}, LOOKUP {req.get('LOOKUP', 0):.2f}, FLUSH {req.get('FLUSH', 0):.2f}")
        if "nvme-kernel" in res:
            n1 = per_open_us(res, "nvme-kernel", one)
            ncpu = res["nvme-kernel"][one].get("cpu_us")
            b += (f"; NVMe hit by passthrough {n1:.0f} us" + (f" ({ncpu:.0f} us daemon CPU)" if ncpu is not None else ""))
        bits.append(b)
    return (
        "Kernel front end (the default): a kernel-cached hit is two round trips, OPEN and RELEASE (LOOKUP "
        "once per path, then cached for an hour; READ only when the kernel does not hold the file's pages; "
        "FLUSH and ACCESS are answered ENOSYS once and never sent again). Each round trip is: the reader "
        "blocks, the kernel queues the request and wakes a reader thread of the daemon (2 by default, each on "
        "its own clone of /dev/fuse), which returns from read(2), takes the GIL, decodes the 40-byte header, "
        "asks the cache (RAM or NVMe hit: no other thread involved) and writes the reply with one writev(2); "
        "no data is copied on a kernel-cached hit. The daemon's CPU per open (the CPU table) is therefore two "
        "blocking read(2)/writev(2) pairs with their wake-ups (kernel time; a syscall costs ~2 us on this VM "
        "and a wake-up several) plus ~10 us of Python in the OPEN and RELEASE handlers (measured in process, "
        "replies written to /dev/null) and the GIL handoffs between reader threads: 4 reader threads cost "
        "more CPU per open than 2 (the `--fuse-readers 4` row). An NVMe hit by passthrough is also OPEN + "
        "RELEASE, and the kernel reads the entry file itself (no READ, no copy through the daemon); with "
        "`--verify-entries first-hit` (opt-in) the daemon reads the entry only at the first hit of each entry, "
        "and once a passthrough backing id is kept for it no longer opens it either (`TieredCache.open_kept`: "
        "\"The NVMe first-hit cost split\" below); with `every-open` (the default) it opens, reads and hashes "
        "it whole at every open (the checksum row: in-process cost per file). A miss is OPEN handed to a worker thread "
        "(a queue and a wake-up), the backend read, admission into the RAM tier (victims evicted), the reply "
        "from the worker, one READ per 1 MiB answered inline from the tier's bytes (one copy into the kernel) "
        "and RELEASE. What remains to native is the two round trips per open and, at 8 readers on 2 cores, "
        "the CPU they take from the readers. Measured: " + "; ".join(bits) + ".")


def limits_text(results: Dict[str, dict], slow: Optional[dict], readers: List[int]) -> str:
    top = max(readers)
    one = 1 if 1 in readers else min(readers)
    parts = []
    parts.append(kernel_limits_text(results, readers))
    parts.append(
        "With the libfuse front end, every open through the mount costs FUSE round trips, each a switch into the daemon and back through "
        "the kernel, libfuse, ctypes and a Python callback: LOOKUP (once per path, then cached for "
        "`entry_timeout` = 3600 s), OPEN (the cache lookup; it decides `keep_cache`), READ (one per 128 KiB; "
        "skipped on a hit when `keep_cache` lets the kernel keep the file's pages from an earlier open) and "
        "RELEASE. GETATTR is cached (`attr_timeout` = 3600 s), FLUSH is not registered (the kernel stops "
        "sending it after the first ENOSYS) and the reader's EOF read never leaves the kernel. So a "
        "kernel-cached hit (RAM or NVMe) is two round trips, OPEN and RELEASE; a hit without kernel cache and "
        "a miss add one READ per 128 KiB (the requests table above shows the measured counts; ~110 KB files "
        "+-30 % need 1.2 READs on average). The direct read is two system calls and no switch. shadefs' own "
        "Python work in OPEN + RELEASE of a RAM hit is ~3 us (measured in-process, without FUSE); the rest of "
        "each per-file time below is the round trips.")
    for size_label, res in results.items():
        if not all(k in res for k in ("direct", "ram-multi", "ram-single")):
            continue
        s = (f"{size_label} files, {one} reader: direct {per_open_us(res, 'direct', one):.0f} us per file; "
             f"RAM hit {per_open_us(res, 'ram-single', one):.0f} us (single loop) and "
             f"{per_open_us(res, 'ram-multi', one):.0f} us (multi loop)")
        if "ram-single-nokc" in res:
            s += (f"; without kernel cache {per_open_us(res, 'ram-single-nokc', one):.0f} us (single) / "
                  f"{per_open_us(res, 'ram-multi-nokc', one):.0f} us (multi), i.e. the READ round trip and its "
                  f"copy add {per_open_us(res, 'ram-single-nokc', one) - per_open_us(res, 'ram-single', one):.0f} us "
                  f"/ {per_open_us(res, 'ram-multi-nokc', one) - per_open_us(res, 'ram-multi', one):.0f} us")
        if "miss-single" in res:
            s += (f"; a miss {per_open_us(res, 'miss-single', one):.0f} us (single) / "
                  f"{per_open_us(res, 'miss-multi', one):.0f} us (multi)")
        if "nvme-single" in res:
            s += (f"; an NVMe hit {per_open_us(res, 'nvme-single', one):.0f} us (single) / "
                  f"{per_open_us(res, 'nvme-multi', one):.0f} us (multi)")
        parts.append(s + ".")
    cpu_bits = []
    for size_label, res in results.items():
        if all(k in res and "cpu_us" in res[k].get(one, {}) for k in ("ram-multi", "ram-single")):
            cpu_bits.append(f"{res['ram-multi'][one]['cpu_us']:.0f} vs {res['ram-single'][one]['cpu_us']:.0f} us "
                            f"for {size_label} RAM hits")
    parts.append(
        "The multithreaded loop (libfuse's `fuse_loop_mt`: a pool of threads, each blocked in read() on "
        "/dev/fuse, growing while requests wait) hands every request to a thread that was asleep, and its "
        "Python callback must then take the GIL from whichever thread had it; with the single-threaded loop "
        "one thread that holds the interpreter finds the next request already queued (the kernel sends "
        "RELEASE asynchronously, so the reader's next OPEN is often waiting). The daemon's CPU time per open "
        "shows the difference" + (f" ({one} reader: " + "; ".join(cpu_bits) + ", multi vs single)" if cpu_bits
                                  else "") + ". With mfusepy on CPython 3.11 each callback on a libfuse thread "
        "also creates and destroys a Python thread state (ctypes' `PyGILState_Ensure`/`Release`; one mmap and "
        "one munmap of a frame stack per callback); keeping one per thread removed those calls in an experiment "
        "but did not lower the CPU per open measurably, so the wake-ups, not the thread states, are the cost. "
        "The single-threaded loop is faster per request but serialises everything, so one slow backend read "
        "stalls every reader (the slow-backend table).")
    # target statement
    for size_label, res in results.items():
        d = res["direct"][top]["files_s"]
        verdicts = []
        for key, label, tier, *_ in CASES:
            if tier.startswith("miss") or key not in res:
                continue
            x = res[key][top]["files_s"]
            verdicts.append(f"{label} {_ratio(x / d)} ({'meets' if x >= TARGET * d else 'misses'})")
        parts.append(f"Target (hit path, {top} readers >= {TARGET} x direct = {_f(TARGET * d)} files/s for "
                     f"{size_label} files, direct {_f(d)} files/s): " + "; ".join(verdicts) + ".")
    for slow in (slow or {}).values():
        if not ("multi" in slow and "single" in slow and "kernel" in slow):
            continue
        m, s, k = slow["multi"], slow["single"], slow["kernel"]
        parts.append(
            f"Slow backend (+{slow['delay_ms']:g} ms per source READ, half of the opens hits), kernel front "
            f"end: a hit's p50 {k['hit_ms_p50']:.2f} ms, p99 {k['hit_ms_p99']:.2f} ms (target p99 <= 1 ms: "
            f"{'meets' if k['hit_ms_p99'] <= 1.0 else 'misses'}); mixed rate {_f(k['mixed_files_s'])} files/s.")
        parts.append(
            f"Slow backend (+{slow['delay_ms']:g} ms per source READ, half of the opens hits): a hit's p50 "
            f"latency is {m['hit_ms_p50']:.2f} ms with the multithreaded loop and {s['hit_ms_p50']:.2f} ms with "
            f"the single-threaded loop, where it waits behind the miss being served; the mixed rate is "
            f"{_f(m['mixed_files_s'])} vs {_f(s['mixed_files_s'])} files/s.")
    return "\n\n".join(parts)


def machine_info(work: str) -> dict:
    info = {"nproc": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()}
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info["cpu"] = cpu
    try:
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    r = subprocess.run([sys.executable, "-c", "from shadefs.daemon import select_libfuse; select_libfuse(); "
                        "import mfusepy, importlib.metadata as m; "
                        "print(mfusepy.fuse_version_major, mfusepy.fuse_version_minor, mfusepy._libfuse_path, "
                        "m.version('mfusepy'))"], capture_output=True, text=True, timeout=60)
    parts = r.stdout.split()
    if len(parts) == 4:
        info["libfuse"] = f"{parts[0]}.{parts[1]}"
        info["libfuse_path"] = parts[2]
        info["mfusepy"] = parts[3]
    best, fs = "", "?"
    real = os.path.realpath(work)
    with open("/proc/self/mounts") as f:
        for line in f:
            p = line.split()
            mp_ = p[1].encode().decode("unicode_escape")
            if (real == mp_ or real.startswith(mp_.rstrip("/") + "/")) and len(mp_) >= len(best):
                best, fs = mp_, f"{p[2]} ({p[0]})"
    info["workdir_fs"] = fs
    return info


def build_report(args, info: dict, results: Dict[str, dict], slow: Optional[dict], command: str,
                 started: str, elapsed: float) -> Tuple[List[Table], str]:
    readers = args.readers
    tables = [size_table(label, res, readers) for label, res in results.items()]
    ct = cpu_table(results, readers)
    if ct is not None:
        tables.append(ct)
    tables.append(ratio_table("FUSE loop: single / multi (files/s ratio, > 1: single is faster)", results,
                              [("ram-single", "ram-multi", "RAM hit"),
                               ("ram-single-nokc", "ram-multi-nokc", "RAM hit, no kernel cache"),
                               ("nvme-single", "nvme-multi", "NVMe hit"),
                               ("miss-single", "miss-multi", "miss")], readers))
    tables.append(ratio_table("Kernel cache: on / off for RAM hits (files/s ratio)", results,
                              [("ram-multi", "ram-multi-nokc", "multi loop"),
                               ("ram-single", "ram-single-nokc", "single loop")], readers))
    tables.append(ratio_table("--trace FILE on RAM hits: change in files/s (negative: the trace costs)", results,
                              [("ram-multi-trace", "ram-multi", "multi loop"),
                               ("ram-single-trace", "ram-single", "single loop")], readers, pct=True))
    tables.append(ratio_table("Front end: kernel / libfuse (files/s ratio, > 1: the kernel front end is faster)",
                              results, [("ram-kernel", "ram-multi", "RAM hit, vs libfuse multi"),
                                        ("ram-kernel", "ram-single", "RAM hit, vs libfuse single"),
                                        ("nvme-kernel", "nvme-kernel-nopt", "NVMe hit, passthrough vs not"),
                                        ("nvme-kernel", "ram-kernel", "NVMe hit (passthrough) vs RAM hit"),
                                        ("miss-kernel", "miss-multi", "miss, vs libfuse multi")], readers))
    tables.append(targets_table(results, slow, getattr(args, "hung_result", None), readers))
    t, _ = target_table(results, readers)
    tables.append(t)
    rt = requests_table(results, args.count_requests)
    if rt is not None:
        tables.append(rt)
    for one in (slow or {}).values():
        tables.append(slow_table(one))
    if getattr(args, "hung_result", None):
        tables.append(hung_table(args.hung_result))

    md = [DOC_START, "## Read path", "",
          f"Generated by `python -m shadefs.bench read` on {started} in {elapsed / 60:.1f} min; everything between the "
          f"`bench_read` markers is rewritten by `--write-doc`, so rerun it rather than editing by hand.", "",
          f"- **Machine**: {info['nproc']} CPUs ({info.get('cpu') or '?'}), {info.get('mem_gib', '?')} GiB RAM, "
          f"Linux `{info['kernel']}`, Python {info['python']}, libfuse {info.get('libfuse', '?')} as loaded by "
          f"mfusepy {info.get('mfusepy', '?')} (`{info.get('libfuse_path', '?')}`); datasets, NVMe tier "
          f"directory and mountpoints on {info['workdir_fs']}.",
          f"- **Command**: `{command}`",
          f"- **Load average (1/5/15 min)**: {_load_str([args.load_start])} at start, {_load_str([args.load_end])} "
          f"at the end; per experiment in each table's title (start -> end)."
          + (" The machine was shared with other work while this ran, so absolute numbers are noisy: compare "
             "rows of one table (measured interleaved) rather than runs, and prefer the daemon CPU per open, "
             "which load disturbs less." if args.noisy_note else ""),
          *([f"- **Quick run (`--quick`)**: a smoke test, not reference numbers."] if args.quick else []),
          f"- **Method**: {args.files} files per size (~{args.small_size} B and ~{args.large_size // 1000} KB, "
          f"+-30 %, {PER_DIR} per directory); readers are processes reading disjoint contiguous shards with "
          f"`os.open`/`os.read({READ_CHUNK // 1024} KiB)` until EOF/`os.close`; all cases of one file size are "
          f"mounted at once, warmed with one pass, then timed round-robin (every case once per round, "
          f"{args.repeat} rounds per reader count, median reported; a pass shorter than {args.min_pass_s:g} s "
          f"reads the files several times), so load that comes and goes touches every row alike. Each mount's counters must show every timed open "
          f"as the outcome named (`shadefs stats --json`), every pass must return the exact byte count, and "
          f"{args.verify + 2} files per mount are compared byte for byte with the source. `RAM hit`: "
          f"`--ram-cache 100%`; `NVMe hit`: `--ram-cache 0 --disk-cache DIR --disk-cache-size` twice the files' bytes and 64 MiB (the "
          f"entries sit in the page cache: the daemon's path, not the device, is measured); `miss`: "
          f"`--ram-cache 0 --policy static --no-kernel-cache` (source page cache warm; every open reads it through the daemon); `kernel`: `--fuse-impl kernel` (the "
          f"default front end; NVMe hits by passthrough unless `--no-passthrough`); `libfuse multi`/`single`: `--fuse-impl libfuse "
          f"--fuse-loop multi|single`. Slow backend: every front end mounted over the same latency-injecting "
          f"source, measured in turn; hung backend: the source is a FUSE view whose opens of `hang/` files "
          f"block until released (`{args.hung}` readers blocked on them), hits and other misses measured "
          f"before and while they hang.",
          ""]
    for t in tables:
        md += [t.markdown(), ""]
    md += ["### What limits it", "", limits_text(results, slow, readers), ""]
    if args.plot:
        rel = os.path.relpath(os.path.abspath(args.plot), os.path.dirname(os.path.abspath(args.doc)))
        md += [f"![files/s vs readers, ~110 KB files]({rel})", ""]
    md.append(DOC_END)
    return tables, "\n".join(md) + "\n"


def write_plot(path: str, res: dict, readers: List[int], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=110)
    styles = {"direct": ("k", "-", "o")}
    for key in ["direct"] + [c[0] for c in CASES]:
        if key not in res:
            continue
        color, ls, marker = styles.get(key, (None, "--" if "single" in key else "-",
                                              "s" if key.startswith("ram") else "^" if key.startswith("nvme") else "v"))
        ax.plot(readers, [res[key][r]["files_s"] for r in readers], label=LABELS[key], color=color,
                linestyle=ls, marker=marker)
    ax.set_yscale("log")
    ax.set_xticks(readers)
    ax.set_xlabel("reader processes")
    ax.set_ylabel("files/s (log scale)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


# -- main ---------------------------------------------------------------------------------------------------


#: the runner's common options this benchmark honours
COMMON = ('baseline', 'write_doc', 'json')


def add_arguments(p) -> None:
    p.add_argument("--files", type=int, default=4000, help="files per dataset (default 4000)")
    p.add_argument("--readers", type=int, nargs="+", default=[1, 4, 8], help="reader process counts (default 1 4 8)")
    p.add_argument("--repeat", type=int, default=3, help="timed passes per point; the median is reported (default 3)")
    p.add_argument("--min-pass-s", type=float, default=0.5, help="a timed pass shorter than this reads the files "
                   "several times instead (default 0.5 s)")
    p.add_argument("--sizes", nargs="*", choices=("small", "large"), default=["small", "large"],
                   help="datasets to run (none: only the slow- and hung-backend experiments)")
    p.add_argument("--slow-loops", nargs="+", choices=SLOW_LOOPS, default=list(SLOW_LOOPS),
                   help="front ends in the slow-backend experiment (default: kernel multi single)")
    p.add_argument("--small-size", type=int, default=300, help="mean size of the small files (default 300 B)")
    p.add_argument("--large-size", type=int, default=110_000, help="mean size of the large files (default 110 KB)")
    p.add_argument("--cases", nargs="+", choices=[c[0] for c in CASES] + ["all"], default=DEFAULT_CASES,
                   help="mount cases to run (default: " + " ".join(DEFAULT_CASES) + "; 'all': every case; "
                   "direct always runs)")
    p.add_argument("--slow-ms", type=float, nargs="+", default=[2.0, 20.0], help="latencies of each source READ "
                   "in the slow-backend experiment, one run each (default 2 20 ms)")
    p.add_argument("--slow-files", type=int, default=800, help="files in the slow-backend experiment (default 800)")
    p.add_argument("--slow-readers", type=int, default=4, help="readers in the slow-backend experiment (default 4)")
    p.add_argument("--no-slow", action="store_true", help="skip the slow-backend experiment")
    p.add_argument("--no-hung", action="store_true", help="skip the hung-backend experiment")
    p.add_argument("--hung", type=int, default=16, help="hung backend reads in the hung-backend experiment (default 16)")
    p.add_argument("--count-requests", type=int, default=200, metavar="N",
                   help="count the FUSE requests per open with strace over N files for a few cases (0: off; "
                   "default 200; needs strace and ptrace rights)")
    p.add_argument("--verify", type=int, default=48, help="files per mount compared byte for byte (plus first and last)")
    p.add_argument("--workdir", help="work directory on local disk (default: a new temporary directory, removed "
                   "at the end); datasets in it are reused")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--quick", action="store_true", help="smoke run (~1 min): 400 files, 1 and 8 readers, 1 pass")
    p.add_argument("--doc", default=os.path.join(ROOT, "docs", "results", "read.md"))
    p.add_argument("--plot", default=os.path.join(ROOT, "docs", "img", "bench_read.png"))
    p.add_argument("--quiet-machine", dest="noisy_note", action="store_false",
                   help="omit the 'machine was shared' caveat from the doc")


def run(args, bench):
    if args.quick:
        args.files = min(args.files, 400)
        args.readers = [1, 8] if args.readers == [1, 4, 8] else args.readers
        args.repeat = 1
        args.slow_files = min(args.slow_files, 200)
        args.verify = min(args.verify, 16)
        args.min_pass_s = min(args.min_pass_s, 0.2)
    args.readers = sorted(set(args.readers))
    if args.files < 2 or min(args.readers) < 1 or args.repeat < 1 or args.slow_files < 2:
        bench.error("--files, --slow-files >= 2; --readers, --repeat >= 1")
    command = bench.command
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    own_work = args.workdir is None
    work = os.path.abspath(args.workdir) if args.workdir else tempfile.mkdtemp(prefix="shadefs-bench-read-")
    for d in ("data", "mnt", "cache", "logs"):
        os.makedirs(os.path.join(work, d), exist_ok=True)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    info = machine_info(work)
    args.load_start = os.getloadavg()
    progress(f"bench_read: {info['nproc']} CPUs, kernel {info['kernel']}, libfuse {info.get('libfuse')} "
             f"({info.get('libfuse_path')}), workdir {work} on {info['workdir_fs']}, load {os.getloadavg()}")
    baseline_dir = None
    if args.baseline:
        baseline_dir, rev = bench.baseline()
        selected = [c[0] for c in CASES] if "all" in args.cases else list(args.cases)
        args.cases = selected + add_baseline_cases(selected, baseline_dir, rev)
        os.chdir(work)  # ``python -m shadefs`` puts the cwd first on sys.path: not this tree's package
    pool = mounts = None
    results: Dict[str, dict] = {}
    slow = hung = None
    t_start = time.monotonic()
    try:
        datasets = {}
        for name in args.sizes:
            mean = args.small_size if name == "small" else args.large_size
            progress(f"dataset {name}: {args.files} files of ~{mean} B")
            datasets[name] = (os.path.join(work, "data", name),
                              make_dataset(os.path.join(work, "data", name), args.files, mean, seed=1 if name == "small" else 2))
        pool = ReaderPool(max(max(args.readers), args.slow_readers))  # forked before any mount or thread
        mounts = Mounts()
        for name in args.sizes:
            src, files = datasets[name]
            label = f"~{args.small_size} B" if name == "small" else f"~{args.large_size // 1000} KB"
            results[label] = run_size(args, pool, mounts, name, src, files, work)
            print("\n" + size_table(label, results[label], args.readers).text() + "\n", flush=True)
        if not args.no_slow:
            slow = {}
            for delay in args.slow_ms:
                slow[f"{delay:g}"] = run_slow(args, pool, mounts, work, delay)
                print("\n" + slow_table(slow[f"{delay:g}"]).text() + "\n", flush=True)
        if not args.no_hung:
            hung = args.hung_result = run_hung(args, pool, mounts, work)
            print("\n" + hung_table(hung).text() + "\n", flush=True)
    except KeyboardInterrupt:
        print("bench_read: interrupted; unmounting", file=sys.stderr)
        return 130
    except BenchError as e:
        print(f"bench_read: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        if pool is not None:
            pool.close()
        if mounts is not None:
            mounts.unmount_all()
        if own_work and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    elapsed = time.monotonic() - t_start
    args.load_end = os.getloadavg()

    tables, section = build_report(args, info, results, slow, command, started, elapsed)
    print(f"machine: {info['nproc']} CPUs ({info.get('cpu')}), kernel {info['kernel']}, libfuse "
          f"{info.get('libfuse')} via mfusepy {info.get('mfusepy')}; workdir on {info['workdir_fs']}")
    print(f"command: {command}\n")
    for t in tables[len(results):]:
        print(t.text() + "\n")
    print(f"total {elapsed:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "results": results, "slow": slow, "hung": hung, "command": command}, f, indent=1, default=str)
    if args.write_doc:
        bench.write_results(section, "bench_read", args.doc)
        large = next((res for label, res in results.items() if "KB" in label), None)
        if large is not None and args.plot:
            write_plot(args.plot, large, args.readers,
                       f"shadefs read path, ~{args.large_size // 1000} KB files, {info['nproc']} CPUs "
                       f"(load {os.getloadavg()[0]:.1f})")
        print(f"wrote the 'Read path' section of {args.doc}" + (f" and {args.plot}" if large is not None else ""))
    return 0


if __name__ == "__main__":  # a FUSE source of this benchmark, as its own process (Mounts._spawn_source)
    if sys.argv[1] == "_gatedfs":
        sys.exit(gatedfs_main(sys.argv[2], sys.argv[3], sys.argv[4]))
    if sys.argv[1] == "_slowfs":
        sys.exit(slowfs_main(sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]))
