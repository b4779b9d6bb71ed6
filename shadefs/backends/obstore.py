"""The object-store backend: s3://, gs:// and az:// read through obstore (Rust ``object_store``).

Reads are where a miss spends its CPU: one GET through obstore costs ~0.3-0.4 ms of whole-process CPU
against s3fs's ~2.8 ms (docs/performance.md, "S3 client CPU per GET"), releases the GIL while the
request is in flight, and runs on a connection pool with no cap on connections in flight, so a
stalled GET holds one connection and never queues another file's GET behind it.

- ``read(path, size)``: ONE whole-object GET whose length must equal ``size``.
- ``read_range(path, offset, length)``: one ranged GET pinned to the object's version with
  ``If-Match``: the ETag the listing gave for files above :data:`PIN_MIN_BYTES` (the files read by
  ranges), else the ETag of the path's first ranged GET. A changed object fails with
  :class:`BackendError` (HTTP 412), so ranges of two versions are never stitched into one file.
- the listing: through the fsspec implementation when it is installed (s3fs, gcsfs, adlfs: same
  directory markers, skipped keys and ETags as the fsspec backend), else through obstore (a
  directory marker is then indistinguishable from an empty file of the same name, and a key that
  is not a file path fails the listing).

Transient failures (timeouts, connection errors, 5xx, throttling) are retried here with the bounded
backoff of :mod:`shadefs.backends.retry` (obstore's own retries are off, so the bound is real); a
missing object is FileNotFoundError (ENOENT), never retried; everything else is BackendError (EIO)
with the cause logged. No credential is ever logged.
"""
from __future__ import annotations

import collections
import errno
import datetime as dt
import logging
import re
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, TypeVar

from .base import (Backend, BackendError, DirChunk, Entry, NoSuchBucket, ScanReport, chunks_from_entries,
                   mtime_ns)
from .retry import TRANSIENT_CODES, RetryPolicy, is_transient, redact

try:
    import obstore as _obs
    import obstore.exceptions as _obx
except ImportError as e:  # pragma: no cover - depends on what is installed
    raise ImportError("the obstore backend needs the obstore package: pip install obstore "
                      "(or mount with --backend fsspec)", name="obstore") from e

__all__ = ["ObstoreBackend", "PROTOCOLS", "PIN_MIN_BYTES"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# URL scheme -> the obstore store that serves it
PROTOCOLS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure",
             "abfss": "azure", "azure": "azure"}
# files above this many bytes are read by ranges (the cache's FILL_CHUNK): their listing ETag is kept
# to pin every range to the version the snapshot saw
PIN_MIN_BYTES = 8 << 20
# ETags learned from a path's first ranged GET (files the listing gave none for), kept at most
LEARNED_ETAGS = 4096
CONNECT_TIMEOUT_S, READ_TIMEOUT_S = 5.0, 15.0  # per attempt, as the fsspec backend's S3 defaults
# idle connections kept per host when the daemon does not size the pool
DEFAULT_POOL = 64

# fsspec / s3fs spellings of the S3 options, mapped to obstore's S3 config keys
_S3_KEYS = {"endpoint_url": "endpoint", "endpoint": "endpoint", "region": "region", "region_name": "region",
            "key": "access_key_id", "access_key_id": "access_key_id", "aws_access_key_id": "access_key_id",
            "secret": "secret_access_key", "secret_access_key": "secret_access_key",
            "aws_secret_access_key": "secret_access_key", "token": "session_token",
            "session_token": "session_token", "aws_session_token": "session_token",
            "requester_pays": "request_payer", "virtual_hosted_style_request": "virtual_hosted_style_request"}
