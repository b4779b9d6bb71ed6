"""The obstore backend (the default client of s3:// sources) against a real S3 server: moto as a separate
process behind the loopback fault proxy of test_s3_backend (503/500/403, resets, cut bodies, stalls).
The same errors, retries and timeouts as the fsspec backend, and ranges pinned to the object's version.
"""
import concurrent.futures as cf
import logging
import threading
import time

import pytest

from conftest import require

boto3 = require("boto3")
require("s3fs", "obstore.store", "moto.server")

from shadefs.backends import BackendError, open_backend  # noqa: E402
from shadefs.backends.base import NoSuchBucket  # noqa: E402
from shadefs.backends import obstore as obstore_backend  # noqa: E402
from shadefs.backends.obstore import ObstoreBackend  # noqa: E402

from test_s3_backend import BUCKET, FILES, PREFIX, SECRET, aws_env, moto, proxy  # noqa: E402,F401


def make_backend(endpoint: str, prefix: str = PREFIX, **opts) -> ObstoreBackend:
    """The backend as the CLI builds it by default: every option a string from --backend-opt."""
    options = dict(endpoint_url=endpoint, retries="3", retry_base_s="0.01", retry_max_s="0.05",
                   retry_seed="7")
    options.update(opts)
    backend = open_backend(f"s3://{BUCKET}/{prefix}", **options)
    assert isinstance(backend, ObstoreBackend)
    return backend


@pytest.fixture
def backend(proxy):  # noqa: F811
    b = make_backend(proxy.endpoint)
    yield b
    b.close()


def test_walk_lists_the_files_with_etags_markers_kept_odd_keys_skipped(backend, caplog):
    with caplog.at_level(logging.WARNING):
        entries = list(backend.walk())
    assert sorted((e.path, e.size) for e in entries) == sorted((k, len(v)) for k, v in FILES.items())
    assert all(e.etag and e.etag.startswith('"') for e in entries)
    assert any("skipped 2 object(s)" in r.getMessage() for r in caplog.records)
    chunks, _ = backend.scan()
    assert "train/1/deep" in {c.path for c in chunks}


def test_read_is_byte_exact_with_one_get_per_file(backend, proxy):  # noqa: F811
    proxy.clear()
    for path, data in FILES.items():
        got = backend.read(path, len(data))
        assert type(got) is bytes and got == data
    assert proxy.requests and all(m == "GET" for m, _ in proxy.requests)
    assert len(proxy.requests) == len(FILES)


def test_missing_object_is_enoent_and_not_retried(backend, proxy):  # noqa: F811
    proxy.clear()
    with pytest.raises(FileNotFoundError):
        backend.read("train/0/missing.png", 10)
    with pytest.raises(FileNotFoundError):
        backend.read_range("train/0/missing.png", 0, 10)
    assert proxy.count("GET", "missing.png") == 2


@pytest.mark.parametrize("fault", ["503", "500", "reset", "truncate"])
def test_transient_faults_are_retried_until_success(backend, proxy, fault):  # noqa: F811
    data = FILES["train/1/c.png"]
    proxy.clear()
    proxy.inject(fault, 3)  # retries=3: the 4th request gets through (obstore's own retries are off)
    assert backend.read("train/1/c.png", len(data)) == data
    assert proxy.count("GET", "c.png") == 4


def test_eio_after_retries_logged_once_without_secret(proxy, caplog):  # noqa: F811
    b = make_backend(proxy.endpoint, retries="2", key="AKIDSHADEFSTEST", secret=SECRET)
    proxy.clear()
    proxy.inject("503", 100)
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(BackendError) as info:
            b.read("README", len(FILES["README"]))
    b.close()
    assert proxy.count("GET", "README") == 3  # 1 + 2 retries, no hidden inner retries
    assert "failed after 3 attempts" in str(info.value) and "503" in str(info.value)
    assert info.value.__cause__ is not None and "\n" not in str(info.value)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert SECRET not in caplog.text and SECRET not in str(info.value) and SECRET not in b.describe()


def test_access_denied_is_eio_without_retry(backend, proxy):  # noqa: F811
    proxy.clear()
    proxy.inject("403", 1)
    with pytest.raises(BackendError) as info:
        backend.read("README", len(FILES["README"]))
    assert not isinstance(info.value, FileNotFoundError)
    assert proxy.count("GET", "README") == 1


def test_unknown_option_is_a_backend_error_naming_it(proxy):  # noqa: F811
    with pytest.raises(BackendError, match="endpoin_url"):
        make_backend(proxy.endpoint, endpoin_url="http://127.0.0.1:9")


def test_stalled_get_is_eio_in_about_the_read_timeout_per_attempt(proxy, caplog):  # noqa: F811
    """timeout_s (the daemon passes --backend-timeout) caps the per-attempt read timeout."""
    b = make_backend(proxy.endpoint, retries="1", timeout_s="1")
    try:
        assert b.read("README", 6) == FILES["README"]
        proxy.clear()
        proxy.inject("stall", 10)
        t0 = time.monotonic()
        with caplog.at_level(logging.ERROR):
            with pytest.raises(BackendError, match=r"read 'README': failed after 2 attempts"):
                b.read("README", 6)
        took = time.monotonic() - t0
        assert 1.9 <= took < 6, took
        assert proxy.count("GET", "README") == 2
    finally:
        b.close()


