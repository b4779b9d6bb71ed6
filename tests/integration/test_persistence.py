"""The NVMe tier and the importance scores survive a restart and a crash (kill -9): entries are
reloaded without reading data, checked against the new snapshot, and serve disk hits from the first
open; stale, partial and foreign entries and unfinished writes are dropped; budgets hold. (A kill -9 and
the remount that clears the dead mount: test_faults.py.)"""
import hashlib
import os
import signal
import time

import numpy as np
import pytest

from conftest import is_mounted, run_cli
from mountutil import disk_budget, force_unmount, pid_gone, read, wait_for
from shadefs.cache import persist
from shadefs.cache.tiers import DiskTier

pytestmark = pytest.mark.usefixtures("fuse")  # skipped without /dev/fuse + fusermount3; failed under CI=true


def ns_dir(cache, src):
    return os.path.join(str(cache), hashlib.sha256(str(src).encode()).hexdigest()[:16])


def entry(cache, src, rel):
    """The one entry file of ``rel`` (``<sha256>.<generation>.<checksum>``)."""
    h = DiskTier.key(rel)
    shard = os.path.join(ns_dir(cache, src), h[:2])
    found = [n for n in os.listdir(shard) if n.startswith(h + ".")]
    assert len(found) == 1, found
    return os.path.join(shard, found[0])


def entries(cache, src):
    d = ns_dir(cache, src)
    return sorted(os.path.join(d, s, e) for s in os.listdir(d) if len(s) == 2 for e in os.listdir(os.path.join(d, s)))


def remount(m, *args):
    """Mount ``m.source`` again at ``m.path`` (same log file; the fixture still unmounts it at teardown);
    returns the CLI's CompletedProcess."""
    return m.start(*args).result


def stop(m):
    m.umount()
    assert not is_mounted(m.path)


def epoch(m, spec):
    for rel, data in sorted(spec.items()):
        assert read(os.path.join(m.path, rel)) == data


def disk_args(cache, size="100%"):
    return ("--ram-cache", "0", "--disk-cache", str(cache), "--disk-cache-size", size, "--no-kernel-cache",
            "--disk-pack-below", "0")


def test_restart_serves_disk_hits_from_the_first_open(small_tree, mount, tmp_path):
    src, spec = small_tree
    cache = tmp_path / "cache"
    m = mount(src, *disk_args(cache))
    epoch(m, spec)
    assert m.stats()["tiers"]["disk"]["files"] == 10
    # each entry carries the source file's mtime, so a reload needs one stat per entry
    for rel in spec:
        assert os.stat(entry(cache, src, rel)).st_mtime_ns == os.stat(src / rel).st_mtime_ns
        assert os.stat(entry(cache, src, rel)).st_mode & 0o777 == 0o600
    assert os.stat(ns_dir(cache, src)).st_mode & 0o777 == 0o700
    stop(m)
    remount(m)
    s = m.stats()
    # device bytes: each entry file takes whole 4 KiB blocks; 100% holds them and the tier's metadata
    assert s["tiers"]["disk"] == {"used_bytes": 18 * 4096, "capacity_bytes": s["tiers"]["disk"]["capacity_bytes"],
                                  "files": 10, "evictions": 0, "overhead_bytes": disk_budget(0, packed=False),
                                  "dying_bytes": 0, "metadata_bytes": disk_budget(0, packed=False),
                                  "slack_bytes": 0, "pack_below": 0,
                                  "entry_bytes": s["tiers"]["disk"]["capacity_bytes"] - disk_budget(0, packed=False)}
    epoch(m, spec)
    s = m.stats()
    assert s["hits"]["disk"] == 10 and s["misses"] == 0 and s["backend_bytes"] == 0
    assert "disk tier: reloaded 10 entries (55000 bytes)" in m.log()
    assert "Traceback" not in m.log()


