"""The backend contract: where the dataset really lives (an NFS path, an object store).

A backend lists the tree once (to build the metadata snapshot) and reads whole files. It raises
:class:`FileNotFoundError` for a file that is gone and :class:`BackendError` for anything else that
failed (with the cause chained); the FUSE layer maps them to ENOENT and EIO in one place. A backend must
be safe to call from several threads at once. It never caches: caching is the cache's job.
"""
from __future__ import annotations

import abc
import dataclasses
import datetime as dt
import errno
from typing import Any, Dict, Iterable, Iterator, List, NamedTuple, Optional, Tuple, Type

import numpy as np
from xxhash import xxh3_64_intdigest as _xxh3

__all__ = ["Backend", "BackendError", "NoSuchBucket", "StaleSource", "PASSED_ERRNOS", "reply_errno", "Entry", "DirChunk", "ScanReport", "make_chunk", "encode_name",
           "etag_hash", "chunks_from_entries", "register", "open_backend", "backend_for"]


class BackendError(OSError):
    """A backend read or listing failed for a reason other than a missing file (EIO)."""


class NoSuchBucket(BackendError):
    """The bucket (or container) of an object-store URL does not exist at the endpoint asked; the
    message names both: ``bucket 'NAME' does not exist at ENDPOINT``. A mount refuses it (exit 2)."""

    def __init__(self, bucket: str, endpoint: Optional[str]):
        super().__init__(f"bucket {bucket!r} does not exist at {endpoint or 'the default endpoint'}")
        self.bucket, self.endpoint = bucket, endpoint


#: errnos a failed open or read is answered with as they are (anything else but ENOENT is EIO):
#: ESTALE, the source path now names another file than the snapshot's (replaced, a symlink swapped in);
#: EMFILE / ENFILE, the daemon is out of file descriptors (nothing is wrong with the file or its entry)
PASSED_ERRNOS = frozenset({errno.ESTALE, errno.EMFILE, errno.ENFILE})


def reply_errno(e: BaseException) -> int:
    """The errno a FUSE front end answers a failed operation with: ENOENT for a missing file, an
    errno of :data:`PASSED_ERRNOS` as it is, EIO for anything else."""
    if isinstance(e, FileNotFoundError):
        return errno.ENOENT
    if isinstance(e, OSError) and e.errno in PASSED_ERRNOS:
        return e.errno
    return errno.EIO


class StaleSource(BackendError):
    """The source path now names another file than the snapshot's (ESTALE): another inode (replaced,
    or a symlink swapped in), no regular file, or a symlink the scan would not serve. (The same file
    with another size or mtime is a plain :class:`BackendError`: it changed under the mount, EIO.)"""

    def __init__(self, msg: str):
        super().__init__(errno.ESTALE, msg)


class Entry(NamedTuple):
    """One regular file of the source tree (a named tuple: a listing makes millions of them).

    Attributes:
        path: relative to the source root, ``/``-separated, no leading slash.
        size: bytes.
        mtime_ns: modification time, integer nanoseconds since the epoch (as exact as the source keeps
            it: ``st_mtime_ns`` for a file system, the listing's timestamp for an object store).
        mode: the source's permission bits (``st_mode & 0o7777``), or None where the source has none
            (object stores: served as 0444).
        uid, gid: the source's owner and group, or None (served as the daemon's own).
        etag: the object's ETag (or another content version tag) where the listing gives one for free
            (S3 ``ListObjectsV2``), else None.
    """

    path: str
    size: int
    mtime_ns: int
    mode: Optional[int] = None
    uid: Optional[int] = None
    gid: Optional[int] = None
    etag: Optional[str] = None


def etag_hash(etag: Optional[str]) -> int:
    """The 64-bit tag the namespace and the disk manifest keep of an ETag: ``xxh3_64`` of it without
    its quotes, never 0 (0 = unknown)."""
    if not etag:
        return 0
    return _xxh3(etag.strip('"').encode("utf-8", "surrogateescape")) or 1


