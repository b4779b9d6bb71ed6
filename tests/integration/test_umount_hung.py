"""``shadefs umount`` never reports success while the daemon still runs: a stopped (hung) daemon is an
error, ``--force`` ends it whether its mount is still there or already gone, and two mounts started at
the same instant onto one directory cannot both succeed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from conftest import SHADEFS, is_mounted
from shadefs import cli as shadefs_cli
from shadefs import registry
from shadefs.testing import mounts as _mounts
from shadefs.testing.mounts import pid_alive, wait_pid_gone

pytestmark = pytest.mark.usefixtures("fuse")


def one_line_error(r, rc=2):
    assert r.returncode == rc, (r.returncode, r.stderr, r.stdout)
    assert r.stderr.count("\n") == 1, r.stderr
    return r.stderr


def _cont(pid):
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def test_umount_of_a_stopped_daemon_fails_and_force_ends_it(small_tree, tmp_path, mount, cli):
    src, spec = small_tree
    cache = tmp_path / "cache"
    m = mount(src, "--disk-cache", cache, "--disk-cache-size", "1MiB")
    os.kill(m.pid, signal.SIGSTOP)  # hung: it answers nothing, and cannot exit
    try:
        r = cli("umount", m.path, check=False, timeout=60)
        assert one_line_error(r, rc=1) == (
            f"shadefs: error: unmounted {m.path}, but its daemon (pid {m.pid}) is stopped (SIGSTOP); a new mount "
            f"there is refused until it exits: end it with: shadefs umount --force {m.path}\n")
        assert not is_mounted(m.path) and pid_alive(m.pid)
        r = cli("mount", src, m.path, "--disk-cache", cache, "--disk-cache-size", "1MiB", check=False)
        assert one_line_error(r) == (
            f"shadefs: error: mountpoint '{m.path}' is in use by pid {m.pid}: a shadefs mount there is starting, "
            f"or its daemon has not exited (if it hangs: shadefs umount --force {m.path})\n")
        r = cli("umount", m.path, check=False)
        assert one_line_error(r) == (f"shadefs: error: '{m.path}' is not mounted, but its daemon (pid {m.pid}) "
                                     f"still runs; end it with: shadefs umount --force {m.path}\n")
        r = cli("umount", "--force", "--timeout", "10", m.path, timeout=60)
        assert r.returncode == 0 and r.stderr == (f"shadefs: ending the daemon of {m.path} (pid {m.pid}): its "
                                                  "mount was already gone\n")
        assert not pid_alive(m.pid)
        assert "final stats" in m.log()  # SIGTERM (and SIGCONT): it ended through its unmount path
    finally:
        _cont(m.pid)
    m.start()  # the mountpoint and the cache directory are free again
    with open(os.path.join(m.path, "cat/01.bin"), "rb") as f:
        assert f.read() == spec["cat/01.bin"]


def test_umount_force_of_a_stopped_mounted_daemon_sends_sigterm_first(small_tree, mount, cli):
    src, _ = small_tree
    m = mount(src)
    os.kill(m.pid, signal.SIGSTOP)
    try:
        r = cli("umount", "--force", "--timeout", "5", m.path, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stderr == f"shadefs: the daemon (pid {m.pid}) did not answer within 5 s; killing it\n"
        assert wait_pid_gone(m.pid) and not is_mounted(m.path)
        assert "final stats" in m.log()  # not SIGKILLed: SIGTERM within the grace let it write its checkpoint
    finally:
        _cont(m.pid)


def test_a_daemon_that_ignores_sigterm_is_killed_after_the_grace():
    # what --force does to a daemon whose SIGTERM handling cannot finish: a real process ignoring SIGTERM
    p = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                          "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        entry = registry.Entry(mountpoint="/nowhere", pid=p.pid, start_time=registry.pid_start_time(p.pid),
                               endpoint="ipc:///nowhere")
        assert shadefs_cli._terminate(entry, grace_s=0.5)
        assert p.wait(timeout=10) == -signal.SIGKILL
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("value", ["0", "-1", "inf"])
def test_umount_timeout_must_be_positive(tmp_path, cli, value):
    r = cli("umount", "--force", "--timeout", value, tmp_path, check=False)
    assert one_line_error(r) == (f"shadefs umount: error: argument --timeout: {value}: seconds must be a finite "
                                 "number > 0 (see shadefs umount --help)\n")


def _mounts_at(path) -> int:
    with open("/proc/self/mountinfo") as f:
        return sum(1 for line in f if line.split()[4] == str(path))


def test_two_mounts_started_at_once_onto_one_directory(small_tree, tmp_path, fuse_impl):
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    impl = ["--fuse-impl", fuse_impl] if fuse_impl else []
    procs = [subprocess.Popen(SHADEFS + ["mount", str(src), str(mp), "--log-file", str(tmp_path / f"{i}.log")] + impl,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    pids = [int(out.split("(pid ")[1].split(",")[0]) for rc, out, err in results if rc == 0]
    try:
        assert sorted(rc for rc, _, _ in results) == [0, 2], results
        err = next(err for rc, _, err in results if rc == 2)
        assert err in (f"shadefs: error: mountpoint '{mp}' is already mounted\n",
                       f"shadefs: error: mountpoint '{mp}' is in use by pid {pids[0]}: a shadefs mount there is "
                       f"starting, or its daemon has not exited (if it hangs: shadefs umount --force {mp})\n"), err
        assert _mounts_at(mp) == 1
    finally:
        for _ in range(3):  # both mounted, stacked: one unmount each
            if is_mounted(mp):
                _mounts.unmount(mp)
        for pid in pids:
            if not wait_pid_gone(pid, 10):
                os.kill(pid, signal.SIGKILL)
