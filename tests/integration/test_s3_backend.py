"""The fsspec backend against a real S3 server: moto as a separate process, loopback only.

Faults are real, not mocks: a small HTTP-aware TCP proxy between s3fs and moto answers chosen requests
with 503 SlowDown / 403 AccessDenied, resets the connection, or cuts the response body short; an outage
is the moto process killed, a recovery is the process started again on the same port.
"""
import collections
import concurrent.futures as cf
import hashlib
import logging
import os
import socket
import struct
import threading
import time

import pytest
from conftest import require, set_dummy_aws_env

boto3 = require("boto3")
require("s3fs", "moto.server")

from shadefs.testing.s3 import MotoServer  # noqa: E402

from shadefs.backends import BackendError, open_backend  # noqa: E402
from shadefs.backends.base import NoSuchBucket  # noqa: E402
from shadefs.backends.fsspec import FsspecBackend  # noqa: E402

BUCKET = "shadefs-test"
PREFIX = "datasets/fmnist"
SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"  # a distinctive fake secret to hunt for in output
FILES = {
    "train/0/a.png": os.urandom(3000),
    "train/0/b.png": os.urandom(1),
    "train/1/c.png": os.urandom(70_000),
    "train/1/deep/er/d.bin": b"x" * 123,
    "val/e.png": b"",
    "README": b"hello\n",
}
MARKERS = ["train/", "train/1/deep/"]  # zero-byte "directory" objects, as consoles create them
ODD = {"train//double.png": b"odd", "train/dirlike/": b"content"}  # no POSIX path: skipped, logged
OUTSIDE = {"datasets/fmnist2/x": b"no", "datasets/other/y": b"no", "top": b"no"}


