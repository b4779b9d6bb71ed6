"""Property: for every registered policy, with a RAM and a disk tier of random sizes, under random
sequences of opens and importance updates, no tier ever holds more bytes than its capacity, the bytes
really stored (in the dict, in the directory) equal the accounted bytes, tiers stay exclusive, every
open returns the source bytes, and a restart with a random (smaller) disk budget keeps the budget.
Drives :class:`TieredCache` directly with a real :class:`PosixBackend` and :class:`DiskTier`."""
import os
import random
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadefs.backends.posix import PosixBackend
from shadefs.cache import persist
from shadefs.cache.core import TieredCache
from shadefs.cache.index import TierIndex
from shadefs.cache.tiers import DiskTier, MemoryTier
from shadefs.namespace import Namespace
from shadefs.policies import Importance, get_policy, policy_names
from shadefs.testing.handles import open_read


NUM_FILES = 12


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("budget") / "src"
    rng = random.Random(5)
    spec = {}
    for i in range(NUM_FILES):
        rel = f"c{i % 3}/{i:02d}.bin"
        spec[rel] = rng.randbytes(rng.choice([1, 10, 300, 1000, 2500, 4000, 6000]))
        os.makedirs(root / f"c{i % 3}", exist_ok=True)
        (root / rel).write_bytes(spec[rel])
    return str(root), spec


def build(src, cache_dir, policy, ram, disk, importance=None):
    backend = PosixBackend(src)
    ns = Namespace(backend.walk())
    imp = importance or Importance(ns.num_files)
    cls = get_policy(policy)
    ram_t = (TierIndex("ram", ram, cls(ram, imp)), MemoryTier())
    disk_t = (TierIndex("disk", disk, cls(disk, imp)), DiskTier(cache_dir, src)) if disk else None
    return TieredCache(ns, backend, ram_t, disk_t, imp), ns, imp


def disk_bytes(store: DiskTier) -> int:
    total = 0
    for shard in os.listdir(store.dir):
        if len(shard) == 2:
            for e in os.scandir(os.path.join(store.dir, shard)):
                total += e.stat().st_size
    return total


def check(cache, spec_by_fid):
    ram, disk = cache.ram_index, cache.disk_index
    assert ram.used_bytes + ram.reserved_bytes <= ram.capacity_bytes
    assert ram.used_bytes == sum(len(cache.ram.get(f)) for f in ram.sizes)
    assert ram.used_bytes == sum(len(spec_by_fid[f]) for f in ram.sizes)
    if disk is not None:
        assert disk.used_bytes + disk.reserved_bytes <= disk.capacity_bytes
        assert disk_bytes(cache.disk) == disk.used_bytes
        assert not set(ram.sizes) & set(disk.sizes)


op = st.one_of(
    st.tuples(st.just("open"), st.integers(0, NUM_FILES - 1)),
    st.tuples(st.just("score"), st.lists(st.tuples(st.integers(0, NUM_FILES - 1),
                                                   st.floats(0, 20, allow_nan=False, width=32)),
                                         min_size=1, max_size=5)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(policy=st.sampled_from(policy_names()), ram=st.integers(0, 12_000), disk=st.integers(0, 16_000),
       ops=st.lists(op, min_size=1, max_size=80), restart_disk=st.integers(0, 16_000))
@pytest.mark.slow
def test_tiers_never_exceed_their_budgets(tree, policy, ram, disk, ops, restart_disk):
    src, spec = tree
    cache_dir = tempfile.mkdtemp(prefix="shadefs-budget-")
    try:
        cache, ns, imp = build(src, cache_dir, policy, ram, disk)
        by_fid = {ns.file_id(rel): data for rel, data in spec.items()}
        for kind, arg in ops:
            if kind == "open":
                data, outcome = open_read(cache, arg)
                assert data == by_fid[arg] and outcome in ("ram", "disk", "miss")
            else:
                fids, values = zip(*arg)
                cache.update_importance(np.array(fids, dtype=np.int64), np.array(values, dtype=np.float32))
            check(cache, by_fid)
        s = cache.stats()
        opens = sum(1 for kind, _ in ops if kind == "open")
        assert s["opens"] == opens == s["hits"]["ram"] + s["hits"]["disk"] + s["misses"]
        if cache.disk is None:
            return
        # a restart with another disk budget: the reload keeps it, and what it keeps is on disk
        on_disk = set(cache.disk_index.sizes)
        cache.disk.close()
        cache2, _, _ = build(src, cache_dir, policy, 0, restart_disk, importance=imp)
        if cache2.disk is None:
            return
        rep = persist.reload_disk_tier(cache2.disk, cache2.disk_index, ns)
        check(cache2, by_fid)
        assert set(cache2.disk_index.sizes) <= on_disk
        assert rep.loaded + rep.over_budget == len(on_disk) and rep.stale == rep.corrupt == 0
        for fid in cache2.disk_index.sizes:
            assert open_read(cache2, fid) == (by_fid[fid], "disk")
        cache2.disk.close()
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
