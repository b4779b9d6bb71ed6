"""What the CLI tells a user about the mount it made: the tiers and policy in the "mounted" line, a warning
when nothing is cached, sizes the machine cannot give refused or warned, the metrics port it picked; a
dead daemon named as dead; no stale control sockets left behind; progress while a slow source is scanned."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from conftest import SHADEFS, is_mounted
from shadefs.sysinfo import memory_limit
from shadefs.testing.mounts import wait_for

pytestmark = pytest.mark.usefixtures("fuse")


def one_line_error(r, rc=2):
    assert r.returncode == rc, (r.returncode, r.stderr, r.stdout)
    assert r.stderr.count("\n") == 1, r.stderr
    return r.stderr


def refused_mount(cli, *args):
    """``shadefs mount ARGS`` expected to be refused; a mount it made all the same is unmounted."""
    r = cli("mount", *args, check=False)
    mp = str(args[1])
    if is_mounted(mp):
        cli("umount", mp, check=False)
    return r


# -- the "mounted" line, sizes the machine cannot give --------------------------------------------------------
def test_mounted_line_names_tiers_and_policy_and_warns_when_nothing_is_cached(small_tree, tmp_path, mount):
    src, _ = small_tree
    m = mount(src)
    assert f"(pid {m.pid}, policy static, RAM tier off, disk tier off, log " in m.result.stdout
    assert m.result.stderr == ("shadefs: warning: no cache tier is on (RAM tier 0, no disk tier): every open reads "
                               "the source; give --ram-cache SIZE and/or --disk-cache DIR --disk-cache-size SIZE\n")
    cache = tmp_path / "cache"
    m2 = mount(src, "--ram-cache", "64KiB", "--disk-cache", cache, "--disk-cache-size", "1MiB", "--policy", "lru")
    assert (f"(pid {m2.pid}, policy lru, RAM tier 64.0 KiB, disk tier 1.0 MiB in {cache}/"
            in m2.result.stdout)
    assert m2.result.stderr == ""


def test_a_ram_tier_larger_than_the_memory_is_refused_before_the_fork(small_tree, tmp_path, cli):
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    limit, what = memory_limit()
    r = refused_mount(cli, src, mp, "--ram-cache", str(2 * limit), "--log-file", tmp_path / "m.log")
    assert one_line_error(r).startswith(f"shadefs: error: --ram-cache ")
    assert f"is more than {what} (" in r.stderr
    assert not is_mounted(mp) and not (tmp_path / "m.log").exists()  # refused before the fork


def test_a_ram_percentage_larger_than_the_memory_is_refused(tmp_path, cli):
    src = tmp_path / "src"
    src.mkdir()
    limit, what = memory_limit()
    with open(src / "huge.bin", "wb") as f:  # sparse: the source's bytes, none on disk
        f.truncate(2 * limit)
    mp = tmp_path / "mp"
    mp.mkdir()
    r = refused_mount(cli, src, mp, "--ram-cache", "100%", "--log-file", tmp_path / "m.log")
    assert one_line_error(r).startswith("shadefs: error: --ram-cache 100% of the source's ")
    assert f"more than {what} (" in r.stderr
    assert not is_mounted(mp)


def test_a_disk_tier_larger_than_the_free_space_is_warned(small_tree, tmp_path, mount):
    src, _ = small_tree
    cache = tmp_path / "cache"
    cache.mkdir()
    fs = os.statvfs(cache)
    size = 4 * fs.f_blocks * fs.f_frsize  # more than the whole filesystem
    m = mount(src, "--disk-cache", cache, "--disk-cache-size", str(size))
    assert m.result.stderr.startswith("shadefs: warning: the disk tier (")
    assert f") is larger than the room on the filesystem of {cache} (" in m.result.stderr
    assert m.result.stderr.endswith("free): it will hold at most that much\n")
    assert m.result.stderr.count("\n") == 1


def test_metrics_port_0_prints_the_chosen_port(small_tree, mount):
    src, _ = small_tree
    m = mount(src, "--ram-cache", "1MiB", "--metrics-port", "0")
    line = [ln for ln in m.result.stdout.splitlines() if "Prometheus" in ln]
    assert len(line) == 1 and line[0].startswith("shadefs: Prometheus metrics on http://127.0.0.1:")
    port = int(line[0].rsplit(":", 1)[1].split("/")[0])
    assert port > 0
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert b"shadefs_" in resp.read()


@pytest.mark.parametrize("cache_dir,kind", [("/proc/shadefs-cache", "proc"), ("/sys/shadefs-cache", "sysfs"),
                                            ("/dev/shadefs-cache", "devtmpfs")])
def test_a_cache_dir_on_a_pseudo_filesystem_is_refused_before_the_fork(small_tree, tmp_path, cli, cache_dir, kind):
    if kind == "devtmpfs" and not any(line.split()[1:3] == ["/dev", "devtmpfs"]
                                      for line in open("/proc/self/mounts")):
        pytest.skip("/dev is not a devtmpfs here")
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    try:
        r = refused_mount(cli, src, mp, "--disk-cache", cache_dir, "--disk-cache-size", "1MiB",
                          "--log-file", tmp_path / "m.log")
    finally:
        if kind == "devtmpfs" and os.path.isdir(cache_dir):
            import shutil

            shutil.rmtree(cache_dir)  # what a mount that was not refused wrote there
    assert one_line_error(r) == (f"shadefs: error: cache directory '{cache_dir}' is on {kind}, a pseudo filesystem "
                                 "that cannot hold a cache; choose a directory on a disk (NVMe) filesystem\n")
    assert not is_mounted(mp) and not os.path.exists(cache_dir) and not (tmp_path / "m.log").exists()