class FaultProxy:
    """A loopback HTTP/1.1 proxy that can fail chosen requests for real.

    Every client connection carries one request (``Connection: close`` both ways), so a fault hits
    exactly one request. ``inject(kind, n)`` queues faults for the next ``n`` requests:
    ``"503"`` (S3 SlowDown), ``"500"`` (InternalError), ``"403"`` (AccessDenied), ``"reset"``
    (TCP RST instead of a response), ``"truncate"`` (half the body, then RST), ``"stall"`` (read the
    request, never answer: a hung server; the connection is held until :meth:`close`).
    ``requests`` records ``(method, path)`` of every request, faulted or not.
    """

    _CANNED = {
        "503": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
        "500": (500, "Internal Server Error", "InternalError", "We encountered an internal error."),
        "403": (403, "Forbidden", "AccessDenied", "Access Denied"),
    }

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.requests = []
        self._faults = collections.deque()
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        self._released = threading.Event()   # stalled connections wait on it
        self._thread = threading.Thread(target=self._accept_loop, name="faultproxy", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def inject(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self._faults.extend([kind] * n)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
            self.requests.clear()

    def count(self, method: str, key: str = "") -> int:
        with self._lock:
            return sum(1 for m, p in self.requests if m == method and key in p)

    def close(self) -> None:
        self._closed = True
        self._released.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self._thread.join(timeout=5)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_message_head(sock: socket.socket, buf: bytes = b""):
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                return None, buf
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        return head, rest

    @staticmethod
    def _with_connection_close(head: bytes) -> bytes:
        lines = [ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"connection:")]
        return b"\r\n".join(lines + [b"Connection: close"]) + b"\r\n\r\n"

    @staticmethod
    def _reset(sock: socket.socket) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()

    def _serve(self, conn: socket.socket) -> None:
        try:
            head, rest = self._read_message_head(conn)
            if head is None:
                conn.close()
                return
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            while len(rest) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                rest += chunk
            method, path = head.split(b" ", 2)[:2]
            with self._lock:
                self.requests.append((method.decode(), path.decode()))
                fault = self._faults.popleft() if self._faults else None
            if fault == "reset":
                self._reset(conn)
                return
            if fault == "stall":
                self._released.wait(120)
                conn.close()
                return
            if fault in self._CANNED:
                status, reason, code, message = self._CANNED[fault]
                body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                        f"<Message>{message}</Message><RequestId>fault</RequestId></Error>").encode()
                conn.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
                             f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
                conn.close()
                return
            with socket.create_connection(("127.0.0.1", self.upstream_port), timeout=30) as up:
                up.sendall(self._with_connection_close(head) + rest)
                resp = b""
                while True:
                    chunk = up.recv(1 << 20)
                    if not chunk:
                        break
                    resp += chunk
            resp_head, _, body = resp.partition(b"\r\n\r\n")
            out = self._with_connection_close(resp_head) + body
            if fault == "truncate":
                conn.sendall(out[:len(out) - max(1, len(body) // 2)])
                self._reset(conn)
                return
            conn.sendall(out)
            conn.close()
        except OSError:
            conn.close()


@pytest.fixture(scope="module")
def aws_env():
    """Dummy credentials for this test process only; no shared config, no proxy, no IMDS."""
    with pytest.MonkeyPatch.context() as mp:
        set_dummy_aws_env(mp)
        yield


def seed(endpoint: str, many: int = 0) -> None:
    """Create the bucket with FILES below PREFIX, the directory markers and keys outside the prefix."""
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    objects = {f"{PREFIX}/{k}": v for k, v in FILES.items()}
    objects.update({f"{PREFIX}/{m}": b"" for m in MARKERS})
    objects.update({f"{PREFIX}/{k}": v for k, v in ODD.items()})
    objects.update(OUTSIDE)
    objects.update({f"many/{i:05d}.bin": str(i).encode() for i in range(many)})
    with cf.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: s3.put_object(Bucket=BUCKET, Key=kv[0], Body=kv[1]), objects.items()))


@pytest.fixture(scope="module")
def moto(moto_server):
    """The session's moto process, seeded once for this module (bucket BUCKET)."""
    seed(moto_server.endpoint, many=1005)  # more than one ListObjectsV2 page (1000 keys)
    return moto_server


@pytest.fixture
def proxy(moto):
    p = FaultProxy(moto.port)
    yield p
    p.close()


def make_backend(endpoint: str, prefix: str = PREFIX, **opts) -> FsspecBackend:
    """The backend as the CLI would build it: every option a string from --backend-opt."""
    options = dict(endpoint_url=endpoint, retries="3", retry_base_s="0.01", retry_max_s="0.05",
                   retry_seed="7")
    options.update(opts)
    backend = open_backend(f"s3://{BUCKET}/{prefix}", "fsspec", **options)
    assert isinstance(backend, FsspecBackend)
    return backend


@pytest.fixture
def backend(proxy):
    b = make_backend(proxy.endpoint)
    yield b
    b.close()


def test_walk_lists_exactly_the_files_below_the_prefix(backend, caplog):
    with caplog.at_level(logging.WARNING):
        entries = list(backend.walk())
    assert sorted((e.path, e.size) for e in entries) == sorted((k, len(v)) for k, v in FILES.items())
    assert all(isinstance(e.mtime_ns, int) and e.mtime_ns > 1e18 for e in entries)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "skipped 2 object(s)" in warnings[0]


def test_walk_follows_pagination(proxy):
    b = make_backend(proxy.endpoint, prefix="many")
    try:
        entries = list(b.walk())
    finally:
        b.close()
    assert len(entries) == 1005
    assert {e.path for e in entries} == {f"{i:05d}.bin" for i in range(1005)}
    assert proxy.count("GET", "list-type=2") == 2  # two pages, no per-key requests


def test_read_is_byte_exact_with_one_get_per_file(backend, proxy):
    proxy.clear()
    for path, data in FILES.items():
        assert backend.read(path, len(data)) == data
    assert len(proxy.requests) == len(FILES)
    assert all(m == "GET" for m, _ in proxy.requests)


def test_stat_and_read_range(backend):
    data = FILES["train/1/c.png"]
    size, mtime_ns = backend.stat("train/1/c.png")
    assert size == len(data) and mtime_ns > 1e18
    assert backend.read_range("train/1/c.png", 100, 50) == data[100:150]
    assert backend.read_range("train/1/c.png", len(data) - 10, 50) == data[-10:]
    assert backend.read_range("train/1/c.png", len(data) + 5, 50) == b""
    with pytest.raises(FileNotFoundError):
        backend.stat("train/1/missing.png")


def test_missing_object_is_enoent_and_not_retried(backend, proxy):
    proxy.clear()
    with pytest.raises(FileNotFoundError):
        backend.read("train/0/missing.png", 10)
    assert proxy.count("GET", "missing.png") == 1


def test_missing_prefix_is_enoent_and_missing_bucket_names_bucket_and_endpoint(proxy):
    for prefix in ("no/such/prefix",):
        b = make_backend(proxy.endpoint, prefix=prefix)
        with pytest.raises(FileNotFoundError):
            list(b.walk())
        b.close()
    b = open_backend("s3://no-such-bucket-shadefs/x", "fsspec", endpoint_url=proxy.endpoint, retries="0")
    with pytest.raises(NoSuchBucket, match=f"^bucket 'no-such-bucket-shadefs' does not exist at {proxy.endpoint}$"):
        list(b.walk())
    b.close()


def test_changed_object_is_backend_error_never_short_data(backend, moto):
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1")
    key = f"{PREFIX}/train/0/changing.bin"
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"0123456789")
    size = next(e.size for e in backend.walk() if e.path == "train/0/changing.bin")
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"01234")
    try:
        with pytest.raises(BackendError, match="object changed: 5 bytes, snapshot says 10"):
            backend.read("train/0/changing.bin", size)
    finally:
        s3.delete_object(Bucket=BUCKET, Key=key)


