"""The scripts use the shared harness (shadefs.testing), start, and edit no sys.path to find it."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(f for f in os.listdir(os.path.join(ROOT, "scripts")) if f.endswith(".py"))
BENCH = [f for f in SCRIPTS if f.startswith("bench_")]


pytestmark = pytest.mark.slow  # runs a subprocess, an install or a long search


def test_there_are_benchmarks_to_check():
    assert {"bench_read.py", "bench_hit_ratio.py", "bench_epoch.py"} <= set(BENCH)


@pytest.mark.parametrize("name", SCRIPTS)
def test_no_script_imports_harness_pieces_through_sys_path(name):
    with open(os.path.join(ROOT, "scripts", name)) as f:
        text = f.read()
    assert not re.search(r"^\s*import (docsection|latency_proxy)\b", text, re.M), \
        f"{name}: use `from shadefs.testing import docsection` / shadefs.testing.latency_proxy"
    assert not re.search(r"sys\.path\.(insert|append)\((0, )?(HERE|ROOT|REPO|os\.path)", text), \
        f"{name}: edits sys.path to import a sibling module"


@pytest.mark.parametrize("name", BENCH)
def test_every_benchmark_starts(name):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", name), "--help"], capture_output=True,
                       text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    assert "usage:" in r.stdout
