"""Two mounts of one source on one Redis act as two nodes of a group: real FUSE mounts, real redis-server
processes (standalone and a 3-master cluster)."""
from __future__ import annotations

import os

import pytest

from mountutil import metrics_port, read, scrape, wait_for
from redisutil import require_redis, redis_cluster, redis_server, shared_secret  # noqa: F401  (fixtures)
require_redis()
from shadefs.cache.shared import SharedTier, parse_urls  # noqa: E402

pytestmark = pytest.mark.timeout(60)

FAST = ("--shared-tier-heartbeat", "0.1", "--shared-tier-partitions", "4", "--shared-tier-timeout", "0.5")


def invariant(s: dict) -> None:
    assert s["opens"] == sum(s["hits"].values()) + s["misses"], s


def read_all(m, spec) -> None:
    for rel, data in sorted(spec.items()):
        assert read(f"{m.path}/{rel}") == data, rel


def test_what_node_a_read_is_a_shared_hit_on_node_b(small_tree, mount, redis_server, shared_secret):
    src, spec = small_tree
    a = mount(src, "--shared-tier", redis_server.url, "--shared-tier-size", "100KB", *FAST, *shared_secret, name="a")
    b = mount(src, "--shared-tier", redis_server.url, "--shared-tier-size", "100KB", "--metrics-port", "0",
              *FAST, *shared_secret, name="b")
    read_all(a, spec)
    total = sum(map(len, spec.values()))
    # A's offers go to Redis off the request path: wait until the group holds all ten
    wait_for(lambda: a.stats()["tiers"]["shared"]["files"] == 10, timeout=10)
    sa = a.stats()
    assert sa["hits"] == {"ram": 0, "disk": 0, "shared": 0} and sa["misses"] == 10
    t = sa["tiers"]["shared"]
    assert t["group_used_bytes"] == total and t["group_capacity_bytes"] == 200_000 and t["members"] == 2
    assert t["capacity_bytes"] == 100_000 and t["used_bytes"] == total // 2
    from shadefs.control.client import ControlClient, find_endpoint

    c = ControlClient(find_endpoint(b.path))
    try:  # residency (what the sampler asks) includes the group's tier: one pipelined query
        assert c.resident(sorted(spec)).tolist() == [True] * 10
    finally:
        c.close()
    read_all(b, spec)  # node B: every byte exact, none from the backend
    sb = b.stats()
    assert sb["hits"] == {"ram": 0, "disk": 0, "shared": 10} and sb["misses"] == 0
    assert sb["backend_bytes"] == 0 and sb["shared_errors"] == 0
    # the offer queue is part of the daemon's bounded memory; A's ten offers all ran: nothing queued
    assert sa["memory"]["offer_queue"] == {"bound_bytes": 64 << 20, "used_bytes": 0}
    assert sa["memory"]["bound_bytes"] == sum(sa["memory"][p]["bound_bytes"] for p in (
        "ram_tier", "fill_buffers", "loose_buffers", "prefetch_window", "offer_queue"))
    invariant(sa)
    invariant(sb)
    m = scrape(metrics_port(b))
    assert m[("shadefs_hits_total", (("tier", "shared"),))] == 10
    assert m[("shadefs_shared_errors_total", ())] == 0
    assert m[("shadefs_shared_group_used_bytes", ())] == total
    assert "redis://127.0.0.1" in b.log() and "shared tier" in b.log()


def test_shared_hit_is_promoted_by_node_policy(small_tree, mount, redis_server, shared_secret):
    src, spec = small_tree
    a = mount(src, "--shared-tier", redis_server.url, "--shared-tier-size", "100KB", *FAST, *shared_secret, name="a")
    b = mount(src, "--ram-cache", "100KB", "--shared-tier", redis_server.url, "--shared-tier-size", "100KB",
              *FAST, *shared_secret, name="b")
    read_all(a, spec)
    wait_for(lambda: a.stats()["tiers"]["shared"]["files"] == 10, timeout=10)
    read_all(b, spec)
    read_all(b, spec)  # the second pass: B's RAM tier admitted the shared hits
    sb = b.stats()
    assert sb["hits"] == {"ram": 10, "disk": 0, "shared": 10} and sb["misses"] == 0
    invariant(sb)


