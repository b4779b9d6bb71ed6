"""The daemon's live counters and the simulator agree exactly on the same recorded trace."""
import json
import os
import random
import subprocess
import sys

import pytest

from shadefs import sim

pytestmark = pytest.mark.usefixtures("fuse")  # skipped without /dev/fuse + fusermount3; failed under CI=true


@pytest.mark.parametrize("policy", ["static", "lru", "fifo"])
def test_live_stats_equal_the_replay(small_tree, mount, tmp_path, policy):
    src, spec = small_tree
    trace = tmp_path / "trace.csv"
    m = mount(src, "--ram-cache", "12000", "--policy", policy, "--trace", trace)
    rng = random.Random(policy)
    names = sorted(spec)
    held = []
    for _ in range(120):  # one reader, so the order of opens is the trace's order
        rel = rng.choice(names)
        f = open(os.path.join(m.path, rel), "rb")
        assert f.read() == spec[rel]
        # the two previous files stay open while this one is opened (and the kernel sends RELEASE after
        # close() returns, asynchronously, with no wait here): an eviction often finds its victim held
        # open. A held victim leaves the tier like any other (its bytes counted against LOOSE_BUFFERS),
        # so the victims are the replay's
        held.append(f)
        if len(held) > 2:
            held.pop(0).close()
    for f in held:
        f.close()
    live = m.stats()  # also flushes the trace
    t = sim.read_trace(str(trace))
    assert t.requests == live["opens"] == 120
    result = sim.simulate(t, policy, 12000)
    assert result.hits == live["hits"]["ram"]
    assert result.hit_ratio == pytest.approx(live["hit_ratio"])
    assert result.byte_hit_ratio == pytest.approx(live["byte_hit_ratio"])
    # and the CLI's JSON parses and says the same
    r = subprocess.run([sys.executable, "-m", "shadefs", "simulate", str(trace), "--cache-size", "12000",
                        "--policy", policy, "--json"], capture_output=True, text=True, check=True)
    out = json.loads(r.stdout)
    assert set(out) == {"requests", "distinct_files", "distinct_bytes", "results"}
    row = [x for x in out["results"] if x["policy"] == policy][0]
    assert row["cache_bytes"] == 12000 and row["hit_ratio"] == pytest.approx(live["hit_ratio"])
    assert [x["policy"] for x in out["results"]] == [policy, "opt"]


def _top(paths, values, resident) -> tuple:
    """(residents, residents among the top ceil(1.2 x residents) files by importance)."""
    import math

    import numpy as np

    n = int(resident.sum())
    top = np.zeros(len(paths), dtype=bool)
    top[np.argsort(-values, kind="stable")[:math.ceil(1.2 * n)]] = True
    return n, int((resident & top).sum())


@pytest.mark.parametrize("size", ["25%", "40%"])
def test_the_disk_tier_keeps_the_top_of_the_ranking_and_the_replay_keeps_the_same_files(tmp_path, mount, size):
    """``--policy shade`` on the NVMe tier alone (small files packed into segments, evictions leaving dead
    records that compaction reclaims): every file scored, two shuffled passes in the regime (each file's
    pages dropped after its read). The residents are the top of the ranking, and the simulator, charging
    the tier's device bytes per entry (``--disk-pack-below``) within its budget for entries, ends with
    the very same files and counts the same hits."""
    import numpy as np

    from mountutil import class_tree
    from shadefs.control.client import ControlClient, find_endpoint
    from shadefs.testing.regime import read_dropping

    src = tmp_path / "src"
    spec = class_tree(src, 3000, 4, 150, 900, seed=11)
    paths = sorted(spec)
    values = (10 + np.random.default_rng(3).permutation(len(paths))).astype(np.float32)  # distinct
    trace = tmp_path / "trace.csv"
    m = mount(src, "--ram-cache", "0", "--disk-cache", tmp_path / "cache", "--disk-cache-size", size,
              "--policy", "shade", "--score-transform", "raw", "--no-kernel-cache", "--trace", trace)
    rng = random.Random(size)
    with ControlClient(find_endpoint(m.path)) as c:
        for i in range(0, len(paths), 64):  # minibatches, as a training step reports them
            c.send_scores(paths[i:i + 64], values[i:i + 64])
        c.stats()  # a round trip: every score was applied before it
        for _ in range(2):
            for rel in rng.sample(paths, len(paths)):
                assert read_dropping(os.path.join(m.path, rel)) == spec[rel]
        resident = c.resident(paths)
    live = m.stats()
    disk = live["tiers"]["disk"]
    assert live["opens"] == 6000 and disk["pack_below"] == 64 << 10
    assert disk["evictions"] > 0 and live["hits"]["disk"] > 0
    n, in_top = _top(paths, values, resident)
    assert n == disk["files"]
    # SHADE's rule admits any file while the tier has room and, once full, only a file more important
    # than every victim it needs: after a second pass (every non-resident missed once more) the
    # residents are the top of the ranking. All of them here (sizes, scores and order are seeded); a resident
    # outside the top could only be one admitted while there was room that no more important miss
    # large enough to need it as a victim came to evict
    assert in_top == n and n > 150  # (207 at 25 %, 780 at 40 %, with today's metadata sizes)
    # the replay of the same trace with the same importance keeps exactly these files
    t = sim.read_trace(str(trace))
    scores = tmp_path / "scores.csv"
    sim.write_scores(str(scores), paths, values)
    r = sim.simulate(t, "shade", disk["entry_bytes"], sim.load_scores(str(scores), t),
                     pack_below=disk["pack_below"], residents=True)
    assert set(r.residents) == {p for p, f in zip(paths, resident) if f}
    assert r.hits == live["hits"]["disk"]
    out = subprocess.run([sys.executable, "-m", "shadefs", "simulate", str(trace), "--cache-size",
                          str(disk["entry_bytes"]), "--policy", "shade", "--scores", str(scores),
                          "--disk-pack-below", "64KiB", "--json"], capture_output=True, text=True, check=True)
    (row,) = json.loads(out.stdout)["results"]  # no opt: it replays bytes as they are
    assert row["policy"] == "shade" and row["hit_ratio"] == pytest.approx(live["hit_ratio"])
