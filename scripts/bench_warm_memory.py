#!/usr/bin/env python3
"""What one long ``warm`` request costs the daemon: its peak resident size (VmHWM) before and after one
request of N paths, and the request's wall time.

The request names one 1000-byte file N times (the namespace stays tiny, so the growth is the request's
own: the decoded paths and ids, and whatever the daemon holds per file while it works through them).
Run as root with /dev/fuse; prints one table row per N.

    bench_warm_memory.py [--paths 100000 1000000]
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from shadefs import registry
from shadefs.control import protocol as P
from shadefs.testing.mounts import Mount


def vm_hwm(pid: int) -> int:
    """Peak resident bytes of ``pid`` (/proc/PID/status VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def one(n: int, work: str) -> tuple:
    """(VmHWM before, after, seconds, reply counts) of one warm request of ``n`` paths on a fresh mount."""
    import zmq

    src, mnt = os.path.join(work, f"src-{n}"), os.path.join(work, f"mnt-{n}")
    os.makedirs(os.path.join(src, "c"))
    os.makedirs(mnt)
    with open(os.path.join(src, "c", "a.bin"), "wb") as f:
        f.write(b"x" * 1000)
    m = Mount(src, mnt, ["--ram-cache", "1MiB"], os.path.join(work, f"{n}.log")).start()
    try:
        before = vm_hwm(m.pid)
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(registry.lookup(m.path).endpoint)
            rid = P.new_request_id()
            t0 = time.monotonic()
            sock.send_multipart(P.encode_warm_request(rid, ["c/a.bin"] * n))
            if not sock.poll(900_000):
                raise TimeoutError("no warm reply within 900 s")
            reply = P.decode_reply(sock.recv_multipart())
            seconds = time.monotonic() - t0
        finally:
            sock.close()
            ctx.term()
        return before, vm_hwm(m.pid), seconds, getattr(reply, "result", reply)
    finally:
        m.umount()


def main() -> int:
    p = argparse.ArgumentParser(description="Daemon peak RSS for one long warm request.")
    p.add_argument("--paths", type=int, nargs="+", default=[100_000, 1_000_000], metavar="N")
    args = p.parse_args()
    print(f"load {open('/proc/loadavg').read().split()[:3]}")
    print("| paths in the request | VmHWM before | after | growth | seconds | reply |")
    print("|---|---|---|---|---|---|")
    work = tempfile.mkdtemp(prefix="bench-warm-memory-")
    try:
        for n in args.paths:
            before, after, seconds, result = one(n, work)
            print(f"| {n:,} | {before / 2**20:.0f} MiB | {after / 2**20:.0f} MiB | +{(after - before) / 2**20:.0f} MiB "
                  f"| {seconds:.1f} | {result} |", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
