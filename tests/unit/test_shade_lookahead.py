"""ShadeSampler's provisional next-epoch draw: announced as lookahead, replaced by the real draw,
never changing what is yielded; the stable draw it relies on.

Against a REAL daemon and control server (:class:`hookfakes.LiveDaemon`), as the other plan tests."""
import numpy as np
import pytest
from conftest import require

require("torch")  # skipped without torch; failed under CI=true

from shadefs.hooks import ShadeSampler  # noqa: E402
from shadefs.hooks.sampler import _stream_key, keyed_shuffle, race_draw  # noqa: E402

from shadefs.testing.mounts import wait_for  # noqa: E402

from hookfakes import FakeDataset, LiveDaemon  # noqa: E402

N = 60


def _plan_of(live):
    plans = live.daemon.plans.active()
    assert len(plans) == 1
    return plans[0]


def _received(live, n):
    """Wait until the daemon has processed ``n`` plan messages (a flushed send is only on its socket)."""
    wait_for(lambda: live.server.counters()["plans_received"] >= n)
    assert live.server.counters()["plans_received"] == n


def _fids(live, order):
    return np.array([live.fid(int(i)) for i in order], dtype=np.int64)


def _losses(idx):
    return (np.asarray(idx) * 7919 % 101).astype(np.float32) / 10.0


def test_provisional_draw_is_announced_then_replaced_by_the_real_one(tmp_path):
    with LiveDaemon(tmp_path, N, resident=range(0, N, 4)) as live:
        s = ShadeSampler(live.dataset, seed=4, client=live.client())
        s.set_epoch(0)
        order0 = np.array(list(s), dtype=np.int64)
        assert s.announcer.flush()
        # epoch 0's draw, then [epoch 0, provisional epoch 1] (the second replaces the first)
        assert s.announcer.sent == 2
        _received(live, 2)
        plan = _plan_of(live)
        assert plan.segments == [(0, N), (1, N)]
        prov = s.provisional
        assert prov is not None and prov.epoch == 1
        np.testing.assert_array_equal(plan.ids, np.concatenate([_fids(live, order0), _fids(live, prov.order)]))
        for k in range(N):  # epoch 0 is read (the daemon's cursor follows it); scores arrive
            live.daemon.plans.observe(int(plan.ids[k]))
        s.update_scores(order0[:32], _losses(order0[:32]))
        s.update_scores(order0[32:], _losses(order0[32:]))
        s.set_epoch(1)
        order1 = np.array(list(s), dtype=np.int64)
        assert s.announcer.flush()
        assert s.announcer.sent == 4
        _received(live, 4)  # real epoch 1, provisional epoch 2
        plan = _plan_of(live)
        assert plan.segments == [(1, N), (2, N)]
        np.testing.assert_array_equal(plan.ids[:N], _fids(live, order1))  # the real draw replaced it
        assert plan.pos == 0 and plan.matched == 0
        assert s.provisional.epoch == 2 and s.announcer.failed == 0


def test_the_draw_is_the_same_with_and_without_the_plan(tmp_path):
    with LiveDaemon(tmp_path, N, resident=range(0, N, 3)) as live:
        samplers = [ShadeSampler(live.dataset, seed=9, client=live.client(), announce_plan=a, lookahead_at=at)
                    for a, at in ((False, None), (True, None), (True, 0.0), (True, 0.5), (True, 1.0))]
        for epoch in range(3):
            orders = []
            for s in samplers:
                s.set_epoch(epoch)
                orders.append(list(s))
                if s.announcer is not None:
                    assert s.announcer.flush()
                s.update_scores(orders[-1], _losses(orders[-1]))
            for o in orders[1:]:
                assert o == orders[0]
        assert samplers[0].announcer is None
        assert all(s.provisional is not None for s in samplers[2:]) and samplers[1].provisional is None


@pytest.mark.parametrize("at, index", [(0.0, 0), (0.5, 30), (1.0, N)])
def test_the_provisional_draw_starts_when_the_loader_takes_that_index(tmp_path, at, index):
    with LiveDaemon(tmp_path, N) as live:
        s = ShadeSampler(live.dataset, seed=1, client=live.client(), lookahead_at=at)
        it = iter(s)
        assert s.announcer.flush()
        got = [next(it) for _ in range(index)]
        assert s.announcer.flush()
        assert s.announcer.sent == 1 and s.provisional is None  # only this epoch's draw so far
        got += list(it)
        assert s.announcer.flush()
        assert s.announcer.sent == 2 and s.provisional.epoch == 1 and len(got) == N
        _received(live, 2)


