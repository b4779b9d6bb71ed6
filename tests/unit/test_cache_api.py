"""What the front ends call on the cache is exactly :class:`shadefs.cache.api.CacheAPI`: the cache and the
bare stand-in implement every member of it, and the front ends' sources name no other member of the cache.
The open's decision is typed (:mod:`shadefs.cache.decision`) and every outcome is an ``Outcome`` that
reads as its string. Real posix backend, namespace and tiers."""
import ast
import os

import shadefs
from shadefs.backends.posix import PosixBackend
from shadefs.cache.api import BareCache, CacheAPI
from shadefs.cache.core import TieredCache
from shadefs.cache.counters import Outcome
from shadefs.cache.decision import DiskHit, Join, Lead, Stream
from shadefs.cache.handle import OpenTicket
from shadefs.cache.index import TierIndex
from shadefs.cache.tiers import DiskTier, MemoryTier
from shadefs.namespace import Namespace
from shadefs.policies import Importance, get_policy
from shadefs.testing.gated import GatedCache

PKG = os.path.dirname(os.path.abspath(shadefs.__file__))
# the front ends' sources (the kernel front end's parts, the libfuse callbacks)
FRONT_ENDS = ["fuse/kernel.py", "fuse/file_ops.py", "fuse/metadata.py", "fuse/pages.py", "fuse/libfuse_ops.py"]


def api_members() -> set:
    """The attributes and methods :class:`CacheAPI` declares."""
    return set(CacheAPI.__annotations__) | {n for n, v in vars(CacheAPI).items()
                                            if callable(v) and not n.startswith("_")}


def called_on_cache(path: str) -> set:
    """Every ``cache.X`` / ``self.cache.X`` attribute named in a source file."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        v = node.value
        if (isinstance(v, ast.Name) and v.id == "cache") or (
                isinstance(v, ast.Attribute) and v.attr == "cache" and isinstance(v.value, ast.Name)
                and v.value.id == "self"):
            out.add(node.attr)
    return out


def build(src, tmp_path, ram=0, disk=100000):
    ns = Namespace(PosixBackend(str(src)).walk())
    imp = Importance(ns.num_files)
    lru = get_policy("lru")
    disk_tier = (TierIndex("disk", disk, lru(disk, imp)), DiskTier(str(tmp_path / "cache"), str(src))) if disk else None
    cache = TieredCache(ns, PosixBackend(str(src)), (TierIndex("ram", ram, lru(ram, imp)), MemoryTier()),
                        disk_tier, imp)
    return cache, ns


def test_the_cache_and_the_bare_stand_in_implement_every_member_of_the_api(small_tree, tmp_path):
    cache, _ = build(small_tree[0], tmp_path)
    members = api_members()
    assert {"open", "open_nowait", "open_ticket", "open_kept", "recheck", "unchecked", "source_fd",
            "source_opened", "attach_residents", "apply_hits", "backend", "disk", "prefetcher", "fds",
            "rechecks", "opens_source", "entry_unlinked", "entry_dropped"} <= members
    assert [m for m in sorted(members) if not hasattr(cache, m)] == []
    # the bare stand-in leaves the opens to its subclass (a test's or a benchmark's source)
    assert [m for m in sorted(members) if not hasattr(BareCache(), m)] == ["open", "open_nowait"]
    gated = GatedCache(cache.ns, str(small_tree[0]), lambda: None)
    assert [m for m in sorted(members) if not hasattr(gated, m)] == []
    assert (cache.rechecks, cache.opens_source) == (False, True)   # a fresh snapshot of a directory source


def test_the_front_ends_name_no_member_of_the_cache_beyond_the_api():
    members = api_members()
    extra = {f: sorted(called_on_cache(os.path.join(PKG, f)) - members) for f in FRONT_ENDS}
    assert extra == {f: [] for f in FRONT_ENDS}
    assert "open_nowait" in called_on_cache(os.path.join(PKG, "fuse/kernel.py"))   # (the scan sees calls)


def test_an_open_is_decided_once_as_a_typed_decision_and_counted_as_an_outcome(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns = build(src, tmp_path)
    rel = "cat/05.bin"
    f = ns.file_id(rel)
    t = cache.open_nowait(f, ticket=True, opener=os.getpid())
    assert isinstance(t, OpenTicket) and type(t.decision) is Lead and not t.joins
    assert (t.opener, cache.state(f)) == (os.getpid(), "fetching")
    t2 = cache.open_nowait(f, ticket=True)                          # the same flight: joined, not led
    assert type(t2.decision) is Join and t2.decision.fetch is t.decision.fetch and t2.joins
    h, h2 = cache.open_ticket(t), cache.open_ticket(t2)
    assert (h.outcome, h2.outcome) == (Outcome.MISS, Outcome.MISS)
    assert h.outcome == "miss" and str(h.outcome) == "miss" and f"{h.outcome}" == "miss"
    assert h.read(0, h.size) == spec[rel]
    h.release()
    h2.release()
    with cache.lock:                                                # now resident(disk): a disk hit
        d = cache._decide(f, len(spec[rel]), None)
    assert d == DiskHit(int(cache.entries.gen[f]), int(cache.entries.csum[f]))
    h = cache._serve(f, len(spec[rel]), d, None)
    assert (h.outcome, h.read(0, h.size)) == ("disk", spec[rel])
    h.release()
    c = cache.counters()
    assert (c["opens"], c["misses"], c["joined"], c["hits_disk"], c["backend_reads"]) == (3, 2, 1, 1, 1)


def test_a_file_no_tier_admits_is_decided_a_stream(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns = build(src, tmp_path, disk=0)
    cache.whole_max = 0                                             # no transient whole read either
    f = ns.file_id("dog/00.bin")
    t = cache.open_nowait(f, ticket=True)
    assert t.decision == Stream() and not t.joins
    h = cache.open_ticket(t)
    assert (h.outcome, h.source, h.read(0, 1000)) == ("miss", "backend", spec["dog/00.bin"])
    h.release()
    assert (cache.streamed, cache.misses, cache.opens) == (1, 1, 1)
