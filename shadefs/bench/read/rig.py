"""The read benchmark's rig: its datasets, the reader processes that time a pass, the mounts it makes
(shadefs daemons and the FUSE sources of :mod:`shadefs.bench.read.sources`) and the checks of what a mount
served (the daemon's counters, the bytes, the FUSE requests per open)."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from shadefs.cmdutil import is_mounted
from shadefs.testing import Mount, ShadefsError, force_unmount, shadefs, unmount
from shadefs.testing.datasets import random_tree

PER_DIR = 500
READ_CHUNK = 1 << 18   # 256 KiB: one os.read() returns a whole ~110 KB file, the next one EOF
_T0 = time.monotonic()


def progress(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


class BenchError(RuntimeError):
    """A check failed (wrong bytes, wrong outcome counters, a mount that does not come up)."""


def make_dataset(root: str, n: int, mean_size: int, seed: int) -> List[Tuple[str, int]]:
    """``n`` files of ``mean_size`` +-30 % random bytes, PER_DIR to a directory (reused if already there)."""
    return random_tree(root, n, mean_size, seed, per_dir=PER_DIR)


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
        """Run ``mode`` of :mod:`shadefs.bench.read.sources` (a FUSE source serving ``mnt``) as a child, and
        wait up to 30 s until ``mnt`` is mounted; raises BenchError with ``failed`` and the log's tail if it
        exits or times out."""
        os.makedirs(mnt, exist_ok=True)
        with open(log_file, "w") as log:
            p = subprocess.Popen([sys.executable, "-m", "shadefs.bench.read.sources", mode, *args], stdout=log,
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
