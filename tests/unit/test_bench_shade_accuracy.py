"""python -m shadefs.bench shade_accuracy: the IDX loader, the emulated SHADE cache, a tiny grid and its report."""
import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shadefs.bench import runner, shade_accuracy as bsa

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
BENCH = [sys.executable, "-m", "shadefs.bench", "shade_accuracy"]


pytestmark = pytest.mark.slow  # runs a subprocess, an install or a long search


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + np.array(array.shape, dtype=">u4").tobytes()
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(">u1").tobytes())


@pytest.fixture
def idx_dir(tmp_path):
    """A Fashion-MNIST-shaped IDX directory: 120 training and 30 test images of random pixels."""
    rng = np.random.default_rng(7)
    d = tmp_path / "idx"
    d.mkdir()
    for split, n in (("train", 120), ("test", 30)):
        images, labels = bsa.IDX_FILES[split]
        _write_idx(d / images, rng.integers(0, 256, size=(n, 28, 28)))
        _write_idx(d / labels, np.arange(n) % 10)
    return d


def test_idx_directory_loads_the_pixels_of_the_image_folder_tree(idx_dir, tmp_path):
    from torchvision import datasets

    tree = tmp_path / "tree"
    proc = subprocess.run([sys.executable, str(SCRIPTS / "make_fashion_mnist.py"), str(tree),
                           "--source", str(idx_dir)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for split, n in (("train", 120), ("test", 30)):
        x_idx, y_idx, _ = bsa.load(str(idx_dir), split)
        x_tree, y_tree, _ = bsa.load(str(tree), split)
        assert tuple(x_idx.shape) == (n, 1, 28, 28) and tuple(y_idx.shape) == (n,)
        # the tree lists by class, then file name (= the IDX index); map it back
        folder = datasets.ImageFolder(str(tree / split))
        order = [int(Path(p).stem) for p, _ in folder.samples]
        assert sorted(order) == list(range(n))
        np.testing.assert_allclose(x_idx[order].numpy(), x_tree.numpy(), atol=1e-6)
        names = [folder.classes[int(c)] for c in y_tree]
        mfm_classes = runner.example("make_fashion_mnist").CLASSES
        assert names == [mfm_classes[int(c)] for c in y_idx[order]]


def test_emulated_cache_keeps_the_shade_rule():
    """Admit while there is room, else replace the least important member if the newcomer is more
    important; importances change in place between accesses (as the sampler's weights do)."""
    rng = np.random.default_rng(3)
    n, cap = 500, 40
    w = rng.random(n)
    cache = bsa.EmulatedCache(cap, w)
    members = set()
    for step in range(5000):
        i = int(rng.integers(n))
        cache.access(i)
        if i not in members:
            if len(members) < cap:
                members.add(i)
            else:
                victim = min(members, key=lambda j: w[j])
                if w[i] > w[victim]:
                    members.discard(victim)
                    members.add(i)
        if step % 50 == 0:
            w[rng.integers(n, size=20)] = rng.random(20)
        assert set(np.flatnonzero(cache.resident).tolist()) == members
    assert cache.size == cap


def test_tiny_grid_writes_its_json_and_reports(idx_dir, tmp_path):
    out = tmp_path / "r.json"
    png = tmp_path / "r.png"
    proc = subprocess.run([*BENCH, "--data", str(idx_dir), "--epochs", "2", "--seeds", "0",
                           "--configs", "uniform;shade", "--json", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert (doc["n_train"], doc["n_test"]) == (120, 30)
    assert [(r["config"], r["seed"], len(r["epochs"])) for r in doc["results"]] == [("uniform", 0, 2), ("shade", 0, 2)]
    uniform, shade = doc["results"]
    assert [e["distinct"] for e in uniform["epochs"]] == [120, 120]
    assert shade["epochs"][1]["resident_draws"] > 0  # the emulated cache (12 samples) is drawn first
    for e in uniform["epochs"] + shade["epochs"]:
        assert 0 < e["compute_s"] <= e["train_s"]
        assert 0.0 <= e["test_acc"] <= 100.0
    proc = subprocess.run([*BENCH, "--report", str(out), "--target", "0", "--png", str(png)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "| epoch | uniform | shade |" in proc.stdout
    assert "epochs to 0 %" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| uniform |")]
    assert len(rows) == 1 and "| 1 |" in rows[0]  # target 0 %: reached at epoch 1
    assert png.stat().st_size > 0
