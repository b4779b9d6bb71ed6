"""Faults on real mounts: the backend going away and coming back, the daemon killed, readers killed
mid-read, a source file changing under the mount, a full or vanishing cache disk. (Malformed arguments:
test_mount.py, test_mount_rejects_bad_arguments_in_one_line.)
The reader sees errors only where data is really unavailable, never wrong bytes."""
import errno
import multiprocessing
import os
import random
import signal
import subprocess
import time

import pytest

from conftest import make_tree
from mountutil import metrics_port, pid_gone, read, scrape, wait_for
from shadefs import metrics as M
from shadefs.cache.segments import SLACK_SHARE

pytestmark = [pytest.mark.usefixtures("fuse"),  # skipped without /dev/fuse + fusermount3; failed under CI=true
              pytest.mark.both_frontends]  # every test that mounts runs on both front ends


def remount(m, *args):
    """Mount ``m.source`` again at ``m.path`` (same log file; the fixture still unmounts it at teardown);
    returns the CLI's CompletedProcess."""
    return m.start(*args).result


def eio_or_enoent(path):
    with pytest.raises(OSError) as e:
        read(path)
    return e.value.errno


# -- the backend goes away, then comes back -------------------------------------------------------

def test_dead_source_daemon_is_eio_hits_serve_and_misses_recover(small_tree, mount):
    """The source is a FUSE mount whose daemon is killed (an NFS server going away), then mounted again."""
    src, spec = small_tree
    inner = mount(src, "--ram-cache", "0", name="inner")
    outer = mount(inner.path, "--ram-cache", "1MiB", "--no-kernel-cache", name="outer")
    assert read(os.path.join(outer.path, "dog/00.bin")) == spec["dog/00.bin"]
    os.kill(inner.pid, signal.SIGKILL)
    pid_gone(inner.pid)
    for _ in range(2):  # a failure is not cached: the next open tries the backend again
        assert eio_or_enoent(os.path.join(outer.path, "cat/01.bin")) == errno.EIO
    assert read(os.path.join(outer.path, "dog/00.bin")) == spec["dog/00.bin"]  # a hit keeps serving
    r = remount(inner)  # clears the dead mount, mounts the same path again
    assert "cleared a stale mount" in r.stderr
    for rel in ("cat/01.bin", "dog/02.bin", "dog/00.bin"):
        assert read(os.path.join(outer.path, rel)) == spec[rel]
    s = outer.stats()
    assert s["opens"] == s["hits"]["ram"] + s["hits"]["disk"] + s["misses"] == 7
    assert "Traceback" not in outer.log()


def test_unmounted_source_is_eio_until_it_is_mounted_again(small_tree, mount, tmp_path):
    """The source is a bind mount that goes away (umount -l) and comes back (mount --bind)."""
    real, spec = small_tree
    source = tmp_path / "nfs"
    source.mkdir()
    subprocess.run(["mount", "--bind", str(real), str(source)], check=True)
    try:
        m = mount(source, "--ram-cache", "1MiB", "--no-kernel-cache")
        assert read(os.path.join(m.path, "dog/00.bin")) == spec["dog/00.bin"]
        subprocess.run(["umount", "-l", str(source)], check=True)
        assert eio_or_enoent(os.path.join(m.path, "cat/01.bin")) == errno.EIO
        assert read(os.path.join(m.path, "dog/00.bin")) == spec["dog/00.bin"]
        assert "unreachable" in m.log()
        subprocess.run(["mount", "--bind", str(real), str(source)], check=True)
        for rel, data in spec.items():
            assert read(os.path.join(m.path, rel)) == data
        # a file really deleted from a reachable source is ENOENT, not EIO
        os.unlink(real / "cat/09.bin")
        m2 = mount(source, "--ram-cache", "0")
        os.unlink(real / "cat/07.bin")
        assert eio_or_enoent(os.path.join(m2.path, "cat/07.bin")) == errno.ENOENT
    finally:
        subprocess.run(["umount", "-l", str(source)], capture_output=True)


