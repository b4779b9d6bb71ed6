"""ControlServer and ControlClient over real ZeroMQ sockets (ipc:// in a private tmp dir, tcp:// on
loopback): requests, one-way scores, exact rejection counters after thousands of fuzzed messages,
handler failures, endpoint validation, runtime-dir and socket permissions, CURVE, and fork safety."""
import logging
import os
import shutil
import stat
import tempfile
import time

import numpy as np
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message
from hypothesis import HealthCheck, given, settings, strategies as st

from shadefs.backends.base import Entry
from shadefs.control import protocol as P
from shadefs.control import server as S
from shadefs.control.client import ControlClient, ControlError, EndpointNotFound, find_endpoint
from shadefs.control.server import ControlServer, validate_endpoint
from shadefs.namespace import Namespace

pytestmark = pytest.mark.timeout(60)

FILES = [f"class{c}/img{i:03d}.jpg" for c in range(3) for i in range(20)] + ["ünï/файл 1.png", "top.bin"]
SMALL_BYTES, SMALL_PATHS = 4096, 16


class FakeDaemon:
    """The handler contract the lead's daemon implements, over a real Namespace."""

    def __init__(self):
        self.namespace = Namespace(Entry(p, 100 + i, 0.0) for i, p in enumerate(FILES))
        self.applied = []
        self.resident_set = set()
        self.fail = set()

    def stats(self):
        if "stats" in self.fail:
            raise RuntimeError("stats exploded")
        return {"files": self.namespace.num_files, "hit_ratio": float("nan"), "tiers": {"ram": {"files": 1}}}

    def apply_scores(self, fids, values):
        if "apply" in self.fail:
            raise RuntimeError("apply exploded")
        assert fids.dtype == np.int64 and values.dtype == np.float32
        self.applied.append((fids.copy(), values.copy()))

    def resident(self, fids):
        if "resident" in self.fail:
            raise RuntimeError("resident exploded")
        return np.array([int(f) in self.resident_set for f in fids], dtype=bool)


@pytest.fixture(scope="module")
def tmpdir_short():
    d = tempfile.mkdtemp(prefix="sfs")  # ipc paths must stay under 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def serve(tmpdir, name, **kw):
    daemon = FakeDaemon()
    srv = ControlServer(f"ipc://{tmpdir}/{name}.sock", daemon, mountpoint="/mnt/x", **kw)
    srv.start()
    return srv, daemon


@pytest.fixture(scope="module")
def live(tmpdir_short):
    srv, daemon = serve(tmpdir_short, "main")
    client = ControlClient(srv.endpoint, timeout_s=5)
    yield srv, daemon, client
    client.close()
    srv.stop()


@pytest.fixture(scope="module")
def small(tmpdir_short):
    """A server with tiny oversize limits, so fuzzing reaches them cheaply."""
    srv, daemon = serve(tmpdir_short, "small", max_message_bytes=SMALL_BYTES, max_paths=SMALL_PATHS)
    yield srv, daemon
    srv.stop()


def raw_dealer(endpoint):
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    return s


def sync(sock, timeout=5.0):
    """Send a stats request after everything already sent; return (replies before it, stats)."""
    rid = P.new_request_id()
    sock.send_multipart(P.encode_stats_request(rid))
    replies = []
    deadline = time.monotonic() + timeout
    while True:
        assert sock.poll(max(1, int((deadline - time.monotonic()) * 1000))), "server stopped answering"
        reply = P.decode_reply(sock.recv_multipart())
        if reply.request_id == rid and isinstance(reply, P.StatsReply):
            return replies, reply.stats
        replies.append(reply)


# -- requests -----------------------------------------------------------------------------------

