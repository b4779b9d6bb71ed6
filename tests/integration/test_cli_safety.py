"""The CLI as a new user meets it: it never unmounts what it did not mount,
a refused mount changes nothing, every refusal is one line and exit 2, and a hung mount does not hang
``stats`` or ``umount``."""
from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import SHADEFS, is_mounted
from mountutil import children_of, pid_gone, waiting_on_fuse

from shadefs.testing.mounts import wait_for




def one_line_error(r, rc=2):
    assert r.returncode == rc, (r.returncode, r.stderr, r.stdout)
    assert r.stderr.count("\n") == 1, r.stderr
    return r.stderr


# -- item 1: umount refuses what shadefs did not mount ------------------------------------------------
def test_umount_refuses_a_tmpfs_and_leaves_it_mounted(tmp_path, cli):
    t = tmp_path / "t"
    t.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(t)], check=True)
    try:
        (t / "keep").write_text("x")
        r = cli("umount", t, check=False)
        assert one_line_error(r) == (f"shadefs: error: '{t}' is a tmpfs mount (tmpfs), not a shadefs mount; "
                                     "refusing to unmount it\n")
        assert is_mounted(t) and (t / "keep").read_text() == "x"
        r = cli("umount", "--force", t, check=False)
        assert r.returncode == 2 and is_mounted(t)
    finally:
        subprocess.run(["umount", str(t)], check=True)


def test_umount_of_a_plain_directory_says_not_mounted(tmp_path, cli):
    r = cli("umount", tmp_path, check=False)
    assert one_line_error(r) == f"shadefs: error: '{tmp_path}' is not mounted\n"


def test_umount_clears_a_dead_shadefs_mount(small_tree, mount, cli):
    src, _ = small_tree
    m = mount(src)
    os.kill(m.pid, signal.SIGKILL)
    assert pid_gone(m.pid)
    r = cli("umount", m.path)
    assert r.stderr == f"shadefs: cleared a stale mount at {m.path} (its daemon had died)\n"
    assert not is_mounted(m.path)


# -- item 2: a refused mount changes nothing --------------------------------------------------------------
@pytest.mark.parametrize("extra,message", [
    (["--disk-cache", "{mp}/cache", "--disk-cache-size", "1MiB"], "the cache directory must not be inside the mountpoint"),
    (["--trace", "{mp}/trace.csv"], "the --trace file must not be inside the mountpoint"),
    (["--log-file", "{mp}/x.log"], "the --log-file must not be inside the mountpoint"),
    (["--disk-cache", "{tmp}/c", "--disk-cache-size", "1MiB", "--policy", "nope"], "unknown policy"),
    (["--disk-cache", "{tmp}/c", "--disk-cache-size", "1MiB", "--trace", "{tmp}/no/such/t.csv"],
     "--trace '{tmp}/no/such/t.csv': directory '{tmp}/no/such' does not exist"),
])
def test_a_refused_mount_creates_nothing(small_tree, tmp_path, cli, extra, message):
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    fmt = dict(mp=mp, tmp=tmp_path)
    r = cli("mount", src, mp, *[a.format(**fmt) for a in extra], check=False)
    assert message.format(**fmt) in one_line_error(r)
    assert os.listdir(mp) == []
    assert not (tmp_path / "c").exists() and not is_mounted(mp)
    r = cli("mount", src, mp, "--log-file", tmp_path / "ok.log")  # the next mount is not blocked
    cli("umount", mp)


# -- item 3: exit 2 for every refusal; clear messages; --version ------------------------------------------
def test_cache_directory_in_use_is_a_refusal_with_status_2(small_tree, tmp_path, mount, cli):
    src, _ = small_tree
    cache = tmp_path / "cache"
    mount(src, "--disk-cache", cache, "--disk-cache-size", "1MiB")
    mp = tmp_path / "second"
    mp.mkdir()
    r = cli("mount", src, mp, "--disk-cache", cache, "--disk-cache-size", "1MiB", check=False)
    assert "is in use for this source by pid" in one_line_error(r)
    assert not is_mounted(mp)


def test_a_dev_fuse_that_is_not_fuse_is_named(small_tree, tmp_path):
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    # a private mount namespace: /dev/fuse is /dev/null there only
    cmd = (f"mount --bind /dev/null /dev/fuse && exec {sys.executable} -m shadefs mount {src} {mp}")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd], capture_output=True,
                       text=True, timeout=60)
    assert one_line_error(r) == ("shadefs: error: /dev/fuse is not the FUSE device (it is a character device 1,3; "
                                 "FUSE is character device 10,229); in a container pass --device /dev/fuse\n")


def test_fusermount_failure_shows_its_own_message(small_tree, tmp_path):
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    # root without CAP_SYS_ADMIN (as in a default container): mount(2) and the setuid fusermount3 fail
    r = subprocess.run(["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin"] + SHADEFS +
                       ["mount", str(src), str(mp), "--log-file", str(tmp_path / "log")],
                       capture_output=True, text=True, timeout=60)
    assert one_line_error(r, rc=1) == "shadefs: mount failed: fusermount3: mount failed: Operation not permitted\n"
    assert not is_mounted(mp) and os.listdir(mp) == []


