"""The demo's simulator hint replays a trace at the mount's real RAM + NVMe bytes."""
import json
import subprocess
import sys

import pytest

from conftest import load_script

demo = load_script("demo")


pytestmark = pytest.mark.slow  # runs a subprocess, an install or a long search


def stats(ram, disk):
    return {"tiers": {"ram": {"capacity_bytes": ram}, "disk": {"capacity_bytes": disk}}}


def test_the_hint_names_the_real_bytes_and_the_limits(tmp_path):
    runs = [{"mode": "transparent", "policy": "static", "trace": "/w/t.csv", "stats": stats(1500, 4500)},
            {"mode": "importance", "policy": "shade", "trace": "/w/i.csv", "stats": stats(1500, 4500)}]
    lines = demo.replay_hint(runs)
    assert lines[1] == ("  shadefs simulate /w/t.csv --cache-size 6000 --policy all"
                        "   # transparent: RAM 1500 + NVMe 4500 bytes")
    assert lines[2] == ("  shadefs simulate /w/i.csv --cache-size 6000 --policy all --scores /w/i.csv.scores.csv"
                        "   # importance: RAM 1500 + NVMe 4500 bytes")
    assert len(lines) == 4 and "not the split between the tiers" in lines[3]
    assert "20%" not in "\n".join(lines)


def test_the_printed_command_replays_at_exactly_those_bytes(tmp_path):
    trace = tmp_path / "t.csv"
    rows = [("a", 1000), ("b", 3000), ("a", 1000), ("c", 2500), ("b", 3000), ("a", 1000)]
    trace.write_text("time_s,path,size_bytes,outcome\n" +
                     "".join(f"{i * 0.1:.1f},{p},{n},miss\n" for i, (p, n) in enumerate(rows)))
    line = demo.replay_hint([{"mode": "transparent", "policy": "static", "trace": str(trace),
                              "stats": stats(1000, 3000)}])[1]
    argv = line.split("#")[0].split()[1:]  # drop "shadefs" and the comment
    r = subprocess.run([sys.executable, "-m", "shadefs"] + argv + ["--json"], capture_output=True, text=True,
                       check=True, timeout=60)
    out = json.loads(r.stdout)
    assert {x["cache_bytes"] for x in out["results"]} == {4000}
    static = [x for x in out["results"] if x["policy"] == "static"][0]
    assert static["hit_ratio"] == 3 / 6  # a and b fit (4000 bytes), c never does: a, b, a hit