@pytest.mark.parametrize("fault", ["503", "500", "reset", "truncate"])
def test_transient_faults_are_retried_until_success(backend, proxy, fault):
    data = FILES["train/1/c.png"]
    proxy.clear()
    proxy.inject(fault, 3)  # retries=3: the 4th request gets through (for "reset": aiohttp's own
    #                         resend + our 2nd attempt, see the test below)
    assert backend.read("train/1/c.png", len(data)) == data
    assert proxy.count("GET", "c.png") == 4


def test_reset_is_resent_once_by_aiohttp_then_bounded_by_the_policy(proxy):
    # aiohttp resends an idempotent request once when the connection drops before a response
    # (RFC 9112 9.3.1); the policy's bound is on attempts, so a reset storm costs 2 x (retries + 1).
    b = make_backend(proxy.endpoint, retries="2")
    proxy.clear()
    proxy.inject("reset", 100)
    with pytest.raises(BackendError, match="failed after 3 attempts"):
        b.read("README", 6)
    b.close()
    assert proxy.count("GET", "README") == 6


def test_listing_pages_are_retried(backend, proxy):
    proxy.clear()
    proxy.inject("503", 2)
    assert len(list(backend.walk())) == len(FILES)


def test_eio_after_retries_logged_once_without_secret(proxy, caplog):
    b = make_backend(proxy.endpoint, retries="2", key="AKIDSHADEFSTEST", secret=SECRET)
    proxy.clear()
    proxy.inject("503", 100)
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(BackendError) as info:
            b.read("README", len(FILES["README"]))
    b.close()
    assert proxy.count("GET", "README") == 3  # 1 + 2 retries, no hidden inner retries
    assert "failed after 3 attempts" in str(info.value)
    assert info.value.__cause__ is not None
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert SECRET not in caplog.text and SECRET not in str(info.value)


def test_access_denied_is_eio_without_retry(backend, proxy):
    proxy.clear()
    proxy.inject("403", 1)
    with pytest.raises(BackendError) as info:
        backend.read("README", len(FILES["README"]))
    assert not isinstance(info.value, FileNotFoundError)
    assert proxy.count("GET", "README") == 1


