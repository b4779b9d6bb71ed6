"""Real FUSE mounts through the real CLI: bytes, exact counters, errors, unmount and signals."""
import errno
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import is_mounted
from mountutil import LockedPages, disk_budget, pid_gone, read, source_passthrough

from shadefs.testing import pid_alive

pytestmark = [pytest.mark.usefixtures("fuse"),  # skipped without /dev/fuse + fusermount3; failed under CI=true
              pytest.mark.both_frontends]  # every test that mounts runs on both front ends


def test_every_file_equals_the_source_byte_for_byte(small_tree, mount):
    src, spec = small_tree
    m = mount(src, "--ram-cache", "20000", "--policy", "lru")
    listed = sorted(os.path.relpath(os.path.join(d, f), m.path) for d, _, fs in os.walk(m.path) for f in fs)
    assert listed == sorted(spec)
    for _ in range(3):
        for rel, data in spec.items():
            assert read(os.path.join(m.path, rel)) == data
            assert os.stat(os.path.join(m.path, rel)).st_size == len(data)


def test_stats_counters_are_exact_for_a_scripted_sequence(small_tree, mount, tmp_path):
    src, spec = small_tree
    # RAM 3000 B (static): 00 (1000) and 01 (2000) fit; disk 3447 device bytes for entries: 02 (3000, a
    # record of 64 + 3000 bytes) fits; the rest miss.
    m = mount(src, "--ram-cache", "3000", "--disk-cache", tmp_path / "cache", "--disk-cache-size",
              str(disk_budget(3447)), "--no-kernel-cache")
    seq = ["dog/00.bin", "cat/01.bin", "dog/02.bin", "cat/03.bin",   # 4 cold misses
           "dog/00.bin", "cat/01.bin", "dog/02.bin", "cat/03.bin",   # ram, ram, disk, miss
           "dog/00.bin"]                                              # ram
    for rel in seq:
        assert read(os.path.join(m.path, rel)) == spec[rel]
    s = m.stats()
    assert set(s) == {"policy", "uptime_s", "opens", "hits", "misses", "hit_ratio", "byte_hit_ratio",
                      "backend_bytes", "source_passthrough_bytes", "corrupt_entries", "tiers", "namespace",
                      "prefetch", "descriptors", "memory"}
    d = s["descriptors"]   # no file is open: none held, none refused
    assert (d["reserve"], d["held"], d["refused"], d["failed"]) == (64, 0, 0, 0) and 0 < d["open"] < d["limit"]
    mem = s["memory"]
    assert set(mem) == {"rss_bytes", "peak_rss_bytes", "bound_bytes", "ram_tier", "fill_buffers",
                        "loose_buffers", "prefetch_window", "per_file_bytes"}
    assert mem["per_file_bytes"] > 0
    parts = ("ram_tier", "fill_buffers", "loose_buffers", "prefetch_window")
    assert mem["bound_bytes"] == sum(mem[p]["bound_bytes"] for p in parts)
    assert mem["ram_tier"]["bound_bytes"] == s["tiers"]["ram"]["capacity_bytes"]
    assert mem["fill_buffers"]["used_bytes"] == 0 and mem["fill_buffers"]["bound_bytes"] == 64 << 20
    assert 0 < mem["rss_bytes"] <= mem["peak_rss_bytes"]
    assert s["namespace"]["files"] == 10 and s["namespace"]["directories"] == 3
    assert set(s["namespace"]["skipped"].values()) == {0}
    assert s["policy"] == "static"
    assert s["opens"] == 9 and s["hits"] == {"ram": 3, "disk": 1} and s["misses"] == 5
    assert s["hit_ratio"] == pytest.approx(4 / 9)
    total = sum(len(spec[r]) for r in seq)
    hit_bytes = 1000 + 2000 + 3000 + 1000
    assert s["byte_hit_ratio"] == pytest.approx(hit_bytes / total)
    # 03 (4000) is admitted by no tier: with passthrough to the source file (the kernel front end's
    # default for a directory source) each of its two opens is answered by it, the kernel reads the
    # source file and the daemon none of it; the libfuse front end (or a kernel that offers no FUSE
    # passthrough, its log says so) reads it through the daemon
    if source_passthrough(m) == "untiered":
        assert (s["backend_bytes"], s["source_passthrough_bytes"]) == (1000 + 2000 + 3000, 4000 + 4000)
    else:
        assert (s["backend_bytes"], s["source_passthrough_bytes"]) == (1000 + 2000 + 3000 + 4000 + 4000, 0)
    assert s["corrupt_entries"] == 0
    assert s["tiers"]["ram"] == {"used_bytes": 3000, "capacity_bytes": 3000, "files": 2, "evictions": 0}
    # a packed record is charged its 64-byte header, its bytes and an eighth of both (its share of the
    # segments' slack)
    assert s["tiers"]["disk"] == {"used_bytes": 3447, "capacity_bytes": disk_budget(3447), "files": 1,
                                  "evictions": 0, "overhead_bytes": disk_budget(0), "dying_bytes": 0,
                                  "metadata_bytes": disk_budget(0) - (192 << 10), "slack_bytes": 192 << 10,
                                  "entry_bytes": 3447, "pack_below": 64 << 10}


