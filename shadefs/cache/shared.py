"""The shared tier: one cache for a group of nodes on Redis (a Redis Cluster or one server).

Mounts of the same source (the namespace key ``sha256(source URL)[:16]``, as :class:`~.tiers.DiskTier`
uses) attached to the same Redis form one **group**. The group stores each sample at most once, under one
byte budget: the sum of its live members' ``--shared-tier-size``. Any member that reads a file from the
backend may offer it; any member reads what any other stored. This is SHADE's own deployment (Khan et al.,
USENIX FAST '23, section 4: the importance-ranked cache lives in Redis Cluster across the training nodes),
with the byte budget and the atomicity SHADE's reference code lacks.

Layout in Redis (``NS`` = namespace key, ``P`` = partition 0..K-1, ``H`` = 128-bit hash of the file's
relative path and version: size, mtime in ns and the ETag where the backend lists one, so a changed source
file never matches an old value)::

    shadefs:{NS:pP}:z        sorted set  H -> rank score (importance for shade; admission time for lru/fifo)
    shadefs:{NS:pP}:s        hash        H -> file bytes
    shadefs:{NS:pP}:m        hash        cap, gen, used, files, evictions   (the partition's budget)
    shadefs:{NS:pP}:v:H      string      b"SHD2" + tag (32 bytes) + data
    shadefs:{NS:g}:members   sorted set  member id -> expiry (server time, ms)
    shadefs:{NS:g}:sizes     hash        member id -> contributed bytes
    shadefs:{NS:g}:meta      hash        gen (bumped on every join, leave, expiry, resize)

Every key of a partition carries the same hash tag ``{NS:pP}``, so a partition lives on one cluster node
and one Lua script admits-and-evicts atomically there: no cross-node lock, no transaction spanning nodes.
The group budget is split evenly over the K partitions (the remainder to the first ones); each partition
enforces ``used <= cap`` inside its script, so the group's bytes never exceed the sum of the caps.
Membership lives on its own hash tag; a change bumps ``gen`` and the member that notices re-applies the
caps to every partition (a script that ignores a stale ``gen`` and evicts the least important excess).

Every call runs on a worker thread and is waited for at most the deadline (``timeout_s``, default 50 ms,
plus 10 ms per MiB of value): a down, slow or full node costs a hit, never an error or a wrong byte.
Failures are counted (``errors``); after repeated failures a partition, or the whole tier, is skipped for
a back-off period (1 s, doubling to 30 s) and then retried.

Values are authenticated before they are served: the tag is HMAC-SHA256, keyed with the group's secret
(``--shared-tier-secret``), over the format tag, the group, the key, the file's path and version, and the
data. Whoever can write to Redis but does not hold the secret cannot make a member serve bytes the source
does not hold: a value that fails (another format, another length, another tag) is deleted, counted
(``auth_failed``), logged once per key, and the open reads the backend. Without a secret
(``--shared-tier-insecure``) the tag is the same HMAC under an empty key: a checksum against accidents
only, whose failures count as ``corrupt``.

Here: :class:`SharedTier`, a member's reads, offers and threads. Its calls with a deadline and back-off
are :class:`.shared_calls.DeadlineCalls`, its membership and the group's budget
:class:`.shared_group.GroupMembership`; the Lua scripts are in :mod:`.shared_scripts`, the value format
and its tag in :mod:`.shared_values`, the options' URLs and secret in :mod:`.shared_config` (their
public names are re-exported here).

Thread-safe. ``redis`` (redis-py >= 5) is imported only when a shared tier is configured.
"""
from __future__ import annotations

import concurrent.futures as cf
import hmac
import logging
import os
import queue
import socket
import threading
import time
import urllib.parse
from typing import Dict, List, Optional, Sequence

import xxhash

from ..logutil import RateLimitedLog
from .shared_calls import PER_MIB_S, SKIP, SOCKET_MARGIN_S, Breaker, DeadlineCalls
from .shared_config import (MIN_SECRET, SharedTierConfigError, namespace_key, parse_urls, read_secret,
                            redact_url)
from .shared_group import GroupMembership
from .shared_scripts import ADMIT, DELETE, RESCORE, TOUCH
from .shared_values import AUTH_LOG_WINDOW_S, HEADER, MAGIC, AuthFailureLog, SharedKey, value_tag

