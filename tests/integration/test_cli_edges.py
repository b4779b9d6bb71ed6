"""Edges a new user meets at the command line: a missing bucket, a busy unmount, a live stats view."""
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import require
from shadefs.cmdutil import is_mounted
from shadefs.testing.mounts import pid_alive, shadefs, wait_pid_gone


@pytest.mark.parametrize("args", [["--backend", "obstore"], ["--backend", "fsspec"],
                                  ["--backend", "obstore", "--backend-opt", "listing=obstore"]],
                         ids=["obstore", "fsspec", "obstore-listing"])
def test_a_missing_bucket_is_a_refusal_naming_the_bucket_and_the_endpoint(moto_server, tmp_path, fuse, args):
    require("obstore.store")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = shadefs("mount", "s3://shadefs-no-such-bucket/ds", mnt, "--backend-opt",
                f"endpoint_url={moto_server.endpoint}", "--log-file", tmp_path / "log", *args, check=False)
    assert r.returncode == 2, r
    assert r.stdout == ""
    assert r.stderr.splitlines()[-1] == (f"shadefs: error: bucket 'shadefs-no-such-bucket' does not exist at "
                                         f"{moto_server.endpoint}")
    assert not os.path.ismount(mnt)


def test_stats_watch_prints_count_samples_with_the_interval_rates(mount, small_tree):
    src, files = small_tree
    m = mount(src, "--ram-cache", "1MiB")
    name = sorted(files)[0]
    with open(os.path.join(m.path, name), "rb") as f:
        f.read()
    r = shadefs("stats", m.path, "--watch", "0.2", "--count", "3", timeout=60)
    tables = r.stdout.split("\n\n")
    assert len(tables) == 3, r.stdout
    for i, table in enumerate(tables):
        lines = table.splitlines()
        assert lines[0].startswith(f"{m.path}  ") and lines[0].endswith("every 0.2 s (Ctrl-C ends)")
        # the one open before the watch, nothing since
        assert "opens           1  (= hits + prefetched + misses: 0 + 0 + 1)" in lines
        if i == 0:
            assert lines[-1] == "last -        (first sample)"
        else:
            assert re.fullmatch(r"last 0\.\d s     0\.0 opens/s, hit ratio -, backend read 0 B/s", lines[-1]), lines
    j = shadefs("stats", m.path, "--watch", "0.1", "--count", "2", "--json", timeout=60)
    docs = [json.loads(line) for line in j.stdout.splitlines()]
    assert len(docs) == 2 and [d["opens"] for d in docs] == [1, 1] and [d["misses"] for d in docs] == [1, 1]


def test_stats_count_without_watch_is_refused(mount, small_tree):
    src, _ = small_tree
    m = mount(src)
    r = shadefs("stats", m.path, "--count", "2", check=False)
    assert r.returncode == 2 and r.stderr == "shadefs: error: --count needs --watch\n"
    r = shadefs("stats", m.path, "--watch", "0", check=False)
    assert r.returncode == 2 and "seconds must be a finite number > 0" in r.stderr


def test_umount_of_a_busy_mount_names_the_holders_and_force_detaches_it(mount, small_tree, tmp_path):
    src, files = small_tree
    m = mount(src, "--ram-cache", "1MiB")
    name = sorted(files)[0]
    held = os.path.join(m.path, name)
    holder = subprocess.Popen([sys.executable, "-c", "import sys; f = open(sys.argv[1], 'rb'); print('open', flush=True); "
                               "sys.stdin.read()", held], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=str(tmp_path))
    try:
        assert holder.stdout.readline() == "open\n"
        r = shadefs("umount", m.path, check=False)
        assert r.returncode == 2, r
        assert r.stderr.startswith(f"shadefs: error: {m.path} is busy: held by pid {holder.pid} ({sys.executable} -c ")
        assert f": open file {held})" in r.stderr
        assert r.stderr.endswith(f"run: shadefs umount --force {m.path} (detaches the mount at once and ends its "
                                 "daemon: those processes' next access to it fails, ENOTCONN)\n")
        assert len(r.stderr.splitlines()) == 1
        assert is_mounted(m.path) and pid_alive(m.pid)

        f = shadefs("umount", "--force", m.path, check=False)
        assert f.returncode == 0, f
        assert f.stderr.startswith(f"shadefs: {m.path} is busy: held by pid {holder.pid} (")
        assert f"; detached it\nshadefs: ending the daemon of {m.path} (pid {m.pid}): its mount was busy" in f.stderr
        assert not is_mounted(m.path)
        assert wait_pid_gone(m.pid, timeout=10)
    finally:
        holder.kill()
        holder.wait()
