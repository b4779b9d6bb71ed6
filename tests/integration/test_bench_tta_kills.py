"""``python -m shadefs.bench tta``'s ways of ending a run early, through real mounts, daemons, a real moto S3 server,
the latency proxy and the real training script on a tiny Fashion-MNIST tree: ``--stop-after``, the run
time limit while the mount lists the bucket and while the training runs, and SIGTERM. Each keeps the run's
record (why it stopped, the epochs it finished) and leaves no mount, daemon, training process or server
behind."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import require, require_fuse

require("torch")
require("moto.server", "s3fs", "boto3", "matplotlib.pyplot")
SOURCE = "/usr/share/datasets/fashion-mnist"
require(f"{SOURCE}/train-images-idx3-ubyte.gz", f"{SOURCE}/t10k-images-idx3-ubyte.gz")

from mountutil import children_of, fashion_tree, mounts_under, processes_naming  # noqa: E402



@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return fashion_tree(tmp_path_factory, 120, 40)


def bench(data, work, *extra):
    return [sys.executable, "-m", "shadefs.bench", "tta", "--data", str(data), "--workdir", str(work),
            "--json", str(work / "tta.json"), "--png", str(work / "tta.png"), "--seeds", "0", "--modes", "shuffle",
            "--workers", "1", *extra]


def finished(data, work, *extra, timeout=240):
    """Run bench_tta to its end: (its stdout, the record of its only run)."""
    r = subprocess.run(bench(data, work, *extra), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout, only_run(work)


def only_run(work) -> dict:
    runs = json.loads((work / "tta.json").read_text())["runs"]
    assert len(runs) == 1
    return runs[0]


def left_behind(root) -> list:
    return mounts_under(root) + processes_naming(root)


def test_stop_after_ends_the_training_after_that_many_epochs_and_unmounts(data, tmp_path):
    require_fuse()
    work = tmp_path / "work"
    out, run = finished(data, work, "--epochs", "6", "--stop-after", "1", "--delay-ms", "1")
    assert run["stopped"] == "after 1 epochs (--stop-after)" and run["partial"] is False
    assert len(run["epochs"]) == 1 and run["mount_s"] is not None
    assert run["gets"] >= 120 and len(run["gets_at_epoch"]) >= 1   # epoch 1 read every image through S3
    assert "stopped: after 1 epochs (--stop-after)" in out
    assert left_behind(tmp_path) == []


def test_a_run_timeout_while_the_mount_lists_the_bucket_stops_the_mount_and_its_daemon(data, tmp_path):
    require_fuse()
    work = tmp_path / "work"
    # 1.5 s each way: the bucket's listing alone takes longer than the run's 2 s
    out, run = finished(data, work, "--epochs", "2", "--delay-ms", "1500", "--run-timeout", "2")
    assert run["stopped"] == "run timeout (mounting)" and run["partial"] is True
    assert run["epochs"] == [] and run["mount_s"] is None and run["limit_s"] == 2
    assert "no run finished an epoch: nothing to report, no picture drawn" in out
    assert not (work / "tta.png").exists()
    assert left_behind(tmp_path) == []


def test_a_run_timeout_while_training_kills_the_training_and_keeps_its_epochs(data, tmp_path):
    require_fuse()
    work = tmp_path / "work"
    # far more epochs than 40 s hold; the mount of 120 objects takes seconds
    _, run = finished(data, work, "--epochs", "400", "--delay-ms", "1", "--run-timeout", "40", timeout=300)
    assert run["stopped"] == "run timeout (40 s)" and run["partial"] is True
    assert run["mount_s"] is not None and 1 <= len(run["epochs"]) < 400
    assert 40 <= run["run_s"] < 40 + 30 + 60   # the limit, the group's grace and the unmount at most
    assert left_behind(tmp_path) == []


def test_sigterm_keeps_the_runs_so_far_and_stops_the_servers(data, tmp_path):
    require_fuse()
    work = tmp_path / "work"
    proc = subprocess.Popen(bench(data, work, "--epochs", "400", "--delay-ms", "1"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out = work / "shuffle-0.json"
    try:
        deadline = time.monotonic() + 180
        while not (out.exists() and json.loads(out.read_text() or "{}").get("epochs")):
            assert proc.poll() is None and time.monotonic() < deadline, "no epoch recorded"
            time.sleep(0.5)
        servers = [p for p, cmd in children_of(proc.pid) if "moto.server" in cmd or "latency_proxy" in cmd]
        assert len(servers) == 2
        assert mounts_under(work) == [str(work / "mnt-shuffle-0")]
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert stderr.count("bench_tta: stopped; the runs so far are kept") == 1
    run = only_run(work)
    assert run["stopped"] == "signal" and run["partial"] is True and len(run["epochs"]) >= 1
    assert left_behind(tmp_path) == []
    for pid in servers:
        assert not os.path.exists(f"/proc/{pid}") or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
