"""The control endpoint keeps answering while a warm reads: ``warm`` runs on a worker,
and its reply comes when it is done."""
from __future__ import annotations

import os
import signal
import threading

import numpy as np

from mountutil import waiting_on_fuse
from shadefs.control.client import ControlClient, find_endpoint
from shadefs.testing.mounts import wait_for


def test_scores_residency_and_stats_are_answered_while_a_slow_warm_runs(small_tree, mount):
    src, spec = small_tree
    inner = mount(src, name="inner")  # the backend of `outer`; stopping its daemon stalls every read
    outer = mount(inner.path, "--ram-cache", "1MiB", "--no-kernel-cache", name="outer")
    with open(os.path.join(outer.path, "dog/00.bin"), "rb") as f:  # one resident file
        assert f.read() == spec["dog/00.bin"]
    endpoint = find_endpoint(outer.path)
    result = {}

    def warm():
        c = ControlClient(endpoint, timeout_s=60)
        try:
            result["warm"] = c.warm(["cat/01.bin", "cat/03.bin"], timeout_s=60)
        finally:
            c.close()

    os.kill(inner.pid, signal.SIGSTOP)
    t = threading.Thread(target=warm)
    try:
        t.start()
        # the warm is now blocked on the stopped backend: a thread of the daemon waits on that FUSE mount
        wait_for(lambda: waiting_on_fuse(outer.pid), timeout=60, what="the warm waits on the stopped backend")
        assert t.is_alive()
        c = ControlClient(endpoint, timeout_s=3)
        try:
            before = c.stats()["scores_received"]
            assert c.send_scores(["dog/00.bin", "cat/01.bin"], np.array([1.0, 2.0], dtype=np.float32))
            # answered while the warm waits (the client's 3 s timeout would raise TimeoutError otherwise)
            assert c.resident(["dog/00.bin", "cat/01.bin", "cat/03.bin"]).tolist() == [True, False, False]
            s = c.stats()
            assert s["scores_received"] == before + 1
            assert s["opens"] == 1  # a warm is not an open
            assert t.is_alive()  # ... and the warm has not finished
        finally:
            c.close()
    finally:
        os.kill(inner.pid, signal.SIGCONT)
    t.join(60)
    assert not t.is_alive()
    assert result["warm"] == {"resident": 0, "ram": 2, "disk": 0, "rejected": 0, "failed": 0,
                              "bytes": len(spec["cat/01.bin"]) + len(spec["cat/03.bin"])}
    c = ControlClient(endpoint, timeout_s=3)
    try:
        assert c.resident(["cat/01.bin", "cat/03.bin"]).tolist() == [True, True]
    finally:
        c.close()
