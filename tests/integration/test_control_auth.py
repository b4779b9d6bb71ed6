"""A tcp:// control endpoint is CURVE-authenticated by default (issue 10, item 11): a client without the
mount's credentials is ignored, one with them (found in the private registry, or given as a file) works;
``--control-insecure`` opts out."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from shadefs import registry
from shadefs.control.client import ControlClient, find_endpoint


def test_tcp_control_refuses_clients_without_credentials(small_tree, mount, tmp_path, monkeypatch):
    monkeypatch.delenv("SHADEFS_CREDENTIALS", raising=False)
    src, _ = small_tree
    m = mount(src, "--ram-cache", "1MiB", "--control", "tcp://127.0.0.1:0")
    endpoint = find_endpoint(m.path)
    assert endpoint.startswith("tcp://127.0.0.1:")
    entry = registry.lookup(m.path)
    assert entry.endpoint == endpoint and sorted(entry.credentials) == ["client_public", "client_secret",
                                                                        "server_public"]
    assert stat.S_IMODE(os.stat(entry.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(entry.path)).st_mode) == 0o700

    stranger = ControlClient(endpoint, timeout_s=0.5, linger_s=0.5, credentials=False)
    try:
        assert stranger.send_scores(["dog/00.bin"], np.array([5.0], dtype=np.float32))  # queued, never read
        with pytest.raises(TimeoutError):
            stranger.stats()
        with pytest.raises(TimeoutError):
            stranger.warm(["cat/01.bin"], timeout_s=0.5)
    finally:
        stranger.close()
    time.sleep(0.5)
    with ControlClient(endpoint, timeout_s=5) as owner:  # credentials from the registry
        s = owner.stats()
        assert s["scores_received"] == 0 and sum(s["scores_rejected"].values()) == 0
        assert owner.resident(["cat/01.bin"]).tolist() == [False]  # the stranger's warm never ran
        assert owner.send_scores(["dog/00.bin"], np.array([5.0], dtype=np.float32))
        deadline = time.monotonic() + 5
        while owner.stats()["scores_received"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert owner.stats()["scores_received"] == 1

    # a copy of the credentials, named by $SHADEFS_CREDENTIALS, in another process (the CLI)
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps(entry.credentials))
    env = dict(os.environ, SHADEFS_ENDPOINT=endpoint, SHADEFS_CREDENTIALS=str(creds))
    r = subprocess.run([sys.executable, "-c", "import sys, shadefs.control.client as c; "
                        "print(c.ControlClient(sys.argv[1], timeout_s=5).stats()['scores_received'])", endpoint],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "1\n", r.stderr


def test_control_insecure_accepts_any_local_client(small_tree, mount):
    src, _ = small_tree
    m = mount(src, "--control", "tcp://127.0.0.1:0", "--control-insecure")
    endpoint = find_endpoint(m.path)
    assert registry.lookup(m.path).credentials is None
    with ControlClient(endpoint, timeout_s=5, credentials=False) as anyone:
        assert anyone.stats()["opens"] == 0
    assert "accepts unauthenticated, unencrypted clients (--control-insecure)" in m.log()


def test_control_insecure_needs_a_tcp_endpoint(small_tree, tmp_path, cli):
    src, _ = small_tree
    (tmp_path / "mp").mkdir()
    r = cli("mount", src, tmp_path / "mp", "--control-insecure", check=False)
    assert r.returncode == 2
    assert r.stderr == "shadefs: error: --control-insecure applies to tcp:// control endpoints only\n"
