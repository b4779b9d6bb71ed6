"""A planned job over a mount whose kernel cache is on, the page cache unbounded: the pages the kernel keeps
from an epoch serve the next one. Before prefetching a file again the prefetcher asks the kernel for its
first and last page (FUSE_NOTIFY_RETRIEVE); the kernel returns them, so those files are left to it: not
read again, their opens fill no tier. The backend reads each file once over the whole run, as the same
job with ``shuffle=True`` does."""
import pytest
from conftest import require

torch = require("torch")  # skipped without torch; failed under CI=true

from shadefs.hooks import PlanSampler  # noqa: E402
from shadefs.testing.datasets import FileDataset as Files  # noqa: E402

from mountutil import class_tree, wait_for  # noqa: E402


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    return src, {rel: len(data) for rel, data in class_tree(src, 60, 3, 700, 2500, seed=12).items()}


def test_files_the_kernel_keeps_are_read_once_over_a_planned_run(tree, mount):
    src, sizes = tree
    total = sum(sizes.values())
    # a RAM tier of a fifth of the files: Belady evicts, so before, an evicted file was read again
    m = mount(src, "--ram-cache", str(total // 5))
    ds = Files(m.path)
    sampler = PlanSampler(ds, seed=3, lookahead_epochs=1, epochs=3)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        it = iter(sampler)
        assert sampler.flush()
        wait_for(lambda: m.full_stats()["prefetch"]["plans_announced"] >= epoch + 1, what="the plan")
        for i in it:
            assert ds[i] == sizes[ds.rel[i]]
        s = m.full_stats()
        if epoch == 0:
            first = s
    sampler.close()
    s = m.full_stats()
    assert s["opens"] == 3 * len(sizes)
    # every file once: the first epoch's misses and prefetches; nothing after it
    assert s["backend_bytes"] == first["backend_bytes"] == total
    assert s["prefetch"]["fetched_bytes"] == first["prefetch"]["fetched_bytes"] <= total
    assert s["prefetch"]["wasted_bytes"] == 0
    # epochs 2 and 3: every open no tier served was left to the kernel (it held the pages when asked), and
    # no READ of one reached us. A file is asked about once more when its open comes while the
    # prefetcher's question is under way (the answer then finds it opened, and the open asks again)
    p = s["prefetch"]
    assert p["kernel_kept"] == s["opens"] - len(sizes) - sum(s["hits"].values()) <= p["probed"], p
    assert p["kernel_reads"] == 0
