"""What does one S3 GET cost the client's process in CPU, for the clients shadefs could read with?

Regime: **counts** (whole-process CPU per GET of one client, alone; no file system, no page cache).
Limit: the cheapest client's CPU per GET, the floor under a miss of an ``s3://`` source through the
daemon (``python -m shadefs.bench s3_miss``).

One moto S3 server on loopback (``shadefs.testing.s3.MotoServer``) holds ``--objects`` objects of
``--size`` bytes; each client reads every object once, sequentially, in this process, and the
process's CPU (``getrusage`` user + system, all threads) is divided by the GETs. Clients: s3fs
``cat_file`` (fsspec), boto3 ``get_object``, obstore ``get`` (the default client of an ``s3://`` source).
Rounds are interleaved; figures are medians over rounds.

    python -m shadefs.bench s3_clients --objects 300 --size 40000 --rounds 2
"""
from __future__ import annotations

import os
import resource
import statistics
import time

from shadefs.testing.s3 import MotoServer

#: the runner's common options this benchmark honours
COMMON = ("rounds", "json")


def add_arguments(p) -> None:
    p.add_argument("--objects", type=int, default=300, help="objects in the bucket, each read once a round")
    p.add_argument("--size", type=int, default=40_000, help="bytes per object")
    p.set_defaults(rounds=2)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(args, bench) -> int:
    import obstore
    import s3fs
    from obstore.store import S3Store

    os.environ.update(AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x", AWS_DEFAULT_REGION="us-east-1")
    server = MotoServer().start()
    bench.on_close(server.stop)
    c = server.client()
    c.create_bucket(Bucket="bkt")
    keys = [f"k{i}" for i in range(args.objects)]
    for k in keys:
        c.put_object(Bucket="bkt", Key=k, Body=os.urandom(args.size))
    fs = s3fs.S3FileSystem(key="x", secret="x", client_kwargs={"endpoint_url": server.endpoint})
    store = S3Store("bkt", endpoint=server.endpoint, access_key_id="x", secret_access_key="x",
                    region="us-east-1", client_options={"allow_http": True})
    clients = {"s3fs cat_file": lambda k: fs.cat_file(f"bkt/{k}"),
               "boto3 get_object": lambda k: c.get_object(Bucket="bkt", Key=k)["Body"].read(),
               "obstore get": lambda k: bytes(obstore.get(store, k).bytes())}
    for get in clients.values():  # connections and imports before the first timed round
        get(keys[0])
    cpu = {name: [] for name in clients}
    wall = {name: [] for name in clients}
    for _, name in bench.interleaved(list(clients)):
        get = clients[name]
        c0, t0 = _cpu_s(), time.monotonic()
        for k in keys:
            if len(get(k)) != args.size:
                raise RuntimeError(f"{name}: a GET of {k} returned the wrong length")
        cpu[name].append((_cpu_s() - c0) / len(keys))
        wall[name].append((time.monotonic() - t0) / len(keys))
    bench.save_json({"cpu_s_per_get": cpu, "wall_s_per_get": wall})
    rows = [[name, f"{statistics.median(cpu[name]) * 1e3:.2f}", f"{statistics.median(wall[name]) * 1e3:.2f}"]
            for name in clients]
    bench.table(f"client CPU per GET, {args.objects} x {args.size} B objects, sequential, medians of "
                f"{args.rounds} rounds", ["client", "CPU ms/GET", "wall ms/GET"], rows)
    return 0