def test_dead_redis_costs_hits_never_an_error(small_tree, mount, redis_server, shared_secret):
    src, spec = small_tree
    a = mount(src, "--shared-tier", redis_server.url, "--shared-tier-size", "1MB", *FAST, *shared_secret, name="a")
    read_all(a, spec)
    wait_for(lambda: a.stats()["tiers"]["shared"]["files"] == 10, timeout=10)
    redis_server.kill()
    b = mount(src, "--shared-tier", redis_server.url, "--shared-tier-size", "1MB", *FAST, *shared_secret, name="b")
    read_all(b, spec)  # Redis is gone: every file from the backend, exact
    read_all(a, spec)
    sb, sa = b.stats(), a.stats()
    assert sb["hits"]["shared"] == 0 and sb["misses"] == 10
    assert sa["hits"]["shared"] == 0 and sa["misses"] == 20
    assert sa["shared_errors"] >= 1
    invariant(sa)
    invariant(sb)
    assert "not reachable yet" in b.log()


def test_member_leaving_shrinks_the_group_budget(small_tree, mount, redis_cluster, shared_secret):
    src, spec = small_tree
    args = ("--shared-tier", redis_cluster.urls, "--shared-tier-size", "30000", *FAST, *shared_secret)
    a = mount(src, *args, name="a")
    b = mount(src, *args, name="b")
    read_all(a, spec)
    total = sum(map(len, spec.values()))  # 55000 bytes: fits 60000 (4 partitions of 15000)
    probe = SharedTier(parse_urls(redis_cluster.urls), str(src), 0, partitions=4, timeout_s=0.5)
    try:
        wait_for(lambda: probe.refresh() and probe.refresh()["used_bytes"] > 0 and a.stats()["tiers"]["shared"]
                 ["group_used_bytes"] == sum(p["used"] for p in probe.partition_figures()), timeout=10)
        before = probe.partition_figures()
        assert sum(p["cap"] for p in before) == 60_000
        stored = sum(p["used"] for p in before)
        assert 0 < stored <= total
        b.umount()  # B leaves the group: the budget is A's 30000 bytes now, the excess evicted
        wait_for(lambda: sum(p["cap"] for p in probe.partition_figures()) == 30_000, timeout=10)
        after = probe.partition_figures()
        for p in after:
            assert p["used"] == p["sizes_sum"] == p["values_sum"] <= p["cap"], p
        assert sum(p["used"] for p in after) <= 30_000
        wait_for(lambda: a.stats()["tiers"]["shared"]["group_capacity_bytes"] == 30_000
                 and a.stats()["tiers"]["shared"]["members"] == 1, timeout=10)
        read_all(a, spec)  # whatever is left is still exact
        invariant(a.stats())
    finally:
        probe.close(leave=False)


def test_password_is_used_and_never_logged(small_tree, mount, tmp_path, shared_secret):
    from redisutil import RedisServer, require_redis

    require_redis()
    secret = "s3cr3t-pw-" + "x" * 8
    server = RedisServer(tmp_path, password=secret)
    try:
        src, spec = small_tree
        url = f"redis://default:{secret}@127.0.0.1:{server.port}"
        a = mount(src, "--shared-tier", url, "--shared-tier-size", "1MB", *FAST, *shared_secret, name="a")
        pw = tmp_path / "pw"
        pw.write_text(secret + "\n")
        b = mount(src, "--shared-tier", server.url, "--shared-tier-password-file", pw, "--shared-tier-size", "1MB",
                  *FAST, *shared_secret, name="b")
        read_all(a, spec)
        wait_for(lambda: a.stats()["tiers"]["shared"]["files"] == 10, timeout=10)
        read_all(b, spec)
        sa, sb = a.stats(), b.stats()
        assert sb["hits"]["shared"] == 10 and sa["shared_errors"] == sb["shared_errors"] == 0
        assert sa["tiers"]["shared"]["url"] == f"redis://default:***@127.0.0.1:{server.port}"
        for m in (a, b):
            assert secret not in m.log() and secret not in str(m.full_stats())
        assert f"redis://default:***@127.0.0.1:{server.port}" in a.log()
    finally:
        server.stop()