@pytest.mark.parametrize("manifest", [True, False], ids=["clean-restart", "no-manifest"])
def test_reload_drops_stale_partial_foreign_entries_and_unfinished_writes(small_tree, mount, tmp_path, manifest):
    src, spec = small_tree
    cache = tmp_path / "cache"
    m = mount(src, *disk_args(cache))
    epoch(m, spec)
    stop(m)
    d = ns_dir(cache, src)
    # 1. the source changed: same size, new bytes, new mtime -> stale
    changed = os.urandom(len(spec["cat/03.bin"]))
    with open(src / "cat/03.bin", "wb") as f:
        f.write(changed)
    os.utime(src / "cat/03.bin", ns=(1_600_000_000 * 10**9, 1_600_000_000 * 10**9))
    spec["cat/03.bin"] = changed
    # 2. the source file is gone -> stale
    os.unlink(src / "dog/08.bin")
    del spec["dog/08.bin"]
    # 3. a partial entry (mtime intact, bytes missing, as a power loss can leave) -> corrupt
    e5 = entry(cache, src, "cat/05.bin")
    mtime = os.stat(e5).st_mtime_ns
    with open(e5, "r+b") as f:
        f.truncate(10)
    os.utime(e5, ns=(mtime, mtime))
    # 4. foreign files: a misnamed file in a shard, an entry in the wrong shard, a directory
    shard = os.path.dirname(entry(cache, src, "dog/00.bin"))
    open(os.path.join(shard, "not-an-entry"), "w").close()
    wrong = "ff" if not shard.endswith("ff") else "fe"
    os.makedirs(os.path.join(d, wrong), exist_ok=True)
    open(os.path.join(d, wrong, "0" * 64), "w").close()
    os.makedirs(os.path.join(shard, "a" * 64))
    # 5. an unfinished write
    open(os.path.join(d, "tmp", "123.4"), "wb").write(b"partial")
    assert os.path.exists(os.path.join(d, persist.INDEX_FILE))  # written at unmount
    if not manifest:  # as after a crash before the first checkpoint: every entry is stat'ed
        os.unlink(os.path.join(d, persist.INDEX_FILE))
    remount(m)
    log = m.log()
    # the previous manifest was taken, and the new daemon wrote its own as soon as it served
    rows = wait_for(lambda: os.path.exists(os.path.join(d, persist.INDEX_FILE))
                    and len(persist.read_index(os.path.join(d, persist.INDEX_FILE))[1]))
    assert rows == (8 if manifest else 7)
    if manifest:
        # sizes come from the manifest: the partial entry is caught at its first read instead
        assert "reloaded 8 entries" in log and "9 from the manifest, 0 stat'ed" in log
        assert "dropped 2 stale, 3 corrupt, 0 over budget, 1 unfinished writes" in log
    else:
        assert "reloaded 7 entries" in log and "0 from the manifest, 9 stat'ed" in log
        assert "dropped 2 stale, 4 corrupt, 0 over budget, 1 unfinished writes" in log
    assert len(entries(cache, src)) == (8 if manifest else 7) and os.listdir(os.path.join(d, "tmp")) == []
    epoch(m, spec)
    s = m.stats()
    assert s["misses"] == 2 and s["hits"]["disk"] == 7  # cat/03 (changed) and cat/05 (partial) re-read
    assert run_cli("stats", m.path).returncode == 0


def test_a_smaller_budget_on_restart_holds_and_deletes_the_excess(small_tree, mount, tmp_path):
    src, spec = small_tree
    cache = tmp_path / "cache"
    m = mount(src, *disk_args(cache))
    epoch(m, spec)
    stop(m)
    budget = disk_budget(20000, packed=False)
    m.args = list(disk_args(cache, str(budget)))
    remount(m)
    t = m.stats()["tiers"]["disk"]
    assert 0 < t["used_bytes"] <= 20000 and t["capacity_bytes"] == budget and t["evictions"] == 0
    on_disk = entries(cache, src)
    assert len(on_disk) == t["files"] and sum(os.stat(p).st_blocks * 512 for p in on_disk) == t["used_bytes"]
    assert "over budget" in m.log()
    epoch(m, spec)  # everything still correct
    assert m.stats()["hits"]["disk"] == t["files"]


