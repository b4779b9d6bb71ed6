"""Helpers shared by the operations tests (persistence, faults, load, metrics, security)."""
from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from shadefs.backends.posix import PosixBackend
from shadefs.cli import is_mounted
from shadefs.fuse.kernel import KernelFrontend
from shadefs.namespace import Namespace
from shadefs.testing.gated import GatedCache
from shadefs.testing.mounts import force_unmount, wait_for, wait_pid_gone  # noqa: F401  (tests import them from here)


def class_tree(src, n: int, classes: int, lo: int, hi: int, seed: int) -> dict:
    """``n`` files of random bytes (``lo``..``hi`` bytes, sizes drawn with ``seed``) under ``src``, in
    ``classes`` class directories ``c0``, ``c1``, ... (file i in ``c{i % classes}/{i:04d}.bin``).
    Returns ``{relative path: bytes}``."""
    import random

    rng = random.Random(seed)
    spec = {}
    for i in range(n):
        rel = f"c{i % classes}/{i:04d}.bin"
        (src / f"c{i % classes}").mkdir(parents=True, exist_ok=True)
        data = os.urandom(rng.randint(lo, hi))
        (src / rel).write_bytes(data)
        spec[rel] = data
    return spec


def read(path) -> bytes:
    """Read a whole file with raw ``os.read`` (no ``isatty`` round trip)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                return b"".join(chunks)
            chunks.append(b)
    finally:
        os.close(fd)


def metrics_port(m) -> int:
    """The real port of a mount started with ``--metrics-port``, from its log."""
    found = re.search(r"Prometheus metrics on http://[^:]+:(\d+)/metrics", m.log())
    assert found, m.log()
    return int(found.group(1))


def scrape(port: int, host: str = "127.0.0.1") -> dict:
    """``{(sample name, ((label, value), ...)): value}`` from one scrape of ``/metrics``."""
    text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def pid_gone(pid: int, timeout: float = 10.0) -> bool:
    """Wait for ``pid`` to exit (a zombie counts as gone); AssertionError after ``timeout`` s."""
    if not wait_pid_gone(pid, timeout):
        raise AssertionError(f"pid {pid} still running after {timeout:g} s")
    return True


def source_passthrough(m) -> str:
    """The passthrough to the source file the mount ``m``'s front end granted at INIT (its log's
    passthrough line): ``"untiered"`` (the default of a directory source) or ``"large"``; ``"off"`` with the
    libfuse front end, ``--source-passthrough off``, ``--no-passthrough``, a source other than a directory,
    or a kernel that offers no FUSE passthrough (then every open is served through the daemon)."""
    found = re.search(r"files served from the source, from the source file: (\w+)\)", m.log())
    return found.group(1) if found else "off"


def disk_budget(entry_bytes: int, packed: bool = True) -> int:
    """The ``--disk-cache-size`` (device bytes) that leaves exactly ``entry_bytes`` for the entries of a
    small tree (under 63 file entries, a snapshot and path digests of one page each, 4 KiB blocks): the
    overhead is the lock, the snapshot and the path digests (a page each), two pages each for the manifest
    and the scores (a second copy while one is replaced) and, with packed entries (``--disk-pack-below``
    on), two pages for the active segment's tail and the segments' slack: 128 KiB of dead records (twice
    the 64 KiB ``--disk-pack-below``) and one 64 KiB segment for a compaction's copy (a packed entry's
    ``entry_bytes`` is its record and an eighth of it). The disk tier's ``overhead_bytes`` in the stats is
    that overhead."""
    return entry_bytes + (7 * 4096 + (2 * 4096 + (192 << 10) if packed else 0))


def mounts_under(path) -> list:
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(str(path))]


def processes_naming(path) -> list:
    """Processes (not this one) whose command line names ``path``: a daemon, a trainer, a loader worker."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(path) in cmd:
            found.append((int(pid), cmd))
    return found


def children_of(pid: int) -> list:
    """(pid, command line) of the live direct children of ``pid``."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append((int(p), cmd))
    return out


def waiting_on_fuse(pid: int) -> list:
    """The threads of ``pid`` and of its descendants that wait for a FUSE daemon's answer (their kernel wait
    channel is ``request_wait_answer`` or another ``fuse`` function): ``(tid, wait channel)``."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        todo += [c for c, _ in children_of(p)]
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tids:
            try:
                wchan = Path(f"/proc/{p}/task/{t}/wchan").read_text()
            except OSError:
                continue
            if "request_wait_answer" in wchan or "fuse" in wchan:
                out.append((int(t), wchan))
    return out


