"""The mover (shadefs/cache/movers.py): the disk work for files other than the one an open asked for never
runs on the opening thread (a corrupt entry's unlink, a changed file's old entry, a promoted file's old
entry, RAM victims' writes), its queue bound drops victims (never deletes), with exact counts."""
import os
import threading

import numpy as np

from shadefs.backends.posix import PosixBackend
from shadefs.cache.core import TieredCache
from shadefs.cache.index import TierIndex
from shadefs.cache.tiers import DiskTier, MemoryTier
from shadefs.namespace import Namespace
from shadefs.policies import Importance, get_policy
from shadefs.testing.handles import open_read as read_all


class RecordingDisk(DiskTier):
    """A real DiskTier that records which thread deletes each entry and can hold a put or a delete."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.put_gate = {}       # relpath -> Event a put of it waits for
        self.put_entered = {}    # relpath -> Event set when its put starts
        self.delete_gate = None  # Event every delete waits for
        self.deletes = []        # (thread name, relpath, generation)
        self.lock = threading.Lock()

    def put(self, relpath, gen, chunks, size, mtime_ns=None):
        if relpath in self.put_entered:
            self.put_entered[relpath].set()
        if relpath in self.put_gate:
            assert self.put_gate[relpath].wait(10)
        return super().put(relpath, gen, chunks, size, mtime_ns)

    def delete(self, relpath, gen, csum):
        with self.lock:
            self.deletes.append((threading.current_thread().name, relpath, gen))
        if self.delete_gate is not None:
            assert self.delete_gate.wait(10)
        super().delete(relpath, gen, csum)


def tree(tmp_path, spec):
    src = tmp_path / "src"
    for rel, data in spec.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    return src


def build(src, tmp_path, ram, disk, unchecked=False):
    backend = PosixBackend(str(src))
    ns = Namespace(backend.walk())
    if unchecked:  # as a reused snapshot: every record compared with the source at its first open
        ns.unchecked = np.zeros(ns.num_files, dtype=np.bool_)
    imp = Importance(ns.num_files)
    cls = get_policy("lru")
    store = RecordingDisk(str(tmp_path / "cache"), str(src))
    cache = TieredCache(ns, backend, (TierIndex("ram", ram, cls(ram, imp)), MemoryTier()),
                        (TierIndex("disk", disk, cls(disk, imp)), store), imp)
    return cache, ns


def flip(path):
    with open(path, "r+b") as f:
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0xFF]))


def open_on_thread(cache, fid):
    """Open, read and release ``fid`` on a new thread; (thread, out list) after up to 5 s."""
    out = []
    t = threading.Thread(target=lambda: out.append(read_all(cache, fid)), name="reader")
    t.start()
    t.join(5)
    return t, out


def test_a_corrupt_entrys_unlink_runs_on_the_mover_not_the_opening_thread(tmp_path):
    spec = {"c/big.bin": b"B" * 3000}
    src = tree(tmp_path, spec)
    cache, ns = build(src, tmp_path, ram=0, disk=100000)
    cache.start_background()
    f = ns.file_id("c/big.bin")
    assert read_all(cache, f) == (spec["c/big.bin"], "miss") and cache.state(f) == "disk"
    old = cache.disk_entry_path(f)
    flip(old)
    gate = cache.disk.delete_gate = threading.Event()    # the mover's delete of the old entry is held
    t, out = open_on_thread(cache, f)
    try:
        assert not t.is_alive(), "the open waited for the corrupt entry's unlink"
        assert out == [(spec["c/big.bin"], "miss")]        # dropped as corrupt, read again into a new entry
        assert os.path.exists(old) and cache.disk_entry_path(f) != old
        assert cache.disk_index.dying_bytes == 3000          # the old entry: deleting, still counted
    finally:
        gate.set()
    assert cache.mover.wait_idle(10)
    assert not os.path.exists(old) and cache.disk_index.dying_bytes == 0
    assert [(name, rel) for name, rel, _ in cache.disk.deletes] == [("shadefs-mover", "c/big.bin")]
    c = cache.counters()
    assert (c["corrupt_entries"], c["opens"], c["misses"], c["backend_reads"]) == (1, 2, 2, 2)
    cache.close()


def test_a_changed_files_old_entry_is_unlinked_by_the_mover(tmp_path):
    spec = {"c/a.bin": b"A" * 3000}
    src = tree(tmp_path, spec)
    cache, ns = build(src, tmp_path, ram=0, disk=100000, unchecked=True)
    cache.start_background()
    f = ns.file_id("c/a.bin")
    assert read_all(cache, f) == (spec["c/a.bin"], "miss") and cache.state(f) == "disk"
    old = cache.disk_entry_path(f)
    new = b"N" * 3000                                      # rewritten in place, same size, a later mtime
    (src / "c/a.bin").write_bytes(new)
    st = os.stat(src / "c/a.bin")
    os.utime(src / "c/a.bin", ns=(st.st_atime_ns, int(ns.mtimes_ns[f]) + 10**9))
    ns.unchecked[f] = True                                 # its record is compared at the next open
    gate = cache.disk.delete_gate = threading.Event()
    t, out = open_on_thread(cache, f)
    try:
        assert not t.is_alive(), "the open waited for the changed file's old entry's unlink"
        assert out == [(new, "miss")] and os.path.exists(old)
    finally:
        gate.set()
    assert cache.mover.wait_idle(10)
    assert not os.path.exists(old) and cache.disk_index.dying_bytes == 0
    assert [(name, rel) for name, rel, _ in cache.disk.deletes] == [("shadefs-mover", "c/a.bin")]
    assert cache.counters()["source_changes"] == 1
    cache.close()


def test_the_move_queue_bound_drops_victims_never_deletes(tmp_path):
    spec = {f"c/x{i}.bin": bytes([i + 1]) * 1000 for i in range(5)}
    spec["c/big.bin"] = b"B" * 3000                        # larger than RAM: the disk tier only
    src = tree(tmp_path, spec)
    cache, ns = build(src, tmp_path, ram=1000, disk=100000)
    cache.mover.capacity = 2                               # two submissions with victims may wait
    cache.start_background()
    x = [ns.file_id(f"c/x{i}.bin") for i in range(5)]
    big = ns.file_id("c/big.bin")
    assert read_all(cache, big) == (spec["c/big.bin"], "miss") and cache.state(big) == "disk"
    old = cache.disk_entry_path(big)
    flip(old)
    gate = cache.disk.put_gate["c/x0.bin"] = threading.Event()     # the mover is held writing x0
    entered = cache.disk.put_entered["c/x0.bin"] = threading.Event()
    try:
        assert read_all(cache, x[0])[1] == "miss"
        assert read_all(cache, x[1])[1] == "miss"          # x0 -> moving; the mover takes it and is held
        assert entered.wait(10)
        assert read_all(cache, x[2])[1] == "miss"          # x1 -> moving, queued (1 of 2)
        assert read_all(cache, x[3])[1] == "miss"          # x2 -> moving, queued (2 of 2)
        assert cache.mover.pending() == (2, 2)
        assert read_all(cache, x[4])[1] == "miss"          # x3: no room in the queue: dropped at once
        assert [cache.state(f) for f in x] == ["moving", "moving", "moving", "absent", "ram"]
        assert cache.counters()["demotions_skipped"] == 1
        t, out = open_on_thread(cache, big)                # corrupt: its old entry's delete is queued
        assert not t.is_alive() and out == [(spec["c/big.bin"], "miss")]
        assert os.path.exists(old) and cache.disk.deletes == []   # nobody deleted it yet
        assert cache.mover.pending() == (3, 2)             # past the bound: deletes are never dropped
    finally:
        gate.set()
    assert cache.mover.wait_idle(10)
    assert [cache.state(f) for f in x] == ["disk", "disk", "disk", "absent", "ram"]
    assert not os.path.exists(old) and cache.disk_index.dying_bytes == 0
    assert [(name, rel) for name, rel, _ in cache.disk.deletes] == [("shadefs-mover", "c/big.bin")]
    c = cache.counters()
    assert (c["demotions"], c["demotions_skipped"], c["corrupt_entries"]) == (3, 1, 1)
    assert (c["opens"], c["misses"], c["backend_reads"]) == (7, 7, 7)
    a = cache.audit()
    assert a["moving"] == [] and a["fetching"] == [] and a["loose"]["bytes"] == 0
    cache.close()
