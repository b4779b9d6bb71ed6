"""A namespace's snapshot format: magic line, ``<Q`` header length, a JSON header (key, counts, report,
directory paths, each array's dtype, shape and offset), the name blob and the arrays (64-byte aligned),
then an ``xxh3_64`` (``<Q``) of everything before it. Written by :meth:`Namespace.save
<shadefs.namespace.Namespace.save>` and by an isolated scan's child; read back as views of one buffer
(``cls``: the class to build, :class:`shadefs.namespace.Namespace`)."""
from __future__ import annotations

import json
import struct
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from xxhash import xxh3_64, xxh3_64_intdigest

from .backends.base import ScanReport

__all__ = ["ARRAYS", "write", "load", "from_buffer"]

# the format's version: a snapshot of another version is rescanned, never read (3: integer-nanosecond
# file mtimes ``mtimes_ns`` in place of float seconds, and directory sizes)
_MAGIC_PREFIX = b"SHADEFS-NAMESPACE-"
_MAGIC = _MAGIC_PREFIX + b"3\n"
_ALIGN = 64

#: the arrays a snapshot holds (besides the name blob), by attribute name
ARRAYS = ("_off", "_parent", "sizes", "mtimes_ns", "etags", "_perm", "_perm_table", "_keys", "_key_ids",
          "_kids", "_dir_start", "_dir_nlink", "_dir_mtime_ns", "_dir_ctime_ns", "_dir_size")


def write(ns, f, key: Dict[str, Any]) -> int:
    """Write namespace ``ns`` in the snapshot format (:meth:`Namespace.save <shadefs.namespace.Namespace.save>`)
    to the binary file ``f``; returns the bytes written."""
    parts: List[Tuple[str, Any]] = [("_blob", ns._blob)]
    parts += [(name, np.ascontiguousarray(getattr(ns, name))) for name in ARRAYS]
    layout: List[Tuple[str, int, str, List[int]]] = []
    pos = 0
    for name, a in parts:
        pos += (-pos) % _ALIGN
        if name == "_blob":
            layout.append((name, pos, "|u1", [len(a)]))
            pos += len(a)
        else:
            layout.append((name, pos, a.dtype.str, list(a.shape)))
            pos += a.nbytes
    header = json.dumps({"key": key, "num_files": ns.num_files, "dirs": ns.dir_paths,
                         "fingerprint": ns.fingerprint,
                         "report": {"counts": ns.report.counts, "examples": ns.report.examples},
                         "arrays": layout}, ensure_ascii=True).encode()
    head = _MAGIC + struct.pack("<Q", len(header)) + header
    head += b"\0" * ((-len(head)) % _ALIGN)
    # streamed from the arrays' own memory (no copy of the namespace), hashed on the way
    h = xxh3_64()
    written = 0

    def put(data) -> None:
        nonlocal written
        h.update(data)
        f.write(data)
        written += len(data)

    put(head)
    body = 0
    for (name, a), (_, off, _, _) in zip(parts, layout):
        if off > body:
            put(b"\0" * (off - body))
            body = off
        mv = a if name == "_blob" else memoryview(a).cast("B")
        put(mv)
        body += len(mv)
    f.write(struct.pack("<Q", h.intdigest()))
    return written + 8


def load(cls, path: str, key: Dict[str, Any]) -> Tuple[Optional[Any], str]:
    """:meth:`Namespace.load <shadefs.namespace.Namespace.load>` (``cls``: the class to build)."""
    t0 = time.monotonic()
    try:
        buf = np.fromfile(path, dtype=np.uint8)
    except FileNotFoundError:
        return None, "no snapshot"
    except OSError as e:
        return None, f"cannot read it: {e}"
    return from_buffer(cls, buf, key, t0)


def from_buffer(cls, buf: np.ndarray, key: Dict[str, Any], t0: float) -> Tuple[Optional[Any], str]:
    """:func:`load` of the bytes ``buf`` (uint8, shape (n,)); the arrays are views of ``buf``."""
    try:
        m = len(_MAGIC)
        if len(buf) < m + 16 or buf[:m].tobytes() != _MAGIC:
            head = buf[:m].tobytes()
            if head.startswith(_MAGIC_PREFIX):
                version = head[len(_MAGIC_PREFIX):].split(b"\n", 1)[0].decode("ascii", "replace")
                return None, f"another format (version {version}; this daemon reads version 3)"
            return None, "not a namespace snapshot"
        (hlen,) = struct.unpack("<Q", buf[m:m + 8].tobytes())
        if xxh3_64_intdigest(memoryview(buf)[:-8]) != struct.unpack("<Q", buf[-8:].tobytes())[0]:
            return None, "checksum mismatch (a damaged snapshot)"
        header = json.loads(buf[m + 8:m + 8 + hlen].tobytes())
        if header.get("key") != key:
            return None, "written for another source, user or --follow-symlinks setting"
        base = m + 8 + hlen
        base += (-base) % _ALIGN
        ns = cls.__new__(cls)
        for name, off, dtype, shape in header["arrays"]:
            dt = np.dtype(dtype)
            count = int(np.prod(shape)) if shape else 1
            a = np.frombuffer(buf, dtype=dt, count=count, offset=base + off).reshape(shape)
            if name == "_blob":
                ns._blob = memoryview(a)
            else:
                setattr(ns, name, a)
        rep = ScanReport(counts=dict(header["report"]["counts"]), examples=dict(header["report"]["examples"]))
        ns._finish(int(header["num_files"]), list(header["dirs"]), rep, time.monotonic() - t0,
                   from_snapshot=True, fingerprint=header["fingerprint"])
        return ns, ""
    except (ValueError, KeyError, TypeError, struct.error) as e:
        return None, f"unreadable ({e})"
