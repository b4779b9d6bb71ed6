"""A planned job whose reader drops each file's pages (POSIX_FADV_DONTNEED on the same open, the regime of a
dataset larger than the reader's memory), over a real S3 server (moto) behind the 2 ms latency proxy: the
kernel keeps nothing between epochs, the kernel front end's page probe finds that out, and every epoch
is prefetched, not only the first."""
import time

import pytest

from shadefs.testing.s3 import LatencyProxyProcess

from conftest import require  # noqa: E402
from mountutil import s3_class_objects  # noqa: E402

torch = require("torch")
from torch.utils.data import DataLoader  # noqa: E402

from shadefs.hooks import PlanSampler  # noqa: E402
from shadefs.testing.datasets import FileDataset as Files  # noqa: E402

BUCKET = "shadefs-plan-pages"
N, SIZE, EPOCHS = 200, 16_000, 3


@pytest.fixture
def s3_tree(moto_server):
    with s3_class_objects(moto_server, BUCKET, N, SIZE, seed=1) as server:
        yield server


def test_every_epoch_is_prefetched_when_the_reader_drops_its_pages(s3_tree, mount, tmp_path):
    with LatencyProxyProcess(s3_tree.port, delay_ms=1, rate="1gbit") as proxy:
        # the setup the design measured: no RAM tier, a disk tier of a fifth of the files, static
        m = mount(f"s3://{BUCKET}/train", "--ram-cache", "0", "--disk-cache", str(tmp_path / "disk"),
                  "--disk-cache-size", "20%", "--policy", "static",
                  "--backend-opt", f"endpoint_url={proxy.endpoint}")
        ds = Files(m.path, drop_pages=True)
        assert len(ds) == N
        sampler = PlanSampler(ds, seed=0, epochs=EPOCHS)
        loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2, multiprocessing_context="spawn",
                            persistent_workers=True)
        per_epoch = []
        before = m.full_stats()
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            for batch in loader:             # a training step's worth of work per batch
                assert batch.tolist() == [SIZE] * len(batch)
                time.sleep(0.01)
            s = m.full_stats()
            p, q = s["prefetch"], before["prefetch"]
            per_epoch.append({"opens": s["opens"] - before["opens"],
                              "hits": sum(s["hits"].values()) - sum(before["hits"].values()),
                              "prefetched": p["ready"] + p["late"] - q["ready"] - q["late"],
                              "misses": s["misses"] - before["misses"],
                              "kernel_kept": p["kernel_kept"] - q["kernel_kept"],
                              "kernel_reads": p["kernel_reads"] - q["kernel_reads"]})
            before = s
        sampler.close()
    for e in per_epoch:
        assert e["opens"] == N and e["hits"] + e["prefetched"] + e["misses"] == N, per_epoch
    for e in per_epoch[1:]:
        # before, the daemon took recently opened files to be in the kernel's pages: 0 prefetched here
        assert e["hits"] + e["prefetched"] >= 0.95 * N, per_epoch
    for e in per_epoch:
        # the reader dropped every page: the kernel returned none, nothing was left to it
        assert (e["kernel_kept"], e["kernel_reads"]) == (0, 0), per_epoch
    assert s["opens"] == sum(s["hits"].values()) + s["prefetch"]["ready"] + s["prefetch"]["late"] + s["misses"]
