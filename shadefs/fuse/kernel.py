"""The kernel-protocol front end: shadefs speaks ``/dev/fuse`` directly (no libfuse), the default on Linux.

Threads and the path of one request (docs/architecture.md, "The front ends"):

- **Readers** (``--fuse-readers``, default 1) each block in ``read(2)`` on their own clone of the
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

Passthrough to the source file (``--source-passthrough``, default ``untiered``, a directory source): an open
the cache serves from the source (a file no tier admits; a chunked file no tier would take more of, or any
under ``large``: ``cache.source_fd``) is answered with a backing id registered from the source file, opened and checked
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
import signal
import sys
import threading
from typing import Dict, List, Optional, Tuple

from ..backends.base import BackendError, reply_errno
from ..cache.api import CacheAPI
from ..config import Environment
from ..procutil import name_thread
from . import protocol as P
from .backing import KEEP_BACKING_IDS, RELEASE_WAIT_S, BackingConflict, _Modes
from .file_ops import (READER_MISS_BACKOFF_S, READER_MISS_MAX_S, SOURCE_RELEASE_WAIT_S, FileOps)
from .metadata import TIMEOUT_S, MetadataOps
from .mount import mount_fuse, unmount_fuse
from .spare import ReaderWatch
from .pages import PAGE, PROBE_TIMEOUT_S, KernelPages, _Probe
from .passthrough import SourceReads
from .workers import Workers

try:  # the reader loop in C, built by `pip install` where a compiler is found (setup.py); else the Python loop
    from . import _fastloop
except ImportError:
    _fastloop = None

__all__ = ["KernelFrontend", "BackingConflict", "TIMEOUT_S", "KEEP_BACKING_IDS", "RELEASE_WAIT_S",
           "SOURCE_RELEASE_WAIT_S", "READER_MISS_MAX_S", "READER_MISS_BACKOFF_S", "PROBE_TIMEOUT_S", "PAGE"]

log = logging.getLogger("shadefs.fuse")

MAX_PAGES = 256           # 1 MiB per READ
MAX_WRITE = 4096          # read-only: keeps the request buffer at FUSE_MIN_READ_BUFFER
BUFSIZE = 4 * P.MIN_READ_BUFFER

# CPython hands the GIL to a waiting thread only after the holder ran this long (default 5 ms): a reader
# thread woken by a hit then waits behind a worker busy with a miss. At 0.25 ms a hit waits at most that.
SWITCH_INTERVAL_S = 0.00025
APPLY_HITS_S = 0.05   # at most this long between the logging and the counting of a RAM hit answered in C
# one reader thread: a second one contends for the GIL on every request (with the switch interval above,
# a handoff every 0.25 ms: futex waits and context switches) and cost 1.2-1.8x the CPU per open, hits
# included, at lower files/s (python -m shadefs.bench miss_cost, read; docs/performance.md)
READERS = 1
# KEEP_BACKING_IDS, RELEASE_WAIT_S (shadefs.fuse.backing), SOURCE_RELEASE_WAIT_S, READER_MISS_MAX_S,
# READER_MISS_BACKOFF_S (shadefs.fuse.file_ops), TIMEOUT_S (shadefs.fuse.metadata), PROBE_TIMEOUT_S, PAGE
# (shadefs.fuse.pages): re-exported here, where they were

_OUT_HEADER_PACK = P.OUT_HEADER.pack
_OUT_HEADER_SIZE = P.OUT_HEADER.size


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










class KernelFrontend(FileOps, MetadataOps, KernelPages):
    """Serve a :class:`~shadefs.namespace.Namespace` and a cache on ``mountpoint`` through ``/dev/fuse``.

    Args:
        namespace: the metadata snapshot (node ids are its dense ids).
        cache: the read path (a :class:`~shadefs.cache.api.CacheAPI`: ``open``/``open_nowait`` ->
            :class:`~shadefs.cache.core.Handle`); a source with no tiers derives from
            :class:`~shadefs.cache.api.BareCache`.
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

    def __init__(self, namespace, cache: CacheAPI, daemon=None, *, mountpoint: str, fsname: str = "shadefs",
                 allow_other: bool = False, kernel_cache: bool = True, passthrough: bool = True,
                 readers: int = READERS, max_workers: int = 256, source_passthrough: str = "untiered"):
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
        backend = cache.backend
        # the mode asked for, where the backend opens source files (posix); set on the cache at INIT
        self.want_source = source_passthrough if cache.opens_source else "off"
        self.source_mode = "off"  # what INIT granted
        self.nreaders = max(1, int(readers))
        self.workers = Workers(max_workers)
        self._open_nowait = cache.open_nowait
        # a miss's lookup on the reader is not repeated on the worker (its ticket: open_ticket)
        self._open_ticket = cache.open_ticket
        # a reused snapshot: each file's record is compared with the source at its first LOOKUP
        self._recheck = cache.recheck if cache.rechecks else None
        self._recheck_needed = cache.unchecked
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
        self.reader_misses = backend is not None and backend.scheme == "file" and env.fuse_reader_misses
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
                         "from it (posix_fadvise WILLNEED into the mount's own pages)", SourceReads.bytes_read)
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
        elif self.cache.disk is None and self.want_source == "off":
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
            if self.cache.verify_entries == "first-hit":
                self._open_kept = self.cache.open_kept
            # an evicted entry must not stay pinned outside --disk-cache-size
            self.cache.entry_unlinked.append(self.modes.forget)
            # a corrupt entry's backing id is never given to another generation's open
            self.cache.entry_dropped.append(self.modes.dropped)
        self._attach_residents()
        prefetcher = self.cache.prefetcher
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
        if (not self.compiled_loop or self.modes is not None or self.gil_opens
                or not hasattr(_fastloop, "Residents")):
            return
        residents = _fastloop.Residents(self._num_files, P.FOPEN_KEEP_CACHE if self.kernel_cache else 0)
        if self.cache.attach_residents(residents):
            self.residents = residents

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

