"""The kernel-protocol front end: shadefs speaks ``/dev/fuse`` directly (no libfuse), the default on Linux.

Threads and the path of one request (docs/architecture.md, "The front ends"):

- **Readers** (``--fuse-readers``, default 2) each block in ``read(2)`` on their own clone of the
  ``/dev/fuse`` fd (``FUSE_DEV_IOC_CLONE``) and answer everything that cannot wait on the backend on the
  spot: LOOKUP/GETATTR/READDIR(PLUS) from the namespace, an OPEN that is a RAM or NVMe hit
  (``cache.open_nowait``), a READ of an open hit, RELEASE. No handoff, no lock on the hot path. An OPEN
  that must wait leaves the reader with its lookup done (an ``OpenTicket``: the worker's
  ``cache.open_ticket`` does not look the file up again).
- **The compiled loop** (:mod:`shadefs.fuse._fastloop`, built by ``pip install`` where a C compiler is
  found; the default where it is built, ``SHADEFS_FUSE_PYTHON_LOOP=1`` selects the Python loop, see
  :class:`shadefs.config.Environment`): the readers' loop in C. It reads requests without the GIL, answers RELEASE
  itself and drops the released handles in batches (:meth:`_release_many`, before its next dispatch, at
  256, or ~2 ms after the first RELEASE of the batch), answers IOCTL (ENOTTY) itself, writes a hit's
  OPEN reply from the triple
  :meth:`_open_compiled` returns, and hands every other request to the same Python handlers. A
  kernel-cached open takes the GIL once (OPEN), not twice. Without passthrough, a RAM hit takes it not at
  all: the cache publishes a file's RAM bytes to :attr:`KernelFrontend.residents` at its first RAM hit
  (``cache.attach_residents``), and the loop answers the file's later OPEN, READ and RELEASE in C and logs
  each open, which the cache applies (counters, policy, plans, trace) in its next critical section, or
  within ~2 ms (``cache.apply_hits``); ``SHADEFS_FUSE_GIL_OPENS=1`` hands every OPEN to Python.
- **Misses on the reader**: a miss of a directory source that leads its own read (``OpenTicket.joins`` is
  False) is served on the reader that read its OPEN, no hand-off (``SHADEFS_FUSE_READER_MISSES=0``: on
  workers), while such misses take under :data:`READER_MISS_MAX_S` on average; a slower source sends
  misses to the workers for :data:`READER_MISS_BACKOFF_S`. A miss that holds its reader past
  :data:`~shadefs.fuse.spare.SPARE_AFTER_S` (a few ms) gets a spare reader started on the same fd
  (:class:`~shadefs.fuse.spare.ReaderWatch`), so a hung source never holds every reader; the replaced
  reader ends once its miss is over. A read stuck past ``--backend-timeout`` is answered EIO by the
  backend's watchdog (:func:`~shadefs.backends.timeout.on_deadline`).
- **Workers** take what may block: any other OPEN that is a miss (``cache.open`` waits on the backend, or
  on another open's read of the file) and a READ of a file streamed by ranges. They reply themselves when the data arrives (a reply may come from any
  thread, in any order; it must go to the fd the request was read from). The pool grows with the misses
  in flight (up to ``max_workers``) and shrinks when idle, so a hit never waits behind a miss and hung
  backend reads cannot starve the mount.
- **INTERRUPT**: a request handed to a worker is answered EINTR as soon as the kernel interrupts it
  (its caller got a signal, or was killed); the worker's late reply is dropped and its handle released.
  A killed reader is never left in D state waiting for shadefs.

Node ids are the namespace's dense ids: ``nodeid 1`` (FUSE_ROOT_ID) is the root directory, every other
node ``id`` is ``nodeid id + 2`` (no path parsing per request, no per-node state: FORGET is a no-op).

Passthrough (kernel >= 6.9, CAP_SYS_ADMIN, negotiated in INIT): an OPEN served by the NVMe tier is
answered with ``FOPEN_PASSTHROUGH`` and a backing id registered from the entry's fd
(``FUSE_DEV_IOC_BACKING_OPEN``), so the kernel reads the entry file itself; every open still reaches the
daemon (counting stays per open). The kernel requires all concurrent opens of one inode to agree (all
passthrough on the same backing file, or all cached): :class:`_Modes` keeps that per file. Backing ids
outlive the last release (at most ``KEEP_BACKING_IDS``), tied to the entry generation they were
registered from: under ``--verify-entries first-hit`` an NVMe hit of a file with a backing id in use or
kept is counted by ``cache.open_kept(fid, gen)`` (one critical section) and answered with that id, without
opening the entry, as long as that generation is still the resident, verified entry; an evicted,
replaced or corrupt entry's id is never reused by a hit (the open takes the usual path, and a new id).
While opens of a file are on a backing id, every new open of it must use that id too: that is correct
for an evicted or promoted generation (same bytes), never for one dropped as corrupt
(``cache.entry_dropped``). The kernel lets go of an inode's backing file before it sends the RELEASE of
its last open, so a daemon-side count still held only by RELEASEs in flight on another reader thread
is waited for (up to :data:`RELEASE_WAIT_S`); an open while the corrupt generation is really still open
is refused with EIO (logged once, counted at unmount), never served that generation's bytes.

Passthrough to the source file (``--source-passthrough``, a directory source): an open the cache serves
from the source (a file no tier admits; a chunked file no tier would take more of, or any under ``large``:
``cache.source_fd``) is answered with a backing id registered from the source file, opened and checked
against the snapshot on a worker; the id is closed at the file's last release (never kept), so every later
open checks the source file again. Its ``_Modes`` generation is -1.

The kernel's pages (``FUSE_NOTIFY_RETRIEVE``): with the kernel cache on, the kernel keeps a file's pages
between opens, in the reader's memory, for as long as that memory lets it. :meth:`KernelFrontend.pages_held`
asks the kernel whether it still holds a file's first and last page (one retrieve of one byte each; the
kernel answers with a ``NOTIFY_REPLY`` request carrying the bytes it found), and the plan prefetcher asks
before reading ahead a file that was opened before (:mod:`shadefs.plan.prefetch`): an observation, not
an estimate of what the reader's memory keeps.

Set ``SHADEFS_FUSE_CHECK_REPLIES=1`` to check every reply's length against its opcode (the test suite
does); a bad reply is logged as ``FUSE reply check failed`` with a traceback.
"""
from __future__ import annotations

import errno
import fcntl
import itertools
import logging
import os
import queue
import signal
import struct
import sys
import threading
import time
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

from ..backends.base import BackendError, reply_errno
from ..backends.timeout import on_deadline
from ..cache.core import Handle, OpenTicket
from ..plan.plans import set_opener
from ..procutil import name_thread
from . import protocol as P
from .mount import mount_fuse, unmount_fuse
from .spare import ReaderWatch
from ..config import Environment
from .ops import ENDPOINT_XATTR, endpoint_of, listdir_slice, statfs_values

try:  # the reader loop in C, built by `pip install` where a compiler is found (setup.py); else the Python loop
    from . import _fastloop
except ImportError:
    _fastloop = None

_PID = struct.Struct("=I")
_PID_OFFSET = 32  # fuse_in_header: len, opcode (4 + 4), unique, nodeid (8 + 8), uid, gid (4 + 4), pid

__all__ = ["KernelFrontend"]

log = logging.getLogger("shadefs.fuse")

TIMEOUT_S = 3600          # entry, attribute and negative-entry cache timeouts (the snapshot is immutable)
MAX_PAGES = 256           # 1 MiB per READ
MAX_WRITE = 4096          # read-only: keeps the request buffer at FUSE_MIN_READ_BUFFER
BUFSIZE = 4 * P.MIN_READ_BUFFER

# backing ids kept between opens, at most: each holds ~0.5 KB of unreclaimable kernel memory (a struct file and
# a fuse_backing: measured +192 B filp and +64 B kmalloc-64 slab objects per id, 470 B of SUnreclaim) and keeps
# its entry's inode and dentry (~1.3 KB) from being reclaimed; 65536 ids: ~32 MiB + ~85 MiB. (It was 256 MiB
# of entry bytes: 2,400 ids for ~110 KB files, too few for an epoch to find its id again, and up to 900k ids
# for ~300 B files. Bytes do not matter: an evicted entry's id is closed by the entry_unlinked hook.)
KEEP_BACKING_IDS = 65536
# CPython hands the GIL to a waiting thread only after the holder ran this long (default 5 ms): a reader
# thread woken by a hit then waits behind a worker busy with a miss. At 0.25 ms a hit waits at most that.
SWITCH_INTERVAL_S = 0.00025
# seconds an open of a file waits for the RELEASEs of opens of a dropped (corrupt) disk entry generation that
# hold its passthrough backing id (another reader thread is handling them), before it is refused with EIO
RELEASE_WAIT_S = 2.0
# seconds an open that would go to the source file waits for the RELEASEs of earlier opens of the file that
# hold it in cached mode (the kernel sends RELEASE after close() returns, and the compiled loop applies
# RELEASEs in batches within ~2 ms): a reopen right after a close then still gets the source file; an open
# that is really still open past it makes the new open join its cached mode
SOURCE_RELEASE_WAIT_S = 0.02
APPLY_HITS_S = 0.05   # at most this long between the logging and the counting of a RAM hit answered in C
READERS = 2      # measured: 2 reader threads cost less CPU per open than 4 (GIL handoffs), same throughput
# misses served on a reader thread that take longer than this on average (a moving average over about the
# last 32: a miss preempted for a few ms on a busy machine does not make the source slow)...
READER_MISS_MAX_S = 0.002
# ...sends the misses to the workers for this long (then one is tried on a reader again)
READER_MISS_BACKOFF_S = 5.0
# seconds a page probe waits for the kernel's NOTIFY_REPLY before it takes the pages to be gone (the kernel
# queues the reply before the notify's write returns; a reader thread answers it within a request's time)
PROBE_TIMEOUT_S = 1.0
PAGE = 4096


