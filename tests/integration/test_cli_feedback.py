"""What the CLI tells a user about the mount it made: the tiers and policy in the "mounted" line, a warning
when nothing is cached, sizes the machine cannot give refused or warned, the metrics port it picked; a
dead daemon named as dead; no stale control sockets left behind; progress while a slow source is scanned."""
from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest

from conftest import SHADEFS, is_mounted
from mountutil import pid_gone
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


# -- a dead daemon, stale control sockets ------------------------------------------------------------------
DIED = re.compile(r"^shadefs: error: the daemon of (?P<mp>\S+)(?: \(pid (?P<pid>\d+)\))? has died; its mount is dead: "
                  r"run 'shadefs umount (?P=mp)' to clear it, then mount again\n$")


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    """A private runtime directory (``$XDG_RUNTIME_DIR``) for this test's daemons, CLI runs and registry
    reads: ``(dir of sockets, env for the CLI)``."""
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    return xdg / "shadefs", dict(os.environ)


def ipc_path(entry) -> str:
    assert entry.endpoint.startswith("ipc://"), entry.endpoint
    return entry.endpoint[len("ipc://"):]


def test_stats_of_a_killed_daemon_says_it_died_at_once(small_tree, mount, cli, runtime):
    from shadefs import registry

    _, env = runtime
    src, _ = small_tree
    m = mount(src, "--ram-cache", "1MiB", env=env)
    sock = ipc_path(registry.lookup(m.path))
    os.kill(m.pid, signal.SIGKILL)
    assert pid_gone(m.pid)
    # no wait for an answer that cannot come: with a --timeout longer than the subprocess may run, the
    # died line (not a timeout's) is the proof
    r = cli("stats", m.path, "--timeout", "600", check=False, env=env, timeout=120)
    got = DIED.match(one_line_error(r))
    assert got and got["mp"] == m.path and got["pid"] == str(m.pid), r.stderr
    r = cli("warm", m.path, check=False, env=env, timeout=30)
    assert DIED.match(one_line_error(r)), r.stderr
    r = cli("umount", m.path, env=env)
    assert r.stderr == f"shadefs: cleared a stale mount at {m.path} (its daemon had died)\n"
    assert not os.path.exists(sock) and registry.lookup(m.path, alive_only=False) is None


def test_stats_of_a_zombie_daemon_says_it_died(small_tree, tmp_path, cli, runtime):
    from shadefs import registry

    _, env = runtime
    src, _ = small_tree
    mp = tmp_path / "fg"
    mp.mkdir()
    # a foreground daemon, our child: killed and not reaped, it is a zombie with its pid and start time
    p = subprocess.Popen(SHADEFS + ["mount", "-f", str(src), str(mp), "--ram-cache", "1MiB",
                                    "--log-file", str(tmp_path / "fg.log")], env=env)
    try:
        wait_for(lambda: registry.lookup(str(mp)) is not None, timeout=60, what="the daemon registered")
        os.kill(p.pid, signal.SIGKILL)
        wait_for(lambda: open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", timeout=10,
                 what="a zombie")
        r = cli("stats", mp, "--timeout", "600", check=False, env=env, timeout=120)  # (as above)
        got = DIED.match(one_line_error(r))
        assert got and got["pid"] == str(p.pid), r.stderr
    finally:
        p.kill()
        p.wait()
        if is_mounted(mp):
            cli("umount", mp, check=False, env=env)
    assert not is_mounted(mp)


