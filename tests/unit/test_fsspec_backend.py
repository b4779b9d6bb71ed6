"""The fsspec backend's pieces that need no server: the transient-error classifier, the retry policy,
option parsing, secret redaction, and the install hint for a missing implementation package."""
import asyncio
import errno
import http.client
import logging
import subprocess
import sys

import fsspec
import pytest
from fsspec.exceptions import FSTimeoutError
from fsspec.registry import known_implementations

from shadefs.backends import BackendError, backend_for, open_backend
from shadefs.backends.fsspec import FsspecBackend, parse_options
from shadefs.backends.retry import RetryPolicy, is_transient, redact

from conftest import require

bx = require("botocore.exceptions")
aiohttp = require("aiohttp")


def client_error(code, status, op="GetObject"):
    return bx.ClientError({"Error": {"Code": code, "Message": "m"},
                           "ResponseMetadata": {"HTTPStatusCode": status}}, op)


def caused(outer, cause):
    outer.__cause__ = cause
    return outer


class GcsLikeHttpError(Exception):
    def __init__(self, code):
        super().__init__(f"HTTP {code}")
        self.code = code


def response_error(status):
    return aiohttp.ClientResponseError(None, (), status=status, message="x")


TRANSIENT = {
    "s3 SlowDown 503": client_error("SlowDown", 503),
    "s3 InternalError 500": client_error("InternalError", 500),
    "s3 ServiceUnavailable": client_error("ServiceUnavailable", 503),
    "s3 RequestTimeout (400)": client_error("RequestTimeout", 400),
    "throttling (400)": client_error("Throttling", 400),
    "429": client_error("TooManyRequests", 429),
    "502 bare code": client_error("502", 502),
    "s3fs-translated SlowDown": caused(OSError(errno.EBUSY, "reduce"), client_error("SlowDown", 503)),
    "s3fs-translated 500": caused(OSError(errno.EREMOTEIO, "internal"), client_error("500", 500)),
    "endpoint down": bx.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
    "connect timeout": bx.ConnectTimeoutError(endpoint_url="http://127.0.0.1:1"),
    "read timeout": bx.ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
    "connection closed": bx.ConnectionClosedError(endpoint_url="http://127.0.0.1:1"),
    "aiohttp disconnected": aiohttp.ServerDisconnectedError(),
    "aiohttp payload": aiohttp.ClientPayloadError("short"),
    "aiohttp os error": aiohttp.ClientOSError(errno.ECONNRESET, "reset"),
    "aiohttp 503": response_error(503),
    "TimeoutError": TimeoutError(),
    "asyncio timeout": asyncio.TimeoutError(),
    "fsspec timeout": FSTimeoutError(),
    "reset": ConnectionResetError(errno.ECONNRESET, "reset"),
    "refused": ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
    "broken pipe": BrokenPipeError(),
    "incomplete read": http.client.IncompleteRead(b"ab", 10),
    "errno ETIMEDOUT": OSError(errno.ETIMEDOUT, "timed out"),
    "gcs-like 503": GcsLikeHttpError(503),
    "unknown wrapper of a reset": caused(RuntimeError("wrapped"), ConnectionResetError()),
}
PERMANENT = {
    "missing": FileNotFoundError("k"),
    "s3fs-translated NoSuchKey": caused(FileNotFoundError("k"), client_error("NoSuchKey", 404)),
    "permission": PermissionError("denied"),
    "s3fs-translated 403": caused(PermissionError("denied"), client_error("AccessDenied", 403)),
    "s3 403": client_error("AccessDenied", 403),
    "s3 invalid range": caused(OSError(errno.EINVAL, "range"), client_error("InvalidRange", 416)),
    "no credentials": bx.NoCredentialsError(),
    "tls": bx.SSLError(endpoint_url="https://x", error="certificate verify failed"),
    "aiohttp 404": response_error(404),
    "aiohttp 403": response_error(403),
    "ValueError": ValueError("bad"),
    "plain OSError": OSError("?"),
    "ENOSPC": OSError(errno.ENOSPC, "full"),
    "RuntimeError": RuntimeError("?"),
    "BackendError": BackendError("object changed"),
    "gcs-like 404": GcsLikeHttpError(404),
}


@pytest.mark.parametrize("exc", TRANSIENT.values(), ids=TRANSIENT.keys())
def test_is_transient(exc):
    assert is_transient(exc) is True


