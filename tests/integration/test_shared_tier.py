"""SharedTier against real redis-server processes (a standalone server, a 3-master cluster, a replica
for failover): group membership, one copy per sample, the group budget, importance ranking, faults."""
from __future__ import annotations

import os
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from redisutil import require_redis, redis_cluster, redis_cluster_replica, redis_server  # noqa: F401  (fixtures)
require_redis()
from shadefs.cache.shared import HEADER, SharedTier, SharedTierConfigError, parse_urls, redact_url  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def blob(i: int, size: int) -> bytes:
    return (i.to_bytes(4, "little") * (size // 4 + 1))[:size]


SECRET = b"group-secret-0123456789"


def tier(urls, source="s3://bucket/ds", size=10_000, **kw):
    kw.setdefault("heartbeat_s", 0.2)
    kw.setdefault("secret", SECRET)
    kw.setdefault("partitions", 4)
    kw.setdefault("timeout_s", 0.5)  # 2 shared cores: generous; the fault tests set their own
    t = SharedTier(parse_urls(urls), source, size, **kw)
    t.start()
    return t


def check_exact(t: SharedTier) -> dict:
    """Every partition: counter == sum of recorded sizes == sum of stored value sizes <= cap."""
    used = 0
    for p in t.partition_figures():
        assert p["used"] == p["sizes_sum"] == p["values_sum"], p
        assert p["files"] == p["members"], p
        assert p["used"] <= p["cap"], p
        used += p["used"]
    return {"used": used}


def test_urls_and_redaction():
    assert parse_urls("redis://:pw@h1:7000,h2:7001") == ["redis://:pw@h1:7000", "redis://:pw@h2:7001"]
    assert parse_urls("rediss://h1") == ["rediss://h1:6379"]
    assert redact_url("redis://user:s3cret@h:1") == "redis://user:***@h:1"
    assert redact_url("redis://h:1") == "redis://h:1"
    for bad in ("", "http://h:1", "h1:6379", "redis://:x@:1", "redis://h:99999"):
        with pytest.raises(SharedTierConfigError):
            parse_urls(bad)


def test_roundtrip_one_copy_and_exact_bytes(redis_server):
    a = tier(redis_server.url, member_id="a")
    b = tier(redis_server.url, member_id="b")
    try:
        assert a.heartbeat()  # a joined alone: its next heartbeat learns of b (its thread may have already)
        assert a.stats()["members"] == 2 and a.stats()["group_capacity_bytes"] == 20_000
        k = SharedTier.key("cat/1.jpg", 3000, 5)
        assert b.get(k, 3000) is None
        assert a.offer(k, blob(1, 3000), 1.0) == "admitted"
        assert b.get(k, 3000) == blob(1, 3000)          # what node A stored is a hit on node B
        assert b.offer(k, blob(1, 3000), 1.0) == "resident"  # stored once for the group
        assert b.get(k, 2999) is None                     # a size mismatch is never served
        assert b.counters()["auth_failed"] == 1 and b.counters()["corrupt"] == 0
        assert a.get(k, 3000) is None                     # ... and the bad entry was dropped
        a.refresh()
        assert check_exact(a)["used"] == 0
        too_big = SharedTier.key("big", 30_000)
        assert a.offer(too_big, blob(2, 30_000)) == "refused"  # over every partition's cap
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("secret", [SECRET, None], ids=["secret", "insecure"])
def test_corrupt_value_is_dropped_not_served(redis_server, secret):
    import redis

    t = tier(redis_server.url, secret=secret)
    try:
        k = SharedTier.key("x", 1000)
        assert t.offer(k, blob(3, 1000)) == "admitted"
        r = redis.Redis.from_url(redis_server.url)
        vk = t._tags[t.partition(k)] + "v:" + k
        raw = bytearray(r.get(vk))
        raw[HEADER + 10] ^= 0xFF  # one flipped byte: the tag catches it
        r.set(vk, bytes(raw))
        assert t.get(k, 1000) is None
        # with a secret, a changed value is one that failed authentication; without, a corrupt one
        assert t.counters()["auth_failed" if secret else "corrupt"] == 1
        assert t.counters()["corrupt" if secret else "auth_failed"] == 0
        assert r.exists(vk) == 0
        check_exact(t)
    finally:
        t.close()


def test_values_are_bound_to_secret_group_path_and_version(redis_server):
    """A value is served only under the key, the path and version, and the group it was written for, and
    only to members holding the secret it was written with: each mismatch fails authentication."""
    import redis

    r = redis.Redis.from_url(redis_server.url)
    a = tier(redis_server.url, source="src-a", member_id="a")
    other = tier(redis_server.url, source="src-a", member_id="o", secret=b"another-secret-0123456")
    b = tier(redis_server.url, source="src-b", member_id="b")
    try:
        k1, k2 = SharedTier.key("f1", 1000, 5), SharedTier.key("f2", 1000, 5)
        assert a.offer(k1, blob(1, 1000)) == "admitted" and a.offer(k2, blob(2, 1000)) == "admitted"
        assert a.get(k1, 1000) == blob(1, 1000)
        assert SharedTier.key("f1", 1000, 5, etag=7) != k1 != SharedTier.key("f1", 1000, 6)  # the version
        vk = lambda t, k: t._tags[t.partition(k)] + "v:" + k  # noqa: E731
        # a value copied under another key (another file, or another version of this one)
        v1 = r.get(vk(a, k1))
        k3 = SharedTier.key("f1", 1000, 6)
        r.set(vk(a, k3), v1)
        assert a.get(k3, 1000) is None and a.counters()["auth_failed"] == 1
        # a value copied into another group (another source) with the same key
        r.set(vk(b, k1), v1)
        assert b.get(k1, 1000) is None and b.counters()["auth_failed"] == 1
        # a member with another secret: fails, and deletes it (the group's next offer stores it again)
        assert other.get(k2, 1000) is None and other.counters()["auth_failed"] == 1
        assert r.exists(vk(a, k2)) == 0
        assert a.get(k1, 1000) == blob(1, 1000) and a.counters()["auth_failed"] == 1
    finally:
        for t in (a, other, b):
            t.close()


def test_a_secret_shorter_than_16_bytes_is_refused():
    with pytest.raises(SharedTierConfigError, match="at least 16"):
        SharedTier(["redis://127.0.0.1:1"], "src", 0, secret=b"short")


def test_static_refuses_when_full_shade_evicts_least_important(redis_server):
    st_ = tier(redis_server.url, source="src-static", size=4 * 1000, policy="static", partitions=1)
    sh = tier(redis_server.url, source="src-shade", size=4 * 1000, policy="shade", partitions=1)
    try:
        keys = [SharedTier.key(f"f{i}", 1000) for i in range(6)]
        for i in range(4):
            assert st_.offer(keys[i], blob(i, 1000)) == "admitted"
            assert sh.offer(keys[i], blob(i, 1000), float(i + 1)) == "admitted"  # scores 1..4
        assert st_.offer(keys[4], blob(4, 1000)) == "refused"       # static: full, never evicts
        assert sh.offer(keys[4], blob(4, 1000), 1.0) == "refused"   # not above the least important (1.0)
        assert sh.offer(keys[4], blob(4, 1000), 2.5) == "admitted"  # above 1.0: f0 is the victim
        assert sh.get(keys[0], 1000) is None and sh.get(keys[4], 1000) == blob(4, 1000)
        # a newcomer needing two victims must beat both: 2.0 and 2.5 are the two least important
        big = SharedTier.key("big", 2000)
        assert sh.offer(big, blob(9, 2000), 2.4) == "refused"
        assert sh.offer(big, blob(9, 2000), 2.6) == "admitted"
        assert [sh.get(keys[i], 1000) is not None for i in range(5)] == [False, False, True, True, False]
        sh.refresh()
        assert sh.stats()["evictions"] == 3 and sh.stats()["files"] == 3
        assert check_exact(sh)["used"] == 4000
        assert sh.rescore([keys[2]], [0.5]) == 1  # the group's importance moves a resident's rank
        assert sh.offer(keys[5], blob(5, 1000), 0.7) == "admitted"
        assert sh.get(keys[2], 1000) is None
    finally:
        st_.close()
        sh.close()


def test_member_leaving_shrinks_budget_and_evicts_excess(redis_cluster):
    a = tier(redis_cluster.urls, member_id="a", size=8000, policy="shade")
    b = tier(redis_cluster.urls, member_id="b", size=8000, policy="shade")
    try:
        a.heartbeat()
        assert a.cluster and a.stats()["group_capacity_bytes"] == 16_000
        n = 0
        for i in range(200):  # fill the 4 partitions (4000 bytes each) with 500-byte files
            n += a.offer(SharedTier.key(f"f{i}", 500), blob(i, 500), float(i)) == "admitted"
        a.refresh()
        before = check_exact(a)["used"]
        assert before == 16_000 and a.stats()["files"] == 32
        b.close()  # leaves: the group budget is a's 8000 bytes from now on
        assert b.stats()["members"] in (1, 2)
        a.heartbeat()
        assert a.stats()["group_capacity_bytes"] == 8000 and a.stats()["members"] == 1
        assert check_exact(a)["used"] == 8000
        # the least important went first: the most important file stored is still there
        assert a.get(SharedTier.key("f199", 500), 500) == blob(199, 500)
        # a member joining grows the budget again without losing what is stored
        c = tier(redis_cluster.urls, member_id="c", size=4000)
        try:
            a.heartbeat()
            assert a.stats()["group_capacity_bytes"] == 12_000
            assert check_exact(a)["used"] == 8000
        finally:
            c.close()
    finally:
        a.close()
        b.close()


def test_expired_member_drops_out(redis_server):
    a = tier(redis_server.url, member_id="a", size=5000)
    b = tier(redis_server.url, member_id="b", size=5000)
    try:
        a.heartbeat()
        assert a.stats()["group_capacity_bytes"] == 10_000
        b._stop.set()  # b stops heartbeating (a crashed node) without leaving
        deadline = time.monotonic() + 5
        while a.stats()["group_capacity_bytes"] != 5000 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert a.stats()["group_capacity_bytes"] == 5000 and a.stats()["members"] == 1
    finally:
        a.close()
        b.close(leave=False)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(offers=st.lists(st.tuples(st.integers(0, 60), st.integers(1, 3000), st.floats(0, 10)),
                       min_size=1, max_size=60),
       sizes=st.tuples(st.integers(0, 9000), st.integers(0, 9000)),
       policy=st.sampled_from(["shade", "static", "lru"]))
def test_group_budget_holds_under_concurrent_offers(redis_cluster, offers, sizes, policy):
    source = f"prop-{os.urandom(6).hex()}"
    a = tier(redis_cluster.urls, source=source, size=sizes[0], policy=policy, member_id="a")
    b = tier(redis_cluster.urls, source=source, size=sizes[1], policy=policy, member_id="b")
    try:
        a.heartbeat()
        cap = sizes[0] + sizes[1]
        assert a.stats()["group_capacity_bytes"] == cap
        stored = {}

        def run(t, part):
            for i, size, score in part:
                k = SharedTier.key(f"f{i}", size)
                if t.offer(k, blob(i, size), score) == "admitted":
                    stored[k] = (i, size)

        ts = [threading.Thread(target=run, args=(t, offers[j::2])) for j, t in enumerate((a, b))]
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        assert a.counters()["errors"] == b.counters()["errors"] == 0
        assert check_exact(a)["used"] <= cap
        for k, (i, size) in stored.items():  # whatever is served is exact
            got = b.get(k, size)
            assert got is None or got == blob(i, size)
    finally:
        a.close()
        b.close()


def test_down_server_costs_hits_never_errors(redis_server):
    t = tier(redis_server.url, timeout_s=0.05, backoff_s=1.0)
    try:
        k = SharedTier.key("x", 1000)
        assert t.offer(k, blob(1, 1000)) == "admitted"
        redis_server.pause()  # accepts connections, never answers: the slow-node case
        assert t.get(k, 1000) is None
        # the deadline ended the call, not the socket's timeout (an error of its own kind)
        assert t.counters()["errors"] == t.counters()["deadlines"] == 1
        for _ in range(3):
            assert t.get(k, 1000) is None
        # the partition's third failure in a row opened its breaker: the fourth get was not sent (the
        # heartbeats' failures count towards the whole tier's breaker only, 9 in a row)
        assert t.counters()["skipped"] == 1
        redis_server.resume()
        deadline = time.monotonic() + 5  # the back-off (1 s) ends; the tier is retried and hits again
        while t.get(k, 1000) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert t.get(k, 1000) == blob(1, 1000)
        redis_server.kill()
        assert t.get(k, 1000) is None and t.offer(k, blob(1, 1000)) in ("failed",)
    finally:
        t.close()


def test_killed_master_costs_its_partitions_only(redis_cluster):
    t = tier(redis_cluster.urls, partitions=16, size=10**6, timeout_s=0.2)
    try:
        keys = [SharedTier.key(f"f{i}", 100) for i in range(64)]
        for i, k in enumerate(keys):
            assert t.offer(k, blob(i, 100)) == "admitted"
        # the keys whose partition lives on the master about to die (EXISTS there; MOVED for the others')
        import redis
        doomed = redis.Redis.from_url(redis_cluster.masters[2].url)
        lost = set()
        for k in keys:
            try:
                if doomed.exists(t._tags[t.partition(k)] + "v:" + k):
                    lost.add(k)
            except redis.ResponseError:  # MOVED: another master's slot
                pass
        doomed.close()
        assert 0 < len(lost) < 64
        redis_cluster.masters[2].kill()
        got = [t.get(k, 100) for k in keys]
        assert [g for k, g in zip(keys, got) if k in lost] == [None] * len(lost)
        # the two live masters still serve every one of their partitions' values, exact
        assert [g for k, g in zip(keys, got) if k not in lost] == [blob(i, 100) for i, k in enumerate(keys)
                                                                   if k not in lost]
        assert t.counters()["errors"] >= 1
    finally:
        t.close(leave=False)


def test_cluster_failover_is_survived(redis_cluster_replica):
    c = redis_cluster_replica
    t = tier(c.urls, partitions=16, size=10**6, timeout_s=0.2, backoff_s=0.2)
    try:
        keys = [SharedTier.key(f"f{i}", 100) for i in range(64)]
        for i, k in enumerate(keys):
            assert t.offer(k, blob(i, 100)) == "admitted"
        c.wait_replicated()  # the replica has every write of its master (a bare WAIT does not ensure it)
        c.masters[0].kill()
        rep = c.replicas[0]
        rep.cli("cluster", "failover", "takeover")  # what the cluster does itself after node-timeout
        c._wait(lambda: "role:master" in rep.cli("info", "replication"), "replica promoted")
        deadline = time.monotonic() + 15
        hits = 0
        while time.monotonic() < deadline:
            got = [t.get(k, 100) for k in keys]
            assert all(g is None or g == blob(i, 100) for i, g in enumerate(got))
            hits = sum(g is not None for g in got)
            if hits == 64:
                break
            time.sleep(0.2)
        assert hits == 64  # every value again, from the promoted replica
    finally:
        t.close(leave=False)


def documented_acl_rule(group: str, password: str) -> list:
    """docs/operations.md's ACL line for ``group``: the arguments of ``ACL SETUSER shadefs-GROUP``."""
    import re

    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "operations.md")).read()
    rule = re.search(r"^\s*user shadefs-GROUP on (.+)$", doc, re.M).group(1).split()
    return [">" + password if r.startswith(">") else r.replace("GROUP", group) for r in rule]