def test_umount_force_leaves_no_control_socket(small_tree, mount, cli, runtime):
    from shadefs import registry

    _, env = runtime
    src, _ = small_tree
    m = mount(src, "--ram-cache", "1MiB", env=env)
    sock = ipc_path(registry.lookup(m.path))
    os.kill(m.pid, signal.SIGSTOP)
    try:
        cli("umount", "--force", "--timeout", "1", m.path, env=env, timeout=30)
        assert pid_gone(m.pid) and not is_mounted(m.path)
    finally:
        try:
            os.kill(m.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert not os.path.exists(sock) and registry.lookup(m.path, alive_only=False) is None


def test_mounting_over_a_dead_mount_clears_its_control_socket(small_tree, mount, runtime):
    from shadefs import registry

    src, _ = small_tree
    _, env = runtime
    m = mount(src, "--ram-cache", "1MiB", env=env)
    old_pid, sock = m.pid, ipc_path(registry.lookup(m.path))
    os.kill(m.pid, signal.SIGKILL)
    assert pid_gone(old_pid)
    m.start()  # the same mountpoint: the CLI clears the dead mount first
    assert m.result.stderr == f"shadefs: cleared a stale mount at {m.path} (its daemon had died)\n"
    assert m.pid != old_pid and not os.path.exists(sock)
    assert os.path.exists(ipc_path(registry.lookup(m.path)))


def test_a_mount_failed_on_a_busy_metrics_port_leaves_no_control_socket(small_tree, tmp_path, cli, runtime):
    import socket

    from shadefs import registry

    sockets, env = runtime
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        r = cli("mount", src, mp, "--ram-cache", "1MiB", "--metrics-port", busy.getsockname()[1],
                "--log-file", tmp_path / "m.log", check=False, env=env)
    finally:
        busy.close()
    assert r.returncode == 1 and "--metrics-port" in r.stderr, r.stderr
    bound = re.search(r"control endpoint ipc://(\S+)", (tmp_path / "m.log").read_text())
    assert bound, "the control server started before the metrics server failed"
    assert not os.path.exists(bound[1])
    assert registry.lookup(str(mp), alive_only=False) is None and not is_mounted(mp)


def test_a_starting_daemon_clears_dead_entries_and_sockets(small_tree, mount, runtime):
    import json
    import socket

    from shadefs import registry

    sockets, env = runtime
    src, _ = small_tree
    sockets.mkdir(mode=0o700)
    (sockets / "mounts").mkdir(mode=0o700)
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(sockets / "0123456789abcdef.sock"))  # closed without unlinking: nobody listens
    dead.close()
    other = sockets / "not-ours.sock"  # not a default socket name: left alone
    o = socket.socket(socket.AF_UNIX)
    o.bind(str(other))
    o.close()
    gone = subprocess.Popen(["true"])
    gone.wait()
    entry = sockets / "mounts" / "deadbeefdeadbeefdeadbeef.json"
    entry.write_text(json.dumps({"mountpoint": "/nowhere", "pid": gone.pid, "start_time": 1,
                                 "endpoint": f"ipc://{sockets}/fedcba9876543210.sock"}))
    m = mount(src, "--ram-cache", "1MiB", env=env)
    assert not (sockets / "0123456789abcdef.sock").exists() and not entry.exists()
    assert other.exists()
    assert os.path.exists(ipc_path(registry.lookup(m.path)))  # its own, live


# -- help, the stats table, --trace ------------------------------------------------------------------------
def test_mount_help_describes_the_command_and_its_arguments(cli):
    r = cli("mount", "--help")
    out = " ".join(r.stdout.split())
    assert "Serve SOURCE read-only at MOUNTPOINT through a cache" in out
    assert "Without size flags nothing is cached." in out
    assert "SOURCE the dataset: a directory (an NFS or local path) or an fsspec URL (s3://bucket/prefix)" in out
    assert "MOUNTPOINT an empty directory; the files appear there read-only" in out
    assert "--trace-overwrite let --trace replace an existing FILE" in out