def test_describe_and_options_never_contain_the_secret(proxy):
    b = make_backend(proxy.endpoint, key="AKIDSHADEFSTEST", secret=SECRET, token="tok-" + SECRET)
    try:
        text = b.describe()
        assert text == f"s3://{BUCKET}/{PREFIX} (endpoint {proxy.endpoint})"
        assert SECRET not in repr(b.options) and SECRET not in text
        assert b.read("README", 6) == FILES["README"]  # the options were really used
    finally:
        b.close()


def test_concurrent_reads_from_eight_threads(backend):
    jobs = [(p, d) for p, d in FILES.items()] * 16

    def read(job):
        path, data = job
        return hashlib.sha256(backend.read(path, len(data))).digest() == hashlib.sha256(data).digest()

    with cf.ThreadPoolExecutor(8) as pool:
        assert all(pool.map(read, jobs))


def test_outage_is_eio_and_recovery_reads_again(aws_env):
    server = MotoServer().start()  # its own process: this test kills it
    try:
        seed(server.endpoint)
        b = make_backend(server.endpoint, retries="2")
        assert b.read("README", 6) == FILES["README"]
        server.stop()  # outage: connection refused
        with pytest.raises(BackendError) as info:
            b.read("README", 6)
        assert "failed after 3 attempts" in str(info.value)
        with pytest.raises(BackendError):
            list(b.walk())
        server.start()  # recovery, same port; moto keeps no state, so seed again
        seed(server.endpoint)
        assert b.read("README", 6) == FILES["README"]
        assert len(list(b.walk())) == len(FILES)
        b.close()
    finally:
        server.stop()


def test_closed_backend_refuses_reads(proxy):
    b = make_backend(proxy.endpoint)
    b.close()
    b.close()  # idempotent
    with pytest.raises(BackendError, match="closed"):
        b.read("README", 6)


# -- --backend-timeout: a stalled GET is EIO in about the timeout ------------------------------------

def test_stalled_get_is_eio_in_about_the_read_timeout_per_attempt(proxy, caplog):
    """timeout_s (the daemon passes --backend-timeout) is botocore's read timeout: each stalled attempt
    fails after it and is retried; after the retries, EIO. Without it a stalled GET took ~94 s."""
    b = make_backend(proxy.endpoint, retries="1", timeout_s="1")
    try:
        assert b.read("README", 6) == FILES["README"]   # the session is up
        proxy.clear()
        proxy.inject("stall", 10)
        t0 = time.monotonic()
        with caplog.at_level(logging.ERROR):
            with pytest.raises(BackendError, match=r"read 'README': failed after 2 attempts") as e:
                b.read("README", 6)
        took = time.monotonic() - t0
        assert 1.9 <= took < 6, took
        assert proxy.count("GET", "README") == 2
        assert "timeout" in str(e.value).lower()
    finally:
        b.close()


def test_stalled_get_under_the_deadline_wrapper_is_eio_at_the_deadline(proxy, caplog):
    """The daemon's wrapper bounds the whole read (retries included) at --backend-timeout."""
    from shadefs.backends.timeout import TimeoutBackend

    # each attempt may take 1.5 s and there are 6 of them: unwrapped, a stalled read would fail after >= 9 s;
    # the wrapper's deadline of 3 s ends it at 3 s (a deadline well above one loaded GET's time, so that the
    # reads around the stall are answered within it on a busy machine)
    inner = make_backend(proxy.endpoint, retries="5", timeout_s="1.5")
    b = TimeoutBackend(inner, 3.0)
    try:
        assert inner.read("README", 6) == FILES["README"]   # connects and warms the client, no deadline
        proxy.clear()
        proxy.inject("stall", 100)
        t0 = time.monotonic()
        with caplog.at_level(logging.ERROR):
            with pytest.raises(BackendError, match=r"read 'README': no answer from the backend within 3(\.0)? s"):
                b.read("README", 6)
        took = time.monotonic() - t0
        assert 2.9 <= took < 6, took
        assert "read 'README'" in caplog.text
        proxy.clear()                                    # the server answers again: served, exact
        assert b.read("train/1/c.png", len(FILES["train/1/c.png"])) == FILES["train/1/c.png"]
    finally:
        proxy.close()                                    # releases the stalled connections
        b.close()
