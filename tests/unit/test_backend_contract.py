"""The backend contract (shadefs/backends/base.py), one suite run against every backend.

posix on a temporary directory, fsspec on ``memory://``, and ``s3://`` against moto's server process
through both object-store backends (obstore, the default, and ``--backend fsspec``) (the session's ``moto_server``; skipped without moto/s3fs, failed under CI=true).
A new backend earns its place by passing this file.
"""
import os
import uuid

import pytest

from shadefs.backends import BackendError, backend_for, open_backend

FILES = {
    "a/1.bin": os.urandom(1000),
    "a/b/2.bin": b"\x00",
    "a/b/c/3.bin": os.urandom(4096),
    "c.txt": b"hello\n",
    "empty.bin": b"",
}


class Source:
    """A backend over a tree holding FILES, plus a way to change an object behind its back."""

    def __init__(self, url, write, **options):
        self.url = url
        self.options = options
        self.write = write
        for path, data in FILES.items():
            write(path, data)
        self.backend = open_backend(url, **options)

    def reopen(self, url):
        return open_backend(url, **self.options)


@pytest.fixture(scope="module")
def moto_endpoint(moto_server):
    client = moto_server.client()
    client.create_bucket(Bucket="contract")
    return moto_server.endpoint, client


# the s3 sources need moto's server process (seconds to start): ``slow``, out of ``make test-fast``
@pytest.fixture(params=["posix", "memory", pytest.param("s3", marks=pytest.mark.slow),
                        pytest.param("s3-fsspec", marks=pytest.mark.slow)])
def source(request, tmp_path):
    if request.param == "posix":
        root = tmp_path / "src"

        def write(path, data):
            full = root / path
            full.parent.mkdir(parents=True, exist_ok=True)
            full.write_bytes(data)

        src = Source(str(root), write)
    elif request.param == "memory":
        import fsspec

        mem = fsspec.filesystem("memory")
        root = f"/contract-{uuid.uuid4().hex}"
        src = Source(f"memory://{root}", lambda path, data: mem.pipe_file(f"{root}/{path}", data))
        request.addfinalizer(lambda: mem.rm(root, recursive=True))
    else:
        endpoint, client = request.getfixturevalue("moto_endpoint")
        prefix = f"t-{uuid.uuid4().hex}"
        src = Source(f"s3://contract/{prefix}",
                     lambda path, data: client.put_object(Bucket="contract", Key=f"{prefix}/{path}",
                                                          Body=data),
                     endpoint_url=endpoint, retries="1", retry_base_s="0.01",
                     **({"backend": "fsspec"} if request.param == "s3-fsspec" else {}))
    yield src
    src.backend.close()


def test_registry_resolves_the_url(source):
    assert backend_for(source.url, source.options.get("backend")) is type(source.backend)
    expected = {"s3": "obstore", "memory": "fsspec", "file": "posix"}
    assert type(source.backend).scheme == (source.options.get("backend")
                                           or expected.get(source.url.split("://")[0], "file"))


def test_walk_lists_exactly_the_files_with_sizes(source):
    entries = list(source.backend.walk())
    assert sorted((e.path, e.size) for e in entries) == sorted((p, len(d)) for p, d in FILES.items())
    assert all(isinstance(e.mtime_ns, int) and e.mtime_ns > 0 for e in entries)
    assert all(not e.path.startswith("/") and "//" not in e.path for e in entries)


def test_read_is_byte_exact(source):
    for path, data in FILES.items():
        got = source.backend.read(path, len(data))
        assert type(got) is bytes and got == data


def test_missing_file_is_file_not_found(source):
    with pytest.raises(FileNotFoundError):
        source.backend.read("a/nope.bin", 10)
    with pytest.raises(FileNotFoundError):
        source.backend.stat("a/nope.bin")


def test_missing_root_is_file_not_found(source, tmp_path):
    url = source.url.rstrip("/") + "-missing" if "://" in source.url else str(tmp_path / "missing")
    backend = source.reopen(url)
    try:
        with pytest.raises(FileNotFoundError):
            list(backend.walk())
    finally:
        backend.close()


@pytest.mark.parametrize("delta", [-1, 1])
def test_wrong_size_is_backend_error(source, delta):
    data = FILES["a/1.bin"]
    with pytest.raises(BackendError):
        source.backend.read("a/1.bin", len(data) + delta)


def test_changed_file_is_backend_error_not_short_data(source):
    size = {e.path: e.size for e in source.backend.walk()}["c.txt"]
    source.write("c.txt", b"hi")
    with pytest.raises(BackendError):
        source.backend.read("c.txt", size)
    source.write("c.txt", b"hello, longer\n")
    with pytest.raises(BackendError):
        source.backend.read("c.txt", size)


def test_stat_and_read_range(source):
    data = FILES["a/b/c/3.bin"]
    size, mtime_ns = source.backend.stat("a/b/c/3.bin")
    assert size == len(data) and isinstance(mtime_ns, int) and mtime_ns > 0
    assert source.backend.read_range("a/b/c/3.bin", 10, 100) == data[10:110]
    assert source.backend.read_range("a/b/c/3.bin", len(data) - 5, 100) == data[-5:]
    assert source.backend.read_range("a/b/c/3.bin", len(data) + 5, 100) == b""


def test_describe_is_one_line(source):
    text = source.backend.describe()
    assert isinstance(text, str) and text and "\n" not in text
