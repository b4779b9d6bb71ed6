"""``python -m shadefs.bench peers``'s plumbing on a few files, one round, through a real moto S3 server, the latency
proxy, real shadefs mounts and the peers installed here: every reader is a row that either ran (its GETs and
HEADs counted at the proxy, per epoch) or says why not; the cacheless readers GET every file every epoch,
shadefs's cold epoch GETs each file once, and its cache never holds more than the budget on the device."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import require, require_fuse

require("torch")
require("moto.server", "boto3")

BENCH = [sys.executable, "-m", "shadefs.bench", "peers"]
FILES, EPOCHS = 20, 2
CONFIGS = ["obstore", "s3torch", "rclone", "s3fs", "transparent", "plan", "plan-nokc", "shade"]


def _installed(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def test_every_reader_runs_or_says_why_and_the_counts_add_up(tmp_path):
    require_fuse()
    out = tmp_path / "peers.json"
    r = subprocess.run([*BENCH, "--files", str(FILES), "--epochs", str(EPOCHS), "--rounds", "1",
                        "--workdir", str(tmp_path / "work"), "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["files"] == FILES and res["budget"] == int(0.2 * res["bytes"])
    assert res["regime"].startswith("regime: reader drops each file's pages after reading it (POSIX_FADV_DONTNEED)")
    runs = {x["config"]: x for x in res["runs"]}
    assert [x["config"] for x in res["runs"]] == CONFIGS  # one round, in the given order

    # the peers: ran where installed, else a row naming what is missing
    expect_missing = {
        "s3torch": None if _installed("s3torchconnector") else "not installed: ",
        "rclone": None if shutil.which("rclone") else "not installed: no rclone on PATH (apt-get install rclone)",
        # s3fs refuses to start unless 5 MB (multipart_size x parallel_count) is free beyond ensure_diskfree,
        # i.e. within the budget: this budget (20 % of 20 files of ~100 kB) is below that
        "s3fs": ("failed to start: s3fs did not mount: exited with 1 before mounting; s3fs: There is no enough "
                 "disk space" if shutil.which("s3fs") else
                 "not installed: no s3fs on PATH (apt-get install s3fs)"),
    }
    if os.environ.get("CI") == "true":  # CI installs every peer (Makefile's APT_PKGS, setup.py's test extra)
        assert {n: w for n, w in expect_missing.items() if w and w.startswith("not installed")} == {}
    for name, why in expect_missing.items():
        if why is None:
            assert [e["epoch"] for e in runs[name]["epochs"]] == list(range(1, EPOCHS + 1)), runs[name]
        else:
            assert runs[name]["status"].startswith(why) and "epochs" not in runs[name]

    # no cache: one GET per sample per epoch, no HEAD
    for name in ("obstore", "s3torch"):
        if "epochs" in runs[name]:
            assert [(e["gets"], e["heads"], e["samples"]) for e in runs[name]["epochs"]] == [(FILES, 0, FILES)] * EPOCHS
    # shadefs transparent: the cold epoch misses every file and GETs each once; a later epoch GETs exactly
    # its misses (the pages were dropped: nothing is served by the kernel)
    eps = runs["transparent"]["epochs"]
    assert [(e["opens"], e["heads"]) for e in eps] == [(FILES, 0)] * EPOCHS and eps[0]["hits"] == 0
    assert [e["gets"] for e in eps] == [FILES - e["hits"] for e in eps]
    # with a plan: every file opened once per epoch, the cold epoch from the bucket
    for name in ("plan", "plan-nokc"):
        eps = runs[name]["epochs"]
        assert [e["opens"] for e in eps] == [FILES] * EPOCHS and eps[0]["hits"] == 0
        assert all(e["heads"] == 0 for e in eps)
    assert len(runs["shade"]["epochs"]) == EPOCHS
    for name in ("transparent", "plan", "plan-nokc", "shade"):
        assert all(0 < e["cache_bytes"] <= res["budget"] and e["rss"] > 0 for e in runs[name]["epochs"])

    # the printed table: one row per reader, in order; a reader that did not run shows its reason
    lines = r.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("reader "))
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[head + 2:head + 2 + len(CONFIGS)]]
    assert [row[0] for row in rows] == CONFIGS
    for row in rows:
        if "status" in runs[row[0]]:
            assert row[1] == runs[row[0]]["status"].split(" | ")[0][:200]
        else:
            assert len(row) == 8 and len(row[1].split(" / ")) == EPOCHS
    assert "shadefs on the cache device: at most" in r.stdout and "(target never above: met)" in r.stdout
