"""Prometheus metrics of one mount: every metric name in one place (documented in docs/metrics.md).

Counters are not kept twice: :class:`CacheCollector` reads the cache's own counters
(:meth:`shadefs.cache.core.TieredCache.counters`, one consistent snapshot under the cache lock) and the
control server's at scrape time, so ``shadefs stats`` and a scrape always agree. The only state kept
here is the backend read latency histogram, fed by the cache's ``backend_read`` events.

The HTTP endpoint binds the loopback address unless told otherwise (``--metrics-addr``); port 0 picks a
free port (logged, and in :attr:`MetricsServer.port`). It is started from FUSE ``init()``, after the
mount exists, like every other thread of the daemon. This module must never change cache state.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import start_http_server
from prometheus_client.process_collector import ProcessCollector

__all__ = ["MetricsServer", "CacheCollector", "NAMES"]

log = logging.getLogger("shadefs.metrics")

# -- the names (docs/metrics.md documents each one) ----------------------------------------------------
INFO = "shadefs_info"
UPTIME = "shadefs_uptime_seconds"
OPENS = "shadefs_opens_total"
HITS = "shadefs_hits_total"                       # {tier="ram"|"disk"|"shared"}
MISSES = "shadefs_misses_total"
OPEN_BYTES = "shadefs_open_bytes_total"
HIT_BYTES = "shadefs_hit_bytes_total"
BACKEND_BYTES = "shadefs_backend_bytes_total"
SOURCE_PASSTHROUGH_BYTES = "shadefs_source_passthrough_bytes_total"
BACKEND_ERRORS = "shadefs_backend_errors_total"
BACKEND_READ_SECONDS = "shadefs_backend_read_seconds"  # histogram
EVICTIONS = "shadefs_evictions_total"             # {tier}
PROMOTIONS = "shadefs_promotions_total"
DEMOTIONS = "shadefs_demotions_total"
DEMOTIONS_SKIPPED = "shadefs_demotions_skipped_total"
LOOSE_BYTES = "shadefs_loose_bytes"
FILL_BUFFER_BYTES = "shadefs_fill_buffer_bytes"
FILL_BUFFER_WAITS = "shadefs_fill_buffer_waits_total"
TIER_USED = "shadefs_tier_used_bytes"             # {tier}
TIER_CAPACITY = "shadefs_tier_capacity_bytes"     # {tier}
TIER_FILES = "shadefs_tier_files"                 # {tier}
CORRUPT = "shadefs_corrupt_entries_total"
DISK_WRITE_ERRORS = "shadefs_disk_write_errors_total"
DISK_WRITES_REFUSED = "shadefs_disk_writes_refused_total"
DISK_RELOAD_ENTRIES = "shadefs_disk_reload_entries"  # {result="loaded"|"stale"|"corrupt"|"over_budget"}
DISK_RELOAD_SECONDS = "shadefs_disk_reload_seconds"
SCORE_MESSAGES = "shadefs_score_messages_total"
SCORE_REJECTED = "shadefs_score_messages_rejected_total"  # {reason}
CHECKPOINTS = "shadefs_importance_checkpoints_total"
# the shared tier (only with --shared-tier; tier="shared" in the TIER_* gauges is this member's share)
SHARED_ERRORS = "shadefs_shared_errors_total"
SHARED_DEADLINES = "shadefs_shared_deadlines_total"
SHARED_SKIPPED = "shadefs_shared_skipped_total"
SHARED_CORRUPT = "shadefs_shared_corrupt_total"
SHARED_AUTH_FAILED = "shadefs_shared_auth_failed_total"
SHARED_OFFERS = "shadefs_shared_offers_total"     # {result="admitted"|"resident"|"refused"|"dropped"|"failed"}
SHARED_GROUP_USED = "shadefs_shared_group_used_bytes"
SHARED_GROUP_CAPACITY = "shadefs_shared_group_capacity_bytes"
SHARED_GROUP_FILES = "shadefs_shared_group_files"
SHARED_MEMBERS = "shadefs_shared_members"
NAMESPACE_FILES = "shadefs_namespace_files"
NAMESPACE_DIRS = "shadefs_namespace_directories"
NAMESPACE_SKIPPED = "shadefs_namespace_skipped"       # {reason}
NAMESPACE_SCAN_SECONDS = "shadefs_namespace_scan_seconds"
# clairvoyant caching: announced plans and the prefetcher
PREFETCH_OPENS = "shadefs_prefetch_opens_total"          # {state="ready"|"late"}
PREFETCH_LATE_SECONDS = "shadefs_prefetch_late_wait_seconds_total"
PREFETCH_FETCHED_BYTES = "shadefs_prefetch_fetched_bytes_total"
PREFETCH_SHARED_BYTES = "shadefs_prefetch_shared_bytes_total"
PREFETCH_WASTED_BYTES = "shadefs_prefetch_wasted_bytes_total"
PREFETCH_ERRORS = "shadefs_prefetch_errors_total"
PREFETCH_WINDOW = "shadefs_prefetch_window_bytes"         # {kind="capacity"|"used"}
PLANS_ACTIVE = "shadefs_plans_active"
PLANS_ENDED = "shadefs_plans_ended_total"                 # {why="retired"|"finished"}
PLAN_MESSAGES = "shadefs_plan_messages_total"
DESCRIPTORS = "shadefs_descriptors"                       # {kind="open"|"limit"|"reserve"|"held"}
DESCRIPTOR_REFUSALS = "shadefs_descriptor_refusals_total"  # {result="served"|"failed"}

NAMES = (INFO, UPTIME, OPENS, HITS, MISSES, OPEN_BYTES, HIT_BYTES, BACKEND_BYTES, SOURCE_PASSTHROUGH_BYTES,
         BACKEND_ERRORS,
         BACKEND_READ_SECONDS, EVICTIONS, PROMOTIONS, DEMOTIONS, TIER_USED, TIER_CAPACITY, TIER_FILES,
         CORRUPT, DISK_WRITE_ERRORS, DISK_WRITES_REFUSED, DISK_RELOAD_ENTRIES, DISK_RELOAD_SECONDS,
         SCORE_MESSAGES, SCORE_REJECTED, CHECKPOINTS, SHARED_ERRORS, SHARED_DEADLINES, SHARED_SKIPPED, SHARED_CORRUPT,
         SHARED_AUTH_FAILED, SHARED_OFFERS, SHARED_GROUP_USED, SHARED_GROUP_CAPACITY, SHARED_GROUP_FILES, SHARED_MEMBERS,
         NAMESPACE_FILES, NAMESPACE_DIRS, NAMESPACE_SKIPPED, NAMESPACE_SCAN_SECONDS,
         PREFETCH_OPENS, PREFETCH_LATE_SECONDS, PREFETCH_FETCHED_BYTES, PREFETCH_SHARED_BYTES, PREFETCH_WASTED_BYTES,
         PREFETCH_ERRORS,
         PREFETCH_WINDOW, PLANS_ACTIVE, PLANS_ENDED, PLAN_MESSAGES, DESCRIPTORS, DESCRIPTOR_REFUSALS)

# 100 us (page-cached NFS) .. 30 s (a throttled object store)
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0)
TIERS = ("ram", "disk")


class CacheCollector:
    """A prometheus-client collector that reads the daemon's counters at scrape time.

    Args:
        daemon: has ``cache`` (:class:`~shadefs.cache.core.TieredCache`), ``cfg``, and optionally
            ``control`` (with ``counters()``), ``reload_report`` and ``checkpointer``.
    """

    def __init__(self, daemon):
        self.daemon = daemon

    def describe(self):
        return []  # names are dynamic only in labels; no collect() at registration time

    def collect(self):
        d = self.daemon
        c = d.cache.counters()
        cfg = d.cfg
        info = GaugeMetricFamily(INFO, "The mount: source, mountpoint and policy (value 1).",
                                 labels=["source", "mountpoint", "policy"])
        info.add_metric([d.backend.describe(), cfg.mountpoint, cfg.policy], 1)
        yield info
        yield GaugeMetricFamily(UPTIME, "Seconds since the cache was built.",
                                value=time.monotonic() - d.cache.started)
        yield CounterMetricFamily(OPENS, "File opens (samples read); = hits + misses.", value=c["opens"])
        hits = CounterMetricFamily(HITS, "Opens served without touching the backend, by tier.",
                                   labels=["tier"])
        hits.add_metric(["ram"], c["hits_ram"])
        hits.add_metric(["disk"], c["hits_disk"])
        if c.get("shared") is not None:
            hits.add_metric(["shared"], c["hits_shared"])
        yield hits
        yield CounterMetricFamily(MISSES, "Opens that read the backend (including failed reads).",
                                  value=c["misses"])
        yield CounterMetricFamily(OPEN_BYTES, "Bytes of every opened file (snapshot sizes).",
                                  value=c["open_bytes"])
        yield CounterMetricFamily(HIT_BYTES, "Bytes of the opens served from a tier.", value=c["hit_bytes"])
        yield CounterMetricFamily(BACKEND_BYTES, "Bytes the daemon read from the backend (single-flight: once "
                                  "per concurrent miss); not what the kernel reads by passthrough to the "
                                  "source file.", value=c["backend_bytes"])
        yield CounterMetricFamily(SOURCE_PASSTHROUGH_BYTES, "Bytes the kernel may read from the source by "
                                  "passthrough to the source file: the file's size at each such open.",
                                  value=c["source_passthrough_bytes"])
        yield CounterMetricFamily(BACKEND_ERRORS, "Backend reads that failed (EIO to the reader), missing "
                                  "files excluded.", value=c["backend_errors"])
        evictions = CounterMetricFamily(EVICTIONS, "Files evicted by the tier's policy.", labels=["tier"])
        used = GaugeMetricFamily(TIER_USED, "Bytes resident in the tier.", labels=["tier"])
        cap = GaugeMetricFamily(TIER_CAPACITY, "The tier's byte budget.", labels=["tier"])
        files = GaugeMetricFamily(TIER_FILES, "Files resident in the tier.", labels=["tier"])
        for tier in TIERS + (("shared",) if "shared" in c["tiers"] else ()):
            t = c["tiers"].get(tier, {"used_bytes": 0, "capacity_bytes": 0, "files": 0, "evictions": 0})
            evictions.add_metric([tier], t["evictions"])
            used.add_metric([tier], t["used_bytes"])
            cap.add_metric([tier], t["capacity_bytes"])
            files.add_metric([tier], t["files"])
        yield from (evictions, used, cap, files)
        yield CounterMetricFamily(PROMOTIONS, "Disk hits moved to the RAM tier.", value=c["promotions"])
        yield CounterMetricFamily(DEMOTIONS, "RAM victims moved to the disk tier.", value=c["demotions"])
        yield CounterMetricFamily(DEMOTIONS_SKIPPED, "RAM victims not demoted: the daemon's bounded working "
                                  "set (LOOSE_BUFFERS) had no room for their bytes.", value=c["demotions_skipped"])
        yield GaugeMetricFamily(LOOSE_BYTES, "Bytes the daemon holds outside the tiers (held-open RAM "
                                "victims, victims being demoted, buffers no tier keeps); at most LOOSE_BUFFERS.",
                                value=c["loose_bytes"])
        fb = d.cache.fills.snapshot()
        yield GaugeMetricFamily(FILL_BUFFER_BYTES, "Bytes of backend reads in flight; at most FILL_BUFFERS "
                                "(one larger read alone may exceed it).", value=fb["used_bytes"])
        yield CounterMetricFamily(FILL_BUFFER_WAITS, "Backend reads that waited for room under FILL_BUFFERS.",
                                  value=fb["waits"])
        yield CounterMetricFamily(CORRUPT, "Disk entries dropped as partial or unreadable (at reload) "
                                  "or failing their checksum (on a read).", value=c["corrupt_entries"])
        yield CounterMetricFamily(DISK_WRITE_ERRORS, "Disk tier writes that failed (ENOSPC, EIO); the "
                                  "file is served but not cached.", value=c["disk_write_errors"])
        yield CounterMetricFamily(DISK_WRITES_REFUSED, "Disk tier writes refused to keep --disk-min-free "
                                  "free on the cache filesystem, or because the segments' compaction "
                                  "left no room for a fill's victims in time.", value=c["disk_writes_refused"])
        if c.get("shared") is not None:
            yield from _shared_metrics(c["shared"], c["tiers"]["shared"])
        rep = getattr(d, "reload_report", None)
        if rep is not None:
            entries = GaugeMetricFamily(DISK_RELOAD_ENTRIES, "Disk tier entries found at mount, by result.",
                                        labels=["result"])
            for result in ("loaded", "stale", "corrupt", "over_budget"):
                entries.add_metric([result], getattr(rep, result))
            yield entries
            yield GaugeMetricFamily(DISK_RELOAD_SECONDS, "Seconds the disk tier reload took at mount.",
                                    value=rep.seconds)
        ns = getattr(d, "namespace", None)
        if ns is not None:
            yield GaugeMetricFamily(NAMESPACE_FILES, "Files served (the namespace snapshot).", value=ns.num_files)
            yield GaugeMetricFamily(NAMESPACE_DIRS, "Directories served, the root and empty ones included.",
                                    value=ns.num_dirs)
            skipped = GaugeMetricFamily(NAMESPACE_SKIPPED, "Source entries the scan left out, by reason "
                                        "(docs/operations.md, Security).", labels=["reason"])
            for reason, n in ns.report.as_dict().items():
                skipped.add_metric([reason], n)
            yield skipped
            yield GaugeMetricFamily(NAMESPACE_SCAN_SECONDS, "Seconds to scan the source (or load the "
                                    "snapshot) at mount.", value=ns.scan_seconds)
        p = c.get("prefetch")
        if p is not None:
            opens = CounterMetricFamily(PREFETCH_OPENS, "Opens served from a prefetch: completed (ready) or "
                                        "waited on (late).", labels=["state"])
            opens.add_metric(["ready"], p["ready"])
            opens.add_metric(["late"], p["late"])
            yield opens
            yield CounterMetricFamily(PREFETCH_LATE_SECONDS, "Seconds late opens waited for their prefetch.",
                                      value=p["late_wait_s"])
            yield CounterMetricFamily(PREFETCH_FETCHED_BYTES, "Bytes the prefetcher read (backend or shared "
                                      "tier).", value=p["fetched_bytes"])
            yield CounterMetricFamily(PREFETCH_SHARED_BYTES, "Bytes the prefetcher read from the shared tier.",
                                      value=p.get("shared_bytes", 0))
            yield CounterMetricFamily(PREFETCH_WASTED_BYTES, "Prefetched bytes dropped before their open.",
                                      value=p["wasted_bytes"])
            yield CounterMetricFamily(PREFETCH_ERRORS, "Prefetch reads that failed (the open read the file).",
                                      value=p.get("errors", 0))
            window = GaugeMetricFamily(PREFETCH_WINDOW, "The prefetch window: its size and the bytes fetched "
                                       "(or in flight) but not yet opened.", labels=["kind"])
            window.add_metric(["capacity"], p.get("window_bytes", 0))
            window.add_metric(["used"], p.get("window_used_bytes", 0))
            yield window
            yield GaugeMetricFamily(PLANS_ACTIVE, "Announced plans being followed.", value=p["plans_active"])
            ended = CounterMetricFamily(PLANS_ENDED, "Plans no longer followed, by why.", labels=["why"])
            ended.add_metric(["retired"], p["plans_retired"])
            ended.add_metric(["finished"], p.get("plans_finished", 0))
            ended.add_metric(["withdrawn"], p.get("plans_withdrawn", 0))
            yield ended
        fds = d.cache.fds.stats()
        gauge = GaugeMetricFamily(DESCRIPTORS, "The daemon's file descriptors: open now, the soft NOFILE limit, "
                                  "the reserve kept free below it, those open files hold.", labels=["kind"])
        for kind in ("open", "limit", "reserve", "held"):
            gauge.add_metric([kind], fds[kind])
        yield gauge
        refusals = CounterMetricFamily(DESCRIPTOR_REFUSALS, "Opens that found the descriptor reserve reached: "
                                       "served without a held descriptor, or failed (EMFILE, ENFILE).",
                                       labels=["result"])
        refusals.add_metric(["served"], fds["refused"])
        refusals.add_metric(["failed"], fds["failed"])
        yield refusals
        checkpointer = getattr(d, "checkpointer", None)
        if checkpointer is not None:
            yield CounterMetricFamily(CHECKPOINTS, "Importance checkpoints written.", value=checkpointer.saves)
        control = getattr(d, "control", None)
        if control is not None and hasattr(control, "counters"):
            cc = control.counters()
            yield CounterMetricFamily(SCORE_MESSAGES, "Score messages accepted on the control endpoint.",
                                      value=cc.get("scores_received", 0))
            rejected = CounterMetricFamily(SCORE_REJECTED, "Control messages rejected, by reason.",
                                           labels=["reason"])
            for reason, n in sorted(cc.get("scores_rejected", {}).items()):
                rejected.add_metric([reason], n)
            yield rejected
            yield CounterMetricFamily(PLAN_MESSAGES, "Plan messages accepted on the control endpoint.",
                                      value=cc.get("plans_received", 0))


def _shared_metrics(sc: dict, st: dict):
    yield CounterMetricFamily(SHARED_ERRORS, "Shared-tier calls that failed or ran past their deadline "
                              "(each cost a hit, never an error).", value=sc["errors"])
    yield CounterMetricFamily(SHARED_DEADLINES, "Shared-tier calls that ran past their deadline (part of "
                              "the errors; the caller went on without waiting).", value=sc["deadlines"])
    yield CounterMetricFamily(SHARED_SKIPPED, "Shared-tier calls skipped while backing off after repeated "
                              "failures.", value=sc["skipped"])
    yield CounterMetricFamily(SHARED_CORRUPT, "Shared-tier values that failed verification (deleted).",
                              value=sc["corrupt"])
    yield CounterMetricFamily(SHARED_AUTH_FAILED, "Shared-tier values that failed authentication with the "
                              "group's secret (deleted; the source was read).", value=sc["auth_failed"])
    offers = CounterMetricFamily(SHARED_OFFERS, "Files this member offered to the group, by result.",
                                 labels=["result"])
    for result, n in sorted(sc["offers"].items()):
        offers.add_metric([result], n)
    yield offers
    yield GaugeMetricFamily(SHARED_GROUP_USED, "Bytes the whole group stores in the shared tier.",
                            value=st["group_used_bytes"])
    yield GaugeMetricFamily(SHARED_GROUP_CAPACITY, "The group's budget: sum of live members' sizes.",
                            value=st["group_capacity_bytes"])
    yield GaugeMetricFamily(SHARED_GROUP_FILES, "Files the whole group stores.", value=st["files"])
    yield GaugeMetricFamily(SHARED_MEMBERS, "Live members of the group (mounts of this source).",
                            value=st["members"])


class MetricsServer:
    """The ``/metrics`` HTTP endpoint of one mount.

    Args:
        daemon: see :class:`CacheCollector`.
        addr: address to bind (default loopback).
        port: TCP port; 0 picks a free one (see :attr:`port` after :meth:`start`).
    """

    def __init__(self, daemon, addr: str = "127.0.0.1", port: int = 0):
        self.daemon = daemon
        self.addr = addr
        self.requested_port = int(port)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(CacheCollector(daemon))
        self.registry.register(ProcessCollector(registry=None))
        self.backend_read_seconds = Histogram(
            BACKEND_READ_SECONDS, "Seconds per backend read of a whole file (misses only).",
            buckets=LATENCY_BUCKETS, registry=self.registry)
        self._httpd = None
        self._thread = None
        self.port: Optional[int] = None

    def start(self) -> None:
        """Bind and serve on a daemon thread. Raises OSError if the address is unusable."""
        try:
            self._httpd, self._thread = start_http_server(self.requested_port, addr=self.addr,
                                                          registry=self.registry)
        except OSError as e:
            raise OSError(f"--metrics-port {self.requested_port} on {self.addr}: {e.strerror or e}") from e
        self.port = self._httpd.server_port

    def observe_backend_read(self, seconds: float) -> None:
        """One backend read took ``seconds``; called on the miss path, so it only records the latency."""
        self.backend_read_seconds.observe(seconds)

    def stop(self) -> None:
        """Stop serving and close the socket. Idempotent."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
