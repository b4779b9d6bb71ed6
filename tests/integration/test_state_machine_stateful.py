"""The read path's per-file state machine driven by hypothesis: a ``RuleBasedStateMachine``
over an in-process :class:`TieredCache` with a real RAM tier and a REAL disk tier on a small tmpfs.

Rules: opens (one at a time, one held open while another is opened, and several threads opening one file
at once while its backend read is held until every other open waits on it), handles held open across other steps and read later, warm-up
prefetches, the plan prefetcher (plans announced, prefetches run one at a time into its window, a prefetch
whose backend read is held while opens of the same file wait on it and an open of another file runs, and
several opens of a prefetched file at once while the first one's admission into the disk tier is held until
the others wait on it), backend failures (EIO, ENOENT) injected into the next read of a file, a disk entry flipped,
cut short or deleted behind the cache's back (one not yet trusted: with ``--verify-entries first-hit`` a
generation is checked at its first hit only), and the cache filesystem filled up (ENOSPC from the real tmpfs) and
freed. Every open's outcome is predicted from the state before it (RAM or moving -> ``ram``; disk -> ``disk``
unless its entry was damaged -> counted corrupt, read again: ``miss``; absent -> ``prefetch`` when the
window holds it, else ``miss``); an open whose outcome the model cannot predict (a race) is counted as its
handle says, and the counters must agree.

After every step (the cache is at rest then): a file is in at most one tier and its residency flags agree;
RAM ``used + reserved + dying <= capacity`` and the loose bytes (exactly the held-open victims' and the
loose handles') ``<= loose_budget`` (drawn: ``LOOSE_BUFFERS``, 40000 or 5000 B, so the bound also fills);
nothing is fetching or moving, nothing reserved or dying; each tier's bytes <= its capacity; the entry
files on the tmpfs are exactly the disk index's entries (no temporary, no victim left behind) and their
bytes = the index's; every resident file's bytes are the source's; the counters equal the model's
(opens, hits per tier, misses, prefetch ready and late, corrupt entries); every open has exactly one
outcome: ``opens == hits.ram + hits.disk + prefetch.ready + prefetch.late + misses``; and ``misses ==
whole-file backend reads + joined + streamed + failed leaders - warm-up reads``, with the backend's own count
of reads (less the prefetcher's).
"""
from __future__ import annotations

import errno
import functools
import os
import random
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from shadefs.backends.posix import PosixBackend
from shadefs.cache.core import LOOSE_BUFFERS, PIN_DYING, PIN_LOOSE, TieredCache
from shadefs.cache.index import TierIndex
from shadefs.cache.tiers import DiskTier, MemoryTier
from shadefs.namespace import Namespace
from shadefs.plan.plans import PlanRegistry
from shadefs.plan.prefetch import Prefetcher
from shadefs.policies import Importance, get_policy

TMPFS_SIZE = 192 * 1024      # the cache filesystem: a disk tier of 160 KB does not always fit (page rounding)
SEED = 0                     # the examples' seed (SM_SEED overrides it; SM_RANDOM=1: fresh random ones)
SIZES = [1, 700, 4096, 9000, 17000, 30000, 45000, 70000, 120000, 200000]   # 200000: larger than every tier


class FaultyBackend(PosixBackend):
    """A posix backend that counts its whole-file reads, fails the next read of a path on demand, and can
    hold a read until released (to make concurrent opens join it)."""

    def __init__(self, url):
        super().__init__(url)
        self.lock = threading.Lock()
        self.reads = {}          # path -> whole-file reads that returned bytes
        self.failed = 0          # whole-file reads that raised (injected)
        self.fail = {}           # path -> exception instance for its next read
        self.hold = {}           # path -> (entered Event, release Event)
        self.prefetchers = set()  # idents of the threads running the prefetcher
        self.hold_prefetch = None  # (entered Event, release Event) for the prefetcher's next read
        self.prefetch_reads = 0  # whole-file reads by the prefetcher that returned bytes

    def read(self, path, size):
        prefetching = threading.get_ident() in self.prefetchers
        with self.lock:
            err = self.fail.pop(path, None)
            gate = self.hold.get(path)
            if prefetching and self.hold_prefetch is not None:
                gate, self.hold_prefetch = self.hold_prefetch, None
        if gate is not None:
            gate[0].set()
            assert gate[1].wait(10)
        if err is not None:
            with self.lock:
                self.failed += 1
            raise err
        data = super().read(path, size)
        with self.lock:
            self.reads[path] = self.reads.get(path, 0) + 1
            self.prefetch_reads += prefetching
        return data

    def total(self):
        with self.lock:
            return sum(self.reads.values())