def test_stats_outside_a_mount_says_so(tmp_path, cli, monkeypatch):
    monkeypatch.delenv("SHADEFS_ENDPOINT", raising=False)
    r = cli("stats", tmp_path, check=False)
    assert one_line_error(r) == f"shadefs: error: '{tmp_path}' is not inside a shadefs mount\n"


def test_version_prints_the_package_version(cli):
    expected = f"shadefs {importlib.metadata.version('shadefs')}\n"
    assert cli("--version").stdout == expected
    assert cli("version").stdout == expected


# -- item 5: validation before forking; a hung mount; Ctrl-C ----------------------------------------------
def test_a_bad_backend_option_is_named(small_tree, tmp_path, cli):
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    r = cli("mount", src, mp, "--backend-opt", "scan_workers=0", check=False)
    assert one_line_error(r) == ("shadefs: error: --backend-opt: backend option scan_workers=0: must be a whole "
                                 "number >= 1\n")
    r = cli("mount", src, mp, "--backend-opt", "scan_workers=two", check=False)
    assert "scan_workers=two" in one_line_error(r)


def test_a_bad_log_file_is_one_line_before_forking(small_tree, tmp_path, cli):
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    r = cli("mount", src, mp, "--log-file", tmp_path / "missing" / "x.log", check=False)
    assert one_line_error(r) == (f"shadefs: error: --log-file '{tmp_path}/missing/x.log': directory "
                                 f"'{tmp_path}/missing' does not exist\n")
    r = cli("mount", src, mp, "--log-file", tmp_path, check=False)
    assert one_line_error(r) == f"shadefs: error: --log-file '{tmp_path}': Is a directory\n"
    assert not is_mounted(mp)


def test_a_hung_mount_does_not_hang_stats_and_umount_force_clears_it(small_tree, mount, cli):
    src, spec = small_tree
    m = mount(src)
    os.kill(m.pid, signal.SIGSTOP)  # a wedged daemon: every request to the mount now waits forever
    try:
        t0 = time.monotonic()
        r = cli("stats", m.path, "--timeout", "1", check=False, timeout=20)
        assert one_line_error(r) == (f"shadefs: error: the daemon of {m.path} did not answer within 1 s "
                                     "(if it hangs: shadefs umount --force)\n")
        assert time.monotonic() - t0 < 15
        r = cli("umount", "--force", "--timeout", "1", m.path, timeout=30)
        assert r.stderr == f"shadefs: the daemon (pid {m.pid}) did not answer within 1 s; killing it\n"
        assert pid_gone(m.pid) and not is_mounted(m.path)
    finally:
        try:
            os.kill(m.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_umount_force_of_a_healthy_mount_is_a_normal_unmount(small_tree, mount, cli):
    src, _ = small_tree
    m = mount(src)
    r = cli("umount", "--force", m.path)
    assert r.stderr == "" and not is_mounted(m.path)
    assert pid_gone(m.pid)
    assert "final stats" in m.log()  # it exited through its unmount path, not killed


def test_ctrl_c_while_mount_waits_stops_the_daemon(small_tree, tmp_path, mount):
    src, _ = small_tree
    inner = mount(src, name="inner")
    os.stat(inner.path)  # the root's attributes are cached: the CLI's checks pass without the daemon
    os.kill(inner.pid, signal.SIGSTOP)  # the outer daemon's scan of it now waits
    mp = tmp_path / "outer"
    mp.mkdir()
    try:
        # Ctrl-C as from a terminal: SIGINT at its default in the CLI even when this suite was started
        # with it ignored (a job started with & by a non-interactive shell; Python then keeps it ignored)
        p = subprocess.Popen(SHADEFS + ["mount", inner.path, str(mp), "--log-file", str(tmp_path / "o.log")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        # the CLI forked its daemon (a child of p): from then on it waits on the daemon's pipe (a sleep
        # alone could signal a CLI still importing on a loaded machine)
        wait_for(lambda: children_of(p.pid), timeout=60, what="the CLI forked its daemon")
        # the daemon's scan is in the kernel, waiting on the stopped mount (not merely started)
        wait_for(lambda: waiting_on_fuse(p.pid), timeout=60, what="the daemon's scan waits on the stopped mount")
        assert p.poll() is None  # still waiting for the daemon
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 130, (out, err)
        last = err.splitlines(True)[-1]  # after a scan progress line if the machine was slow to signal
        assert last.startswith("shadefs: interrupted; stopped the daemon (pid ")
        pid = int(last.split("(pid ")[1].split(")")[0])
        assert last == f"shadefs: interrupted; stopped the daemon (pid {pid}), nothing is mounted at {mp}\n"
        assert pid_gone(pid)
    finally:
        os.kill(inner.pid, signal.SIGCONT)
    assert not is_mounted(mp)  # (its daemon is gone: nothing can mount there later)
