"""The backend contract: where the dataset really lives (an NFS path, an object store).

A backend lists the tree once (to build the metadata snapshot) and reads whole files. It raises
:class:`FileNotFoundError` for a file that is gone and :class:`BackendError` for anything else that
failed (with the cause chained); the FUSE layer maps them to ENOENT and EIO in one place. A backend must
be safe to call from several threads at once. It never caches: caching is the cache's job.
"""
from __future__ import annotations

import abc
from typing import Dict, Iterator, NamedTuple, Tuple, Type

__all__ = ["Backend", "BackendError", "Entry", "register", "open_backend", "backend_for"]


class BackendError(OSError):
    """A backend read or listing failed for a reason other than a missing file (EIO)."""


class Entry(NamedTuple):
    """One regular file of the source tree (a named tuple: a listing makes millions of them).

    Attributes:
        path: relative to the source root, ``/``-separated, no leading slash.
        size: bytes.
        mtime: seconds since the epoch (float).
    """

    path: str
    size: int
    mtime: float


class Backend(abc.ABC):
    """One source tree. ``url`` is what the user passed as SOURCE."""

    scheme: str = ""

    def __init__(self, url: str, **options):
        self.url = url
        self.options = options

    @abc.abstractmethod
    def walk(self) -> Iterator[Entry]:
        """Yield every regular file below the root, in any order.

        Raises:
            FileNotFoundError: the root does not exist.
            BackendError: listing failed.
        """

    @abc.abstractmethod
    def read(self, path: str, size: int) -> bytes:
        """Return the whole content of ``path`` (relative), which the snapshot says is ``size`` bytes.

        Raises:
            FileNotFoundError: the file is gone.
            BackendError: any other failure, including a length different from ``size``
                (the file changed under the mount; partial data is never returned as whole).
        """

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """Return up to ``length`` bytes of ``path`` from ``offset`` (for files too big to cache)."""
        raise NotImplementedError

    def stat(self, path: str) -> Tuple[int, float]:
        """Return (size in bytes, mtime in seconds) of ``path`` now. Raises FileNotFoundError."""
        raise NotImplementedError

    def describe(self) -> str:
        """A one-line description for logs (never includes secrets)."""
        return self.url

    def close(self) -> None:
        """Release connections; the backend is not used afterwards."""


_REGISTRY: Dict[str, str] = {}


def register(scheme: str, target: str) -> None:
    """Register ``"module:Class"`` for URLs of ``scheme`` (imported lazily on first use)."""
    _REGISTRY[scheme] = target


def backend_for(url: str) -> Type[Backend]:
    """Return the backend class for ``url``: a plain path is ``posix``; ``s3://`` etc. are fsspec.

    Raises:
        BackendError: the scheme is unknown, or its optional dependency is missing (with an install hint).
    """
    import importlib

    scheme = url.split("://", 1)[0] if "://" in url else "file"
    target = _REGISTRY.get(scheme, _REGISTRY.get("*"))
    if target is None:
        raise BackendError(f"no backend for {scheme}:// URLs")
    module, _, cls = target.partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as e:  # pragma: no cover - depends on what is installed
        raise BackendError(f"{scheme}:// needs an optional dependency ({e.name}); "
                           f"install it with: pip install 'shadefs[s3]'") from e


def open_backend(url: str, **options) -> Backend:
    """Instantiate the backend for ``url`` with backend-specific ``options``."""
    return backend_for(url)(url, **options)


register("file", "shadefs.backends.posix:PosixBackend")
register("s3", "shadefs.backends.fsspec:FsspecBackend")
register("gs", "shadefs.backends.fsspec:FsspecBackend")
register("gcs", "shadefs.backends.fsspec:FsspecBackend")
register("http", "shadefs.backends.fsspec:FsspecBackend")
register("https", "shadefs.backends.fsspec:FsspecBackend")
register("memory", "shadefs.backends.fsspec:FsspecBackend")
register("*", "shadefs.backends.fsspec:FsspecBackend")  # any other fsspec protocol (abfs, hf, ...)