_OUT_HEADER_PACK = P.OUT_HEADER.pack
_OUT_HEADER_SIZE = P.OUT_HEADER.size


class _SourceReads:
    """The handle of an open answered by passthrough to the source file. The kernel reads the source file
    itself; the READs that still reach the daemon are the kernel's read-ahead into the mount's own pages,
    which passthrough does not redirect (``posix_fadvise(POSIX_FADV_WILLNEED)``: pyarrow issues one per
    column chunk or row group it is about to read). They are served from the checked source file's fd,
    kept for the open: no chunk is opened or admitted for them. ``bytes_read`` counts them (all handles)."""

    __slots__ = ("h", "fd", "size", "fds")
    source = "source"
    bytes_read = 0

    def __init__(self, h, fd: int, fds):
        # ``fds``: the cache's descriptor reserve (shadefs.procutil.FdReserve), which granted holding ``fd``
        self.h, self.fd, self.size, self.fds = h, fd, h.size, fds

    def read(self, offset: int, length: int) -> bytes:
        end = min(self.size, offset + length)
        out = b""
        while offset + len(out) < end:
            piece = os.pread(self.fd, end - offset - len(out), offset + len(out))
            if not piece:
                raise OSError(errno.EIO, f"the source file ended at {offset + len(out)}, expected {end}")
            out += piece
        _SourceReads.bytes_read += len(out)
        return out

    def release(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)
            self.fds.drop()
        self.h.release()


class _StopFlag(threading.Event):
    """An Event whose state is also the plain attribute ``stopped``: the reader loop reads it once per
    request (``Event.is_set`` is a Python call there). Each reader thread's loop reads its own
    :class:`_ReaderStop`, set with this one (:meth:`reader`), or alone when that reader retires."""

    stopped = False

    def __init__(self):
        super().__init__()
        self._readers: List["_ReaderStop"] = []

    def reader(self) -> "_ReaderStop":
        r = _ReaderStop()
        self._readers.append(r)
        r.stopped = self.stopped
        return r

    def set(self) -> None:
        self.stopped = True
        for r in list(self._readers):
            r.stopped = True
        super().set()


class _ReaderStop:
    """One reader thread's stop flag: ``stopped`` when the front end stops, or when the reader was
    replaced by a spare while it served a slow miss (``retired``: only this reader ends)."""

    stopped = False
    retired = False


class _Workers:
    """A thread pool that grows when every worker is busy (a miss never queues behind hung misses) and
    shrinks after ``idle_s`` seconds without work. At ``max_threads`` further work queues."""

    def __init__(self, max_threads: int = 256, idle_s: float = 30.0):
        self.max_threads, self.idle_s = max_threads, idle_s
        self._q: "queue.SimpleQueue" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0        # waiting threads not yet promised an item (negative: items queued at the cap)
        self.threads = 0
        self.peak = 0

    def submit(self, fn, *args) -> None:
        with self._lock:
            spawn = self._idle <= 0 and self.threads < self.max_threads
            if spawn:
                self.threads += 1
                self.peak = max(self.peak, self.threads)
            else:
                self._idle -= 1
        self._q.put((fn, args))
        if spawn:
            threading.Thread(target=self._run, name="fuse-worker", daemon=True).start()

    def _run(self) -> None:
        name_thread()
        while True:
            try:
                fn, args = self._q.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:
                        self._idle -= 1
                        self.threads -= 1
                        return
                continue
            try:
                fn(*args)
            except Exception:
                log.exception("FUSE worker: unexpected error")
            with self._lock:
                self._idle += 1


class _Probe:
    """One :meth:`KernelFrontend.pages_held`: ``want`` retrieves, ``found`` of them answered with bytes."""

    __slots__ = ("want", "answered", "found", "done", "lock")

    def __init__(self, want: int):
        self.want, self.answered, self.found = want, 0, 0
        self.done = threading.Event()
        self.lock = threading.Lock()

    def answer(self, found: bool) -> None:
        with self.lock:
            self.answered += 1
            self.found += found
            if self.answered == self.want:
                self.done.set()


class BackingConflict(OSError):
    """An open of a file while opens of a dropped generation of its disk entry hold the kernel's backing file
    for it (:meth:`_Modes.acquire`): answered EIO. ``first``: the first of the mount (logged)."""

    def __init__(self, fid: int, gen: int, opens: int, first: bool):
        super().__init__(errno.EIO, f"{opens} open(s) of the dropped disk entry generation {gen} still hold its "
                                    "passthrough backing file")
        self.fid, self.first = fid, first


