"""Ctrl-C during ``shadefs mount``: SIGINT at each point of the start, from the first line of the entry
point to the moment before the "mounted" line, ends with ONE line on stderr, exit status 130, nothing
mounted and no daemon process left.

The points are deterministic: ``SHADEFS_TESTING_PAUSE=POINT:FILE`` (testing only,
:func:`shadefs.config.pause_point`) makes the process that reaches POINT (the command or its daemon)
write its pid to FILE and wait there; the test then sends SIGINT to the command."""
import os
import re
import signal
import subprocess
import sys

import pytest

from shadefs import registry
from shadefs.cmdutil import is_mounted
from shadefs.config import PAUSE_POINTS
from shadefs.testing.mounts import force_unmount, wait_for, wait_pid_gone

LINE = re.compile(r"^shadefs: interrupted; (stopped the daemon \(pid \d+\), )?nothing is mounted( at \S+)?$")


def processes_naming(text: str):
    """Pids of the processes whose command line contains ``text`` (the daemon is a fork of the command,
    so it carries the command's argv)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    out.append(int(name))
        except OSError:
            pass
    return out


@pytest.mark.parametrize("point", PAUSE_POINTS)
def test_sigint_at_each_point_of_the_start_leaves_nothing(tmp_path, fuse, point):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.bin").write_bytes(b"x" * 1000)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    flag = tmp_path / "paused"
    env = {**os.environ, "SHADEFS_TESTING_PAUSE": f"{point}:{flag}"}
    cmd = [sys.executable, "-m", "shadefs", "mount", str(src), str(mnt), "--ram-cache", "1MiB",
           "--log-file", str(tmp_path / "daemon.log")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert wait_for(flag.exists, timeout=60), f"{point} never reached"
        paused = int(flag.read_text())
        assert (paused == proc.pid) == point.startswith("cli-")  # the command's points, or the daemon's
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    try:
        assert proc.returncode == 130, (out, err)
        assert out == ""
        lines = err.splitlines()
        assert len(lines) == 1 and LINE.match(lines[0]), err
        if point.startswith("daemon-") or point in ("cli-forked", "cli-ready"):
            assert "stopped the daemon" in lines[0]
        assert not is_mounted(mnt)
        assert wait_pid_gone(paused, timeout=10)
        assert processes_naming(str(mnt)) == []
        assert registry.lookup(str(mnt), alive_only=False) is None
    finally:
        if is_mounted(mnt):
            force_unmount(mnt)
        for pid in processes_naming(str(mnt)):
            os.kill(pid, signal.SIGKILL)

