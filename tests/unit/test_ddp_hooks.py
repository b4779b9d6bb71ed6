"""Two real torch.distributed (gloo) processes: one global draw, disjoint shards, all-gathered scores,
rank 0's sampling state shared, and one score sender per daemon."""
import pickle
import time

import numpy as np
import pytest
from conftest import require

torch = require("torch")  # skipped without torch; failed under CI=true
import torch.multiprocessing as mp  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from shadefs.hooks import ScoreReporter, ShadeSampler  # noqa: E402
from shadefs.hooks.distributed import sender_ranks  # noqa: E402
from shadefs.hooks.sampler import _GLOBAL_STREAM, _hash_exponential, _stream_key, rank_transform  # noqa: E402

from hookfakes import LiveDaemon  # noqa: E402

N, BS, EPOCHS, WORLD = 37, 5, 3, 2


pytestmark = pytest.mark.slow  # runs a subprocess, an install or a long search


class IndexDataset:
    def __init__(self, n, mount_root):
        self.root = mount_root + "/train"
        self.samples = [(f"{self.root}/c{i % 3}/img{i:05d}.png", i % 3) for i in range(n)]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return torch.zeros(1), i % 3, i


def fake_loss(idx, rank):
    return (np.sin(np.asarray(idx) * 1.7 + rank) + 1.5).astype(np.float32)


def _worker(rank, tmp, endpoint, mount_root):
    import torch.distributed as dist

    from shadefs.hooks import Client

    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=WORLD)
    try:
        ds = IndexDataset(N, mount_root)
        # both ranks see the same endpoint on the same host: one daemon, so one sender
        client = Client(endpoint=endpoint, mount_root=mount_root)
        sampler = ShadeSampler(ds, seed=3, client=client)  # num_replicas, rank from torch.distributed
        reporter = ScoreReporter(ds, sampler=sampler, batch_size=BS)
        loader = DataLoader(ds, batch_size=BS, sampler=sampler)
        epochs = []
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            steps = []
            for _, _, idx in loader:
                reporter.report(torch.from_numpy(fake_loss(idx.numpy(), rank)))
                steps.append(idx.numpy())
            if rank == 0:  # only rank 0 validates; its trend must reach rank 1
                accuracies = {0: [0.5, 0.3], 1: [0.6]}.get(epoch, [])
                for acc in accuracies:
                    reporter.report_accuracy(acc)
            p = sampler.plan
            epochs.append(dict(mode=p.mode, global_order=p.global_order, positions=p.positions, order=p.order,
                               steps=steps, weights=sampler.weights.copy(), ls=sampler.ls))
        stats = client.stats()  # after this rank's scores on the same socket
        out = dict(rank=sampler.rank, world=sampler.num_replicas, epochs=epochs, stats=stats,
                   dropped=client.dropped)
        client.close()
        with open(f"{tmp}/rank{rank}.pkl", "wb") as f:
            pickle.dump(out, f)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """The real daemon both ranks talk to ("--score-transform raw": importance = the last raw loss)."""
    with LiveDaemon(tmp_path_factory.mktemp("ddp-src"), N, score_transform="raw") as d:
        yield d


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, live):
    tmp = tmp_path_factory.mktemp("ddp")
    ctx = mp.spawn(_worker, args=(str(tmp), live.endpoint, live.root), nprocs=WORLD, join=False)
    deadline = time.monotonic() + 120
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("distributed workers did not finish in 120 s")
    out = []
    for r in range(WORLD):
        with open(tmp / f"rank{r}.pkl", "rb") as f:
            out.append(pickle.load(f))
    return out


def test_ranks_come_from_torch_distributed(ranks):
    assert [(o["rank"], o["world"]) for o in ranks] == [(0, 2), (1, 2)]


