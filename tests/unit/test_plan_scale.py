"""Plans at scale: bounded bookkeeping with tiers that never evict, announcements built off the lock,
plan state that follows the plan's length, registration that does not copy the table under the lock."""
import gc
import threading
import weakref

import numpy as np

from shadefs.cache.index import TierIndex
from shadefs.plan.plans import PlanRegistry
from shadefs.plan.policy import PlanPolicy
from shadefs.policies.base import Importance, get_policy


def tiers(n, capacities, inner="lru"):
    plans = PlanRegistry(n)
    h, _ = plans.register(None, np.arange(n, dtype=np.int64))
    imp = Importance(n)
    idx = [TierIndex(f"t{i}", c, PlanPolicy(get_policy(inner)(c, imp), plans)) for i, c in enumerate(capacities)]
    return plans, h, idx


def test_a_tier_that_is_off_or_never_evicts_keeps_no_growing_backlog():
    n = 500
    plans, h, (off, big) = tiers(n + 1, [0, n])
    for f in range(n):
        assert big.admit(f, 1) == []
    plans.announce(h, 0, 0, [2], np.array([n, 1], dtype=np.uint32))
    (victim,) = big.admit(n, 1)                       # one victim search: the structure is current
    big.remove(n)
    assert big.admit(victim, 1) == []
    rng = np.random.default_rng(0)
    dead = []
    for epoch in range(6):
        order = rng.permutation(n).astype(np.uint32)
        plans.announce(h, 0, epoch, [n, n], np.concatenate([order, rng.permutation(n).astype(np.uint32)]))
        dead.append(weakref.ref(plans.plans[(h, 0)]))
        for f in order.tolist():                      # every open a hit: no insert, no victim search
            assert plans.observe(f) == 1
            big.hit(f)
    assert len(off.policy._dirty) == 0                # the tier that is off does not listen at all
    assert len(big.policy._dirty) <= n                # at most one entry per resident
    plans.announce(h, 0, 99, [1], np.array([1], dtype=np.uint32))
    gc.collect()
    assert [r() for r in dead] == [None] * len(dead)  # no replaced plan is kept alive by a backlog
