"""ShadeSampler's provisional next-epoch draw on a real mount: the files the next epoch reads first are
kept across the epoch boundary, which they are not without it."""
import os

import numpy as np
import pytest
from conftest import require

require("torch")  # skipped without torch; failed under CI=true

from shadefs.hooks import ShadeSampler  # noqa: E402
from shadefs.testing.datasets import FileDataset as Files  # noqa: E402

from mountutil import wait_for  # noqa: E402

FILES = 400
SIZE = 1000
CACHE_FILES = 40


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    for i in range(FILES):
        d = src / f"c{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:04d}.bin").write_bytes(bytes([i % 251]) * SIZE)
    return src


def _loss(idx):
    return ((np.asarray(idx) * 7919) % 97).astype(np.float32) / 10.0


def run_epochs(m, lookahead_at, seed):
    """Two epochs, one reader; returns (sampler, epoch 1's provisional and real plans, the daemon's stats
    after each epoch)."""
    ds = Files(m.path)
    s = ShadeSampler(ds, seed=seed, lookahead_at=lookahead_at, mode="relaxed")
    per_epoch = 1 if lookahead_at is None else 2
    stats = []
    for epoch in range(2):
        s.set_epoch(epoch)
        it = iter(s)
        first = next(it)  # the provisional draw (lookahead_at=0.0) starts here
        assert s.announcer.flush()
        wait_for(lambda: m.full_stats()["plans_received"] == per_epoch * (epoch + 1))
        order = [first] + list(it)
        for k in range(0, len(order), 20):
            batch = order[k:k + 20]
            for i in batch:
                assert ds[i] == SIZE
            s.update_scores(batch, _loss(batch))
        stats.append(m.full_stats())
        if epoch == 0:
            prov1 = s.provisional
    assert s.announcer.failed == 0
    return s, prov1, s.plan, stats


@pytest.mark.parametrize("seed", [0, 1])
def test_the_provisional_draw_keeps_the_next_epochs_first_files(tree, mount, seed):
    got = {}
    for name, at in (("provisional", 0.0), ("none", None)):
        m = mount(tree, "--ram-cache", str(CACHE_FILES * SIZE), "--policy", "lru", "--prefetch-window", "0",
                  "--no-kernel-cache", name=f"m-{name}-{seed}")
        s, prov1, plan1, stats = run_epochs(m, at, seed)
        # what epoch 1 found cached at its start: its hits-first block, distinct files
        kept = len(set(plan1.order[:plan1.hits].tolist()))
        hits1 = stats[1]["hits"]["ram"] - stats[0]["hits"]["ram"]
        got[name] = (kept, hits1, prov1, plan1)
        m.umount()
    kept, hits1, prov1, plan1 = got["provisional"]
    kept0, hits0, none1, _ = got["none"]
    # with the provisional draw announced, nearly the whole cache at the boundary is drawn again in
    # epoch 1 (Belady kept what the provisional draw reads first; the real draw is close to it) ...
    assert kept >= 0.9 * CACHE_FILES, got
    # ... and without it the cache holds what epoch 0 read last (lru), much of which epoch 1 never draws
    assert kept0 <= 0.85 * CACHE_FILES, got
    assert hits1 >= hits0 + 20, got
    # the provisional draw was close to the real one: most of the files epoch 1 drew were in it
    real, guess = set(plan1.global_order.tolist()), set(prov1.global_order.tolist())
    assert prov1.epoch == 1 and len(real & guess) / len(real | guess) >= 0.7, got
    assert none1 is None