def test_stats_table_shows_plans_announced_and_withdrawn(small_tree, mount, cli):
    import numpy as np

    from shadefs.control.client import ControlClient, find_endpoint

    src, _ = small_tree
    m = mount(src, "--ram-cache", "1MiB")
    c = ControlClient(find_endpoint(m.path))
    try:
        handle, _ = c.register(["cat/01.bin", "dog/00.bin"])
        c.send_plan(handle, 0, 0, [2], np.array([1, 0], dtype=np.uint32))
        c.send_plan(handle, 1, 0, [2], np.array([0, 1], dtype=np.uint32))
        c.withdraw_plan(handle, 1)
        wait_for(lambda: c.stats()["prefetch"]["plans_withdrawn"] == 1, timeout=10, what="the withdrawal")
    finally:
        c.close()
    r = cli("stats", m.path)
    assert "plans           1 active, 2 announced, 1 withdrawn, 0 retired\n" in r.stdout


def test_trace_refuses_to_overwrite_unless_told(small_tree, tmp_path, mount, cli):
    src, _ = small_tree
    trace = tmp_path / "t.csv"
    trace.write_text("time_s,path,size_bytes,outcome\n0.1,cat/01.bin,2000,miss\n")
    mp = tmp_path / "mp"
    mp.mkdir()
    r = refused_mount(cli, src, mp, "--trace", trace, "--log-file", tmp_path / "m.log")
    assert one_line_error(r) == (f"shadefs: error: --trace '{trace}' exists (56 B); pass --trace-overwrite to "
                                 "replace it, or choose another file\n")
    assert trace.read_text().endswith("0.1,cat/01.bin,2000,miss\n")  # kept
    m = mount(src, "--ram-cache", "1MiB", "--trace", trace, "--trace-overwrite")
    m.stats()  # flushes the trace
    assert trace.read_text() == "time_s,path,size_bytes,outcome\n"
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    mount(src, "--trace", empty)  # an empty file holds no record: no flag needed


