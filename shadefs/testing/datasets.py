"""A map-style dataset of the files under a directory, for the hook tests and the plan benchmarks, and
:func:`random_tree`, the read benchmarks' tree of random files, and :func:`random_file`; :func:`make_npy` /
:func:`npy_epoch`, the records file of the format benchmarks and its random-rows reader (they need numpy).

:class:`FileDataset` looks like ``torchvision.datasets.ImageFolder`` where the hooks look
(``samples`` of ``(path, class)``, ``root``), and its item is the length in bytes of the file read whole,
so a ``DataLoader`` over a mount reads every byte through it without decoding images. It needs no torch
(a ``DataLoader`` takes any object with ``__len__`` and ``__getitem__``) and pickles by reference, so it
works with every multiprocessing start method.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from typing import List, Optional, Tuple

from shadefs.fsutil import atomic_write

__all__ = ["FileDataset", "read_size", "random_file", "random_tree", "completed_tree", "mark_complete",
           "make_npy", "npy_epoch"]


def random_file(path: str, size: int) -> None:
    """Write ``size`` bytes of random content to ``path`` (in 4 MiB writes) unless a file of that size is
    already there (then it is reused as it is). Raises OSError where it cannot be written."""
    if os.path.exists(path) and os.path.getsize(path) == size:
        return
    with open(path, "wb") as f:
        left = size
        while left:
            k = min(left, 4 << 20)
            f.write(os.urandom(k))
            left -= k


def completed_tree(root: str) -> Optional[dict]:
    """The summary :func:`mark_complete` left in ``root/.complete`` (a tree written whole), or None where
    there is none or it cannot be read: the caller compares it with what it would write."""
    try:
        with open(os.path.join(root, ".complete")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def mark_complete(root: str, summary: dict) -> None:
    """Record ``summary`` (JSON) in ``root/.complete``: the tree under ``root`` is written whole."""
    with open(os.path.join(root, ".complete"), "w") as f:
        json.dump(summary, f)


def random_tree(root: str, n: int, mean_size: int, seed: int, per_dir: int = 500) -> List[Tuple[str, int]]:
    """``n`` files of ``mean_size`` +-30 % bytes (uniform, drawn with ``seed``) of random content under
    ``root``, ``per_dir`` to a directory: ``c0000/f0000000.bin`` ... (the read and open_cost benchmarks of shadefs.bench).

    A tree already there with the same list (its ``manifest.json``) is reused; otherwise ``root`` is replaced.
    The data are synced to disk before it returns. Returns ``[(relative path, size in bytes)]`` in path order.

    Raises:
        OSError: the tree cannot be written.
    """
    rng = random.Random(seed)
    lo, hi = max(1, int(mean_size * 0.7)), max(1, int(mean_size * 1.3))
    files = [(f"c{i // per_dir:04d}/f{i:07d}.bin", rng.randint(lo, hi)) for i in range(n)]
    manifest = os.path.join(root, "manifest.json")
    try:
        with open(manifest) as f:
            if [tuple(x) for x in json.load(f)] == files:
                return files
    except (OSError, ValueError, TypeError):
        pass
    if os.path.exists(root):
        shutil.rmtree(root)
    for i in range(0, n, per_dir):
        os.makedirs(os.path.join(root, os.path.dirname(files[i][0])), exist_ok=True)
    for rel, size in files:
        fd = os.open(os.path.join(root, rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, os.urandom(size))
        finally:
            os.close(fd)
    os.makedirs(root, exist_ok=True)
    atomic_write(manifest, json.dumps(files).encode(), mode=0o644)
    os.sync()
    return files


def make_npy(path: str, size: int, record: int) -> None:
    """Write a ``.npy`` file at ``path`` of ``size // record`` float32 rows of ``record`` bytes each
    (random values, seed 1, so a row's sum is the same in every run)."""
    import numpy as np

    rows = size // record
    a = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, record // 4))
    rng = np.random.default_rng(1)
    for i in range(0, rows, 4096):
        a[i:i + 4096] = rng.random((min(4096, rows - i), record // 4), dtype=np.float32)
    a.flush()
    del a


def npy_epoch(path: str, rows) -> float:
    """One epoch of the rows ``rows`` (an integer array, in that order) of the ``.npy`` file at ``path``,
    memory-mapped (``np.load(mmap_mode="r")``), 1,000 rows a read; returns their sum (float64)."""
    import numpy as np

    a = np.load(path, mmap_mode="r")
    total = 0.0
    for i in range(0, len(rows), 1000):
        total += float(a[rows[i:i + 1000]].sum(dtype=np.float64))
    del a
    return total


def read_size(path: str) -> int:
    """Read the file at ``path`` whole, in 1 MiB reads, and return its size in bytes.

    Raises: ``OSError`` of ``open`` or ``read`` (EIO, ENOENT, ...)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        n = 0
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                return n
            n += len(b)
    finally:
        os.close(fd)


class FileDataset:
    """The files under ``root``, sorted by relative path (or exactly ``rel``, relative paths, in order).

    Attributes:
        root: the directory (str).
        rel: relative paths, one per sample.
        samples: ``[(absolute path, 0), ...]``, as ImageFolder's ``samples``.

    ``dataset[i]`` reads sample ``i`` whole and returns its size in bytes (int); errors of ``open`` and
    ``read`` (``OSError``: EIO, ENOENT, ...) propagate. With ``drop_pages`` it then drops the file's pages
    on the same open (:func:`shadefs.testing.regime.read_dropping`): the kernel keeps none between opens.
    """

    def __init__(self, root, rel: Optional[List[str]] = None, drop_pages: bool = False):
        self.root = str(root)
        self.drop_pages = drop_pages
        if rel is None:
            rel = sorted(os.path.relpath(os.path.join(d, f), self.root)
                         for d, _, fs in os.walk(self.root) for f in fs)
        self.rel = list(rel)
        self.samples = [(os.path.join(self.root, r), 0) for r in self.rel]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> int:
        if self.drop_pages:
            from .regime import read_dropping

            return len(read_dropping(self.samples[i][0]))
        return read_size(self.samples[i][0])