@dataclasses.dataclass
class DirChunk:
    """One directory of a structured listing (:meth:`Backend.scan`): the directory's own attributes
    and its regular files as arrays, so a listing of millions of files keeps no Python object per file.

    Attributes:
        path: relative to the source root (``""`` = the root), ``/``-separated.
        mode, uid, gid: the directory's permission bits, owner and group.
        mtime_ns, ctime_ns: the directory's mtime and ctime (integer nanoseconds; 0 if unknown).
        names: the file names, UTF-8 (``surrogateescape``), sorted as Python strings, concatenated.
        name_lens: shape (k,) int64, bytes of each name in ``names``.
        name_hashes: shape (k,) uint64, ``xxh3_64`` of each encoded name.
        sizes: shape (k,) int64 bytes. mtimes_ns: shape (k,) int64 nanoseconds since the epoch.
        modes: shape (k,) uint16 permission bits. uids, gids: shape (k,) uint32.
        subdirs: names of the subdirectories listed in this directory; each has its own chunk, and a
            name without one (a subdirectory that could not be listed) is left out of the tree.
        etags: shape (k,) uint64, :func:`etag_hash` of each file's ETag (0 = unknown), or None when
            the source gives none.
        size: the directory's own ``st_size`` in bytes as the source reports it (0 where it has none).
    """

    path: str
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    ctime_ns: int
    names: bytes
    name_lens: np.ndarray
    name_hashes: np.ndarray
    sizes: np.ndarray
    mtimes_ns: np.ndarray
    modes: np.ndarray
    uids: np.ndarray
    gids: np.ndarray
    subdirs: List[str]
    etags: Optional[np.ndarray] = None
    size: int = 0

    @property
    def num_files(self) -> int:
        return len(self.sizes)


def encode_name(name: str) -> bytes:
    """A file name as the namespace stores it: UTF-8, undecodable bytes kept (``surrogateescape``)."""
    return name.encode("utf-8", "surrogateescape")


def make_chunk(path: str, names: List[str], sizes, mtimes_ns, modes, uids, gids, subdirs: List[str],
               mode: int, uid: int, gid: int, mtime_ns: int = 0, ctime_ns: int = 0, etags=None,
               size: int = 0) -> DirChunk:
    """Build a :class:`DirChunk` from per-file sequences in any order (sorted here by name)."""
    n = len(names)
    order = sorted(range(n), key=names.__getitem__)
    names = [names[i] for i in order]
    idx = np.asarray(order, dtype=np.int64)
    encoded = [encode_name(x) for x in names]
    lens = np.fromiter(map(len, encoded), dtype=np.int64, count=n)
    hashes = np.fromiter(map(_xxh3, encoded), dtype=np.uint64, count=n)

    def arr(values, dtype):
        a = np.asarray(values, dtype=dtype).reshape(-1)
        return a[idx] if n else a[:0]

    return DirChunk(path, mode, uid, gid, mtime_ns, ctime_ns, b"".join(encoded), lens, hashes,
                    arr(sizes, np.int64), arr(mtimes_ns, np.int64), arr(modes, np.uint16), arr(uids, np.uint32),
                    arr(gids, np.uint32), sorted(subdirs), None if etags is None else arr(etags, np.uint64), size)


@dataclasses.dataclass
class ScanReport:
    """What a listing left out of the tree, by reason (counts), with the first few paths of each.

    Reasons: ``symlinks_outside`` (a symlink whose target lies outside the source tree, without
    ``--follow-symlinks``), ``symlinks_dangling`` (target missing or a symlink loop), ``loops`` (a
    directory that is its own ancestor, by device and inode), ``unreadable`` (a file or directory the
    daemon may not read or list), ``special`` (fifos, sockets, devices), ``conflicts`` (an object-store
    key that is also a prefix of other keys: the directory wins).
    """

    REASONS = ("symlinks_outside", "symlinks_dangling", "loops", "unreadable", "special", "conflicts")
    EXAMPLES = 5

    counts: Dict[str, int] = dataclasses.field(default_factory=dict)
    examples: Dict[str, List[str]] = dataclasses.field(default_factory=dict)

    def add(self, reason: str, path: str, n: int = 1) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + n
        ex = self.examples.setdefault(reason, [])
        if len(ex) < self.EXAMPLES:
            ex.append(path)

    def merge(self, other: "ScanReport") -> None:
        for reason, n in other.counts.items():
            for p in other.examples.get(reason, ())[:max(0, self.EXAMPLES - len(self.examples.get(reason, ())))]:
                self.add(reason, p, 0)
            self.counts[reason] = self.counts.get(reason, 0) + n

    def count(self, reason: str) -> int:
        return self.counts.get(reason, 0)

    def as_dict(self) -> Dict[str, int]:
        """Every reason with its count (0 included), for the stats JSON and Prometheus."""
        return {r: self.counts.get(r, 0) for r in self.REASONS}

    def log(self, logger, source: str) -> None:
        """One warning per reason that occurred, with its total and the first paths."""
        text = {"symlinks_outside": "symlinks pointing outside the source tree (use --follow-symlinks to "
                                    "serve them)",
                "symlinks_dangling": "dangling or looping symlinks",
                "loops": "directories that loop back to an ancestor (symlink or bind-mount loops)",
                "unreadable": "files or directories the daemon may not read",
                "special": "special files (fifos, sockets, devices)",
                "conflicts": "files that are also directory prefixes"}
        for reason in self.REASONS:
            n = self.counts.get(reason, 0)
            if n:
                logger.warning("%s: skipped %d %s, e.g. %s", source, n, text[reason],
                               ", ".join(repr(p) for p in self.examples.get(reason, ())))


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_US = dt.timedelta(microseconds=1)


