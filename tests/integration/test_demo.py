"""``make demo``'s script on a tiny Fashion-MNIST tree, through real mounts and daemons: a finished demo
leaves only its daemon logs in its work folder (``--keep`` keeps it all); Ctrl-C unmounts, leaves no daemon
and no training process running, and cleans up."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import require, require_fuse

torch = require("torch")
SOURCE = "/usr/share/datasets/fashion-mnist"
require(f"{SOURCE}/train-images-idx3-ubyte.gz", f"{SOURCE}/t10k-images-idx3-ubyte.gz")

from shadefs import registry  # noqa: E402

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("fm") / "data"
    subprocess.run([sys.executable, str(SCRIPTS / "make_fashion_mnist.py"), str(out), "--limit-train", "200",
                    "--limit-test", "50"], check=True, capture_output=True, timeout=120)
    return out


def demo(data, workdir, *extra, **kw):
    return [sys.executable, str(SCRIPTS / "demo.py"), "--data", str(data), "--workdir", str(workdir),
            "--workers", "1", *extra]


def mounts_under(path) -> list:
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(str(path))]


def processes_naming(path) -> list:
    """Processes (not this one) whose command line names ``path``: a daemon, a trainer, a loader worker."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(path) in cmd:
            found.append((int(pid), cmd))
    return found


def test_a_finished_demo_leaves_nothing_and_keep_keeps_it(data, tmp_path):
    require_fuse()
    work = tmp_path / "work"
    r = subprocess.run(demo(data, work, "--epochs", "1", "--modes", "plan"), capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [p.name for p in work.iterdir()] == ["plan.log"]   # mounts, caches, traces: gone; the log stays
    assert f"the work folder {work} was cleaned up" in r.stdout
    assert f"daemon logs (kept): {work}/plan.log: 0 warnings or errors; 0 corrupt disk entries" in r.stdout
    assert f"the converted dataset stays in {data} (250 images, " in r.stdout
    assert f"to remove it: rm -rf {data} {data}.complete" in r.stdout and "shadefs simulate /" not in r.stdout
    assert "plan         PlanSampler" in r.stdout and data.is_dir()
    kept = tmp_path / "kept"
    r = subprocess.run(demo(data, kept, "--epochs", "1", "--modes", "transparent", "--keep"),
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    names = sorted(p.name for p in kept.iterdir())
    assert names == ["cache-transparent", "mnt-transparent", "transparent.log", "transparent.trace.csv",
                     "transparent.trace.csv.scores.csv", "transparent.train.json"]
    assert f"shadefs simulate {kept}/transparent.trace.csv" in r.stdout
    assert mounts_under(tmp_path) == [] and processes_naming(tmp_path) == []


def test_ctrl_c_unmounts_stops_the_daemon_and_cleans_up(data, tmp_path):
    require_fuse()
    work = tmp_path / "work"
    # a session of its own, like a terminal's foreground job: Ctrl-C is SIGINT to that process group
    proc = subprocess.Popen(demo(data, work, "--epochs", "200", "--modes", "plan"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:                               # wait until it trains through the mount
            lines.append(line)
            if line.startswith("epoch 1/200"):
                break
        else:
            pytest.fail("".join(lines[-30:]))
        mnt = work / "mnt-plan"
        assert mounts_under(work) == [str(mnt)]
        daemon = registry.lookup(str(mnt))
        assert daemon is not None and daemon.alive()
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = "".join(lines) + rest
    assert proc.returncode == 128 + signal.SIGINT, out[-3000:]
    assert "demo: interrupted; unmounted, no daemon left running" in out
    assert mounts_under(work) == []
    deadline = time.monotonic() + 10                           # the daemon is gone, not just unmounted
    while registry.pid_start_time(daemon.pid) == daemon.start_time and time.monotonic() < deadline:
        time.sleep(0.1)
    assert registry.pid_start_time(daemon.pid) != daemon.start_time
    assert processes_naming(work) == []                         # no trainer, no DataLoader worker
    assert [p.name for p in work.iterdir()] == ["plan.log"]     # only the daemon's log
    assert "Traceback" not in out                               # the trainer stops quietly at Ctrl-C