def test_lru_order_survives_a_restart(small_tree, mount, tmp_path):
    src, spec = small_tree
    cache = tmp_path / "cache"
    m = mount(src, *disk_args(cache, str(disk_budget(3 * 4096, packed=False))), "--policy", "lru")
    for rel in ("dog/00.bin", "cat/01.bin", "dog/02.bin"):  # one 4 KiB block each, oldest first
        read(os.path.join(m.path, rel))
        time.sleep(0.05)  # distinct ctimes (the kernel's coarse clock ticks every few ms)
    stop(m)
    remount(m)
    # one more block with none free: LRU evicts the oldest (00), not the newer (01, 02)
    read(os.path.join(m.path, "cat/03.bin"))
    assert m.stats()["tiers"]["disk"]["evictions"] == 1
    assert read(os.path.join(m.path, "dog/02.bin")) == spec["dog/02.bin"]
    assert read(os.path.join(m.path, "cat/01.bin")) == spec["cat/01.bin"]
    assert read(os.path.join(m.path, "dog/00.bin")) == spec["dog/00.bin"]
    s = m.stats()
    assert s["hits"]["disk"] == 2 and s["misses"] == 2


def test_importance_is_checkpointed_and_restored_after_kill_9(small_tree, mount, tmp_path):
    src, spec = small_tree
    cache = tmp_path / "cache"
    m = mount(src, *disk_args(cache), "--policy", "shade", "--checkpoint-interval", "0.2")
    from shadefs.control.client import ControlClient, find_endpoint

    with ControlClient(find_endpoint(m.path)) as c:
        c.send_scores(["dog/00.bin", "cat/01.bin", "dog/02.bin"], [3.0, 1.0, 2.0])
        c.stats()
    path = os.path.join(ns_dir(cache, src), persist.SCORES_FILE)
    wait_for(lambda: os.path.exists(path))
    paths, values = persist.read_scores(path)
    got = dict(zip(paths, values.tolist()))
    # the rank transform: ln(10 + rank of the loss in its minibatch)
    assert got == pytest.approx({"dog/00.bin": np.log(12.0), "cat/01.bin": np.log(10.0), "dog/02.bin": np.log(11.0)})
    assert os.stat(path).st_mode & 0o777 == 0o600
    os.kill(m.pid, signal.SIGKILL)
    pid_gone(m.pid)
    remount(m)
    assert "importance: restored 3 scores" in m.log()


def test_a_second_daemon_cannot_share_the_same_cache_namespace(small_tree, mount, tmp_path, cli):
    src, _ = small_tree
    cache = tmp_path / "cache"
    mount(src, *disk_args(cache))
    mp2 = tmp_path / "second"
    mp2.mkdir()
    r = cli("mount", src, mp2, *disk_args(cache), check=False)
    try:
        assert r.returncode == 2 and "in use" in r.stderr and r.stderr.count("\n") == 1  # a refusal: one line, exit 2
        assert not is_mounted(mp2)
    finally:
        force_unmount(mp2)


def test_reload_unit_maps_entries_through_the_vectorised_digests(tmp_path):
    """persist.reload_disk_tier without a mount: many paths, some entries valid, the digest cache reused."""
    from shadefs.backends.posix import PosixBackend
    from shadefs.cache.core import TieredCache
    from shadefs.cache.index import TierIndex
    from shadefs.cache.tiers import MemoryTier
    from shadefs.namespace import Namespace
    from shadefs.policies import Importance, get_policy

    src = tmp_path / "src"
    for i in range(300):
        p = src / f"c{i % 7}" / f"{i:04d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(bytes([i % 256]) * (i + 1))

    def build():
        backend = PosixBackend(str(src))
        ns = Namespace(backend.walk())
        imp = Importance(ns.num_files)
        cls = get_policy("lru")
        disk = (TierIndex("disk", 10**6, cls(10**6, imp)), DiskTier(str(tmp_path / "cache"), str(src)))
        return TieredCache(ns, backend, (TierIndex("ram", 0, cls(0, imp)), MemoryTier()), disk, imp), ns

    cache, ns = build()
    for fid in range(0, 300, 3):
        cache.open(fid)
    cache.disk.close()
    for attempt in range(2):  # the second reload reuses pathdigests.bin
        cache, ns = build()
        rep = persist.reload_disk_tier(cache.disk, cache.disk_index, ns)
        assert (rep.loaded, rep.stale, rep.corrupt) == (100, 0, 0)
        assert sorted(cache.disk_index.sizes) == list(range(0, 300, 3))
        assert all(cache.open(fid).outcome == "disk" for fid in range(0, 300, 3))
        cache.disk.close()
    assert os.path.exists(os.path.join(cache.disk.dir, persist.DIGESTS_FILE))