def mtime_ns(info: Dict[str, Any]) -> int:
    """Integer nanoseconds since the epoch from an fsspec info dict or an S3 listing entry; 0 if absent.

    A timestamp (``LastModified``, ISO strings) is converted exactly, in integers (a float of seconds
    would round the sub-second part: ~240 ns steps at today's dates); a number is taken as seconds.
    """
    for key in ("LastModified", "mtime", "last_modified", "updated", "modified", "created"):
        value = info.get(key)
        if isinstance(value, str):
            try:
                value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
        if isinstance(value, dt.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=dt.timezone.utc)
            return ((value - _EPOCH) // _US) * 1000
        if isinstance(value, int) and not isinstance(value, bool):
            return value * 1_000_000_000
        if isinstance(value, float):
            return round(value * 1e9)
    return 0


class Backend(abc.ABC):
    """One source tree. ``url`` is what the user passed as SOURCE."""

    scheme: str = ""
    #: whether the listing's per-file tags (:attr:`DirChunk.etags`) name a version of the content (an
    #: object store's ETag) rather than the file's identity (a posix inode number, the same for every
    #: version): only a version goes into the shared tier's keys, which nodes with their own copies share
    etags_are_versions: bool = True
    #: whether the backend takes a ``deadline_s`` option (seconds) and then returns or raises within it
    #: on every read and stat by itself: the daemon passes ``--backend-timeout`` that way instead of
    #: handing each read to a deadline thread (:class:`~shadefs.backends.timeout.TimeoutBackend`)
    bounds_own_reads: bool = False

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

    def scan(self, follow_symlinks: bool = False) -> Tuple[Iterator[DirChunk], ScanReport]:
        """List the tree as directories (:class:`DirChunk`, any order, the root's path ``""``) and a
        :class:`ScanReport` of what was left out (filled while the iterator runs).

        The default builds chunks from :meth:`walk`; directories are inferred from file paths.
        ``follow_symlinks`` matters only to sources that have symlinks.

        Raises:
            FileNotFoundError: the root does not exist.
            BackendError: listing failed.
        """
        report = ScanReport()
        return chunks_from_entries(self.walk(), report), report

    def snapshot_key(self, follow_symlinks: bool) -> Optional[Dict[str, Any]]:
        """What a persisted namespace snapshot of this source must match to be reused (a JSON-able
        dict), or None when this backend cannot validate a snapshot cheaply (then every mount scans)."""
        return None

    def snapshot_changed(self, dir_paths: List[str], mtimes_ns: np.ndarray, ctimes_ns: np.ndarray,
                         watched: List[Tuple[str, int, int]]) -> Optional[str]:
        """Why a snapshot with these directories (mtime and ctime in ns each) is out of date, or None."""
        return "this backend does not validate snapshots"

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

    def stat(self, path: str) -> Tuple[int, int]:
        """Return (size in bytes, mtime in integer nanoseconds) of ``path`` now. Raises FileNotFoundError."""
        raise NotImplementedError

    def identify(self, path: str) -> Tuple[int, int, int]:
        """Return (size in bytes, mtime in ns, version tag) of ``path`` now, the tag as the listing
        puts it in :attr:`DirChunk.etags` (0 = none). One metadata request; the default is :meth:`stat`
        with no tag. Raises FileNotFoundError, BackendError."""
        size, mtime = self.stat(path)
        return size, mtime, 0

    def attach(self, namespace, follow_symlinks: bool = False) -> None:
        """Serve ``namespace``'s files: a backend that can check each opened file against its record
        (posix: inode, size, mtime) does so from now on. ``follow_symlinks``: the scan's setting."""

    def describe(self) -> str:
        """A one-line description for logs (never includes secrets)."""
        return self.url

    def close(self) -> None:
        """Release connections; the backend is not used afterwards."""


def chunks_from_entries(entries: Iterable[Entry], report: Optional[ScanReport] = None,
                        dirs: Iterable[str] = ()) -> Iterator[DirChunk]:
    """Group flat file entries (any order) into :class:`DirChunk` s: every directory that holds a file,
    every directory named in ``dirs`` (object-store directory markers, empty directories of a listing;
    read after ``entries`` is exhausted, so a generator may fill it while it yields), and each of their
    ancestors; a path that is both a file and a directory prefix (object stores allow ``a`` beside
    ``a/b``) keeps the directory and is recorded as a ``conflicts`` skip in ``report``.
    Files without permission bits are served 0444, directories 0555, owned by the daemon's user."""
    import os
    import posixpath

    uid, gid = os.getuid(), os.getgid()
    files: Dict[str, List[Entry]] = {}
    for e in entries:
        files.setdefault(posixpath.dirname(e.path), []).append(e)
    dirs = set(files) | {d.strip("/") for d in dirs}
    for d in list(dirs):
        while d:
            d = posixpath.dirname(d)
            if d in dirs:
                break
            dirs.add(d)
    dirs.add("")
    subdirs: Dict[str, List[str]] = {d: [] for d in dirs}
    for d in dirs:
        if d:
            subdirs[posixpath.dirname(d)].append(posixpath.basename(d))
    for d in sorted(dirs):
        kept = []
        for e in files.get(d, ()):
            if e.path in dirs:
                if report is not None:
                    report.add("conflicts", e.path)
                continue
            kept.append(e)
        yield make_chunk(d, [posixpath.basename(e.path) for e in kept], [e.size for e in kept],
                         [e.mtime_ns for e in kept], [0o444 if e.mode is None else e.mode for e in kept],
                         [uid if e.uid is None else e.uid for e in kept],
                         [gid if e.gid is None else e.gid for e in kept], subdirs[d], 0o555, uid, gid,
                         etags=[etag_hash(e.etag) for e in kept] if any(e.etag for e in kept) else None)


_REGISTRY: Dict[str, str] = {}
# backends by name (--backend NAME), whatever the URL's scheme
_NAMED: Dict[str, str] = {"posix": "shadefs.backends.posix:PosixBackend",
                          "fsspec": "shadefs.backends.fsspec:FsspecBackend",
                          "obstore": "shadefs.backends.obstore:ObstoreBackend"}
_HINTED: List[str] = []  # the fallback to fsspec was logged


def register(scheme: str, target: str) -> None:
    """Register ``"module:Class"`` for URLs of ``scheme`` (imported lazily on first use)."""
    _REGISTRY[scheme] = target


def backend_for(url: str, name: Optional[str] = None) -> Type[Backend]:
    """Return the backend class for ``url``: a plain path is ``posix``; ``s3://``, ``gs://``, ``az://``
    are ``obstore`` (``fsspec`` when obstore is not installed, with a one-time hint); any other
    ``scheme://`` is ``fsspec``. ``name`` (``"fsspec"``, ``"obstore"``, ``"posix"``; None or ``"auto"``:
    by scheme) picks the backend class explicitly (``--backend``).

    Raises:
        BackendError: the scheme or name is unknown, or its optional dependency is missing (with an
            install hint).
    """
    import importlib

    scheme = url.split("://", 1)[0] if "://" in url else "file"
    if name not in (None, "", "auto"):
        target = _NAMED.get(name)
        if target is None:
            raise BackendError(f"unknown backend {name!r}: choose auto, {', '.join(sorted(_NAMED))}")
    else:
        target = _REGISTRY.get(scheme, _REGISTRY.get("*"))
    if target is None:
        raise BackendError(f"no backend for {scheme}:// URLs")
    module, _, cls = target.partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as e:  # pragma: no cover - depends on what is installed
        if name in (None, "", "auto") and target == _NAMED["obstore"]:
            if not _HINTED:
                _HINTED.append(scheme)
                import logging
                logging.getLogger(__name__).warning(
                    "%s:// is read through fsspec: the native object-store client is not installed "
                    "(pip install obstore)", scheme)
            return backend_for(url, "fsspec")
        raise BackendError(f"{scheme}:// needs an optional dependency ({e.name}); "
                           f"install it with: pip install 'shadefs[s3]'") from e


def open_backend(url: str, backend: Optional[str] = None, **options) -> Backend:
    """Instantiate the backend for ``url`` (``backend``: a name as :func:`backend_for` takes) with
    backend-specific ``options``."""
    return backend_for(url, backend)(url, **options)


register("file", "shadefs.backends.posix:PosixBackend")
register("s3", "shadefs.backends.fsspec:FsspecBackend")
register("gs", "shadefs.backends.fsspec:FsspecBackend")
register("gcs", "shadefs.backends.fsspec:FsspecBackend")
register("http", "shadefs.backends.fsspec:FsspecBackend")
register("https", "shadefs.backends.fsspec:FsspecBackend")
register("memory", "shadefs.backends.fsspec:FsspecBackend")
register("*", "shadefs.backends.fsspec:FsspecBackend")  # any other fsspec protocol (abfs, hf, ...)
for _scheme in ("s3", "s3a", "gs", "gcs", "az", "azure"): register(_scheme, _NAMED["obstore"])  # noqa: E701