# -- the daemon dies ------------------------------------------------------------------------------

def test_kill_9_then_mount_clears_the_stale_mount_in_one_line_and_serves_disk_hits(small_tree, mount, tmp_path):
    src, spec = small_tree
    m = mount(src, "--ram-cache", "20000", "--disk-cache", tmp_path / "cache", "--disk-cache-size", "100%",
              "--policy", "lru")
    for rel, data in spec.items():
        assert read(os.path.join(m.path, rel)) == data
    disk_files = m.stats()["tiers"]["disk"]["files"]
    assert 0 < disk_files < 10
    os.kill(m.pid, signal.SIGKILL)
    pid_gone(m.pid)
    with pytest.raises(OSError) as e:
        os.listdir(m.path)
    # what a reader sees while no daemon serves the mount (ECONNABORTED: a request caught in the abort)
    assert e.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    r = remount(m)
    assert r.stderr.splitlines() == [f"shadefs: cleared a stale mount at {m.path} (its daemon had died)"]
    for rel, data in spec.items():
        assert read(os.path.join(m.path, rel)) == data
    s = m.stats()
    assert s["hits"]["disk"] == disk_files  # the RAM tier was lost with the process; the disk tier was not


# -- readers killed mid-read ----------------------------------------------------------------------

def _slow_reader(paths, seed):
    rng = random.Random(seed)
    while True:
        for p in rng.sample(paths, len(paths)):
            fd = os.open(p, os.O_RDONLY)
            while os.read(fd, 512):
                time.sleep(0.001)
            os.close(fd)


def _fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_readers_killed_mid_read_leak_no_daemon_fds(small_tree, mount, tmp_path):
    src, spec = small_tree
    m = mount(src, "--ram-cache", "30000", "--disk-cache", tmp_path / "cache", "--disk-cache-size", "15000",
              "--policy", "lru")
    paths = [os.path.join(m.path, rel) for rel in sorted(spec)]
    read(paths[0])
    baseline = _fd_count(m.pid)
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(3)
    for epoch in range(3):
        readers = [ctx.Process(target=_slow_reader, args=(paths, epoch * 10 + i), daemon=True) for i in range(6)]
        for p in readers:
            p.start()
        for p in readers:
            time.sleep(rng.uniform(0.02, 0.12))
            os.kill(p.pid, signal.SIGKILL)  # mid-read: it holds an open file of the mount
        for p in readers:
            p.join(10)
            assert p.exitcode == -signal.SIGKILL
    wait_for(lambda: _fd_count(m.pid) <= baseline, timeout=10)
    for rel, data in spec.items():
        assert read(os.path.join(m.path, rel)) == data
    s = m.stats()
    assert s["opens"] == s["hits"]["ram"] + s["hits"]["disk"] + s["misses"]
    assert "Traceback" not in m.log()


# -- the source changes under the mount: the snapshot is the contract -----------------------------

def test_changed_source_file_is_eio_on_a_miss_and_the_snapshot_bytes_on_a_hit(small_tree, mount):
    src, spec = small_tree
    m = mount(src, "--ram-cache", "1MiB", "--no-kernel-cache")
    assert read(os.path.join(m.path, "dog/00.bin")) == spec["dog/00.bin"]  # cached
    for rel in ("dog/00.bin", "cat/03.bin"):
        with open(src / rel, "ab") as f:
            f.write(b"appended")
    assert read(os.path.join(m.path, "dog/00.bin")) == spec["dog/00.bin"]  # the snapshot's bytes
    assert os.stat(os.path.join(m.path, "dog/00.bin")).st_size == len(spec["dog/00.bin"])
    assert eio_or_enoent(os.path.join(m.path, "cat/03.bin")) == errno.EIO  # never a wrong-length file
    with open(src / "cat/05.bin", "wb") as f:
        f.write(spec["cat/05.bin"][:100])  # shrunk
    assert eio_or_enoent(os.path.join(m.path, "cat/05.bin")) == errno.EIO


# -- a full or failing cache disk ----------------------------------------------------------------

