"""Tests for scripts/make_fashion_mnist.py: IDX parsing and a small build."""
import gzip
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import load_script, require

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
SCRIPT = SCRIPTS / "make_fashion_mnist.py"
SOURCE = Path("/usr/share/datasets/fashion-mnist")


mfm = load_script("make_fashion_mnist")


def _idx_bytes(array: np.ndarray, code: int, be_dtype: str) -> bytes:
    header = bytes([0, 0, code, array.ndim])
    header += np.array(array.shape, dtype=">u4").tobytes()
    return header + array.astype(be_dtype).tobytes()


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "gzip"])
def test_read_idx_uint8(tmp_path, compress):
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4) * 7
    data = _idx_bytes(array, 0x08, ">u1")
    path = tmp_path / ("a.idx.gz" if compress else "a.idx")
    path.write_bytes(gzip.compress(data) if compress else data)
    out = mfm.read_idx(str(path))
    assert out.dtype == np.uint8
    assert out.shape == (2, 3, 4)
    np.testing.assert_array_equal(out, array)


def test_read_idx_big_endian_int32_gzip(tmp_path):
    array = np.array([[1, -2, 70000], [2**31 - 1, 0, -(2**31)]],
                     dtype=np.int32)
    path = tmp_path / "b.idx.gz"
    path.write_bytes(gzip.compress(_idx_bytes(array, 0x0C, ">i4")))
    out = mfm.read_idx(str(path))
    assert out.dtype == np.dtype(np.int32)
    assert out.dtype.isnative
    np.testing.assert_array_equal(out, array)


def test_read_idx_rejects_truncated(tmp_path):
    array = np.zeros((4, 5), dtype=np.uint8)
    path = tmp_path / "c.idx"
    path.write_bytes(_idx_bytes(array, 0x08, ">u1")[:-1])
    with pytest.raises(ValueError):
        mfm.read_idx(str(path))


def test_classes():
    assert len(mfm.CLASSES) == 10
    assert len(set(mfm.CLASSES)) == 10
    for name in mfm.CLASSES:
        assert name and "/" not in name and " " not in name
        assert not name.startswith(".")


def test_missing_source_exits_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "out"),
         "--source", str(tmp_path / "nowhere")],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "apt-get install dataset-fashion-mnist" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_build_small_tree(tmp_path):
    require(str(SOURCE))  # apt-get install dataset-fashion-mnist (make test installs it)
    out = tmp_path / "fmnist"
    cmd = [sys.executable, str(SCRIPT), str(out),
           "--limit-train", "30", "--limit-test", "10"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr

    # the marker lies beside the tree, so a mount of it shows only the two splits
    assert sorted(os.listdir(out)) == ["test", "train"]
    assert sorted(os.listdir(tmp_path)) == ["fmnist", "fmnist.complete"]
    for split, expected in (("train", 30), ("test", 10)):
        assert sorted(os.listdir(out / split)) == sorted(mfm.CLASSES)
        files = [p for p in (out / split).rglob("*") if p.is_file()]
        assert len(files) == expected
        assert {p.name for p in files} == {f"{i:05d}.png"
                                           for i in range(expected)}

    images = mfm.read_idx(str(SOURCE / "train-images-idx3-ubyte.gz"))
    labels = mfm.read_idx(str(SOURCE / "train-labels-idx1-ubyte.gz"))
    index = 12
    path = out / "train" / mfm.CLASSES[labels[index]] / f"{index:05d}.png"
    with Image.open(path) as img:
        assert img.format == "PNG"
        assert img.mode == "L"
        pixels = np.asarray(img)
    np.testing.assert_array_equal(pixels, images[index])

    # A second run finds the tree complete and leaves it alone.
    mtime = path.stat().st_mtime_ns
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "already complete" in proc.stdout
    assert path.stat().st_mtime_ns == mtime