# The options the fsspec lister of each store kind takes (s3fs, gcsfs, adlfs spellings); obstore's own
# spellings of the same settings are translated to them, and everything else (``allow_http``, obstore's
# other store config keys) goes to obstore alone: s3fs fails its first request on a keyword it does not know.
_LISTER_KEYS = {
    "s3": {"endpoint_url", "region", "connect_timeout", "read_timeout", "max_pool_connections", "anon",
           "key", "secret", "token", "requester_pays"},
    "gcs": {"token", "project", "endpoint_url", "requester_pays"},
    "azure": {"account_name", "account_key", "sas_token", "connection_string", "tenant_id", "client_id",
              "client_secret", "anon"},
}
_LISTER_NAMES = {
    "s3": {"endpoint": "endpoint_url", "region_name": "region", "access_key_id": "key",
           "aws_access_key_id": "key", "secret_access_key": "secret", "aws_secret_access_key": "secret",
           "session_token": "token", "aws_session_token": "token"},
    "gcs": {"service_account_path": "token"},
    "azure": {},
}
_LISTER_NESTS = {"s3": ("client_kwargs.", "config_kwargs.", "s3_additional_kwargs."), "gcs": (), "azure": ()}
_SECRET_NAME = re.compile(r"key|secret|token|password|passwd|credential|signature|sas", re.IGNORECASE)
_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>")
# object_store's answer to a range past the end where the store itself does not answer HTTP 416 (Azure
# Blob Storage serves such a range as the whole object; object_store then checks it against the length)
_PAST_END = re.compile(r"Wanted range starting at \d+, but object was only \d+ bytes long")


def _seconds(value: Any, name: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError) as e:
        raise BackendError(f"backend option {name}={value!r}: expected seconds") from e
    if not out > 0:
        raise BackendError(f"backend option {name}={value!r}: expected seconds > 0")
    return out


def lister_options(kind: str, options: Dict[str, Any]) -> Dict[str, Any]:
    """The subset of ``--backend-opt`` pairs that the fsspec lister of a ``kind`` store (``s3``, ``gcs``,
    ``azure``) takes, in its spelling: ``service_account_path`` becomes gcsfs's ``token``, obstore's
    ``access_key_id`` s3fs's ``key``, and so on. Options only obstore takes (``allow_http``, the store
    config keys s3fs does not know) are left out; ``pool_connections`` is kept (the fsspec backend's own
    parameter), the retry options travel separately. Returns a new dict; raises nothing."""
    keys, names, nests = _LISTER_KEYS[kind], _LISTER_NAMES[kind], _LISTER_NESTS[kind]
    out: Dict[str, Any] = {}
    for key, value in options.items():
        key = names.get(key, key)
        if key in keys or key == "pool_connections" or (nests and key.startswith(nests)):
            out[key] = value
    return out