def test_percent_sizes_resolve_against_source_bytes(small_tree, mount):
    src, spec = small_tree
    total = sum(len(v) for v in spec.values())  # 55000
    m = mount(src, "--ram-cache", "20%")
    assert m.stats()["tiers"]["ram"]["capacity_bytes"] == int(0.2 * total)


def test_errors_enoent_erofs(small_tree, mount):
    src, spec = small_tree
    m = mount(src, "--ram-cache", "1MiB")
    with pytest.raises(FileNotFoundError):
        os.open(os.path.join(m.path, "cat/nope.bin"), os.O_RDONLY)
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_CREAT):
        with pytest.raises(OSError) as e:
            os.open(os.path.join(m.path, "cat/01.bin"), flags)
        assert e.value.errno == errno.EROFS
    with pytest.raises(OSError) as e:
        os.mkdir(os.path.join(m.path, "new"))
    assert e.value.errno == errno.EROFS
    with pytest.raises(OSError) as e:
        os.unlink(os.path.join(m.path, "cat/01.bin"))
    assert e.value.errno == errno.EROFS


def test_backend_failure_is_eio_and_the_daemon_keeps_serving(small_tree, mount):
    src, spec = small_tree
    m = mount(src, "--ram-cache", "1MiB")
    assert read(os.path.join(m.path, "dog/00.bin")) == spec["dog/00.bin"]  # now cached
    with open(os.path.join(src, "cat/05.bin"), "ab") as f:  # the source changed under the mount
        f.write(b"more")
    with pytest.raises(OSError) as e:
        read(os.path.join(m.path, "cat/05.bin"))
    assert e.value.errno == errno.EIO
    os.unlink(os.path.join(src, "cat/07.bin"))
    with pytest.raises(FileNotFoundError):
        read(os.path.join(m.path, "cat/07.bin"))
    assert read(os.path.join(m.path, "dog/00.bin")) == spec["dog/00.bin"]
    assert read(os.path.join(m.path, "cat/03.bin")) == spec["cat/03.bin"]
    log = m.log()
    assert "cat/05.bin" in log and "changed under the mount" in log
    assert "Traceback" not in log


def test_unreachable_backend_is_eio_hits_keep_serving(small_tree, mount, tmp_path):
    """The source is itself a FUSE mount whose daemon dies (like an NFS server going away)."""
    src, spec = small_tree
    inner = mount(src, "--ram-cache", "0", name="inner")
    outer = mount(inner.path, "--ram-cache", "1MiB", name="outer")
    assert read(os.path.join(outer.path, "dog/00.bin")) == spec["dog/00.bin"]
    os.kill(inner.pid, signal.SIGKILL)
    pid_gone(inner.pid)  # its mount is dead now: every request to it fails
    with pytest.raises(OSError) as e:
        read(os.path.join(outer.path, "cat/01.bin"))
    assert e.value.errno == errno.EIO
    assert read(os.path.join(outer.path, "dog/00.bin")) == spec["dog/00.bin"]  # hit: still served
    subprocess.run(["fusermount", "-uz", inner.path], capture_output=True)


