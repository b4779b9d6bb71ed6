"""What a shared tier's options name: the Redis URLs (:func:`parse_urls`, :func:`redact_url` for logs),
the group's secret file (:func:`read_secret`) and the group's name (:func:`namespace_key`). Each bad
value is a :class:`SharedTierConfigError`, one line for the user."""
from __future__ import annotations

import hashlib
import os
import urllib.parse
from typing import List

__all__ = ["SharedTierConfigError", "parse_urls", "redact_url", "read_secret", "namespace_key", "MIN_SECRET"]

MIN_SECRET = 16           # bytes of group secret at least


class SharedTierConfigError(ValueError):
    """A ``--shared-tier`` setting is invalid (one line for the user)."""


def read_secret(path: str) -> bytes:
    """The group secret in ``path`` (its bytes, surrounding whitespace stripped).

    Raises:
        SharedTierConfigError: unreadable, not a regular file, readable or writable by group or others
            (the secret would not be one), or shorter than :data:`MIN_SECRET` bytes.
    """
    import stat

    name = f"--shared-tier-secret {path!r}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY)
    except OSError as e:
        raise SharedTierConfigError(f"{name}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SharedTierConfigError(f"{name}: not a regular file")
        if st.st_mode & 0o066:
            raise SharedTierConfigError(f"{name}: mode {stat.S_IMODE(st.st_mode):04o} lets group or others read "
                                        f"or write the secret; chmod 600 it")
        with os.fdopen(os.dup(fd), "rb") as f:
            secret = f.read(1 << 16).strip()
    finally:
        os.close(fd)
    if len(secret) < MIN_SECRET:
        raise SharedTierConfigError(f"{name}: {len(secret)} bytes; give at least {MIN_SECRET} "
                                    f"(head -c 32 /dev/urandom | base64 > FILE)")
    return secret


def namespace_key(source_url: str) -> str:
    """The group's name: sha256 of the source URL, first 16 hex digits (as the disk tier names its folder)."""
    return hashlib.sha256(source_url.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def parse_urls(spec: str) -> List[str]:
    """Split ``redis://h1:6379,h2:6379`` or ``redis://a:6379,redis://b:6379`` into full URLs.

    A bare ``host:port`` after the first URL takes the first one's scheme and credentials.

    Raises:
        SharedTierConfigError: empty, a scheme other than redis:// or rediss://, no host, or a bad port.
    """
    parts = [p.strip() for p in (spec or "").split(",") if p.strip()]
    if not parts:
        raise SharedTierConfigError("--shared-tier: give at least one redis:// or rediss:// URL")
    out = []
    first = None
    for p in parts:
        if "://" not in p:
            if first is None:
                raise SharedTierConfigError(f"--shared-tier {redact_url(p)!r}: start with redis:// or rediss://")
            userinfo = first.netloc.rpartition("@")[0]
            p = f"{first.scheme}://{userinfo + '@' if userinfo else ''}{p}"
        u = urllib.parse.urlsplit(p)
        if u.scheme not in ("redis", "rediss"):
            raise SharedTierConfigError(f"--shared-tier {redact_url(p)!r}: the scheme must be redis:// or rediss://")
        try:
            port = u.port
        except ValueError:
            raise SharedTierConfigError(f"--shared-tier {redact_url(p)!r}: bad port") from None
        if not u.hostname:
            raise SharedTierConfigError(f"--shared-tier {redact_url(p)!r}: no host")
        if port is None:
            p = urllib.parse.urlunsplit((u.scheme, u.netloc + ":6379", u.path, u.query, u.fragment))
            u = urllib.parse.urlsplit(p)
        if first is None:
            first = u
        out.append(p)
    return out


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (what logs and stats show)."""
    try:
        u = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if u.password is None and "@" not in u.netloc:
        return url
    user = u.username or ""
    host = u.netloc.rpartition("@")[2]
    cred = f"{user}:***" if u.password is not None else user
    return urllib.parse.urlunsplit((u.scheme, f"{cred}@{host}", u.path, u.query, u.fragment))