def test_one_global_draw_split_into_disjoint_shards(ranks):
    total = -(-N // WORLD) * WORLD
    for e in range(EPOCHS):
        a, b = (o["epochs"][e] for o in ranks)
        assert a["mode"] == b["mode"]
        np.testing.assert_array_equal(a["global_order"], b["global_order"])
        assert len(a["global_order"]) == total
        pos = np.concatenate([a["positions"], b["positions"]])
        assert np.array_equal(np.sort(pos), np.arange(total))  # disjoint, covering every position
        union = np.concatenate([a["order"], b["order"]])
        np.testing.assert_array_equal(np.sort(union), np.sort(a["global_order"]))
        for o in (a, b):  # the loader carried exactly the yielded order
            np.testing.assert_array_equal(np.concatenate(o["steps"]), o["order"])
    # rank 0's falling validation trend reached rank 1 (whose own trend stayed at 100)
    assert [ranks[1]["epochs"][e]["mode"] for e in range(EPOCHS)] == ["relaxed", "relaxed", "aggressive"]


def test_all_gathered_scores_are_identical_and_global(ranks):
    w = np.ones(N)
    for e in range(EPOCHS):
        steps = [o["epochs"][e]["steps"] for o in ranks]
        for k in range(len(steps[0])):
            for r in range(WORLD):  # each rank's minibatch ranked on its own, in rank order
                idx = steps[r][k]
                w[idx] = rank_transform(fake_loss(idx, r))
        a, b = (o["epochs"][e] for o in ranks)
        np.testing.assert_array_equal(a["weights"], b["weights"])
        np.testing.assert_allclose(a["weights"], w, rtol=1e-6)
        assert a["ls"] == b["ls"]


def _global_weights_and_losses(ranks, epoch):
    """The weights every rank should hold after ``epoch`` (each rank's minibatch ranked on its own, in
    rank order, as test_all_gathered_scores_are_identical_and_global checks) and that epoch's mean loss
    over all ranks, both from the recorded minibatches and fake_loss alone."""
    w = np.ones(N)
    losses = []
    for e in range(epoch + 1):
        steps = [o["epochs"][e]["steps"] for o in ranks]
        for k in range(len(steps[0])):
            for r in range(WORLD):
                w[steps[r][k]] = rank_transform(fake_loss(steps[r][k], r))
        if e == epoch:
            losses = np.concatenate([fake_loss(i, r) for r in range(WORLD) for i in steps[r]])
    return w, float(losses.astype(np.float64).mean())


def _documented_draw(weights, ls, epoch, seed=3):
    """global_draw's documented contract (draw="stable"): the labels of the first total_size arrivals of
    one Poisson process per sample, of rate w_i + ls, arrival k of sample i after the Exp(1) gaps keyed by
    (seed, epoch, _GLOBAL_STREAM, i, k) -- here by brute force: 40 arrivals of every sample, sorted."""
    total = -(-N // WORLD) * WORLD
    key = _stream_key(seed, epoch, _GLOBAL_STREAM)
    w = np.asarray(weights, dtype=np.float64) + ls
    items = np.arange(N)
    times = np.cumsum(np.stack([_hash_exponential(key, items, k) for k in range(40)], axis=1), axis=1) / w[:, None]
    labels = np.repeat(items, 40)
    return labels[np.argsort(times.reshape(-1), kind="stable")[:total]]


def test_next_draw_uses_the_global_scores(ranks):
    smoothing = 1e-2  # ShadeSampler's default
    ls = 0.0
    prev_loss = None
    for e in range(1, EPOCHS):
        w, loss = _global_weights_and_losses(ranks, e - 1)
        ls = smoothing * loss if prev_loss is None else ls * np.exp((loss - prev_loss) / prev_loss)
        prev_loss = loss
        want = _documented_draw(w, ls, e)
        assert not np.array_equal(np.sort(want), np.sort(_documented_draw(np.ones(N), ls, e)))  # scores matter
        for o in ranks:
            cur = o["epochs"][e]
            assert cur["ls"] == pytest.approx(ls, rel=1e-9)
            got = np.asarray(cur["global_order"])
            np.testing.assert_array_equal(np.sort(got), np.sort(want))  # the same draw, on every rank
            if cur["mode"] == "relaxed":
                np.testing.assert_array_equal(got, want)  # in draw order
            else:  # aggressive: grouped by sample, most-drawn first (tie order is the sampler's choice)
                starts = np.flatnonzero(np.r_[True, got[1:] != got[:-1]])
                counts = np.diff(np.r_[starts, got.size])
                assert len(set(got[starts].tolist())) == starts.size  # each sample's draws contiguous
                assert np.all(np.diff(counts) <= 0)


def test_one_sender_per_daemon_sends_every_ranks_minibatch(ranks, live):
    steps = [(e, k, r) for e in range(EPOCHS) for k in range(len(ranks[0]["epochs"][e]["steps"]))
             for r in range(WORLD)]
    # rank 0 sends one message per rank's minibatch (not one concatenated batch), rank 1 sends none:
    # the daemon received exactly that many, none rejected, none dropped
    assert ranks[0]["stats"]["scores_received"] == len(steps)
    assert sum(ranks[0]["stats"]["scores_rejected"].values()) == 0
    assert ranks[0]["dropped"] == ranks[1]["dropped"] == 0
    assert live.server.counters()["scores_received"] == len(steps)
    # and what arrived is every rank's raw losses for the right files, in that order (the last one wins)
    want = np.ones(N)
    for e, k, r in steps:
        idx = ranks[r]["epochs"][e]["steps"][k]
        want[idx] = fake_loss(idx, r)
    np.testing.assert_array_equal(live.importance(range(N)), want.astype(np.float32))


def test_sender_election():
    assert sender_ranks([("a", "x"), ("a", "x"), ("b", "x"), None, ("b", "x")]) == {0, 2}
    assert sender_ranks([None, None]) == set()
