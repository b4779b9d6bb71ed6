"""How long a shared-tier budget shrink blocks Redis: the longest single SET_CAP script call.

Regime: **counts** against a real redis-server on loopback. Limit: Redis runs one script at a time, so
the longest script call is how long every other client waits.

One partition of a real ``redis-server`` (loopback) holds ``--values`` values (100 B each, recorded as
64 B, as the admission script writes them); the group budget then drops to 0, so every value must go. Redis
runs a script alone: while it runs, every other client of that Redis (every member's GETs) waits. Each
round compares, side by side, evicting in one script call (``cap_batch`` unbounded, the behaviour before
batching) with batches of ``--batch`` values per call. The duration of each call is read from Redis'
SLOWLOG (microseconds, measured by Redis itself).

    python -m shadefs.bench shared_cap [--values 150000] [--batch 1000] [--rounds 2]
"""
from __future__ import annotations

import os
import tempfile
import time

from shadefs.testing.redis import RedisServer

SECRET = b"group-secret-0123456789"


def one(values: int, batch: int) -> dict:
    import redis

    from shadefs.cache.shared import SharedTier, parse_urls

    with tempfile.TemporaryDirectory(prefix="shadefs-bench-cap-") as d:
        srv = RedisServer(d)
        try:
            t = SharedTier(parse_urls(srv.url), "s3://bucket/ds", values * 128, secret=SECRET, partitions=1,
                           heartbeat_s=600, timeout_s=5.0)
            t.heartbeat()
            c = redis.Redis(port=srv.port)
            z, s, m = t._pkeys(0)
            prefix = t._tags[0] + "v:"
            for lo in range(0, values, 10000):  # the keys, sizes and counters the admission script writes
                p = c.pipeline(transaction=False)
                for i in range(lo, min(values, lo + 10000)):
                    p.set(prefix + f"k{i}", b"x" * 100)
                    p.zadd(z, {f"k{i}": float(i)})
                    p.hset(s, f"k{i}", 64)
                p.execute()
            c.hset(m, mapping={"used": values * 64, "files": values})
            c.config_set("slowlog-log-slower-than", 0)
            c.config_set("slowlog-max-len", 1_000_000)
            c.slowlog_reset()
            t.cap_batch = batch
            calls = t.counters()["cap_calls"]
            t0 = time.monotonic()
            evicted = t.apply_caps(t.gen + 1, 0)
            wall = time.monotonic() - t0
            durations = [e["duration"] for e in c.slowlog_get(1_000_000) if e["command"].startswith(b"EVAL")]
            out = {"evicted": evicted, "calls": t.counters()["cap_calls"] - calls,
                   "longest_ms": max(durations) / 1e3, "wall_s": wall}
            t.close(leave=False)
            return out
        finally:
            srv.stop()


#: the runner's common options this benchmark honours
COMMON = ('rounds',)


def add_arguments(ap) -> None:
    ap.add_argument("--values", type=int, default=150_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.set_defaults(rounds=2)


def run(args, bench):
    rows = []
    for r, (label, batch) in bench.interleaved((("one call", 1 << 62), (f"batches of {args.batch}", args.batch))):
        x = one(args.values, batch)
        rows.append(f"| {r + 1} | {label} | {x['evicted']} | {x['calls']} | {x['longest_ms']:.1f} | "
                    f"{x['wall_s']:.2f} |")
        print(rows[-1], flush=True)
    load = os.getloadavg()
    print("| round | SET_CAP | values evicted | script calls | longest call (ms) | all (s) |")
    print("|---|---|--:|--:|--:|--:|")
    print("\n".join(rows))
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; python -m shadefs.bench shared_cap "
          f"--values {args.values} --batch {args.batch} --rounds {args.rounds}")