def test_stats_has_handler_stats_and_counters(tmpdir_short):
    srv, daemon = serve(tmpdir_short, "counts")  # a fresh server: its counters start at zero
    try:
        with ControlClient(srv.endpoint, timeout_s=5) as client:
            stats = client.stats()
            assert stats["scores_received"] == 0
            assert stats["scores_rejected"] == {r: 0 for r in P.REASONS}
            assert client.send_scores(["top.bin"], [1.0])
            assert client.send_scores(["top.bin", "class1/img005.jpg"], [1.0, 2.0])
            client.send_scores(["nope.jpg"], [1.0])           # rejected: unknown_path
            stats = client.stats()                            # ordered after the scores on the same socket
    finally:
        srv.stop()
    assert stats["files"] == len(FILES) and stats["tiers"] == {"ram": {"files": 1}}
    assert stats["hit_ratio"] is None                     # NaN is not JSON
    assert stats["scores_received"] == 2                  # the two accepted messages, counted once each
    assert stats["scores_rejected"] == {r: (1 if r == "unknown_path" else 0) for r in P.REASONS}
    assert len(daemon.applied) == 2


def test_scores_arrive_raw_with_file_ids(live):
    srv, daemon, client = live
    before = srv.counters()["scores_received"]
    n = len(daemon.applied)
    assert client.send_scores(["top.bin", "ünï/файл 1.png", "class1/img005.jpg"], [0.5, 2.25, -1.0])
    client.stats()                                        # ordered after the scores on the same socket
    assert len(daemon.applied) == n + 1
    fids, values = daemon.applied[-1]
    ns = daemon.namespace
    assert fids.tolist() == [ns.file_id("top.bin"), ns.file_id("ünï/файл 1.png"), ns.file_id("class1/img005.jpg")]
    assert values.tolist() == [0.5, 2.25, -1.0]           # raw: the daemon applies the transform
    assert srv.counters()["scores_received"] == before + 1


def test_resident(live):
    srv, daemon, client = live
    ns = daemon.namespace
    daemon.resident_set = {ns.file_id("class0/img001.jpg")}
    flags = client.resident(["class0/img000.jpg", "class0/img001.jpg"])
    assert flags.dtype == bool and flags.tolist() == [False, True]
    assert client.resident([]).shape == (0,)


def test_unknown_paths_reject_the_whole_message(live):
    srv, daemon, client = live
    before = srv.counters()["scores_rejected"]["unknown_path"]
    n = len(daemon.applied)
    client.send_scores(["top.bin", "class0"], [1.0, 2.0])       # a directory is not a file
    client.send_scores(["nope.jpg"], [1.0])
    with pytest.raises(ControlError) as ei:
        client.resident(["top.bin", "missing/x"])
    assert ei.value.reason == "unknown_path"
    client.stats()
    assert len(daemon.applied) == n
    assert srv.counters()["scores_rejected"]["unknown_path"] == before + 3


def test_bad_requests_get_error_replies_with_their_id(live):
    srv, _, _ = live
    sock = raw_dealer(srv.endpoint)
    rid = b"ABCDEFGH"
    sock.send_multipart([b"SHADEFS1", b"resident", rid, b"../x"])
    sock.send_multipart([b"SHADEFS1", b"stats", b"short"])
    sock.send_multipart([b"SHADEFS9", b"stats", rid])
    sock.send_multipart([b"SHADEFS1", b"scores", b"/abs", b"\0\0\0\0"])  # one-way: never answered
    replies, _ = sync(sock)
    assert [(r.request_id, r.reason) for r in replies] == [(rid, "bad_path"), (b"", "malformed"), (rid, "version")]
    assert all(isinstance(r, P.ErrorReply) for r in replies)
    sock.close()


def test_handler_failures_are_answered_and_survived(live, caplog):
    srv, daemon, client = live
    caplog.set_level(logging.ERROR, logger="shadefs.control")
    srv._log_error._last = -float("inf")                  # let this test's first failure be logged
    daemon.fail = {"stats", "apply", "resident"}
    try:
        with pytest.raises(ControlError) as ei:
            client.stats()
        assert ei.value.reason == "error" and "stats exploded" in str(ei.value)
        with pytest.raises(ControlError):
            client.resident(["top.bin"])
        assert client.send_scores(["top.bin"], [1.0])
    finally:
        daemon.fail = set()
    assert client.stats()["files"] == len(FILES)
    assert srv._thread.is_alive()
    records = [r for r in caplog.records if r.name == "shadefs.control" and r.exc_info]
    assert records and "stats exploded" in str(records[0].exc_info[1])


