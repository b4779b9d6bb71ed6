"""ShadeSampler (PADS) without a mount: determinism, epoch length, the with-replacement draw, modes,
hits-first repetition and its cap, shards, and degradation without a daemon."""
import math
import os
import random
import warnings

import numpy as np
import pytest
from conftest import require

torch = require("torch")  # skipped without torch; failed under CI=true

from shadefs.hooks import Client, ShadeSampler  # noqa: E402
from shadefs.hooks.client import DatasetPaths, find_mount_root  # noqa: E402
from shadefs.hooks.sampler import pads_sort, rank_transform  # noqa: E402

from hookfakes import MOUNT, FakeDataset, LiveDaemon  # noqa: E402


def counting(client):
    """The real ``client``, counting its residency queries in ``client.queries`` (a spy, not a fake)."""
    client.queries = 0
    real = client.resident

    def resident(paths):
        client.queries += 1
        return real(paths)

    client.resident = resident
    return client


def make(n=100, **kw):
    kw.setdefault("client", False)
    return ShadeSampler(FakeDataset(n), **kw)


# ------------------------------------------------------------------------------------ determinism
def test_same_seed_and_epoch_same_order_and_independent_of_global_rng():
    a, b = make(seed=7), make(seed=7)
    orders_a = []
    for epoch in range(3):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        np.random.seed(epoch)  # global RNG state must not matter ...
        random.seed(epoch + 1)
        torch.manual_seed(epoch + 2)
        state = (np.random.get_state()[1].copy(), random.getstate(), torch.get_rng_state().clone())
        oa = list(a)
        np.random.seed(999)
        ob = list(b)
        assert oa == ob
        orders_a.append(oa)
        np.random.seed(epoch)  # ... and must not be touched
        random.seed(epoch + 1)
        torch.manual_seed(epoch + 2)
        list(make(seed=7))
        assert np.array_equal(np.random.get_state()[1], state[0])
        assert random.getstate() == state[1]
        assert torch.equal(torch.get_rng_state(), state[2])
    assert len({tuple(o) for o in orders_a}) == 3  # three epochs, three different orders (0 vs 2 too)
    c = make(seed=8)
    c.set_epoch(0)
    assert list(c) != orders_a[0]


def test_set_epoch_reproduces_and_iter_without_it_advances():
    s = make(seed=1)
    s.set_epoch(4)
    first = list(s)
    s.set_epoch(4)
    assert list(s) == first and s.epoch == 4
    again = list(s)  # no set_epoch: the next epoch
    assert s.epoch == 5
    t = make(seed=1)
    t.set_epoch(5)
    assert again == list(t)


@pytest.mark.parametrize("n,world", [(100, 1), (101, 4), (7, 3), (1, 2)])
def test_epoch_length_and_disjoint_shards(n, world):
    plans = []
    for rank in range(world):
        s = make(n, num_replicas=world, rank=rank, seed=3)
        assert len(s) == math.ceil(n / world)
        order = list(s)
        assert len(order) == len(s)
        assert all(0 <= i < n for i in order)
        plans.append(s.plan)
    for p in plans[1:]:
        assert np.array_equal(p.global_order, plans[0].global_order)
    pos = np.concatenate([p.positions for p in plans])
    assert np.array_equal(np.sort(pos), np.arange(math.ceil(n / world) * world))
    shards = np.concatenate([p.order for p in plans])  # no residency: order is a shuffled shard
    assert np.array_equal(np.sort(shards), np.sort(plans[0].global_order))


