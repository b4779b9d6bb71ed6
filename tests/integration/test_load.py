"""Load: 16 reader processes x 3 epochs over 3000 small files, with score traffic on the control
endpoint at the same time. No deadlock (everything under timeouts), no error, every byte correct, and
the daemon counted exactly the opens the readers did (opens = hits + misses)."""
import hashlib
import multiprocessing
import os
import random
import threading
import time

import numpy as np
import pytest

from mountutil import read

pytestmark = pytest.mark.usefixtures("fuse")  # skipped without /dev/fuse + fusermount3; failed under CI=true

NUM_FILES = 3000
READERS = 16
EPOCHS = 3


def content(rel: str) -> bytes:
    """Deterministic bytes of ``rel`` (200..3199 bytes), so readers can check without shared state."""
    h = hashlib.sha256(rel.encode()).digest()
    size = 200 + int.from_bytes(h[:2], "little") % 3000
    return (h * (size // 32 + 1))[:size]


@pytest.fixture(scope="module")
def many_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("load") / "src"
    names = [f"class{i % 10}/{i:05d}.bin" for i in range(NUM_FILES)]
    for d in range(10):
        (root / f"class{d}").mkdir(parents=True)
    for rel in names:
        (root / rel).write_bytes(content(rel))
    return root, names


def _reader(mnt, names, rank, queue):
    """One DataLoader-like worker: every epoch its shard of a fresh permutation, every file checked."""
    opens = bad = errors = 0
    try:
        for epoch in range(EPOCHS):
            order = random.Random(epoch).sample(names, len(names))
            for rel in order[rank::READERS]:
                try:
                    data = read(os.path.join(mnt, rel))
                except OSError:
                    errors += 1
                    continue
                finally:
                    opens += 1
                bad += data != content(rel)
            # a second look at a few files of the shard: concurrent hits and misses on the same files
            for rel in order[rank::READERS][:20]:
                opens += 1
                bad += read(os.path.join(mnt, rel)) != content(rel)
    except Exception as e:  # pragma: no cover - reported to the parent
        queue.put(("crash", rank, repr(e)))
        return
    queue.put(("done", rank, (opens, bad, errors)))


@pytest.mark.parametrize("policy", ["shade", "lru"])
def test_sixteen_readers_three_epochs_with_score_traffic(many_files, mount, tmp_path, policy):
    src, names = many_files
    m = mount(src, "--ram-cache", "15%", "--disk-cache", tmp_path / "cache", "--disk-cache-size", "30%",
              "--policy", policy)
    from shadefs.control.client import ControlClient, find_endpoint

    endpoint = find_endpoint(m.path)
    stop = threading.Event()
    sent = {"batches": 0, "resident_queries": 0}
    failures = []

    def scores():
        rng = np.random.default_rng(0)
        try:
            with ControlClient(endpoint) as c:
                while not stop.is_set():
                    batch = [names[i] for i in rng.integers(0, len(names), 64)]
                    assert c.send_scores(batch, rng.random(64).astype(np.float32))
                    sent["batches"] += 1
                    if sent["batches"] % 20 == 0:
                        assert c.resident(batch).shape == (64,)
                        sent["resident_queries"] += 1
                    time.sleep(0.002)
        except Exception as e:  # pragma: no cover - reported below
            failures.append(e)

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    sender = threading.Thread(target=scores, daemon=True)
    sender.start()
    readers = [ctx.Process(target=_reader, args=(m.path, names, r, queue), daemon=True) for r in range(READERS)]
    for p in readers:
        p.start()
    results = []
    deadline = time.monotonic() + 150
    while len(results) < READERS:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"deadlock? only {len(results)} of {READERS} readers finished"
        try:
            results.append(queue.get(timeout=remaining))
        except Exception:
            break
    stop.set()
    sender.join(30)
    for p in readers:
        p.join(10)
        if p.is_alive():  # pragma: no cover
            p.kill()
    assert not sender.is_alive() and not failures, failures
    assert len(results) == READERS and all(kind == "done" for kind, _, _ in results), results
    opens = sum(r[2][0] for r in results)
    assert sum(r[2][1] for r in results) == 0, "wrong bytes served"
    assert sum(r[2][2] for r in results) == 0, "read errors"
    assert opens == EPOCHS * (NUM_FILES + READERS * 20)
    s = m.full_stats()
    assert s["opens"] == s["hits"]["ram"] + s["hits"]["disk"] + s["misses"] == opens
    for tier in ("ram", "disk"):
        assert s["tiers"][tier]["used_bytes"] <= s["tiers"][tier]["capacity_bytes"]
    assert s["scores_received"] == sent["batches"] > 0
    assert sum(s["scores_rejected"].values()) == 0
    assert "Traceback" not in m.log()