def test_rejections_are_logged_at_most_once_a_second(live, caplog):
    srv, _, _ = live
    caplog.set_level(logging.WARNING, logger="shadefs.control")
    limiter = srv._log_reject
    now = [1000.0]
    limiter._clock, limiter._last, limiter._suppressed = (lambda: now[0]), -float("inf"), 0  # the test's clock
    sock = raw_dealer(srv.endpoint)
    try:
        for _ in range(200):
            sock.send_multipart([b"SHADEFS1", b"scores", b"../x", b"\0\0\0\0"])
        sync(sock)
        now[0] += 0.999                                   # within the second: still suppressed
        sock.send_multipart([b"SHADEFS1", b"scores", b"../x", b"\0\0\0\0"])
        sync(sock)
        now[0] += 0.001                                   # a second after the first: logged, with the count
        sock.send_multipart([b"SHADEFS1", b"scores", b"../x", b"\0\0\0\0"])
        sync(sock)
    finally:
        limiter._clock = time.monotonic
        sock.close()
    warnings = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert "suppressed" not in warnings[0] and warnings[1].endswith("(200 similar messages suppressed)")


def test_oversize_at_the_real_limits(live):
    srv, _, _ = live
    sock = raw_dealer(srv.endpoint)
    before = srv.counters()["scores_rejected"]["oversize"]
    sock.send_multipart([b"SHADEFS1", b"scores", b"a", bytes(P.MAX_MESSAGE_BYTES)])
    sock.send_multipart([b"SHADEFS1", b"resident", b"12345678", b"\0".join([b"a"] * (P.MAX_PATHS + 1))])
    replies, stats = sync(sock, timeout=20)
    assert stats["scores_rejected"]["oversize"] == before + 2
    assert [r.reason for r in replies] == ["oversize"]
    sock.close()


def test_frames_beyond_maxmsgsize_drop_the_peer_not_the_server(small):
    srv, _ = small
    before = srv.counters()["scores_rejected"]["oversize"]
    sock = raw_dealer(srv.endpoint)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.send_multipart([b"SHADEFS1", b"scores", b"a", bytes(SMALL_BYTES + S.MAXMSGSIZE_SLACK + 1)])
    # the server's transport refuses the frame and drops the connection: wait for that, not for a while
    assert monitor.poll(10_000), "the oversized frame did not drop the connection"
    assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
    sock.disable_monitor()
    monitor.close()
    fresh = raw_dealer(srv.endpoint)
    _, stats = sync(fresh)  # the server still answers a new peer
    # the transport dropped the frame (ZMQ_MAXMSGSIZE) before it reached the server: nothing counted
    assert stats["scores_rejected"]["oversize"] == before
    sock.close()
    fresh.close()


# -- fuzzing: thousands of messages, exact counters afterwards ----------------------------------

good_path = st.sampled_from(FILES)
finite = st.sampled_from([0.0, -0.0, 0.5, 1.5, -2.0, 3.25, 1e-30, 1e30, 2.3025851])


