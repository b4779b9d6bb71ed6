"""The latency proxy counts what crossed its link (the benchmarks' backend GETs and bytes come from it):
GETs and their object bytes exactly, other methods apart, and a live snapshot (SIGUSR1) per epoch."""
from shadefs.testing.s3 import LatencyProxyProcess

from conftest import require  # noqa: E402

BUCKET = "shadefs-proxy-counters"


def test_proxy_counts_gets_and_object_bytes_and_snapshots_live(moto_server):
    boto3 = require("boto3")
    s3 = moto_server.client()
    s3.create_bucket(Bucket=BUCKET)
    sizes = [1, 1000, 70_000, 200_000]   # the last two span several 64 KiB chunks of the link
    for i, n in enumerate(sizes):
        s3.put_object(Bucket=BUCKET, Key=f"k{i}", Body=bytes([i]) * n)
    try:
        with LatencyProxyProcess(moto_server.port, delay_ms=0.5, rate="1gbit") as proxy:
            first = proxy.snapshot()
            assert (first["gets"], first["get_body_bytes"], first["requests"]) == (0, 0, 0)
            c = boto3.client("s3", endpoint_url=proxy.endpoint, region_name="us-east-1")
            for i in range(len(sizes)):
                assert len(c.get_object(Bucket=BUCKET, Key=f"k{i}")["Body"].read()) == sizes[i]
            c.head_object(Bucket=BUCKET, Key="k0")
            mid = proxy.snapshot()
            assert mid["gets"] == 4
            assert mid["get_body_bytes"] == sum(sizes)
            assert mid["methods"] == {"GET": 4, "HEAD": 1}
            assert mid["requests"] == 5
            assert mid["bytes_down"] > sum(sizes)          # headers on top of the bodies
            c.get_object(Bucket=BUCKET, Key="k1")["Body"].read()
            assert proxy.snapshot()["gets"] == 5
        assert proxy.counters["gets"] == 5
        assert proxy.counters["get_body_bytes"] == sum(sizes) + 1000
    finally:
        for i in range(len(sizes)):
            s3.delete_object(Bucket=BUCKET, Key=f"k{i}")
        s3.delete_bucket(Bucket=BUCKET)