__all__ = ["SharedTier", "SharedTierConfigError", "SharedKey", "parse_urls", "redact_url", "namespace_key",
           "read_secret", "value_tag", "HEADER", "MAGIC", "DEFAULT_PARTITIONS", "MODES", "MIN_SECRET"]

log = logging.getLogger("shadefs.shared")

DEFAULT_PARTITIONS = 64
OFFER_QUEUE_BYTES = 64 << 20  # bytes of values queued for the offer thread at most (an offer past it is dropped)
CAP_BATCH = 1000          # values one SET_CAP call evicts at most (Redis runs a script alone: ~10-20 ms per call)
# policy name -> admission mode of the partition script
MODES = {"shade": "imp", "static": "static", "lru": "lru", "fifo": "fifo"}


class SharedTier(DeadlineCalls, GroupMembership):
    """This mount's membership in a group's shared tier.

    Args:
        urls: Redis URLs (:func:`parse_urls`); the first reachable one is asked whether it is a cluster.
        source_url: the mounted source (names the group).
        size_bytes: this member's contribution to the group's budget (bytes, >= 0).
        policy: the mount's ``--policy`` (``shade``: rank by importance; ``lru``/``fifo``: by time;
            anything else: ``static``, admit while there is room and never evict).
        timeout_s: the deadline of one call (seconds), plus 10 ms per MiB of value.
        max_file: files above this many bytes bypass the tier.
        partitions: K, the number of hash-tagged partitions (every member of a group must agree).
        password: overrides a password in the URLs (``--shared-tier-password-file``).
        secret: the group's secret (:func:`read_secret`), which authenticates every value; None runs the
            tier without authentication (``--shared-tier-insecure``: anyone who can write to Redis can
            make members serve bytes of their choosing).
        heartbeat_s: membership heartbeat period (seconds); a member is dropped ``3 x heartbeat_s`` after
            its last heartbeat.
        member_id: this member's name in the group (default ``host:pid:random``).
        workers: threads that run calls (the FUSE request path waits on them at most the deadline).

    Raises:
        SharedTierConfigError: bad URL, size, timeout or partition count.
    """

    def __init__(self, urls: Sequence[str], source_url: str, size_bytes: int, policy: str = "static",
                 timeout_s: float = 0.05, max_file: int = 16 * 2**20, partitions: int = DEFAULT_PARTITIONS,
                 password: Optional[str] = None, heartbeat_s: float = 2.0, member_id: Optional[str] = None,
                 workers: int = 8, fail_threshold: int = 3, backoff_s: float = 1.0, backoff_max_s: float = 30.0,
                 offer_queue: int = 64, secret: Optional[bytes] = None):
        self.urls = list(urls) if not isinstance(urls, str) else parse_urls(urls)
        if not self.urls:
            raise SharedTierConfigError("--shared-tier: no URL")
        if size_bytes < 0:
            raise SharedTierConfigError("--shared-tier-size: must be >= 0")
        if not 0 < timeout_s <= 60:
            raise SharedTierConfigError(f"--shared-tier-timeout {timeout_s}: seconds in (0, 60]")
        if not 1 <= partitions <= 16384:
            raise SharedTierConfigError(f"shared tier partitions {partitions}: 1..16384")
        if secret is not None and len(secret) < MIN_SECRET:
            raise SharedTierConfigError(f"shared tier secret: {len(secret)} bytes; at least {MIN_SECRET}")
        self.secret = secret
        self.ns = namespace_key(source_url)
        self.size_bytes = int(size_bytes)
        self.policy = policy
        self.mode = MODES.get(policy, "static")
        self.timeout_s = float(timeout_s)
        self.max_file = int(max_file)
        # the client's socket timeout: a worker stuck on a hung Redis is freed after it. Every call's
        # deadline ends before it (DeadlineCalls._run), so that a hung call ends at its deadline, counted
        # so, never at the socket's timeout first
        self.socket_timeout_s = max(1.0, self.timeout_s + self.max_file / 2**20 * PER_MIB_S) + SOCKET_MARGIN_S
        self.K = int(partitions)
        self.password = password
        self.heartbeat_s = float(heartbeat_s)
        self.member_id = member_id or f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
        self.redacted = ",".join(redact_url(u) for u in self.urls)
        self._tags = [f"shadefs:{{{self.ns}:p{p}}}:" for p in range(self.K)]
        g = f"shadefs:{{{self.ns}:g}}:"
        self._group_keys = (g + "members", g + "sizes", g + "meta")
        self._pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="shared")
        self._lock = threading.Lock()
        self._breakers = [Breaker(fail_threshold, backoff_s, backoff_max_s) for _ in range(self.K)]
        self._global = Breaker(fail_threshold * 3, backoff_s, backoff_max_s)
        self._offers: "queue.Queue" = queue.Queue(maxsize=offer_queue)
        # the bytes of the values queued: at most offer_queue_bytes (an offer past it is dropped)
        self.offer_queue_bytes = OFFER_QUEUE_BYTES
        self._queued_bytes = 0
        self.cap_batch = CAP_BATCH  # values one SET_CAP call evicts at most
        self.cap_calls = 0       # SET_CAP calls made (one per partition per batch)
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self._err_log = RateLimitedLog(log, 10.0)
        self._auth_log = AuthFailureLog()  # which failed authentications are logged
        self.client = None
        self.cluster = False
        self._connect_lock = threading.Lock()
        self.gen = -1            # the membership generation whose caps we applied last
        self.group_capacity = 0
        self.members = 0
        self.joined = False
        # counters (under self._lock)
        self.errors = 0          # calls that failed or ran past their deadline
        self.deadlines = 0       # of those, calls that ran past their deadline (the caller went on without them)
        self.skipped = 0         # calls not made because the tier (or the partition) was backing off
        self.corrupt = 0         # values that failed verification without a secret (deleted)
        self.auth_failed = 0     # values that failed authentication with the group's secret (deleted)
        self.gets = 0
        self.get_hits = 0
        self.offers = {"admitted": 0, "resident": 0, "refused": 0, "dropped": 0, "failed": 0}
        self.cap_evictions = 0   # evicted by a budget shrink (a member left), as applied by this member
        self._group = {"used_bytes": 0, "files": 0, "evictions": 0}
        self._free: List[Optional[int]] = [None] * self.K  # per partition, as of the last refresh

    def offer_queue_memory(self) -> dict:
        """``{"bound_bytes", "used_bytes"}``: the bytes of offers queued for the offer thread and its
        bound (:attr:`offer_queue_bytes`)."""
        with self._lock:
            return {"bound_bytes": self.offer_queue_bytes, "used_bytes": self._queued_bytes}

    # -- keys ------------------------------------------------------------------------------------------------
    @staticmethod
    def key(relpath: str, size: int, mtime_ns: int = 0, etag: int = 0) -> SharedKey:
        """The group-wide name of one version of a file: 128-bit xxh3 (hex) of its path and version (size
        in bytes, mtime in ns, and ``etag``, the backend's 64-bit ETag hash, 0 where it lists none)."""
        ident = f"{relpath}\0{int(size)}\0{int(mtime_ns)}\0{int(etag):016x}".encode("utf-8", "surrogateescape")
        return SharedKey(xxhash.xxh3_128_hexdigest(b"v2\0" + ident), ident)

    def partition(self, key: str) -> int:
        return int(key[:8], 16) % self.K

    def _pkeys(self, p: int):
        t = self._tags[p]
        return t + "z", t + "s", t + "m"

    # -- connection -----------------------------------------------------------------------------------------
    def _connect(self):
        """Build the client: RedisCluster when the first reachable seed reports cluster mode, else Redis."""
        import redis
        from redis.backoff import NoBackoff
        from redis.cluster import ClusterNode, RedisCluster
        from redis.retry import Retry

        sock_t = self.socket_timeout_s
        last = None
        for url in self.urls:
            kw = dict(socket_timeout=sock_t, socket_connect_timeout=max(0.2, self.timeout_s * 4))
            if self.password is not None:
                kw["password"] = self.password
            try:
                probe = redis.Redis.from_url(url, **kw)
                try:
                    info = probe.info("cluster")
                finally:
                    probe.close()
            except redis.RedisError as e:
                last = e
                continue
            if info.get("cluster_enabled"):
                u = urllib.parse.urlsplit(url)
                nodes = [ClusterNode(urllib.parse.urlsplit(x).hostname, urllib.parse.urlsplit(x).port)
                         for x in self.urls]
                ckw = dict(kw)
                if u.username:
                    ckw["username"] = urllib.parse.unquote(u.username)
                if u.password is not None and self.password is None:
                    ckw["password"] = urllib.parse.unquote(u.password)
                if u.scheme == "rediss":
                    ckw["ssl"] = True
                client = RedisCluster(startup_nodes=nodes, retry=Retry(NoBackoff(), 1), **ckw)
                self.cluster = True
            else:
                client = redis.Redis.from_url(url, **kw)
                self.cluster = False
            log.info("shared tier: %s (%s), group %s, member %s, %s contributed, %d partitions, %s",
                     self.redacted, "Redis Cluster" if self.cluster else "one Redis server", self.ns,
                     self.member_id, self.size_bytes, self.K,
                     "values authenticated with the group secret" if self.secret is not None
                     else "values NOT authenticated (--shared-tier-insecure)")
            return client
        raise ConnectionError(f"no Redis reachable at {self.redacted}: {last}")

    def _client(self):
        c = self.client
        if c is None:
            with self._connect_lock:
                if self.client is None:
                    self.client = self._connect()
                c = self.client
        return c

    # -- the read path -------------------------------------------------------------------------------------
    def get(self, key: str, size: int) -> Optional[bytes]:
        """The verified value of ``key`` (exactly ``size`` bytes), or None (absent, too large, failed,
        past the deadline, backing off, or corrupt). Never raises."""
        if size > self.max_file or not self.joined:
            return None
        p = self.partition(key)
        vk = self._tags[p] + "v:" + key

        def call(c):
            if self.mode == "lru":
                pipe = c.pipeline(transaction=False)
                pipe.get(vk)
                pipe.execute_command("EVAL", TOUCH, 1, self._tags[p] + "z", key)
                return pipe.execute()[0]
            return c.get(vk)

        with self._lock:
            self.gets += 1
        raw = self._run(call, p, self._deadline(size))
        if raw is SKIP or raw is None:
            return None
        data = self._verify(key, raw, size)
        if data is not None:
            with self._lock:
                self.get_hits += 1
        return data

    def get_many(self, keys: Sequence[str], sizes: Sequence[int]) -> List[Optional[bytes]]:
        """:meth:`get` for a batch in one pipelined round trip per node (``warm``, the prefetcher)."""
        idx = [i for i, (k, s) in enumerate(zip(keys, sizes)) if s <= self.max_file]
        out: List[Optional[bytes]] = [None] * len(keys)
        if not idx or not self.joined:
            return out
        vks = [self._tags[self.partition(keys[i])] + "v:" + keys[i] for i in idx]

        def call(c):
            pipe = c.pipeline(transaction=False)
            for vk in vks:
                pipe.get(vk)
            return pipe.execute(raise_on_error=False)

        raws = self._run(call, None, self._deadline(sum(sizes[i] for i in idx)) + self.timeout_s)
        with self._lock:
            self.gets += len(idx)
        if raws is SKIP:
            return out
        for i, raw in zip(idx, raws):
            if isinstance(raw, bytes):
                out[i] = self._verify(keys[i], raw, sizes[i])
        with self._lock:
            self.get_hits += sum(x is not None for x in out)
        return out

    def contains_many(self, keys: Sequence[str], chunk: int = 4096) -> List[bool]:
        """Residency of ``keys`` in the group: pipelined ``ZSCORE``s, ``chunk`` per round trip, each
        chunk within a deadline of ``4 x timeout_s + 2 us`` per key; False where unknown (failed)."""
        out = [False] * len(keys)
        if not keys or not self.joined:
            return out
        for i in range(0, len(keys), chunk):
            part = keys[i:i + chunk]

            def call(c, part=part):
                pipe = c.pipeline(transaction=False)
                for k in part:
                    pipe.zscore(self._tags[self.partition(k)] + "z", k)
                return pipe.execute(raise_on_error=False)

            res = self._run(call, None, self.timeout_s * 4 + len(part) * 2e-6)
            if res is SKIP:
                break
            out[i:i + len(part)] = [isinstance(r, float) for r in res]
        return out

    def _tag(self, key: str, data) -> bytes:
        return value_tag(self.secret or b"", self.ns, key, getattr(key, "ident", key.encode()), data)

    def _verify(self, key: str, raw: bytes, size: int) -> Optional[bytes]:
        """The data of ``raw`` when it is a value of this format, length and tag; else None, after the
        value is counted, logged (once per key, rate-limited) and deleted. Never serves a failed value."""
        ok = (len(raw) == HEADER + size and raw[:len(MAGIC)] == MAGIC
              and hmac.compare_digest(raw[len(MAGIC):HEADER], self._tag(key, memoryview(raw)[HEADER:])))
        if ok:
            return raw[HEADER:]
        if self.secret is None:
            with self._lock:
                self.corrupt += 1
            self._err_log(logging.WARNING, "shared tier: dropping a corrupt value (%d bytes, expected %d + %d)",
                          len(raw), HEADER, size)
        else:
            with self._lock:
                self.auth_failed += 1
                first, suppressed = self._auth_log.note(key, time.monotonic())
            if first:
                log.warning("shared tier: a value failed authentication (key %s, %d bytes, format %r): not written "
                            "with this group's secret; deleted, reading the source%s", key, len(raw),
                            bytes(raw[:len(MAGIC)]),
                            f" ({suppressed} more keys failed in the last {AUTH_LOG_WINDOW_S:g} s, not logged)"
                            if suppressed else "")
        self.evict(key)
        return None

    # -- admission ------------------------------------------------------------------------------------------
    def offer(self, key: str, data: bytes, score: float = 1.0) -> str:
        """Offer a file read from the backend to the group (admit-and-evict in one script, atomically).

        Returns:
            ``"admitted"``, ``"resident"`` (some member stored it already), ``"refused"`` (the policy:
            full under ``static``, or not more important than the partition's least important resident
            under ``shade``; or too large), ``"failed"`` (Redis error or past the deadline, counted).
        """
        size = len(data)
        if size > self.max_file or not self.joined:
            self._count_offer("refused")
            return "refused"
        p = self.partition(key)
        z, s, m = self._pkeys(p)
        payload = MAGIC + self._tag(key, data) + bytes(data)
        args = (key, repr(float(score)), size, payload, self.mode, self._tags[p] + "v:")
        res = self._run(lambda c: self._script(c, ADMIT, (z, s, m, self._tags[p] + "v:" + key), args), p,
                        self._deadline(size) + self.timeout_s)
        outcome = "failed" if res is SKIP else ("refused", "resident", "admitted")[int(res[0])]
        self._count_offer(outcome)
        return outcome

    def _count_offer(self, outcome: str) -> None:
        with self._lock:
            self.offers[outcome] += 1

    def offer_async(self, key: str, data: bytes, score: float = 1.0) -> bool:
        """Queue :meth:`offer` for the background offer thread (off the request path). False when the
        queue is full (counted ``dropped``): the group will get it from the next member that misses."""
        if len(data) > self.max_file or not self.joined:
            return False
        if self.mode == "static":  # a full partition refuses every newcomer: save the transfer
            free = self._free[self.partition(key)]
            if free is not None and free < len(data):
                self._count_offer("refused")
                return False
        n = len(data)
        with self._lock:
            if self._queued_bytes + n > self.offer_queue_bytes:
                self.offers["dropped"] += 1
                return False
            self._queued_bytes += n
        try:
            self._offers.put_nowait((key, data, score))
            return True
        except queue.Full:
            with self._lock:
                self._queued_bytes -= n
            self._count_offer("dropped")
            return False

    def _offer_loop(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._offers.get(timeout=0.2)
            except queue.Empty:
                continue
            if item is None:
                break
            try:
                if item[0] is None:
                    self.rescore(item[1], item[2])
                else:
                    self.offer(*item)
            finally:
                if item[0] is not None:
                    with self._lock:
                        self._queued_bytes -= len(item[1])
                item = None  # its bytes go now, not when the next one arrives
                self._offers.task_done()

    def drain(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued offer ran (tests, benchmarks). True when drained in time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._offers.unfinished_tasks == 0:
                return True
            time.sleep(0.005)
        return False

    def rescore_async(self, keys: Sequence[str], scores: Sequence[float]) -> bool:
        """Queue :meth:`rescore` for the offer thread; False (dropped) when the queue is full."""
        if self.mode != "imp" or not keys or not self.joined:
            return False
        try:
            self._offers.put_nowait((None, list(keys), list(scores)))
            return True
        except queue.Full:
            return False

    def evict(self, key: str) -> bool:
        """Remove ``key`` from the group (a corrupt value, a test). True when it was resident."""
        p = self.partition(key)
        z, s, m = self._pkeys(p)
        res = self._run(lambda c: self._script(c, DELETE, (z, s, m, self._tags[p] + "v:" + key), (key,)), p,
                        self.timeout_s * 4)
        return res is not SKIP and bool(res)

    def rescore(self, keys: Sequence[str], scores: Sequence[float]) -> int:
        """Set the rank score of resident ``keys`` (the group's importance under ``shade``), one
        pipelined script per partition. Returns how many changed; 0 on failure."""
        if self.mode != "imp" or not keys or not self.joined:
            return 0
        byp: Dict[int, list] = {}
        for k, v in zip(keys, scores):
            byp.setdefault(self.partition(k), []).extend((repr(float(v)), k))

        def call(c):
            pipe = c.pipeline(transaction=False)
            for p, args in byp.items():
                pipe.execute_command("EVAL", RESCORE, 1, self._tags[p] + "z", *args)
            return pipe.execute(raise_on_error=False)

        res = self._run(call, None, self.timeout_s * 8, wait=True)
        return 0 if res is SKIP else sum(r for r in res if isinstance(r, int))

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Join the group (first heartbeat, bounded by a few deadlines) and start the heartbeat and offer
        threads. Redis being unreachable is logged, not raised: the tier joins when it comes back."""
        if self.secret is None:
            log.warning("shared tier without a group secret (--shared-tier-insecure): whoever can write to %s "
                        "can make this mount serve bytes of their choosing", self.redacted)
        if not self.heartbeat():
            log.warning("shared tier %s not reachable yet; serving without it and retrying every %.1f s",
                        self.redacted, self.heartbeat_s)
        for target, name in ((self._heartbeat_loop, "shared-heartbeat"), (self._offer_loop, "shared-offer")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def close(self, leave: bool = True) -> None:
        """Stop the threads; ``leave``: drop out of the group (its budget shrinks now, the excess is
        evicted). Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2)
        if leave and self.client is not None:
            self.heartbeat(leave=True)
        self.joined = False
        self._pool.shutdown(wait=False)
        if self.client is not None:
            try:
                self.client.close()
            except Exception:
                pass

    # -- figures ----------------------------------------------------------------------------------------------
    def stats(self) -> dict:
        """``tiers.shared`` of the stats JSON (never touches Redis: the heartbeat refreshes the figures).

        ``used_bytes``/``capacity_bytes``: this member's share (its size, and the group's bytes in
        proportion to it); ``group_used_bytes``/``group_capacity_bytes``: the whole group's; ``files`` and
        ``evictions``: the group's."""
        with self._lock:
            g = dict(self._group)
            cap = self.group_capacity
            share = g["used_bytes"] * self.size_bytes // cap if cap else 0
            return {"used_bytes": share, "capacity_bytes": self.size_bytes, "files": g["files"],
                    "evictions": g["evictions"], "group_used_bytes": g["used_bytes"],
                    "group_capacity_bytes": cap, "members": self.members, "partitions": self.K,
                    "cluster": self.cluster, "url": self.redacted}

    def counters(self) -> dict:
        with self._lock:
            return {"errors": self.errors, "deadlines": self.deadlines, "skipped": self.skipped, "corrupt": self.corrupt,
                    "auth_failed": self.auth_failed,
                    "gets": self.gets, "get_hits": self.get_hits, "offers": dict(self.offers),
                    "cap_evictions": self.cap_evictions, "cap_calls": self.cap_calls}