@st.composite
def case(draw):
    """(frames, expected reason or None) for one message built with one known defect (or none)."""
    rid = draw(st.binary(min_size=8, max_size=8))
    paths = draw(st.lists(good_path, min_size=1, max_size=6))
    vals = draw(st.lists(finite, min_size=len(paths), max_size=len(paths)))
    ok = P.encode_scores(paths, vals)
    defect = draw(st.sampled_from(["none", "none", "resident", "stats", "version", "unknown_kind",
                                   "malformed", "length_mismatch", "non_finite", "bad_path",
                                   "unknown_path", "oversize", "junk"]))
    if defect == "none":
        return ok, None
    if defect == "resident":
        return P.encode_resident_request(rid, paths), None
    if defect == "stats":
        return P.encode_stats_request(rid), None
    if defect == "version":
        return [draw(st.binary(max_size=10).filter(lambda b: b != P.VERSION))] + ok[1:], "version"
    if defect == "unknown_kind":
        kind = draw(st.binary(max_size=10).filter(lambda b: b not in P.REQUEST_KINDS))
        return [P.VERSION, kind] + ok[2:], "unknown_kind"
    if defect == "malformed":
        return draw(st.sampled_from([
            ok + [b""], ok[:3], ok[:1],
            [P.VERSION, P.STATS, rid[:draw(st.integers(0, 7))]],
            [P.VERSION, P.RESIDENT, rid + b"x", ok[2]],
            [P.VERSION, P.SCORES, b"", b""],
            [P.VERSION, P.SCORES, ok[2] + b"\xff", ok[3]],
        ])), "malformed"
    if defect == "length_mismatch":
        return ok[:3] + [ok[3][:-draw(st.integers(1, 4))]], "length_mismatch"
    if defect == "non_finite":
        i = draw(st.integers(0, len(paths) - 1))
        bad = np.array(vals, dtype="<f4")
        bad[i] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        return ok[:3] + [bad.tobytes()], "non_finite"
    if defect == "bad_path":
        i = draw(st.integers(0, len(paths) - 1))
        broken = list(paths)
        broken[i] = draw(st.sampled_from(["/" + paths[i], "../" + paths[i], paths[i] + "/", "a//b", "./x", ""]))
        joined = "\0".join(broken).encode()
        return ok[:2] + [joined, ok[3]], "bad_path" if joined else "malformed"  # b"": no paths at all
    if defect == "unknown_path":
        broken = list(paths)
        broken[draw(st.integers(0, len(paths) - 1))] = draw(st.sampled_from(["class0", "nope.jpg", "class0/x.jpg"]))
        if draw(st.booleans()):
            return P.encode_resident_request(rid, broken), "unknown_path"
        return P.encode_scores(broken, vals), "unknown_path"
    if defect == "oversize":
        return draw(st.sampled_from([
            ok[:3] + [ok[3] + bytes(SMALL_BYTES)],                        # too many bytes
            P.encode_resident_request(rid, ["top.bin"] * (SMALL_PATHS + 1)),  # too many paths
            [b"junk", bytes(SMALL_BYTES)],                                # bytes beat version
        ])), "oversize"
    # junk: arbitrary frames, classified by the codec plus the snapshot (exercises the receive path)
    frames = draw(st.lists(st.binary(max_size=40) | st.sampled_from([P.VERSION, P.SCORES, P.STATS]),
                           min_size=1, max_size=8))
    return frames, None if draw(st.booleans()) else "?"


def classify(frames, namespace):
    try:
        msg = P.decode_request(frames, max_bytes=SMALL_BYTES, max_paths=SMALL_PATHS)
    except P.ProtocolError as e:
        return e.reason
    if not isinstance(msg, P.StatsRequest) and any(namespace.file_id(p) is None for p in msg.paths):
        return "unknown_path"
    return None


