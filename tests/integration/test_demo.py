"""``make demo``'s script on a tiny Fashion-MNIST tree, through real mounts, daemons, a real moto S3 server and
the latency proxy: the default run puts the tree in S3 and prints one table row per mode (direct reader,
transparent, PlanSampler, ShadeSampler) and a PNG; ``--full`` reads the local tree; a finished demo leaves
only its daemon logs and the PNG in its work folder (``--keep`` keeps it all); Ctrl-C unmounts, leaves no
daemon, no training process and no S3 server running, cleans up, and says so in one line."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import require, require_fuse

torch = require("torch")
require("moto.server", "s3fs", "boto3", "matplotlib.pyplot")
SOURCE = "/usr/share/datasets/fashion-mnist"
require(f"{SOURCE}/train-images-idx3-ubyte.gz", f"{SOURCE}/t10k-images-idx3-ubyte.gz")

from mountutil import children_of, fashion_tree, mounts_under, processes_naming  # noqa: E402

from shadefs import registry  # noqa: E402

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
HEADER = ["mode", "sampler", "policy", "epoch times (s)", "train hit ratio", "prefetched", "GETs", "test acc",
          "speed-up"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return fashion_tree(tmp_path_factory, 200, 50)


def demo(data, workdir, *extra):
    return [sys.executable, str(SCRIPTS / "demo.py"), "--data", str(data), "--workdir", str(workdir),
            "--workers", "1", *extra]


def table(stdout: str) -> dict:
    """The summary table: {mode: {column: cell}} (columns split on runs of 2+ spaces)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("=== summary:"))
    head = re.split(r"\s{2,}", lines[start + 1].strip())
    assert head == HEADER
    rows = {}
    for line in lines[start + 3:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != len(head):
            break
        rows[cells[0]] = dict(zip(head, cells))
    return rows


def test_the_default_demo_reads_s3_behind_the_proxy_in_every_mode(tmp_path):
    require_fuse()
    work, small = tmp_path / "work", tmp_path / "small"
    r = subprocess.run(demo(small, work, "--train-images", "60", "--test-images", "20", "--epochs", "2",
                            "--delay-ms", "2"), capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert f"--- building the dataset: 60 training + 20 test images of Fashion-MNIST in {small}" in out
    assert "--- starting the S3 server (python -m moto.server)" in out
    assert "80 objects in s3://shadefs-demo/fmnist/" in out
    assert re.search(r"slow storage: moto's S3 server behind a latency proxy at http://127\.0\.0\.1:\d+, "
                     r"2 ms each way: it stands in for a remote object store", out)
    assert out.count("--- mounting s3://shadefs-demo/fmnist at ") == 3
    # the regime: the job on a mount drops each image's pages after reading it, and says so
    assert out.count("regime: reader drops each file's pages after reading it (POSIX_FADV_DONTNEED)") == 2
    assert len(re.findall(r"train_fashion_mnist\.py .*--drop-pages --data \S+/mnt-", out)) == 3
    # two hit ratios, each named for what it counts: the daemon's (every open) and the table's (training)
    assert out.count("the daemon's counters since the mount (shadefs stats): its \"hit ratio\" counts every "
                     "open, the test set's too; the summary's \"train hit ratio\"") == 3
    assert "img/s" in r.stderr and "hit ratio" in r.stderr and "GETs" in r.stderr  # the epochs' bars
    rows = table(out)
    assert list(rows) == ["direct", "transparent", "plan", "importance"]
    assert [(m["sampler"], m["policy"]) for m in rows.values()] == [
        ("shuffle=True", "(no shadefs)"), ("shuffle=True", "static"), ("PlanSampler", "static"),
        ("ShadeSampler", "shade")]
    direct = rows["direct"]
    assert direct["train hit ratio"] == direct["prefetched"] == "-" and direct["speed-up"] == "1.00x"
    assert int(direct["GETs"]) >= 2 * 60 + 20       # one GET per sample read: 2 epochs and the test set
    for mode, row in rows.items():
        assert len(row["epoch times (s)"].split(", ")) == 2
        assert re.fullmatch(r"\d+\.\d\dx", row["speed-up"]) and re.fullmatch(r"\d+\.\d\d%", row["test acc"])
        if mode != "direct":
            hit, pre = (float(row[k].rstrip("%")) for k in ("train hit ratio", "prefetched"))
            assert 0 <= hit <= 100 and 0 <= pre <= 100 - hit and int(row["GETs"]) > 0
    assert rows["transparent"]["prefetched"] == "0.0%"  # nothing announced: nothing prefetched
    # In the regime every open the tiers miss reads the bucket: with nothing prefetched, the transparent job's
    # GETs (training and test reads) are exactly its daemon's misses. With the pages kept by the kernel, the
    # repeat epoch's misses would be served from the page cache without a GET.
    misses = [int(m) for m in re.findall(r"^misses\s+(\d+)$", out, re.M)]
    assert len(misses) == 3 and misses[0] >= 60  # transparent, plan, importance; epoch 1 misses them all
    assert int(rows["transparent"]["GETs"]) == misses[0]
    assert float(rows["plan"]["prefetched"].rstrip("%")) > 0
    png = work / "demo.png"
    assert f"picture: {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in work.iterdir()) == ["demo.png", "importance.log", "plan.log",
                                                      "transparent.log"]
    assert mounts_under(tmp_path) == [] and processes_naming(tmp_path) == []


def test_full_reads_the_local_tree_and_keep_keeps_it(data, tmp_path):
    require_fuse()
    work = tmp_path / "work"
    # 100 %: a tier for this 200-file tree at a smaller share would be mostly its own metadata (a warning)
    r = subprocess.run(demo(data, work, "--full", "--epochs", "1", "--modes", "plan", "--disk-cache-size", "100%"),
                       capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "S3" not in r.stdout.split("=== summary:")[0]   # no bucket, no proxy: the local tree
    assert f"--- mounting {data} at {work}/mnt-plan" in r.stdout
    row = table(r.stdout)["plan"]
    assert row["GETs"] == "-" and row["speed-up"] == "-" and row["sampler"] == "PlanSampler"
    assert sorted(p.name for p in work.iterdir()) == ["demo.png", "plan.log"]  # mounts, caches, traces: gone
    assert f"the work folder {work} was cleaned up" in r.stdout
    assert f"daemon logs (kept): {work}/plan.log: 0 warnings or errors; 0 corrupt disk entries" in r.stdout
    assert f"the converted dataset stays in {data} (250 images, " in r.stdout
    assert f"to remove it: rm -rf {data} {data}.complete" in r.stdout and "shadefs simulate /" not in r.stdout
    kept = tmp_path / "kept"
    r = subprocess.run(demo(data, kept, "--full", "--epochs", "1", "--modes", "transparent", "--keep"),
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    names = sorted(p.name for p in kept.iterdir())
    assert names == ["cache-transparent", "demo.png", "mnt-transparent", "transparent.log",
                     "transparent.trace.csv", "transparent.trace.csv.scores.csv", "transparent.train.json"]
    assert f"shadefs simulate {kept}/transparent.trace.csv" in r.stdout
    assert mounts_under(tmp_path) == [] and processes_naming(tmp_path) == []


@pytest.mark.parametrize("args, message", [
    (["--full", "--modes", "direct"], "--full reads the local disk: no direct S3 mode"),
    (["--modes", "direct,bogus"], "unknown mode 'bogus'"),
    (["--train-images", "0"], "--train-images must be >= 1"),
])
def test_bad_arguments_are_refused_before_anything_starts(tmp_path, args, message):
    work = tmp_path / "work"
    r = subprocess.run(demo(tmp_path / "none", work, *args), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr
    assert not work.exists()


def test_full_without_the_tree_says_how_to_build_it(tmp_path):
    r = subprocess.run(demo(tmp_path / "none", tmp_path / "work", "--full"), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1
    assert f"{tmp_path}/none has no train/: build it with make dataset" in r.stderr


def test_ctrl_c_unmounts_stops_the_daemon_and_the_s3_server_and_says_so_once(tmp_path):
    require_fuse()
    work, small = tmp_path / "work", tmp_path / "small"
    # a session of its own, like a terminal's foreground job: Ctrl-C is SIGINT to that process group
    proc = subprocess.Popen(demo(small, work, "--train-images", "60", "--test-images", "20", "--epochs", "200",
                                 "--modes", "plan", "--delay-ms", "2"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:                               # wait until it trains through the mount
            lines.append(line)
            if line.startswith("epoch 1/200: train_loss"):
                break
        else:
            pytest.fail("".join(lines[-30:]))
        mnt = work / "mnt-plan"
        assert mounts_under(work) == [str(mnt)]
        daemon = registry.lookup(str(mnt))
        assert daemon is not None and daemon.alive()
        servers = [p for p, cmd in children_of(proc.pid) if "moto.server" in cmd or "latency_proxy" in cmd]
        assert len(servers) == 2
        # Ctrl-C reaches the demo, not the storage: the trainer stops before its source goes away
        assert all(os.getpgid(p) != proc.pid for p in servers)
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = "".join(lines) + rest
    assert proc.returncode == 128 + signal.SIGINT, out[-3000:]
    said = [line for line in rest.replace("\r", "\n").splitlines() if "interrupted" in line]
    assert said == [f"demo: interrupted; unmounted, no daemon left running, the work folder {work} cleaned up"]
    assert "Traceback" not in out
    assert mounts_under(work) == []
    deadline = time.monotonic() + 10                           # the daemon is gone, not just unmounted
    while registry.pid_start_time(daemon.pid) == daemon.start_time and time.monotonic() < deadline:
        time.sleep(0.1)
    assert registry.pid_start_time(daemon.pid) != daemon.start_time
    assert processes_naming(work) == []                         # no trainer, no DataLoader worker
    assert not [p for p in servers if os.path.exists(f"/proc/{p}")]  # moto and the proxy: stopped, reaped
    assert [p.name for p in work.iterdir()] == ["plan.log"]     # only the daemon's log
