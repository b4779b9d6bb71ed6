"""One shadefs daemon: builds the snapshot, the tiers and the cache for a mount, runs the FUSE loop,
and answers the control plane.

Order matters (the project's design notes, "Conventions"; docs/architecture.md): the daemon process is forked first (by the CLI), then the source
is scanned and the FUSE loop starts; threads and ZeroMQ contexts start only in FUSE ``init()``
(:meth:`Daemon.on_mounted`), after the mount exists. The parent CLI process learns the outcome through a
pipe: one line, ``ok`` or ``error: ...``.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Optional

import numpy as np

from .backends.base import open_backend
from .backends.timeout import TimeoutBackend
from .cache.core import TieredCache
from .cache import persist
from .cache.index import TierIndex
from .cache.tiers import DiskTier, MemoryTier
from .cache.trace import TraceWriter
from .config import MountConfig, format_bytes
from .namespace import SNAPSHOT_FILE, Namespace
from .plan.plans import PlanError, PlanRegistry
from .plan.policy import PlanPolicy
from .plan.prefetch import Prefetcher
from .policies.base import Importance, get_policy
from .policies.shade import get_transform

__all__ = ["Daemon"]

log = logging.getLogger("shadefs.daemon")


from .fuse.libfuse import select_libfuse  # noqa: E402,F401  (kept importable from here)


def default_prefetch_window() -> int:
    """min(256 MiB, 5 % of physical RAM), in bytes."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        ram = 8 * 2**30
    return int(min(256 * 2**20, 0.05 * ram))


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
        self._audit = os.environ.get("SHADEFS_AUDIT", "") == "1"

    # -- construction (after the fork, before the mount) -----------------------------------------------
    def build(self) -> None:
        """Scan the source and assemble tiers and cache.

        Raises:
            FileNotFoundError, OSError, ValueError: the source cannot be listed or a setting is invalid.
        """
        cfg = self.cfg
        t0 = time.monotonic()
        options = dict(cfg.backend_options)
        if "://" not in cfg.source:
            options.setdefault("scan_workers", cfg.scan_workers)
        if "://" in cfg.source and cfg.backend_timeout_s > 0:
            options.setdefault("timeout_s", cfg.backend_timeout_s)  # fsspec: connect/read timeouts
        self.backend = open_backend(cfg.source, **options)
        if cfg.backend_timeout_s > 0:  # the deadline of every read, whatever the backend does
            self.backend = TimeoutBackend(self.backend, cfg.backend_timeout_s)
        self.namespace = self._namespace()
        ns = self.namespace
        log.info("%s %s: %d files, %d directories, %s in %.2f s", "snapshot of" if ns.from_snapshot else "scanned",
                 self.backend.describe(), ns.num_files, ns.num_dirs, format_bytes(ns.total_bytes),
                 time.monotonic() - t0)
        ns.report.log(log, self.backend.describe())
        ram_bytes = cfg.ram_cache.resolve(ns.total_bytes)
        disk_bytes = cfg.disk_cache.resolve(ns.total_bytes) if cfg.disk_cache_dir else 0
        self.importance = Importance(ns.num_files)
        # Every tier runs Belady on the announced plans (issue 11), the mount's --policy without one.
        self.plans = PlanRegistry(ns.num_files, window=cfg.plan_window)
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
            store = DiskTier(cfg.disk_cache_dir, cfg.source, min_free=min_free)
            self._save_snapshot(os.path.join(store.dir, SNAPSHOT_FILE))
            disk = (TierIndex("disk", disk_bytes, policy_cls(disk_bytes, self.importance)), store)
        if cfg.trace:
            self.trace = TraceWriter(cfg.trace)
        self.shared = self._build_shared(ns)
        self.cache = TieredCache(ns, self.backend, ram, disk, self.importance, trace=self.trace,
                                 on_backend_read=self._on_backend_read, shared=self.shared)
        self.cache.verify_entries = cfg.verify_entries
        if self._audit and os.environ.get("SHADEFS_LOOSE_BUFFERS"):  # tests only: a smaller working-set bound
            self.cache.loose_budget = int(os.environ["SHADEFS_LOOSE_BUFFERS"])
        self.plans.lock = self.cache.lock  # cursors advance under the lock that counts the opens
        window = (cfg.prefetch_window.resolve(0) if cfg.prefetch_window is not None else default_prefetch_window())
        if cfg.prefetch_concurrency <= 0:
            window = 0
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

    def _build_shared(self, ns):
        """The shared tier of ``--shared-tier`` (not connected yet: threads start after the mount), or None."""
        cfg = self.cfg
        if not cfg.shared_tier:
            return None
        from .cache.shared import SharedTier

        password = None
        if cfg.shared_tier_password_file:
            with open(cfg.shared_tier_password_file) as f:
                password = f.read().strip()
        return SharedTier(list(cfg.shared_tier), cfg.source, cfg.shared_tier_size.resolve(ns.total_bytes),
                          policy=cfg.policy, timeout_s=cfg.shared_tier_timeout_s, max_file=cfg.shared_max_file,
                          partitions=cfg.shared_tier_partitions, password=password,
                          heartbeat_s=cfg.shared_tier_heartbeat_s)

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
        return Namespace.scan(self.backend, follow_symlinks=cfg.follow_symlinks, isolate=True, snapshot_key=key)

    def _save_snapshot(self, path: str) -> None:
        ns = self.namespace
        key = self.backend.snapshot_key(self.cfg.follow_symlinks)
        if key is None or ns.from_snapshot:
            return
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
        digests = persist.PathDigests(self.namespace.paths, os.path.join(store.dir, persist.DIGESTS_FILE),
                                      fingerprint=self.namespace.fingerprint)
        rep = persist.reload_disk_tier(store, index, self.namespace, digests)
        self.reload_report = rep
        self.cache.corrupt_entries += rep.corrupt
        log.info("disk tier: %s", rep.summary())
        self.checkpointer = persist.Checkpointer(store.dir, self.namespace, self.importance, index, digests,
                                                 self.cache.lock, self.cfg.checkpoint_interval_s,
                                                 entries=self.cache.entries)

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
        try:
            self._start_services()
        except Exception as e:
            log.exception("control plane failed to start")
            self._detach()  # the mount exists already: never leave it behind without a daemon
            self._notify(f"error: {e}")
            os._exit(1)
        self._notify("ok")

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
        self.control = ControlServer(cfg.control, self, mountpoint=cfg.mountpoint,
                                     allow_remote=cfg.control_allow_remote,
                                     curve_secret_key_file=cfg.curve_server_secret,
                                     insecure=cfg.control_insecure)
        self.control.start()
        self.endpoint = self.control.endpoint
        self.cache.start_background()  # threads only now: after the FUSE fork
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
        if self.metrics is not None:
            self.metrics.stop()
        if self.checkpointer is not None:
            self.checkpointer.stop()
        self.cache.close()
        if getattr(self, "shared", None) is not None:
            self.shared.close(leave=True)  # the group's budget shrinks by ours now
        if self.cache.disk is not None:
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
        scored = np.flatnonzero(self.importance.values != self.importance.default)
        write_scores(path, [self.namespace.path(int(i)) for i in scored], self.importance.values[scored])

    # -- control-plane handler -----------------------------------------------------------------------------
    def stats(self) -> dict:
        """The stats JSON (docs/metrics.md). Also flushes the trace so it can be replayed while mounted."""
        if self.trace is not None:
            self.trace.flush()  # its own lock: never the cache lock
        out = self.cache.stats()
        out["namespace"] = self.namespace.info()
        if self._audit:  # SHADEFS_AUDIT=1: the state machine's consistent view, for tests (docs/metrics.md)
            out["audit"] = self.cache.audit()
        return out

    def apply_scores(self, fids: np.ndarray, values: np.ndarray) -> None:
        """One minibatch of raw per-sample scores (losses): transform, then update importance."""
        weights = self._transform(values)
        self.cache.update_importance(fids, np.asarray(weights, dtype=np.float32))

    def warm(self, fids: np.ndarray) -> dict:
        """Prefetch ``fids`` into the cache through the policies (4 backend reads in flight).

        Returns counts: ``resident`` (already cached), ``ram``, ``disk`` (admitted there), ``rejected``
        (the policies refused), ``failed`` (backend error, logged), and ``bytes`` read from the backend.
        """
        import concurrent.futures as cf

        out = {"resident": 0, "ram": 0, "disk": 0, "rejected": 0, "failed": 0, "bytes": 0}

        def one(fid):
            try:
                return self.cache.prefetch(int(fid)), int(self.namespace.size(int(fid)))
            except OSError as e:
                log.warning("warm: %s: %s", self.namespace.path(int(fid)), e)
                return "failed", 0

        # what the group holds comes in pipelined batches from the shared tier first
        if self.shared is not None:
            out["shared"] = self.cache.warm_shared(fids)
        with cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="warm") as pool:
            for outcome, size in pool.map(one, fids):
                out[outcome] += 1
                if outcome in ("ram", "disk", "rejected"):
                    out["bytes"] += size
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