class GatedDisk(DiskTier):
    """A real disk tier whose write of one chosen entry waits until released (to make opens join its
    admission)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.gate = None         # (relpath, entered Event, release Event)

    def put(self, relpath, gen, chunks, size, mtime_ns=None):
        gate = self.gate
        if gate is not None and gate[0] == relpath:
            gate[1].set()
            assert gate[2].wait(10)
        return super().put(relpath, gen, chunks, size, mtime_ns)


def read_into(cache, fid, got, k):
    """Open ``fid``, read it whole, release it: ``got[k] = (the open's outcome, the bytes)``."""
    h = cache.open(fid)
    try:
        got[k] = (h.outcome, bytes(h.read(0, h.size)))
    finally:
        h.release()


def waiters(event) -> int:
    """Threads blocked in ``event.wait()`` (a flight's ``done``)."""
    return len(event._cond._waiters)


def wait_until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.001)
    return cond()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    if os.geteuid() != 0:
        from conftest import CI
        (pytest.fail if CI else pytest.skip)("needs root (mounts a tmpfs for the disk tier)")
    base = tmp_path_factory.mktemp("sm")
    src = base / "src"
    rng = random.Random(5)
    spec = {}
    for i, n in enumerate(SIZES):
        rel = f"c{i % 2}/f{i:02d}.bin"
        spec[rel] = rng.randbytes(n)
        (src / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(spec[rel])
    fs = base / "fs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs", str(fs)], check=True)
    try:
        yield src, spec, fs
    finally:
        subprocess.run(["umount", "-l", str(fs)], capture_output=True)


