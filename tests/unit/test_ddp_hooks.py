"""Two real torch.distributed (gloo) processes: one global draw, disjoint shards, all-gathered scores,
rank 0's sampling state shared, and one score sender per daemon."""
import pickle
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from shadefs.hooks import ScoreReporter, ShadeSampler
from shadefs.hooks.distributed import sender_ranks
from shadefs.hooks.sampler import rank_transform

MOUNT = "/mnt/fake-shadefs"
N, BS, EPOCHS, WORLD = 37, 5, 3, 2


class IndexDataset:
    def __init__(self, n):
        self.root = MOUNT + "/train"
        self.samples = [(f"{self.root}/c{i % 3}/img{i:05d}.png", i % 3) for i in range(n)]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return torch.zeros(1), i % 3, i


class RecordingClient:
    """Both ranks see the same endpoint on the same host: one daemon, so one sender."""

    mount_root = MOUNT
    endpoint = "ipc:///tmp/shadefs-test-node.sock"
    dropped = 0

    def __init__(self):
        self.sent = []

    def resident(self, paths):
        return np.zeros(len(paths), dtype=bool)

    def send_scores(self, paths, scores):
        self.sent.append((list(paths), np.asarray(scores, dtype=np.float32).copy()))
        return True


def fake_loss(idx, rank):
    return (np.sin(np.asarray(idx) * 1.7 + rank) + 1.5).astype(np.float32)


def _worker(rank, tmp):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=WORLD)
    try:
        ds = IndexDataset(N)
        client = RecordingClient()
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
        out = dict(rank=sampler.rank, world=sampler.num_replicas, epochs=epochs, sent=client.sent)
        with open(f"{tmp}/rank{rank}.pkl", "wb") as f:
            pickle.dump(out, f)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    ctx = mp.spawn(_worker, args=(str(tmp),), nprocs=WORLD, join=False)
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


def test_next_draw_uses_the_global_scores(ranks):
    ref = ShadeSampler(IndexDataset(N), seed=3, num_replicas=WORLD, rank=0, client=False)
    for e in range(1, EPOCHS):
        prev = ranks[0]["epochs"][e - 1]
        cur = ranks[0]["epochs"][e]
        ref.weights[:] = prev["weights"]
        losses = np.concatenate([fake_loss(i, r) for r in range(WORLD) for i in ranks[r]["epochs"][e - 1]["steps"]])
        ref.on_epoch_end(float(losses.astype(np.float64).mean()))
        ref.mode = cur["mode"]
        np.testing.assert_array_equal(ref.plan_epoch(e).global_order, cur["global_order"])


def test_one_sender_per_daemon_sends_every_ranks_minibatch(ranks):
    assert ranks[1]["sent"] == []
    sent = ranks[0]["sent"]
    steps = [s for e in range(EPOCHS) for k in range(len(ranks[0]["epochs"][e]["steps"]))
             for s in [(e, k, r) for r in range(WORLD)]]
    assert len(sent) == len(steps)  # one message per rank's minibatch, not one concatenated batch
    for (paths, vals), (e, k, r) in zip(sent, steps):
        idx = ranks[r]["epochs"][e]["steps"][k]
        assert paths == [f"train/c{i % 3}/img{i:05d}.png" for i in idx]
        np.testing.assert_array_equal(vals, fake_loss(idx, r))


def test_sender_election():
    assert sender_ranks([("a", "x"), ("a", "x"), ("b", "x"), None, ("b", "x")]) == {0, 2}
    assert sender_ranks([None, None]) == set()
