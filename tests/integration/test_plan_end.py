"""A job's last plan ends with the job (docs/protocol.md ``withdraw``): on a real mount and daemon, a
sampler's close() -- or a clean interpreter exit -- drops the plan at once and counts its prefetched but
unopened bytes as wasted; a crashed job's plan stays until the daemon's expiry."""
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import require

torch = require("torch")  # skipped without torch; failed under CI=true

from shadefs.control.client import ControlClient, find_endpoint  # noqa: E402
from shadefs.hooks import PlanSampler, ShadeSampler  # noqa: E402
from shadefs.testing.datasets import FileDataset as Files  # noqa: E402

from mountutil import class_tree, metrics_port, scrape, wait_for  # noqa: E402


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    return src, {rel: len(data) for rel, data in class_tree(src, 60, 3, 700, 2500, seed=11).items()}


def prefetch(m):
    return m.full_stats()["prefetch"]


def flush(sampler):
    return (sampler.announcer if isinstance(sampler, ShadeSampler) else sampler).flush()


def read_epoch(sampler, ds, m, announced):
    it = iter(sampler)
    assert flush(sampler)
    wait_for(lambda: m.full_stats()["plans_received"] >= announced, what="the plan reached the daemon")
    for i in it:
        ds[i]


@pytest.mark.parametrize("kind", ["plan", "shade"])
def test_close_withdraws_the_plan_and_counts_its_window_as_wasted(tree, mount, kind):
    src, sizes = tree
    total = sum(sizes.values())
    # no cache tier: every file of the lookahead epoch is fetchable, so the window ends up holding all of them
    m = mount(src, "--ram-cache", "0", "--no-kernel-cache", "--metrics-port", "0")
    ds = Files(m.path)
    if kind == "plan":
        sampler = PlanSampler(ds, seed=2, lookahead_epochs=1)    # announces [epoch 0, epoch 1]
    else:
        sampler = ShadeSampler(ds, seed=2)                       # [epoch 0], then [epoch 0, provisional 1]
    read_epoch(sampler, ds, m, 1)
    if kind == "shade":
        assert flush(sampler)
        wait_for(lambda: m.full_stats()["plans_received"] == 2, what="the provisional draw")
        nxt = sampler.provisional.order
    else:
        nxt = sampler.order(1)
    # the prefetcher reads epoch 1 in plan order and waits at the first repeat of a file it holds (that
    # use needs a read of its own once the first is opened): a permutation is prefetched whole
    head = []
    for i in nxt.tolist():
        if i in head:
            break
        head.append(i)
    ahead = sum(sizes[ds.rel[i]] for i in head)
    assert 0 < ahead <= total and (kind == "shade" or ahead == total)
    wait_for(lambda: prefetch(m)["window_used_bytes"] == ahead, what="epoch 1 prefetched up to its first repeat")
    before = prefetch(m)
    assert before["plans_active"] == 1 and before["wasted_bytes"] == 0
    sampler.close()
    wait_for(lambda: prefetch(m)["plans_active"] == 0, timeout=10, what="the plan withdrawn")
    after = prefetch(m)
    assert after["wasted_bytes"] == ahead                      # exactly what the window held for it
    assert after["window_used_bytes"] == 0
    assert (after["plans_withdrawn"], after["plans_retired"], after["plans_finished"]) == (1, 0, 0)
    got = scrape(metrics_port(m))
    assert got[("shadefs_prefetch_wasted_bytes_total", ())] == ahead
    assert got[("shadefs_plans_ended_total", (("why", "withdrawn"),))] == 1
    assert got[("shadefs_plans_ended_total", (("why", "retired"),))] == 0
    assert "retired plan" not in m.log()
    sampler.close()                                            # idempotent: nothing more is sent
    assert prefetch(m)["plans_withdrawn"] == 1


CHILD = textwrap.dedent("""
    import gc, os, sys, time
    from shadefs.control.client import ControlClient, find_endpoint
    from shadefs.hooks import PlanSampler
    from shadefs.hooks.plan import PlanAnnouncer
    from shadefs.testing.datasets import FileDataset
    PlanAnnouncer.IDLE_S = 0.2                        # the announcer's thread ends soon after its last send

    def train():
        ds = FileDataset(sys.argv[1])
        sampler = PlanSampler(ds, seed=int(sys.argv[3]), lookahead_epochs=1)
        it = iter(sampler)
        assert sampler.flush()
        c = ControlClient(find_endpoint(sys.argv[1]))
        want = int(sys.argv[4])
        deadline = time.monotonic() + 30
        while c.stats()["plans_received"] < want:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        c.close()
        if sys.argv[2] == "crash":
            for i in it:
                ds[i]
            os._exit(3)                              # no atexit: the daemon keeps the plan until it expires
        while sampler.announcer._thread.is_alive():  # idle: the thread no longer holds the announcer
            time.sleep(0.05)
        return sampler

    sampler = train()
    if sys.argv[2] == "dropped":
        del sampler                                  # dropped without close(), before the exit
        gc.collect()
        os._exit(0)                                  # not through atexit: the collection sent the withdraw
    """)


def test_a_clean_exit_or_a_dropped_sampler_withdraws_and_a_crash_leaves_the_plan_to_expire(tree, mount, tmp_path):
    src, _ = tree
    m = mount(src, "--ram-cache", "0", "--no-kernel-cache")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    crash = subprocess.run([sys.executable, str(script), m.path, "crash", "1", "1"], env=env, timeout=120)
    assert crash.returncode == 3
    p = prefetch(m)
    assert (p["plans_active"], p["plans_withdrawn"]) == (1, 0)  # left to the expiry (idle_s)
    # a second job announces and ends without reading (its reads would retire the crashed job's plan: most
    # opens of its files would not match it) and without calling close(): its exit sends the withdraw
    clean = subprocess.run([sys.executable, str(script), m.path, "exit", "2", "2"], env=env, timeout=120)
    assert clean.returncode == 0
    wait_for(lambda: prefetch(m)["plans_withdrawn"] == 1, timeout=10, what="the clean exit's withdraw")
    p = prefetch(m)
    assert p["plans_active"] == 1 and p["plans_retired"] == 0   # only the crashed job's plan is left
    # a third job drops its sampler (a training function's local) after the thread went idle
    dropped = subprocess.run([sys.executable, str(script), m.path, "dropped", "3", "3"], env=env, timeout=120)
    assert dropped.returncode == 0
    wait_for(lambda: prefetch(m)["plans_withdrawn"] == 2, timeout=10, what="the dropped sampler's withdraw")
    assert prefetch(m)["plans_active"] == 1
    c = ControlClient(find_endpoint(m.path))
    try:
        assert c.stats()["scores_rejected"]["unknown_kind"] == 0
    finally:
        c.close()
