"""Per-open buffers of held-open files are the RAM tier's own bytes or counted against a bound.

A RAM-hit handle pins the tier's buffer. If the file is evicted while a handle holds it, it leaves the tier
at once (the policy's victims are exactly what is evicted, as in the simulator) and its bytes are counted
against ``TieredCache.loose_budget`` (``LOOSE_BUFFERS``) until the last handle on them is released; only when
that bound has no room do they stay counted in the RAM tier (dying bytes, the tier then takes other
victims). So RAM tier bytes never exceed the capacity and the bytes outside it never exceed the loose
budget. Buffers no tier holds are counted against the same bound. ``Handle.release`` takes no lock: the
next critical section (an open, ``counters``/``stats``/``audit``, a reservation) applies it. Real posix
backend, real tiers, no mount.
"""
import os
import threading

from conftest import make_tree
from test_cache import build, fid, open_read

from shadefs.cache.index import TierIndex
from shadefs.policies import Importance, get_policy


def ram_total(cache):
    i = cache.ram_index
    return i.used_bytes + i.reserved_bytes + i.dying_bytes


def settled(cache):
    """Apply the handed-back pins (what every critical section does first) and return the audit."""
    return cache.audit()


def test_an_evicted_held_buffer_leaves_the_tier_and_is_counted_loose_until_its_last_release(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, backend = build(src, tmp_path, "lru", ram=6000)
    a, b, c = fid(ns, "dog/00.bin"), fid(ns, "cat/01.bin"), fid(ns, "cat/03.bin")  # 1000, 2000, 4000 B
    ha = cache.open(a)                       # miss -> RAM; held open
    ha2 = cache.open(a)                      # a RAM hit on the same buffer: two handles
    assert (ha.outcome, ha2.outcome) == ("miss", "ram")
    assert open_read(cache, b) == (spec["cat/01.bin"], "miss")
    assert cache.ram_index.used_bytes == 3000
    hc = cache.open(c)                       # needs 1000 more: a is the LRU victim (pinned), and only a goes
    assert hc.outcome == "miss" and hc.source == "memory"
    assert cache.state(a) == "absent" and cache.state(b) == "ram" and cache.state(c) == "ram"
    au = settled(cache)
    assert (au["budget"]["ram"]["used"], au["budget"]["ram"]["dying"]) == (6000, 0)
    assert au["loose"]["bytes"] == 1000 and au["held"] == {"dying": 0, "loose": 1000, "uncounted": []}
    assert bytes(ha.read(0, 1000)) == spec["dog/00.bin"]  # the evicted buffer still serves its handles
    ha.release()
    assert settled(cache)["loose"]["bytes"] == 1000       # one handle still holds it
    ha2.release()
    ha2.release()                                         # idempotent: counted once
    au = settled(cache)
    assert au["loose"]["bytes"] == 0 and au["held"]["loose"] == 0 and cache._held == {}
    hc.release()
    settled(cache)
    assert cache.ram_index.used_bytes == 6000 and cache._pins == {}


def test_with_no_loose_room_a_held_victim_stays_dying_in_the_tier(small_tree, tmp_path):
    # the fallback: the loose bound is full, so the held victim frees nothing and the tier takes another
    src, spec = small_tree
    cache, ns, backend = build(src, tmp_path, "lru", ram=6000)
    cache.loose_budget = 999                 # a's 1000 bytes do not fit outside the tier
    a, b, c = fid(ns, "dog/00.bin"), fid(ns, "cat/01.bin"), fid(ns, "cat/03.bin")  # 1000, 2000, 4000 B
    ha = cache.open(a)
    assert open_read(cache, b) == (spec["cat/01.bin"], "miss")
    hc = cache.open(c)                       # a is pinned and cannot leave: b goes too
    assert cache.state(a) == "absent" and cache.state(b) == "absent" and cache.state(c) == "ram"
    au = settled(cache)
    assert (au["budget"]["ram"]["used"], au["budget"]["ram"]["dying"]) == (4000, 1000)
    assert au["loose"]["bytes"] == 0 and au["held"] == {"dying": 1000, "loose": 0, "uncounted": []}
    assert ram_total(cache) <= 6000
    assert bytes(ha.read(0, 1000)) == spec["dog/00.bin"]
    ha.release()
    assert settled(cache)["budget"]["ram"]["dying"] == 0 and cache._held == {}
    hc.release()


def test_held_open_victims_are_the_policys_victims(small_tree, tmp_path):
    # every handle held open: the live tier evicts exactly what the same policy evicts with nothing held
    # (the simulator's index, which has no pins), at every open
    src, spec = small_tree
    names = sorted(spec)
    cache, ns, _ = build(src, tmp_path, "lru", ram=7000)
    imp = Importance(ns.num_files)
    model = TierIndex("ram", 7000, get_policy("lru")(7000, imp))
    held = []
    order = [names[i % len(names)] for i in (0, 1, 2, 3, 0, 4, 5, 1, 6, 2, 7, 3, 0, 5)]
    for name in order:
        f = fid(ns, name)
        h = cache.open(f)
        held.append(h)
        if f in model:
            model.hit(f)
            assert h.outcome == "ram", name
        else:
            assert h.outcome == "miss", name
            model.admit(f, int(ns.size(f)))
        assert sorted(cache.ram_index.sizes) == sorted(model.sizes), name
        au = settled(cache)
        # loose: the held victims' bytes, plus the transient buffers of misses no tier admitted (every
        # buffer pinned) that their handles hold
        transient = sum(h.size for h in held if h.source == "memory" and h._pin is None)
        assert au["budget"]["ram"]["dying"] == 0 and au["loose"]["bytes"] == au["held"]["loose"] + transient
        assert au["loose"]["bytes"] <= cache.loose_budget
    assert [bytes(h.read(0, h.size)) for h in held] == [spec[n] for n in order]
    for h in held:
        h.release()
    assert settled(cache)["loose"]["bytes"] == 0 and cache._held == {} and cache._pins == {}


def test_release_takes_no_lock(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, _ = build(src, tmp_path, "lru", ram=6000)
    a = fid(ns, "dog/00.bin")
    h = cache.open(a)
    t = threading.Thread(target=h.release)
    with cache.lock:                         # held by another thread: a release that took it would wait
        t.start()
        t.join(10)
        assert not t.is_alive(), "Handle.release waited for the cache lock"
    assert cache._pins[a].refs == 1            # handed back, applied at the next critical section
    assert cache.counters()["loose_bytes"] == 0 and cache._pins == {}


def test_held_open_files_never_exceed_the_ram_budget_or_the_loose_bound(tmp_path):
    # 300 files held open at once with a RAM tier of 20 files' worth and a loose bound of 30: before the
    # pins, every miss was admitted and its handle kept the evicted buffer alive (300 x 1000 B outside
    # every budget); now 20 stay the tier's, 30 evicted ones are counted loose, the rest stream
    spec = {f"c{i % 3}/{i:03d}.bin": os.urandom(1000) for i in range(300)}
    make_tree(tmp_path / "src", spec)
    cache, ns, backend = build(tmp_path / "src", tmp_path, "lru", ram=20_000)
    cache.loose_budget = 30_000
    handles = []
    for path in sorted(spec):
        h = cache.open(fid(ns, path))
        handles.append((path, h))
        assert ram_total(cache) <= 20_000 and cache.loose_bytes <= 30_000
        held = sum(x.size for _, x in handles if x.source == "memory")
        assert held <= 50_000, f"{held} bytes of open buffers with a 20000-byte RAM tier and 30000 loose"
    assert [bytes(h.read(0, h.size)) == spec[p] for p, h in handles] == [True] * 300
    assert sum(h.source == "memory" for _, h in handles) == 50   # the rest stream from the backend
    assert sum(h.source == "backend" for _, h in handles) == 250
    au = settled(cache)
    assert au["held"] == {"dying": 0, "loose": 30_000, "uncounted": []} and au["loose"]["bytes"] == 30_000
    assert au["budget"]["ram"]["used"] == 20_000
    for _, h in handles:
        h.release()
    au = settled(cache)
    assert au["budget"]["ram"]["dying"] == 0 and au["budget"]["ram"]["used"] == 20_000
    assert au["loose"]["bytes"] == 0
    # released: the tier admits again (LRU evicts the unpinned files)
    path = sorted(spec)[-1]
    assert open_read(cache, fid(ns, path)) == (spec[path], "miss")
    assert cache.state(fid(ns, path)) == "ram"


def test_buffers_no_tier_holds_are_bounded_by_the_loose_budget(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, _ = build(src, tmp_path, "lru", ram=0)
    cache.loose_budget = 2500
    f0, f1 = fid(ns, "dog/00.bin"), fid(ns, "cat/01.bin")
    h0 = cache._loose_handle(f0, 1000, "prefetch", spec["dog/00.bin"])
    h1 = cache._loose_handle(f1, 2000, "prefetch", spec["cat/01.bin"])  # 3000 > 2500: by ranges instead
    assert (h0.source, h1.source) == ("memory", "backend")
    assert cache.loose_bytes == 1000
    assert bytes(h1.read(0, 2000)) == spec["cat/01.bin"]
    h0.release()
    h1.release()
    assert cache.counters()["loose_bytes"] == 0


def test_a_handle_dropped_without_release_gives_its_pin_back(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, _ = build(src, tmp_path, "lru", ram=3000)
    a, c = fid(ns, "dog/00.bin"), fid(ns, "dog/02.bin")    # 1000 B, 3000 B
    h = cache.open(a)
    assert cache._pins[a].refs == 1
    del h                                                 # never released
    assert open_read(cache, c) == (spec["dog/02.bin"], "miss")  # the next open hands the pin back first
    assert cache.state(a) == "absent" and cache.state(c) == "ram"
    assert settled(cache)["loose"]["bytes"] == 0          # (c's release: applied by this audit)
    assert cache._pins == {} and cache.ram_index.dying_bytes == 0