def test_the_documented_acl_user_is_enough_and_confined_to_its_group(redis_cluster):
    """docs/operations.md's per-group ACL user, applied to every master: a group's tier works through it
    (errors 0), and the user of group A can neither read nor write group B's keys."""
    import redis
    from redis.cluster import RedisCluster

    from shadefs.cache.shared import namespace_key

    for source, pw in (("src-a", "pw-a"), ("src-b", "pw-b")):
        rule = documented_acl_rule(namespace_key(source), pw)
        for s in redis_cluster.masters:
            s.cli("acl", "setuser", f"shadefs-{namespace_key(source)}", "on", *rule)

    def urls(source, pw):
        return ",".join(f"redis://shadefs-{namespace_key(source)}:{pw}@127.0.0.1:{s.port}"
                        for s in redis_cluster.masters)

    a = tier(urls("src-a", "pw-a"), source="src-a", member_id="a", policy="shade")
    a2 = tier(urls("src-a", "pw-a"), source="src-a", member_id="a2", policy="lru")
    b = tier(urls("src-b", "pw-b"), source="src-b", member_id="b")
    a_on_b = tier(urls("src-a", "pw-a"), source="src-b", member_id="intruder", timeout_s=0.5)
    try:
        assert a.cluster and a.heartbeat() and b.heartbeat()
        k = SharedTier.key("x", 500)
        assert a.offer(k, blob(1, 500), 2.0) == "admitted" and b.offer(k, blob(2, 500)) == "admitted"
        assert a2.get(k, 500) == blob(1, 500) and b.get(k, 500) == blob(2, 500)
        assert a2.get_many([k], [500]) == [blob(1, 500)] and a2.contains_many([k]) == [True]
        assert a.rescore([k], [3.0]) == 1
        a.refresh()
        assert a.apply_caps(a.gen, a.group_capacity) == 0  # applied already: nothing over the caps
        assert a.counters()["errors"] == a2.counters()["errors"] == b.counters()["errors"] == 0
        # group A's user on group B's keys: every call refused (counted errors, never a value)
        assert not a_on_b.heartbeat()
        a_on_b.joined = True  # as if it had joined: the reads and writes themselves are refused
        assert a_on_b.get(k, 500) is None and a_on_b.offer(k, blob(3, 500)) == "failed"
        assert a_on_b.counters()["errors"] >= 3
        c = RedisCluster(host="127.0.0.1", port=redis_cluster.masters[0].port,
                         username=f"shadefs-{namespace_key('src-a')}", password="pw-a")
        try:
            vb = b._tags[b.partition(k)] + "v:" + k
            for op in (lambda: c.get(vb), lambda: c.set(vb, b"x"), lambda: c.delete(vb)):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    op()
            va = a._tags[a.partition(k)] + "v:" + k
            assert c.get(va) is not None  # its own group's keys: allowed
        finally:
            c.close()
        assert b.get(k, 500) == blob(2, 500)
        assert a.evict(k)
    finally:
        for t in (a, a2, b, a_on_b):
            t.close()


