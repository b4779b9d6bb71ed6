"""``shadefs stats`` and ``shadefs endpoint``: read a running mount's figures over its control endpoint
and print them (a table, a live view with ``--watch``, or JSON)."""
from __future__ import annotations

import json
import signal
import sys
import time

from ..cmdutil import UserError, mount_client as _client
from ..config import format_bytes


STATS_KEYS = ("policy", "uptime_s", "opens", "hits", "misses", "hit_ratio", "byte_hit_ratio",
              "backend_bytes", "source_passthrough_bytes", "corrupt_entries", "tiers", "shared_errors", "shared_deadlines", "namespace", "prefetch",
              "descriptors", "memory")  # shared_*: only with --shared-tier


def tier_budget(name: str, t: dict) -> str:
    """One line saying what a tier's budget holds, from its stats entry ``t`` (docs/metrics.md), e.g.
    ``disk 9.1 MiB: 6.4 MiB metadata, 192.0 KiB segment slack, 2.5 MiB entries (2.4 MiB used), full``.
    ``full``: less than 1 % of the entries' budget is left (a miss is then admitted only by evicting);
    otherwise how much is free."""
    cap = t["capacity_bytes"]
    entries = t.get("entry_bytes", cap)
    parts = []
    if "metadata_bytes" in t:
        parts.append(f"{format_bytes(t['metadata_bytes'])} metadata")
        if t.get("slack_bytes"):
            parts.append(f"{format_bytes(t['slack_bytes'])} segment slack")
    parts.append(f"{format_bytes(entries)} entries ({format_bytes(t['used_bytes'])} used)")
    left = entries - t["used_bytes"] - t.get("dying_bytes", 0)
    parts.append("full" if left < max(1, entries // 100) else f"{format_bytes(left)} free")
    return f"{name} {format_bytes(cap)}: {', '.join(parts)}"


def format_stats(s: dict) -> str:
    """A short human table of the stats JSON."""
    hits = sum(s["hits"].values())
    per_tier = ", ".join(f"{k} {v}" for k, v in s["hits"].items())
    p = s.get("prefetch") or {}
    prefetched = p.get("ready", 0) + p.get("late", 0)
    lines = [
        f"policy          {s['policy']}      uptime {s['uptime_s']:.0f} s",
        f"opens           {s['opens']}  (= hits + prefetched + misses: {hits} + {prefetched} + {s['misses']})",
        f"hits            {hits}  ({per_tier})",
        f"misses          {s['misses']}",
        f"hit ratio       {s['hit_ratio'] * 100:.2f} %   (byte hit ratio {s['byte_hit_ratio'] * 100:.2f} %)",
        f"backend read    {format_bytes(s['backend_bytes'])}  (by the daemon; by passthrough to the source: "
        f"{format_bytes(s.get('source_passthrough_bytes', 0))} of files opened)",
        f"corrupt entries {s.get('corrupt_entries', 0)}  (dropped and read from the backend)",
        "tier   used / capacity            files   evictions",
    ]
    for name in ("ram", "disk", "shared"):
        if name not in s["tiers"]:
            continue
        t = s["tiers"][name]
        lines.append(f"{name:<6} {format_bytes(t['used_bytes']):>10} / {format_bytes(t['capacity_bytes']):<10} "
                     f"{t['files']:>8} {t['evictions']:>11}")
    for name in ("ram", "disk"):  # what each budget holds
        t = s["tiers"].get(name)
        if t and t.get("capacity_bytes"):
            lines.append(tier_budget(name, t))
    if p:
        lines.append(f"prefetch        {p['ready']} ready, {p['late']} late ({p.get('late_wait_s', 0.0):.3f} s "
                     f"waited), {format_bytes(p['fetched_bytes'])} fetched, {format_bytes(p['wasted_bytes'])} wasted")
        lines.append(f"plans           {p['plans_active']} active, {p.get('plans_announced', 0)} announced, "
                     f"{p.get('plans_withdrawn', 0)} withdrawn, {p['plans_retired']} retired")
    if "scores_received" in s:
        rejected = sum(s.get("scores_rejected", {}).values())
        lines.append(f"score messages  {s['scores_received']} received, {rejected} rejected")
    d = s.get("descriptors")
    if d:
        lines.append(f"descriptors     {d['open']} open of {d['limit']} (reserve {d['reserve']}), {d['held']} held "
                     f"by open files, {d['refused']} opens served without one, {d['failed']} failed")
    return "\n".join(lines)


def _interval_line(prev: dict, cur: dict, seconds: float) -> str:
    """What happened between two stats samples ``seconds`` apart: opens per second, the hit ratio of
    those opens, backend bytes per second (the live view's last line)."""
    opens = cur["opens"] - prev["opens"]
    hits = sum(cur["hits"].values()) - sum(prev["hits"].values())
    ratio = f"{hits / opens * 100:.2f} %" if opens > 0 else "-"
    rate = format_bytes(max(0, cur["backend_bytes"] - prev["backend_bytes"]) / seconds)
    return (f"last {seconds:.1f} s     {opens / seconds:.1f} opens/s, hit ratio {ratio}, backend read "
            f"{rate}/s")


def cmd_stats(args) -> int:
    """Print the stats once, or with ``--watch SECONDS`` every SECONDS until Ctrl-C (or ``--count N``
    samples): a table with the last interval's rates (redrawn in place on a terminal), or with ``--json``
    one JSON object a line."""
    if args.count is not None and args.watch is None:
        raise UserError("--count needs --watch")
    client = _client(args.mountpoint, args.timeout)
    live = args.watch is not None and not args.json and sys.stdout.isatty()
    prev, n = None, 0
    try:
        while True:
            t = time.monotonic()
            try:
                s = client.stats()
            except TimeoutError:
                raise UserError(f"the daemon of {args.mountpoint} did not answer within {args.timeout:g} s "
                                f"(if it hangs: shadefs umount --force)") from None
            n += 1
            if args.json:
                doc = {k: s[k] for k in STATS_KEYS if k in s}
                print(json.dumps(doc) if args.watch is not None else json.dumps(doc, indent=2), flush=True)
            else:
                text = format_stats(s)
                if args.watch is not None:
                    last = _interval_line(prev[1], s, t - prev[0]) if prev else "last -        (first sample)"
                    head = f"{args.mountpoint}  {time.strftime('%H:%M:%S')}  every {args.watch:g} s (Ctrl-C ends)"
                    text = ("\x1b[H\x1b[2J" if live else ("" if n == 1 else "\n")) + f"{head}\n{text}\n{last}"
                print(text, flush=True)
            if args.watch is None or (args.count is not None and n >= args.count):
                return 0
            prev = (t, s)
            time.sleep(max(0.0, t + args.watch - time.monotonic()))
    except KeyboardInterrupt:  # the way a watch ends
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return 0
    finally:
        client.close()


def cmd_endpoint(args) -> int:
    client = _client(args.mountpoint)
    print(client.endpoint)
    client.close()
    return 0
