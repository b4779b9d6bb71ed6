"""Aggressive mode splits the global draw into contiguous per-rank blocks: ties must not follow index
order, which in an ImageFolder is class order."""
import numpy as np

from shadefs.hooks.sampler import ShadeSampler, pads_sort

CLASSES, PER_CLASS, WORLD = 10, 100, 4
N = CLASSES * PER_CLASS  # index i is of class i // PER_CLASS, as ImageFolder orders its samples


def plans(epoch, seed=0):
    out = []
    for rank in range(WORLD):
        s = ShadeSampler(range(N), seed=seed, num_replicas=WORLD, rank=rank, mode="aggressive", client=False)
        s.set_epoch(epoch)
        list(s)
        out.append(s.plan)
    return out


def class_shares(order):
    return np.bincount(order // PER_CLASS, minlength=CLASSES) / order.size


def test_every_rank_gets_every_class_in_proportion_under_aggressive_mode():
    EPOCHS = 16
    shares = np.zeros((EPOCHS, WORLD, CLASSES))
    for e in range(EPOCHS):
        ps = plans(e + 1)
        g = ps[0].global_order
        for p in ps:
            assert np.array_equal(p.global_order, g)  # one global order on every rank
            assert p.order.size == N // WORLD
        # the shards are the draw, split: together exactly its multiset
        assert np.array_equal(np.sort(np.concatenate([p.shard for p in ps])), np.sort(g))
        shares[e] = [class_shares(p.shard) for p in ps]
    # every epoch, every rank sees every class (ties by index gave most ranks 0 % of most classes)
    assert shares.min() > 0.0
    # uniform weights: every class is 10 % of every rank's draws in expectation. One epoch's block holds
    # about 100 distinct samples (3.0 % standard deviation); the mean of 16 epochs is within 10 +- 3 %
    # (> 4 standard deviations). Ties by index put classes 0-2 on rank 0 and 7-9 on rank 3 every epoch.
    mean = shares.mean(axis=0)
    assert mean.min() >= 0.07 and mean.max() <= 0.13, mean
    assert np.allclose(shares.sum(axis=2), 1.0)


def test_most_drawn_first_and_repeats_stay_together():
    g = plans(1)[0].global_order
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    runs = np.diff(np.r_[starts, g.size])
    assert np.unique(g[starts]).size == starts.size  # each sample's draws are one run
    assert np.all(np.diff(runs) <= 0)  # most-drawn first


def test_tie_order_is_seeded():
    a, b, c = plans(1, seed=0)[0].global_order, plans(1, seed=0)[0].global_order, plans(1, seed=1)[0].global_order
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert not np.array_equal(plans(2)[0].global_order, plans(3)[0].global_order)


def test_pads_sort_breaks_ties_by_the_random_key():
    draw = np.array([4, 4, 1, 2, 3, 0])  # 4 twice, then five ties drawn once
    rng = np.random.Generator(np.random.PCG64(5))
    key = np.random.Generator(np.random.PCG64(5)).random(5)  # the key pads_sort draws for uniq [0 1 2 3 4]
    ties = np.array([0, 1, 2, 3])[np.argsort(key[:4])]
    assert pads_sort(draw, rng).tolist() == [4, 4] + ties.tolist()
    assert pads_sort(draw).tolist() == [4, 4, 0, 1, 2, 3]  # without rng: by index