class _Modes:
    """Per file: the io mode the kernel holds for its open files (passthrough on one backing id, or cached)
    and how many of our handles are open in it. Only used when passthrough was negotiated.

    Each backing id is tied to the disk entry generation it was registered from (``Handle.gen``): an open
    of a file with a backing id in use or kept (:meth:`gen_of`) is first offered to
    ``cache.open_kept(fid, gen)``, which counts the hit without opening the entry when that generation is
    still resident and verified; a backing id is reused for a disk hit only of the same generation."""

    def __init__(self, dev_fd: int, keep_ids: int = KEEP_BACKING_IDS):
        self.dev_fd = dev_fd
        self.lock = threading.Lock()
        # notified when the last open of a dropped generation is released (acquire may wait for it)
        self.cond = threading.Condition(self.lock)
        self.files: Dict[int, List] = {}   # fid -> [backing_id or None, open count, bytes, keep at release, gen]
        # backing ids kept registered after the last release of an NVMe hit, so that the next NVMe hit of
        # the file opens nothing and makes no ioctl (cache.open_kept); at most keep_ids (least recently
        # released first out), closed as soon as their entry is unlinked (forget) or an open of the file is
        # not an NVMe hit of the same generation
        self.kept: "OrderedDict[int, Tuple[int, int, int]]" = OrderedDict()   # fid -> (backing id, bytes, gen)
        self.kept_bytes = 0                # entry bytes of the kept ids (a figure, not a bound)
        self.keep_ids = keep_ids
        # fid -> generation of its disk entry dropped as corrupt, while a state or kept id may hold it
        self.bad: Dict[int, int] = {}
        self.release_wait_s = RELEASE_WAIT_S
        self.conflicts = 0                 # opens refused: a dropped generation was still open (EIO)
        self.waits = 0                     # opens that waited for the release of a dropped generation's opens
        self.backing_errors = 0
        self.first_error: Optional[str] = None

    def gen_of(self, fid: int) -> Optional[int]:
        """The entry generation of the backing id open or kept for ``fid``, or None (no lock: a hint that
        ``cache.open_kept`` checks, and :meth:`acquire` checks again; None for the source file's)."""
        st = self.files.get(fid)
        if st is not None:
            return st[4] if st[0] is not None and st[4] >= 0 else None
        kept = self.kept.get(fid)
        return kept[2] if kept is not None else None

    def acquire(self, fid: int, h, may_wait: bool = True, source_fd: Optional[int] = None) -> Optional[int]:
        """Count one open of ``fid`` served by ``h``; returns the backing id to answer it with (None: cached
        mode). ``source_fd``: the source file, for an open served from the source (``cache.source_fd``):
        registered as the backing file when no open of ``fid`` holds an io mode (else the open joins that
        mode: a backing id of a disk entry serves the same bytes); never kept past the last release, so
        that every later open opens and checks the source file again. Its generation is -1.

        While opens of ``fid`` are counted on a backing id of a disk entry generation that was dropped as
        corrupt (:meth:`dropped`) and ``h`` is not of that generation, the kernel would read the dropped
        entry's bytes through that id: this waits up to :data:`RELEASE_WAIT_S` for their RELEASEs (handled on
        another reader thread; ``may_wait`` False: on the only one, so none can come meanwhile), then
        registers ``h``'s own backing file. Any other generation's id is reused (an evicted or promoted
        entry holds the same bytes: the snapshot does not change).

        Raises:
            BackingConflict: those opens are still open (the file's holders read the dropped entry until
                they close it; a new open cannot be given another backing file meanwhile).
        """
        stale = None
        gen = getattr(h, "gen", 0)
        with self.cond:
            st = self.files.get(fid)
            if st is not None and st[0] is not None and st[4] != gen and self.bad.get(fid) == st[4]:
                if may_wait:
                    self.waits += 1
                    deadline = time.monotonic() + self.release_wait_s
                    while st is not None and self.bad.get(fid) == st[4] and st[4] != gen:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self.cond.wait(left)
                        st = self.files.get(fid)
                if st is not None and st[0] is not None and self.bad.get(fid) == st[4] and st[4] != gen:
                    self.conflicts += 1
                    first = self.conflicts == 1
                    raise BackingConflict(fid, st[4], st[1], first)
            if st is None:
                bid = None
                kept = self.kept.get(fid)
                keep = True
                if h.outcome == "disk" and kept is not None and kept[2] == gen:
                    bid = kept[0]
                else:
                    stale = kept
                    bfd = h.backing_fd()
                    if bfd is not None:
                        bid = self._backing_open(bfd)
                        # unlinked since the handle opened it (forget() ran before this file had a state)
                        keep = os.fstat(bfd).st_nlink > 0
                    elif source_fd is not None:
                        bid = self._backing_open(source_fd)
                        keep = False
                        gen = -1
                if gen >= 0 and self.bad.get(fid, gen) != gen:
                    del self.bad[fid]  # a newer generation is open: the dropped one is never opened again
                st = self.files[fid] = [bid, 0, h.size, keep, gen]
                if kept is not None:  # after the state is set: gen_of (no lock) finds one or the other
                    del self.kept[fid]
                    self.kept_bytes -= kept[1]
            st[1] += 1
            bid = st[0]
        if stale is not None:
            self._backing_close(stale[0])
        return bid

    def wait_uncached(self, fid: int, timeout: float) -> None:
        """Wait up to ``timeout`` seconds while opens of ``fid`` are counted in cached mode (their RELEASEs
        may be in flight)."""
        with self.cond:
            deadline = None
            while True:
                st = self.files.get(fid)
                if st is None or st[0] is not None:
                    return
                now = time.monotonic()
                if deadline is None:
                    deadline = now + timeout
                if now >= deadline:
                    return
                self.cond.wait(deadline - now)

    def dropped(self, fid: int, gen: int) -> None:
        """Generation ``gen`` of ``fid``'s disk entry was dropped as corrupt (``cache.entry_dropped``): a
        backing id of it is never given to an open of another generation (:meth:`acquire`)."""
        with self.cond:
            self.bad[fid] = gen
            st = self.files.get(fid)
            if st is not None and st[4] == gen:
                st[3] = False  # closed at its last release, never kept
            kept = self.kept.get(fid)
            if kept is not None and kept[2] == gen:
                del self.kept[fid]
                self.kept_bytes -= kept[1]
            else:
                kept = None
        if kept is not None:
            self._backing_close(kept[0])

    def release(self, fid: int) -> None:
        with self.cond:
            st = self.files.get(fid)
            if st is None:
                return
            st[1] -= 1
            if st[1] > 0:
                return
            drop = []
            if st[0] is not None:
                if st[3] and self.keep_ids > 0:
                    # kept before the state goes: gen_of (no lock) finds the id in one or the other
                    self.kept[fid] = (st[0], st[2], st[4])
                    self.kept_bytes += st[2]
                    while len(self.kept) > self.keep_ids:
                        _, (bid, size, _) = self.kept.popitem(last=False)
                        self.kept_bytes -= size
                        drop.append(bid)
                else:
                    drop.append(st[0])
            del self.files[fid]
            # an open of a newer generation may wait for the last open of a dropped one (acquire), an open
            # of the source file for the last cached one (wait_uncached)
            self.cond.notify_all()
        for bid in drop:
            self._backing_close(bid)

    def forget(self, fid: int, gen: int) -> None:
        """Generation ``gen`` of ``fid``'s disk entry was unlinked (``cache.entry_unlinked``): close a backing
        id kept for that generation (it pins the unlinked file on the cache filesystem, outside the disk
        budget), and keep none of it at its last release. A backing id of another generation stays: the
        mover may unlink an old generation after a refill of the file wrote a new one and its open
        registered (and kept) the new entry's id."""
        with self.lock:
            kept = self.kept.get(fid)
            if kept is not None and kept[2] == gen:
                del self.kept[fid]
                self.kept_bytes -= kept[1]
            else:
                kept = None
            st = self.files.get(fid)
            if st is not None and st[4] == gen:
                st[3] = False  # its entry is gone: closed at the last release
        if kept is not None:
            self._backing_close(kept[0])

    def _backing_close(self, bid: int) -> None:
        try:
            fcntl.ioctl(self.dev_fd, P.DEV_IOC_BACKING_CLOSE, bytearray(P.struct.pack("=I", bid)), True)
        except OSError as e:
            log.warning("FUSE_DEV_IOC_BACKING_CLOSE %d: %s", bid, e)

    def _backing_open(self, bfd: int) -> Optional[int]:
        try:
            return fcntl.ioctl(self.dev_fd, P.DEV_IOC_BACKING_OPEN, bytearray(P.BACKING_MAP.pack(bfd, 0, 0)), True)
        except OSError as e:
            self.backing_errors += 1
            if self.first_error is None:
                self.first_error = str(e)
                log.warning("passthrough: FUSE_DEV_IOC_BACKING_OPEN failed (%s); serving NVMe hits through the "
                            "daemon instead (logged once)", e)
            return None


