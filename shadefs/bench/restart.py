"""Restart-to-serving time of a mount whose NVMe tier already holds N entries.

Regime: **counts** (wall time until the mount serves; metadata only). Limit: the source scan alone
(a mount cannot serve before its namespace is known).

For each N it synthesises, directly on local disk and without FUSE, a source tree of N tiny files
(1000 per directory) and the matching disk-tier namespace a previous daemon would have left (entries
named sha256(path), stamped with the source mtime). Then it times ``shadefs mount`` until the mount is
ready (the CLI returns when the daemon serves), with the daemon's own split (source scan, disk tier
reload, listing, path hashes, entries stat'ed) read from its log, and checks that the first opens are
disk hits:

- after a crash: no manifest (``index.bin``) and no cached path digests, so every entry is stat'ed and
  every snapshot path hashed;
- after a clean unmount: the manifest written at unmount and the digests cached (the usual restart);
- the same with the pages of the tier's and the source's files dropped (``POSIX_FADV_DONTNEED`` per file,
  :func:`shadefs.testing.regime.drop_tree_pages`; dentries stay cached): the nearest to a reboot that
  leaves the rest of a shared machine alone;
- the reload alone, in this process (:func:`shadefs.cache.persist.reload_disk_tier`, snapshot given).

Prints a table (``--markdown`` for docs/results/restart.md) with the 1-minute load average after each row:
on a shared machine, compare rows of similar load.

    python -m shadefs.bench restart --files 100000 1000000 --workdir /var/tmp/shadefs-bench [--keep]
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import time

from shadefs.backends.posix import PosixBackend
from shadefs.cache import persist
from shadefs.cache.index import TierIndex
from shadefs.cache.tiers import DiskTier
from shadefs.namespace import Namespace
from shadefs.policies import Importance, get_policy
from shadefs.testing import Mount, ShadefsError
from shadefs.testing.docsection import markdown_table
from shadefs.testing.regime import drop_tree_pages

MTIME_NS = 1_700_000_000 * 10**9  # whole seconds: the float snapshot mtime round-trips exactly
PER_DIR = 1000


def synthesize(root: str, n: int, size: int) -> tuple:
    """Create ``root/src`` (n files) and ``root/cache`` (n entries). Returns (src, cache, seconds)."""
    src, cache = os.path.join(root, "src"), os.path.join(root, "cache")
    t0 = time.monotonic()
    ns_dir = os.path.join(cache, hashlib.sha256(src.encode()).hexdigest()[:16])
    for d in (src, ns_dir, os.path.join(ns_dir, "tmp")):
        os.makedirs(d, exist_ok=True)
    for shard in range(256):
        os.makedirs(os.path.join(ns_dir, f"{shard:02x}"), exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    sha = hashlib.sha256
    for i in range(n):
        d, rel = i // PER_DIR, f"d{i // PER_DIR:05d}/f{i:07d}.bin"
        if i % PER_DIR == 0:
            os.makedirs(os.path.join(src, f"d{d:05d}"), exist_ok=True)
        data = i.to_bytes(8, "little") * (size // 8) + b"x" * (size % 8)
        h = sha(rel.encode()).hexdigest()
        for path in (os.path.join(src, rel), os.path.join(ns_dir, h[:2], h)):
            fd = os.open(path, flags, 0o600)
            os.write(fd, data)
            os.utime(fd, ns=(MTIME_NS, MTIME_NS))
            os.close(fd)
        if i and i % 100_000 == 0:
            print(f"  synthesised {i} / {n} ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    return src, cache, time.monotonic() - t0


def timed_mount(src, mnt, cache, log_file) -> dict:
    open(log_file, "w").close()
    mount = Mount(src, mnt, ["--disk-cache", cache, "--disk-cache-size", "100%", "--ram-cache", "0"],
                  log_file=log_file, mount_timeout=900)
    t0 = time.monotonic()
    try:
        mount.start()
    except ShadefsError as e:
        raise SystemExit(str(e))
    wall = time.monotonic() - t0
    try:
        log = open(log_file).read()
        # "scanned SRC: ..." (a fresh scan) or "snapshot of SRC: ..." (the namespace snapshot)
        scan = float(re.search(r"(?:scanned|snapshot of) .* in ([0-9.]+) s", log).group(1))
        m = re.search(r"disk tier: reloaded (\d+) entries .* in ([0-9.]+) s \(listing ([0-9.]+) s, path hashes "
                      r"([0-9.]+) s, (\d+) from the manifest, (\d+) stat'ed\); dropped (\d+) stale, (\d+) corrupt, "
                      r"(\d+) over budget", log)
        out = {"wall": wall, "scan": scan, "reloaded": int(m.group(1)), "reload": float(m.group(2)),
               "entry_scan": float(m.group(3)), "hashes": float(m.group(4)),
               "statted": int(m.group(6)), "dropped": sum(int(m.group(i)) for i in (7, 8, 9))}
        # the first opens of the new epoch are disk hits
        for i in (0, 1, 2):
            rel = f"d{i // PER_DIR:05d}/f{i:07d}.bin"
            with open(os.path.join(mnt, rel), "rb") as f:
                f.read()
        stats = mount.stats()
        out["first_opens_disk_hits"] = stats["hits"]["disk"] == 3 and stats["misses"] == 0
    finally:
        err = mount.umount(exit_timeout=120)  # waits for the daemon to exit (it releases the namespace lock)
    if err:
        raise SystemExit(f"umount failed: {err}")
    return out


def reload_alone(src, cache, repeats: int = 3) -> dict:
    """The reload in this process, ``repeats`` times (each rewrites the manifest it took): the fastest
    run, with its CPU seconds (less sensitive than wall time to other load on a shared machine)."""
    import threading

    t0 = time.monotonic()
    ns = Namespace(PosixBackend(src).walk())
    t_scan = time.monotonic() - t0
    best = None
    for _ in range(repeats):
        store = DiskTier(cache, src)
        try:
            cap = ns.total_bytes
            imp = Importance(ns.num_files)
            index = TierIndex("disk", cap, get_policy("static")(cap, imp))
            digests = persist.PathDigests(ns.paths, os.path.join(store.dir, persist.DIGESTS_FILE))
            c0 = time.process_time()
            rep = persist.reload_disk_tier(store, index, ns, digests)
            cpu = time.process_time() - c0
            persist.Checkpointer(store.dir, ns, imp, index, digests, threading.Lock(), 0).save()
        finally:
            store.close()
        if best is None or rep.seconds < best[0].seconds:
            best = (rep, cpu)
    rep, cpu = best
    return {"scan": t_scan, "reload": rep.seconds, "entry_scan": rep.scan_seconds, "cpu": cpu,
            "hashes": rep.digest_seconds, "reloaded": rep.loaded, "statted": rep.statted}


#: the runner's common options this benchmark honours
COMMON = ()


def add_arguments(ap) -> None:
    ap.add_argument("--files", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--size", type=int, default=64, help="bytes per file (default 64)")
    ap.add_argument("--workdir", default="/var/tmp/shadefs-bench-restart")
    ap.add_argument("--keep", action="store_true",
                    help="keep the synthesised trees, and reuse them when they exist")
    ap.add_argument("--no-drop-pages", action="store_true", help="skip the row with the files' pages dropped")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")


def run(args, bench):

    rows = []
    for n in args.files:
        root = os.path.join(args.workdir, f"n{n}")
        done = os.path.join(root, "synthesised")
        if os.path.exists(done) and args.keep:
            src, cache, t_syn = os.path.join(root, "src"), os.path.join(root, "cache"), 0.0
            print(f"{n} files: reusing {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
            os.makedirs(root)
            print(f"{n} files: synthesising ...", file=sys.stderr)
            src, cache, t_syn = synthesize(root, n, args.size)
            open(done, "w").close()
        for d in os.listdir(cache):  # the first mount: as after a crash, and the path digests not cached
            for name in (persist.DIGESTS_FILE, persist.INDEX_FILE):
                try:
                    os.unlink(os.path.join(cache, d, name))
                except FileNotFoundError:
                    pass
        mnt = os.path.join(root, "mnt")
        os.makedirs(mnt, exist_ok=True)
        log_file = os.path.join(root, "daemon.log")
        plan = [("mount after a crash (no manifest, no digests)", lambda: timed_mount(src, mnt, cache, log_file)),
                ("mount after a clean unmount", lambda: timed_mount(src, mnt, cache, log_file))]
        if not args.no_drop_pages:
            def after_pages_dropped():
                drop_tree_pages(src)
                drop_tree_pages(cache)
                return timed_mount(src, mnt, cache, log_file)

            plan.append(("the same, the files' pages dropped", after_pages_dropped))
        plan.append(("reload alone, in process (best of 3)", lambda: reload_alone(src, cache)))
        for what, run in plan:
            r = run()
            if r is None:
                continue
            load = os.getloadavg()[0]  # the machine may be shared: say how busy it was
            print(f"  {what}: {r} (load {load:.1f})", file=sys.stderr)
            rows.append((n, what, r.get("wall"), r["scan"], r["reload"], r.get("cpu"), r["entry_scan"],
                         r["hashes"], r["statted"], r["reloaded"], r.get("first_opens_disk_hits"), f"{load:.1f}"))
        print(f"  synthesis took {t_syn:.0f} s", file=sys.stderr)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    head = ("entries", "run", "mount ready s", "source scan s", "reload s", "reload CPU s", "listing s",
            "path hashes s", "stat'ed", "reloaded", "disk hits at once", "load avg")
    fmt = lambda v: "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))  # noqa: E731
    if args.markdown:
        print(markdown_table(head, [[fmt(v) for v in row] for row in rows]))
    else:
        widths = [9, 46, 14, 14, 9, 13, 10, 14, 9, 9, 18, 8]
        print("".join(h.ljust(w) for h, w in zip(head, widths)))
        for row in rows:
            print("".join(fmt(v).ljust(w) for v, w in zip(row, widths)))
    return 0