def fashion_tree(tmp_path_factory, train: int, test: int) -> Path:
    """A Fashion-MNIST ImageFolder tree of ``train`` training and ``test`` test images
    (``scripts/make_fashion_mnist.py``) in a new temporary folder; its path."""
    out = tmp_path_factory.mktemp("fm") / "data"
    subprocess.run([sys.executable, str(Path(__file__).resolve().parents[2] / "scripts" / "make_fashion_mnist.py"),
                    str(out), "--limit-train", str(train), "--limit-test", str(test)],
                   check=True, capture_output=True, timeout=120)
    return out


@contextlib.contextmanager
def gated_fuse_source(tmp_path, spec: dict, gate: threading.Event, wait):
    """A FUSE source run in this process (the kernel front end over a :class:`GatedCache`) serving ``spec``
    (``{relative path: bytes}``, written under ``tmp_path/gated-src``) at ``tmp_path/gated``; opening a file
    below ``hang/`` blocks in ``wait()``. Yields ``(mountpoint, cache)``; on exit opens ``gate``, stops the
    front end and asserts the source is unmounted."""
    root = tmp_path / "gated-src"
    for rel, data in spec.items():
        os.makedirs(root / os.path.dirname(rel), exist_ok=True)
        (root / rel).write_bytes(data)
    ns = Namespace(PosixBackend(str(root)).walk())
    cache = GatedCache(ns, str(root), wait)
    mp = tmp_path / "gated"
    mp.mkdir()
    fe = KernelFrontend(ns, cache, None, mountpoint=str(mp), fsname="shadefs-test-gated", passthrough=False)
    t = threading.Thread(target=fe.run, daemon=True)
    t.start()
    wait_for(lambda: is_mounted(str(mp)))
    yield str(mp), cache
    gate.set()
    fe.stop()
    t.join(10)
    assert not is_mounted(str(mp))


@contextlib.contextmanager
def s3_class_objects(moto_server, bucket: str, n: int, size: int, seed: int):
    """A bucket of ``n`` objects of ``size`` random bytes (numpy ``default_rng(seed)``) at
    ``train/c{i % 4}/{i:04d}.bin`` on ``moto_server``; yields ``moto_server``, then deletes the objects and
    the bucket."""
    import numpy as np

    s3 = moto_server.client()
    s3.create_bucket(Bucket=bucket)
    rng = np.random.default_rng(seed)
    keys = [f"train/c{i % 4}/{i:04d}.bin" for i in range(n)]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=rng.bytes(size))
    yield moto_server
    for key in keys:
        s3.delete_object(Bucket=bucket, Key=key)
    s3.delete_bucket(Bucket=bucket)


class LockedPages:
    """The pages of an open file, mapped (``MAP_SHARED``, read-only) and locked in memory (``mlock``) until
    :meth:`close`: no reclaim drops them meanwhile. Use: a test that asserts what re-reads of a file through
    a mount reach the daemon, when the kernel keeps the file's pages between opens (``FOPEN_KEEP_CACHE``).

    Why: the kernel may reclaim clean page-cache pages with no memory pressure at all. This machine runs
    DAMON (``kdamond``, ``/sys/kernel/mm/damon/admin``) with a ``paddr`` ``pageout`` scheme, which pages
    out physical memory it sampled as unaccessed, now and then, whoever's pages it holds: ``/proc/vmstat``
    ``pgsteal_file`` grows while ``pgsteal_kswapd`` and ``pgsteal_direct`` stay 0. A file's pages dropped
    between two opens make the re-read reach the daemon again. Locked pages are not reclaimed.

    ``fd``: an open file (through the mount: locking faults in every page not resident yet, by READs of
    that open). Raises OSError when ``mmap`` or ``mlock`` fails (EPERM/ENOMEM: ``RLIMIT_MEMLOCK`` without
    ``CAP_IPC_LOCK``). The fd may be closed once this returns; the mapping holds the file.
    """

    def __init__(self, fd: int):
        self.size = os.fstat(fd).st_size
        self.addr = None
        libc = self._libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.mlock.argtypes = libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        if self.size == 0:
            return
        addr = libc.mmap(None, self.size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            e = ctypes.get_errno()
            raise OSError(e, f"mmap of {self.size} bytes: {os.strerror(e)}")
        if libc.mlock(addr, self.size) != 0:
            e = ctypes.get_errno() or errno.ENOMEM
            libc.munmap(addr, self.size)
            raise OSError(e, f"mlock of {self.size} bytes: {os.strerror(e)}")
        self.addr = addr

    def close(self) -> None:
        """Unmap (and so unlock) the pages. Idempotent."""
        addr, self.addr = self.addr, None
        if addr is not None:
            self._libc.munmap(addr, self.size)

    def __enter__(self) -> "LockedPages":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
