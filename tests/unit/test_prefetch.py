"""The prefetcher on the real read path (posix backend, no mount): window bound, single-flight, counters."""
import os
import random
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from shadefs.backends.posix import PosixBackend
from shadefs.cache.core import TieredCache
from shadefs.cache.index import TierIndex
from shadefs.cache.tiers import MemoryTier
from shadefs.namespace import Namespace
from shadefs.plan.plans import PlanRegistry
from shadefs.plan.policy import PlanPolicy
from shadefs.plan.prefetch import Prefetcher
from shadefs.policies import Importance, get_policy
from shadefs.testing.handles import open_read


class CountingBackend(PosixBackend):
    def __init__(self, url, gate=None, fail=()):
        super().__init__(url)
        self.reads = []
        self.gate = gate
        self.fail = set(fail)
        self.lock = threading.Lock()

    def read(self, path, size):
        with self.lock:
            self.reads.append(path)
        if self.gate is not None:
            assert self.gate.wait(10)
        if path in self.fail:
            raise OSError(5, "injected backend failure")
        return super().read(path, size)


@pytest.fixture(scope="module")

def tree(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    rng = random.Random(3)
    spec = {}
    for i in range(30):
        rel = f"c{i % 3}/{i:03d}.bin"
        os.makedirs(src / f"c{i % 3}", exist_ok=True)
        data = bytes(rng.getrandbits(8) for _ in range(100 * (1 + i % 7)))
        (src / rel).write_bytes(data)
        spec[rel] = data
    return src, spec


def build(src, ram, window, policy="static", gate=None, fail=(), page_probe=None):
    backend = CountingBackend(str(src), gate, fail)
    ns = Namespace(backend.walk())
    imp = Importance(ns.num_files)
    plans = PlanRegistry(ns.num_files)
    index = TierIndex("ram", ram, PlanPolicy(get_policy(policy)(ram, imp), plans))
    cache = TieredCache(ns, backend, (index, MemoryTier()), None, imp)
    plans.lock = cache.lock  # as the daemon wires it
    pf = Prefetcher(cache, plans, window, concurrency=0, page_probe=page_probe)
    cache.attach_plans(plans, pf)
    handle, _ = plans.register(None, np.arange(ns.num_files, dtype=np.int64))
    return cache, ns, plans, pf, handle, backend


def check_invariants(cache, pf):
    s = cache.stats()
    p = s["prefetch"]
    assert s["opens"] == s["hits"]["ram"] + s["hits"]["disk"] + p["ready"] + p["late"] + s["misses"]
    assert 0 <= pf.reserved_bytes <= pf.window_bytes
    assert pf.reserved_bytes == sum(len(d) for d, _ in pf.staged.values()) + sum(z for z, _ in pf.pending.values())


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_window_is_never_exceeded_and_outcomes_add_up(tree, data):
    src, spec = tree
    window = data.draw(st.integers(0, 3000))
    ram = data.draw(st.integers(0, 4000))
    cache, ns, plans, pf, h, backend = build(src, ram, window)
    order = data.draw(st.lists(st.integers(0, ns.num_files - 1), min_size=1, max_size=60))
    plans.announce(h, 0, 0, [len(order)], np.array(order, dtype=np.uint32))
    i = 0
    for _ in range(200):
        action = data.draw(st.sampled_from(["step", "open", "stray", "reannounce"]))
        if action == "step":
            pf.step()
        elif action == "open" and i < len(order):
            got, outcome = open_read(cache, order[i])
            assert bytes(got) == spec[ns.path(order[i])]
            i += 1
        elif action == "stray":
            open_read(cache, data.draw(st.integers(0, ns.num_files - 1)))
        elif action == "reannounce":
            rest = data.draw(st.lists(st.integers(0, ns.num_files - 1), min_size=1, max_size=20))
            try:
                plans.announce(h, data.draw(st.integers(0, 1)), 1, [len(rest)], np.array(rest, dtype=np.uint32))
            except Exception as e:   # a flood refusal is fine here
                assert getattr(e, "reason", None) == "flood"
        check_invariants(cache, pf)  # single-threaded: nothing moves between the reads
        assert pf.peak_bytes <= window


def test_a_planned_epoch_is_served_ready_and_read_once(tree):
    src, spec = tree
    cache, ns, plans, pf, h, backend = build(src, ram=0, window=10**6)
    order = list(range(ns.num_files))
    random.Random(0).shuffle(order)
    plans.announce(h, 0, 0, [len(order)], np.array(order, dtype=np.uint32))
    while pf.step():
        pass
    assert len(backend.reads) == ns.num_files
    outcomes = [open_read(cache, f)[1] for f in order]
    assert outcomes == ["prefetch"] * ns.num_files
    s = cache.stats()
    assert s["prefetch"]["ready"] == ns.num_files and s["misses"] == 0
    assert s["prefetch"]["fetched_bytes"] == sum(len(v) for v in spec.values()) == s["backend_bytes"]
    assert len(backend.reads) == ns.num_files and pf.reserved_bytes == 0


@pytest.mark.parametrize("reannounce", [False, True])
def test_a_second_planned_use_of_a_staged_file_is_prefetched_again(tree, reannounce):
    """Two epochs announced at once, a window larger than the dataset: every file is staged for its epoch-0
    use, and its epoch-1 use must be read again once that copy is taken, not passed over (which left
    epoch 1 without any prefetch when the stream then re-announced epoch 1 alone)."""
    src, spec = tree
    cache, ns, plans, pf, h, backend = build(src, ram=0, window=10**6)
    n = ns.num_files
    e0 = list(range(n))
    random.Random(1).shuffle(e0)
    e1 = list(range(n))
    random.Random(2).shuffle(e1)
    plans.announce(h, 0, 0, [n, n], np.array(e0 + e1, dtype=np.uint32))
    while pf.step():
        pass
    assert len(backend.reads) == n                       # each file once: one staged copy per file
    assert [open_read(cache, f)[1] for f in e0] == ["prefetch"] * n
    if reannounce:                                       # epoch 1 begins: the stream announces it alone
        plans.announce(h, 0, 1, [n], np.array(e1, dtype=np.uint32))
    while pf.step():
        pass
    assert len(backend.reads) == 2 * n                   # the epoch-1 uses, read ahead again
    assert [open_read(cache, f)[1] for f in e1] == ["prefetch"] * n
    s = cache.stats()
    assert s["prefetch"]["ready"] == 2 * n and s["misses"] == 0 and s["prefetch"]["wasted_bytes"] == 0


def test_an_open_of_a_file_being_prefetched_waits_for_that_read(tree):
    src, spec = tree
    gate = threading.Event()
    cache, ns, plans, pf, h, backend = build(src, ram=0, window=10**6, gate=gate)
    plans.announce(h, 0, 0, [1], np.array([5], dtype=np.uint32))
    t = threading.Thread(target=pf.step)
    t.start()
    while not backend.reads:
        pass
    out = {}
    opener = threading.Thread(target=lambda: out.setdefault("r", open_read(cache, 5)))
    opener.start()
    gate.set()
    t.join(10)
    opener.join(10)
    assert out["r"][1] == "late" and bytes(out["r"][0]) == spec[ns.path(5)]
    assert len(backend.reads) == 1   # single-flight: one backend read
    s = cache.stats()["prefetch"]
    assert s["late"] == 1 and s["late_wait_s"] > 0 and pf.reserved_bytes == 0


def test_a_failed_prefetch_surfaces_only_as_a_miss(tree):
    src, spec = tree
    cache, ns, plans, pf, h, backend = build(src, ram=0, window=10**6, fail={ "c1/001.bin"})
    f = ns.file_id("c1/001.bin")
    plans.announce(h, 0, 0, [1], np.array([f], dtype=np.uint32))
    assert pf.step()
    backend.fail.clear()
    data, outcome = open_read(cache, f)
    assert outcome == "miss" and bytes(data) == spec["c1/001.bin"]
    assert cache.stats()["prefetch"]["errors"] == 1 and pf.reserved_bytes == 0


def test_two_plans_share_the_window(tree):
    src, spec = tree
    cache, ns, plans, pf, h, backend = build(src, ram=0, window=1400)
    plans.announce(h, 0, 0, [10], np.arange(0, 10, dtype=np.uint32))
    plans.announce(h, 1, 0, [10], np.arange(10, 20, dtype=np.uint32))
    while pf.step():
        pass
    owned = {k[1]: v for k, v in pf.owned.items()}
    assert set(owned) == {0, 1} and all(v <= 1400 // 2 for v in owned.values())


def test_retired_plan_wastes_its_window(tree):
    src, spec = tree
    cache, ns, plans, pf, h, backend = build(src, ram=0, window=10**6)
    plans.announce(h, 0, 0, [3], np.array([0, 1, 2], dtype=np.uint32))
    while pf.step():
        pass
    with cache.lock:
        plans.retire_all("test")
    s = cache.stats()["prefetch"]
    assert s["wasted_bytes"] == sum(ns.size(f) for f in (0, 1, 2)) and pf.reserved_bytes == 0
    assert s["plans_retired"] == 1


def test_the_cores_read_ahead_entry_point_is_single_flight_and_counts_no_open(tree):
    """TieredCache.prefetch(fid, hold=...): the prefetcher's one way in (no copy of the core's fetch)."""
    src, spec = tree
    gate = threading.Event()
    cache, ns, plans, pf, h, backend = build(src, ram=10**6, window=10**6, gate=gate)
    held = []

    def hold(fid, data, source):
        held.append((fid, bytes(data), source))
        return True

    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", cache.prefetch(4, hold=hold)))
    t.start()
    while not backend.reads:
        pass
    with cache.lock:
        assert not cache.fetchable(4) and cache.fetchable(5)
    assert cache.prefetch(4, hold=hold) == "fetching"   # a read of it is in flight: nothing started
    gate.set()
    t.join(10)
    assert out["r"] == "held" and held == [(4, spec[ns.path(4)], "miss")]
    assert backend.reads == [ns.path(4)]
    s = cache.stats()
    assert s["opens"] == 0 and s["misses"] == 0 and s["backend_bytes"] == len(spec[ns.path(4)])
    assert cache.prefetch(4, hold=lambda *a: False) == "dropped" and len(backend.reads) == 2
    open_read(cache, 6)                                   # RAM-resident now
    assert cache.prefetch(6, hold=hold) == "resident" and len(backend.reads) == 3
    with cache.lock:
        assert cache.fetchable(4) and not cache.fetchable(6)


def test_a_failed_read_ahead_raises_and_leaves_nothing_in_flight(tree):
    src, spec = tree
    cache, ns, plans, pf, h, backend = build(src, ram=0, window=10**6, fail={"c1/001.bin"})
    f = ns.file_id("c1/001.bin")
    with pytest.raises(OSError):
        cache.prefetch(f, hold=lambda *a: True)
    with cache.lock:
        assert cache.fetchable(f)
    assert cache.stats()["opens"] == 0 and cache.counters()["backend_errors"] == 1


def test_across_an_epoch_boundary_only_the_next_epochs_first_burst_is_read_ahead(tree):
    """Two epochs announced, a window larger than both: the prefetcher reads the epoch the cursor is in
    and the next one's first ``boundary_opens`` positions only, until the cursor enters that epoch."""
    src, spec = tree
    cache, ns, plans, pf, h, backend = build(src, ram=0, window=10**6)
    pf.boundary_opens = 4
    n = ns.num_files
    e0 = list(range(n))
    random.Random(1).shuffle(e0)
    e1 = list(range(n))
    random.Random(2).shuffle(e1)
    # two epochs over disjoint halves of the files: every read is the read of one position
    plans.announce(h, 0, 0, [n // 2, n // 2], np.array(e0[:n // 2] + e0[n // 2:], dtype=np.uint32))
    while pf.step():
        pass
    assert sorted(backend.reads) == sorted(ns.path(f) for f in e0[:n // 2 + 4])
    for f in e0[:n // 2]:
        assert open_read(cache, f)[1] == "prefetch"
    while pf.step():                                     # the cursor is in epoch 1: the rest of it
        pass
    assert sorted(backend.reads) == sorted(ns.path(f) for f in e0)


def test_files_the_kernel_holds_are_left_to_it_and_a_read_reaching_the_daemon_drops_that(tree):
    """The page states, with the front end's page probe answered from ``held`` (the files whose first and
    last page the kernel returns; the kernel front end asks the kernel, tests/integration/
    test_plan_kernel_pages.py). Files 0-9 were opened before any plan through an LRU RAM tier that ends
    up holding 10-14 only; 15-17 never were. A plan names 5-9, 0-4, 15-17: the prefetcher asks about
    0-9 (opened before) and not about 15-17 (the kernel cannot hold a page of a file never opened), reads
    0-4 and 15-17 once each and leaves 5-9 to the kernel. An open of 5-9 reads nothing and fills no tier
    (Belady would have evicted the unplanned 10-14 for it); a READ of one of them reaching the daemon
    (its pages were gone) is read by ranges, counted, and its next planned use is prefetched without
    asking."""
    src, spec = tree
    first, last, other, never = list(range(0, 5)), list(range(5, 10)), list(range(10, 15)), [15, 16, 17]
    ns = Namespace(PosixBackend(str(src)).walk())
    size = lambda fs: sum(int(ns.size(f)) for f in fs)  # noqa: E731
    held, asked = set(last), []
    probe = lambda f: asked.append(f) or f in held  # noqa: E731
    cache, ns, plans, pf, h, backend = build(src, ram=size(other), window=10**6, policy="lru", page_probe=probe)
    for f in first + last + other:
        open_read(cache, f)
    assert len(backend.reads) == 15 and sorted(cache.ram_index.sizes) == other
    plans.announce(h, 0, 0, [13], np.array(last + first + never, dtype=np.uint32))
    while pf.step():
        pass
    assert asked == last + first                                                  # in plan order
    assert sorted(backend.reads[15:]) == sorted(ns.path(f) for f in first + never)   # once each
    assert (pf.probed, pf.kernel_kept, pf.kernel_reads) == (10, 5, 0)
    assert [pf.kernel_holds(f) for f in last + first + never] == [True] * 5 + [False] * 8
    handles = [cache.open(f) for f in last]
    assert [(hd.outcome, hd.keep_pages, hd.left) for hd in handles] == [("miss", True, True)] * 5
    assert len(backend.reads) == 23 and sorted(cache.ram_index.sizes) == other   # nothing read, nothing filled
    assert handles[0].read(0, 10) == spec[ns.path(5)][:10]    # the kernel no longer had file 5's pages
    assert (pf.kernel_reads, handles[0].left) == (1, False)
    assert len(backend.reads) == 23  # by ranges (read_range), not a whole read
    for hd in handles:
        hd.release()
    assert [open_read(cache, f)[1] for f in first + never] == ["prefetch"] * 8
    # the next plan: 5 is prefetched without asking (dropped), 6 asked about again (still held)
    plans.announce(h, 1, 0, [2], np.array([5, 6], dtype=np.uint32))
    while pf.step():
        pass
    assert asked[10:] == [6] and backend.reads[23:] == [ns.path(5)]
    assert (pf.probed, pf.kernel_kept) == (11, 6)


def test_an_open_the_prefetcher_did_not_serve_asks_the_kernel_first(tree):
    """A planned file opened before that no prefetch served (here the window is 0; in a mount, one resident
    when the scan passed it and evicted before its open) asks the kernel at its open: held, the open is
    left to the kernel's pages (``left``: nothing read now); not held, the open reads it. No tier here
    (RAM 0): both stream, the second one reading the file by ranges."""
    src, spec = tree
    held, asked = {0}, []
    probe = lambda f: asked.append(f) or f in held  # noqa: E731
    cache, ns, plans, pf, h, backend = build(src, ram=0, window=0, page_probe=probe)
    for f in (0, 1, 2):
        open_read(cache, f)
    assert asked == []                                   # no plan: nobody asks
    plans.announce(h, 0, 0, [3], np.array([0, 1, 2], dtype=np.uint32))
    hd = cache.open(0)
    assert (hd.outcome, hd.left, hd.keep_pages) == ("miss", True, True)
    hd.release()
    hd = cache.open(1)
    assert (hd.outcome, hd.left) == ("miss", False)
    assert hd.read(0, hd.size) == spec[ns.path(1)]
    hd.release()
    assert asked == [0, 1] and (pf.probed, pf.kernel_kept, pf.kernel_reads) == (2, 1, 0)


def test_the_threads_that_claim_reads_follow_the_reads_time(tree):
    """Two threads claim reads while reads take under 1 ms (a fast local source: fewer wake-ups and GIL
    hand-offs), one more per 0.5 ms of the reads' moving average, up to the concurrency; the first read sets
    the average."""
    src, _ = tree
    cache, ns, plans, _, _, _ = build(src, 10**6, 10**6)
    pf = Prefetcher(cache, plans, 10**6, concurrency=32)   # not started: the bookkeeping only

    def took(p, secs):
        with p.cond:   # as _hold calls it: under the cache lock
            p._read_took(secs)

    assert pf.active == 2
    took(pf, 0.0002)                 # tmpfs
    assert (pf.active, pf._read_s) == (2, 0.0002)
    took(pf, 0.0052)                 # an object store: the average 0.2 + (5.2 - 0.2) / 8 = 0.825 ms
    assert pf.active == 2 and abs(pf._read_s - 0.000825) < 1e-12
    for _ in range(40):
        took(pf, 0.005)
    assert pf.active == 10                # 5 ms / 0.5 ms
    took(pf, 1.0)
    assert pf.active == 32                # never past the concurrency
    one = Prefetcher(cache, plans, 10**6, concurrency=1)
    took(one, 0.0001)
    assert one.active == 1                # never past it either way
