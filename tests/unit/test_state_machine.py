"""The per-file state machine of the read path, one transition at a time (docs/architecture.md): single-flight
over the whole miss (admission included), generation-named entries (a pending delete never removes a newer
entry), failures of the disk tier that release their reservation, and the Handle API."""
import os
import threading

import pytest

from shadefs.backends.posix import PosixBackend
from shadefs.cache.core import TieredCache
from shadefs.cache.index import TierIndex
from shadefs.cache.tiers import DiskTier, MemoryTier
from shadefs.namespace import Namespace
from shadefs.policies import Importance, get_policy
from shadefs.testing.handles import open_read as read_all


class CountingBackend(PosixBackend):
    def __init__(self, url):
        super().__init__(url)
        self.reads = []
        self.lock = threading.Lock()
        self.read_gate = {}            # relpath -> Event a read of it waits for
        self.reading = threading.Event()  # set once a gated read has started

    def read(self, path, size):
        with self.lock:
            self.reads.append(path)
        gate = self.read_gate.get(path)
        if gate is not None:
            self.reading.set()
            assert gate.wait(10)
        return super().read(path, size)


class GatedDisk(DiskTier):
    """A real DiskTier whose put/delete of chosen paths wait for an event (or raise)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.put_gate = {}      # relpath -> Event waited on before writing
        self.put_entered = {}   # relpath -> Event set when put starts
        self.delete_gate = {}   # (relpath, gen) -> Event
        self.put_error = None   # an exception instance raised by every put

    def put(self, relpath, gen, chunks, size, mtime_ns=None):
        if relpath in self.put_entered:
            self.put_entered[relpath].set()
        if relpath in self.put_gate:
            assert self.put_gate[relpath].wait(10)
        if self.put_error is not None:
            list(chunks)  # the backend read happens, then the write fails
            raise self.put_error
        return super().put(relpath, gen, chunks, size, mtime_ns)

    def delete(self, relpath, gen, csum):
        gate = self.delete_gate.get((relpath, gen))
        if gate is not None:
            assert gate.wait(10)
        super().delete(relpath, gen, csum)


def build(src, tmp_path, policy="lru", ram=0, disk=0):
    backend = CountingBackend(str(src))
    ns = Namespace(backend.walk())
    imp = Importance(ns.num_files)
    cls = get_policy(policy)
    store = GatedDisk(str(tmp_path / "cache"), str(src)) if disk else None
    disk_t = (TierIndex("disk", disk, cls(disk, imp)), store) if disk else None
    return TieredCache(ns, backend, (TierIndex("ram", ram, cls(ram, imp)), MemoryTier()), disk_t, imp), ns, backend


def entry_files(cache, rel):
    h = cache.disk.key(rel)
    shard = os.path.join(cache.disk.dir, h[:2])
    return sorted(n for n in os.listdir(shard) if n.startswith(h)) if os.path.isdir(shard) else []


def test_an_open_during_admission_waits_for_the_one_read(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, backend = build(src, tmp_path, "lru", ram=0, disk=100000)
    rel = "cat/05.bin"
    f = ns.file_id(rel)
    cache.disk.put_gate[rel] = threading.Event()
    cache.disk.put_entered[rel] = threading.Event()
    out = []
    t1 = threading.Thread(target=lambda: out.append(read_all(cache, f)))
    t1.start()
    assert cache.disk.put_entered[rel].wait(10)   # the leader is admitting it (writing the entry)
    assert cache.state(f) == "fetching"
    t2 = threading.Thread(target=lambda: out.append(read_all(cache, f)))
    t2.start()
    t2.join(0.3)
    assert t2.is_alive()                           # the second open waits: no second leader
    assert cache.open_nowait(f) is None            # and open_nowait neither waits nor counts
    cache.disk.put_gate[rel].set()
    t1.join(10)
    t2.join(10)
    assert out == [(spec[rel], "miss")] * 2
    assert backend.reads == [rel]
    c = cache.counters()
    assert (c["opens"], c["misses"], c["joined"], c["backend_reads"]) == (2, 2, 1, 1)
    assert cache.state(f) == "disk" and f not in cache.ram_index
    assert read_all(cache, f) == (spec[rel], "disk")


def test_a_pending_delete_never_removes_a_newer_entry(tmp_path):
    src = tmp_path / "src"
    spec = {f"c/x{i}.bin": bytes([i + 1]) * 1000 for i in range(4)}
    for rel, data in spec.items():
        (src / "c").mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    cache, ns, _ = build(src, tmp_path, "lru", ram=2000, disk=10000)
    x = [ns.file_id(f"c/x{i}.bin") for i in range(4)]
    for f in x[:3]:
        read_all(cache, f)                          # RAM: x1, x2; disk: x0 (demoted)
    assert cache.state(x[0]) == "disk"
    gen1 = int(cache.entries.gen[x[0]])
    gate = threading.Event()
    cache.disk.delete_gate[("c/x0.bin", gen1)] = gate
    t = threading.Thread(target=lambda: read_all(cache, x[0]))  # promotes x0; its old entry's delete waits
    t.start()
    for _ in range(1000):
        if cache.state(x[0]) == "ram":
            break
        t.join(0.01)
    assert cache.state(x[0]) == "ram" and cache.disk_index.dying_bytes == 1000  # still on disk: counted
    # x0 goes back to disk as a newer generation while the delete of the old one is still pending
    assert read_all(cache, x[2]) == (spec["c/x2.bin"], "ram")
    assert read_all(cache, x[3]) == (spec["c/x3.bin"], "miss")   # RAM evicts x0 -> disk
    assert cache.state(x[0]) == "disk"
    gen2 = int(cache.entries.gen[x[0]])
    assert gen2 > gen1 and len(entry_files(cache, "c/x0.bin")) == 2
    gate.set()
    t.join(10)
    assert len(entry_files(cache, "c/x0.bin")) == 1
    assert read_all(cache, x[0]) == (spec["c/x0.bin"], "disk")
    assert cache.corrupt_entries == 0
    assert not set(cache.ram_index.sizes) & set(cache.disk_index.sizes)
    assert cache.disk_index.dying_bytes == 0


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), RuntimeError("a bug in the tier")])
def test_any_failure_of_a_disk_write_releases_its_reservation(small_tree, tmp_path, error):
    src, spec = small_tree
    cache, ns, backend = build(src, tmp_path, "lru", ram=0, disk=100000)
    cache.disk.put_error = error
    rel = "dog/04.bin"
    assert read_all(cache, ns.file_id(rel)) == (spec[rel], "miss")   # the reader never sees it
    idx = cache.disk_index
    assert (idx.used_bytes, idx.reserved_bytes, idx.dying_bytes, len(idx)) == (0, 0, 0, 0)
    assert cache.disk_write_errors == 1 and cache.state(ns.file_id(rel)) == "absent"
    assert os.listdir(cache.disk.tmp_dir) == []
    cache.disk.put_error = None
    assert read_all(cache, ns.file_id(rel)) == (spec[rel], "miss")
    assert read_all(cache, ns.file_id(rel)) == (spec[rel], "disk")


def test_handle_api(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, _ = build(src, tmp_path, "lru", ram=0, disk=100000)
    rel = "cat/03.bin"
    f = ns.file_id(rel)
    assert cache.open_nowait(f) is None and cache.counters()["opens"] == 0   # absent: nothing counted
    h = cache.open(f)
    assert (h.outcome, h.size) == ("miss", len(spec[rel]))
    h.release()
    h = cache.open_nowait(f)                         # an NVMe hit, served without waiting
    assert h.outcome == "disk" and h.source == "entry"
    fd = h.backing_fd()
    assert os.pread(fd, h.size + 10, 0) == spec[rel]
    assert h.read(10, 100) == spec[rel][10:110]
    assert h.read(h.size - 5, 100) == spec[rel][-5:] and h.read(h.size, 10) == b""
    h.release()
    h.release()                                      # idempotent
    assert h.backing_fd() is None
    with pytest.raises(OSError):
        os.fstat(fd)
    with pytest.raises(OSError):
        h.read(0, 1)
    c = cache.counters()
    assert (c["opens"], c["hits_disk"], c["misses"]) == (2, 1, 1)


def test_prefetch_shares_the_single_flight_and_reports_the_tier(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, backend = build(src, tmp_path, "static", ram=3000, disk=5000)
    assert cache.prefetch(ns.file_id("dog/00.bin")) == "ram"
    assert cache.prefetch(ns.file_id("dog/00.bin")) == "resident"
    assert cache.prefetch(ns.file_id("dog/04.bin")) == "disk"
    assert cache.prefetch(ns.file_id("dog/08.bin")) == "rejected"    # 9000 bytes: no tier admits it
    assert cache.counters()["opens"] == 0 and len(backend.reads) == 2
    assert read_all(cache, ns.file_id("dog/04.bin")) == (spec["dog/04.bin"], "disk")


def test_open_nowait_ticket_serves_a_miss_without_a_second_lookup(small_tree, tmp_path):
    """D8: the ticket carries the lookup (lead a fetch, or join one) to the thread that may block."""
    from shadefs.cache.core import OpenTicket

    src, spec = small_tree
    cache, ns, backend = build(src, tmp_path, "lru", ram=0, disk=100000)
    rel = "cat/05.bin"
    f = ns.file_id(rel)
    assert cache.open_nowait(f) is None                      # without a ticket: as before
    t = cache.open_nowait(f, ticket=True)
    assert isinstance(t, OpenTicket) and (t.fid, t.size) == (f, len(spec[rel]))
    assert cache.counters()["opens"] == 0 and cache.state(f) == "fetching"   # it leads the fetch
    # a second open while the first is not served: it joins the same flight, one backend read
    t2 = cache.open_nowait(f, ticket=True)
    assert isinstance(t2, OpenTicket) and backend.reads == []
    calls = []
    real_decide = cache._decide
    cache._decide = lambda *a: calls.append(a) or real_decide(*a)   # the worker decides nothing again
    h = cache.open_ticket(t)
    h2 = cache.open_ticket(t2)
    assert calls == []
    assert (h.read(0, h.size), h.outcome) == (spec[rel], "miss")
    assert (h2.read(0, h2.size), h2.outcome) == (spec[rel], "miss")
    h.release()
    h2.release()
    c = cache.counters()
    assert (c["opens"], c["misses"], c["joined"], c["backend_reads"]) == (2, 2, 1, 1)
    assert backend.reads == [rel]
    with pytest.raises(ValueError):
        cache.open_ticket(t)                                 # exactly once
    h = cache.open_nowait(f, ticket=True)                    # a hit is a Handle, never a ticket
    assert h.outcome == "disk" and h.read(0, h.size) == spec[rel]
    h.release()
    assert cache.counters()["opens"] == 3


def test_an_open_joining_a_prefetched_files_admission_is_counted_late(small_tree, tmp_path):
    """The first open takes a completed prefetch (``ready``) and fills the disk tier with its bytes; an open
    of the same file meanwhile waits for that fill and is counted ``late``: every open has exactly one
    outcome (opens == hits + ready + late + misses)."""
    import numpy as np

    from shadefs.plan.plans import PlanRegistry
    from shadefs.plan.prefetch import Prefetcher

    src, spec = small_tree
    cache, ns, backend = build(src, tmp_path, "lru", ram=0, disk=100000)
    plans = PlanRegistry(ns.num_files, cache.lock)
    pf = Prefetcher(cache, plans, 100000, concurrency=0)
    cache.attach_plans(plans, pf)
    rel = "cat/05.bin"
    f = ns.file_id(rel)
    table, _ = plans.register(None, np.arange(ns.num_files, dtype=np.int64))
    plans.announce(table, 0, 0, [1], np.array([f], dtype=np.uint32))
    assert pf.step() and f in pf.staged and backend.reads == [rel]
    cache.disk.put_gate[rel] = threading.Event()
    cache.disk.put_entered[rel] = threading.Event()
    out = []
    t1 = threading.Thread(target=lambda: out.append(read_all(cache, f)))
    t1.start()
    assert cache.disk.put_entered[rel].wait(10)   # the first open is admitting the prefetched bytes
    t2 = threading.Thread(target=lambda: out.append(read_all(cache, f)))
    t2.start()
    fl = cache._flights[f]
    for _ in range(1000):
        if fl.done._cond._waiters:
            break
        t2.join(0.01)
    assert len(fl.done._cond._waiters) == 1        # the second open waits for that admission
    cache.disk.put_gate[rel].set()
    t1.join(10)
    t2.join(10)
    assert all(data == spec[rel] for data, _ in out)
    assert sorted(outcome for _, outcome in out) == ["late", "prefetch"]
    s = cache.stats()
    assert (s["opens"], s["prefetch"]["ready"], s["prefetch"]["late"], s["misses"]) == (2, 1, 1, 0)
    assert s["opens"] == s["hits"]["ram"] + s["hits"]["disk"] + s["prefetch"]["ready"] + s["prefetch"]["late"] \
        + s["misses"]
    assert cache.counters()["joined"] == 0 and backend.reads == [rel]   # one backend read: the prefetch's
    assert read_all(cache, f) == (spec[rel], "disk")


def small_files(tmp_path, n=4):
    src = tmp_path / "src"
    (src / "c").mkdir(parents=True)
    spec = {f"c/x{i}.bin": bytes([i + 1]) * 1000 for i in range(n)}
    for rel, data in spec.items():
        (src / rel).write_bytes(data)
    return src, spec


def wait_state(cache, f, want):
    for _ in range(1000):
        if cache.state(f) == want:
            return True
        threading.Event().wait(0.01)
    return False


@pytest.mark.parametrize("mover", [False, True], ids=["inline", "mover"])
def test_a_victim_never_waits_for_the_backend_read_that_evicted_it(tmp_path, mover):
    src, spec = small_files(tmp_path)
    cache, ns, backend = build(src, tmp_path, "lru", ram=1000, disk=10000)
    if mover:
        cache.start_background()
    a, b = ns.file_id("c/x0.bin"), ns.file_id("c/x1.bin")
    assert read_all(cache, b) == (spec["c/x1.bin"], "miss")     # RAM: b
    gate = backend.read_gate["c/x0.bin"] = threading.Event()
    t = threading.Thread(target=read_all, args=(cache, a))     # RAM admits a, evicting b; a's read is held
    t.start()
    try:
        assert backend.reading.wait(10)
        out = []
        tb = threading.Thread(target=lambda: out.append(read_all(cache, b)))
        tb.start()
        tb.join(5)
        assert not tb.is_alive() and not gate.is_set()          # b's open returned while a's read is held
        assert out[0][0] == spec["c/x1.bin"] and out[0][1] in ("ram", "disk")
    finally:
        gate.set()
        t.join(10)
    assert wait_state(cache, b, "disk") and cache.state(a) == "ram"
    cache.close()
    c = cache.counters()
    assert (c["opens"], c["misses"], c["demotions"], c["backend_reads"]) == (3, 2, 1, 2)


def test_a_promotion_never_waits_for_its_victims_disk_write(tmp_path):
    src, spec = small_files(tmp_path)
    cache, ns, backend = build(src, tmp_path, "lru", ram=1000, disk=10000)
    cache.start_background()
    x0, x1 = ns.file_id("c/x0.bin"), ns.file_id("c/x1.bin")
    read_all(cache, x0)
    read_all(cache, x1)                                          # x0 demoted by the mover
    assert wait_state(cache, x0, "disk")
    gate = cache.disk.put_gate["c/x1.bin"] = threading.Event()   # x1's demotion write is held
    entered = cache.disk.put_entered["c/x1.bin"] = threading.Event()
    out = []
    t = threading.Thread(target=lambda: out.append(read_all(cache, x0)))  # promotes x0, evicting x1
    t.start()
    try:
        t.join(5)
        assert not t.is_alive() and not gate.is_set()           # the opening thread did not write x1
        assert out == [(spec["c/x0.bin"], "disk")] and cache.state(x0) == "ram"
        assert entered.wait(10) and cache.state(x1) == "moving"  # the mover writes it meanwhile
        assert read_all(cache, x1) == (spec["c/x1.bin"], "ram")  # served from its bytes in memory
    finally:
        gate.set()
    assert wait_state(cache, x1, "disk")
    cache.close()
    c = cache.counters()
    assert (c["promotions"], c["demotions"], c["backend_reads"]) == (1, 2, 2)
    assert len(entry_files(cache, "c/x0.bin")) == 0 and cache.disk_index.dying_bytes == 0
    assert read_all(cache, x1) == (spec["c/x1.bin"], "disk")      # after close: moves are done inline
    assert cache.state(x1) == "ram" and cache.state(x0) == "disk" and cache.disk_index.dying_bytes == 0
