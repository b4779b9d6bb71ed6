"""The shared tier's values: the format (``MAGIC`` + a 32-byte tag + the data), the tag (HMAC-SHA256 under
the group's secret over the format, the group, the key, the file's path and version, and the data),
the key that carries the path and version (:class:`SharedKey`), and the log of failed authentications
(:class:`AuthFailureLog`: each key once, a flood summed up)."""
from __future__ import annotations

import collections
import hashlib
import hmac
import struct
from typing import Tuple

__all__ = ["MAGIC", "TAG", "HEADER", "SharedKey", "value_tag", "AuthFailureLog"]

MAGIC = b"SHD2"           # the value format: values of another format are never served
TAG = 32                  # HMAC-SHA256
HEADER = len(MAGIC) + TAG  # bytes in front of every value
LOGGED_KEYS = 4096        # keys whose failed authentication was logged (each once), most recent kept
AUTH_LOG_BURST = 10       # failed authentications logged per AUTH_LOG_WINDOW_S at most (a flood is summed up)
AUTH_LOG_WINDOW_S = 10.0


class SharedKey(str):
    """A group-wide key: the hex name of one version of a file (a ``str``, what Redis stores it under),
    carrying ``ident``, the bytes of its path and version that the value's tag covers."""

    __slots__ = ("ident",)

    def __new__(cls, hexkey: str, ident: bytes):
        self = super().__new__(cls, hexkey)
        self.ident = ident
        return self


def value_tag(secret: bytes, ns: str, key: str, ident: bytes, data) -> bytes:
    """The 32-byte tag of a value: HMAC-SHA256 under ``secret`` over the format tag, the group ``ns``,
    the ``key``, the file's ``ident`` (path and version) and ``data`` (bytes-like; not copied)."""
    h = hmac.new(secret, MAGIC + b"\0" + ns.encode() + b"\0" + key.encode() + b"\0"
                 + struct.pack(">I", len(ident)) + ident, hashlib.sha256)
    h.update(data)
    return h.digest()


class AuthFailureLog:
    """Which failed authentications to log: each key once (the :data:`LOGGED_KEYS` most recent kept), at
    most :data:`AUTH_LOG_BURST` per :data:`AUTH_LOG_WINDOW_S` seconds; the keys past the burst are counted
    and said by the first line of the next window. Not thread-safe: the caller holds its lock."""

    def __init__(self):
        self._logged: "collections.OrderedDict[str, None]" = collections.OrderedDict()
        self._window = [-float("inf"), 0, 0]  # window start (monotonic s), logged in it, suppressed

    def note(self, key: str, now: float) -> Tuple[bool, int]:
        """A value of ``key`` failed at ``now`` (monotonic seconds). Returns (log it, keys suppressed in
        the window before, to say in that line)."""
        w = self._window
        if key in self._logged:
            return False, 0
        self._logged[key] = None
        if len(self._logged) > LOGGED_KEYS:
            self._logged.popitem(last=False)
        suppressed = 0
        if now - w[0] >= AUTH_LOG_WINDOW_S:
            suppressed, w[:] = w[2], [now, 0, 0]
        if w[1] < AUTH_LOG_BURST:
            w[1] += 1
            return True, suppressed
        w[2] += 1
        return False, suppressed
