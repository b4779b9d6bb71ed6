"""Prometheus metrics of a real mount: exact counter values after a scripted sequence, agreement with
``shadefs stats``, loopback binding, and the names documented in docs/metrics.md."""
import os
import re

import pytest

from conftest import is_mounted
from mountutil import disk_budget, metrics_port, read, scrape, source_passthrough
from shadefs import metrics as M
from shadefs.testing import wait_for

pytestmark = pytest.mark.usefixtures("fuse")  # skipped without /dev/fuse + fusermount3; failed under CI=true

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "metrics.md")


def test_scrape_after_a_scripted_sequence_has_exact_values(small_tree, mount, tmp_path):
    src, spec = small_tree
    # as test_mount's scripted sequence: RAM 3000 B holds 00+01, disk 3000 B holds 02, the rest miss
    m = mount(src, "--ram-cache", "3000", "--disk-cache", tmp_path / "cache", "--disk-cache-size",
              str(disk_budget(3447)), "--no-kernel-cache", "--metrics-port", "0")  # 02: a 3064-byte record
    # (charged 3447: its share of the segments' slack)
    seq = ["dog/00.bin", "cat/01.bin", "dog/02.bin", "cat/03.bin",
           "dog/00.bin", "cat/01.bin", "dog/02.bin", "cat/03.bin", "dog/00.bin"]
    for rel in seq:
        assert read(os.path.join(m.path, rel)) == spec[rel]
    from shadefs.control.client import ControlClient, find_endpoint

    with ControlClient(find_endpoint(m.path)) as c:
        c.send_scores(["dog/00.bin", "cat/01.bin"], [0.5, 1.5])
        c.send_scores(["no/such.bin"], [1.0])  # rejected: unknown_path
        c.stats()  # a round trip: both one-way messages were handled before it
    port = metrics_port(m)
    s = scrape(port)
    v = lambda name, **labels: s[(name, tuple(sorted(labels.items())))]  # noqa: E731
    assert v(M.OPENS) == 9
    assert v(M.HITS, tier="ram") == 3 and v(M.HITS, tier="disk") == 1
    assert v(M.MISSES) == 5
    assert v(M.HIT_BYTES) == 1000 + 2000 + 3000 + 1000
    assert v(M.OPEN_BYTES) == sum(len(spec[r]) for r in seq)
    # 03 (4000), admitted by no tier, is read by the kernel from the source file at both its opens
    # (passthrough to the source file, the default of a directory source) or by the daemon without it
    streamed = 2 if source_passthrough(m) == "off" else 0
    assert v(M.BACKEND_BYTES) == 1000 + 2000 + 3000 + streamed * 4000
    assert v(M.SOURCE_PASSTHROUGH_BYTES) == (2 - streamed) * 4000
    assert v(M.BACKEND_ERRORS) == 0
    assert v(M.BACKEND_READ_SECONDS + "_count") == 3 + streamed
    assert v(M.BACKEND_READ_SECONDS + "_bucket", le="+Inf") == 3 + streamed
    for tier, used, cap, files in (("ram", 3000, 3000, 2), ("disk", 3447, disk_budget(3447), 1)):
        assert v(M.TIER_USED, tier=tier) == used
        assert v(M.TIER_CAPACITY, tier=tier) == cap
        assert v(M.TIER_FILES, tier=tier) == files
        assert v(M.EVICTIONS, tier=tier) == 0
    assert v(M.PROMOTIONS) == 0 and v(M.DEMOTIONS) == 0
    assert v(M.CORRUPT) == 0 and v(M.DISK_WRITE_ERRORS) == 0 and v(M.DISK_WRITES_REFUSED) == 0
    assert v(M.SCORE_MESSAGES) == 1
    assert v(M.SCORE_REJECTED, reason="unknown_path") == 1
    assert v(M.DISK_RELOAD_ENTRIES, result="loaded") == 0
    assert v(M.INFO, source=str(src), mountpoint=m.path, policy="static") == 1
    assert s[("process_open_fds", ())] > 0
    # one source of truth: the stats JSON says the same, and scraping changed nothing
    st = m.stats()
    assert st["opens"] == 9 and st["hits"] == {"ram": 3, "disk": 1} and st["misses"] == 5
    assert st["backend_bytes"] == v(M.BACKEND_BYTES)
    assert st["source_passthrough_bytes"] == v(M.SOURCE_PASSTHROUGH_BYTES)
    assert scrape(port)[(M.OPENS, ())] == 9


def test_promotions_demotions_and_evictions_are_counted(small_tree, mount, tmp_path):
    src, spec = small_tree
    m = mount(src, "--ram-cache", "3000", "--disk-cache", tmp_path / "cache", "--disk-cache-size",
              str(disk_budget(10000)), "--policy", "lru", "--no-kernel-cache", "--metrics-port", "0")
    port = metrics_port(m)
    # as test_cache's LRU case: a, b, c (c evicts a and b to disk), a (disk hit, promoted; c demoted).
    # The mover thread writes victims after the open that evicted them returned; until a's write is done,
    # an open of a is a RAM hit from its bytes in memory (no promotion): wait for both writes first
    for rel in ("dog/00.bin", "cat/01.bin", "dog/02.bin"):
        assert read(os.path.join(m.path, rel)) == spec[rel]
    wait_for(lambda: scrape(port)[(M.DEMOTIONS, ())] == 2, timeout=10)
    assert read(os.path.join(m.path, "dog/00.bin")) == spec["dog/00.bin"]
    wait_for(lambda: scrape(port)[(M.DEMOTIONS, ())] == 3, timeout=10)
    s = scrape(port)
    assert s[(M.EVICTIONS, (("tier", "ram"),))] == 3
    assert s[(M.DEMOTIONS, ())] == 3
    assert s[(M.PROMOTIONS, ())] == 1
    assert s[(M.HITS, (("tier", "disk"),))] == 1


def test_metrics_listen_on_loopback_only_by_default(small_tree, mount):
    src, _ = small_tree
    m = mount(src, "--metrics-port", "0")
    port = metrics_port(m)
    listening = set()
    with open("/proc/net/tcp") as f:
        for line in list(f)[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A":  # LISTEN
                addr, p = local.split(":")
                listening.add((addr, int(p, 16)))
    assert ("0100007F", port) in listening  # 127.0.0.1, little-endian hex
    assert ("00000000", port) not in listening
    assert "Prometheus metrics on http://127.0.0.1:%d/metrics" % port in m.log()


def test_every_metric_name_is_documented():
    with open(DOCS) as f:
        doc = f.read()
    for name in M.NAMES:
        assert re.search(r"`%s[`{]" % re.escape(name), doc), f"{name} is not in docs/metrics.md"


def test_a_busy_metrics_port_fails_the_mount_in_one_line(small_tree, mount, tmp_path, cli):
    src, _ = small_tree
    m = mount(src, "--metrics-port", "0")
    port = metrics_port(m)
    mp = tmp_path / "second"
    mp.mkdir()
    r = cli("mount", src, mp, "--metrics-port", str(port), check=False)
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert f"--metrics-port {port} on 127.0.0.1: Address already in use" in r.stderr
    assert not is_mounted(mp)