@pytest.mark.parametrize("exc", PERMANENT.values(), ids=PERMANENT.keys())
def test_is_not_transient(exc):
    assert is_transient(exc) is False


def test_is_transient_survives_a_cycle_in_the_chain():
    a, b = OSError("a"), OSError("b")
    a.__cause__, b.__cause__ = b, a
    assert is_transient(a) is False


class Flaky:
    """Fails with the given exceptions in turn, then returns "ok"."""

    def __init__(self, *failures):
        self.failures = list(failures)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "ok"


def policy(retries=3, sleeps=None):
    return RetryPolicy(retries, base_s=0.1, max_s=0.3, seed=1,
                       sleep=(sleeps.append if sleeps is not None else lambda s: None))


def test_retry_succeeds_after_transient_failures_with_bounded_backoff():
    sleeps = []
    fn = Flaky(TimeoutError(), ConnectionResetError(), client_error("SlowDown", 503))
    assert policy(3, sleeps).call(fn, "read 'x'") == "ok"
    assert fn.calls == 4 and len(sleeps) == 3
    for i, s in enumerate(sleeps):
        d = min(0.3, 0.1 * 2 ** i)
        assert d / 2 <= s <= d


def test_retry_jitter_is_seeded():
    a, b = RetryPolicy(seed=3), RetryPolicy(seed=3)
    assert [a.backoff(i) for i in range(6)] == [b.backoff(i) for i in range(6)]
    assert all(a.backoff(i) <= 5.0 for i in range(100))


def test_file_not_found_is_never_retried_nor_wrapped():
    fn = Flaky(FileNotFoundError("k"))
    with pytest.raises(FileNotFoundError):
        policy(5).call(fn, "read 'k'")
    assert fn.calls == 1


def test_permanent_failure_is_backend_error_at_once(caplog):
    fn = Flaky(PermissionError("denied"))
    with pytest.raises(BackendError) as info:
        policy(5).call(fn, "read 'k'")
    assert fn.calls == 1 and isinstance(info.value.__cause__, PermissionError)
    assert not isinstance(info.value, FileNotFoundError)


def test_exhausted_retries_are_backend_error_logged_once(caplog):
    fn = Flaky(*[TimeoutError("slow")] * 10)
    with caplog.at_level(logging.DEBUG, logger="shadefs.backends.retry"):
        with pytest.raises(BackendError, match="failed after 3 attempts") as info:
            policy(2).call(fn, "read 'k'", secrets=["hunter2-secret"])
    assert fn.calls == 3 and isinstance(info.value.__cause__, TimeoutError)
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1


def test_zero_retries_means_one_attempt():
    fn = Flaky(TimeoutError())
    with pytest.raises(BackendError):
        policy(0).call(fn, "read 'k'")
    assert fn.calls == 1


@pytest.mark.parametrize("args", [(-1, 0.1, 1), (1, 0, 1), (1, 2, 1)])
def test_retry_policy_rejects_bad_settings(args):
    with pytest.raises(ValueError):
        RetryPolicy(*args)


def test_messages_never_carry_secrets():
    fn = Flaky(OSError("GET https://user:pa55word@host/x?X-Amz-Signature=abcd&token=zz9 failed: s3cr3tvalue"))
    with pytest.raises(BackendError) as info:
        policy(0).call(fn, "read 'k'", secrets=["s3cr3tvalue"])
    text = str(info.value)
    for secret in ("pa55word", "abcd", "zz9", "s3cr3tvalue"):
        assert secret not in text
    assert redact("s3://bucket/prefix") == "s3://bucket/prefix"


def test_parse_options_coerces_and_nests():
    out = parse_options({"anon": "true", "use_ssl": "False", "max_concurrency": "4",
                         "config_kwargs.read_timeout": "2.5", "client_kwargs.region_name": "eu-west-1",
                         "secret": "123456", "key": "true", "name": "plain", "n": 3})
    assert out == {"anon": True, "use_ssl": False, "max_concurrency": 4,
                   "config_kwargs": {"read_timeout": 2.5}, "client_kwargs": {"region_name": "eu-west-1"},
                   "secret": "123456", "key": "true", "name": "plain", "n": 3}


def test_parse_options_rejects_a_collision():
    with pytest.raises(BackendError):
        parse_options({"client_kwargs": "x", "client_kwargs.region_name": "y"})


