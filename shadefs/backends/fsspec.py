"""The fsspec backend: a dataset in an object store or any other fsspec filesystem (s3://, gs://, http(s)://).

One listing builds the snapshot (S3: ``ListObjectsV2`` page by page, streamed, never one request per
key); each read is ONE whole-object GET whose length must equal the snapshot's size. Transient failures
(timeouts, resets, 5xx, throttling) are retried here, and only here, with bounded backoff (retry.py);
the inner layers' own retries (botocore, s3fs) are switched off so the bound is real. A missing object
is FileNotFoundError (ENOENT) and is never retried; everything else is BackendError (EIO). This module
never logs a credential: options named like key/secret/token/password are masked in ``options``,
``describe()`` and every message.
"""
from __future__ import annotations

import logging
import re
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, TypeVar

import fsspec
from fsspec.registry import known_implementations

from .base import (Backend, BackendError, DirChunk, Entry, NoSuchBucket, ScanReport, chunks_from_entries,
                   mtime_ns)
from .retry import RetryPolicy, redact

__all__ = ["FsspecBackend", "parse_options"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_SECRET_NAME = re.compile(r"key|secret|token|password|passwd|credential|signature",
                          re.IGNORECASE)
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+)([eE][+-]?\d+)?")
_S3 = ("s3", "s3a")
# Convenience spellings for s3fs, moved to where botocore wants them.
_S3_CLIENT_KWARGS = {"endpoint_url": "endpoint_url", "region": "region_name", "region_name": "region_name"}
_S3_CONFIG_KWARGS = ("connect_timeout", "read_timeout", "max_pool_connections")
S3FS_CONNECT_TIMEOUT_S, S3FS_READ_TIMEOUT_S = 5.0, 15.0  # s3fs's per-attempt defaults (S3FileSystem)
# Listing caches would keep a second copy of a million-key listing and serve stale stat(); off.
_NO_LISTINGS_CACHE = _S3 + ("gs", "gcs", "http", "https")


