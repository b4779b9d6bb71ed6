"""Bounded retries for backend calls, and the one classifier of which failures are worth retrying.

A remote backend retries a failed request only when :func:`is_transient` says the failure may go away
(timeouts, connection resets, HTTP 5xx, throttling), with exponential backoff and jitter, a bounded
number of times. It never retries a missing object or a refused permission, and it never turns a
failure into data: what is left after the retries is a :class:`BackendError` (EIO) with the cause
chained, logged once. This module must never log or format credentials: every message goes through
:func:`redact`.
"""
from __future__ import annotations

import errno
import http.client
import logging
import random
import re
import threading
import time
from typing import Callable, Iterable, Optional, TypeVar

from .base import BackendError

__all__ = ["RetryPolicy", "is_transient", "redact"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# S3 / AWS error codes that mean "try again later"; most come with a 5xx status, but RequestTimeout
# comes with 400 and the throttling codes with 400/429/503 depending on the service.
TRANSIENT_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
    "RequestThrottledException", "TooManyRequestsException", "RequestLimitExceeded",
    "ProvisionedThroughputExceededException", "BandwidthLimitExceeded", "EC2ThrottledException",
    "TransactionInProgressException", "PriorRequestNotComplete", "RequestTimeout",
    "RequestTimeoutException", "InternalError", "ServiceUnavailable", "IDPCommunicationError",
})
TRANSIENT_STATUS = frozenset({408, 429})  # plus every 5xx
TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name) for name in (
        "ECONNRESET", "ECONNREFUSED", "ECONNABORTED", "EPIPE", "ETIMEDOUT", "EHOSTUNREACH",
        "ENETUNREACH", "ENETDOWN", "ENETRESET", "EAGAIN", "EBUSY", "EREMOTEIO")
    if hasattr(errno, name))
_MAX_CHAIN = 16


def _transient_status(status: object) -> bool:
    return isinstance(status, int) and (status >= 500 or status in TRANSIENT_STATUS)


def _classify_strong(exc: BaseException) -> Optional[bool]:
    """Verdict from the exception's type or service error code; None when this link says nothing."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, BackendError):
        return False  # raised by a backend after its own judgement (a changed object, retries spent)
    try:  # botocore is optional (only with s3fs)
        import botocore.exceptions as bx
    except ImportError:  # pragma: no cover - s3fs not installed
        bx = None
    if bx is not None:
        if isinstance(exc, bx.ClientError):
            resp = getattr(exc, "response", None) or {}
            code = str(resp.get("Error", {}).get("Code", ""))
            status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code.isdigit():
                status = status or int(code)
            return code in TRANSIENT_CODES or _transient_status(status)
        if isinstance(exc, bx.SSLError):
            return False  # a certificate problem does not heal by retrying
        if isinstance(exc, (bx.ConnectionError, bx.HTTPClientError, bx.IncompleteReadError)):
            return True  # EndpointConnectionError, ConnectTimeout, ReadTimeout, ConnectionClosed, ...
        if type(exc).__name__ == "ResponseParserError":
            return True  # throttling responses can carry invalid XML (s3fs issue #484)
        if isinstance(exc, bx.BotoCoreError):
            return False  # NoCredentialsError, ParamValidationError, ...
    try:  # aiohttp is optional (s3fs, http)
        import aiohttp
    except ImportError:  # pragma: no cover
        aiohttp = None
    if aiohttp is not None:
        if isinstance(exc, aiohttp.ClientResponseError):
            return _transient_status(exc.status)
        if isinstance(exc, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)):
            return True  # ServerDisconnected, ClientOSError, timeouts, truncated bodies
    if isinstance(exc, (TimeoutError, ConnectionError, http.client.IncompleteRead)):
        return True  # includes socket.timeout, asyncio.TimeoutError, fsspec's FSTimeoutError
    if isinstance(exc, (ValueError, TypeError, KeyError, AttributeError, NotImplementedError)):
        return False
    return None


def _classify_weak(exc: BaseException) -> Optional[bool]:
    """Verdict from hints only (errno, an HTTP status attribute, the raising library)."""
    if isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS:
        return True
    for attr in ("status", "status_code", "code"):
        if _transient_status(getattr(exc, attr, None)):
            return True  # e.g. gcsfs HttpError(code=503)
    module = type(exc).__module__.split(".", 1)[0]
    if isinstance(exc, OSError) and module in ("aiohttp", "botocore", "aiobotocore", "urllib3"):
        return True
    return None


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen and len(seen) < _MAX_CHAIN:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)


def is_transient(exc: BaseException) -> bool:
    """Return True when retrying the call that raised ``exc`` may succeed.

    The exception and its causes (``__cause__``/``__context__``, outermost first) are examined: the
    first link whose type or service error code is decisive wins (a missing object, a permission
    error, a 4xx client error: False; a timeout, a connection error, a 5xx, throttling: True). Only
    when no link is decisive do hints count (a transient errno, a 5xx ``status``/``code`` attribute,
    an ``OSError`` raised by aiohttp/botocore). Anything unknown is not transient, so an unexpected
    failure becomes EIO quickly instead of stalling a reader.
    """
    links = list(_chain(exc))
    for link in links:
        verdict = _classify_strong(link)
        if verdict is not None:
            return verdict
    return any(_classify_weak(link) for link in links)


_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")
_SECRET_PARAM = re.compile(
    r"(?P<name>[A-Za-z0-9_.-]*(?:key|secret|token|password|passwd|signature|credential)"
    r"[A-Za-z0-9_.-]*)=(?P<value>[^&\s'\"]+)", re.IGNORECASE)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Return ``text`` with URL user-info, secret-looking ``name=value`` pairs and ``secrets`` masked."""
    text = _URL_USERINFO.sub(r"\g<scheme>***@", text)
    text = _SECRET_PARAM.sub(r"\g<name>=***", text)
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, "***")
    return text