@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(case(), min_size=20, max_size=80))
def test_fuzz_exact_counters(small, batch):
    srv, daemon = small
    sock = raw_dealer(srv.endpoint)
    try:
        before = srv.counters()
        n_applied = len(daemon.applied)
        expected = {r: 0 for r in P.REASONS}
        accepted_scores, n_replies = [], 0
        for frames, reason in batch:
            if reason == "?" or reason is None:
                reason = classify(frames, daemon.namespace)
            else:
                assert classify(frames, daemon.namespace) == reason   # the codec agrees with the construction
            if reason:
                expected[reason] += 1
            elif frames[1] == P.SCORES:
                accepted_scores.append(frames)
            n_replies += P.wants_reply(frames)
            sock.send_multipart(frames)
        replies, stats = sync(sock)
        assert len(replies) == n_replies
        after = srv.counters()
        assert {r: after["scores_rejected"][r] - before["scores_rejected"][r] for r in P.REASONS} == expected
        assert after["scores_received"] - before["scores_received"] == len(accepted_scores)
        assert stats["scores_rejected"] == after["scores_rejected"]
        applied = daemon.applied[n_applied:]
        assert len(applied) == len(accepted_scores)
        for (fids, values), frames in zip(applied, accepted_scores):
            msg = P.decode_request(frames)
            assert fids.tolist() == [daemon.namespace.file_id(p) for p in msg.paths]
            assert values.tobytes() == frames[3]
    finally:
        sock.close()
    assert srv._thread.is_alive()


# -- endpoints, permissions -----------------------------------------------------------------------

@pytest.mark.parametrize("url", [
    None, "tcp://127.0.0.1:0", "tcp://127.0.0.1:5555", "tcp://127.1.2.3:*", "tcp://localhost:9",
    "tcp://[::1]:0", "tcp://[::ffff:127.0.0.1]:7", "ipc:///tmp/x.sock",
])
def test_loopback_and_ipc_accepted(url):
    assert validate_endpoint(url) == url


@pytest.mark.parametrize("url", [
    "tcp://0.0.0.0:5555", "tcp://*:5555", "tcp://10.1.2.3:5555", "tcp://example.com:5555",
    "tcp://[::]:5555", "tcp://eth0:5555", "tcp://192.168.1.1:0",
])
def test_non_loopback_refused_unless_allowed(url):
    with pytest.raises(ValueError, match="not a loopback address"):
        validate_endpoint(url)
    assert validate_endpoint(url, allow_remote=True) == url


@pytest.mark.parametrize("url, match", [
    ("udp://127.0.0.1:5", "use ipc"), ("inproc://x", "use ipc"), ("127.0.0.1:5555", "use ipc"),
    ("ipc://relative.sock", "absolute"), ("ipc://@abstract", "abstract"),
    ("ipc:///" + "x" * 120, "limited"), ("ipc:///no/such/dir/x.sock", "does not exist"),
    ("tcp://127.0.0.1", "HOST:PORT"), ("tcp://127.0.0.1:99999", "port"), ("tcp://127.0.0.1:http", "port"),
    ("tcp://[::1:5", "IPv6"), ("tcp://127.0.0.1:5;127.0.0.1:6", "source"),
])
def test_invalid_endpoints(url, match):
    with pytest.raises(ValueError, match=match):
        validate_endpoint(url, allow_remote=True)


def test_server_constructor_validates(tmpdir_short):
    with pytest.raises(ValueError, match="loopback"):
        ControlServer("tcp://0.0.0.0:0", FakeDaemon(), mountpoint="/m")


def test_tcp_port_zero_resolves(live):
    daemon = FakeDaemon()
    with ControlServer("tcp://127.0.0.1:0", daemon, mountpoint="/m") as srv:
        assert srv.endpoint.startswith("tcp://127.0.0.1:") and not srv.endpoint.endswith(":0")
        with ControlClient(srv.endpoint, timeout_s=5, credentials=srv.credentials) as c:
            assert c.stats()["files"] == len(FILES)


def test_default_endpoint_is_private(monkeypatch, tmpdir_short):
    xdg = tempfile.mkdtemp(prefix="x", dir=tmpdir_short)
    monkeypatch.setenv("XDG_RUNTIME_DIR", xdg)
    srv = ControlServer(None, FakeDaemon(), mountpoint="/mnt/data")
    assert srv.endpoint is None
    srv.start()
    try:
        d = os.path.join(xdg, "shadefs")
        path = os.path.join(d, S.default_socket_name("/mnt/data", os.getpid()))
        assert srv.endpoint == "ipc://" + path
        st_d, st_s = os.stat(d), os.stat(path)
        assert stat.S_IMODE(st_d.st_mode) == 0o700 and st_d.st_uid == os.geteuid()
        assert stat.S_ISSOCK(st_s.st_mode) and stat.S_IMODE(st_s.st_mode) == 0o600
        with ControlClient(srv.endpoint) as c:
            assert c.stats()["files"] == len(FILES)
    finally:
        srv.stop()
    assert not os.path.exists(path)
    srv.stop()  # idempotent


