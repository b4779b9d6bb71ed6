"""scripts/train_fashion_mnist.py's defaults: DataLoader workers follow the machine (min(4, cores))."""
import os

import pytest

from conftest import load_script, require


pytestmark = pytest.mark.slow  # runs a subprocess, an install or a long search


@pytest.fixture(scope="module")
def train():
    require("torch", "torchvision")
    return load_script("train_fashion_mnist")


@pytest.mark.parametrize("cores,workers", [(1, 1), (2, 2), (4, 4), (64, 4)])
def test_workers_default_to_min_4_cores(train, monkeypatch, cores, workers):
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    args = train.parse_args(["--data", "/nowhere"])
    assert args.workers == workers
    assert args.threads == max(1, min(2, cores - workers))
    assert train.parse_args(["--data", "/nowhere", "--workers", "3"]).workers == 3


class _Counters:
    """The daemon's counters as the bar polls them: ``seq`` in turn, then the last one again."""

    def __init__(self, *seq):
        self.seq = list(seq)

    def read(self):
        return self.seq.pop(0) if len(self.seq) > 1 else self.seq[0]


def test_the_progress_bars_last_frame_shows_the_epochs_record(train):
    import io
    import re

    out = io.StringIO()
    before = {"opens": 0, "hits": 0, "prefetched": 0}
    # ShadeSampler reads its hits first: a poll half-way sees 90 %, the whole epoch has 60 %
    live = {"opens": 50, "hits": 45, "prefetched": 5}
    end = {"opens": 100, "hits": 60, "prefetched": 20}
    bar = train.EpochBar("epoch 1/1", 100, _Counters(live), start=before, file=out, interval_s=0)
    bar.update(25)  # polls; the postfix is drawn with the next update
    bar.update(25)
    assert "hit ratio 90.0%, prefetched 10.0%" in out.getvalue()
    record = train.CacheCounters.delta(end, before)
    bar.update(50)  # the last batch: no poll can see the epoch's end before the record is taken
    bar.close(record)
    # (a frame shorter than the one before is padded with spaces by tqdm, to erase that one on a terminal)
    last = [f for f in re.split(r"[\r\n]", out.getvalue()) if f.strip()][-1].rstrip()
    assert record["hit_ratio"] == 0.6
    assert last.startswith("epoch 1/1: 100%") and last.endswith("hit ratio 60.0%, prefetched 20.0%]"), last