@pytest.fixture
def s3_options():
    require("s3fs")
    return dict(endpoint_url="http://127.0.0.1:9", anon="false", key="AKIDEXAMPLE",
                secret="very-secret-value-42", region="eu-west-1", read_timeout="3")


def test_s3_options_land_where_s3fs_wants_them(s3_options):
    b = open_backend("s3://bucket/some/prefix/", "fsspec", **s3_options)
    fs = b.fs
    assert fs.client_kwargs == {"endpoint_url": "http://127.0.0.1:9", "region_name": "eu-west-1"}
    assert fs.config_kwargs["retries"] == {"total_max_attempts": 1}  # ours is the only retry layer
    assert fs.config_kwargs["read_timeout"] == 3
    assert fs.anon is False and fs.retries == 1 and fs.max_concurrency == 1
    assert "max_pool_connections" not in fs.config_kwargs  # botocore's default unless the daemon sizes it
    b.close()
    b = open_backend("s3://bucket/some/prefix/", "fsspec", **s3_options, pool_connections="288")
    assert b.fs.config_kwargs["max_pool_connections"] == 288
    assert b.root == "bucket/some/prefix"
    assert b.describe() == "s3://bucket/some/prefix (endpoint http://127.0.0.1:9)"
    assert "very-secret-value-42" not in repr(b.options) and b.options["secret"] == "***"
    b.close()


def test_s3_user_settings_win_over_defaults(s3_options):
    b = open_backend("s3://bucket/p", "fsspec", **s3_options, **{"config_kwargs.retries.max_attempts": "3",
                                                       "max_concurrency": "8"})
    assert b.fs.config_kwargs["retries"] == {"max_attempts": 3} and b.fs.max_concurrency == 8
    b.close()


def test_bad_options_are_backend_errors(s3_options):
    with pytest.raises(BackendError, match="retry"):
        open_backend("s3://bucket/p", "fsspec", retries="-1")
    with pytest.raises(BackendError, match="retry"):
        open_backend("s3://bucket/p", "fsspec", retry_base_s="soon")
    with pytest.raises(BackendError, match="pool_connections"):
        open_backend("s3://bucket/p", "fsspec", pool_connections="many")
    with pytest.raises(BackendError, match="no backend for nosuchproto://"):
        open_backend("nosuchproto://x")
    typo = open_backend("s3://bucket/p", "fsspec", endpoin_url="http://127.0.0.1:9", retries="3")
    with pytest.raises(BackendError, match="endpoin_url"):  # s3fs rejects it on first use, not retried
        list(typo.walk())
    typo.close()


def test_any_fsspec_protocol_resolves_to_fsspec_backend():
    assert backend_for("s3://b/p", "fsspec") is FsspecBackend  # --backend fsspec
    assert backend_for("memory://x") is FsspecBackend
    assert backend_for("abfs://container/p") is FsspecBackend  # the "*" registration


@pytest.fixture
def unavailable_protocol():
    """A protocol fsspec knows but whose package is missing: fsspec's real ImportError path."""
    fsspec.register_implementation("shadefsnope", "shadefs_no_such_package.NopeFileSystem",
                                   errtxt="Please install shadefs_no_such_package to use nope://")
    yield "shadefsnope"
    known_implementations.pop("shadefsnope", None)


def test_missing_package_gives_the_one_line_install_hint(unavailable_protocol):
    with pytest.raises(BackendError) as info:
        open_backend(f"{unavailable_protocol}://bucket/x")
    assert str(info.value) == (f"{unavailable_protocol}:// needs an optional dependency "
                               "(shadefs_no_such_package); install it with: pip install "
                               "shadefs_no_such_package")
    assert isinstance(info.value.__cause__, ImportError)


def test_missing_gcsfs_hint():
    try:
        import gcsfs  # noqa: F401
        pytest.skip("gcsfs is installed")
    except ImportError:
        pass
    with pytest.raises(BackendError, match=r"gs:// needs an optional dependency \(gcsfs\); "
                                           r"install it with: pip install gcsfs"):
        open_backend("gs://bucket/prefix", "fsspec")