def test_bad_shared_tier_flags_are_one_line_errors(small_tree, tmp_path, cli):
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    from redisutil import secret_file

    sec = ("--shared-tier-secret", secret_file(tmp_path))
    loose = secret_file(tmp_path, "loose.secret")
    os.chmod(loose, 0o640)
    short = secret_file(tmp_path, "short.secret", b"too short")
    for args, msg in ((["--shared-tier", "http://h:1", *sec], "redis:// or rediss://"),
                      (["--shared-tier-size", "1GiB"], "--shared-tier-size needs --shared-tier"),
                      (["--shared-tier", "redis://h:1", "--shared-tier-timeout", "0", *sec], "--shared-tier-timeout"),
                      (["--shared-tier", "redis://h:1", "--shared-tier-size", "lots", *sec], "--shared-tier-size"),
                      (["--shared-tier", "redis://h:1", "--shared-tier-password-file", tmp_path / "nope", *sec],
                       "--shared-tier-password-file"),
                      # values are authenticated with a group secret, or the user says they are not
                      (["--shared-tier", "redis://h:1"], "--shared-tier needs --shared-tier-secret FILE"),
                      (["--shared-tier", "redis://h:1", "--shared-tier-secret", loose], "mode 0640"),
                      (["--shared-tier", "redis://h:1", "--shared-tier-secret", short], "at least 16"),
                      (["--shared-tier", "redis://h:1", "--shared-tier-secret", tmp_path / "nope"],
                       "--shared-tier-secret"),
                      (["--shared-tier", "redis://h:1", *sec, "--shared-tier-insecure"], "give one of them"),
                      (["--shared-tier-secret", loose], "--shared-tier-secret needs --shared-tier"),
                      (["--shared-tier-insecure"], "--shared-tier-insecure needs --shared-tier")):
        r = cli("mount", src, mp, *args, check=False)
        assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_hung_redis_never_holds_an_open_past_the_deadline(small_tree, mount, redis_server, shared_secret):
    src, spec = small_tree
    args = ("--shared-tier", redis_server.url, "--shared-tier-size", "1MB", "--shared-tier-heartbeat", "0.1",
            "--shared-tier-partitions", "4", "--shared-tier-timeout", "0.05", *shared_secret)
    a = mount(src, *args, name="a")
    read_all(a, spec)
    wait_for(lambda: a.stats()["tiers"]["shared"]["files"] == 10, timeout=10)
    redis_server.pause()  # SIGSTOP: connections hang (the client's socket timeout is 1 s)
    try:
        b = mount(src, *args, name="b")  # joins while Redis hangs: serves without it
        for m in (a, b):
            for rel, data in sorted(spec.items()):
                assert read(f"{m.path}/{rel}") == data
        sa, sb = a.stats(), b.stats()
        # every call A made while Redis hung (its opens' lookups at 50 ms, its heartbeats at 0.4 s) ended
        # at its deadline, none at the socket's 1 s timeout: its failed calls are exactly its calls past
        # their deadline. (B's join waits up to 1 s, as long as the socket: B's errors may be either kind.)
        assert sa["shared_errors"] == sa["shared_deadlines"] >= 1
        assert sa["hits"]["shared"] == 0 and sa["misses"] == 20
        assert sb["hits"]["shared"] == 0 and sb["misses"] == 10
        invariant(sa)
        invariant(sb)
    finally:
        redis_server.resume()


