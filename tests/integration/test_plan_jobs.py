"""Plans of several jobs over one mount: each job's plan follows its own opens (its process and its
DataLoader workers) and nobody else's; a reader of no plan (an evaluation loop, a copy) moves no cursor."""
import os
import random
import subprocess
import sys
import textwrap

import pytest
from conftest import require

require("torch")  # the jobs run PlanSampler + DataLoader; skipped without torch, failed under CI=true

from mountutil import class_tree, wait_for  # noqa: E402

# READER: a reader that announces nothing (every file once, in a shuffled order)
from shadefs.bench.plan_jobs import READER  # noqa: E402

N = 3000

JOB = textwrap.dedent("""
    import sys
    from torch.utils.data import DataLoader
    from shadefs.hooks import PlanSampler
    from shadefs.testing.datasets import FileDataset

    ds = FileDataset(sys.argv[1])
    sampler = PlanSampler(ds, seed=int(sys.argv[2]), lookahead_epochs=0)
    iter(sampler)                                    # announce epoch 0 before its first open
    assert sampler.flush()
    print("announced", flush=True)
    assert sys.stdin.readline() == "go\\n"
    sampler.set_epoch(0)                             # the DataLoader's iter() announces the same order again
    loader = DataLoader(ds, batch_size=16, sampler=sampler, num_workers=2, multiprocessing_context="fork")
    print(sum(int(b.sum()) for b in loader), flush=True)
    sampler.close()
    """)


@pytest.mark.both_frontends
def test_two_planned_jobs_and_an_unplanned_reader_keep_each_plan_on_its_own_opens(tmp_path, mount):
    src = tmp_path / "src"
    spec = class_tree(src, N, 6, 100, 400, seed=3)
    total = sum(len(v) for v in spec.values())
    m = mount(src, "--ram-cache", "30%", "--no-kernel-cache")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    jobs = [subprocess.Popen([sys.executable, "-c", JOB, m.path, str(seed)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env) for seed in (1, 2)]
    try:
        for j in jobs:
            assert j.stdout.readline() == "announced\n"
        wait_for(lambda: m.full_stats()["prefetch"]["plans_announced"] == 2, what="both plans installed")
        reader = subprocess.Popen([sys.executable, "-c", READER, m.path], stdout=subprocess.PIPE, text=True)
        for j in jobs:
            j.stdin.write("go\n")
            j.stdin.flush()
        out = [j.communicate(timeout=120)[0] for j in jobs]
        assert reader.communicate(timeout=120)[0] == f"{total}\n"
    finally:
        for j in jobs:
            j.kill()
    assert [o.split() for o in out] == [[str(total)]] * 2
    assert [j.returncode for j in jobs] == [0, 0]
    p = m.full_stats()["prefetch"]
    # each plan followed exactly its own job's opens (each file once, in its window) and nobody else's
    assert (p["plans_retired"], p["plans_finished"]) == (0, 2), p
    assert (p["plans_matched"], p["plans_unmatched"]) == (2 * N, 0), p
    assert p["plans_foreign_opens"] > 0                   # the reader opened while the plans were active