def test_memory_walk_skips_markers_and_unrepresentable_keys(caplog):
    mem = fsspec.filesystem("memory")
    mem.pipe_file("/skiptest/ok/a.bin", b"abc")
    mem.makedirs("/skiptest/emptydir", exist_ok=True)
    b = open_backend("memory://skiptest")
    with caplog.at_level(logging.WARNING):
        assert [(e.path, e.size) for e in b.walk()] == [("ok/a.bin", 3)]
    assert not caplog.records
    b.close()
    mem.rm("/skiptest", recursive=True)


def test_memory_empty_root_that_exists_walks_empty():
    mem = fsspec.filesystem("memory")
    mem.makedirs("/emptyroot", exist_ok=True)
    b = open_backend("memory://emptyroot")
    assert list(b.walk()) == []
    b.close()
    mem.rm("/emptyroot", recursive=True)


def test_memory_root_that_is_a_file_is_file_not_found():
    mem = fsspec.filesystem("memory")
    mem.pipe_file("/fileroot/a.bin", b"abc")
    b = open_backend("memory://fileroot/a.bin")
    with pytest.raises(FileNotFoundError):
        list(b.walk())
    b.close()
    mem.rm("/fileroot", recursive=True)


def test_memory_scan_keeps_empty_directories_and_their_parents():
    """Every directory of the source is a directory of the snapshot, empty ones included:
    ``walk`` yields files only, ``scan`` also the directories a listing shows without files."""
    from shadefs.namespace import Namespace

    mem = fsspec.filesystem("memory")
    mem.pipe_file("/scantest/cls_a/a.bin", b"abc")
    mem.makedirs("/scantest/cls_empty", exist_ok=True)
    mem.makedirs("/scantest/deep/only/dirs", exist_ok=True)
    b = open_backend("memory://scantest")
    try:
        assert [e.path for e in b.walk()] == ["cls_a/a.bin"]
        ns = Namespace.scan(b)
        assert ns.num_files == 1
        assert ns.children(ns.lookup("")) == ("cls_a", "cls_empty", "deep")
        assert ns.children(ns.lookup("cls_empty")) == ()
        assert ns.children(ns.lookup("deep/only")) == ("dirs",)
        assert ns.children(ns.lookup("deep/only/dirs")) == ()
    finally:
        b.close()
        mem.rm("/scantest", recursive=True)


def test_listing_timestamps_become_exact_integer_nanoseconds():
    """A listing's timestamp is converted in integers (a float of seconds would round the microseconds
    of a 2001 date to ~240 ns steps); a number is seconds; none is 0."""
    import datetime as dt

    from shadefs.backends.base import mtime_ns as _mtime_ns

    t = dt.datetime(2001, 9, 9, 1, 46, 40, 123456, tzinfo=dt.timezone.utc)
    assert _mtime_ns({"LastModified": t}) == 1_000_000_000_123_456_000
    assert _mtime_ns({"LastModified": t.replace(tzinfo=None)}) == 1_000_000_000_123_456_000  # naive: UTC
    assert _mtime_ns({"updated": "2001-09-09T01:46:40.123456Z"}) == 1_000_000_000_123_456_000
    assert _mtime_ns({"LastModified": t.astimezone(dt.timezone(dt.timedelta(hours=2)))}) == 1_000_000_000_123_456_000
    assert _mtime_ns({"mtime": 1_000_000_000}) == 1_000_000_000_000_000_000
    assert _mtime_ns({"mtime": 1.5}) == 1_500_000_000
    assert _mtime_ns({"size": 3}) == 0 and _mtime_ns({"mtime": True}) == 0


def test_object_store_urls_are_obstore_by_default_and_fsspec_without_it():
    require("s3fs")
    from shadefs.backends.obstore import ObstoreBackend

    assert backend_for("s3://b/p") is ObstoreBackend and backend_for("gs://b/p") is ObstoreBackend
    assert backend_for("az://c/p") is ObstoreBackend and backend_for("https://h/d/") is FsspecBackend
    # a platform without the obstore wheel: the daemon still imports and reads s3:// through fsspec,
    # with the install hint logged once
    code = ("import sys, logging; sys.modules['obstore'] = None; logging.basicConfig(level=logging.WARNING)\n"
            "from shadefs.backends import backend_for\n"
            "print(backend_for('s3://b/p').__name__, backend_for('gs://b/p').__name__)\n"
            "import shadefs.daemon, shadefs.cli\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["FsspecBackend", "FsspecBackend"]
    assert r.stderr.count("pip install obstore") == 1