def test_the_prefetcher_reads_what_the_group_holds_from_the_group(small_tree, mount, redis_server, shared_secret):
    """Node B announces a plan (the control protocol's register + plan, what PlanSampler sends): its
    prefetcher reads A's files from the shared tier, not the backend."""
    from shadefs.control.client import ControlClient, find_endpoint

    src, spec = small_tree
    args = ("--shared-tier", redis_server.url, "--shared-tier-size", "1MB", *FAST, *shared_secret)
    a = mount(src, *args, name="a")
    read_all(a, spec)
    wait_for(lambda: a.stats()["tiers"]["shared"]["files"] == 10, timeout=10)
    b = mount(src, *args, "--no-kernel-cache", name="b")
    paths = sorted(spec)
    order = [3, 7, 1, 9, 0, 5, 2, 8, 6, 4]
    c = ControlClient(find_endpoint(b.path))
    try:
        handle, n = c.register(paths)
        assert n == 10 and c.send_plan(handle, 0, 0, [10], order)
        wait_for(lambda: b.full_stats()["plans_received"] == 1)
        wait_for(lambda: b.full_stats()["prefetch"]["window_used_bytes"] > 0, timeout=10)
    finally:
        c.close()
    for i in order:
        assert read(f"{b.path}/{paths[i]}") == spec[paths[i]]
    s = b.full_stats()
    p = s["prefetch"]
    assert s["opens"] == s["hits"]["ram"] + s["hits"]["disk"] + s["hits"]["shared"] + p["ready"] + p["late"] \
        + s["misses"] == 10
    assert p["ready"] + p["late"] >= 1
    assert s["backend_bytes"] == 0  # every byte from the group: prefetched from it, or a shared hit


def test_a_value_forged_in_redis_is_never_served(small_tree, mount, redis_server, shared_secret):
    """A plain Redis client, with write access but not the group's secret, stores values under the keys the
    mount computes from public facts (path, size, mtime): in the old format with a valid checksum, in the
    current format with a made-up tag. The mount serves the source's bytes, counts each value, deletes it,
    logs each key once, and the group then holds authentic values that a second member serves."""
    import redis

    from shadefs.cache import shared as shared_mod

    src, spec = small_tree
    evil = {rel: b"E" * len(data) for rel, data in spec.items()}
    probe = SharedTier(parse_urls(redis_server.url), str(src), 0, partitions=4)  # never started: key names
    r = redis.Redis.from_url(redis_server.url)
    old, made_up = sorted(spec)[:2]
    for rel in (old, made_up):
        st = os.stat(src / rel)
        k = probe.key(rel, st.st_size, st.st_mtime_ns)
        vk = probe._tags[probe.partition(k)] + "v:" + k
        if rel == old:  # the old format: b"SHD1" + xxh3_64 (big-endian) + data
            import struct

            import xxhash

            value = b"SHD1" + struct.pack(">Q", xxhash.xxh3_64_intdigest(evil[rel])) + evil[rel]
        else:
            value = shared_mod.MAGIC + os.urandom(32) + evil[rel]
        r.set(vk, value)
    a = mount(src, "--shared-tier", redis_server.url, "--shared-tier-size", "1MB", "--metrics-port", "0",
              "--no-kernel-cache", *FAST, *shared_secret, name="a")
    read_all(a, spec)  # the source's bytes
    sa = a.stats()
    assert sa["hits"]["shared"] == 0 and sa["misses"] == 10
    m = scrape(metrics_port(a))
    assert m[("shadefs_shared_auth_failed_total", ())] == 2
    assert m[("shadefs_shared_corrupt_total", ())] == 0
    assert a.log().count("failed authentication") == 2
    wait_for(lambda: a.stats()["tiers"]["shared"]["files"] == 10, timeout=10)  # replaced by authentic values
    b = mount(src, "--shared-tier", redis_server.url, "--shared-tier-size", "1MB", *FAST, *shared_secret,
              name="b")
    read_all(b, spec)
    sb = b.stats()
    assert sb["hits"]["shared"] == 10 and sb["backend_bytes"] == 0
    invariant(sa)
    invariant(sb)


def test_insecure_shares_without_a_secret_and_says_so(small_tree, mount, redis_server):
    src, spec = small_tree
    args = ("--shared-tier", redis_server.url, "--shared-tier-size", "1MB", "--shared-tier-insecure", *FAST)
    a = mount(src, *args, name="a")
    read_all(a, spec)
    wait_for(lambda: a.stats()["tiers"]["shared"]["files"] == 10, timeout=10)
    b = mount(src, *args, name="b")
    read_all(b, spec)
    assert b.stats()["hits"]["shared"] == 10
    for m in (a, b):
        assert "without a group secret (--shared-tier-insecure)" in m.log()
        assert "values NOT authenticated" in m.log()