def test_a_provisional_draw_overtaken_by_the_next_epoch_is_not_sent(tmp_path):
    with LiveDaemon(tmp_path, N) as live:
        s = ShadeSampler(live.dataset, seed=1, client=live.client(), lookahead_at=None)
        list(s)
        assert s.announcer.flush() and s.announcer.sent == 1
        s._announce_provisional(s.generation - 1, s.epoch, s.plan.order)  # a job of the previous epoch
        assert s.announcer.flush()
        assert s.announcer.sent == 1 and s.provisional is None
        s._announce_provisional(s.generation, s.epoch, s.plan.order)  # this epoch's: sent
        assert s.announcer.flush()
        assert s.announcer.sent == 2 and s.provisional.epoch == s.epoch + 1
        _received(live, 2)


def test_same_weights_and_residency_give_the_real_draw_exactly(tmp_path):
    """The provisional draw is the real procedure: with nothing changed in between, it is the real draw."""
    with LiveDaemon(tmp_path, N, resident=range(0, N, 5)) as live:
        s = ShadeSampler(live.dataset, seed=2, client=live.client(), mode="aggressive")
        s.update_scores(np.arange(N), _losses(np.arange(N)))
        prov = s.provisional_plan(1)
        s.set_epoch(1)
        assert list(s) == prov.order.tolist() and prov.hits > 0


# ------------------------------------------------------------------------------ the stable draw
def test_a_small_score_change_keeps_almost_every_pick():
    rng = np.random.default_rng(0)
    n = 4000
    w = np.log(10 + rng.integers(0, 64, n)).astype(np.float64)
    w2 = w.copy()
    changed = rng.choice(n, n // 20, replace=False)  # 5 % rescored
    w2[changed] = np.log(10 + rng.integers(0, 64, changed.size))
    key = _stream_key(1, 2, 3)
    a, b = race_draw(w, n, key), race_draw(w2, n, key)
    sa, sb = set(a.tolist()), set(b.tolist())
    assert len(sa & sb) / len(sa | sb) > 0.95
    # inverse CDF over the cumulative sum, same uniforms: most picks move (why "stable" is the default)
    u = np.random.default_rng(5).random(n)
    c1, c2 = np.cumsum(w), np.cumsum(w2)
    x, y = np.searchsorted(c1, u * c1[-1]), np.searchsorted(c2, u * c2[-1])
    assert len(set(x.tolist()) & set(y.tolist())) / len(set(x.tolist()) | set(y.tolist())) < 0.8


def test_race_draw_takes_exactly_n_and_never_draws_zero_weights():
    w = np.array([0.0, 1.0, 0.0, 3.0, 6.0])
    d = race_draw(w, 5000, _stream_key(7))
    assert d.size == 5000 and set(d.tolist()) <= {1, 3, 4}
    counts = np.bincount(d, minlength=5)
    expected = 5000 * w / w.sum()
    chi2 = float(((counts[[1, 3, 4]] - expected[[1, 3, 4]]) ** 2 / expected[[1, 3, 4]]).sum())
    assert chi2 < 13.82  # 2 dof, p = 0.001 (seeded: exact)
    with pytest.raises(ValueError):
        race_draw(np.zeros(3), 3, _stream_key(7))


def test_keyed_shuffle_is_a_permutation_and_stable_under_one_removal():
    v = np.array([5, 3, 5, 1, 3, 5, 2, 9, 9, 4])
    key = _stream_key(3)
    out = keyed_shuffle(v, key)
    assert sorted(out.tolist()) == sorted(v.tolist())
    less = keyed_shuffle(np.delete(v, 3), key)  # the 1 removed: the others keep their relative order
    rest = out.tolist()
    rest.remove(1)
    assert less.tolist() == rest
    assert keyed_shuffle(v, key).tolist() == out.tolist()  # seeded


def test_cdf_draw_is_the_previous_behaviour():
    ds = FakeDataset(50)
    s = ShadeSampler(ds, seed=3, client=False, draw="cdf", mode="relaxed")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([3, 0, 0x5EED_0001])))
    cdf = np.cumsum(np.ones(50))
    want = np.minimum(np.searchsorted(cdf, rng.random(50) * cdf[-1], side="right"), 49)
    np.testing.assert_array_equal(s.global_draw(0), want)
    rng2 = np.random.Generator(np.random.PCG64(np.random.SeedSequence([3, 0, 0x5EED_0002, 0])))
    assert list(s) == rng2.permutation(want).tolist()
    with pytest.raises(ValueError):
        ShadeSampler(ds, client=False, draw="alias")
    with pytest.raises(ValueError):
        ShadeSampler(ds, client=False, lookahead_at=1.5)