class ReadPath(RuleBasedStateMachine):
    world = None   # (src, spec, tmpfs dir), set by the test
    seen = None    # what the examples exercised, summed over all of them (asserted by the test)

    def __init__(self):
        super().__init__()
        self.cache = None

    @initialize(policy=st.sampled_from(["lru", "fifo", "shade", "static"]),
                ram=st.sampled_from([0, 20000, 80000]), disk=st.sampled_from([50000, 160000]),
                verify=st.sampled_from(["first-hit", "every-open"]),
                loose=st.sampled_from([LOOSE_BUFFERS, 40000, 5000]),
                window=st.sampled_from([250000, 0, 60000]))
    def build(self, policy, ram, disk, verify, loose, window):
        src, self.spec, fs = self.world
        self.fs = str(fs)
        cache_dir = os.path.join(self.fs, "cache")
        shutil.rmtree(cache_dir, ignore_errors=True)
        self.filler = os.path.join(self.fs, "filler")
        if os.path.exists(self.filler):
            os.unlink(self.filler)
        self.backend = FaultyBackend(str(src))
        self.ns = Namespace(self.backend.walk())
        imp = Importance(self.ns.num_files)
        cls = get_policy(policy)
        self.disk = GatedDisk(cache_dir, str(src))
        self.cache = TieredCache(self.ns, self.backend, (TierIndex("ram", ram, cls(ram, imp)), MemoryTier()),
                                 (TierIndex("disk", disk, cls(disk, imp)), self.disk), imp)
        self.cache.verify_entries = verify
        self.cache.loose_budget = loose   # 40000, 5000: held victims and demotions also meet a full bound
        # the plan prefetcher (window 0: off), run one prefetch at a time by the rules (no threads of its own)
        self.plans = PlanRegistry(self.ns.num_files, self.cache.lock, announce_burst=1000)
        self.pf = Prefetcher(self.cache, self.plans, window, concurrency=0)
        self.cache.attach_plans(self.plans, self.pf)
        self.table, _ = self.plans.register(None, np.arange(self.ns.num_files, dtype=np.int64))
        self.epochs = [0, 0]      # per stream: the next epoch to announce
        self.rels = sorted(self.spec)
        self.fids = {r: self.ns.file_id(r) for r in self.rels}
        self.model = dict(opens=0, hits_ram=0, hits_disk=0, misses=0, ready=0, late=0, corrupt_entries=0)
        self.failed_leads = 0     # opens that led a read that failed
        self.warm_reads = 0       # whole-file reads done by prefetch (not opens)
        self.damaged = {}         # fid -> entry path damaged behind the cache's back
        self.held = []            # (rel, handle) open across steps

    def teardown(self):
        for _, h in getattr(self, "held", []):
            h.release()
        if self.cache is not None:
            c = self.cache.counters()
            for k in ("joined", "corrupt_entries", "disk_write_errors", "promotions", "demotions", "streamed",
                      "backend_errors", "hits_ram", "hits_disk", "demotions_skipped"):
                self.seen[k] = self.seen.get(k, 0) + c[k]
            for k in ("ready", "late"):
                self.seen[k] = self.seen.get(k, 0) + c["prefetch"][k]
            self.cache.close()
            self.disk.close()

    # -- helpers --------------------------------------------------------------------------------------
    def predict(self, fid):
        """The outcome of an open of ``fid`` now, and whether it finds a damaged entry (counted corrupt).
        A file the cache does not serve (absent, or its entry found damaged) is taken from the prefetch
        window when that holds it (the window may hold a file warm-up read meanwhile), else read."""
        st_ = self.cache.state(fid)
        if st_ in ("ram", "moving"):
            return "ram", False
        with self.cache.lock:
            staged = fid in self.pf.staged
        absent = "prefetch" if staged else "miss"
        if st_ == "disk":
            path = self.cache.disk_entry_path(fid)
            if self.damaged.get(fid, (None,))[0] == path:
                return absent, True
            return "disk", False
        return absent, False

    def trusted(self, fid):
        """``--verify-entries first-hit``: a generation that passed its first hit is served unchecked
        while resident, unless its hit may promote it (then its bytes are read, and checked, anyway)."""
        c = self.cache
        return (c.verify_entries == "first-hit" and bool(c.verified[fid])
                and int(self.ns.size(fid)) > c.ram_index.capacity_bytes)

    def count(self, outcome):
        self.model["opens"] += 1
        self.model[{"ram": "hits_ram", "disk": "hits_disk", "miss": "misses", "prefetch": "ready",
                    "late": "late"}[outcome]] += 1

    def open_read(self, rel, hold=False):
        fid = self.fids[rel]
        want, corrupt = self.predict(fid)
        reads0, failed0 = self.backend.total(), self.backend.failed
        streamed0 = self.cache.counters()["streamed"]
        try:
            h = self.cache.open(fid)
        except OSError as e:
            assert want == "miss" and self.backend.failed == failed0 + 1, e
            self.count("miss")
            self.failed_leads += 1
            self.model["corrupt_entries"] += corrupt
            self.damaged.pop(fid, None)
            return
        assert h.outcome == want, (rel, h.outcome, want)
        self.count(want)
        self.model["corrupt_entries"] += corrupt
        if corrupt:
            self.damaged.pop(fid, None)
        streamed = self.cache.counters()["streamed"] - streamed0 == 1   # no tier admitted it: by ranges
        assert self.backend.total() - reads0 == (1 if want == "miss" and not streamed else 0)
        assert h.read(0, h.size + 10) == self.spec[rel]
        if hold:
            self.held.append((rel, h))
        else:
            h.release()

    # -- rules ----------------------------------------------------------------------------------------
    @rule(i=st.integers(0, len(SIZES) - 1), hold=st.booleans())
    def open(self, i, hold):
        self.open_read(self.rels[i], hold and len(self.held) < 4)

    @rule(i=st.integers(0, len(SIZES) - 1), j=st.integers(0, len(SIZES) - 1))
    def open_while_one_is_held(self, i, j):
        """Open one file and keep it open, then open another: an eviction may find its victim held open."""
        self.open_read(self.rels[i], len(self.held) < 4)
        self.open_read(self.rels[j])

    @rule(i=st.integers(0, len(SIZES) - 1), n=st.integers(2, 5))
    def open_concurrently(self, i, n):
        """n threads open one file at once; a miss's backend read is held until the others wait on it."""
        rel = self.rels[i]
        fid = self.fids[rel]
        if rel in self.backend.fail:
            return
        want, corrupt = self.predict(fid)
        gate = (threading.Event(), threading.Event())
        self.backend.hold[rel] = gate
        reads0 = self.backend.total()
        joined0 = self.cache.counters()["joined"]
        got = [None] * n

        def one(k):
            h = self.cache.open(fid)
            try:
                got[k] = (h.outcome, h.source, h.read(0, h.size))
            finally:
                h.release()

        threads = [threading.Thread(target=one, args=(0,))]
        threads[0].start()
        deadline = time.monotonic() + 10
        while not gate[0].is_set() and threads[0].is_alive() and time.monotonic() < deadline:
            time.sleep(0.001)   # a miss that reads enters the gate; a hit or a streamed open just ends
        leader_read = gate[0].is_set()
        if leader_read:                           # a miss that reads: the others must join it
            threads += [threading.Thread(target=one, args=(k,)) for k in range(1, n)]
            for t in threads[1:]:
                t.start()
            fl = self.cache._flights.get(fid)
            deadline = time.monotonic() + 10
            while fl is not None and len(fl.done._cond._waiters) < n - 1 and time.monotonic() < deadline:
                time.sleep(0.001)
            assert fl is not None and len(fl.done._cond._waiters) == n - 1, "the other opens did not join"
        gate[1].set()
        for t in threads:
            t.join(10)
        del self.backend.hold[rel]
        if not leader_read:                       # a hit or a streamed miss: no read to join
            for k in range(1, n):
                one(k)
        assert all(g is not None and g[2] == self.spec[rel] for g in got), rel
        outcomes = [g[0] for g in got]
        self.model["corrupt_entries"] += corrupt
        if corrupt:
            self.damaged.pop(fid, None)
        if leader_read:
            assert outcomes == ["miss"] * n
            assert self.backend.total() - reads0 == 1          # single-flight: one read for n opens
            assert self.cache.counters()["joined"] - joined0 == n - 1
        elif want == "prefetch":      # no tier kept the prefetched bytes: the later opens may read them
            assert outcomes[0] == want, (rel, outcomes, want)
            assert self.backend.total() - reads0 <= outcomes.count("miss")
        else:
            assert outcomes[0] == want, (rel, outcomes, want)
            assert self.backend.total() == reads0
        for o in outcomes:
            self.count(o)

    @precondition(lambda self: self.held)
    @rule(k=st.integers(0, 3), data=st.data())
    def read_held(self, k, data):
        """A handle held across evictions, promotions and corruption keeps serving the exact bytes."""
        rel, h = self.held[k % len(self.held)]
        off = data.draw(st.integers(0, h.size))
        assert h.read(off, 50000) == self.spec[rel][off:off + 50000]

    @precondition(lambda self: self.held)
    @rule(k=st.integers(0, 3))
    def release_held(self, k):
        _, h = self.held.pop(k % len(self.held))
        h.release()
        h.release()  # idempotent

    @rule(i=st.integers(0, len(SIZES) - 1))
    def warm(self, i):
        rel = self.rels[i]
        fid = self.fids[rel]
        was = self.cache.state(fid)
        reads0, failed0 = self.backend.total(), self.backend.failed
        try:
            out = self.cache.prefetch(fid)
        except OSError:
            assert self.backend.failed == failed0 + 1
            return
        read = self.backend.total() - reads0
        self.warm_reads += read
        if was != "absent":
            assert out == "resident" and read == 0
        else:
            assert out in ("ram", "disk", "rejected") and read <= 1
            assert self.cache.state(fid) == (out if out != "rejected" else "absent")

    @precondition(lambda self: self.cache is not None and self.pf.window_bytes > 0)
    @rule(action=st.sampled_from(["announce", "ahead", "race", "admission"]), data=st.data())
    def prefetcher(self, action, data):
        """The plan prefetcher's moves (one rule, so that the read path's own rules keep their share of the
        steps): announce a plan, prefetch ahead of it, race a prefetch with opens, open a prefetched file
        from several threads at once."""
        if action == "announce" or not self.plans.plans:
            self.announce_plan(data.draw(st.lists(st.integers(0, len(SIZES) - 1), min_size=1, max_size=12)),
                               data.draw(st.integers(0, 1)))
        if action == "ahead":
            self.prefetch_ahead(data.draw(st.integers(1, 4)))
        elif action == "race":
            self.prefetch_races_opens(data.draw(st.integers(1, 3)), data.draw(st.integers(0, len(SIZES) - 1)))
        elif action == "admission":
            self.open_prefetched_concurrently(data.draw(st.integers(0, 100)), data.draw(st.integers(2, 4)))

    def announce_plan(self, order, stream):
        """A reader announces the order of its next epoch (a stream's new plan replaces its last one)."""
        ids = np.array([self.fids[self.rels[i]] for i in order], dtype=np.uint32)
        self.plans.announce(self.table, stream, self.epochs[stream], [len(ids)], ids)
        self.epochs[stream] += 1

    def _prefetch(self):
        """One prefetch on this thread (the prefetcher's own work: claim the next file, read it into the
        window); returns whether there was one."""
        me = threading.get_ident()
        self.backend.prefetchers.add(me)
        try:
            return self.pf.step()
        finally:
            self.backend.prefetchers.discard(me)

    def prefetch_ahead(self, n):
        for _ in range(n):
            if not self._prefetch():
                break

    def prefetch_races_opens(self, n, other):
        """A prefetch's backend read is held; n opens of its file wait on it (``late``: no second read) while
        an open of another file is served; then the read completes (or fails: its opens read the file)."""
        gate = (threading.Event(), threading.Event())
        self.backend.hold_prefetch = gate
        done = []
        pt = threading.Thread(target=lambda: done.append(self._prefetch()))
        pt.start()
        assert wait_until(lambda: gate[0].is_set() or not pt.is_alive())
        if not gate[0].is_set():      # nothing to prefetch (window full, nothing ahead of the cursors)
            pt.join(10)
            self.backend.hold_prefetch = None
            return
        with self.cache.lock:
            (fid,) = self.cache._inflight
        fut = self.cache._inflight[fid]
        got = [None] * n
        one = functools.partial(read_into, self.cache, fid, got)
        threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        assert wait_until(lambda: len(fut._condition._waiters) == n), "the opens did not wait on the prefetch"
        rel = self.rels[other]
        if self.fids[rel] != fid:
            self.open_read(rel)       # another file meanwhile: served as predicted
        gate[1].set()
        for t in threads + [pt]:
            t.join(10)
        rel = self.ns.path(fid)
        assert all(g is not None and g[1] == self.spec[rel] for g in got), rel
        outcomes = [g[0] for g in got]
        if fut.result() is not None:
            assert outcomes == ["late"] * n
        for o in outcomes:            # a failed prefetch: its opens read the file (lead, join or hit)
            self.count(o)

    def open_prefetched_concurrently(self, k, n):
        """n opens of a file the window holds: the first takes it (``ready``) and admits its bytes to the
        tiers; when the disk tier admits it, that write is held until the other opens wait on it, and each
        of them is counted ``late`` (it waited for the prefetch's admission), never left uncounted."""
        for _ in range(4):
            with self.cache.lock:
                fids = sorted(f for f in self.pf.staged if self.cache._absent(f))
            if fids or not self._prefetch():
                break
        if not fids:
            return
        fid = fids[k % len(fids)]
        rel = self.ns.path(fid)
        gate = (rel, threading.Event(), threading.Event())
        self.disk.gate = gate
        got = [None] * n
        one = functools.partial(read_into, self.cache, fid, got)
        threads = [threading.Thread(target=one, args=(0,))]
        threads[0].start()
        assert wait_until(lambda: gate[1].is_set() or not threads[0].is_alive())
        admitting = gate[1].is_set()
        if admitting:                 # the disk tier admitted it: the others join that admission
            threads += [threading.Thread(target=one, args=(j,)) for j in range(1, n)]
            for t in threads[1:]:
                t.start()
            fl = self.cache._flights.get(fid)
            assert fl is not None and wait_until(lambda: waiters(fl.done) == n - 1), "the opens did not join"
        gate[2].set()
        for t in threads:
            t.join(10)
        self.disk.gate = None
        if not admitting:             # RAM took it, or no tier did: the others open it after
            for j in range(1, n):
                one(j)
        assert all(g is not None and g[1] == self.spec[rel] for g in got), rel
        outcomes = [g[0] for g in got]
        assert outcomes[0] == "prefetch"
        if admitting:
            assert outcomes[1:] == ["late"] * (n - 1), outcomes
            self.seen["joined_admission"] = self.seen.get("joined_admission", 0) + 1
        for o in outcomes:
            self.count(o)

    @rule(i=st.integers(0, len(SIZES) - 1), err=st.sampled_from([errno.EIO, errno.ENOENT]))
    def fail_next_backend_read(self, i, err):
        rel = self.rels[i]
        exc = FileNotFoundError(err, "injected") if err == errno.ENOENT else OSError(err, "injected")
        with self.backend.lock:
            self.backend.fail[rel] = exc

    @precondition(lambda self: self.cache is not None and len(self.cache.disk_index) > 0)
    @rule(k=st.integers(0, 100), how=st.sampled_from(["flip", "unlink", "truncate"]))
    def damage_entry(self, k, how):
        """Behind the cache's back: flip one byte of a disk entry (same size), delete it, or cut it short."""
        held = {h.fid for _, h in self.held if h.source == "entry"}   # their fds would read the damage
        fids = sorted(f for f in self.cache.disk_index.sizes
                      if f not in held and f not in self.damaged and not self.trusted(f))
        if not fids:
            return
        fid = fids[k % len(fids)]
        path = self.cache.disk_entry_path(fid)
        if how == "unlink":
            os.unlink(path)
        else:
            with open(path, "r+b") as f:
                if how == "flip":
                    n = os.fstat(f.fileno()).st_size
                    f.seek(n // 2)
                    b = f.read(1)
                    f.seek(n // 2)
                    f.write(bytes([b[0] ^ 0x80]))
                else:
                    f.truncate(os.fstat(f.fileno()).st_size - 1)
        self.damaged[fid] = (path, how)

    @precondition(lambda self: self.cache is not None and not os.path.exists(self.filler))
    @rule()
    def fill_cache_filesystem(self):
        """Take all the free space of the tmpfs: the next disk writes fail with ENOSPC."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
        finally:
            os.close(fd)

    @precondition(lambda self: self.cache is not None and os.path.exists(self.filler))
    @rule()
    def free_cache_filesystem(self):
        os.unlink(self.filler)

    # -- invariants, after every step -----------------------------------------------------------------
    @invariant()
    def consistent(self):
        if self.cache is None:
            return
        a = self.cache.audit()
        assert a["both"] == [] and a["flag_errors"] == []
        assert a["fetching"] == [] and a["moving"] == [] and a["moving_bytes"] == 0
        # RAM buffers of evicted files that handles still hold stay counted until released: against the
        # loose bound (the tier's victims are the policy's), or, with no room there, as the tier's dying bytes
        pins = {id(h._pin): h._pin for _, h in self.held if h._pin is not None}
        pinned_dying = sum(p.size for p in pins.values() if p.where == PIN_DYING)
        pinned_loose = sum(p.size for p in pins.values() if p.where == PIN_LOOSE)
        assert a["held"] == {"dying": pinned_dying, "loose": pinned_loose, "uncounted": []}
        assert a["loose"]["bytes"] == sum(h._loose for _, h in self.held) + pinned_loose
        assert a["loose"]["bytes"] <= a["loose"]["budget"] == self.cache.loose_budget
        self.seen["held_loose"] = self.seen.get("held_loose", 0) + (pinned_loose > 0)
        self.seen["held_dying"] = self.seen.get("held_dying", 0) + (pinned_dying > 0)
        for name, b in a["budget"].items():
            dying = pinned_dying if name == "ram" else 0
            assert (b["reserved"], b["dying"], b["pending"]) == (0, dying, []), (name, b)
            assert b["used"] + b["reserved"] + b["dying"] <= b["capacity"]
        ram = self.cache.ram_index.sizes
        assert sorted(self.cache.ram._data) == a["ram"]
        assert a["budget"]["ram"]["used"] == sum(ram.values())
        for fid in a["ram"]:
            assert self.cache.ram.get(fid) == self.spec[self.ns.path(fid)]
        # the disk tier: the files on the tmpfs are exactly the index's entries, with the source's bytes
        on_disk = {}
        for e in os.scandir(self.disk.dir):
            if e.is_dir():
                for f in os.scandir(e.path):
                    on_disk[f.path] = f.stat().st_size
        gone = {p for p, how in self.damaged.values() if how == "unlink"}
        assert sorted(on_disk) == sorted(set(a["entries"].values()) - gone), "an entry, temporary or victim left behind"
        disk = self.cache.disk_index.sizes
        assert a["budget"]["disk"]["used"] == sum(disk.values())
        for fid_s, path in a["entries"].items():
            fid = int(fid_s)
            data = None
            if path not in gone:
                with open(path, "rb") as f:
                    data = f.read()
            if self.damaged.get(fid, (None,))[0] == path:
                if path not in gone:
                    assert data != self.spec[self.ns.path(fid)]
            else:
                assert data == self.spec[self.ns.path(fid)] and on_disk[path] == disk[fid]
        assert sum(on_disk.values()) <= a["budget"]["disk"]["capacity"]
        # damaged entries that left the tier (victims) are no longer pending detection
        for fid in [f for f, (p, _) in self.damaged.items() if a["entries"].get(str(f)) != p]:
            del self.damaged[fid]
        # counters: the model's, and every miss read the backend once, waited for a read, or streamed
        c = a["counters"]
        p = self.cache.counters()["prefetch"]
        c = dict(c, ready=p["ready"], late=p["late"])
        for k, v in self.model.items():
            assert c[k] == v, (k, c[k], v)
        assert c["opens"] == c["hits_ram"] + c["hits_disk"] + c["ready"] + c["late"] + c["misses"], c
        assert c["backend_reads"] == self.backend.total() - self.backend.prefetch_reads
        assert c["misses"] == c["backend_reads"] - self.warm_reads + c["joined"] + c["streamed"] + self.failed_leads


def test_read_path_state_machine(world, monkeypatch):
    ReadPath.world = world
    ReadPath.seen = {}
    # hypothesis also draws constants found in the modules loaded so far (all of shadefs and the tests run
    # before this one): without them the seeded examples are the same whatever ran before
    from hypothesis.internal.conjecture import providers
    monkeypatch.setattr(providers, "_get_local_constants", lambda: providers.Constants())
    # SM_SEED: the examples' seed (default: a fixed one whose examples reach every transition below)
    machine = ReadPath if os.environ.get("SM_RANDOM") else seed(int(os.environ.get("SM_SEED", SEED)))(ReadPath)
    # SM_EXAMPLES: how many examples; SM_RANDOM=1: fresh random ones (default: the same seeded set)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=int(os.environ.get("SM_EXAMPLES", 100)), stateful_step_count=40, deadline=None,
        derandomize=not os.environ.get("SM_RANDOM"), database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        phases=[Phase.explicit, Phase.reuse, Phase.generate] + ([] if os.environ.get("SM_NO_SHRINK") else [Phase.shrink])))
    # the examples went through every transition and failure (seeded: the same examples every run)
    print(f"\nstate machine examples: {ReadPath.seen}")
    assert all(ReadPath.seen.get(k, 0) > 0 for k in (
        "joined", "corrupt_entries", "disk_write_errors", "promotions", "demotions", "streamed",
        "backend_errors", "hits_ram", "hits_disk", "held_loose", "held_dying", "demotions_skipped", "ready",
        "late", "joined_admission")), ReadPath.seen