def test_default_socket_name_depends_on_mount_and_pid():
    a = S.default_socket_name("/mnt/a", 10)
    assert a.endswith(".sock") and len(a) == 21
    assert a != S.default_socket_name("/mnt/b", 10) and a != S.default_socket_name("/mnt/a", 11)
    assert a == S.default_socket_name("/mnt/a/", 10)


def test_runtime_dir_refuses_shared_or_foreign_dirs(monkeypatch, tmpdir_short):
    xdg = tempfile.mkdtemp(prefix="r", dir=tmpdir_short)
    monkeypatch.setenv("XDG_RUNTIME_DIR", xdg)
    d = os.path.join(xdg, "shadefs")
    os.mkdir(d)
    os.chmod(d, 0o755)
    with pytest.raises(PermissionError, match="chmod 700"):
        S.runtime_dir()
    with pytest.raises(PermissionError):
        ControlServer(None, FakeDaemon(), mountpoint="/m").start()
    os.chmod(d, 0o700)
    assert S.runtime_dir() == d
    if os.geteuid() == 0:
        os.chown(d, 12345, 12345)
        with pytest.raises(PermissionError, match="belongs to uid 12345"):
            S.runtime_dir()
    os.rmdir(d)
    os.symlink(xdg, d)
    with pytest.raises(PermissionError, match="not a directory"):
        S.runtime_dir()