def _is_secret(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def _coerce(name: str, value: Any) -> Any:
    """Turn a command-line string into what fsspec implementations expect: bool, int, float or str.

    Only strings are converted, and never the value of a secret-looking option (an all-digit
    secret stays a string).
    """
    if not isinstance(value, str) or _is_secret(name):
        return value
    low = value.strip().lower()
    if low == "true":
        return True
    if low == "false":
        return False
    if _INT.fullmatch(value.strip()):
        return int(value)
    if _FLOAT.fullmatch(value.strip()):
        return float(value)
    return value


def parse_options(options: Dict[str, Any]) -> Dict[str, Any]:
    """Return fsspec storage options from ``--backend-opt KEY=VALUE`` pairs.

    Values are coerced (``"true"``/``"false"`` -> bool, digits -> int/float, see :func:`_coerce`);
    a dotted key nests: ``client_kwargs.region_name=eu-west-1`` -> ``{"client_kwargs":
    {"region_name": "eu-west-1"}}``. Values that are not strings (API callers) pass unchanged.

    Raises:
        BackendError: a dotted key collides with a plain one.
    """
    out: Dict[str, Any] = {}
    for key, value in options.items():
        parts = key.split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise BackendError(f"backend option {key!r} nests into {part!r}, which has a value")
        node[parts[-1]] = _coerce(parts[-1], value)
    return out


def _mask(options: Any, name: str = "") -> Any:
    """Return ``options`` with the values of secret-looking keys replaced by ``***``."""
    if isinstance(options, dict):
        return {k: _mask(v, k) for k, v in options.items()}
    return "***" if _is_secret(name) and options not in (None, "", False) else options


def _secret_values(options: Any, name: str = "") -> List[str]:
    if isinstance(options, dict):
        return [s for k, v in options.items() for s in _secret_values(v, k)]
    return [options] if _is_secret(name) and isinstance(options, str) else []




def _is_no_such_bucket(exc: Optional[BaseException]) -> bool:
    """True when ``exc`` or one of its causes is S3's NoSuchBucket (s3fs raises it as FileNotFoundError)."""
    while exc is not None:
        if type(exc).__name__ == "NoSuchBucket" or "NoSuchBucket" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _is_invalid_range(exc: BaseException) -> bool:
    """True when ``exc`` says a range starts at or past the end of the object (HTTP 416)."""
    while exc is not None:
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            error = response.get("Error", {})
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if error.get("Code") in ("InvalidRange", "416") or status == 416:
                return True
        if getattr(exc, "status", None) == 416:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _missing_dependency(protocol: str, exc: ImportError) -> BackendError:
    """The one-line install hint for a protocol whose implementation package is missing.

    fsspec raises a plain ImportError("Please install gcsfs ...") without ``name``, so the package is
    taken from fsspec's registry of known implementations.
    """
    known = known_implementations.get(protocol, {})
    package = exc.name or known.get("class", "").split(".", 1)[0] or "unknown"
    install = "'shadefs[s3]'" if package == "s3fs" else package
    return BackendError(f"{protocol}:// needs an optional dependency ({package}); "
                        f"install it with: pip install {install}")


class FsspecBackend(Backend):
    """Objects below ``url`` in an fsspec filesystem: ``s3://bucket/prefix``, ``gs://bucket/prefix``,
    ``https://host/dir/`` (where the server lists directories), ``memory://root`` (tests).

    Options (strings from ``--backend-opt KEY=VALUE`` are coerced, see :func:`parse_options`):
        retries (int): retries of a transiently failed request (default 5; 0 = no retries).
        retry_base_s (float): first backoff in seconds (default 0.1); doubles per retry.
        retry_max_s (float): cap on one backoff in seconds (default 5).
        retry_seed (int): seeds the backoff jitter (default: random).
        timeout_s (float, s3): caps the default ``connect_timeout`` (5 s) and ``read_timeout`` (15 s) of
            one attempt (the daemon passes ``--backend-timeout``); other protocols are bounded only by
            the daemon's per-read deadline (:mod:`shadefs.backends.timeout`).
        endpoint_url (str, s3): an S3-compatible endpoint (MinIO, Ceph, moto); goes into
            ``client_kwargs``. ``region`` likewise; ``connect_timeout``, ``read_timeout`` (seconds)
            and ``max_pool_connections`` go into botocore's ``config_kwargs``.
        pool_connections (int, s3): ``max_pool_connections`` unless that is given (the daemon passes the
            prefetch concurrency plus its read concurrency, so a stalled GET never holds the last
            connection another file's GET needs); ignored by other protocols.
        anything else: passed to the fsspec implementation (s3fs: ``anon``, ``key``, ``secret``,
            ``token``, ``requester_pays``, ``client_kwargs.*``, ``config_kwargs.*``, ...).

    Credentials come the implementation's usual way (s3fs: environment, ``~/.aws``, instance role)
    unless given as options.

    Raises (constructor):
        BackendError: unknown protocol, missing optional package (with an install hint), or an
            option the implementation rejects.
    """

    scheme = "fsspec"

    def __init__(self, url: str, retries: Any = 5, retry_base_s: Any = 0.1, retry_max_s: Any = 5.0,
                 retry_seed: Any = None, timeout_s: Any = None, pool_connections: Any = None, **options: Any):
        storage_options = parse_options(options)
        self._secrets = _secret_values(storage_options)
        super().__init__(url, **_mask(storage_options))
        try:
            self.retry = RetryPolicy(int(retries), float(retry_base_s), float(retry_max_s),
                                     None if retry_seed in (None, "") else int(retry_seed))
        except ValueError as e:
            raise BackendError(f"bad retry option: {e}") from e
        if "::" in url:
            raise BackendError("chained fsspec URLs (a::b) are not supported; shadefs caches itself")
        self.protocol = url.split("://", 1)[0] if "://" in url else "file"
        try:
            cls = fsspec.get_filesystem_class(self.protocol)
        except ImportError as e:
            raise _missing_dependency(self.protocol, e) from e
        except ValueError as e:
            raise BackendError(f"no backend for {self.protocol}:// URLs (fsspec: {e})") from e
        self._is_s3 = self.protocol in _S3
        try:
            self.timeout_s = None if timeout_s in (None, "") else float(timeout_s)
        except ValueError as e:
            raise BackendError(f"bad timeout_s option: {e}") from e
        if self._is_s3:
            self._s3_defaults(storage_options, self.timeout_s)
            if pool_connections not in (None, ""):  # botocore's pool (default 10): a stalled GET holds one
                try:
                    pool = int(pool_connections)
                except ValueError as e:
                    raise BackendError(f"bad pool_connections option: {e}") from e
                storage_options["config_kwargs"].setdefault("max_pool_connections", pool)
        if self.protocol in _NO_LISTINGS_CACHE:
            storage_options.setdefault("use_listings_cache", False)
        kwargs = dict(cls._get_kwargs_from_urls(url))
        kwargs.update(storage_options)
        try:
            # A fresh instance: the daemon forks before it opens the backend, and a cached instance
            # would carry a client (and event loop) from before the fork.
            self.fs = cls(skip_instance_cache=True, **kwargs)
        except ImportError as e:
            raise _missing_dependency(self.protocol, e) from e
        except (TypeError, ValueError, KeyError) as e:
            raise BackendError(redact(f"{self.protocol}:// rejected the backend options: {e}",
                                      self._secrets)) from e
        if self._is_s3:
            self.fs.retries = 1  # s3fs's own retry loop: off, the policy above is the only one
        self.root = cls._strip_protocol(url).rstrip("/")
        self._prefix = self.root + "/"
        self._closed = False

    @staticmethod
    def _s3_defaults(opts: Dict[str, Any], timeout_s: Optional[float] = None) -> None:
        """Move s3 convenience options into place and set shadefs's defaults (in place).

        ``timeout_s`` (``--backend-timeout``) caps botocore's ``connect_timeout`` and ``read_timeout`` per
        attempt (s3fs's defaults, 5 s and 15 s, when the timeout is longer) unless those are given, so a
        stalled attempt fails and is retried within the deadline; the whole read, retries included, is
        bounded by :class:`shadefs.backends.timeout.TimeoutBackend` (6 attempts x 15 s + backoff was the
        ~94 s a stalled GET took before)."""
        client = opts.setdefault("client_kwargs", {})
        for name, target in _S3_CLIENT_KWARGS.items():
            if name in opts:
                client[target] = opts.pop(name)
        config = opts.setdefault("config_kwargs", {})
        for name in _S3_CONFIG_KWARGS:
            if name in opts:
                config[name] = opts.pop(name)
        if timeout_s is not None and timeout_s > 0:
            config.setdefault("connect_timeout", min(S3FS_CONNECT_TIMEOUT_S, timeout_s))
            config.setdefault("read_timeout", min(S3FS_READ_TIMEOUT_S, timeout_s))
        # One retry policy, ours: botocore's retries would multiply with it (6 x 5 attempts).
        config.setdefault("retries", {"total_max_attempts": 1})
        # One GET per read: with max_concurrency > 1, s3fs sends a HEAD first and splits big objects.
        opts.setdefault("max_concurrency", 1)

    # --- helpers -------------------------------------------------------------------------------

    def _call(self, fn: Callable[[], T], what: str) -> T:
        if self._closed:
            raise BackendError(f"{what}: the backend is closed")
        return self.retry.call(fn, what, secrets=self._secrets)

    def _full(self, path: str) -> str:
        return self._prefix + path

    def _endpoint(self) -> Optional[str]:
        client = self.options.get("client_kwargs") or {}
        return client.get("endpoint_url") or self.options.get("endpoint_url")

    def describe(self) -> str:
        """``scheme://bucket/prefix`` plus the endpoint when one is set; never a credential."""
        text = f"{self.protocol}://{self.root}" if "://" not in self.root else self.root
        endpoint = self._endpoint()
        if endpoint:
            text += f" (endpoint {endpoint})"
        return redact(text, self._secrets)

    # --- listing -------------------------------------------------------------------------------

    def walk(self) -> Iterator[Entry]:
        """Yield every object below the root as an Entry (path relative to the root).

        Keys ending in ``/`` (directory markers) are not files and are not yielded (:meth:`scan` keeps
        the directories they name); keys that are not a valid relative path (empty, ``.`` or ``..``
        components) are skipped, counted and logged once.

        Raises:
            FileNotFoundError: the bucket does not exist, or nothing exists below the prefix.
            BackendError: a listing request failed (after retries).
        """
        return self._listing([])

    def scan(self, follow_symlinks: bool = False) -> Tuple[Iterator[DirChunk], ScanReport]:
        """The tree as directories: every directory that holds a file, and every directory an object
        store only *marks* (a 0-byte key ending in ``/``, e.g. the console's "Create folder", or a prefix
        holding nothing but such a marker) or that a listing shows empty (``memory://``), so an
        ImageFolder over the mount has the classes of the source, an empty class included.

        Raises: as :meth:`walk` (while the iterator runs).
        """
        report = ScanReport()
        dirs: List[str] = []
        return chunks_from_entries(self._listing(dirs), report, dirs), report

    def _listing(self, dirs: List[str]) -> Iterator[Entry]:
        # the files below the root; the directories named by markers are appended to ``dirs``
        skipped: List[str] = []
        if self._is_s3:
            entries = self._walk_s3(skipped, dirs)
        else:
            entries = self._walk_find(skipped, dirs)
        yield from entries
        if skipped:
            log.warning("%s: skipped %d object(s) whose key is not a file path, e.g. %r",
                        self.describe(), len(skipped), skipped[0])

    def _entry(self, rel: str, size: Any, mtime_ns: int, skipped: List[str], dirs: List[str],
               etag: Optional[str] = None) -> Optional[Entry]:
        if not rel:
            return None  # the root's own marker (a key equal to the prefix plus "/")
        if rel.endswith("/"):
            if size or not self._valid(rel[:-1]):
                skipped.append(rel)  # a "directory" with content, or no POSIX path: not representable
            else:
                dirs.append(rel[:-1])  # a directory marker: the directory exists, maybe empty
            return None
        if not self._valid(rel):
            skipped.append(rel)
            return None
        return Entry(rel, int(size), mtime_ns, etag=etag if isinstance(etag, str) else None)

    @staticmethod
    def _valid(rel: str) -> bool:
        return not any(p in ("", ".", "..") for p in rel.split("/")) and "\x00" not in rel

    def _walk_s3(self, skipped: List[str], dirs: List[str]) -> Iterator[Entry]:
        bucket, key, _ = self.fs.split_path(self.root)
        prefix = key + "/" if key else ""
        request: Dict[str, Any] = dict(Bucket=bucket, Prefix=prefix, **self.fs.req_kw)
        keys = 0
        page_no = 0
        while True:
            page_no += 1
            try:
                page = self._call(lambda: self.fs.call_s3("list_objects_v2", **request),
                                  f"list {self.describe()} (page {page_no})")
            except FileNotFoundError as e:
                if _is_no_such_bucket(e):
                    raise NoSuchBucket(bucket, self._endpoint()) from None
                raise
            for obj in page.get("Contents", ()):
                keys += 1
                entry = self._entry(obj["Key"][len(prefix):], obj["Size"], mtime_ns(obj), skipped, dirs,
                                    obj.get("ETag"))
                if entry is not None:
                    yield entry
            if not page.get("IsTruncated"):
                break
            request["ContinuationToken"] = page["NextContinuationToken"]
        if keys == 0 and prefix:
            raise FileNotFoundError(f"no objects below {self.describe()}")

    def _walk_find(self, skipped: List[str], dirs: List[str]) -> Iterator[Entry]:
        found = self._call(lambda: self.fs.find(self.root, detail=True, withdirs=True),
                           f"list {self.describe()}")
        below = 0
        for name, info in found.items():
            kind = info.get("type", "file")
            name = self.fs._strip_protocol(name)
            if not name.startswith(self._prefix):
                continue  # the root itself (a file or the directory), or an http link to another site
            if kind == "directory":
                self._entry(name[len(self._prefix):].rstrip("/") + "/", 0, 0, skipped, dirs)
                continue
            if kind != "file":
                continue
            below += 1
            size = info.get("size")
            if size is None:  # http servers may not say in a listing: one HEAD for this file
                size = self._call(lambda: self.fs.info(name)["size"], f"stat {name!r}")
            entry = self._entry(name[len(self._prefix):], size, mtime_ns(info), skipped, dirs,
                                info.get("ETag") or info.get("etag"))
            if entry is not None:
                yield entry
        if not below and not self._call(lambda: self.fs.isdir(self.root), f"list {self.describe()}"):
            raise FileNotFoundError(f"no files below {self.describe()}")

    # --- reads ---------------------------------------------------------------------------------

    def read(self, path: str, size: int) -> bytes:
        """Return the whole object ``path`` with ONE GET; its length must be ``size``.

        Raises:
            FileNotFoundError: the object is gone (not retried).
            BackendError: the object changed size, access was refused, or a transient failure
                outlived the retries (cause chained).
        """
        full = self._full(path)
        data = self._call(lambda: self.fs.cat_file(full), f"read {path!r}")
        if len(data) != size:
            raise BackendError(f"read {path!r}: object changed: {len(data)} bytes, "
                               f"snapshot says {size}")
        return bytes(data)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """Return up to ``length`` bytes of ``path`` from ``offset`` (b"" at or past the end)."""
        if length <= 0:
            return b""
        full = self._full(path)

        def fetch() -> bytes:
            try:
                return self.fs.cat_file(full, start=offset, end=offset + length)
            except OSError as e:
                if _is_invalid_range(e):
                    return b""
                raise

        return bytes(self._call(fetch, f"read {path!r} at {offset}"))

    def stat(self, path: str) -> Tuple[int, int]:
        """Return (size in bytes, mtime in integer nanoseconds) of ``path`` now (one HEAD for S3)."""
        info = self._call(lambda: self.fs.info(self._full(path)), f"stat {path!r}")
        if info.get("type", "file") != "file":
            raise FileNotFoundError(path)
        return int(info["size"]), mtime_ns(info)

    def close(self) -> None:
        """Close the implementation's HTTP session (s3fs, gcsfs, http); idempotent."""
        if self._closed:
            return
        self._closed = True
        closer = getattr(type(self.fs), "close_session", None)
        for attr in ("_s3", "_session"):
            session = getattr(self.fs, attr, None)
            if closer is None or session is None:
                continue
            try:
                closer(self.fs.loop, session)
            except Exception as e:  # noqa: BLE001 - closing is best effort
                log.debug("%s: closing the session failed: %s", self.describe(), e)