def _bool(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")


class ObjectStoreError(OSError):
    """An obstore failure, its message cut to the first line, its retry verdict taken before."""

    def __init__(self, message: str, transient: bool):
        super().__init__(message)
        self.transient = transient


def _short(exc: BaseException, limit: int = 300) -> str:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text if len(text) <= limit else text[:limit] + "..."


def obstore_transient(exc: BaseException) -> bool:
    """True when retrying the obstore call that raised ``exc`` may succeed: a timeout, a connection
    error, an HTTP 5xx/408/429 or an S3 throttling code; False for a missing object, a refused
    permission, a failed precondition (the object changed), a bad configuration or any other 4xx."""
    if isinstance(exc, ObjectStoreError):
        return exc.transient
    if isinstance(exc, (FileNotFoundError, _obx.PermissionDeniedError, _obx.UnauthenticatedError,
                        _obx.PreconditionError, _obx.NotModifiedError, _obx.InvalidPathError,
                        _obx.NotSupportedError, _obx.UnknownConfigurationKeyError, BackendError)):
        return False
    if isinstance(exc, _obx.GenericError):
        text = str(exc)
        if _PAST_END.search(text):
            return False
        code = _CODE.search(text)
        if code and code.group(1) in TRANSIENT_CODES:
            return True
        status = _STATUS.search(text)
        if status:
            s = int(status.group(1))
            return s >= 500 or s in (408, 429)
        return True  # no HTTP status: the request never got an answer (timeout, reset, refused, cut body)
    return is_transient(exc)


class ObstoreBackend(Backend):
    """Objects below ``url`` in S3 (``s3://bucket/prefix``), GCS (``gs://``) or Azure (``az://container/
    prefix``), read through obstore.

    Options (strings from ``--backend-opt KEY=VALUE``):
        retries, retry_base_s, retry_max_s, retry_seed: the retry policy, as the fsspec backend's.
        timeout_s (float): caps the connect timeout (5 s) and the read timeout (15 s without a byte)
            of one attempt.
        deadline_s (float): every read and stat returns or raises within this many seconds, retries
            included (the daemon passes ``--backend-timeout``; :attr:`bounds_own_reads`): one attempt
            lasts at most half of it (obstore's request timeout) and a retry starts only if it can end
            in time, so a stalled GET is EIO after half the deadline. The request is bounded inside
            obstore (Rust, the GIL released), so no deadline thread is needed per read.
        connect_timeout, read_timeout (float seconds): set those per-attempt timeouts explicitly.
        listing (str): ``auto`` (through the fsspec implementation when installed, else obstore),
            ``fsspec`` or ``obstore``.
        allow_http (bool): allow a plain ``http://`` store URL (an emulator on loopback: a GCS
            service-account file whose ``gcs_base_url`` is ``http://...``, Azurite); an S3
            ``endpoint_url`` starting with ``http://`` allows it by itself.
        pool_connections (int): idle connections kept per host (the daemon passes the prefetch
            concurrency plus its read concurrency); connections in flight are never capped, so a
            stalled request never makes another wait. ``max_pool_connections`` is read as the same.
        s3: ``endpoint_url`` (an S3-compatible endpoint; ``http://`` allowed), ``region``, ``anon``
            (unsigned requests), ``key``/``secret``/``token``, ``requester_pays``; the ``client_kwargs.``
            and ``config_kwargs.`` spellings of s3fs are accepted for these.
        anything else: passed to obstore's store config (``S3Config``, ``GCSConfig``, ``AzureConfig``
            keys, e.g. ``service_account_path`` for gs://, ``account_name`` for az://); an unknown key
            is a BackendError.

    Credentials come obstore's way from the environment (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``, instance
    metadata), from the options, or for S3 without either from boto3's chain (``~/.aws`` profiles,
    SSO) when boto3 is installed.

    Raises (constructor):
        BackendError: an unsupported URL scheme, or an option obstore rejects.
    """

    scheme = "obstore"
    bounds_own_reads = True

    def __init__(self, url: str, retries: Any = 5, retry_base_s: Any = 0.1, retry_max_s: Any = 5.0,
                 retry_seed: Any = None, timeout_s: Any = None, listing: Any = "auto",
                 deadline_s: Any = None, **options: Any):
        if listing not in ("auto", "fsspec", "obstore"):
            raise BackendError(f"backend option listing={listing!r}: choose auto, fsspec or obstore")
        self.listing = listing
        self._options = dict(options)  # as given, for the fsspec lister (lister_options picks its part)
        self._fsspec_retry = dict(retries=retries, retry_base_s=retry_base_s, retry_max_s=retry_max_s,
                                  retry_seed=retry_seed, timeout_s=timeout_s)
        options = self._flatten(options)
        self._secrets = [str(v) for k, v in options.items() if _SECRET_NAME.search(k) and v]
        super().__init__(url, **{k: ("***" if _SECRET_NAME.search(k) else v) for k, v in options.items()})
        try:
            self.retry = RetryPolicy(int(retries), float(retry_base_s), float(retry_max_s),
                                     None if retry_seed in (None, "") else int(retry_seed),
                                     classify=obstore_transient)
        except ValueError as e:
            raise BackendError(f"bad retry option: {e}") from e
        self.protocol = url.split("://", 1)[0] if "://" in url else ""
        kind = PROTOCOLS.get(self.protocol)
        if kind is None:
            raise BackendError(f"the obstore backend serves {', '.join(sorted(PROTOCOLS))}:// URLs, not "
                               f"{url!r} (use --backend fsspec)")
        self.kind = kind
        rest = url.split("://", 1)[1]
        self.bucket, _, prefix = rest.partition("/")
        self.prefix = prefix.strip("/")
        if not self.bucket:
            raise BackendError(f"{url!r}: no bucket")
        self._key_prefix = self.prefix + "/" if self.prefix else ""
        client = {"connect_timeout": f"{CONNECT_TIMEOUT_S}s", "read_timeout": f"{READ_TIMEOUT_S}s",
                  "pool_max_idle_per_host": str(DEFAULT_POOL)}
        t = None if timeout_s in (None, "") else _seconds(timeout_s, "timeout_s")
        self.timeout_s = t
        if t is not None:
            client["connect_timeout"] = f"{min(CONNECT_TIMEOUT_S, t)}s"
            client["read_timeout"] = f"{min(READ_TIMEOUT_S, t)}s"
        for name in ("connect_timeout", "read_timeout"):
            if name in options:
                client[name] = f"{_seconds(options.pop(name), name)}s"
        self.deadline_s = None if deadline_s in (None, "") else _seconds(deadline_s, "deadline_s")
        if self.deadline_s is not None:  # one attempt at most half the deadline: a retry can follow
            half = self.deadline_s / 2
            client["timeout"] = f"{half}s"
            for name in ("connect_timeout", "read_timeout"):
                client[name] = f"{min(float(client[name][:-1]), half)}s"
        if "allow_http" in options:
            client["allow_http"] = _bool(options.pop("allow_http"))
        for name in ("pool_connections", "max_pool_connections"):
            if name in options:
                value = options.pop(name)
                try:
                    client["pool_max_idle_per_host"] = str(max(1, int(value)))
                except ValueError as e:
                    raise BackendError(f"backend option {name}={value!r}: expected an integer") from e
        self._store = self._make_store(kind, options, client)
        self._lock = threading.Lock()
        self._etags: Dict[str, str] = {}  # listing ETags of the files read by ranges
        self._learned: "collections.OrderedDict[str, str]" = collections.OrderedDict()
        self._lister = None
        self._closed = False

    # --- construction ------------------------------------------------------------------------------

    @staticmethod
    def _flatten(options: Dict[str, Any]) -> Dict[str, Any]:
        out = {}
        for key, value in options.items():
            for nest in ("client_kwargs.", "config_kwargs."):
                if key.startswith(nest):
                    key = key[len(nest):]
            out[key] = value
        return out

    def _make_store(self, kind: str, options: Dict[str, Any], client: Dict[str, str]):
        from obstore.store import AzureStore, GCSStore, S3Store

        retry = {"max_retries": 0, "retry_timeout": dt.timedelta(seconds=1)}  # ours is the only policy
        config: Dict[str, Any] = {}
        provider = None
        try:
            if kind == "s3":
                anon = _bool(options.pop("anon", False))
                for key, value in options.items():
                    config[_S3_KEYS.get(key, key)] = value
                if "request_payer" in config:
                    config["request_payer"] = _bool(config["request_payer"])
                if anon:
                    config["skip_signature"] = True
                endpoint = config.get("endpoint")
                if isinstance(endpoint, str) and endpoint.startswith("http://"):
                    client["allow_http"] = True
                if not anon and "access_key_id" not in config:
                    provider = _boto3_provider()
                return S3Store(self.bucket, config=config or None, client_options=client, retry_config=retry,
                               credential_provider=provider)
            if kind == "gcs":
                if "token" in options:  # gcsfs's spelling of a service-account file
                    options["service_account_path"] = options.pop("token")
                options.pop("project", None)
                return GCSStore(self.bucket, config=options or None, client_options=client, retry_config=retry)
            return AzureStore(self.bucket, config=options or None, client_options=client, retry_config=retry)
        except (_obx.BaseError, TypeError, ValueError) as e:
            raise BackendError(redact(f"{self.protocol}:// rejected the backend options: {_short(e)}",
                                      self._secrets)) from e

    # --- helpers ----------------------------------------------------------------------------------

    def _call(self, fn: Callable[[], T], what: str) -> T:
        if self._closed:
            raise BackendError(f"{what}: the backend is closed")

        def run() -> T:
            try:
                return fn()
            except FileNotFoundError as e:
                raise FileNotFoundError(errno.ENOENT, f"{what}: not found ({_short(e)})") from None
            except _obx.BaseError as e:  # obstore's text ends in pages of debug output: the first line
                raise ObjectStoreError(_short(e), obstore_transient(e)) from e

        if self.deadline_s is None:
            return self.retry.call(run, what, secrets=self._secrets)
        return self.retry.call(run, what, secrets=self._secrets, deadline=time.monotonic() + self.deadline_s,
                               attempt_s=self.deadline_s / 2)

    def _key(self, path: str) -> str:
        return self._key_prefix + path

    def describe(self) -> str:
        """``scheme://bucket/prefix`` plus the endpoint when one is set; never a credential."""
        text = f"{self.protocol}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        endpoint = self.options.get("endpoint_url") or self.options.get("endpoint")
        if endpoint:
            text += f" (endpoint {endpoint})"
        return redact(text, self._secrets) + " via obstore"

    # --- listing ----------------------------------------------------------------------------------

    def _fsspec_lister(self):
        """The fsspec backend over the same URL and options, for listings; None when its
        implementation (s3fs, gcsfs, adlfs) is not installed."""
        if self._lister is None and self.listing == "obstore":
            self._lister = False
        if self._lister is None:
            url = self.url if self.kind != "azure" else "abfs://" + self.url.split("://", 1)[1]
            try:
                from .fsspec import FsspecBackend

                self._lister = FsspecBackend(url, **self._fsspec_retry,
                                             **lister_options(self.kind, self._options))
            except (ImportError, BackendError) as e:
                if self.listing == "fsspec":
                    raise BackendError(f"listing={self.listing}: {e}") from e
                log.debug("%s: listing through obstore (%s)", self.describe(), e)
                self._lister = False
        return self._lister or None

    def walk(self) -> Iterator[Entry]:
        """Yield every object below the root as an Entry (path relative to the root, ETag kept).

        Raises:
            FileNotFoundError: nothing exists below the prefix.
            NoSuchBucket: the bucket does not exist at the endpoint.
            BackendError: a listing request failed (after retries).
        """
        lister = self._fsspec_lister()
        return self._keep_etags(lister.walk() if lister is not None else self._walk_obstore())

    def scan(self, follow_symlinks: bool = False) -> Tuple[Iterator[DirChunk], ScanReport]:
        """The tree as directories, directory markers included (through the fsspec implementation when
        installed; see the module docstring). Raises: as :meth:`walk` (while the iterator runs)."""
        lister = self._fsspec_lister()
        if lister is None:
            report = ScanReport()
            return chunks_from_entries(self._keep_etags(self._walk_obstore()), report), report
        report = ScanReport()
        dirs: List[str] = []  # the directories markers name, filled while the listing runs
        return chunks_from_entries(self._keep_etags(lister._listing(dirs)), report, dirs), report

    def _keep_etags(self, entries: Iterator[Entry]) -> Iterator[Entry]:
        for e in entries:
            if e.etag and e.size > PIN_MIN_BYTES:
                self._etags[e.path] = e.etag
            yield e

    def _walk_obstore(self) -> Iterator[Entry]:
        prefix = self._key_prefix
        stream = self._call(lambda: _obs.list(self._store, prefix=prefix or None, chunk_size=1000),
                            f"list {self.describe()}")
        n = 0
        while True:
            try:
                page = self._call(lambda: next(stream, None), f"list {self.describe()} (page)")
            except BackendError as e:
                cause = e.__cause__.__cause__ if isinstance(e.__cause__, ObjectStoreError) else e.__cause__
                if isinstance(cause, _obx.InvalidPathError):
                    raise BackendError(f"{e} (install the fsspec implementation, e.g. s3fs, to list keys "
                                       f"that are not file paths)") from cause
                if "status code: 404" in str(cause or ""):  # a listing of an existing bucket never is
                    raise NoSuchBucket(self.bucket, self.options.get("endpoint_url")
                                       or self.options.get("endpoint")) from None
                raise
            if page is None:
                break
            for meta in page:
                rel = meta["path"][len(prefix):] if meta["path"].startswith(prefix) else None
                if not rel:
                    continue
                n += 1
                yield Entry(rel, int(meta["size"]), mtime_ns(meta), etag=meta.get("e_tag"))
        if n == 0:
            raise FileNotFoundError(f"no objects below {self.describe()}")

    # --- reads ------------------------------------------------------------------------------------

    def read(self, path: str, size: int) -> bytes:
        """Return the whole object ``path`` with ONE GET (pinned to the listing's ETag where kept);
        its length must be ``size``.

        Raises:
            FileNotFoundError: the object is gone (not retried).
            BackendError: the object changed (size or ETag), access was refused, or a transient
                failure outlived the retries (cause chained).
        """
        key = self._key(path)
        etag = self._etags.get(path)
        opts = {"if_match": etag} if etag else None

        def fetch() -> bytes:
            return bytes(_obs.get(self._store, key, options=opts).bytes())

        data = self._call(self._changed(fetch, path), f"read {path!r}")
        if len(data) != size:
            raise BackendError(f"read {path!r}: object changed: {len(data)} bytes, snapshot says {size}")
        return data

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """Return up to ``length`` bytes of ``path`` from ``offset`` (b"" at or past the end) with one
        ranged GET pinned to the object's version (If-Match).

        Raises:
            FileNotFoundError: the object is gone.
            BackendError: the object changed since the listing (or since this path's first range), or
                a failure as in :meth:`read`.
        """
        if length <= 0:
            return b""
        key = self._key(path)
        etag = self._etags.get(path)
        if etag is None:
            with self._lock:
                etag = self._learned.get(path)

        def fetch() -> bytes:
            opts: Dict[str, Any] = {"range": (offset, offset + length)}
            if etag:
                opts["if_match"] = etag
            try:
                result = _obs.get(self._store, key, options=opts)
            except _obx.GenericError as e:
                text = str(e)
                if ("416" in text and _STATUS.search(text)) or _PAST_END.search(text):
                    return b""  # the range starts at or past the end
                raise
            if etag is None:
                self._learn(path, result.meta.get("e_tag"))
            return bytes(result.bytes())

        return self._call(self._changed(fetch, path), f"read {path!r} at {offset}")

    def _learn(self, path: str, etag: Optional[str]) -> None:
        if not etag:
            return
        with self._lock:
            self._learned[path] = etag
            self._learned.move_to_end(path)
            while len(self._learned) > LEARNED_ETAGS:
                self._learned.popitem(last=False)

    def _changed(self, fn: Callable[[], bytes], path: str) -> Callable[[], bytes]:
        def call() -> bytes:
            try:
                return fn()
            except _obx.PreconditionError as e:
                with self._lock:
                    self._learned.pop(path, None)  # the next open of the new version learns again
                raise BackendError(f"read {path!r}: object changed since the listing (ETag)") from e
        return call

    def stat(self, path: str) -> Tuple[int, int]:
        """Return (size in bytes, mtime in ns) of ``path`` now (one HEAD)."""
        meta = self._call(lambda: _obs.head(self._store, self._key(path)), f"stat {path!r}")
        return int(meta["size"]), mtime_ns(meta)

    def close(self) -> None:
        """Refuse further reads and close the listing's fsspec session; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._lister:
            self._lister.close()


def _boto3_provider():
    """boto3's credential chain (``~/.aws`` profiles, SSO, assumed roles) for an S3 store given no keys,
    when boto3 is installed and the environment holds no ``AWS_ACCESS_KEY_ID`` (obstore reads that
    itself); None otherwise (obstore's own chain: environment, web identity, instance metadata)."""
    import os

    if os.environ.get("AWS_ACCESS_KEY_ID"):
        return None
    try:
        import boto3  # noqa: F401
        from obstore.auth.boto3 import Boto3CredentialProvider

        provider = Boto3CredentialProvider()
    except Exception as e:  # noqa: BLE001 - no boto3, or no credentials in its chain
        log.debug("boto3 credentials not used: %s", e)
        return None
    return provider
