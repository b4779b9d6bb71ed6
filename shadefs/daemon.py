"""One shadefs daemon: builds the snapshot, the tiers and the cache for a mount, runs the FUSE loop,
and answers the control plane.

Order matters (the project's design notes, "Conventions"; docs/architecture.md): the daemon process is forked first (by the CLI), then the source
is scanned and the FUSE loop starts; threads and ZeroMQ contexts start only in FUSE ``init()``
(:meth:`Daemon.on_mounted`), after the mount exists. The parent CLI process learns the outcome through a
pipe: the scan's progress (``scan FILES DIRS``, then ``scanned FILES DIRS``), then one line, ``ok`` and
the mount's summary as JSON (tiers, policy, warnings, metrics URL), ``refused: ...`` or ``error: ...``.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from typing import Optional

import numpy as np

from .backends.base import backend_for
from .backends.timeout import TimeoutBackend
from .cache.buffers import FillBuffers, tune_malloc
from .cache.chunks import ChunkMap, EntryIds
from .cache.core import TieredCache
from .cache import persist
from .cache.index import TierIndex
from .cache.tiers import DiskTier, MemoryTier
from .cache.trace import TraceWriter
from .config import Environment, MountConfig, format_bytes, pause_point
from .namespace import SNAPSHOT_FILE, Namespace
from .plan.plans import PlanError, PlanRegistry
from .plan.policy import PlanPolicy
from .plan.prefetch import Prefetcher
from .policies.base import Importance, get_policy
from .policies.shade import get_transform
from .procutil import FdReserve, raise_nofile

__all__ = ["Daemon"]

# reads in flight at most besides prefetches: the kernel front end's miss workers (KernelFrontend's
# max_workers); object-store connection pools are sized for them
MISS_WORKERS = 256
log = logging.getLogger("shadefs.daemon")


from .fuse.libfuse import select_libfuse  # noqa: E402,F401  (kept importable from here)


#: Backend reads a warm request keeps in flight.
WARM_READS = 4


def default_prefetch_window() -> int:
    """min(256 MiB, 5 % of physical RAM), in bytes."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        ram = 8 * 2**30
    return int(min(256 * 2**20, 0.05 * ram))


class ScanProgress:
    """Tells the waiting ``shadefs mount`` how far the scan is: ``scan FILES DIRS`` lines on the ready pipe,
    one per directory for the first ``first`` directories (so a scan that stalls early shows where), then
    at most one per ``interval_s``. A line is shorter than PIPE_BUF: written whole, also from the scan's
    forked child. A reader that has gone is ignored."""

    def __init__(self, fd: int, interval_s: float = 0.5, first: int = 64):
        self.fd = fd
        self.interval_s = interval_s
        self.first = first
        self._last = time.monotonic()

    def __call__(self, files: int, dirs: int) -> None:
        now = time.monotonic()
        if dirs > self.first and now - self._last < self.interval_s:
            return
        self._last = now
        self._write(f"scan {files} {dirs}\n")

    def done(self, files: int, dirs: int) -> None:
        """The namespace is complete (scanned, or loaded from its snapshot)."""
        self._write(f"scanned {files} {dirs}\n")

    def _write(self, line: str) -> None:
        try:
            os.write(self.fd, line.encode())
        except OSError:
            pass


