"""Two DDP ranks (gloo, two processes) each announce their DistributedSampler shard to one daemon."""
import os

import pytest

from conftest import require  # noqa: E402

torch = require("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

from shadefs.testing.datasets import FileDataset as Files  # noqa: E402

N = 64


def _rank(rank, root, init_file, out_dir):
    from shadefs.hooks import PlanSampler

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        ds = Files(root)
        sampler = PlanSampler(ds, sampler=DistributedSampler(ds, num_replicas=2, rank=rank, seed=0),
                              lookahead_epochs=0)
        sampler.set_epoch(0)
        order = list(iter(sampler))
        assert sampler.flush(20)
        assert sampler.announcer.stream == rank and sampler.announcer.sent == 1
        import time

        from shadefs.control.client import ControlClient, find_endpoint

        with ControlClient(find_endpoint(root)) as c:  # both plans are announced before anyone reads
            deadline = time.monotonic() + 60
            while c.stats()["prefetch"]["plans_announced"] < 2:
                assert time.monotonic() < deadline, "the daemon did not announce both plans"
                time.sleep(0.02)
        for i in order:
            ds[i]
        with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
            f.write(",".join(map(str, order)))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_two_ranks_announce_their_shards_to_one_daemon(mount, tmp_path):
    src = tmp_path / "src"
    for i in range(N):
        (src / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"c{i % 2}" / f"{i:03d}.bin").write_bytes(os.urandom(1000 + i))
    m = mount(src, "--ram-cache", "0", "--no-kernel-cache")
    mp.start_processes(_rank, args=(m.path, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    orders = [list(map(int, (tmp_path / f"rank{r}.txt").read_text().split(","))) for r in range(2)]
    assert sorted(orders[0] + orders[1]) == list(range(N))     # disjoint shards covering the dataset
    s = m.full_stats()
    p = s["prefetch"]
    assert s["plans_received"] == 2
    assert p["plans_announced"] == 2 and p["tables"] == 2
    assert p["plans_finished"] == 2 and p["plans_retired"] == 0 and p["plans_active"] == 0
    assert s["opens"] == N and p["ready"] + p["late"] + s["misses"] == N
    assert p["ready"] >= N // 2