def test_a_deadline_is_kept_by_the_backend_itself_with_no_attempt_past_it(proxy, caplog):  # noqa: F811
    """deadline_s (the daemon passes --backend-timeout; no deadline thread then): a stalled attempt ends at
    half the deadline and no retry starts that could not end by it, so the stalled GET is the only one;
    a fast transient failure is still retried."""
    b = make_backend(proxy.endpoint, retries="5", deadline_s="2")
    try:
        assert b.bounds_own_reads
        assert b.read("README", 6) == FILES["README"]
        proxy.clear()
        proxy.inject("stall", 10)
        with caplog.at_level(logging.ERROR):
            with pytest.raises(BackendError, match=r"read 'README': failed after 1 attempts, no time left"):
                b.read("README", 6)
        assert proxy.count("GET", "README") == 1
        proxy.clear()
        proxy.inject("503", 1)
        assert b.read("README", 6) == FILES["README"]
        assert proxy.count("GET", "README") == 2
    finally:
        b.close()


def test_sixteen_stalled_gets_never_hold_up_another_read(proxy):  # noqa: F811
    b = make_backend(proxy.endpoint, retries="0", timeout_s="30", pool_connections="4")
    try:
        assert b.read("README", 6) == FILES["README"]
        proxy.clear()
        proxy.inject("stall", 16)
        with cf.ThreadPoolExecutor(16) as pool:
            stalled = [pool.submit(b.read, "train/0/a.png", 3000) for _ in range(16)]
            deadline = time.monotonic() + 10
            while proxy.count("GET", "a.png") < 16 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert proxy.count("GET", "a.png") == 16  # all in flight at once (pool_connections: idle only)
            other = cf.ThreadPoolExecutor(1)
            try:  # held up behind a stalled GET, it would end only with them (proxy.close())
                got = other.submit(b.read, "train/1/c.png", 70_000).result(timeout=60)
            finally:
                other.shutdown(wait=False)
            assert got == FILES["train/1/c.png"]
            assert not any(f.done() for f in stalled)  # served while all 16 GETs still stall
            proxy.close()  # the stalled GETs fail now
            assert all(isinstance(f.exception(timeout=30), BackendError) for f in stalled)
    finally:
        b.close()


def test_ranges_are_pinned_to_the_version_first_read(backend, moto):  # noqa: F811
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1")
    key = f"{PREFIX}/train/0/pinned.bin"
    v1, v2 = bytes(range(256)) * 40, bytes(reversed(range(256))) * 40
    s3.put_object(Bucket=BUCKET, Key=key, Body=v1)
    try:
        assert backend.read_range("train/0/pinned.bin", 0, 4096) == v1[:4096]  # its ETag is learned
        s3.put_object(Bucket=BUCKET, Key=key, Body=v2)  # same size, new version
        with pytest.raises(BackendError, match="object changed since the listing"):
            backend.read_range("train/0/pinned.bin", 4096, 4096)  # never v2's bytes after v1's
        assert backend.read_range("train/0/pinned.bin", 4096, 4096) == v2[4096:8192]  # a new open: v2
    finally:
        s3.delete_object(Bucket=BUCKET, Key=key)


def test_big_files_are_pinned_to_the_listings_etag(backend, moto, monkeypatch):  # noqa: F811
    monkeypatch.setattr(obstore_backend, "PIN_MIN_BYTES", 1000)  # "big": read by ranges
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1")
    key = f"{PREFIX}/train/0/listed.bin"
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"a" * 5000)
    try:
        size = next(e.size for e in backend.walk() if e.path == "train/0/listed.bin")
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"b" * 5000)  # overwritten after the listing
        with pytest.raises(BackendError, match="object changed since the listing"):
            backend.read_range("train/0/listed.bin", 0, 1000)
        with pytest.raises(BackendError, match="object changed since the listing"):
            backend.read("train/0/listed.bin", size)
    finally:
        s3.delete_object(Bucket=BUCKET, Key=key)


def test_concurrent_reads_from_eight_threads(backend):
    jobs = list(FILES.items()) * 16
    errors = []

    def read(job):
        path, data = job
        if backend.read(path, len(data)) != data:
            errors.append(path)

    threads = [threading.Thread(target=lambda chunk=jobs[i::8]: [read(j) for j in chunk]) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and not any(t.is_alive() for t in threads)


def test_listing_through_obstore_without_the_fsspec_implementation(proxy):  # noqa: F811
    b = make_backend(proxy.endpoint, prefix="many", listing="obstore")
    try:
        proxy.clear()
        entries = list(b.walk())
        assert len(entries) == 1005 and {e.path for e in entries} == {f"{i:05d}.bin" for i in range(1005)}
        assert all(e.etag for e in entries)
        assert proxy.count("GET", "list-type=2") == 2  # two pages, no per-key requests
        assert b.read("00007.bin", 1) == b"7"
    finally:
        b.close()
    for prefix in ("no/such/prefix",):
        b = make_backend(proxy.endpoint, prefix=prefix, listing="obstore")
        with pytest.raises(FileNotFoundError):
            list(b.walk())
        b.close()
    b = open_backend("s3://no-such-bucket-shadefs/x", endpoint_url=proxy.endpoint, retries="0", listing="obstore")
    with pytest.raises(NoSuchBucket, match=f"^bucket 'no-such-bucket-shadefs' does not exist at {proxy.endpoint}$"):
        list(b.walk())
    b.close()
