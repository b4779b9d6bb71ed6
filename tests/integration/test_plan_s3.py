"""A PlanSampler epoch over a real S3 server process (moto) behind the 2 ms RTT latency proxy: the
prefetcher serves the epoch's opens as ``ready`` and reads each file once."""
import os
import time

import pytest

from shadefs.testing.s3 import LatencyProxyProcess

from conftest import require  # noqa: E402
from mountutil import s3_class_objects  # noqa: E402

torch = require("torch")
from torch.utils.data import DataLoader  # noqa: E402

from shadefs.hooks import PlanSampler  # noqa: E402
from shadefs.testing.datasets import FileDataset as Files  # noqa: E402

BUCKET = "shadefs-plan"
N, SIZE = 240, 16_000


@pytest.fixture
def s3_tree(moto_server):
    with s3_class_objects(moto_server, BUCKET, N, SIZE, seed=0) as server:
        yield server


def test_plan_sampler_epoch_over_slow_s3_is_served_ready_and_read_once(s3_tree, mount):
    with LatencyProxyProcess(s3_tree.port, delay_ms=1, rate="1gbit") as proxy:
        m = mount(f"s3://{BUCKET}/train", "--ram-cache", "10%", "--no-kernel-cache",
                  "--backend-opt", f"endpoint_url={proxy.endpoint}")
        ds = Files(m.path)
        assert len(ds) == N
        sampler = PlanSampler(ds, seed=0, lookahead_epochs=0)
        loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2, multiprocessing_context="spawn",
                            persistent_workers=True)
        before = m.full_stats()
        for batch in loader:             # a training step's worth of work per batch
            assert batch.tolist() == [SIZE] * len(batch)
            time.sleep(0.01)
        s = m.full_stats()
    p = s["prefetch"]
    opens = s["opens"] - before["opens"]
    assert opens == N
    assert s["opens"] == s["hits"]["ram"] + s["hits"]["disk"] + p["ready"] + p["late"] + s["misses"]
    assert p["ready"] >= 0.95 * N, p
    assert s["backend_bytes"] == N * SIZE     # each file read exactly once: no miss re-read a prefetch
    assert p["fetched_bytes"] == N * SIZE and p["wasted_bytes"] == 0
    assert p["plans_retired"] == 0
