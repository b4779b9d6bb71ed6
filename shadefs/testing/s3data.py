"""A dataset in an S3 bucket, and the reader that uses no shadefs: what the demo and the epoch benchmark share.

- :func:`upload`: PUT a local tree (an ImageFolder's ``train/``, ``test/``) into a bucket.
- :func:`s3fs_client`: an s3fs client configured like shadefs's fsspec backend (one GET per object).
- :func:`probe`: the whole-object GET latency seen at one or more endpoints.
- :class:`S3ImageFolder`: the FUSE-less reader, a torch-style Dataset with ImageFolder's semantics over
  ``bucket/prefix``, one GET per sample, one client (s3fs, or obstore's ``S3Store``) per DataLoader worker.

Needs the ``test`` extra (boto3, s3fs; torchvision and Pillow for :class:`S3ImageFolder`).
"""
from __future__ import annotations

import concurrent.futures as cf
import io
import os
import statistics
import time
from typing import Dict, List, Sequence

__all__ = ["upload", "s3fs_client", "obstore_client", "probe", "S3ImageFolder"]


def upload(endpoint: str, bucket: str, prefix: str, root: str, splits: Sequence[str] = ("train",),
           threads: int = 8) -> int:
    """PUT every file below ``root/<split>`` (each of ``splits``) to ``s3://bucket/prefix/<split>/<relpath>``,
    creating the bucket if needed. Returns the number of objects written.

    Raises:
        whatever boto3 raises (the endpoint does not answer, ...).
    """
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    try:
        s3.create_bucket(Bucket=bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    files = []
    for split in splits:
        for d, _, names in os.walk(os.path.join(root, split)):
            files += [os.path.join(d, n) for n in names]

    def put(path: str) -> None:
        with open(path, "rb") as f:
            s3.put_object(Bucket=bucket, Key=f"{prefix}/{os.path.relpath(path, root)}", Body=f.read())

    with cf.ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, files))
    return len(files)


def s3fs_client(endpoint: str):
    """A fresh s3fs client configured like shadefs's fsspec backend (one GET per object)."""
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, max_concurrency=1,
                             client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"})


def obstore_client(endpoint: str, bucket: str):
    """A fresh obstore ``S3Store`` of ``bucket`` at ``endpoint`` (plain http allowed, region us-east-1,
    credentials from the environment), retries off as in shadefs's obstore backend."""
    import datetime

    from obstore.store import S3Store

    return S3Store(bucket, config={"endpoint": endpoint, "region": "us-east-1"},
                   client_options={"allow_http": True},
                   retry_config={"max_retries": 0, "retry_timeout": datetime.timedelta(seconds=1)})


def probe(endpoints: Dict[str, str], key: str, n: int = 60, warmup: int = 5) -> Dict[str, Dict[str, float]]:
    """Latency of whole-object GETs of ``key`` (``bucket/path``; s3fs ``cat_file``) at each endpoint: ``n``
    rounds, one sequential GET per endpoint per round (interleaved, so load swings hit all alike), after
    ``warmup`` rounds. Returns ``{name: {"median_ms", "p90_ms"}}`` (milliseconds)."""
    clients = {name: s3fs_client(url) for name, url in endpoints.items()}
    times: Dict[str, List[float]] = {name: [] for name in clients}
    for _ in range(warmup):
        for fs in clients.values():
            fs.cat_file(key)
    for _ in range(n):
        for name, fs in clients.items():
            t0 = time.perf_counter()
            fs.cat_file(key)
            times[name].append(time.perf_counter() - t0)
    out = {}
    for name, ts in times.items():
        ts.sort()
        out[name] = {"median_ms": 1e3 * statistics.median(ts), "p90_ms": 1e3 * ts[int(0.9 * (n - 1))]}
    return out


class S3ImageFolder:
    """The FUSE-less reader: ImageFolder semantics over ``s3://bucket/prefix`` with one GET per sample.

    ``endpoint``: the S3 endpoint URL; ``root``: ``bucket/prefix`` (the folder holding one directory per
    class); ``client``: ``"s3fs"`` (``cat_file``, as a reader written with fsspec does) or ``"obstore"``
    (``obstore.get`` on an ``S3Store``, the client shadefs's default backend uses); the listing is s3fs's. Classes are the sorted first-level "directories", samples sorted by key within a class, exactly
    ImageFolder's order, so a seeded shuffle visits the same files in the same order as on a mount. An
    item is ``(transform(PIL RGB image), class index)``, as ImageFolder's.

    Attributes:
        samples: ``[(key, class index)]``; classes, class_to_idx: as ImageFolder's.
        gets, get_s: GETs made and the seconds they took, shared with the forked DataLoader workers
            (``multiprocessing.Value``; read ``.value``).
    """

    def __init__(self, endpoint: str, root: str, transform=None, client: str = "s3fs"):
        import gc
        import multiprocessing

        from torchvision.datasets.folder import IMG_EXTENSIONS

        if client not in ("s3fs", "obstore"):
            raise ValueError(f"client {client!r}: choose s3fs or obstore")
        self.endpoint, self.root, self.transform, self.client = endpoint, root.rstrip("/"), transform, client
        lister = s3fs_client(endpoint)
        keys = sorted(k for k in lister.find(self.root) if k.lower().endswith(IMG_EXTENSIONS))
        # Close the listing client here, before the DataLoader forks: else each worker inherits it
        # and its finalizer fails there ("attached to a different loop") when the worker exits.
        del lister
        gc.collect()
        rel = [k[len(self.root) + 1:] for k in keys]
        self.classes = sorted({r.split("/", 1)[0] for r in rel if "/" in r})
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = sorted(((self.root + "/" + r, self.class_to_idx[r.split("/", 1)[0]])
                               for r in rel if "/" in r), key=lambda s: (s[1], s[0]))
        self._fs = None
        self._pid = None
        self.gets = multiprocessing.Value("d", 0.0)
        self.get_s = multiprocessing.Value("d", 0.0)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        from PIL import Image

        if self._pid != os.getpid():  # one client per DataLoader worker, made after the fork
            if self.client == "obstore":
                self._fs = obstore_client(self.endpoint, self.root.split("/", 1)[0])
            else:
                self._fs = s3fs_client(self.endpoint)
            self._pid = os.getpid()
        key, target = self.samples[index]
        t0 = time.perf_counter()
        if self.client == "obstore":
            import obstore

            data = bytes(obstore.get(self._fs, key.split("/", 1)[1]).bytes())
        else:
            data = self._fs.cat_file(key)
        seconds = time.perf_counter() - t0
        with self.gets.get_lock():
            self.gets.value += 1
            self.get_s.value += seconds
        img = Image.open(io.BytesIO(data)).convert("RGB")
        return (self.transform(img) if self.transform else img), target