class RetryPolicy:
    """Call a function, retrying transient failures with bounded exponential backoff and jitter.

    Attempt ``i`` (0-based) that fails transiently is followed by a sleep drawn uniformly from
    ``[d/2, d]`` with ``d = min(max_s, base_s * 2**i)`` ("equal jitter": a floor on the wait, so a
    struggling server gets relief; randomness, so many threads do not retry in lockstep). At most
    ``retries`` retries, so ``retries + 1`` attempts and at most ``sum(d_i)`` seconds of sleep.

    Args:
        retries: retries after the first attempt (>= 0).
        base_s: first backoff in seconds (> 0).
        max_s: cap on one backoff in seconds (>= base_s).
        seed: seeds the jitter (deterministic tests); None draws from the OS.
        sleep: injectable sleep function (tests).
        classify: injectable classifier, default :func:`is_transient`.
    """

    def __init__(self, retries: int = 5, base_s: float = 0.1, max_s: float = 5.0,
                 seed: Optional[int] = None, sleep: Callable[[float], None] = time.sleep,
                 classify: Callable[[BaseException], bool] = is_transient):
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if base_s <= 0 or max_s < base_s:
            raise ValueError(f"need 0 < retry_base_s <= retry_max_s, got {base_s}, {max_s}")
        self.retries = int(retries)
        self.base_s = float(base_s)
        self.max_s = float(max_s)
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._sleep = sleep
        self._classify = classify

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (0-based)."""
        d = min(self.max_s, self.base_s * (2 ** min(attempt, 62)))
        with self._rng_lock:
            return self._rng.uniform(d / 2, d)

    def call(self, fn: Callable[[], T], what: str, secrets: Iterable[str] = (),
             deadline: Optional[float] = None, attempt_s: float = 0.0) -> T:
        """Return ``fn()``, retrying transient failures.

        Args:
            fn: the call; it is repeated whole, so it must have no side effects beyond the request.
            what: names the operation in messages, e.g. ``"read 'a/b.jpg'"`` (no secrets).
            secrets: strings masked in messages.
            deadline: ``time.monotonic()`` by which the call must have returned or raised, or None: a
                retry is started only if its backoff plus ``attempt_s`` (the longest one attempt can
                take, in seconds) still ends by then.

        Raises:
            FileNotFoundError: as raised by ``fn`` (never retried).
            BackendError: a non-transient failure, or a transient one that outlived the retries;
                the last exception is chained as ``__cause__``. Logged once at ERROR.
        """
        attempt = 0
        while True:
            try:
                return fn()
            except FileNotFoundError:
                raise
            except Exception as e:  # noqa: BLE001 - classified below, re-raised as BackendError
                transient = self._classify(e)
                delay = self.backoff(attempt) if transient and attempt < self.retries else 0.0
                if delay and deadline is not None and time.monotonic() + delay + attempt_s > deadline:
                    msg = redact(f"{what}: failed after {attempt + 1} attempts, no time left for another "
                                 f"within the deadline: {_describe(e)}", secrets)
                    log.error("%s", msg)
                    raise BackendError(msg) from e
                if delay:
                    log.debug("%s: transient failure (attempt %d of %d), retrying in %.2f s: %s",
                              what, attempt + 1, self.retries + 1, delay,
                              redact(_describe(e), secrets))
                    self._sleep(delay)
                    attempt += 1
                    continue
                if transient:
                    msg = f"{what}: failed after {attempt + 1} attempts: {_describe(e)}"
                else:
                    msg = f"{what}: {_describe(e)}"
                msg = redact(msg, secrets)
                log.error("%s", msg)
                raise BackendError(msg) from e


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if type(exc).__name__ in text else f"{type(exc).__name__}: {text}"