@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(size) -> path``: a small real tmpfs (unmounted at teardown)."""
    made = []

    def _make(size):
        d = tmp_path / f"tmpfs{len(made)}"
        d.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(d)], check=True)
        made.append(d)
        return d

    yield _make
    for d in made:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


@pytest.fixture
def big_tree(tmp_path):
    """20 files of 30 KB (600 KB): more than the small tmpfs holds."""
    rng = random.Random(11)
    spec = {f"c{i % 2}/{i:02d}.bin": rng.randbytes(30_000) for i in range(20)}
    return make_tree(tmp_path / "big", spec), spec


def test_full_cache_disk_means_fewer_hits_never_errors(big_tree, tmpfs, mount):
    src, spec = big_tree
    disk = tmpfs("256k")
    m = mount(src, "--ram-cache", "0", "--disk-cache", disk, "--disk-cache-size", "10MiB",
              "--no-kernel-cache", "--metrics-port", "0")
    for _ in range(2):
        for rel, data in sorted(spec.items()):
            assert read(os.path.join(m.path, rel)) == data
    s = m.stats()
    files = s["tiers"]["disk"]["files"]
    record = 64 + 30_000  # a packed record: header and bytes, charged a SLACK_SHARE-th more for the slack
    assert 0 < files < 20 and s["tiers"]["disk"]["used_bytes"] == (record + record // SLACK_SHARE) * files
    assert s["hits"]["disk"] == files and s["misses"] == 40 - files
    metrics = scrape(metrics_port(m))
    # every miss tried to write its file: the ones that fit, and each other miss's failed write (two passes)
    assert metrics[(M.DISK_WRITE_ERRORS, ())] == (40 - files) - files
    log = m.log()
    assert "disk tier write failed" in log and log.count("disk tier write failed") <= 2  # rate-limited
    assert "Traceback" not in log
    assert os.listdir(os.path.join(disk, os.listdir(disk)[0], "tmp")) == []  # no partial leftovers


def test_disk_min_free_keeps_the_floor(big_tree, tmpfs, mount):
    src, spec = big_tree
    disk = tmpfs("1m")
    m = mount(src, "--ram-cache", "0", "--disk-cache", disk, "--disk-cache-size", "10MiB",
              "--disk-min-free", "50%", "--no-kernel-cache", "--metrics-port", "0")
    for rel, data in sorted(spec.items()):
        assert read(os.path.join(m.path, rel)) == data
    st = os.statvfs(disk)
    assert st.f_bavail * st.f_frsize >= 512 * 1024
    metrics = scrape(metrics_port(m))
    files = m.stats()["tiers"]["disk"]["files"]
    assert 0 < files < 20
    assert metrics[(M.DISK_WRITES_REFUSED, ())] == 20 - files and metrics[(M.DISK_WRITE_ERRORS, ())] == 0
    assert "keeping 512.0 KiB free" in m.log()


def test_cache_disk_vanishing_while_mounted_degrades_to_misses(big_tree, tmpfs, mount):
    src, spec = big_tree
    disk = tmpfs("4m")
    m = mount(src, "--ram-cache", "0", "--disk-cache", disk, "--disk-cache-size", "10MiB",
              "--no-kernel-cache", "--metrics-port", "0", "--disk-pack-below", "0")  # entry files
    for rel, data in sorted(spec.items()):
        assert read(os.path.join(m.path, rel)) == data
    assert m.stats()["tiers"]["disk"]["files"] == 20
    subprocess.run(["umount", "-l", str(disk)], check=True)  # the cache disk is gone
    for _ in range(2):
        for rel, data in sorted(spec.items()):
            assert read(os.path.join(m.path, rel)) == data
    s = m.stats()
    assert s["hits"]["disk"] == 0 and s["misses"] == 60
    metrics = scrape(metrics_port(m))
    assert metrics[(M.CORRUPT, ())] == 20  # each entry dropped once, then writes fail
    assert metrics[(M.DISK_WRITE_ERRORS, ())] == 40