def test_umount_leaves_no_mount_and_the_daemon_exits(small_tree, mount, cli):
    src, _ = small_tree
    m = mount(src)
    assert is_mounted(m.path)
    cli("umount", m.path)
    assert not is_mounted(m.path)
    assert m.umount() is None  # waits for the pid; None: the daemon exited within 30 s
    assert not pid_alive(m.pid)  # gone, or a zombie its reaper has not collected yet


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_unmounts(small_tree, mount, sig):
    src, spec = small_tree
    m = mount(src)
    assert read(os.path.join(m.path, "dog/00.bin")) == spec["dog/00.bin"]
    os.kill(m.pid, sig)
    deadline = time.monotonic() + 10
    while is_mounted(m.path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_mounted(m.path)


def test_readdir_lists_only_the_source(small_tree, mount):
    src, spec = small_tree
    m = mount(src)
    assert sorted(os.listdir(m.path)) == ["cat", "dog"]
    assert os.getxattr(m.path, "user.shadefs.endpoint").decode().startswith(("ipc://", "tcp://"))
    assert os.getxattr(os.path.join(m.path, "cat/01.bin"), "user.shadefs.endpoint")


@pytest.mark.parametrize("args,message", [
    (["--ram-cache", "12XB"], "invalid size"),
    (["--ram-cache", "150%"], "percentage"),
    (["--policy", "belady"], "unknown policy"),
    (["--disk-cache-size", "1GiB"], "needs --disk-cache"),
    (["--control", "tcp://10.1.2.3:5555"], "loopback"),
    (["--ram-cache", "-5MiB"], "invalid size '-5MiB': a size cannot be negative"),
    (["--ram-cache", "-5"], "cannot be negative"),
    (["--ram-cache", "abc"], "invalid size 'abc'"),
    (["--ram-cache", "1.5"], "whole number"),
    (["--ram-cache", ""], "invalid size ''"),
    (["--disk-cache-size"], "expected one argument"),
    (["--disk-min-free", "101%"], "--disk-min-free"),
    (["--checkpoint-interval", "-1"], "--checkpoint-interval"),
    (["--checkpoint-interval", "nan"], "--checkpoint-interval"),
    (["--backend-timeout", "-1"], "--backend-timeout -1: seconds must be a finite number >= 0"),
    (["--backend-timeout", "inf"], "--backend-timeout inf"),
    (["--metrics-port", "70000"], "--metrics-port 70000"),
    (["--metrics-port", "-1"], "--metrics-port -1"),
    (["--backend", "fsspec"], "--backend fsspec: chooses the client of an object-store URL"),
    (["--backend", "native"], "invalid choice: 'native'"),
])
def test_mount_rejects_bad_arguments_in_one_line(small_tree, tmp_path, cli, args, message):
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    r = cli("mount", src, mp, *args, check=False)
    assert r.returncode == 2
    assert message in r.stderr and r.stderr.count("\n") == 1
    assert not is_mounted(mp)


def test_mount_preflight_errors(small_tree, tmp_path, cli, mount):
    src, _ = small_tree
    mp = tmp_path / "mp"
    r = cli("mount", tmp_path / "missing", mp, check=False)
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = cli("mount", src, mp, check=False)
    assert r.returncode == 2 and "mountpoint" in r.stderr
    mp.mkdir()
    (mp / "x").write_text("x")
    r = cli("mount", src, mp, check=False)
    assert r.returncode == 2 and "not empty" in r.stderr
    m = mount(src)
    r = cli("mount", src, m.path, check=False)
    assert r.returncode == 2 and "already mounted" in r.stderr
    ro = tmp_path / "ro"
    ro.write_text("a file, not a directory")
    mp2 = tmp_path / "mp2"
    mp2.mkdir()
    r = cli("mount", src, mp2, "--disk-cache", ro / "sub", "--disk-cache-size", "1MiB", check=False)
    assert r.returncode == 2 and "not writable" in r.stderr


@pytest.mark.parametrize("source_mode", ["untiered", "off"])
def test_a_file_larger_than_every_tier_streams_byte_exactly(tmp_path, mount, source_mode):
    import hashlib

    src = tmp_path / "big"
    src.mkdir()
    blob = os.urandom(1 << 20) * 70  # 70 MiB: above the 64 MiB streaming threshold
    (src / "shard.tar").write_bytes(blob)
    m = mount(src, "--ram-cache", "1MiB", "--source-passthrough", source_mode)
    h = hashlib.sha256()
    with open(os.path.join(m.path, "shard.tar"), "rb") as f:
        f.seek(5)
        assert f.read(10) == blob[5:15]
        f.seek(0)
        while chunk := f.read(1 << 20):
            h.update(chunk)
    assert h.hexdigest() == hashlib.sha256(blob).hexdigest()
    s = m.stats()
    if source_passthrough(m) == "untiered":
        # no tier would take any of its 8 MiB chunks: the open is answered by passthrough to the source
        # file, counted one miss of the file; the kernel reads it, the daemon none of it
        assert (s["opens"], s["misses"], s["tiers"]["ram"]["files"]) == (1, 1, 0)
        assert (s["backend_bytes"], s["source_passthrough_bytes"]) == (0, len(blob))
        return
    # through the daemon (--source-passthrough off, or the libfuse front end): cached by chunks of 8 MiB:
    # nine chunk entries, each opened (a miss) and read from the source once
    assert s["opens"] == 9 and s["misses"] == 9 and s["tiers"]["ram"]["files"] == 0
    assert (s["backend_bytes"], s["source_passthrough_bytes"]) == (len(blob), 0)


def test_an_untiered_file_is_read_again_from_the_kernels_pages(tmp_path, mount):
    """A file no tier admits keeps its kernel pages between opens (the mount is a snapshot): its second
    open is still counted (a miss), but none of its reads reach the daemon, so the backend serves its
    bytes once. A file that fills a tier is read once too (then a RAM hit). Through the daemon
    (``--source-passthrough off``); with passthrough to the source file the kernel reads the source
    file's own pages (tests/integration/test_source_passthrough.py)."""
    src = tmp_path / "src"
    src.mkdir()
    big, small = os.urandom(3 << 20), os.urandom(5000)
    (src / "big.bin").write_bytes(big)
    (src / "small.bin").write_bytes(small)
    m = mount(src, "--ram-cache", "64KiB", "--source-passthrough", "off")
    path = os.path.join(m.path, "big.bin")
    # The kernel's proactive reclaim (DAMON pageout, see LockedPages) may drop the file's clean pages
    # between a close and the next open, and a re-read would then reach the daemon: the pages are locked
    # while the file is re-read. Locking them on the miss's own open faults them in by its READs (served
    # from the one 3 MiB chunk that handle reads), before anything reads them.
    fd = os.open(path, os.O_RDONLY)
    try:
        pages = LockedPages(fd)
    except BaseException:
        os.close(fd)
        raise
    with pages:  # unmapped at the end (a mapping left would keep the mount busy)
        try:
            assert os.read(fd, len(big) + 1) == big
        finally:
            os.close(fd)
        s = m.stats()
        assert (s["opens"], s["misses"], s["backend_bytes"]) == (1, 1, len(big))
        for _ in range(2):
            assert read(path) == big
            fd = os.open(path, os.O_RDONLY)
            try:
                assert os.pread(fd, 10_000, (2 << 20) + 123) == big[(2 << 20) + 123:(2 << 20) + 10_123]
            finally:
                os.close(fd)
        s = m.stats()
    assert (s["opens"], s["misses"]) == (5, 5)
    # no READ of the four re-opens reached the daemon (one would stream the whole 3 MiB chunk again; an
    # open answered without keep_cache would drop the pages, and every later read would)
    assert s["backend_bytes"] == len(big)
    assert s["tiers"]["ram"]["files"] == 0
    for _ in range(3):
        assert read(os.path.join(m.path, "small.bin")) == small
    s = m.stats()
    assert (s["opens"], s["hits"]["ram"], s["backend_bytes"]) == (8, 2, len(big) + len(small))
