"""Per-open buffers of held-open files are the RAM tier's own bytes, counted in its budget (issue 9 item 2).

A RAM-hit handle pins the tier's buffer: if the file is evicted while the handle is open, its bytes stay
counted (the RAM index's dying bytes) until the last handle on them is released, so RAM tier bytes,
held-open buffers included, never exceed the capacity. Buffers no tier holds are counted against
``TieredCache.loose_budget``. Real posix backend, real tiers, no mount.
"""
import os

from conftest import make_tree
from test_cache import build, fid, open_read


def ram_total(cache):
    i = cache.ram_index
    return i.used_bytes + i.reserved_bytes + i.dying_bytes


def test_an_evicted_buffer_stays_counted_until_its_last_handle_is_released(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, backend = build(src, tmp_path, "lru", ram=6000)
    a, b, c = fid(ns, "dog/00.bin"), fid(ns, "cat/01.bin"), fid(ns, "cat/03.bin")  # 1000, 2000, 4000 B
    ha = cache.open(a)                       # miss -> RAM; held open
    ha2 = cache.open(a)                      # a RAM hit on the same buffer: two handles
    assert (ha.outcome, ha2.outcome) == ("miss", "ram")
    assert open_read(cache, b) == (spec["cat/01.bin"], "miss")
    assert cache.ram_index.used_bytes == 3000
    hc = cache.open(c)                       # needs 1000 more: a is the LRU victim but pinned, so b goes too
    assert hc.outcome == "miss" and hc.source == "memory"
    assert cache.state(a) == "absent" and cache.state(b) == "absent" and cache.state(c) == "ram"
    assert (cache.ram_index.used_bytes, cache.ram_index.dying_bytes) == (4000, 1000)
    assert ram_total(cache) <= 6000
    assert bytes(ha.read(0, 1000)) == spec["dog/00.bin"]  # the evicted buffer still serves its handles
    ha.release()
    assert cache.ram_index.dying_bytes == 1000            # one handle still holds it
    ha2.release()
    ha2.release()                                         # idempotent: counted once
    assert cache.ram_index.dying_bytes == 0
    hc.release()
    assert cache.ram_index.used_bytes == 4000 and cache._pins == {}


def test_held_open_files_never_exceed_the_ram_budget(tmp_path):
    # 300 files held open at once with a RAM tier of 20 files' worth: before, every miss was admitted and
    # its handle kept the evicted buffer alive (300 x 1000 B outside the budget)
    spec = {f"c{i % 3}/{i:03d}.bin": os.urandom(1000) for i in range(300)}
    make_tree(tmp_path / "src", spec)
    cache, ns, backend = build(tmp_path / "src", tmp_path, "lru", ram=20_000)
    handles = []
    for path in sorted(spec):
        h = cache.open(fid(ns, path))
        handles.append((path, h))
        assert ram_total(cache) <= 20_000
        held = sum(x.size for _, x in handles if x.source == "memory")
        assert held <= 20_000, f"{held} bytes of open buffers with a 20000-byte RAM tier"
    assert [bytes(h.read(0, h.size)) == spec[p] for p, h in handles] == [True] * 300
    assert sum(h.source == "memory" for _, h in handles) == 20   # the rest stream from the backend
    assert sum(h.source == "backend" for _, h in handles) == 280
    for _, h in handles:
        h.release()
    assert cache.ram_index.dying_bytes == 0 and cache.ram_index.used_bytes == 20_000
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
    assert cache.loose_bytes == 0


def test_a_handle_dropped_without_release_gives_its_pin_back(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, _ = build(src, tmp_path, "lru", ram=3000)
    a, c = fid(ns, "dog/00.bin"), fid(ns, "dog/02.bin")    # 1000 B, 3000 B
    h = cache.open(a)
    assert cache._pins[a][0] == 1
    del h                                                 # never released
    assert open_read(cache, c) == (spec["dog/02.bin"], "miss")  # the next open hands the pin back first
    assert cache.state(a) == "absent" and cache.state(c) == "ram"
    assert cache._pins == {} and cache.ram_index.dying_bytes == 0
