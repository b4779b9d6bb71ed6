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