class Daemon:
    """Everything one mount owns. Also the control-plane handler (``stats``, ``apply_scores``,
    ``resident``, ``namespace``) that :class:`shadefs.control.server.ControlServer` calls.

    Args:
        cfg: the validated mount configuration.
        ready_fd: a pipe to tell the parent ``ok`` / ``error: ...`` (or None in the foreground).
    """

    def __init__(self, cfg: MountConfig, ready_fd: Optional[int] = None):
        self.cfg = cfg
        self.ready_fd = ready_fd
        self.endpoint: Optional[str] = None
        self.control = None
        self.metrics = None
        self.trace = None
        self.checkpointer = None
        self.reload_report: Optional[persist.ReloadReport] = None
        self._transform = None
        self._stopped = threading.Event()
        self._env = Environment.from_env()  # SHADEFS_AUDIT, SHADEFS_LOOSE_BUFFERS: testing switches
        self._audit = self._env.audit

    # -- construction (after the fork, before the mount) -----------------------------------------------
    def build(self) -> None:
        """Scan the source and assemble tiers and cache.

        Raises:
            FileNotFoundError, OSError, ValueError: the source cannot be listed or a setting is invalid.
        """
        cfg = self.cfg
        pause_point("daemon-build")
        t0 = time.monotonic()
        soft, hard = raise_nofile()   # each open handle of a disk entry holds a descriptor
        log.info("file descriptors: soft limit %d (hard limit %d), %d kept free for control, the tiers and the "
                 "source (--fd-reserve)", soft, hard, cfg.fd_reserve)
        options = dict(cfg.backend_options)
        if "://" not in cfg.source:
            options.setdefault("scan_workers", cfg.scan_workers)
        if "://" in cfg.source and cfg.backend_timeout_s > 0:
            options.setdefault("timeout_s", cfg.backend_timeout_s)  # fsspec: connect/read timeouts
        if "://" in cfg.source:  # pools sized so no read waits for a connection: prefetches + misses
            options.setdefault("pool_connections", cfg.prefetch_concurrency + MISS_WORKERS)
        cls = backend_for(cfg.source, cfg.backend)
        # the deadline of every read, whatever the backend does: kept by the backend itself where it can
        # (obstore: the request is bounded in Rust), else by TimeoutBackend: a miss's read runs on the front
        # end's worker under a watchdog (no hand-off), any other read is handed to a deadline thread
        own = cfg.backend_timeout_s > 0 and cls.bounds_own_reads
        if own:
            options.setdefault("deadline_s", cfg.backend_timeout_s)
        self.backend = cls(cfg.source, **options)
        if cfg.backend_timeout_s > 0 and not own:
            self.backend = TimeoutBackend(self.backend, cfg.backend_timeout_s)
        self.namespace = self._namespace()
        ns = self.namespace
        self.backend.attach(ns, cfg.follow_symlinks)   # each opened file is checked against its record
        if self.ready_fd is not None:
            ScanProgress(self.ready_fd).done(ns.num_files, ns.num_dirs)
        log.info("%s %s: %d files, %d directories, %s in %.2f s", "snapshot of" if ns.from_snapshot else "scanned",
                 self.backend.describe(), ns.num_files, ns.num_dirs, format_bytes(ns.total_bytes),
                 time.monotonic() - t0)
        ns.report.log(log, self.backend.describe())
        ram_bytes = cfg.ram_cache.resolve(ns.total_bytes)
        self._check_ram(ram_bytes)
        disk_bytes = cfg.disk_cache.resolve(ns.total_bytes) if cfg.disk_cache_dir else 0
        # files above CHUNK bytes are cached by chunks, entries with ids above the files' (cache/chunks.py):
        # importance (a chunk weighs what its file weighs) and the policies' id space cover them
        chunks = ChunkMap(ns.sizes)
        self.importance = Importance(chunks.num_ids)
        if chunks:
            self.importance.follower = chunks.follow_importance
        # Every tier runs Belady on the announced plans, the mount's --policy without one.
        self.plans = PlanRegistry(chunks.num_ids, window=cfg.plan_window)
        if chunks:
            self.plans.aliases = chunks  # a plan's next use of a file is the next use of its chunks
        base_cls = get_policy(cfg.policy)

        def policy_cls(capacity, importance):
            return PlanPolicy(base_cls(capacity, importance), self.plans)

        ram = (TierIndex("ram", ram_bytes, policy_cls(ram_bytes, self.importance)), MemoryTier())
        disk = None
        min_free = 0
        if cfg.disk_cache_dir and disk_bytes > 0:
            os.makedirs(cfg.disk_cache_dir, exist_ok=True)
            fs = os.statvfs(cfg.disk_cache_dir)
            min_free = cfg.disk_min_free.resolve(fs.f_blocks * fs.f_frsize)  # a % is of the cache filesystem
            store = DiskTier(cfg.disk_cache_dir, cfg.source, min_free=min_free, pack_below=cfg.disk_pack_below)
            self._save_snapshot(os.path.join(store.dir, SNAPSHOT_FILE))
            if cfg.disk_cache.nbytes is None:  # a share of the dataset's device bytes (entries + metadata)
                disk_bytes = cfg.disk_cache.resolve(store.footprint(ns.sizes, extra=32 * ns.num_files))
            disk = (TierIndex("disk", disk_bytes, policy_cls(disk_bytes, self.importance)), store)
        if cfg.trace:
            self.trace = TraceWriter(cfg.trace)
        self.shared = self._build_shared(ns)
        self.cache = TieredCache(ns, self.backend, ram, disk, self.importance, trace=self.trace,
                                 on_backend_read=self._on_backend_read, shared=self.shared, chunks=chunks)
        self.cache.verify_entries = cfg.verify_entries
        self.cache.fds = FdReserve(cfg.fd_reserve)
        if disk is not None:
            disk[1].bind(disk[0], self.cache.lock)  # the budget in device bytes
        if self._audit and self._env.loose_buffers is not None:  # tests only: a smaller working-set bound
            self.cache.loose_budget = self._env.loose_buffers
        if self._audit and self._env.fill_buffers is not None:  # tests only: a smaller fill-buffer bound
            self.cache.fills = FillBuffers(self._env.fill_buffers)
        self.plans.lock = self.cache.lock  # cursors advance under the lock that counts the opens
        window = (cfg.prefetch_window.resolve(0) if cfg.prefetch_window is not None else default_prefetch_window())
        if cfg.prefetch_concurrency <= 0:
            window = 0
        # what the kernel keeps of a file's pages is observed, not assumed: the kernel front end gives the
        # prefetcher its page probe at INIT (docs/architecture.md, "Plans")
        self.prefetcher = Prefetcher(self.cache, self.plans, window, cfg.prefetch_concurrency)
        self.cache.attach_plans(self.plans, self.prefetcher)
        self._transform = get_transform(cfg.score_transform)
        log.info("mount %s -> %s: policy %s, RAM tier %s, disk tier %s%s, kernel cache %s, FUSE front end %s",
                 self.backend.describe(), cfg.mountpoint, cfg.policy, format_bytes(ram_bytes),
                 format_bytes(disk_bytes if disk else 0),
                 f" in {disk[1].dir} (keeping {format_bytes(min_free)} free)" if disk else "",
                 "on" if cfg.kernel_cache else "off",
                 cfg.fuse_impl if cfg.fuse_impl == "kernel"
                 else f"libfuse ({'multithreaded' if cfg.fuse_threads else 'single-threaded'} loop)")
        if disk is not None:
            self._restore(disk)
        self.summary = self._summary(ram_bytes, disk, min_free)

    def _check_ram(self, ram_bytes: int) -> None:
        """Raise ValueError for a RAM tier (a % of the source: a size was checked before the fork) larger
        than the memory this process may use; nothing is created yet."""
        from .sysinfo import memory_limit

        limit, what = memory_limit()
        if self.cfg.ram_cache.fraction is not None and limit and ram_bytes > limit:
            raise ValueError(f"--ram-cache {self.cfg.ram_cache} of the source's "
                             f"{format_bytes(self.namespace.total_bytes)} is {format_bytes(ram_bytes)}, more than "
                             f"{what} ({format_bytes(limit)})")

    def _summary(self, ram_bytes: int, disk, min_free: int) -> dict:
        """What the CLI's "mounted" line shows: the tiers' sizes (bytes), the policy, and ``warnings`` (one
        line each): no tier on, a disk tier larger than the room its filesystem has."""
        cfg = self.cfg
        out = {"policy": cfg.policy, "ram_bytes": ram_bytes, "disk_bytes": 0, "disk_dir": None,
               "shared_bytes": 0, "warnings": []}
        if disk is not None:
            index, store = disk
            out["disk_bytes"], out["disk_dir"] = index.capacity_bytes, store.dir
            out["disk_tier"] = index.snapshot()
            if index.overhead_bytes > index.capacity_bytes // 4:
                out["warnings"].append(
                    f"the disk tier's metadata ({format_bytes(index.overhead_bytes)}: the snapshot, path digests, "
                    f"manifest and scores of {self.namespace.num_files} files) takes more than a quarter of its "
                    f"{format_bytes(index.capacity_bytes)}; {format_bytes(index.entry_bytes)} is left for "
                    f"entries: give a larger --disk-cache-size")
            fs = os.statvfs(store.dir)
            room = fs.f_bavail * fs.f_frsize + index.used_bytes - min_free  # its own entries count as room
            if index.capacity_bytes > room:
                out["warnings"].append(
                    f"the disk tier ({format_bytes(index.capacity_bytes)}) is larger than the room on the "
                    f"filesystem of {cfg.disk_cache_dir} ({format_bytes(max(0, room))}, keeping "
                    f"{format_bytes(min_free)} free): it will hold at most that much")
        if self.shared is not None:
            out["shared_bytes"] = int(cfg.shared_tier_size.resolve(self.namespace.total_bytes))
        if not ram_bytes and disk is None and self.shared is None:
            out["warnings"].append("no cache tier is on (RAM tier 0, no disk tier): every open reads the "
                                   "source; give --ram-cache SIZE and/or --disk-cache DIR --disk-cache-size SIZE")
        for w in out["warnings"]:
            log.warning("%s", w)
        return out

    def _build_shared(self, ns):
        """The shared tier of ``--shared-tier`` (not connected yet: threads start after the mount), or None."""
        cfg = self.cfg
        if not cfg.shared_tier:
            return None
        from .cache.shared import SharedTier, SharedTierConfigError, read_secret

        if not cfg.shared_tier_secret_file and not cfg.shared_tier_insecure:
            raise SharedTierConfigError("a shared tier needs shared_tier_secret_file (the group's secret) or "
                                        "shared_tier_insecure")
        secret = read_secret(cfg.shared_tier_secret_file) if cfg.shared_tier_secret_file else None
        password = None
        if cfg.shared_tier_password_file:
            with open(cfg.shared_tier_password_file) as f:
                password = f.read().strip()
        return SharedTier(list(cfg.shared_tier), cfg.source, cfg.shared_tier_size.resolve(ns.total_bytes),
                          policy=cfg.policy, timeout_s=cfg.shared_tier_timeout_s, max_file=cfg.shared_max_file,
                          partitions=cfg.shared_tier_partitions, password=password,
                          heartbeat_s=cfg.shared_tier_heartbeat_s, secret=secret)

    def _namespace(self) -> Namespace:
        """The namespace: the snapshot beside the disk tier when it is still valid (same source and
        settings, every directory's mtime and ctime unchanged), else a scan of the source."""
        cfg = self.cfg
        key = self.backend.snapshot_key(cfg.follow_symlinks)
        if key is not None and cfg.disk_cache_dir:
            path = os.path.join(DiskTier.dir_for(cfg.disk_cache_dir, cfg.source), SNAPSHOT_FILE)
            if cfg.rescan:
                why = "--rescan"
            else:
                ns, why = Namespace.load(path, key)
                if ns is not None:
                    why = self.backend.snapshot_changed(*ns.snapshot_dirs(), [])
                    if why is None:
                        log.info("namespace snapshot %s is current (%d directories unchanged); loaded in %.2f s",
                                 path, ns.num_dirs, ns.scan_seconds)
                        return ns
            if why != "no snapshot":
                log.info("namespace snapshot %s not used (%s): scanning the source", path, why)
        # isolated: the listing's heap stays in a child process (docs/performance.md, "Namespace")
        progress = ScanProgress(self.ready_fd) if self.ready_fd is not None else None
        return Namespace.scan(self.backend, follow_symlinks=cfg.follow_symlinks, isolate=True, snapshot_key=key,
                              progress=progress)

    def _save_snapshot(self, path: str) -> None:
        ns = self.namespace
        key = self.backend.snapshot_key(self.cfg.follow_symlinks)
        if key is None or (ns.from_snapshot and not ns.revised):
            return  # a reused snapshot is on disk as it is (unless records of changed files were revised)
        t0 = time.monotonic()
        try:
            n = ns.save(path, key)
        except OSError as e:
            log.warning("cannot write the namespace snapshot %s: %s", path, e)
            return
        log.info("namespace snapshot written to %s (%s) in %.2f s", path, format_bytes(n), time.monotonic() - t0)

    def _restore(self, disk) -> None:
        """Reload importance, then the disk tier's entries, from the previous run's cache directory."""
        index, store = disk
        scores_path = os.path.join(store.dir, persist.SCORES_FILE)
        t0 = time.monotonic()
        restored, skipped = persist.load_scores(scores_path, self.namespace, self.importance)
        if restored or skipped:
            log.info("importance: restored %d scores from %s (%d no longer in the source) in %.2f s",
                     restored, scores_path, skipped, time.monotonic() - t0)
        # the entries: the files, and the chunks of files above CHUNK bytes (cache/chunks.py)
        ids = EntryIds(self.namespace, self.cache.chunks) if self.cache.chunks is not None else self.namespace
        digests = persist.PathDigests(ids.paths, os.path.join(store.dir, persist.DIGESTS_FILE),
                                      fingerprint=ids.fingerprint)
        rep = persist.reload_disk_tier(store, index, ids, digests)
        store.account(index)  # the metadata the reload wrote (path digests)
        self.reload_report = rep
        self.cache.corrupt_entries += rep.corrupt
        log.info("disk tier: %s", rep.summary())
        self.checkpointer = persist.Checkpointer(store.dir, self.namespace, self.importance, index, digests,
                                                 self.cache.lock, self.cfg.checkpoint_interval_s,
                                                 entries=self.cache.entries, pack_below=store.pack_below,
                                                 ids=ids)

    def _on_backend_read(self, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.observe_backend_read(seconds)

    # -- FUSE lifecycle ----------------------------------------------------------------------------------
    def run(self) -> None:
        """Mount with the configured front end (``--fuse-impl``) and serve until unmounted (blocks)."""
        from .fuse import make_frontend

        fsname = f"shadefs:{self.backend.describe()}"[:200].replace(",", "_")
        frontend = make_frontend(self.cfg.fuse_impl, self.namespace, self.cache, self, self.cfg, fsname)
        try:
            frontend.run()
        finally:
            self.on_unmount()

    def on_mounted(self) -> None:
        """FUSE ``init``: the mount exists; start threads and tell the parent."""
        pause_point("daemon-mounted")
        try:
            self._start_services()
        except Exception as e:
            log.exception("control plane failed to start")
            self._abandon_services()
            self._detach()  # the mount exists already: never leave it behind without a daemon
            self._notify(f"error: {e}")
            os._exit(1)
        summary = dict(getattr(self, "summary", {}))
        if self.metrics is not None:
            summary["metrics_url"] = f"http://{self.cfg.metrics_addr}:{self.metrics.port}/metrics"
        self._notify("ok " + json.dumps(summary))

    def _abandon_services(self) -> None:
        """A start that failed half-way: leave no registry entry or control socket behind (we exit next)."""
        if getattr(self, "_registered", False):
            from . import registry

            registry.unregister(self.cfg.mountpoint)
            self._registered = False
        if self.control is not None:
            try:
                self.control.stop(timeout=1.0)
            except Exception:
                log.exception("stopping the control server")

    def _detach(self) -> None:
        """Lazily unmount our own mountpoint (from FUSE ``init``, which cannot wait for a normal unmount)."""
        import shutil
        import subprocess

        tool = shutil.which("fusermount3") or shutil.which("fusermount")
        for cmd in ([tool, "-uz", self.cfg.mountpoint] if tool else None, ["umount", "-l", self.cfg.mountpoint]):
            if cmd is None:
                continue
            try:
                if subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0:
                    return
            except (OSError, subprocess.TimeoutExpired):
                continue
        log.error("could not unmount %s; run: fusermount -uz %s", self.cfg.mountpoint, self.cfg.mountpoint)

    def _start_services(self) -> None:
        from .control.server import ControlServer  # zmq: imported after the fork, started after the mount

        cfg = self.cfg
        tune_malloc()  # freed read buffers go back to the system (shadefs.cache.buffers)
        self.control = ControlServer(cfg.control, self, mountpoint=cfg.mountpoint,
                                     allow_remote=cfg.control_allow_remote,
                                     curve_secret_key_file=cfg.curve_server_secret,
                                     curve_authorized_keys=cfg.control_authorized_keys,
                                     insecure=cfg.control_insecure)
        self.control.fds = self.cache.fds   # unbound while descriptors run out (libzmq aborts at EMFILE)
        self.control.start()
        self.endpoint = self.control.endpoint
        self.cache.start_background()  # threads only now: after the FUSE fork
        self.plans.start()  # a plan set that changes without an announcement: tiers prepared off the lock
        self.prefetcher.start()
        self._register()
        if self.checkpointer is not None:
            self.checkpointer.start()
        if self.shared is not None:
            self.shared.start()  # joins the group; Redis down is logged and retried, never fatal
        if cfg.metrics_port is not None:
            from .metrics import MetricsServer

            self.metrics = MetricsServer(self, cfg.metrics_addr, cfg.metrics_port)
            self.metrics.start()
            log.info("Prometheus metrics on http://%s:%d/metrics", cfg.metrics_addr, self.metrics.port)

    def _register(self) -> None:
        """Tell ``shadefs stats``/``umount`` and the hooks where we are, without them touching the mount."""
        from . import registry

        try:
            registry.clear_dead()  # what killed daemons left: their entries and control sockets
        except OSError as e:
            log.warning("could not clear dead entries from the runtime directory: %s", e)
        try:
            registry.register(self.cfg.mountpoint, self.endpoint, self.cfg.source,
                              credentials=getattr(self.control, "credentials", None))
            self._registered = True
        except OSError as e:
            log.warning("could not register the mount in the runtime directory (%s); shadefs stats and "
                        "umount will find the daemon through the mount", e)

    def _notify(self, line: str) -> None:
        if self.ready_fd is not None:
            try:
                os.write(self.ready_fd, (line + "\n").encode())
                os.close(self.ready_fd)
            except OSError:
                pass
            self.ready_fd = None

    def on_unmount(self) -> None:
        """FUSE ``destroy`` (or the loop ended): stop threads, flush the trace. Idempotent."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if getattr(self, "_registered", False):
            from . import registry

            registry.unregister(self.cfg.mountpoint)
        if self.control is not None:
            self.control.stop()
        self.prefetcher.stop()
        self.plans.stop()
        if self.metrics is not None:
            self.metrics.stop()
        if self.checkpointer is not None:
            self.checkpointer.stop()
        self.cache.close()
        if getattr(self, "shared", None) is not None:
            self.shared.close(leave=True)  # the group's budget shrinks by ours now
        if self.cache.disk is not None:
            if self.namespace.revised:  # the records of files found changed: the next mount reuses them
                self._save_snapshot(os.path.join(self.cache.disk.dir, SNAPSHOT_FILE))
            self.cache.disk.close()
        if self.trace is not None:
            self.trace.close()
            self._write_scores(self.cfg.trace + ".scores.csv")
        log.info("unmounted %s; final stats %s", self.cfg.mountpoint, self.cache.stats())

    def _write_scores(self, path: str) -> None:
        try:
            from .sim import write_scores
        except ImportError:
            return
        values = self.importance.values[:self.namespace.num_files]  # the files' (a chunk weighs its file's)
        scored = np.flatnonzero(values != self.importance.default)
        write_scores(path, [self.namespace.path(int(i)) for i in scored], values[scored])

    # -- control-plane handler -----------------------------------------------------------------------------
    def stats(self) -> dict:
        """The stats JSON (docs/metrics.md). Also flushes the trace so it can be replayed while mounted."""
        if self.trace is not None:
            self.trace.flush()  # its own lock: never the cache lock
        out = self.cache.stats()
        out["namespace"] = self.namespace.info()
        out["descriptors"] = self.cache.fds.stats()
        out["memory"] = self.memory()
        if self._audit:  # SHADEFS_AUDIT=1: the state machine's consistent view, for tests (docs/metrics.md)
            out["audit"] = self.cache.audit()
        return out

    def memory(self) -> dict:
        """The stats JSON's ``memory`` object (docs/metrics.md; docs/operations.md, "The daemon's memory"):
        the daemon's resident set now and at its peak (``rss_bytes``, ``peak_rss_bytes``: VmRSS, VmHWM of
        /proc/self/status; 0 where there is none), each bounded part of its working set (``{"bound_bytes",
        "used_bytes"}``, bytes) and ``bound_bytes``, their sum: what the daemon holds above its size after
        the mount."""
        out = {"rss_bytes": 0, "peak_rss_bytes": 0}
        try:
            with open("/proc/self/status", encoding="ascii") as f:
                for line in f:
                    k, _, v = line.partition(":")
                    if k == "VmRSS":
                        out["rss_bytes"] = int(v.split()[0]) * 1024
                    elif k == "VmHWM":
                        out["peak_rss_bytes"] = int(v.split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        parts = self.cache.memory()
        if self.shared is not None:
            parts["offer_queue"] = self.shared.offer_queue_memory()
        out.update(parts)
        out["bound_bytes"] = sum(p["bound_bytes"] for p in parts.values())
        out["per_file_bytes"] = self._per_file_bytes()
        return out

    def _per_file_bytes(self) -> int:
        """Bytes of the arrays sized by the number of files and chunks (the namespace snapshot with its
        names, importance, residency, entry, plan and prefetch tables): fixed at the mount, part of the
        daemon's size after it (not of ``bound_bytes``)."""
        cache = self.cache
        objs = [self.namespace, cache, self.importance, self.plans, self.prefetcher, cache.chunks,
                cache.entries, cache.ram_index, cache.disk_index]
        for ix in (cache.ram_index, cache.disk_index):
            pol = getattr(ix, "policy", None)
            objs += [pol, getattr(pol, "inner", None)]
        seen, total = set(), 0
        for o in objs:
            for v in (vars(o).values() if o is not None and hasattr(o, "__dict__") else ()):
                if isinstance(v, memoryview) and isinstance(v.obj, np.ndarray):
                    continue  # a view of an array counted as itself
                if isinstance(v, (np.ndarray, memoryview)) and id(v) not in seen:
                    seen.add(id(v))
                    total += v.nbytes
        return total

    def apply_scores(self, fids: np.ndarray, values: np.ndarray) -> None:
        """One minibatch of raw per-sample scores (losses): transform, then update importance."""
        weights = self._transform(values)
        self.cache.update_importance(fids, np.asarray(weights, dtype=np.float32))

    def warm(self, fids: np.ndarray) -> dict:
        """Prefetch ``fids`` into the cache through the policies (:data:`WARM_READS` backend reads in
        flight, at most twice that many files submitted at once, whatever the request's length).

        A file no tier of this node admits is not read (the policies are asked first). Returns counts:
        ``resident`` (already cached), ``ram``, ``disk`` (admitted there), ``rejected`` (the policies
        refused), ``failed`` (backend error, logged), and ``bytes`` read from the backend for it.
        """
        import collections
        import concurrent.futures as cf

        out = {"resident": 0, "ram": 0, "disk": 0, "rejected": 0, "failed": 0, "bytes": 0}

        def one(fid):
            fid = int(fid)
            try:
                return self.cache.prefetch(fid, keep_only=True), int(self.namespace.size(fid)), fid
            except OSError as e:
                log.warning("warm: %s: %s", self.namespace.path(fid), e)
                return "failed", 0, fid

        # a repeated id in flight with the first joins its read (read once, cached once): counted resident;
        # results are counted in submission order, so the first is among the last 2 * WARM_READS admitted
        recent: "collections.deque[int]" = collections.deque(maxlen=2 * WARM_READS)

        def count(outcome, size, fid):
            if outcome in ("ram", "disk"):
                if fid in recent:
                    outcome = "resident"
                else:
                    recent.append(fid)
                    out["bytes"] += size
            out[outcome] += 1

        # what the group holds comes in pipelined batches from the shared tier first
        if self.shared is not None:
            out["shared"] = self.cache.warm_shared(fids)
        pending: "collections.deque[cf.Future]" = collections.deque()
        with cf.ThreadPoolExecutor(max_workers=WARM_READS, thread_name_prefix="warm") as pool:
            for fid in fids:
                if len(pending) >= 2 * WARM_READS:
                    count(*pending.popleft().result())
                pending.append(pool.submit(one, fid))
            while pending:
                count(*pending.popleft().result())
        return out

    def resident(self, fids: np.ndarray) -> np.ndarray:
        return self.cache.resident(fids)

    def register_paths(self, handle, fids: np.ndarray):
        """``register``: a dataset's path table (resolved to ``fids``) -> (8-byte handle, table size)."""
        from .control.protocol import ProtocolError

        try:
            return self.plans.register(handle, fids)
        except PlanError as e:
            raise ProtocolError(e.reason, e.message) from None

    def apply_plan(self, msg) -> None:
        """``plan``: install an announced order (:class:`shadefs.control.protocol.PlanMessage`)."""
        from .control.protocol import ProtocolError

        try:
            plan = self.plans.announce(msg.handle, msg.stream, msg.first_epoch, msg.segments.tolist(), msg.ids,
                                       window=msg.window, job=getattr(msg, "job", None))
        except PlanError as e:
            raise ProtocolError(e.reason, e.message) from None
        log.info("announced %s", plan.describe())
        self.prefetcher.wake()

    def withdraw_plan(self, handle: bytes, stream: int) -> None:
        """``withdraw``: the job is done with stream ``stream``'s plan; drop it now (what it still had in the
        prefetch window counts as wasted). A plan the daemon does not hold (finished, retired, another
        daemon's) changes nothing."""
        plan = self.plans.withdraw(handle, stream)
        if plan is not None:
            log.info("withdrawn %s", plan.describe())
            self.prefetcher.wake()
