"""Belady on the announced plan: exact MIN decisions, equal to sim.belady, fallback to --policy."""
import numpy as np
import pytest
from hypothesis import given, note, settings, strategies as st

from shadefs import sim
from shadefs.cache.index import TierIndex
from shadefs.plan.plans import NOT_PLANNED, PlanRegistry
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


def full_sort_victims(pol, fid, size, free):
    """The decision computed from scratch by sorting every resident (the rule of the module docstring;
    what PlanPolicy computed per miss before its heaps): the reference the heaps must equal."""
    plans = pol.plans
    need = size - free
    if size > pol.capacity_bytes:
        return None
    if need <= 0:
        return []
    mine = plans.distance(fid)
    res = np.array(sorted(pol.sizes), dtype=np.int64)
    dist = plans.distances(res)
    never = set(res[dist == NOT_PLANNED].tolist())
    ranking = getattr(pol.inner, "ranking", None)
    order = [f for f in ranking() if f in never] if ranking is not None else sorted(never, reverse=True)
    later = (dist > mine) & (dist != NOT_PLANNED)
    sel = np.lexsort((-res[later], -dist[later]))   # furthest first; ties: highest file id
    order += res[later][sel].tolist()
    out, freed = [], 0
    for v in order:
        out.append(v)
        freed += pol.sizes[v]
        if freed >= need:
            return out
    return None


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(st.data(), st.sampled_from(["static", "lru", "shade"]))
def test_the_heaps_decide_as_a_full_sort_under_many_plans(data, inner):
    """Random opens, admissions, removals, announcements (1-3 streams, repeats, lookahead), skips and
    retirements: every victim list equals the full sort's."""
    n = 24
    imp = Importance(n)
    imp.update(np.arange(n), np.array(data.draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=n,
                                                          max_size=n)), dtype=np.float32))
    cap = data.draw(st.integers(1, 30))
    plans = PlanRegistry(n, window=data.draw(st.sampled_from([2, 4, 64])), unmatched_limit=data.draw(
        st.sampled_from([6, 1000])))
    h, _ = plans.register(None, np.arange(n, dtype=np.int64))
    pol = PlanPolicy(get_policy(inner)(cap, imp), plans)
    idx = TierIndex("ram", cap, pol)
    sizes = data.draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    decided = 0
    ops = ["announce"] * data.draw(st.integers(1, 3)) + [None] * data.draw(st.integers(5, 150))
    for op in ops:
        op = op or data.draw(st.sampled_from(["follow"] * 12 + ["open"] * 2 + ["announce", "remove", "retire"]))
        if op == "announce":
            order = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=60))
            cut = data.draw(st.integers(0, len(order)))
            segs = [cut, len(order) - cut] if 0 < cut < len(order) else [len(order)]
            try:
                plans.announce(h, data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2)), segs,
                               np.array(order, dtype=np.uint32))
            except Exception as e:
                assert getattr(e, "reason", None) == "flood"
        elif op == "remove" and idx.sizes:
            idx.remove(data.draw(st.sampled_from(sorted(idx.sizes))))
        elif op == "retire" and plans.plans:
            plans._remove(plans.plans[data.draw(st.sampled_from(sorted(plans.plans)))], "test")
        elif op == "retire" or op == "remove":
            continue
        else:
            live = [p for p in plans.plans.values() if not p.finished]
            if op == "follow" and live:  # the next unconsumed position of a plan, a little reordered
                p = live[data.draw(st.integers(0, len(live) - 1))]
                q = p.pos + data.draw(st.integers(0, 2))
                f = int(p.ids[min(q, len(p) - 1)])
            else:
                f = data.draw(st.integers(0, n - 1))
            plans.observe(f)
            if f in idx:
                idx.hit(f)
            else:
                want = full_sort_victims(pol, f, sizes[f], idx.free_bytes) if plans.plans else None
                got = pol.victims(f, sizes[f], idx.free_bytes)
                if plans.plans and plans.distance(f) != NOT_PLANNED:
                    assert got == want
                    decided += 1
                if got is not None:
                    assert idx.admit(f, sizes[f]) == got
    assert pol._entries >= sum(1 for f in idx.sizes if pol._home[f] >= 0)
    note(f"{decided} decisions compared")


def test_a_file_nearer_in_another_plan_is_not_taken_for_furthest():
    """0 and 1 are homed in plan A (their nearest use when the heaps were built); then plan B's cursor
    advances and needs 0 at once. The victim for a newcomer needed next is 1, not 0 (A's stale bound)."""
    plans, h, idx = tier(10, 2)
    idx.admit(0, 1)
    idx.admit(1, 1)
    plans.announce(h, 0, 0, [3], np.array([5, 1, 0], dtype=np.uint32))                    # A: 1 at 1, 0 at 2
    plans.announce(h, 1, 0, [9], np.array([6, 6, 6, 6, 0, 1, 9, 9, 8], dtype=np.uint32))  # B: 0 at 4, 1 at 5
    assert idx.admit(8, 1) is None   # 8 is needed after both: bypassed (the heaps are built here)
    for _ in range(4):
        plans.observe(6)             # B's cursor moves to 4: 0 is B's next, 1 B's after
    # distances now: 0 = min(2 [A], 0 [B]) = 0; 1 = min(1 [A], 1 [B]) = 1; newcomer 5 = 0 [A]
    assert idx.admit(5, 1) == [1]
    assert sorted(idx.sizes) == [0, 5]


