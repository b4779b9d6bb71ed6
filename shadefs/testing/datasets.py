"""A map-style dataset of the files under a directory, for the hook tests and the plan benchmarks.

:class:`FileDataset` looks like ``torchvision.datasets.ImageFolder`` where the hooks look
(``samples`` of ``(path, class)``, ``root``), and its item is the length in bytes of the file read whole,
so a ``DataLoader`` over a mount reads every byte through it without decoding images. It needs no torch
(a ``DataLoader`` takes any object with ``__len__`` and ``__getitem__``) and pickles by reference, so it
works with every multiprocessing start method.
"""
from __future__ import annotations

import os
from typing import List, Optional

__all__ = ["FileDataset", "read_size"]


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
    ``read`` (``OSError``: EIO, ENOENT, ...) propagate.
    """

    def __init__(self, root, rel: Optional[List[str]] = None):
        self.root = str(root)
        if rel is None:
            rel = sorted(os.path.relpath(os.path.join(d, f), self.root)
                         for d, _, fs in os.walk(self.root) for f in fs)
        self.rel = list(rel)
        self.samples = [(os.path.join(self.root, r), 0) for r in self.rel]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> int:
        return read_size(self.samples[i][0])