class KernelFrontend:
    """Serve a :class:`~shadefs.namespace.Namespace` and a cache on ``mountpoint`` through ``/dev/fuse``.

    Args:
        namespace: the metadata snapshot (node ids are its dense ids).
        cache: the read path (``open``/``open_nowait`` -> :class:`~shadefs.cache.core.Handle`).
        daemon: ``on_mounted()`` is called once INIT is answered; ``daemon.endpoint`` is served as the
            ``user.shadefs.endpoint`` xattr. May be None.
        mountpoint: an existing empty directory.
        fsname: the mount's source in /proc/self/mounts.
        allow_other: let other users in (the kernel checks).
        kernel_cache: answer hits and opens of untiered files with FOPEN_KEEP_CACHE (``Handle.keep_pages``).
        passthrough: use FUSE passthrough when the kernel allows it (NVMe hits, and files served from
            the source as ``source_passthrough`` says).
        source_passthrough: opens served from the source (no tier holds the file) answered by
            passthrough to the source file (``cache.source_fd``): ``"untiered"`` (files no tier would
            take any part of), ``"large"`` (also every chunked file, whatever the tiers hold) or ``"off"``;
            only with a backend that opens source files (posix).
        readers: reader threads (each on its own clone of the /dev/fuse fd).
        max_workers: cap on the worker threads that serve misses (misses beyond it queue).
    """

    def __init__(self, namespace, cache, daemon=None, *, mountpoint: str, fsname: str = "shadefs",
                 allow_other: bool = False, kernel_cache: bool = True, passthrough: bool = True,
                 readers: int = READERS, max_workers: int = 256, source_passthrough: str = "off"):
        self.ns = namespace
        self.cache = cache
        self.daemon = daemon
        self.mountpoint = os.path.abspath(mountpoint)
        self.fsname = fsname
        self.allow_other = allow_other
        self.kernel_cache = kernel_cache
        self.want_passthrough = passthrough
        if source_passthrough not in ("untiered", "large", "off"):
            raise ValueError(f"source_passthrough {source_passthrough!r}: choose untiered, large or off")
        backend = getattr(cache, "backend", None)
        # the mode asked for, where the backend opens source files (posix); set on the cache at INIT
        self.want_source = source_passthrough if getattr(backend, "open_source", None) is not None else "off"
        self.source_mode = "off"  # what INIT granted
        self.nreaders = max(1, int(readers))
        self.workers = _Workers(max_workers)
        self._open_nowait = cache.open_nowait
        # a cache with tickets: a miss's lookup on the reader is not repeated on the worker (open_ticket)
        self._open_ticket = getattr(cache, "open_ticket", None)
        # a reused snapshot: each file's record is compared with the source at its first LOOKUP
        self._recheck = getattr(cache, "recheck", None) if getattr(cache, "_unchecked", None) is not None else None
        self._recheck_needed = getattr(cache, "unchecked", None)
        # a cache that counts an NVMe hit on a kept passthrough backing id without opening the entry: set at
        # INIT when passthrough is on and the cache verifies entries at their first hit only (every-open reads
        # the entry at every hit)
        self._open_kept = None
        env = Environment.from_env()  # the front end's switches of the environment (docs/configuration.md)
        self.check_replies = env.fuse_check_replies
        # the reader loop in C (shadefs.fuse._fastloop) where it was built
        self.compiled_loop = _fastloop is not None and not env.fuse_python_loop
        # the RAM tier's residents whose OPEN, READ and RELEASE the compiled loop answers without the GIL
        # (set at INIT: _fastloop.Residents, attached to the cache), or None
        self.residents = None
        self.gil_opens = env.fuse_gil_opens
        # a miss of a directory source is served on the reader that read its OPEN (no hand-off to a worker)
        # while the source answers within READER_MISS_MAX_S; a network backend's misses always go to workers
        self.reader_misses = (getattr(backend, "scheme", None) == "file" and self._open_ticket is not None
                              and env.fuse_reader_misses)
        self._reader_misses_after = 0.0   # monotonic time before which misses go to workers (backoff)
        self._reader_miss_s = 0.0         # moving average of a reader miss's wall time, seconds
        self.reader_misses_served = 0     # misses served on a reader thread
        self.reader_misses_slow = 0       # backoffs: the moving average went past READER_MISS_MAX_S
        self.spare_readers = 0            # reader threads started in place of one stuck on the source
        # a reader in a miss for longer than spare.SPARE_AFTER_S is replaced by a spare reader, and ends
        # once its miss is over: a hung source never holds the readers (shadefs.fuse.spare)
        self.reader_watch = ReaderWatch(self._start_spare) if self.reader_misses else None
        self._reader_local = threading.local()   # .stop: the reader thread's _ReaderStop
        self.fd: Optional[int] = None
        self._fds: List[int] = []
        self._stop = _StopFlag()
        self._files: Dict[int, Tuple] = {}       # fh -> (handle, fid)
        self._next_fh = itertools.count(1)
        self._pending: Dict[int, int] = {}       # unique -> fd, requests a worker is serving
        self._plock = threading.Lock()
        self._early_interrupts = set()           # INTERRUPTs read before their request was registered
        self.modes: Optional[_Modes] = None
        self.passthrough = False
        self.passthrough_reason = "not negotiated"
        self.proto_minor = 0
        self.interrupted = 0
        self.passthrough_opens = 0
        self.kept_opens = 0       # NVMe hits counted on a backing id we hold, without opening the entry
        self.source_opens = 0     # opens answered by passthrough to the source file
        self.reply_errors = 0
        self.ioctls = 0           # IOCTL requests answered by the Python handlers (the compiled loop counts its own)
        # page probes (FUSE_NOTIFY_RETRIEVE) waiting for their NOTIFY_REPLY: notify unique -> _Probe
        self._probes: Dict[int, "_Probe"] = {}
        self._opening: Dict[int, int] = {}       # unique -> file id: OPENs whose handle is not yet in _files
        self._probe_ids = itertools.count(1)
        self.retrieve = True      # False once a retrieve failed other than ENOENT: probes answer None from then on
        self.probes = 0           # files probed
        self.probes_held = 0      # ... whose first and last page the kernel held
        self.probe_timeouts = 0   # retrieves the kernel did not answer within PROBE_TIMEOUT_S
        nf = self.ns.num_files
        self._root = self.ns.root
        self._num_files = nf
        self._ops = {
            P.LOOKUP: self._lookup, P.GETATTR: self._getattr, P.OPEN: self._open, P.READ: self._read,
            P.RELEASE: self._release, P.OPENDIR: self._opendir, P.READDIR: self._readdir,
            P.READDIRPLUS: self._readdirplus, P.RELEASEDIR: self._reply_ok, P.STATFS: self._statfs,
            P.GETXATTR: self._getxattr, P.LISTXATTR: self._listxattr, P.INTERRUPT: self._interrupt,
            P.FORGET: self._noreply, P.BATCH_FORGET: self._noreply, P.DESTROY: self._destroy,
            P.INIT: self._reinit, P.FLUSH: self._enosys, P.ACCESS: self._enosys, P.IOCTL: self._enotty,
            P.NOTIFY_REPLY: self._notify_reply,
        }

    # -- node ids -------------------------------------------------------------------------------------
    def node_of(self, nodeid: int) -> int:
        """Namespace id of a FUSE node id (1 = root, else id + 2). Raises KeyError for an unknown one."""
        if nodeid == P.ROOT_ID:
            return self._root
        node = nodeid - 2
        if node < 0 or node >= self.ns.num_nodes or node == self._root:
            raise KeyError(nodeid)
        return node

    def nodeid_of(self, node: int) -> int:
        return P.ROOT_ID if node == self._root else node + 2

    def _attr(self, node: int) -> bytes:
        mode, size, mtime_ns, uid, gid, nlink = self.ns.attr(node)
        return P.encode_attr(self.nodeid_of(node), mode, size, mtime_ns, uid, gid, nlink)

    # -- lifecycle --------------------------------------------------------------------------------------
    def run(self) -> None:
        """Mount, answer INIT, start the readers, call ``daemon.on_mounted()``, serve until unmounted
        (``shadefs umount``/``fusermount -u``), SIGTERM/SIGINT (unmounts lazily, as libfuse does) or
        DESTROY. Blocks.

        Raises:
            OSError: the mount failed or the kernel's INIT could not be answered.
        """
        self.fd = mount_fuse(self.mountpoint, self.fsname, allow_other=self.allow_other)
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._fds = [self.fd]
        signalled = []
        old = {}
        try:
            if threading.current_thread() is threading.main_thread():
                # before the first request is served: a signal sent once the mount answers is never missed
                def on_signal(signum, frame):
                    signalled.append(signum)
                    self._stop.set()
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    old[sig] = signal.signal(sig, on_signal)
            self._serve_init(self.fd)
            for _ in range(self.nreaders - 1):
                clone = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
                fcntl.ioctl(clone, P.DEV_IOC_CLONE, bytearray(P.struct.pack("=I", self.fd)), True)
                self._fds.append(clone)
            for i, fd in enumerate(self._fds):
                threading.Thread(target=self._reader, args=(fd,), name=f"fuse-reader-{i}", daemon=True).start()
            if self.daemon is not None:
                self.daemon.on_mounted()
            # a signal taken by another thread (SIGTERM sent while the daemon was stopped, then SIGCONT)
            # only sets Python's flag: its handler runs on this thread when the wait returns
            # with RAM hits answered in C: their log is applied at least every APPLY_HITS_S (a busy reader
            # thread applies it every ~2 ms or 256 hits; an idle one blocks in read)
            res = self.residents
            while not self._stop.wait(0.5 if res is None else APPLY_HITS_S):
                if res is not None and res.pending():
                    self.cache.apply_hits()
        finally:
            self._stop.set()
            if self.reader_watch is not None:
                self.reader_watch.close()
            for sig, handler in old.items():
                signal.signal(sig, handler)
            if signalled:
                log.info("signal %d: unmounting %s", signalled[0], self.mountpoint)
            unmount_fuse(self.mountpoint)   # a no-op when the kernel already unmounted us
            log.info("kernel front end: %d opens answered by passthrough (%d of them NVMe hits on a kept backing "
                     "id, without opening the entry; %d to the source file), %d requests interrupted, %d worker "
                     "threads at most; %d opens waited for the release of a corrupt entry's backing file, %d of "
                     "them refused (still open)",
                     self.passthrough_opens, self.kept_opens, self.source_opens, self.interrupted, self.workers.peak,
                     self.modes.waits if self.modes else 0, self.modes.conflicts if self.modes else 0)
            if self.source_opens:
                log.info("kernel front end: %d bytes of read-ahead READs of opens on the source file served "
                         "from it (posix_fadvise WILLNEED into the mount's own pages)", _SourceReads.bytes_read)
            log.info("kernel front end: %d misses served on a reader thread (%d times slower than %g ms on "
                     "average: misses went to the workers for %g s after each), %d spare readers started in place of one "
                     "stuck on the source", self.reader_misses_served, self.reader_misses_slow,
                     READER_MISS_MAX_S * 1e3, READER_MISS_BACKOFF_S, self.spare_readers)
            ioctls = self.ioctls + (getattr(_fastloop, "ioctls", int)() if self.compiled_loop else 0)
            log.info("kernel front end: %d IOCTL requests answered ENOTTY", ioctls)
            if self.residents is not None:
                c = self.residents.counters()
                log.info("kernel front end: %d RAM hits (%d READs of them) answered without the GIL, %d files "
                         "published, %d opens left to Python with the hit log full", c["opens"], c["reads"],
                         c["published"], c["log_full"])
            for fd in self._fds:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def stop(self) -> None:
        """Ask :meth:`run` to unmount and return (thread-safe)."""
        self._stop.set()

    def _serve_init(self, fd: int) -> None:
        buf = bytearray(BUFSIZE)
        while True:
            try:
                n = os.readv(fd, [buf])
                break
            except OSError as e:
                if e.errno in (errno.EINTR, errno.ENOENT):
                    continue
                raise
        h = P.decode_in_header(buf)
        if h.opcode != P.INIT:
            raise OSError(errno.EPROTO, f"first FUSE request is opcode {h.opcode}, not INIT")
        init = P.decode_init_in(buf, P.IN_HEADER.size, n - P.IN_HEADER.size)
        if init.major != P.KERNEL_VERSION:
            self._send(fd, h.unique, P.INIT, errno.EPROTO, ())
            raise OSError(errno.EPROTO, f"kernel FUSE protocol {init.major}.{init.minor} (need 7.x)")
        self.proto_minor = minor = min(init.minor, P.KERNEL_MINOR_VERSION)
        want = P.ASYNC_READ | P.PARALLEL_DIROPS | P.DO_READDIRPLUS | P.MAX_PAGES
        if init.flags & P.INIT_EXT:
            want |= P.INIT_EXT
        if not self.want_passthrough:
            self.passthrough_reason = "off (--no-passthrough)"
        elif not init.flags & P.PASSTHROUGH:
            self.passthrough_reason = f"off (the kernel's FUSE 7.{init.minor} does not offer it; needs Linux >= 6.9 " \
                                      "built with CONFIG_FUSE_PASSTHROUGH)"
        elif not _has_cap_sys_admin():
            self.passthrough_reason = "off (needs CAP_SYS_ADMIN)"
        elif (self.cache is None or getattr(self.cache, "disk", None) is None) and self.want_source == "off":
            self.passthrough_reason = "off (no NVMe tier, and no passthrough to the source: --source-passthrough " \
                                      "off, or a source other than a directory)"
        else:
            want |= P.PASSTHROUGH
        flags = want & init.flags
        self.passthrough = bool(flags & P.PASSTHROUGH)
        if self.passthrough:
            self.passthrough_reason = "on (NVMe hits are read by the kernel from the entry file"
            if self.want_source != "off":
                self.source_mode = self.want_source
                self.cache.source_passthrough = self.source_mode
                self.passthrough_reason += f"; files served from the source, from the source file: " \
                                           f"{self.source_mode}"
            self.passthrough_reason += ")"
            self.modes = _Modes(fd)
            if getattr(self.cache, "verify_entries", None) == "first-hit":
                self._open_kept = getattr(self.cache, "open_kept", None)
            hooks = getattr(self.cache, "entry_unlinked", None)
            if hooks is not None:  # an evicted entry must not stay pinned outside --disk-cache-size
                hooks.append(self.modes.forget)
            hooks = getattr(self.cache, "entry_dropped", None)
            if hooks is not None:  # a corrupt entry's backing id is never given to another generation's open
                hooks.append(self.modes.dropped)
        self._attach_residents()
        prefetcher = getattr(self.cache, "prefetcher", None)
        if self.kernel_cache and prefetcher is not None:
            # the kernel may keep pages between opens: the prefetcher asks it before reading a file again
            prefetcher.page_probe = self.pages_held
            prefetcher.page_open = self.open_now
        body = P.encode_init_out(minor, init.max_readahead, flags, max_background=64, congestion_threshold=48,
                                 max_write=MAX_WRITE, time_gran=1, max_pages=MAX_PAGES,
                                 max_stack_depth=1 if self.passthrough else 0)
        if not self._send(fd, h.unique, P.INIT, 0, (body,)):
            raise OSError(errno.ENODEV, "the kernel dropped the INIT reply")
        names = [name for bit, name in P.INIT_FLAG_NAMES.items() if flags & bit and bit != P.INIT_EXT]
        log.info("FUSE kernel protocol 7.%d (kernel offers 7.%d): %s; max_pages %d, max_readahead %d KiB, "
                 "%d reader threads (%s loop%s); passthrough %s", minor, init.minor, ", ".join(names), MAX_PAGES,
                 init.max_readahead // 1024, self.nreaders, "compiled" if self.compiled_loop else "Python",
                 ", RAM hits answered without the GIL" if self.residents is not None else "",
                 self.passthrough_reason)

    def _attach_residents(self) -> None:
        """With the compiled loop, a cache that supports it and no passthrough (whose per-file io modes,
        :class:`_Modes`, every open must take part in): RAM hits' OPEN, READ and RELEASE are answered in C
        without the GIL (docs/architecture.md, "The front ends")."""
        attach = getattr(self.cache, "attach_residents", None)
        if (not self.compiled_loop or attach is None or self.modes is not None or self.gil_opens
                or not hasattr(_fastloop, "Residents")):
            return
        self.residents = _fastloop.Residents(self._num_files, P.FOPEN_KEEP_CACHE if self.kernel_cache else 0)
        attach(self.residents)

    # -- the reader loop ---------------------------------------------------------------------------------
    def _reader(self, fd: int) -> None:
        name_thread()
        stop = self._reader_local.stop = self._stop.reader()
        try:
            self._reader_loop(fd, stop)
        finally:
            try:
                self._stop._readers.remove(stop)
            except ValueError:
                pass

    def _reader_loop(self, fd: int, stop: "_ReaderStop") -> None:
        if _fastloop is not None and self.compiled_loop:
            self._reader_compiled(fd, stop)
            return
        buf = bytearray(BUFSIZE)
        dispatch = self._dispatch  # the same per-request handling as the compiled loop's
        unpack = P.IN_HEADER.unpack_from
        while not stop.stopped:
            try:
                n = os.readv(fd, [buf])
            except OSError as e:
                if e.errno in (errno.EINTR, errno.ENOENT, errno.EAGAIN):
                    continue  # ENOENT: the request was interrupted before we got it
                self._reader_ended(e.errno)
                return
            if n < P.IN_HEADER.size:
                if n == 0:  # end of file: the device (or the test's socket) is closed
                    self._stop.set()
                    return
                log.error("short FUSE request (%d bytes) ignored", n)
                continue
            _, opcode, unique, nodeid, _, _, _, _, _ = unpack(buf, 0)
            dispatch(fd, buf, opcode, unique, nodeid, n)

    def _reader_compiled(self, fd: int, stop: "_ReaderStop") -> None:
        """The reader loop of :mod:`shadefs.fuse._fastloop`: requests are read and RELEASE answered in C
        without the GIL; the released handles are dropped in batches (:meth:`_release_many`); an OPEN goes
        to :meth:`_open_compiled` (the loop writes a hit's reply), every other request to
        :meth:`_dispatch`."""
        os.set_blocking(fd, False)  # a read that finds no request lets the loop hand back released handles
        res = self.residents
        err = _fastloop.serve(fd, bytearray(BUFSIZE), self._dispatch, self._release_many, stop,
                              self._open_compiled, res, self.cache.apply_hits if res is not None else None)
        if err == 0 and stop.retired and not self._stop.stopped:
            return  # replaced by a spare reader during a slow miss: only this thread ends
        if err == 0:
            self._stop.set()  # end of file (the test's socket closed), or DESTROY
        else:
            self._reader_ended(err)

    def _reader_ended(self, err: int) -> None:
        if err not in (errno.ENODEV, errno.EBADF, errno.ECONNABORTED):
            log.error("reading /dev/fuse: %s", os.strerror(err))
        self._stop.set()  # ENODEV: unmounted (or the connection was aborted)

    def _dispatch(self, fd: int, buf: bytearray, opcode: int, unique: int, nodeid: int, n: int) -> None:
        """One request read by the compiled loop (``opcode`` 0: shorter than its header)."""
        if n < P.IN_HEADER.size:
            log.error("short FUSE request (%d bytes) ignored", n)
            return
        op = self._ops.get(opcode)
        try:
            if op is not None:
                op(fd, unique, nodeid, buf, n)
            elif opcode in P.WRITE_OPS:
                self._send(fd, unique, opcode, errno.EROFS, ())
            else:
                self._send(fd, unique, opcode, errno.ENOSYS, ())
        except KeyError:
            self._send(fd, unique, opcode, errno.ENOENT, ())
        except Exception as e:
            self._fail(fd, unique, opcode, nodeid, e)

    def _release_many(self, fhs: List[int]) -> None:
        """RELEASEs the compiled loop answered: drop their handles (never raises: the loop goes on)."""
        for fh in fhs:
            try:
                self._drop(fh)
            except Exception:
                log.exception("release of file handle %d", fh)

    def _fail(self, fd: int, unique: int, opcode: int, what, e: BaseException) -> None:
        """Map an exception to an errno in one place (:func:`~shadefs.backends.base.reply_errno`): ENOENT
        for a missing file, ESTALE / EMFILE / ENFILE as they are (logged), EIO (logged) otherwise."""
        name = P.OPCODE_NAMES.get(opcode, str(opcode))
        err = reply_errno(e)   # ENOENT, ESTALE, EMFILE, ENFILE as they are; anything else EIO
        if isinstance(e, FileNotFoundError):
            pass
        elif isinstance(e, (BackendError, OSError)):
            log.error("%s %s: backend error: %s", name.lower(), what, e)
        else:
            log.error("%s %s: unexpected error", name.lower(), what, exc_info=e)
            err = errno.EIO
        if opcode not in P.NO_REPLY:
            self._send(fd, unique, opcode, err, ())

    def _send(self, fd: int, unique: int, opcode: int, error: int, bufs, asked: int = 0) -> bool:
        """Write one reply; False when the kernel no longer waits for it (interrupted, or unmounted)."""
        if len(bufs) == 1:
            body_len = len(bufs[0])
            iov = [_OUT_HEADER_PACK(_OUT_HEADER_SIZE + body_len, -error, unique), bufs[0]]
        elif not bufs:  # RELEASE, errors: the header alone
            body_len = 0
            iov = [_OUT_HEADER_PACK(_OUT_HEADER_SIZE, -error, unique)]
        else:
            body_len = sum(len(b) for b in bufs)
            iov = [_OUT_HEADER_PACK(_OUT_HEADER_SIZE + body_len, -error, unique), *bufs]
        try:
            written = os.writev(fd, iov)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENODEV, errno.EBADF):
                self.reply_errors += 1
                log.error("FUSE reply to %s (unique %d): %s", P.OPCODE_NAMES.get(opcode, opcode), unique, e)
            return False
        if self.check_replies:
            self._check_reply(unique, opcode, error, body_len, asked, written)
        return True

    def _check_reply(self, unique, opcode, error, body_len, asked, written) -> None:
        try:
            assert written == P.OUT_HEADER.size + body_len, f"wrote {written} of {P.OUT_HEADER.size + body_len} bytes"
            assert P.expected_reply_len(opcode, error, body_len, asked), (
                f"{P.OPCODE_NAMES.get(opcode, opcode)} reply of {body_len} bytes (error {error}, asked {asked})")
        except AssertionError:
            log.exception("FUSE reply check failed (unique %d)", unique)

    # -- async replies, interrupts ------------------------------------------------------------------------
    def _defer(self, fd: int, unique: int, fn, *args, always: bool = False) -> None:
        """Hand a request that may block to a worker; it replies through :meth:`_finish`. An
        interrupted request is not handed over unless ``always`` (its worker then finds it answered)."""
        with self._plock:
            self._pending[unique] = fd
            early = unique in self._early_interrupts
            if early:
                self._early_interrupts.discard(unique)
        if early:
            self._interrupt_pending(unique)
            if not always:
                return
        self.workers.submit(fn, fd, unique, *args)

    def _finish(self, unique: int) -> bool:
        """A worker is about to reply: True if the request still waits (not interrupted)."""
        return self._pending.pop(unique, None) is not None

    def _interrupt(self, fd, unique, nodeid, buf, n) -> None:
        (target,) = P.INTERRUPT_IN.unpack_from(buf, P.IN_HEADER.size)
        with self._plock:
            if target not in self._pending:
                # not (yet) handed to a worker: answered inline in microseconds, or about to be deferred
                if len(self._early_interrupts) > 4096:
                    self._early_interrupts.clear()
                self._early_interrupts.add(target)
                return
        self._interrupt_pending(target)

    def _interrupt_pending(self, target: int) -> bool:
        tfd = self._pending.pop(target, None)
        if tfd is None:
            return False
        self.interrupted += 1
        self._send(tfd, target, P.INTERRUPT, errno.EINTR, ())
        return True

    # -- metadata -----------------------------------------------------------------------------------------
    def _lookup(self, fd, unique, nodeid, buf, n) -> None:
        parent = self.node_of(nodeid)
        name = P.decode_cstring(buf, P.IN_HEADER.size, n).decode("utf-8", "surrogateescape")
        child = self.ns.child(parent, name) if self.ns.is_dir(parent) else None
        if child is None:  # a negative entry, cached by the kernel for TIMEOUT_S (libfuse negative_timeout)
            body = P.encode_entry_out(0, bytes(P.ATTR.size), TIMEOUT_S, 0)
        elif self._recheck is not None and child < self._num_files and self._recheck_needed(child):
            # a reused snapshot's record: compared with the source (a stat) on a worker before the kernel
            # caches its size
            self._defer(fd, unique, self._lookup_checked, child)
            return
        else:
            body = P.encode_entry_out(self.nodeid_of(child), self._attr(child), TIMEOUT_S, TIMEOUT_S)
        self._send(fd, unique, P.LOOKUP, 0, (body,))

    def _lookup_checked(self, fd: int, unique: int, child: int) -> None:
        """Worker: the LOOKUP of a file whose snapshot record was not compared with the source yet."""
        try:
            self._recheck(child)
        except Exception as e:  # gone or unreachable: the open reports it; the entry is the snapshot's
            log.info("lookup %s: %s", self.ns.path(child), e)
        body = P.encode_entry_out(self.nodeid_of(child), self._attr(child), TIMEOUT_S, TIMEOUT_S)
        if self._finish(unique):
            self._send(fd, unique, P.LOOKUP, 0, (body,))

    def _getattr(self, fd, unique, nodeid, buf, n) -> None:
        node = self.node_of(nodeid)
        self._send(fd, unique, P.GETATTR, 0, (P.encode_attr_out(self._attr(node), TIMEOUT_S),))

    def _statfs(self, fd, unique, nodeid, buf, n) -> None:
        v = statfs_values(self.ns)
        body = P.encode_statfs(v["f_blocks"], v["f_bfree"], v["f_bavail"], v["f_files"], v["f_ffree"],
                               v["f_bsize"], v["f_namemax"], v["f_frsize"])
        self._send(fd, unique, P.STATFS, 0, (body,))

    def _xattr_reply(self, fd, unique, opcode, value: Optional[bytes], asked: int) -> None:
        if value is None:
            self._send(fd, unique, opcode, errno.ENODATA, ())
        elif asked == 0:
            self._send(fd, unique, opcode, 0, (P.encode_getxattr_out(len(value)),), asked)
        elif asked < len(value):
            self._send(fd, unique, opcode, errno.ERANGE, ())
        else:
            self._send(fd, unique, opcode, 0, (value,), asked)

    def _getxattr(self, fd, unique, nodeid, buf, n) -> None:
        self.node_of(nodeid)
        asked, _ = P.GETXATTR_IN.unpack_from(buf, P.IN_HEADER.size)
        name = P.decode_cstring(buf, P.IN_HEADER.size + P.GETXATTR_IN.size, n).decode("utf-8", "surrogateescape")
        endpoint = endpoint_of(self.daemon)
        value = endpoint.encode("utf-8") if name == ENDPOINT_XATTR and endpoint else None
        self._xattr_reply(fd, unique, P.GETXATTR, value, asked)

    def _listxattr(self, fd, unique, nodeid, buf, n) -> None:
        self.node_of(nodeid)
        asked, _ = P.GETXATTR_IN.unpack_from(buf, P.IN_HEADER.size)
        value = (ENDPOINT_XATTR.encode() + b"\x00") if endpoint_of(self.daemon) else b""
        self._xattr_reply(fd, unique, P.LISTXATTR, value, asked)

    # -- directories ------------------------------------------------------------------------------------------
    def _opendir(self, fd, unique, nodeid, buf, n) -> None:
        node = self.node_of(nodeid)
        if not self.ns.is_dir(node):
            self._send(fd, unique, P.OPENDIR, errno.ENOTDIR, ())
            return
        # the snapshot is immutable: let the kernel cache the listing in its page cache
        self._send(fd, unique, P.OPENDIR, 0, (P.encode_open_out(0, P.FOPEN_CACHE_DIR | P.FOPEN_KEEP_CACHE),))

    def _listing(self, node: int, start: int, count: int) -> list:
        """Entries ``[start, start + count)`` of directory ``node``'s listing (``.``, ``..``, then the
        snapshot's children in name order) as ``(name bytes, node, d_type)``: built from the snapshot for
        each READDIR, never kept (a listing of a 1M-entry directory kept between READDIRs took ~139 MiB)."""
        nf = self._num_files
        out = []
        if start < 2:
            out = [(b".", node, 4), (b"..", self.ns.parent(node), 4)][start:start + count]
        first = max(0, start - 2)
        stop = start + count - 2
        if stop > first:
            out += [(name.encode("utf-8", "surrogateescape"), child, 4 if child >= nf else 8)
                    for name, child in listdir_slice(self.ns, node, first, stop)]
        return out

    def _readdir_common(self, fd, unique, nodeid, buf, opcode: int, plus: bool) -> None:
        node = self.node_of(nodeid)
        if not self.ns.is_dir(node):
            self._send(fd, unique, opcode, errno.ENOTDIR, ())
            return
        _, offset, size, _, _, _, _ = P.READ_IN.unpack_from(buf, P.IN_HEADER.size)
        # at most this many entries fit in the reply (each takes at least a header and 8 bytes of name)
        entries = self._listing(node, offset, size // P.dirent_size(1, plus) + 1)
        out, used = [], 0
        for i, (name, child, dtype) in enumerate(entries, offset):
            need = P.dirent_size(len(name), plus)
            if used + need > size:
                break
            ino = self.nodeid_of(child)
            if plus:
                if i < 2 or (self._recheck is not None and child < self._num_files and self._recheck_needed(child)):
                    # "." and "..": no entry (the kernel does not link them); a file whose reused snapshot
                    # record is not checked yet: none either, so that its first LOOKUP checks it
                    eo = P.encode_entry_out(0, bytes(P.ATTR.size), 0, 0)
                else:
                    eo = P.encode_entry_out(ino, self._attr(child), TIMEOUT_S, TIMEOUT_S)
                out.append(P.encode_direntplus(eo, ino, i + 1, dtype, name))
            else:
                out.append(P.encode_dirent(ino, i + 1, dtype, name))
            used += need
        self._send(fd, unique, opcode, 0, (b"".join(out),), size)

    def _readdir(self, fd, unique, nodeid, buf, n) -> None:
        self._readdir_common(fd, unique, nodeid, buf, P.READDIR, False)

    def _readdirplus(self, fd, unique, nodeid, buf, n) -> None:
        self._readdir_common(fd, unique, nodeid, buf, P.READDIRPLUS, True)

    # -- files --------------------------------------------------------------------------------------------------
    def _open(self, fd, unique, nodeid, buf, n) -> None:
        flags, _ = P.OPEN_IN.unpack_from(buf, P.IN_HEADER.size)
        pid = _PID.unpack_from(buf, _PID_OFFSET)[0]  # the opener (fuse_in_header.pid): plans follow its job's opens
        reply = self._open_request(fd, unique, nodeid, flags, pid)
        if reply is not None:
            self._reply_open(fd, unique, reply)

    def _open_compiled(self, fd: int, unique: int, nodeid: int, flags: int, pid: int):
        """OPEN from the compiled loop: as :meth:`_open_request` (the loop writes the reply); never raises."""
        try:
            return self._open_request(fd, unique, nodeid, flags, pid)
        except KeyError:
            self._send(fd, unique, P.OPEN, errno.ENOENT, ())
        except Exception as e:
            self._fail(fd, unique, P.OPEN, nodeid, e)
        return None

    def _open_request(self, fd: int, unique: int, nodeid: int, flags: int, pid: int):
        """An OPEN with its ``flags`` (fuse_open_in) and opener ``pid``: a hit returns ``(fh, open_flags,
        backing_id)`` for the caller to reply with; an error is replied here and a miss handed to a worker
        (None). Raises KeyError for an unknown node id."""
        node = self.node_of(nodeid)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            self._send(fd, unique, P.OPEN, errno.EROFS, ())
            return None
        if node >= self._num_files:
            self._send(fd, unique, P.OPEN, errno.EISDIR, ())
            return None
        set_opener(pid)
        # until its handle is in self._files (or it failed): the file is opening (open_now)
        self._opening[unique] = node
        try:
            return self._open_counted(fd, unique, node, pid)
        finally:
            if unique not in self._pending:  # not handed to a worker (which lets go of it)
                self._opening.pop(unique, None)

    def _open_counted(self, fd: int, unique: int, node: int, pid: int):
        # the rest of _open_request: the cache counts the open; a hit's handle is registered here
        try:
            h = None
            if self._open_kept is not None:
                # an NVMe hit of a file whose backing id we hold: counted without opening its entry
                gen = self.modes.gen_of(node)
                if gen is not None:
                    h = self._open_kept(node, gen)
                    if h is not None:
                        self.kept_opens += 1
            if h is None:
                h = self._open_nowait(node, True) if self._open_ticket is not None else self._open_nowait(node)
        except Exception as e:
            self._fail(fd, unique, P.OPEN, self.ns.path(node), e)
            return None
        if h is None:
            self._defer(fd, unique, self._open_slow, node, None, pid)
        elif h.__class__ is OpenTicket:
            if (self.reader_misses and not h.joins and time.monotonic() >= self._reader_misses_after
                    and self.reader_watch.room()):
                return self._open_on_reader(fd, unique, node, h)
            # the ticket is served even if the open is interrupted first: it may lead a fetch that other
            # opens of the file wait on (its handle is then released)
            self._defer(fd, unique, self._open_slow, node, h, pid, always=True)
        elif self.source_mode != "off" and h.source == "backend":
            # a chunked file: whether it goes to the source file, and that open and check, on a worker
            # (an open of the source may wait on it: NFS)
            self._defer(fd, unique, self._open_source, node, h, always=True)
        else:
            try:
                # on a reader thread: it may wait for a RELEASE only where another reader can handle it
                return self._open_handle(node, h, self.nreaders > 1)
            except BackingConflict as e:
                self._refuse(fd, unique, node, e)
        return None

    def _open_on_reader(self, fd: int, unique: int, fid: int, ticket):
        """Reader: a miss this open leads (or a file no tier admits), served here rather than handed to a
        worker (a thread hand-off, two GIL switches), for a directory source that has been answering fast.
        Returns the reply triple as :meth:`_open_request` does, or None (answered here).

        A miss that holds this reader longer than :data:`~shadefs.fuse.spare.SPARE_AFTER_S` gets a spare
        reader started in its place (:attr:`reader_watch`); this reader then ends once the miss is over.
        When misses take longer than :data:`READER_MISS_MAX_S` on average (a slow source), misses go to
        the workers for :data:`READER_MISS_BACKOFF_S`. A read stuck past ``--backend-timeout`` is answered
        EIO by the backend's watchdog (:meth:`_reader_stuck`); the request is registered as pending
        meanwhile, so an INTERRUPT or the watchdog answers it once."""
        rec = self.reader_watch.begin(fd)
        try:
            return self._serve_on_reader(fd, unique, fid, ticket)
        finally:
            if self.reader_watch.end(rec):
                stop = getattr(self._reader_local, "stop", None)
                if stop is not None:
                    stop.retired = stop.stopped = True

    def _start_spare(self, fd: int) -> None:
        # the reader watch's: a reader is held by a slow miss; a fresh one reads fd's requests meanwhile
        if self._stop.stopped:
            return
        self.spare_readers += 1
        threading.Thread(target=self._reader, args=(fd,), name="fuse-reader-spare", daemon=True).start()

    def _serve_on_reader(self, fd: int, unique: int, fid: int, ticket):
        with self._plock:
            self._pending[unique] = fd
        self.reader_misses_served += 1
        t0 = time.monotonic()
        stuck: list = []  # the watchdog's mark: this miss went past the deadline (its backoff started then)
        try:
            with on_deadline(lambda e: self._reader_stuck(fd, unique, stuck)):
                h = self._open_ticket(ticket)
            reply = self._open_handle(fid, h, self.nreaders > 1)
        except BackingConflict as e:
            self._reader_miss_took(t0, stuck)
            if self._finish(unique):
                self._refuse(fd, unique, fid, e)
            return None
        except Exception as e:
            self._reader_miss_took(t0, stuck)
            if self._finish(unique):
                self._fail(fd, unique, P.OPEN, self.ns.path(fid), e)
            return None
        self._reader_miss_took(t0, stuck)
        if not self._finish(unique):  # interrupted, or answered EIO at the deadline, meanwhile
            self._drop(reply[0])
            return None
        return reply

    def _reader_miss_took(self, t0: float, stuck: list) -> None:
        if stuck:
            return  # counted at its deadline
        now = time.monotonic()
        avg = self._reader_miss_s = self._reader_miss_s + (now - t0 - self._reader_miss_s) * 0.03125
        if avg > READER_MISS_MAX_S:
            self.reader_misses_slow += 1
            self._reader_misses_after = now + READER_MISS_BACKOFF_S
            self._reader_miss_s = 0.0  # after the backoff, misses are tried on a reader afresh

    def _reader_stuck(self, fd: int, unique: int, stuck: list) -> None:
        """The backend's watchdog, for a reader whose miss is past ``--backend-timeout``: answer the OPEN
        EIO and send misses to the workers (backoff). A spare reader serves in its place since the miss
        passed ``SPARE_AFTER_S`` (:attr:`reader_watch`); the stuck one ends once its read returns."""
        stuck.append(True)
        self.reader_misses_slow += 1
        self._reader_misses_after = time.monotonic() + READER_MISS_BACKOFF_S
        self._reader_miss_s = 0.0
        if self._finish(unique):
            self._send(fd, unique, P.OPEN, errno.EIO, ())

    def _open_source(self, fd: int, unique: int, fid: int, h) -> None:
        """Worker: an open served from the source that the reader handed over (:meth:`_open_handle` may
        open the source file, which may wait: the request stays interruptible until it is answered)."""
        self._opened(fd, unique, fid, h)

    def _open_slow(self, fd: int, unique: int, fid: int, ticket, pid: Optional[int] = None) -> None:
        """Worker: a miss (waits on the backend, or on another open's fetch of the same file); ``ticket``:
        the reader's lookup of it (:meth:`TieredCache.open_ticket`), or None; ``pid``: the opener."""
        set_opener(pid)
        try:
            # the backend's reads run on this thread; at a deadline its watchdog answers the open
            with on_deadline(lambda e: self._past_deadline(fd, unique)):
                h = self.cache.open(fid) if ticket is None else self._open_ticket(ticket)
        except Exception as e:
            self._opening.pop(unique, None)
            if self._finish(unique):
                self._fail(fd, unique, P.OPEN, self.ns.path(fid), e)
            return
        self._opened(fd, unique, fid, h)

    def _past_deadline(self, fd: int, unique: int) -> None:
        """The backend's watchdog, for a worker whose read is past ``--backend-timeout``: answer its OPEN
        EIO now (the watchdog logged the path); the worker's late answer is dropped (:meth:`_finish`)."""
        if self._finish(unique):
            self._send(fd, unique, P.OPEN, errno.EIO, ())

    def _opened(self, fd: int, unique: int, fid: int, h) -> None:
        """Worker: answer a deferred OPEN with a handle for ``h``, unless it was interrupted meanwhile (then
        the handle is released). The handle is made first (an open of the source file may wait on it), so
        an INTERRUPT that comes meanwhile is answered at once."""
        try:
            reply = self._open_handle(fid, h)
        except BackingConflict as e:
            if self._finish(unique):
                self._refuse(fd, unique, fid, e)
            return
        except Exception as e:  # the source file refused or changed (cache.source_fd): as a read of it fails
            if self._finish(unique):
                self._fail(fd, unique, P.OPEN, self.ns.path(fid), e)
            return
        finally:
            self._opening.pop(unique, None)  # registered in self._files, or failed
        if not self._finish(unique):  # interrupted meanwhile: the opener is gone
            self._drop(reply[0])
            return
        self._reply_open(fd, unique, reply)

    def _refuse(self, fd: int, unique: int, fid: int, e: BackingConflict) -> None:
        """An open that would read a dropped (corrupt) entry through the kernel's backing file: EIO."""
        if e.first:
            log.warning("open of %r refused (EIO): %s; it is served again once they are closed (logged once, "
                        "counted at unmount)", self.ns.path(fid), e.strerror)
        self._send(fd, unique, P.OPEN, errno.EIO, ())

    def _reply_open(self, fd: int, unique: int, reply: Tuple[int, int, int]) -> None:
        if not self._send(fd, unique, P.OPEN, 0, (P.encode_open_out(*reply),)):
            self._drop(reply[0])  # the opener was interrupted: no RELEASE will come for this fh

    def _open_handle(self, fid: int, h, may_wait: bool = True) -> Tuple[int, int, int]:
        """A new file handle for ``h``: its ``(fh, open_flags, backing_id)`` (``may_wait``: see
        :meth:`_Modes.acquire`).

        Raises:
            BackingConflict: opens of a dropped generation of the file hold its backing file (``h`` is
                released).
        """
        backing_id = None
        src = None
        if self.modes is not None:
            try:
                if self.source_mode != "off" and h.source == "backend" and h.gen == 0:
                    # served from the source: the source file itself, when the cache says so; acquire
                    # registers it if no other open of the file holds an io mode then, else joins that mode
                    # (opened and checked first: an open the cache serves itself, e.g. a chunked file the
                    # tiers hold whole, never waits; the earlier opens' RELEASEs may come meanwhile)
                    src = self.cache.source_fd(h)
                    if src is not None and may_wait and fid in self.modes.files:
                        self.modes.wait_uncached(fid, SOURCE_RELEASE_WAIT_S)
                backing_id = self.modes.acquire(fid, h, may_wait, src)
            except BaseException:
                h.release()
                if src is not None:
                    os.close(src)
                raise
        if backing_id is not None:
            flags = P.FOPEN_PASSTHROUGH
            self.passthrough_opens += 1
            st = self.modes.files.get(fid)  # this open holds it: the same record until its release
            if st is not None and st[4] == -1:  # the kernel reads the source file for it
                self.source_opens += 1
                self.cache.source_opened(h)
                if src is not None and self.cache.fds.hold(src):
                    h, src = _SourceReads(h, src, self.cache.fds), None  # its read-ahead READs: the source file
                # (past the descriptor reserve they are served by ranges from the backend; src closed below)
            elif type(h) is Handle:
                # the kernel reads the entry file through its own reference (the backing id): the open holds
                # no descriptor of the daemon, however many opens a reader keeps (the descriptor reserve)
                h.close_entry_fd()
        elif self.kernel_cache and h.keep_pages:
            # a hit, or a file no tier holds, serves the bytes the kernel may still hold (the mount is a
            # snapshot); a miss that fills a tier drops them (Handle.keep_pages)
            flags = P.FOPEN_KEEP_CACHE
        else:
            flags = 0
        if src is not None:
            os.close(src)  # the kernel holds its own reference to a registered backing file; else unused
        fh = next(self._next_fh)
        # reads that wait on the backend (or on the source file) go to a worker
        self._files[fh] = (h, fid, h.source != "memory" and h.source != "entry")
        return fh, flags, backing_id or 0

    def _drop(self, fh: int) -> None:
        entry = self._files.pop(fh, None)
        if entry is None:
            return
        h, fid, _ = entry
        if self.modes is not None:
            self.modes.release(fid)
        h.release()

    def _read(self, fd, unique, nodeid, buf, n) -> None:
        fh, offset, size, _, _, _, _ = P.READ_IN.unpack_from(buf, P.IN_HEADER.size)
        entry = self._files.get(fh)
        if entry is None:
            self._send(fd, unique, P.READ, errno.EBADF, ())
            return
        h, fid, blocking = entry
        if blocking:
            self._defer(fd, unique, self._read_slow, h, fid, offset, size)
            return
        try:
            data = h.read(offset, size)
        except Exception as e:
            self._fail(fd, unique, P.READ, self.ns.path(fid), e)
            return
        self._send(fd, unique, P.READ, 0, (data,), size)

    def _read_slow(self, fd: int, unique: int, h, fid: int, offset: int, size: int) -> None:
        try:
            data = h.read(offset, size)
        except Exception as e:
            if self._finish(unique):
                self._fail(fd, unique, P.READ, self.ns.path(fid), e)
            return
        if self._finish(unique):
            self._send(fd, unique, P.READ, 0, (data,), size)

    def _release(self, fd, unique, nodeid, buf, n) -> None:
        (fh,) = P.RELEASE_IN.unpack_from(buf, P.IN_HEADER.size)[:1]
        self._drop(fh)
        self._send(fd, unique, P.RELEASE, 0, ())

    # -- the kernel's pages ---------------------------------------------------------------------------------
    def pages_held(self, fid: int) -> Optional[bool]:
        """Whether the kernel holds the first and the last page of file ``fid`` now (``FUSE_NOTIFY_RETRIEVE``
        of one byte at each; module docstring). Blocks up to :data:`PROBE_TIMEOUT_S`; thread-safe; any
        thread but a reader's (a reader answers the kernel's NOTIFY_REPLY).

        Returns:
            True: the kernel returned both pages. False: it holds neither or only one of them, does not
            know the inode (``ENOENT``: never looked up, or forgotten), or did not answer in time. None:
            the mount cannot retrieve (not mounted, or a retrieve failed otherwise: logged once).
        """
        fd = self.fd
        if fd is None or not self.retrieve or self._stop.is_set():
            return None
        size = int(self.ns.attr(fid)[1])
        if size <= 0:
            return False
        offsets = [0] if size <= PAGE else [0, (size - 1) - (size - 1) % PAGE]
        probe = _Probe(len(offsets))
        ids = [next(self._probe_ids) for _ in offsets]
        for u in ids:
            self._probes[u] = probe
        nodeid = self.nodeid_of(fid)
        try:
            for u, off in zip(ids, offsets):
                try:
                    os.write(fd, P.encode_notify_retrieve(u, nodeid, off, 1))
                except OSError as e:
                    if e.errno != errno.ENOENT:
                        if self.retrieve:
                            self.retrieve = False
                            log.warning("FUSE_NOTIFY_RETRIEVE failed (%s): planned files are prefetched without "
                                        "asking the kernel for their pages", os.strerror(e.errno))
                        return None
                    return False  # the kernel has no inode for it: no pages
            if not probe.done.wait(PROBE_TIMEOUT_S):
                self.probe_timeouts += 1
                return False
        finally:
            for u in ids:
                self._probes.pop(u, None)
        self.probes += 1
        held = probe.found == len(offsets)
        self.probes_held += held
        return held

    def open_now(self, fid: int) -> bool:
        """Whether an open of file ``fid`` is under way or not yet released: its reader may still be reading
        it into the kernel's pages, so what the kernel holds of it is not settled. Every OPEN this front
        end handles in Python counts from its arrival (before the cache counts it) to its RELEASE (a
        RELEASE the compiled loop answered, until its batch is dropped: ~2 ms); RAM hits answered in C are
        not seen. O(opens under way + open files); thread-safe."""
        return fid in list(self._opening.values()) or any(entry[1] == fid for entry in list(self._files.values()))

    def _notify_reply(self, fd, unique, nodeid, buf, n) -> None:
        # the kernel's answer to a retrieve (no reply to it is expected): how many bytes it found
        probe = self._probes.pop(unique, None)
        if probe is None or n < P.IN_HEADER.size + P.NOTIFY_RETRIEVE_IN.size:
            return  # a probe that timed out, or a reply from before a restart: nobody waits for it
        size = P.NOTIFY_RETRIEVE_IN.unpack_from(buf, P.IN_HEADER.size)[2]
        probe.answer(size > 0)

    # -- the rest ---------------------------------------------------------------------------------------------
    def _reply_ok(self, fd, unique, nodeid, buf, n) -> None:
        self._send(fd, unique, P.RELEASEDIR, 0, ())

    def _enosys(self, fd, unique, nodeid, buf, n) -> None:
        # FLUSH, ACCESS: ENOSYS tells the kernel to stop sending them (one round trip less per close)
        self._send(fd, unique, P.decode_in_header(buf).opcode, errno.ENOSYS, ())

    def _enotty(self, fd, unique, nodeid, buf, n) -> None:
        # IOCTL (one per isatty() of an open file: Python's buffered open() makes one): no ioctl is
        # implemented, and no reply stops the kernel sending them (it turns ENOSYS into ENOTTY for that
        # call only); the compiled loop answers them itself, without the GIL
        self.ioctls += 1
        self._send(fd, unique, P.IOCTL, errno.ENOTTY, ())

    def _noreply(self, fd, unique, nodeid, buf, n) -> None:
        pass  # FORGET, BATCH_FORGET: node ids are static, nothing to forget

    def _reinit(self, fd, unique, nodeid, buf, n) -> None:
        self._send(fd, unique, P.INIT, errno.EPROTO, ())

    def _destroy(self, fd, unique, nodeid, buf, n) -> None:
        self._send(fd, unique, P.DESTROY, 0, ())
        self._stop.set()


def _has_cap_sys_admin() -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & (1 << 21))
    except OSError:
        pass
    return os.geteuid() == 0