def test_runtime_dir_candidates(monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert S._runtime_dir_path() == "/run/user/1000/shadefs"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert S._runtime_dir_path() == "/tmp/shadefs-1000"
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(os, "access", lambda p, m: True)
    assert S._runtime_dir_path() == "/run/shadefs"
    monkeypatch.setattr(os, "access", lambda p, m: False)
    assert S._runtime_dir_path() == "/tmp/shadefs-0"


def test_explicit_ipc_path_is_never_clobbered(live, tmpdir_short):
    srv, _, _ = live
    regular = os.path.join(tmpdir_short, "regular")
    with open(regular, "w") as f:
        f.write("data")
    with pytest.raises(ValueError, match="not a socket"):
        ControlServer("ipc://" + regular, FakeDaemon(), mountpoint="/m").start()
    assert open(regular).read() == "data"
    with pytest.raises(ValueError, match="in use"):
        ControlServer(srv.endpoint, FakeDaemon(), mountpoint="/m").start()


def test_start_twice_refused(live):
    srv, _, _ = live
    with pytest.raises(RuntimeError, match="already started"):
        srv.start()


# -- CURVE --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def certs(tmpdir_short):
    import zmq.auth

    d = tempfile.mkdtemp(prefix="k", dir=tmpdir_short)
    server_pub, server_sec = zmq.auth.create_certificates(d, "server")
    client_pub, client_sec = zmq.auth.create_certificates(d, "client")
    allowed = os.path.join(d, "allowed")
    os.mkdir(allowed)
    shutil.copy(client_pub, allowed)
    return dict(server_pub=server_pub, server_sec=server_sec, client_sec=client_sec, allowed=allowed)


def test_curve_encrypts_and_plain_clients_get_nothing(certs):
    with ControlServer("tcp://127.0.0.1:0", FakeDaemon(), mountpoint="/m",
                       curve_secret_key_file=certs["server_sec"]) as srv:
        with ControlClient(srv.endpoint, timeout_s=5, curve_server_key=certs["server_pub"]) as c:
            assert c.stats()["files"] == len(FILES)
        with ControlClient(srv.endpoint, timeout_s=0.3, linger_s=0) as plain:
            with pytest.raises(TimeoutError):
                plain.stats()


def test_curve_authorized_clients_only(certs):
    with ControlServer("tcp://127.0.0.1:0", FakeDaemon(), mountpoint="/m", curve_secret_key_file=certs["server_sec"],
                       curve_authorized_clients=certs["allowed"]) as srv:
        with ControlClient(srv.endpoint, timeout_s=5, curve_server_key=certs["server_pub"],
                           curve_client_key=certs["client_sec"]) as c:
            assert c.stats()["files"] == len(FILES)
        with ControlClient(srv.endpoint, timeout_s=0.3, linger_s=0, curve_server_key=certs["server_pub"]) as stranger:
            with pytest.raises(TimeoutError):
                stranger.stats()


def test_curve_key_validation(certs):
    with pytest.raises(ValueError, match="tcp://"):
        validate_endpoint("ipc:///tmp/x.sock", curve_secret_key_file=certs["server_sec"])
    with pytest.raises(ValueError, match="tcp://"):
        validate_endpoint(None, curve_secret_key_file=certs["server_sec"])
    with pytest.raises(ValueError, match="no secret key"):
        validate_endpoint("tcp://127.0.0.1:0", curve_secret_key_file=certs["server_pub"])
    with pytest.raises(ValueError, match="CURVE key file"):
        validate_endpoint("tcp://127.0.0.1:0", curve_secret_key_file="/no/such/key")


# -- the client ---------------------------------------------------------------------------------

def test_find_endpoint(monkeypatch, tmpdir_short):
    f = os.path.join(tmpdir_short, "plain-file")
    open(f, "w").close()
    monkeypatch.delenv("SHADEFS_ENDPOINT", raising=False)
    with pytest.raises(EndpointNotFound, match="SHADEFS_ENDPOINT"):
        find_endpoint(f)
    with pytest.raises(EndpointNotFound):
        find_endpoint(os.path.join(tmpdir_short, "missing"))
    monkeypatch.setenv("SHADEFS_ENDPOINT", "tcp://127.0.0.1:7")
    assert find_endpoint("/anything") == "tcp://127.0.0.1:7"
    monkeypatch.delenv("SHADEFS_ENDPOINT")
    try:
        os.setxattr(f, "user.shadefs.endpoint", b"ipc:///run/shadefs/abc.sock")
    except OSError:
        pytest.skip("this filesystem has no user xattrs")
    assert find_endpoint(f) == "ipc:///run/shadefs/abc.sock"


def test_send_scores_never_blocks_and_counts_drops(tmpdir_short):
    nobody = f"ipc://{tmpdir_short}/nobody.sock"
    with ControlClient(nobody, timeout_s=0.2, send_hwm=1, linger_s=0) as c:
        results = [c.send_scores(["a"], [1.0]) for _ in range(50)]
        assert c.dropped > 0 and c.dropped == results.count(False) and c.sent == results.count(True)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="daemon running"):
            c.stats()
        assert time.monotonic() - t0 < 2


def test_client_rejects_bad_batches_before_sending(live):
    _, _, client = live
    with pytest.raises(P.ProtocolError) as ei:
        client.send_scores(["/abs"], [1.0])
    assert ei.value.reason == "bad_path"
    with pytest.raises(P.ProtocolError):
        client.send_scores(["a"], [float("nan")])


def test_client_survives_fork(live):
    srv, daemon, client = live
    client.stats()                                        # the parent's socket exists
    pid = os.fork()
    if pid == 0:                                          # the child: a DataLoader worker
        code = 1
        try:
            ok = client.send_scores(["top.bin"], [7.0])
            stats = client.stats()
            code = 0 if ok and stats["files"] == len(FILES) and client._pid == os.getpid() else 2
            client.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert client.stats()["files"] == len(FILES)          # the parent's socket still works
    assert daemon.applied[-1][1].tolist() == [7.0]
