"""The NVMe tier on a device of its own: small samples packed into segment files, and --disk-cache-size
bounding the device bytes the tier takes (entries, segments, temporaries, metadata), sampled with
``statvfs`` of the cache directory's own tmpfs while 16 threads read through a real mount; packed
entries survive a remount and serve disk hits with the source's bytes."""
import os
import signal
import random
import threading
import time

import pytest

from mountutil import read
from stressutil import tmpfs, used_bytes

pytestmark = pytest.mark.usefixtures("fuse")  # skipped without /dev/fuse + fusermount3; failed under CI=true

PAGE = 4096


def _needs_root():
    if os.geteuid() != 0:
        from conftest import CI
        (pytest.fail if CI else pytest.skip)("needs root (mounts a tmpfs for the cache directory)")


def _tree(src, n, size, seed):
    rng = random.Random(seed)
    spec = {}
    for i in range(n):
        rel = f"c{i % 8}/{i:05d}.bin"
        os.makedirs(os.path.join(src, f"c{i % 8}"), exist_ok=True)
        data = rng.randbytes(size - 50 + rng.randrange(100))
        with open(os.path.join(src, rel), "wb") as f:
            f.write(data)
        spec[rel] = data
    return spec


@pytest.mark.parametrize("size,files", [(300, 6000), (20_000, 200)], ids=["300B", "20kB"])
def test_device_bytes_stay_within_the_budget_under_16_readers(tmp_path, mount, size, files):
    _needs_root()
    budget = 1 << 20
    src = tmp_path / "src"
    spec = _tree(str(src), files, size, seed=size)  # about 2x (20 kB: 4x) the budget in source bytes
    with tmpfs(tmp_path / "cachefs", "8m") as cdir:
        assert used_bytes(cdir) == 0
        m = mount(src, "--ram-cache", "0", "--disk-cache", cdir, "--disk-cache-size", str(budget),
                  "--policy", "lru", "--no-kernel-cache", "--checkpoint-interval", "0.2")
        peak = [used_bytes(cdir)]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], used_bytes(cdir))
                time.sleep(0.0005)

        names = sorted(spec)
        errors = []

        def reader(k):
            rng = random.Random(k)
            order = names[k::16] + rng.sample(names, len(names) // 16)  # every file once, then a random share
            for rel in order:
                if read(os.path.join(m.path, rel)) != spec[rel]:
                    errors.append(rel)

        sampler = threading.Thread(target=sample)
        sampler.start()
        threads = [threading.Thread(target=reader, args=(k,)) for k in range(16)]
        deadline = time.monotonic() + 200
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(1.0, deadline - time.monotonic()))
        time.sleep(0.5)  # a compaction and a checkpoint after the last read
        stop.set()
        sampler.join()
        assert not any(t.is_alive() for t in threads), "readers did not finish"
        assert not errors
        s = m.stats()
        disk = s["tiers"]["disk"]
        assert peak[0] <= budget + PAGE, (peak[0], budget, disk)
        assert used_bytes(cdir) <= budget + PAGE
        assert disk["evictions"] > 0 and disk["files"] > 0  # the budget was exercised
        assert s["hits"]["disk"] > 0
        m.umount()
        assert used_bytes(cdir) <= budget + PAGE  # the final checkpoint included
        print(f"\n{size} B samples: statvfs used peaked at {peak[0]} B of a {budget} B budget; {disk}")


def test_packed_samples_survive_a_remount_and_serve_disk_hits(small_tree, tmp_path, mount):
    src = tmp_path / "src300"
    spec = _tree(str(src), 300, 300, seed=3)
    big = {f"big/{i}.bin": random.Random(i).randbytes(100_000 + i) for i in range(3)}  # entry files
    os.makedirs(src / "big")
    for rel, data in big.items():
        (src / rel).write_bytes(data)
    cache = tmp_path / "cache"
    args = ("--ram-cache", "0", "--disk-cache", str(cache), "--disk-cache-size", "100%", "--no-kernel-cache")
    m = mount(src, *args)
    every = dict(spec, **big)
    for rel, data in sorted(every.items()):
        assert read(os.path.join(m.path, rel)) == data
    s = m.stats()
    assert s["misses"] == 303 and s["tiers"]["disk"]["files"] == 303
    # one record of header + bytes per sample (charged an eighth more: its share of the segments' slack),
    # no file per sample; the large files' blocks
    assert s["tiers"]["disk"]["used_bytes"] == (sum(64 + len(d) + (64 + len(d)) // 8 for d in spec.values())
                                                + sum(-(-len(d) // PAGE) * PAGE for d in big.values()))
    (ns,) = os.listdir(cache)
    entry_files = [f for d in os.listdir(cache / ns) if len(d) == 2 for f in os.listdir(cache / ns / d)]
    assert len(entry_files) == 3
    segs = os.listdir(cache / ns / "seg")
    assert segs and all(n.endswith(".seg") for n in segs)
    m.umount()
    m.start()
    assert "disk tier: reloaded 303 entries" in m.log()
    for rel, data in sorted(every.items()):
        assert read(os.path.join(m.path, rel)) == data
    s = m.stats()
    assert s["hits"]["disk"] == 303 and s["misses"] == 0 and s["backend_bytes"] == 0


def test_kill_9_while_packing_loses_at_most_unsealed_records_and_serves_no_torn_one(tmp_path, mount):
    from mountutil import pid_gone

    src = tmp_path / "src"
    spec = _tree(str(src), 2000, 2000, seed=9)
    cache = tmp_path / "cache"
    m = mount(src, "--ram-cache", "0", "--disk-cache", str(cache), "--disk-cache-size", "100%",
              "--no-kernel-cache", "--checkpoint-interval", "3600")
    names = sorted(spec)
    stop = threading.Event()

    def reader(k):  # misses that append records while the daemon is killed
        for rel in names[k::4]:
            if stop.is_set():
                return
            try:
                read(os.path.join(m.path, rel))
            except OSError:
                return  # the daemon is gone

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while m.stats()["misses"] < 300 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(m.pid, signal.SIGKILL)
    pid_gone(m.pid)
    stop.set()
    for t in threads:
        t.join(30)
    (ns,) = os.listdir(cache)
    seg_dir = cache / ns / "seg"
    # cut the newest segment in the middle of its last record, as a write the kill interrupted would
    last = sorted(os.listdir(seg_dir))[-1]
    size = os.path.getsize(seg_dir / last)
    if size > 100:
        os.truncate(seg_dir / last, size - 100)
    m.start()
    log = m.log()
    assert "disk tier: reloaded" in log
    for rel in names:
        assert read(os.path.join(m.path, rel)) == spec[rel]
    s = m.stats()
    assert s["corrupt_entries"] >= (1 if size > 100 else 0)  # the cut record: dropped at the reload
    assert s["hits"]["disk"] >= 250  # what was written before the kill is served from the tier