# -- a slow or hung source ---------------------------------------------------------------------------------
def test_mount_of_a_hung_source_shows_scan_progress_and_ctrl_c_stops_it(small_tree, tmp_path, mount):
    import threading

    from conftest import make_tree

    src, _ = small_tree
    outer_src = make_tree(tmp_path / "outer-src", {f"a/{i:02d}.bin": b"x" * (i + 1) for i in range(50)})
    hung = outer_src / "zz-hung"
    inner = mount(src, "--ram-cache", "1MiB", name=str(hung.relative_to(tmp_path)))  # a mount inside the source
    os.stat(inner.path)  # its root's attributes are cached: the outer scan stats it, then hangs listing it
    os.kill(inner.pid, signal.SIGSTOP)
    mp = tmp_path / "outer"
    mp.mkdir()
    lines = []
    p = subprocess.Popen(SHADEFS + ["mount", str(outer_src), str(mp), "--log-file", str(tmp_path / "o.log")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        reader = threading.Thread(target=lambda: lines.extend(p.stderr), daemon=True)
        reader.start()
        wait_for(lambda: any("scanning" in ln for ln in lines), timeout=60, what="a scan progress line")
        assert p.poll() is None
        p.send_signal(signal.SIGINT)
        p.wait(timeout=30)
        reader.join(10)
        assert p.returncode == 130, lines
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            p.wait(timeout=30)
        os.kill(inner.pid, signal.SIGCONT)
        if is_mounted(mp):
            subprocess.run(SHADEFS + ["umount", str(mp)], timeout=60)
    progress = re.fullmatch(rf"shadefs: scanning {outer_src}: (\d+) files in (\d+) directories so far "
                            r"\((\d+) s; Ctrl-C stops the mount\)\n", lines[0])
    assert progress, lines
    assert int(progress[1]) == 50 and int(progress[3]) >= 2  # the listed part counted; not before 2 s
    stopped = re.fullmatch(rf"shadefs: interrupted; stopped the daemon \(pid (\d+)\), nothing is mounted at {mp}\n",
                           lines[-1])
    assert stopped, lines
    assert pid_gone(int(stopped[1]))
    assert not is_mounted(mp)  # (its daemon is gone: nothing can mount there later)


def test_a_quick_scan_prints_no_progress(small_tree, mount):
    src, _ = small_tree
    m = mount(src, "--ram-cache", "1MiB")
    assert m.result.stderr == ""


# -- what a budget holds -------------------------------------------------------------------------------------
def test_mount_line_and_stats_table_say_what_the_disk_budget_holds_and_the_opens_add_up(small_tree, tmp_path,
                                                                                          mount, cli):
    from mountutil import disk_budget, read

    src, spec = small_tree
    cache = tmp_path / "cache"
    # room for one record: dog/02.bin, 3000 bytes, charged 64 + 3000 and an eighth of both (3447)
    m = mount(src, "--ram-cache", "0", "--disk-cache", cache, "--disk-cache-size", str(disk_budget(3447)),
              "--no-kernel-cache")
    # 9 pages of metadata (lock, snapshot, path digests, manifest and scores twice, the active segment's
    # tail) and 192 KiB of segment slack (2 x --disk-pack-below of dead records, one segment to copy)
    assert m.result.stdout.splitlines()[1] == (
        "shadefs: disk 231.4 KiB: 36.0 KiB metadata, 192.0 KiB segment slack, 3.4 KiB entries (0 B used), "
        "3.4 KiB free")
    assert m.result.stderr == ""  # metadata is 16 % of the tier: no warning
    for rel in ["dog/02.bin", "dog/00.bin", "dog/02.bin"]:  # a miss that fills the tier, one it refuses, a hit
        assert read(os.path.join(m.path, rel)) == spec[rel]
    out = cli("stats", m.path).stdout.splitlines()
    assert "opens           3  (= hits + prefetched + misses: 1 + 0 + 2)" in out
    assert ("disk 231.4 KiB: 36.0 KiB metadata, 192.0 KiB segment slack, 3.4 KiB entries (3.4 KiB used), "
            "full") in out
    assert not any(line.startswith("ram ") and ":" in line for line in out)  # no RAM tier, no RAM budget line


def test_metadata_over_a_quarter_of_the_disk_tier_is_warned(tmp_path, mount):
    from mountutil import class_tree

    src = tmp_path / "src"
    class_tree(src, 2000, 4, 100, 200, seed=1)  # many small files: their metadata is large next to them
    cache = tmp_path / "cache"
    m = mount(src, "--ram-cache", "0", "--disk-cache", cache, "--disk-cache-size", "25%")
    budget = m.result.stdout.splitlines()[1]
    meta, entries = re.match(r"shadefs: disk [^:]+: ([\d.]+ \w+) metadata, 192.0 KiB segment slack, "
                             r"([\d.]+ \w+) entries \(0 B used\), ", budget).groups()
    (warning,) = m.result.stderr.splitlines()
    assert re.fullmatch(r"shadefs: warning: the disk tier's metadata \([\d.]+ \w+: the snapshot, path digests, "
                        r"manifest and scores of 2000 files\) takes more than a quarter of its [\d.]+ \w+; "
                        rf"{re.escape(entries)} is left for entries: give a larger --disk-cache-size", warning)
    assert warning[len("shadefs: warning: "):] in m.log()  # and in the daemon's log


def test_a_disk_cache_whose_parent_does_not_exist_is_refused(small_tree, tmp_path, cli):
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    cache = tmp_path / "no" / "such" / "cache"
    r = refused_mount(cli, src, mp, "--disk-cache", cache, "--disk-cache-size", "1MiB",
                      "--log-file", tmp_path / "m.log")
    assert one_line_error(r) == (f"shadefs: error: --disk-cache {str(cache)!r}: its parent directory "
                                 f"{str(cache.parent)!r} does not exist; create it first (shadefs creates "
                                 f"only the last folder)\n")
    assert not (tmp_path / "no").exists() and not is_mounted(mp) and not (tmp_path / "m.log").exists()
