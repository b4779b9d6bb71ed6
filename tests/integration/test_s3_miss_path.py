"""The miss path over a real S3 server process (moto), through both object-store clients (obstore, the
default, and ``--backend fsspec``):

- one GET per miss: a file no tier admits (tiers off, or ``static`` with its tier full) is read whole
  with one GET, whatever the kernel's READ sizes, counted by the latency proxy between the daemon and
  moto;
- a stalled request costs only itself: with 16 GETs that never answer in flight, a RAM hit and a miss
  of other objects both answer in well under a second (a stalled GET must not hold a connection the
  next miss waits for).
"""
import os
import time

import pytest

from conftest import require
from mountutil import read, wait_for
from shadefs.testing.s3 import LatencyProxyProcess

boto3 = require("boto3")
require("s3fs", "obstore.store", "moto.server")

from test_s3_backend import FaultProxy  # noqa: E402  (the loopback proxy that stalls chosen requests)

BUCKET = "shadefs-miss-path"
N, SIZE = 12, 300_000   # above the kernel's 128 KiB READ: streamed, each file took several GETs
STALLED = 16


@pytest.fixture(scope="module")
def bucket(moto_server):
    s3 = moto_server.client()
    s3.create_bucket(Bucket=BUCKET)
    files = {f"ds/c{i % 3}/{i:03d}.bin": os.urandom(SIZE + i) for i in range(N)}
    files.update({f"ds/hang/{i:02d}.bin": os.urandom(1000 + i) for i in range(STALLED)})
    files.update({f"ds/hit/{i}.bin": os.urandom(2000 + i) for i in range(4)})
    for key, data in files.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=data)
    return moto_server, {k[len("ds/"):]: v for k, v in files.items()}


def _read_in_pieces(path: str, piece: int) -> bytes:
    out = []
    with open(path, "rb", buffering=0) as f:
        while True:
            chunk = f.read(piece)
            if not chunk:
                return b"".join(out)
            out.append(chunk)


@pytest.mark.parametrize("backend", ["obstore", "fsspec"])
@pytest.mark.parametrize("tiers", [["--ram-cache", "0"], ["--policy", "static", "--ram-cache", "1MiB"]],
                         ids=["tiers-off", "static-full"])
def test_a_miss_no_tier_admits_is_one_get_whatever_the_read_sizes(bucket, mount, backend, tiers):
    moto, files = bucket
    names = sorted(p for p in files if p.startswith("c"))
    with LatencyProxyProcess(moto.port, delay_ms=0.2, rate="10gbit") as proxy:
        m = mount(f"s3://{BUCKET}/ds", *tiers, "--no-kernel-cache", "--backend", backend,
                  "--backend-opt", f"endpoint_url={proxy.endpoint}", "--prefetch-concurrency", "0")
        before, stats0 = proxy.snapshot(), m.stats()
        for epoch, piece in enumerate((4096, 1 << 20, 65536)):  # three epochs, three read sizes
            for name in names:
                assert _read_in_pieces(os.path.join(m.path, name), piece) == files[name], (epoch, name)
        after, s = proxy.snapshot(), m.stats()
    misses = s["misses"] - stats0["misses"]
    gets = after["gets"] - before["gets"]
    assert misses >= 2 * N            # static holds 3 of the 12 files: the rest miss every epoch
    assert gets == misses             # GETs per miss: 1.00
    assert after["get_body_bytes"] - before["get_body_bytes"] == s["backend_bytes"] - stats0["backend_bytes"]


@pytest.mark.parametrize("backend", ["obstore", "fsspec"])
def test_sixteen_stalled_gets_leave_a_hit_and_a_miss_of_other_objects_answered(bucket, mount, backend):
    moto, files = bucket
    proxy = FaultProxy(moto.port)
    pids = []
    try:
        m = mount(f"s3://{BUCKET}/ds", "--ram-cache", "1MiB", "--no-kernel-cache", "--backend", backend,
                  "--backend-opt", f"endpoint_url={proxy.endpoint}", "--backend-opt", "retries=0",
                  "--backend-timeout", "60", "--prefetch-concurrency", "0")
        hits = sorted(p for p in files if p.startswith("hit/"))
        for rel in hits:  # RAM hits from now on
            assert read(os.path.join(m.path, rel)) == files[rel]
        proxy.inject("stall", STALLED)
        for i in range(STALLED):
            pid = os.fork()
            if pid == 0:  # a reader whose GET never answers
                try:
                    read(os.path.join(m.path, f"hang/{i:02d}.bin"))
                finally:
                    os._exit(0)
            pids.append(pid)
        # all 16 in flight at once, well within the per-attempt read timeout (15 s): none waits for a connection
        wait_for(lambda: proxy.count("GET", "/hang/") == STALLED, timeout=8)
        for rel in (hits[0], "c1/001.bin"):  # a hit, then a miss of another object
            t0 = time.monotonic()
            assert read(os.path.join(m.path, rel)) == files[rel]
            took = time.monotonic() - t0
            assert took < 1.0, f"{rel} took {took:.1f} s behind {STALLED} stalled GETs"
        assert proxy.count("GET", "/hang/") == STALLED  # still stalled: nobody waited them out
    finally:
        proxy.close()  # the stalled GETs fail now (retries=0): their readers get EIO and exit
        for pid in pids:
            os.waitpid(pid, 0)


def test_a_big_file_is_read_by_whole_chunks_and_never_stitched_from_two_versions(moto_server, mount):
    """17 MiB no tier admits: ranged GETs of whole 8 MiB chunks (3, whatever the READ size); an overwrite
    between two chunks makes the next chunk fail with EIO (If-Match on the listing's ETag), never the
    new version's bytes after the old one's."""
    import errno

    s3 = moto_server.client()
    bucket = "shadefs-big-chunks"
    s3.create_bucket(Bucket=bucket)
    size = 17 << 20
    v1 = os.urandom(size)
    s3.put_object(Bucket=bucket, Key="ds/big.bin", Body=v1)
    try:
        with LatencyProxyProcess(moto_server.port, delay_ms=0.2, rate="10gbit") as proxy:
            m = mount(f"s3://{bucket}/ds", "--ram-cache", "0", "--no-kernel-cache", "--prefetch-concurrency", "0",
                      "--backend-opt", f"endpoint_url={proxy.endpoint}", "--backend-opt", "retries=0")
            path = os.path.join(m.path, "big.bin")
            g0 = proxy.snapshot()["gets"]
            assert _read_in_pieces(path, 128 << 10) == v1
            assert proxy.snapshot()["gets"] - g0 == 3
            with open(path, "rb", buffering=0) as f:
                assert f.read(4096) == v1[:4096]            # chunk 0 of the old version
                s3.put_object(Bucket=bucket, Key="ds/big.bin", Body=os.urandom(size))  # same size, new ETag
                assert f.read(4096) == v1[4096:8192]        # still chunk 0, held by the open
                f.seek(9 << 20)
                with pytest.raises(OSError) as e:
                    f.read(4096)                            # chunk 1: the object changed
                assert e.value.errno == errno.EIO
            assert "object changed since the listing" in m.log()
    finally:
        s3.delete_object(Bucket=bucket, Key="ds/big.bin")
        s3.delete_bucket(Bucket=bucket)