def test_one_plan_victim_choice_is_logarithmic_not_a_sort():
    """10,000 residents, one plan over them: a miss pops a handful of heap entries, never all of them
    (counted by the heap sizes, not timed), and the structure is rebuilt once per announcement."""
    n = 20_000
    plans = PlanRegistry(n, window=64)
    h, _ = plans.register(None, np.arange(n, dtype=np.int64))
    pol = PlanPolicy(get_policy("static")(10_000, Importance(n)), plans)
    idx = TierIndex("ram", 10_000, pol)
    for f in range(10_000):
        idx.admit(f, 1)
    rng = np.random.default_rng(0)
    order = np.concatenate([rng.permutation(n), rng.permutation(n)]).astype(np.uint32)  # two epochs
    plans.announce(h, 0, 0, [n, n], order)
    admitted = hits = 0
    for f in order[:4000].tolist():
        plans.observe(f)
        if f in idx:
            hits += 1   # its next use moved: re-keyed (one push) at the next search
            continue
        before = len(pol._heaps[0]) if pol._heaps else None
        got = idx.admit(f, 1)
        assert got is None or len(got) == 1
        admitted += got is not None
        if before is not None:  # the search popped and pushed a handful of entries, not n
            assert -3 <= len(pol._heaps[0]) - before <= hits + 2
        hits = 0
    assert admitted > 500 and pol.prepared == 1 and pol.rebuilds == 0  # built at the announcement, off the lock


@pytest.mark.parametrize("inner", ["shade", "lru", "static"])
def test_a_hit_reaches_the_inner_policy_in_its_current_mode(inner):
    """PlanPolicy hands ``on_hit`` straight to its inner policy (no frame of its own), also after
    ``defer()``: shade then only queues the hit, as the daemon's background thread expects."""
    _, _, idx = tier(8, 100, inner)
    pol = idx.policy
    for f in (1, 2, 3):
        pol.on_insert(f, 10)
    deferred = pol.defer(lambda: None)
    assert deferred is (inner == "shade")
    pol.on_hit(1)
    if inner == "shade":
        assert pol.inner.pending() == 1 and pol.inner.ranking() == [1, 2, 3]  # queued, not applied
        assert pol.apply_pending(64) is False and pol.inner.ranking() == [2, 3, 1]
    elif inner == "lru":
        assert list(pol.inner._order) == [2, 3, 1]                             # applied at once


def test_plans_that_advance_at_different_speeds_compare_distances_in_opens():
    """Plan A (files 0..1999) gets three opens for each of plan B's (files 2000..3999). Resident a is 300
    positions ahead of A's cursor, b 200 ahead of B's: by positions a is used last, but B advances at a
    third of A's speed, so b's next use is the later one in opens (about 200 x 4 = 800 against 300 x 4/3
    = 400): Belady evicts b for a newcomer A needs next."""
    n = 4100
    plans = PlanRegistry(n)
    h, _ = plans.register(None, np.arange(n, dtype=np.int64))
    rng = np.random.default_rng(9)
    a_order, b_order = rng.permutation(2000), 2000 + rng.permutation(2000)
    plans.announce(h, 0, 0, [2000], a_order.astype(np.uint32))
    plans.announce(h, 1, 0, [2000], b_order.astype(np.uint32))
    plans.announce(h, 2, 0, [100], np.arange(4000, 4100, dtype=np.uint32))  # C: its reader never starts
    pol = PlanPolicy(get_policy("static")(2, Importance(n)), plans)
    idx = TierIndex("ram", 2, pol)
    ia = ib = 0
    for k in range(2048):                     # one measuring period: A, A, A, B, ...
        if k % 4 == 3:
            plans.observe(int(b_order[ib]))
            ib += 1
        else:
            plans.observe(int(a_order[ia]))
            ia += 1
    A, B = plans.plans[(h, 0)], plans.plans[(h, 1)]
    assert (A.pos, B.pos) == (1536, 512)
    assert plans.distance(4001) == 2          # C consumed nothing in the period: its stride doubled
    a, b = int(a_order[A.pos + 300]), int(b_order[B.pos + 200])
    assert idx.admit(a, 1) == [] and idx.admit(b, 1) == []
    newcomer = int(a_order[A.pos + 10])
    assert plans.distance(b) > plans.distance(a) > plans.distance(newcomer)
    assert idx.admit(newcomer, 1) == [b]
    assert sorted(idx.sizes) == sorted([a, newcomer])
