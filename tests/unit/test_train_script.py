"""scripts/train_fashion_mnist.py's defaults: DataLoader workers follow the machine (min(4, cores))."""
import importlib.util
import os
from pathlib import Path

import pytest

from conftest import require

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_fashion_mnist.py"


@pytest.fixture(scope="module")
def train():
    require("torch", "torchvision")
    spec = importlib.util.spec_from_file_location("train_fashion_mnist", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("cores,workers", [(1, 1), (2, 2), (4, 4), (64, 4)])
def test_workers_default_to_min_4_cores(train, monkeypatch, cores, workers):
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    args = train.parse_args(["--data", "/nowhere"])
    assert args.workers == workers
    assert args.threads == max(1, min(2, cores - workers))
    assert train.parse_args(["--data", "/nowhere", "--workers", "3"]).workers == 3
