"""A tcp:// control endpoint is CURVE-authenticated by default: a client without the
mount's credentials is ignored, one with them (found in the private registry, or given as a file) works;
``--control-insecure`` opts out. A server key of one's own (``--curve-secret-key``) answers only the client
keys listed in ``--control-authorized-keys``."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import is_mounted
from shadefs import registry
from shadefs.control.client import ControlClient, find_endpoint


def stranger_gets_nothing(stranger) -> None:
    """A client the mount does not admit: its scores are queued but never read, its requests time out."""
    try:
        assert stranger.send_scores(["dog/00.bin"], np.array([5.0], dtype=np.float32))  # queued, never read
        with pytest.raises(TimeoutError):
            stranger.stats()
        with pytest.raises(TimeoutError):
            stranger.warm(["cat/01.bin"], timeout_s=0.5)
    finally:
        stranger.close()
    time.sleep(0.5)


def scores_applied_once(client) -> None:
    """An admitted client after :func:`stranger_gets_nothing`: nothing of the stranger's was counted or
    warmed; its own scores message is."""
    s = client.stats()
    assert s["scores_received"] == 0 and sum(s["scores_rejected"].values()) == 0
    assert client.resident(["cat/01.bin"]).tolist() == [False]  # the stranger's warm never ran
    assert client.send_scores(["dog/00.bin"], np.array([5.0], dtype=np.float32))
    deadline = time.monotonic() + 5
    while client.stats()["scores_received"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.stats()["scores_received"] == 1


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

    stranger_gets_nothing(ControlClient(endpoint, timeout_s=0.5, linger_s=0.5, credentials=False))
    with ControlClient(endpoint, timeout_s=5) as owner:  # credentials from the registry
        scores_applied_once(owner)

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


@pytest.fixture
def curve_certs(tmp_path):
    """A server key pair and two client key pairs (zmq.auth certificates): ``authorized`` and ``stranger``."""
    import zmq.auth

    d = tmp_path / "keys"
    d.mkdir()
    return {name: zmq.auth.create_certificates(str(d), name) for name in ("server", "authorized", "stranger")}


def _public(cert) -> str:
    import zmq.auth

    return zmq.auth.load_certificate(cert)[0].decode()


def test_a_server_key_answers_only_the_authorized_keys(small_tree, mount, tmp_path, curve_certs):
    import zmq.auth

    src, _ = small_tree
    keys = tmp_path / "authorized_keys"
    keys.write_text(f"# the training job's key\n\n{_public(curve_certs['authorized'][0])}\n")
    m = mount(src, "--ram-cache", "1MiB", "--control", "tcp://127.0.0.1:0",
              "--curve-secret-key", curve_certs["server"][1], "--control-authorized-keys", keys)
    endpoint = find_endpoint(m.path)
    server_pub = curve_certs["server"][0]
    # a stranger who knows the server's public key, with a key pair of its own: no answer, scores not read
    stranger_gets_nothing(ControlClient(endpoint, timeout_s=0.5, linger_s=0.5, curve_server_key=server_pub,
                                        curve_client_key=curve_certs["stranger"][1]))
    # the authorized key, given as key files, and as the hooks pass it (a credentials dict)
    with ControlClient(endpoint, timeout_s=5, curve_server_key=server_pub,
                       curve_client_key=curve_certs["authorized"][1]) as job:
        scores_applied_once(job)
    public, secret = zmq.auth.load_certificate(curve_certs["authorized"][1])
    creds = {"server_public": _public(server_pub), "client_public": public.decode(),
             "client_secret": secret.decode()}
    with ControlClient(endpoint, timeout_s=5, credentials=creds) as hook:
        assert hook.stats()["scores_received"] == 1
    with ControlClient(endpoint, timeout_s=5) as owner:  # the registry's credentials still work
        assert owner.stats()["scores_received"] == 1


def test_a_server_key_needs_authorized_keys(small_tree, tmp_path, cli, curve_certs):
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    base = ["mount", src, mp, "--control", "tcp://127.0.0.1:0", "--curve-secret-key", curve_certs["server"][1]]
    r = cli(*base, check=False)
    if r.returncode == 0:
        cli("umount", mp)
    assert r.returncode == 2 and r.stderr == (
        "shadefs: error: --curve-secret-key needs --control-authorized-keys FILE (the public keys of the clients "
        "to answer, one a line): without it any key pair would be admitted\n")
    bad = tmp_path / "bad_keys"
    bad.write_text(f"# ok\n{_public(curve_certs['authorized'][0])}\nnot-a-key\n")
    r = cli(*base, "--control-authorized-keys", bad, check=False)
    assert r.returncode == 2 and r.stderr == (
        f"shadefs: error: --control-authorized-keys: '{bad}' line 3: not a CURVE public key (40 Z85 characters, "
        "as in the public-key line of a zmq.auth certificate)\n")
    empty = tmp_path / "empty_keys"
    empty.write_text("# nobody yet\n\n")
    r = cli(*base, "--control-authorized-keys", empty, check=False)
    assert r.returncode == 2
    assert r.stderr == f"shadefs: error: --control-authorized-keys: '{empty}' holds no public key\n"
    shared = tmp_path / "shared_keys"
    shared.write_text(f"{_public(curve_certs['authorized'][0])}\n")
    os.chmod(shared, 0o666)  # anyone could add a key of their own
    r = cli(*base, "--control-authorized-keys", shared, check=False)
    assert r.returncode == 2 and r.stderr == (
        f"shadefs: error: --control-authorized-keys: '{shared}' can be changed by others (owner uid 0, mode 666): "
        "whoever writes it admits their keys; chmod go-w it and keep it owned by root\n")
    r = cli("mount", src, mp, "--control", "tcp://127.0.0.1:0", "--control-insecure", "--control-authorized-keys",
            bad, check=False)
    assert r.returncode == 2 and r.stderr == ("shadefs: error: --control-authorized-keys needs --curve-secret-key "
                                              "FILE and a tcp:// --control\n")
    assert not is_mounted(mp) and os.listdir(mp) == []
