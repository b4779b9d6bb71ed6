"""``pip install .`` (not only ``-e``) ships the hook as ``shadefs.hooks`` and the ``shadefs`` command."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


pytestmark = pytest.mark.slow  # runs a subprocess, an install or a long search


def test_regular_install_provides_shadefs_hooks(tmp_path):
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q",
                        "--target", str(target), ROOT], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (target / "shadefs" / "hooks" / "sampler.py").is_file()
    assert (target / "shadefs" / "control" / "protocol.py").is_file()
    assert (target / "shadefs" / "testing" / "mounts.py").is_file()  # the harness tests and benchmarks import
    assert (target / "shadefs" / "fuse" / "kernel.py").is_file()  # the default FUSE front end
    assert (target / "shadefs" / "fuse" / "libfuse_ops.py").is_file()  # the libfuse front end's callbacks
    for part in ("read/sources.py", "epoch/child.py", "hit_ratio/analysis.py"):  # benchmarks that are packages
        assert (target / "shadefs" / "bench" / part).is_file(), part
    code = ("import sys, shadefs, shadefs.hooks as h; "
            "assert shadefs.__file__.startswith(sys.argv[1]), shadefs.__file__; "
            "assert h.Client and h.ScoreReporter; assert 'torch' not in sys.modules; print('ok')")
    env = dict(os.environ, PYTHONPATH=str(target))
    r = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, env=env,
                       cwd=str(tmp_path))
    assert r.stdout.strip() == "ok", r.stderr
