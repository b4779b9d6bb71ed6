"""The examples in scripts/ and the benchmarks of ``python -m shadefs.bench`` use the shared harness
(shadefs.testing), start, and edit no sys.path to find it."""
import importlib
import os
import re
import subprocess
import sys

import pytest

from shadefs.bench.runner import benchmarks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(f for f in os.listdir(os.path.join(ROOT, "scripts")) if f.endswith(".py"))


def _benchmark_sources():
    """Every file of every benchmark: its module, or each module of a benchmark that is a package of parts."""
    out = []
    for name in benchmarks():
        d = os.path.join("shadefs", "bench", name)
        if os.path.isdir(os.path.join(ROOT, d)):
            out += [os.path.join(d, f) for f in sorted(os.listdir(os.path.join(ROOT, d))) if f.endswith(".py")]
        else:
            out.append(d + ".py")
    return out


SOURCES = [os.path.join("scripts", f) for f in SCRIPTS] + _benchmark_sources()


pytestmark = pytest.mark.slow  # runs a subprocess, an install or a long search


def test_scripts_hold_only_the_examples():
    assert not [f for f in SCRIPTS if f.startswith("bench_")]
    assert {"read", "hit_ratio", "epoch", "miss_cost"} <= set(benchmarks())


@pytest.mark.parametrize("path", SOURCES)
def test_no_script_imports_harness_pieces_through_sys_path(path):
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    assert not re.search(r"^\s*import (docsection|latency_proxy)\b", text, re.M), \
        f"{path}: use `from shadefs.testing import docsection` / shadefs.testing.latency_proxy"
    assert not re.search(r"sys\.path\.(insert|append)\((0, )?(HERE|ROOT|REPO|os\.path)", text), \
        f"{path}: edits sys.path to import a sibling module"


@pytest.mark.parametrize("name", benchmarks())
def test_every_benchmark_starts(name):
    r = subprocess.run([sys.executable, "-m", "shadefs.bench", name, "--help"], capture_output=True,
                       text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: python -m shadefs.bench {name} ")
    honoured = importlib.import_module(f"shadefs.bench.{name}").COMMON
    for common, flag in (("rounds", "--rounds ROUNDS"), ("baseline", "--baseline REV"), ("write_doc", "--write-doc"),
                         ("json", "--json PATH")):
        assert (flag in r.stdout) == (common in honoured), flag