def test_residency_is_pipelined_in_chunks(redis_cluster):
    t = tier(redis_cluster.urls, size=10**6, partitions=8)
    try:
        keys = [SharedTier.key(f"f{i}", 10) for i in range(300)]
        for i in range(0, 300, 3):
            assert t.offer(keys[i], blob(i, 10)) == "admitted"
        assert t.contains_many(keys, chunk=64) == [i % 3 == 0 for i in range(300)]
        got = t.get_many(keys[:30], [10] * 30)
        assert got == [blob(i, 10) if i % 3 == 0 else None for i in range(30)]
    finally:
        t.close()


def test_files_over_max_file_bypass_the_tier(redis_server):
    t = tier(redis_server.url, max_file=1000)
    try:
        k = SharedTier.key("big", 1001)
        assert t.offer(k, blob(1, 1001)) == "refused" and not t.offer_async(k, blob(1, 1001))
        assert t.get(k, 1001) is None and t.get_many([k], [1001]) == [None]
        assert t.counters()["gets"] == 0  # never asked Redis
        small = SharedTier.key("small", 1000)
        assert t.offer(small, blob(2, 1000)) == "admitted" and t.get(small, 1000) == blob(2, 1000)
    finally:
        t.close()


def test_a_full_redis_refuses_writes_and_still_serves(tmp_path):
    from redisutil import RedisServer

    server = RedisServer(tmp_path, extra=["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"])
    t = tier(server.url, size=10**9)
    try:
        first = SharedTier.key("f0", 100_000)
        assert t.offer(first, blob(0, 100_000)) == "admitted"
        outcomes = [t.offer(SharedTier.key(f"f{i}", 100_000), blob(i, 100_000)) for i in range(1, 60)]
        assert "failed" in outcomes  # OOM: Redis refuses the write; counted, never raised
        assert t.counters()["offers"]["failed"] >= 1 and t.counters()["errors"] >= 1
        deadline = time.monotonic() + 10  # past a partition's back-off (1 s), if the refusals opened one
        while (got := t.get(first, 100_000)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got == blob(0, 100_000)  # what is stored is still served, exact
        check_exact(t)
    finally:
        t.close()
        server.stop()


def test_the_plan_prefetcher_reads_from_the_group_and_offers_what_no_tier_keeps(tmp_path, redis_server):
    """Two caches of one source on one real Redis (no FUSE): node A, with no node tier, prefetches its
    plan from the backend and, at each open, offers the bytes to the group (no tier of A keeps them);
    node B's prefetcher then reads every file from the group, none from the backend."""
    import numpy as np

    from shadefs.backends.posix import PosixBackend
    from shadefs.cache.core import TieredCache
    from shadefs.cache.index import TierIndex
    from shadefs.cache.tiers import MemoryTier
    from shadefs.namespace import Namespace
    from shadefs.plan.plans import PlanRegistry
    from shadefs.plan.policy import PlanPolicy
    from shadefs.plan.prefetch import Prefetcher
    from shadefs.policies import Importance, get_policy

    src = tmp_path / "src"
    src.mkdir()
    spec = {f"f{i}.bin": blob(i, 1000 + 37 * i) for i in range(8)}
    for rel, data in spec.items():
        (src / rel).write_bytes(data)

    class Counting(PosixBackend):
        def __init__(self, url):
            super().__init__(url)
            self.reads = []

        def read(self, path, size):
            self.reads.append(path)
            return super().read(path, size)

    def node():
        backend = Counting(str(src))
        ns = Namespace(backend.walk())
        imp = Importance(ns.num_files)
        plans = PlanRegistry(ns.num_files)
        index = TierIndex("ram", 0, PlanPolicy(get_policy("static")(0, imp), plans))
        shared = tier(redis_server.url, source=str(src), size=10**6)
        cache = TieredCache(ns, backend, (index, MemoryTier()), None, imp, shared=shared)
        plans.lock = cache.lock
        pf = Prefetcher(cache, plans, 10**6, concurrency=0)
        cache.attach_plans(plans, pf)
        h, _ = plans.register(None, np.arange(ns.num_files, dtype=np.int64))
        plans.announce(h, 0, 0, [ns.num_files], np.arange(ns.num_files, dtype=np.uint32)[::-1].copy())
        return cache, ns, pf, backend, shared

    def epoch(cache, ns, pf):
        while pf.step():
            pass
        for f in reversed(range(ns.num_files)):
            h = cache.open(f)
            try:
                assert h.read(0, h.size) == spec[ns.path(f)] and h.outcome == "prefetch"
            finally:
                h.release()

    a, ns, pfa, backend_a, shared_a = node()
    b = None
    try:
        epoch(a, ns, pfa)
        keys = [a.shared_key(f) for f in range(ns.num_files)]
        deadline = time.monotonic() + 20
        while not all(shared_a.contains_many(keys)) and time.monotonic() < deadline:
            time.sleep(0.05)  # offers go through a background queue
        assert shared_a.contains_many(keys) == [True] * ns.num_files
        assert len(backend_a.reads) == ns.num_files and pfa.shared_bytes == 0
        b, ns_b, pfb, backend_b, shared_b = node()
        epoch(b, ns_b, pfb)
        total = sum(len(v) for v in spec.values())
        s = b.stats()
        assert backend_b.reads == [] and s["backend_bytes"] == 0
        assert s["prefetch"]["ready"] == ns.num_files == s["opens"]
        assert s["prefetch"]["shared_bytes"] == s["prefetch"]["fetched_bytes"] == total
    finally:
        shared_a.close()
        if b is not None:
            shared_b.close()


def test_a_budget_shrink_evicts_in_batches_of_cap_batch_values(redis_server):
    # one partition holding 2,500 values of 64 B; its budget halves: 938 values must go, at most 100 per
    # script call (Redis runs a script alone: no single call may evict a whole shrink's worth)
    a = tier(redis_server.url, size=200_000, partitions=1, heartbeat_s=60, member_id="a")
    try:
        for i in range(2500):
            assert a.offer(SharedTier.key(f"s/{i}", 64), blob(i, 64)) == "admitted"
        a.cap_batch = 100
        calls = a.counters()["cap_calls"]
        assert a.apply_caps(a.gen + 1, 100_000) == 938  # ceil((160,000 - 100,000) / 64)
        c = a.counters()
        assert c["cap_calls"] - calls == 10 and c["cap_evictions"] == 938
        a.refresh()
        assert check_exact(a)["used"] == (2500 - 938) * 64
        assert a.apply_caps(a.gen, 100_000) == 0  # nothing over: one call
        assert a.counters()["cap_calls"] - calls == 11
    finally:
        a.close()


def test_the_offer_queue_holds_at_most_its_bytes(redis_server):
    t = SharedTier(parse_urls(redis_server.url), "s3://bucket/ds", 100_000, secret=SECRET, partitions=4,
                   timeout_s=0.5, heartbeat_s=60)
    try:
        t.offer_queue_bytes = 10_000
        assert t.heartbeat() and t.joined  # joined, no offer thread yet: the queue only fills
        got = [t.offer_async(SharedTier.key(f"q/{i}", 3000), blob(i, 3000)) for i in range(5)]
        assert got == [True, True, True, False, False]
        assert t.offer_queue_memory() == {"bound_bytes": 10_000, "used_bytes": 9000}
        assert t.counters()["offers"]["dropped"] == 2
        t.start()  # the offer thread drains the queue
        assert t.drain(10)
        assert t.offer_queue_memory()["used_bytes"] == 0 and t.counters()["offers"]["admitted"] == 3
    finally:
        t.close()
