"""Belady on the announced plan: exact MIN decisions, equal to sim.belady, fallback to --policy."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from shadefs import sim
from shadefs.cache.index import TierIndex
from shadefs.plan.plans import PlanRegistry
from shadefs.plan.policy import PlanPolicy
from shadefs.policies.base import Importance, get_policy


def tier(n, capacity, inner="static", importance=None):
    plans = PlanRegistry(n)
    h, _ = plans.register(None, np.arange(n, dtype=np.int64))
    imp = importance or Importance(n)
    idx = TierIndex("ram", capacity, PlanPolicy(get_policy(inner)(capacity, imp), plans))
    return plans, h, idx


def test_victim_is_the_resident_used_furthest_in_the_future():
    plans, h, idx = tier(4, 3)
    for f in (0, 1, 2):
        assert idx.admit(f, 1) == []
    # future: 3 0 1 3 2 -> admitting 3 (next used at 3) evicts 2 (next used at 4), not 0 or 1
    plans.announce(h, 0, 0, [5], np.array([3, 0, 1, 3, 2], dtype=np.uint32))
    plans.observe(3)
    assert idx.admit(3, 1) == [2]
    assert sorted(idx.sizes) == [0, 1, 3]


def test_unplanned_residents_go_first_and_a_far_newcomer_is_bypassed():
    plans, h, idx = tier(6, 3)
    for f in (0, 1, 2):
        idx.admit(f, 1)
    plans.announce(h, 0, 0, [4], np.array([4, 1, 0, 4], dtype=np.uint32))  # 2 is never used again
    plans.observe(4)
    assert idx.admit(4, 1) == [2]                 # never = infinitely far: first victim
    # 5 is not planned: may not displace planned residents
    assert idx.admit(5, 1) is None and 5 not in idx
    plans.observe(1)
    plans.observe(0)
    # newcomer 3 planned at no position at all, residents 0, 1 have no further use, 4 has one
    assert idx.admit(3, 1) is None


def test_newcomer_needed_later_than_every_resident_is_not_admitted():
    plans, h, idx = tier(4, 2)
    idx.admit(0, 1)
    idx.admit(1, 1)
    plans.announce(h, 0, 0, [4], np.array([2, 0, 1, 2], dtype=np.uint32))
    plans.observe(2)
    assert idx.admit(2, 1) is None               # 2 is next used at position 3, after 0 and 1
    assert sorted(idx.sizes) == [0, 1]


def test_variable_sizes_free_enough_bytes_from_the_furthest():
    plans, h, idx = tier(5, 10)
    idx.admit(0, 4)
    idx.admit(1, 3)
    idx.admit(2, 3)
    plans.announce(h, 0, 0, [5], np.array([3, 0, 3, 1, 2], dtype=np.uint32))
    plans.observe(3)
    assert idx.admit(3, 5) == [2, 1]             # furthest first (2 at 4, 1 at 3) until 5 bytes are free
    assert idx.used_bytes == 9


def test_without_a_plan_it_is_the_inner_policy():
    plans, h, idx = tier(3, 2, inner="lru")
    idx.admit(0, 1)
    idx.admit(1, 1)
    idx.hit(0)
    assert idx.admit(2, 1) == [1]


def test_shade_order_among_unplanned_residents():
    imp = Importance(5)
    imp.update(np.array([0, 1, 2]), np.array([3.0, 1.0, 2.0], dtype=np.float32))
    plans, h, idx = tier(5, 3, inner="shade", importance=imp)
    for f in (0, 1, 2):
        idx.admit(f, 1)
    plans.announce(h, 0, 0, [1], np.array([4], dtype=np.uint32))
    plans.observe(4)  # consumed; announce again with 4 ahead
    plans.announce(h, 1, 0, [2], np.array([4, 4], dtype=np.uint32))
    plans.observe(4)
    assert idx.admit(4, 1) == [1]                # least important of the unplanned


@pytest.mark.parametrize("inner", ["static", "lru", "fifo", "shade"])
def test_hand_made_trace_equals_belady(inner):
    paths = "a b c d a b e a b c d e".split()
    t = sim.Trace.from_requests(paths)
    for cap in range(0, 6):
        assert sim.simulate_plan(t, inner, cap).hits == sim.belady(t, cap).hits


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=80), st.integers(0, 12),
       st.lists(st.integers(1, 4), min_size=10, max_size=10), st.sampled_from(["static", "lru", "fifo", "shade"]))
def test_random_traces_equal_sim_belady(ids, cap, sizes, inner):
    t = sim.Trace.from_requests([f"f{i}" for i in ids], [sizes[i] for i in ids])
    mask_opt = np.zeros(t.requests, dtype=bool)
    mask_plan = np.zeros(t.requests, dtype=bool)
    a = sim.belady(t, cap, hit_mask=mask_opt)
    b = sim.simulate_plan(t, inner, cap, hit_mask=mask_plan)
    assert b.hits == a.hits and b.hit_bytes == a.hit_bytes
    assert np.array_equal(mask_opt, mask_plan)
    assert b.policy == inner + "+plan"


def test_simulate_cli_plan_mode(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("path\n" + "\n".join("a b c a b d a b c d".split()) + "\n")
    from shadefs.cli import main
    assert main(["simulate", str(trace), "--cache-size", "2", "--policy", "static", "--plan", "--json"]) == 0
    import json
    out = json.loads(capsys.readouterr().out)
    rows = {r["policy"]: r["hit_ratio"] for r in out["results"]}
    assert set(rows) == {"static", "static+plan", "opt"}
    assert rows["static+plan"] == rows["opt"]