# ---------------------------------------------------------------------------------- the draw
def test_draw_follows_weights_chi_square_by_group():
    n = 2000
    s = make(n, seed=11)
    s.weights[:] = np.repeat([1.0, 2.0, 3.0, 4.0], n // 4)  # expected shares 0.1 .. 0.4
    counts = np.zeros(4)
    for epoch in range(5):
        counts += np.bincount(s.global_draw(epoch) // (n // 4), minlength=4)
    expected = counts.sum() * np.array([0.1, 0.2, 0.3, 0.4])
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 16.27, (counts, chi2)  # chi-square, 3 dof, p = 0.001 (seeded: exact)


def test_draw_follows_weights_chi_square_per_sample_with_smoothing():
    n = 50
    s = make(n, seed=5)
    s.update_scores(np.arange(n), np.linspace(0.0, 2.0, n))  # ln(10) .. ln(59)
    s.ls = 0.5
    counts = sum(np.bincount(s.global_draw(e), minlength=n) for e in range(60))
    p = (s.weights + 0.5) / (s.weights + 0.5).sum()
    expected = counts.sum() * p
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 85.35, chi2  # 49 dof, p = 0.001
    assert counts[-10:].sum() > counts[:10].sum()  # high loss drawn more


def test_never_scored_weigh_one_and_draw_with_replacement():
    s = make(200, seed=2)
    assert np.all(s.weights == 1.0) and s.ls == 0.0
    order = list(s)
    assert len(set(order)) < len(order)  # with replacement: ~1/e of the dataset is not drawn


def test_rank_transform_matches_shade():
    losses = np.array([0.3, 0.1, 0.9, 0.1], dtype=np.float32)
    w = rank_transform(losses)
    assert w.dtype == np.float32
    np.testing.assert_allclose(w, np.log([12.0, 10.0, 13.0, 11.0]), rtol=1e-6)  # stable on ties


def test_smoothing_term_follows_shade_on_epoch_end():
    s = make(smoothing=1e-2)
    s.on_epoch_end(2.0)
    assert s.ls == pytest.approx(0.02)
    s.on_epoch_end(1.0)
    assert s.ls == pytest.approx(0.02 * math.exp((1.0 - 2.0) / 2.0))
    np.testing.assert_allclose(s.sampling_weights(), 1.0 + s.ls)


# ------------------------------------------------------------------------------------- modes
def test_mode_switch_follows_validation_trend():
    s = make(seed=0)
    assert s.current_mode(0) == "relaxed" and s.val_trend == 100.0
    assert s.current_mode(1) == "aggressive"  # no validation: trend stays 100
    s.report_accuracy(0.5)
    assert s.val_trend == 0.0 and s.current_mode(1) == "relaxed"  # first delta is 0
    s.report_accuracy(0.6)
    assert s.val_trend == pytest.approx(0.05) and s.current_mode(2) == "aggressive"
    s.report_accuracy(0.4)
    s.report_accuracy(0.45)  # last three deltas: 0.1, -0.2, 0.05
    assert s.val_trend == pytest.approx(-0.05 / 3) and s.current_mode(3) == "relaxed"
    assert make(mode="aggressive").current_mode(0) == "aggressive"
    assert make(mode="relaxed").current_mode(5) == "relaxed"


def test_pads_sort_most_drawn_first_ties_by_index():
    assert pads_sort(np.array([5, 3, 5, 1, 3, 5, 2])).tolist() == [5, 5, 5, 3, 3, 1, 2]


def test_aggressive_contiguous_blocks_keep_repeats_on_one_rank():
    world, n = 4, 400
    plans = []
    for rank in range(world):
        s = make(n, num_replicas=world, rank=rank, seed=9, mode="aggressive")
        s.update_scores(np.arange(n), np.arange(n, dtype=np.float32))
        s.set_epoch(1)
        list(s)
        plans.append(s.plan)
    g = plans[0].global_order
    # grouped by sample, most-drawn first (ties in a seeded random order)
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    runs = np.diff(np.r_[starts, g.size])
    assert np.unique(g[starts]).size == starts.size and np.all(np.diff(runs) <= 0)
    for r, p in enumerate(plans):
        assert np.array_equal(p.global_order, g)
        assert np.array_equal(p.positions, np.arange(r * 100, (r + 1) * 100))
        assert np.array_equal(np.sort(p.order), np.sort(g[r * 100 : (r + 1) * 100]))
    # a sample's repeats straddle at most one block boundary
    owners = [{r for r, p in enumerate(plans) if i in set(p.order.tolist())} for i in np.unique(g)]
    assert sum(len(o) > 1 for o in owners) <= world - 1


# --------------------------------------------------------------------------- cache awareness
def test_resident_draws_repeated_and_first(tmp_path):
    n = 60
    resident = set(range(6))
    with LiveDaemon(tmp_path, n, resident=resident) as live, counting(live.client()) as client:
        s = ShadeSampler(live.dataset, client=client, rep_factor=3, seed=4)
        order = np.array(list(s))
        plan = s.plan
        assert client.queries == 1 and len(order) == n
        shard = plan.shard
        h = int(np.isin(shard, list(resident)).sum())
        assert h > 0 and plan.resident == h and plan.hits == 3 * h
        head, tail = order[: plan.hits], order[plan.hits :]
        assert np.isin(head, list(resident)).all() and not np.isin(tail, list(resident)).any()
        for i in resident:
            assert (head == i).sum() == 3 * (shard == i).sum()
        misses = shard[~np.isin(shard, list(resident))]
        assert set(tail.tolist()) <= set(misses.tolist()) and len(tail) == n - 3 * h
        # same (seed, epoch, residency): same order
        s2 = ShadeSampler(live.dataset, client=client, rep_factor=3, seed=4)
        assert list(s2) == order.tolist()


def test_fractional_rep_factor(tmp_path):
    n = 80
    with LiveDaemon(tmp_path, n, resident=range(10)) as live, live.client() as client:
        s = ShadeSampler(live.dataset, client=client, rep_factor=2.5, seed=6)
        list(s)
    h = s.plan.resident
    assert h == 10 and s.plan.hits == 2 * h + h // 2  # every resident file is in the (one) shard


@pytest.fixture(scope="module")
def half_resident(tmp_path_factory):
    """100 files, the first 50 resident (r * h >= 1: the reference code's epoch would be all hits)."""
    with LiveDaemon(tmp_path_factory.mktemp("half"), 100, resident=range(50)) as live:
        yield live


@pytest.mark.parametrize("mmf,expect_misses", [(0.0, 0), (0.2, 20), (0.1, 10)])
def test_min_miss_fraction_prevents_all_hit_epochs(half_resident, mmf, expect_misses):
    with half_resident.client() as client:
        s = ShadeSampler(half_resident.dataset, client=client, rep_factor=3, seed=1, min_miss_fraction=mmf)
        order = np.array(list(s))
    assert len(order) == 100
    misses = ~np.isin(order, list(range(50)))
    assert misses.sum() == expect_misses
    assert not misses[: s.plan.hits].any()


@pytest.mark.slow
def test_residency_failure_warns_once_and_degrades(tmp_path):
    n = 30
    # a real client of an endpoint nobody serves: every residency query times out
    client = counting(Client(endpoint=f"ipc://{tmp_path}/nobody.sock", mount_root=MOUNT, timeout_s=0.2))
    try:
        s = ShadeSampler(FakeDataset(n), client=client, seed=0)
        with pytest.warns(RuntimeWarning, match="residency query failed"):
            order = list(s)
        assert len(order) == n and s.plan.hits == 0
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            list(s)
        assert client.queries == 2
    finally:
        client.close()


def test_paths_outside_the_mount_are_never_resident(tmp_path):
    with LiveDaemon(tmp_path, 20, resident=range(20)) as live, live.client() as client:
        ds = live.dataset
        ds.samples[3] = ("/elsewhere/x.png", 0)
        s = ShadeSampler(ds, client=client, seed=0, min_miss_fraction=0.0)
        list(s)
        assert s.plan.hits > 0
        assert 3 not in s.plan.order[: s.plan.hits]
        assert DatasetPaths(ds, live.root).rel_path(3) is None
        assert DatasetPaths(ds, live.root).rel_path(4) == "train/c1/img00004.png"


def test_dataset_paths_follow_subsets():
    ds = FakeDataset(10)
    sub = torch.utils.data.Subset(ds, [7, 2, 5])
    paths = DatasetPaths(sub, MOUNT + "/")
    assert len(paths) == 3
    assert paths.rel_paths([0, 2]) == ["train/c1/img00007.png", "train/c2/img00005.png"]
    with pytest.raises(TypeError, match="no per-sample paths"):
        DatasetPaths(list(range(3)), MOUNT)


def test_mount_root_found_by_walking_up_the_xattr(tmp_path):
    mnt = tmp_path / "mnt"
    leaf = mnt / "train" / "c0"
    leaf.mkdir(parents=True)
    try:
        for d in (mnt, mnt / "train", leaf):
            os.setxattr(d, "user.shadefs.endpoint", b"ipc:///x.sock")
    except OSError as exc:
        pytest.skip(f"user xattrs unsupported on {tmp_path}: {exc}")
    assert find_mount_root(str(leaf)) == str(mnt)
    assert find_mount_root(str(tmp_path)) is None


def test_no_daemon_single_warning(tmp_path, monkeypatch):
    monkeypatch.delenv("SHADEFS_ENDPOINT", raising=False)
    ds = FakeDataset(10, root=str(tmp_path))
    with pytest.warns(RuntimeWarning, match="without cache awareness") as rec:
        s = ShadeSampler(ds)
        list(s)
        list(s)
    assert len(rec) == 1 and s.client is None and len(list(s)) == 10
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ShadeSampler(ds, client=False)


def test_invalid_arguments():
    with pytest.raises(ValueError):
        make(rep_factor=0.5)
    with pytest.raises(ValueError):
        make(mode="greedy")
    with pytest.raises(ValueError):
        make(min_miss_fraction=1.5)
    with pytest.raises(ValueError):
        make(num_replicas=2, rank=2)
    with pytest.raises(ValueError):
        make(seed=-1)
    s = make(10)
    with pytest.raises(ValueError):
        s.update_scores([10], [1.0])
