"""The control protocol, version 1 (docs/protocol.md): encode and validate every message kind.

Pure functions over lists of ``bytes`` frames; no sockets, no ZeroMQ, no torch. The daemon's
:mod:`shadefs.control.server`, the hook's :mod:`shadefs.control.client` and ``shadefs stats`` share it,
so a message the client can build is exactly a message the daemon accepts.

A message is the unit of rejection: any defect rejects the whole message with ONE reason, the first
of these checks that fails (the precedence, also in docs/protocol.md):

1. ``oversize``      the frames total more than :data:`MAX_MESSAGE_BYTES` bytes.
2. ``version``       frame 0 is missing or is not ``SHADEFS1``.
3. ``malformed``     frame 1 (the kind) is missing.
4. ``unknown_kind``  the kind is not one this side accepts.
5. ``malformed``     wrong frame count for the kind; a request id that is not 8 bytes.
6. ``oversize``      more than :data:`MAX_PATHS` paths (counted before decoding).
7. ``malformed``     paths not UTF-8; an empty path list where one is not allowed (``scores``);
                     (replies) flags other than 0/1, stats not a JSON object, error text not UTF-8.
8. ``length_mismatch`` the values frame is not exactly 4 bytes per path.
9. ``bad_path``      a path is empty, absolute, or has an empty, ``.`` or ``..`` component.
10. ``non_finite``   a value is NaN or infinite.
11. ``unknown_path`` a path is not a file of the mount's snapshot, or a plan index lies beyond its
                     path table (checked by the server, not here).
12. ``unknown_handle`` a ``plan`` or ``register`` names a path table the daemon does not hold (server).
13. ``flood``        too many plans, tables, or plan announcements per second (server).

``register`` and ``plan`` (clairvoyant caching, docs/protocol.md): ``register`` uploads a dataset's path
table (in chunks) and gets a handle; ``plan`` announces epochs as uint32 indices into that table. Their
own checks slot into the order above: a handle frame that is not 0/8 (``register``) or 8 (``plan``)
bytes, a meta frame that is not 16 bytes, or a segments frame that is empty or not a multiple of 4 bytes
is ``malformed`` (5); a meta format other than :data:`PLAN_FORMAT` is ``version`` (2, after the frame
count); more than :data:`MAX_PLAN_IDS` ids or :data:`MAX_PLAN_SEGMENTS` segments is ``oversize`` (6); an
ids frame that is not 4 bytes per id, or segment lengths that do not sum to the id count, is
``length_mismatch`` (8).

``withdraw`` (one-way, added after ``plan``; a daemon without it rejects it as ``unknown_kind``) ends a
stream's plan: the job is done with it. Its handle frame must be 8 bytes and its stream frame 4 bytes, else
``malformed`` (5).

Never raises anything but :class:`ProtocolError` on bytes from the wire.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import List, Optional, Sequence, Union

import numpy as np

__all__ = [
    "VERSION", "SCORES", "RESIDENT", "STATS", "WARM", "ERROR", "REQUEST_KINDS", "REPLY_KINDS",
    "REQUEST_ID_BYTES", "MAX_MESSAGE_BYTES", "MAX_PATHS", "MAX_FRAMES", "REASONS",
    "ProtocolError", "Scores", "ResidentRequest", "StatsRequest", "ResidentReply", "StatsReply",
    "ErrorReply", "WarmRequest", "WarmReply", "encode_warm_request", "encode_warm_reply", "new_request_id", "encode_scores", "encode_resident_request", "encode_stats_request",
    "encode_resident_reply", "encode_stats_reply", "encode_error_reply", "decode_request",
    "decode_reply", "error_reply_id", "wants_reply", "check_paths",
    "REGISTER", "PLAN", "PLAN_FORMAT", "PLAN_META_BYTES", "MAX_PLAN_IDS", "MAX_PLAN_SEGMENTS",
    "RegisterRequest", "RegisterReply", "PlanMessage", "encode_register_request", "encode_register_reply",
    "encode_plan", "WITHDRAW", "PlanWithdraw", "encode_withdraw", "PLAN_FORMAT_JOB", "PLAN_META_JOB_BYTES",
]

VERSION = b"SHADEFS1"
SCORES = b"scores"
RESIDENT = b"resident"
STATS = b"stats"
WARM = b"warm"
REGISTER = b"register"
PLAN = b"plan"
WITHDRAW = b"withdraw"
ERROR = b"error"
REQUEST_KINDS = (SCORES, RESIDENT, STATS, WARM, REGISTER, PLAN, WITHDRAW)
REPLY_KINDS = (RESIDENT, STATS, WARM, REGISTER, ERROR)

REQUEST_ID_BYTES = 8
#: Largest accepted message, all frames together (bytes). 1M paths of ~60 bytes fit.
MAX_MESSAGE_BYTES = 64 * 2**20
#: Most paths in one message (``scores`` or ``resident``).
MAX_PATHS = 1_048_576
#: Most frames any valid message has; a receiver may keep only MAX_FRAMES + 1 frames of a message.
MAX_FRAMES = 6
#: The layout version of a ``plan`` message's meta frame (``<IIII``: format, stream, first epoch, window).
PLAN_FORMAT = 1
PLAN_META_BYTES = 16
#: Format 2 adds the announcing job: ``<IIIIIIQ``, format 1's fields then pid, 0, start time (32 bytes).
#: Sent only to a daemon whose ``register`` reply says ``"plan_format": 2``; format 1 is still read.
PLAN_FORMAT_JOB = 2
PLAN_META_JOB_BYTES = 32
#: Most ids in one ``plan`` message (4 bytes each: 32 MiB); a 1.28M-sample epoch is 5 MiB.
MAX_PLAN_IDS = 8 * 2**20
#: Most epochs (segments) in one ``plan`` message.
MAX_PLAN_SEGMENTS = 16

REASONS = ("version", "unknown_kind", "malformed", "length_mismatch", "non_finite", "bad_path",
           "unknown_path", "oversize", "unknown_handle", "flood")

_FRAME_COUNTS = {SCORES: 4, RESIDENT: 4, STATS: 3, WARM: 4, REGISTER: 5, PLAN: 6, WITHDRAW: 4}
#: One-way kinds: never answered, not even when rejected.
ONE_WAY = (SCORES, PLAN, WITHDRAW)


class ProtocolError(ValueError):
    """A message violates the protocol.

    Attributes:
        reason: one of :data:`REASONS` (the counter it is filed under).
        message: one line for a log or an ``error`` reply.
    """

    def __init__(self, reason: str, message: str):
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


# -- messages -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False)
class Scores:
    """``scores``: raw per-sample values (float32, shape (n,)) of one minibatch, by mount-relative path."""

    paths: List[str]
    values: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class ResidentRequest:
    """``resident``: which of ``paths`` are in a cache tier."""

    request_id: bytes
    paths: List[str]


@dataclasses.dataclass(frozen=True, eq=False)
class WarmRequest:
    """``warm``: read ``paths`` into the cache through the policies (not counted as opens)."""

    request_id: bytes
    paths: List[str]


@dataclasses.dataclass(frozen=True, eq=False)
class WarmReply:
    """Answer to ``warm``: ``result`` maps outcome (resident, ram, disk, rejected, failed, bytes) to counts."""

    request_id: bytes
    result: dict


@dataclasses.dataclass(frozen=True, eq=False)
class StatsRequest:
    """``stats``: the daemon's stats JSON."""

    request_id: bytes


@dataclasses.dataclass(frozen=True, eq=False)
class ResidentReply:
    """Answer to ``resident``: ``flags`` is bool, shape (n,), in the order of the request's paths."""

    request_id: bytes
    flags: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class StatsReply:
    """Answer to ``stats``."""

    request_id: bytes
    stats: dict


@dataclasses.dataclass(frozen=True, eq=False)
class ErrorReply:
    """A request was rejected or failed; ``message`` starts with ``<reason>: `` when it was rejected.

    ``request_id`` is empty when the request's id could not be read.
    """

    request_id: bytes
    message: str

    @property
    def reason(self) -> str:
        """The rejection reason named at the start of ``message``, else ``"error"`` (a daemon failure)."""
        head = self.message.split(":", 1)[0]
        return head if head in REASONS else "error"


@dataclasses.dataclass(frozen=True, eq=False)
class RegisterRequest:
    """``register``: add ``paths`` to path table ``handle`` (empty: a new table); answered with the handle."""

    request_id: bytes
    handle: bytes
    paths: List[str]


@dataclasses.dataclass(frozen=True, eq=False)
class RegisterReply:
    """Answer to ``register``: the table's ``handle`` (8 bytes) and its ``size`` (paths) so far."""

    request_id: bytes
    handle: bytes
    size: int
    plan_format: int = PLAN_FORMAT  #: the newest plan meta format the daemon reads (1 when it does not say)


@dataclasses.dataclass(frozen=True, eq=False)
class PlanMessage:
    """``plan`` (one-way): stream ``stream`` of table ``handle`` will read epochs ``first_epoch, ...``
    in the order ``ids`` (uint32 table indices, shape (L,)), ``segments[i]`` positions per epoch;
    ``window`` is the client's matching-window hint in positions (0: the daemon's default)."""

    handle: bytes
    stream: int
    first_epoch: int
    window: int
    segments: np.ndarray
    ids: np.ndarray
    job: Optional[tuple] = None  #: (pid, start time) of the announcing process (format 2), else None


@dataclasses.dataclass(frozen=True, eq=False)
class PlanWithdraw:
    """``withdraw`` (one-way): stream ``stream`` of table ``handle`` is done with its plan (the job closed its
    sampler or exited); the daemon drops the plan now instead of retiring it after ``idle_s``."""

    handle: bytes
    stream: int


Request = Union[Scores, ResidentRequest, StatsRequest, WarmRequest, RegisterRequest, PlanMessage, PlanWithdraw]
Reply = Union[ResidentReply, StatsReply, WarmReply, RegisterReply, ErrorReply]


def new_request_id() -> bytes:
    """A random 8-byte request id."""
    return os.urandom(REQUEST_ID_BYTES)


# -- encoding -----------------------------------------------------------------------------------

def encode_scores(paths: Sequence[str], values, *, max_bytes: int = MAX_MESSAGE_BYTES,
                  max_paths: int = MAX_PATHS) -> List[bytes]:
    """Frames of a ``scores`` message.

    Args:
        paths: mount-relative file paths, at least one.
        values: one finite number per path (converted to little-endian float32).

    Raises:
        ProtocolError: the message would be rejected by the daemon (same reasons as decoding).
    """
    if len(paths) == 0:
        raise ProtocolError("malformed", "a scores message needs at least one path")
    pf = _encode_paths(paths, max_paths)
    try:
        vals = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ProtocolError("malformed", "values must be numbers") from None
    total = len(VERSION) + len(SCORES) + len(pf) + 4 * vals.size
    if total > max_bytes:
        raise ProtocolError("oversize", f"message of {total} bytes exceeds the limit of {max_bytes}")
    if vals.ndim != 1 or vals.shape[0] != len(paths):
        raise ProtocolError("length_mismatch", f"{len(paths)} paths but values of shape {vals.shape}")
    check_paths(paths)
    with np.errstate(over="ignore"):
        v32 = vals.astype("<f4")  # a float64 beyond float32's range becomes inf: rejected below
    _check_finite(v32)
    return [VERSION, SCORES, pf, v32.tobytes()]


def encode_resident_request(request_id: bytes, paths: Sequence[str], *, max_bytes: int = MAX_MESSAGE_BYTES,
                            max_paths: int = MAX_PATHS) -> List[bytes]:
    """Frames of a ``resident`` request (``paths`` may be empty). Raises :class:`ProtocolError`."""
    _check_request_id(request_id)
    pf = _encode_paths(paths, max_paths)
    frames = [VERSION, RESIDENT, bytes(request_id), pf]
    _check_size(frames, max_bytes)
    check_paths(paths)
    return frames


def encode_warm_request(request_id: bytes, paths: Sequence[str], *, max_bytes: int = MAX_MESSAGE_BYTES,
                        max_paths: int = MAX_PATHS) -> List[bytes]:
    """Frames of a ``warm`` request. Raises :class:`ProtocolError`."""
    frames = encode_resident_request(request_id, paths, max_bytes=max_bytes, max_paths=max_paths)
    frames[1] = WARM
    return frames


def encode_warm_reply(request_id: bytes, result: dict) -> List[bytes]:
    """Frames answering ``warm``: a JSON object of outcome counts."""
    frames = encode_stats_reply(request_id, result)
    frames[1] = WARM
    return frames


def encode_register_request(request_id: bytes, handle: bytes, paths: Sequence[str], *,
                            max_bytes: int = MAX_MESSAGE_BYTES, max_paths: int = MAX_PATHS) -> List[bytes]:
    """Frames of a ``register`` request: ``handle`` b"" creates a table, 8 bytes appends to one.

    Raises:
        ProtocolError: as the daemon would reject it.
    """
    _check_request_id(request_id)
    if len(handle) not in (0, 8):
        raise ProtocolError("malformed", f"a table handle is 0 or 8 bytes, got {len(handle)}")
    pf = _encode_paths(paths, max_paths)
    frames = [VERSION, REGISTER, bytes(request_id), bytes(handle), pf]
    _check_size(frames, max_bytes)
    check_paths(paths)
    return frames


def encode_register_reply(request_id: bytes, handle: bytes, size: int) -> List[bytes]:
    """Frames answering ``register``: JSON ``{"handle": "<16 hex digits>", "size": paths, "plan_format": 2}``
    (``plan_format``: the newest ``plan`` meta this daemon reads)."""
    frames = encode_stats_reply(request_id, {"handle": bytes(handle).hex(), "size": int(size),
                                             "plan_format": PLAN_FORMAT_JOB})
    frames[1] = REGISTER
    return frames


def encode_plan(handle: bytes, stream: int, first_epoch: int, segments: Sequence[int], ids, *,
                window: int = 0, max_ids: int = MAX_PLAN_IDS, job: Optional[tuple] = None) -> List[bytes]:
    """Frames of a ``plan`` message (one-way).

    Args:
        handle: the table's 8-byte handle (from ``register``).
        stream: the announcing stream (e.g. the DDP rank), 0 .. 2**32-1.
        first_epoch: the epoch of the first segment.
        segments: positions per epoch, at least one, summing to ``len(ids)``.
        ids: table indices (0 .. table size - 1), sent as little-endian uint32.
        window: matching-window hint (positions; 0 = the daemon's default).
        job: ``(pid, start time)`` of the announcing process (format 2: only for a daemon whose
            ``register`` reply has ``plan_format`` >= 2), or None (format 1).

    Raises:
        ProtocolError: as the daemon would reject it.
    """
    if len(handle) != 8:
        raise ProtocolError("malformed", f"a table handle is 8 bytes, got {len(handle)}")
    ids = np.asarray(ids)
    segs = np.asarray(segments, dtype=np.int64).reshape(-1)
    if ids.ndim != 1:
        raise ProtocolError("malformed", f"ids must be one-dimensional, got shape {ids.shape}")
    if ids.size > max_ids:
        raise ProtocolError("oversize", f"{ids.size} plan ids exceed the limit of {max_ids}")
    if segs.size == 0 or segs.size > MAX_PLAN_SEGMENTS:
        raise ProtocolError("malformed" if segs.size == 0 else "oversize",
                            f"a plan has 1..{MAX_PLAN_SEGMENTS} segments, got {segs.size}")
    if ids.size and (ids.min() < 0 or ids.max() > 0xFFFFFFFF):
        raise ProtocolError("malformed", "plan ids must be in 0 .. 2**32-1")
    if segs.min() < 0 or int(segs.sum()) != ids.size:
        raise ProtocolError("length_mismatch", f"segments sum to {int(segs.sum())}, {ids.size} ids")
    for name, v in (("stream", stream), ("first_epoch", first_epoch), ("window", window)):
        if not 0 <= int(v) <= 0xFFFFFFFF:
            raise ProtocolError("malformed", f"{name} {v} is not in 0 .. 2**32-1")
    meta = np.array([PLAN_FORMAT, stream, first_epoch, window], dtype="<u4").tobytes()
    if job is not None:
        pid, start = int(job[0]), int(job[1])
        if not 0 <= pid <= 0xFFFFFFFF or not 0 <= start < 2**64:
            raise ProtocolError("malformed", f"job {job} is not (pid < 2**32, start time < 2**64)")
        meta = (np.array([PLAN_FORMAT_JOB, stream, first_epoch, window, pid, 0], dtype="<u4").tobytes()
                + np.array([start], dtype="<u8").tobytes())
    return [VERSION, PLAN, bytes(handle), meta, segs.astype("<u4").tobytes(), ids.astype("<u4").tobytes()]


def encode_withdraw(handle: bytes, stream: int) -> List[bytes]:
    """Frames of a ``withdraw`` message (one-way): ``handle`` (8 bytes), ``stream`` as little-endian uint32.

    Raises:
        ProtocolError: ``malformed`` (a handle that is not 8 bytes, a stream outside 0 .. 2**32-1).
    """
    if len(handle) != 8:
        raise ProtocolError("malformed", f"a table handle is 8 bytes, got {len(handle)}")
    if not 0 <= int(stream) <= 0xFFFFFFFF:
        raise ProtocolError("malformed", f"stream {stream} is not in 0 .. 2**32-1")
    return [VERSION, WITHDRAW, bytes(handle), np.array([stream], dtype="<u4").tobytes()]


def encode_stats_request(request_id: bytes) -> List[bytes]:
    """Frames of a ``stats`` request. Raises :class:`ProtocolError` for a bad request id."""
    _check_request_id(request_id)
    return [VERSION, STATS, bytes(request_id)]


def encode_resident_reply(request_id: bytes, flags) -> List[bytes]:
    """Frames answering ``resident``: one byte per path, 1 = resident, 0 = not."""
    f = np.asarray(flags, dtype=bool).reshape(-1)
    return [VERSION, RESIDENT, bytes(request_id), f.astype(np.uint8).tobytes()]


def encode_stats_reply(request_id: bytes, stats: dict) -> List[bytes]:
    """Frames answering ``stats``: compact UTF-8 JSON; numpy scalars become numbers, NaN/inf ``null``."""
    text = json.dumps(_jsonable(stats), separators=(",", ":"), allow_nan=False, sort_keys=True)
    return [VERSION, STATS, bytes(request_id), text.encode("utf-8")]


def encode_error_reply(request_id: bytes, message: str) -> List[bytes]:
    """Frames of an ``error`` reply (``request_id`` empty when the request's id was unreadable)."""
    return [VERSION, ERROR, bytes(request_id), message.encode("utf-8", "replace")]


# -- decoding -----------------------------------------------------------------------------------

def decode_request(frames: Sequence[bytes], *, total_bytes: Optional[int] = None,
                   max_bytes: int = MAX_MESSAGE_BYTES, max_paths: int = MAX_PATHS) -> Request:
    """Validate and decode a client's message (the frames after ZeroMQ's routing id).

    Args:
        frames: the message's frames; a receiver may pass only the first ``MAX_FRAMES + 1``.
        total_bytes: the size of all frames when ``frames`` was truncated (default: summed here).

    Returns:
        :class:`Scores`, :class:`ResidentRequest` or :class:`StatsRequest`.

    Raises:
        ProtocolError: with the reason of the first failed check (module docstring).
    """
    frames = [bytes(f) for f in frames]
    kind = _check_header(frames, total_bytes, max_bytes, REQUEST_KINDS)
    if len(frames) != _FRAME_COUNTS[kind]:
        raise ProtocolError("malformed", f"{kind.decode()} takes {_FRAME_COUNTS[kind]} frames, got {len(frames)}")
    if kind == STATS:
        _check_request_id(frames[2])
        return StatsRequest(frames[2])
    if kind == PLAN:
        return _decode_plan(frames)
    if kind == WITHDRAW:
        if len(frames[2]) != 8:
            raise ProtocolError("malformed", f"a table handle is 8 bytes, got {len(frames[2])}")
        if len(frames[3]) != 4:
            raise ProtocolError("malformed", f"a withdraw's stream is 4 bytes, got {len(frames[3])}")
        return PlanWithdraw(frames[2], int(np.frombuffer(frames[3], dtype="<u4")[0]))
    if kind == REGISTER:
        _check_request_id(frames[2])
        if len(frames[3]) not in (0, 8):
            raise ProtocolError("malformed", f"a table handle is 0 or 8 bytes, got {len(frames[3])}")
        text, n = _paths_text(frames[4], max_paths, allow_empty=True)
        return RegisterRequest(frames[2], frames[3], _split_checked(text, n))
    if kind in (RESIDENT, WARM):
        _check_request_id(frames[2])
        text, n = _paths_text(frames[3], max_paths, allow_empty=True)
        paths = _split_checked(text, n)
        return (ResidentRequest if kind == RESIDENT else WarmRequest)(frames[2], paths)
    text, n = _paths_text(frames[2], max_paths, allow_empty=False)
    if len(frames[3]) != 4 * n:
        raise ProtocolError("length_mismatch", f"{n} paths need {4 * n} value bytes, got {len(frames[3])}")
    paths = _split_checked(text, n)
    values = np.frombuffer(frames[3], dtype="<f4").astype(np.float32)
    _check_finite(values)
    return Scores(paths, values)


def _decode_plan(frames: List[bytes]) -> PlanMessage:
    handle, meta, segs, ids = frames[2], frames[3], frames[4], frames[5]
    if len(handle) != 8:
        raise ProtocolError("malformed", f"a table handle is 8 bytes, got {len(handle)}")
    if len(meta) not in (PLAN_META_BYTES, PLAN_META_JOB_BYTES):
        raise ProtocolError("malformed", f"plan meta is {PLAN_META_BYTES} or {PLAN_META_JOB_BYTES} bytes, "
                                         f"got {len(meta)}")
    fmt, stream, first_epoch, window = np.frombuffer(meta[:16], dtype="<u4").tolist()
    if fmt not in (PLAN_FORMAT, PLAN_FORMAT_JOB):
        raise ProtocolError("version", f"plan format {fmt}, this daemon reads {PLAN_FORMAT} and {PLAN_FORMAT_JOB}")
    if (fmt == PLAN_FORMAT_JOB) != (len(meta) == PLAN_META_JOB_BYTES):
        raise ProtocolError("malformed", f"plan format {fmt} with a meta of {len(meta)} bytes")
    job = None
    if fmt == PLAN_FORMAT_JOB:
        job = (int(np.frombuffer(meta[16:20], dtype="<u4")[0]), int(np.frombuffer(meta[24:32], dtype="<u8")[0]))
    if not segs or len(segs) % 4:
        raise ProtocolError("malformed", f"segments frame of {len(segs)} bytes (4 per epoch, at least one)")
    if len(segs) // 4 > MAX_PLAN_SEGMENTS:
        raise ProtocolError("oversize", f"{len(segs) // 4} segments exceed the limit of {MAX_PLAN_SEGMENTS}")
    if len(ids) // 4 > MAX_PLAN_IDS:
        raise ProtocolError("oversize", f"{len(ids) // 4} plan ids exceed the limit of {MAX_PLAN_IDS}")
    if len(ids) % 4:
        raise ProtocolError("length_mismatch", f"ids frame of {len(ids)} bytes is not 4 per id")
    seg = np.frombuffer(segs, dtype="<u4").astype(np.int64)
    if int(seg.sum()) != len(ids) // 4:
        raise ProtocolError("length_mismatch", f"segments sum to {int(seg.sum())}, {len(ids) // 4} ids")
    return PlanMessage(handle, int(stream), int(first_epoch), int(window), seg,
                       np.frombuffer(ids, dtype="<u4"), job)


def decode_reply(frames: Sequence[bytes], *, max_bytes: int = MAX_MESSAGE_BYTES) -> Reply:
    """Validate and decode the daemon's reply (client side).

    Returns:
        :class:`ResidentReply`, :class:`StatsReply` or :class:`ErrorReply`.

    Raises:
        ProtocolError: the reply violates the protocol (same precedence as requests).
    """
    frames = [bytes(f) for f in frames]
    kind = _check_header(frames, None, max_bytes, REPLY_KINDS)
    if len(frames) != 4:
        raise ProtocolError("malformed", f"a {kind.decode()} reply takes 4 frames, got {len(frames)}")
    rid, body = frames[2], frames[3]
    if kind == ERROR:
        if len(rid) not in (0, REQUEST_ID_BYTES):
            raise ProtocolError("malformed", f"request id of {len(rid)} bytes")
        return ErrorReply(rid, _utf8(body, "error message"))
    _check_request_id(rid)
    if kind == RESIDENT:
        raw = np.frombuffer(body, dtype=np.uint8)
        if raw.size and raw.max() > 1:
            raise ProtocolError("malformed", "resident flags must be bytes 0 or 1")
        return ResidentReply(rid, raw.astype(bool))
    try:
        stats = json.loads(_utf8(body, "stats"))
    except ValueError:
        raise ProtocolError("malformed", "stats reply is not JSON") from None
    if not isinstance(stats, dict):
        raise ProtocolError("malformed", "stats reply is not a JSON object")
    if kind == REGISTER:
        try:
            handle = bytes.fromhex(stats["handle"])
            size = int(stats["size"])
        except (KeyError, TypeError, ValueError):
            raise ProtocolError("malformed", "register reply lacks a handle and a size") from None
        if len(handle) != 8:
            raise ProtocolError("malformed", "register reply's handle is not 8 bytes")
        fmt = stats.get("plan_format", PLAN_FORMAT)
        return RegisterReply(rid, handle, size, fmt if isinstance(fmt, int) and not isinstance(fmt, bool) else PLAN_FORMAT)
    return (StatsReply if kind == STATS else WarmReply)(rid, stats)


def wants_reply(frames: Sequence[bytes]) -> bool:
    """Whether a (possibly invalid) inbound message gets a reply: everything but the one-way kinds
    (``scores``, ``plan``, ``withdraw``)."""
    return not (len(frames) >= 2 and bytes(frames[1]) in ONE_WAY)


def error_reply_id(frames: Sequence[bytes]) -> bytes:
    """The request id to echo in an ``error`` reply: frame 2 if it is 8 bytes, else empty."""
    if len(frames) >= 3 and len(frames[2]) == REQUEST_ID_BYTES:
        return bytes(frames[2])
    return b""


def check_paths(paths: Sequence[str]) -> None:
    """Raise ``ProtocolError('bad_path')`` naming the first path that is empty, absolute, contains NUL,
    or has an empty, ``.`` or ``..`` component."""
    for p in paths:
        why = _path_problem(p)
        if why:
            raise ProtocolError("bad_path", f"{why}: {p!r}"[:300])


# -- helpers ------------------------------------------------------------------------------------

def _check_header(frames: List[bytes], total_bytes: Optional[int], max_bytes: int, kinds) -> bytes:
    total = sum(len(f) for f in frames) if total_bytes is None else total_bytes
    if total > max_bytes:
        raise ProtocolError("oversize", f"message of {total} bytes exceeds the limit of {max_bytes}")
    if not frames or frames[0] != VERSION:
        got = frames[0][:16] if frames else b"(no frames)"
        raise ProtocolError("version", f"expected {VERSION.decode()}, got {got!r}")
    if len(frames) < 2:
        raise ProtocolError("malformed", "no kind frame")
    if frames[1] not in kinds:
        raise ProtocolError("unknown_kind", f"unknown kind {frames[1][:32]!r}")
    return frames[1]


def _check_request_id(rid) -> None:
    if not isinstance(rid, (bytes, bytearray, memoryview)) or len(rid) != REQUEST_ID_BYTES:
        n = len(rid) if isinstance(rid, (bytes, bytearray, memoryview)) else type(rid).__name__
        raise ProtocolError("malformed", f"request id must be {REQUEST_ID_BYTES} bytes, got {n}")


def _check_size(frames: List[bytes], max_bytes: int) -> None:
    total = sum(len(f) for f in frames)
    if total > max_bytes:
        raise ProtocolError("oversize", f"message of {total} bytes exceeds the limit of {max_bytes}")


def _check_finite(values: np.ndarray) -> None:
    ok = np.isfinite(values)
    if not ok.all():
        i = int(np.argmin(ok))
        raise ProtocolError("non_finite", f"value {i} is {values[i]}")


def _encode_paths(paths: Sequence[str], max_paths: int) -> bytes:
    if len(paths) > max_paths:
        raise ProtocolError("oversize", f"{len(paths)} paths exceed the limit of {max_paths}")
    if not all(isinstance(p, str) for p in paths):
        raise ProtocolError("malformed", "paths must be str")
    try:
        return "\0".join(paths).encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError("malformed", "a path is not encodable as UTF-8") from None


def _paths_text(frame: bytes, max_paths: int, allow_empty: bool):
    if not frame:
        if allow_empty:
            return "", 0
        raise ProtocolError("malformed", "empty path list")
    n = frame.count(b"\0") + 1
    if n > max_paths:
        raise ProtocolError("oversize", f"{n} paths exceed the limit of {max_paths}")
    return _utf8(frame, "paths"), n


def _utf8(b: bytes, what: str) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError("malformed", f"{what} are not valid UTF-8 (byte {e.start})") from None


def _split_checked(text: str, n: int) -> List[str]:
    if n == 0:
        return []
    # One pass of C-speed substring tests over the joined text; per-path checks only to name the culprit.
    u = "\0" + text + "\0"
    if "\0\0" in u or "\0/" in u or "/\0" in u or "//" in u:
        check_paths(text.split("\0"))
    v = u.replace("\0", "/")
    if "/./" in v or "/../" in v:
        check_paths(text.split("\0"))
    return text.split("\0")


def _path_problem(p) -> Optional[str]:
    if not isinstance(p, str):
        return "not a str"
    if p == "":
        return "empty path"
    if "\0" in p:
        return "NUL in path"
    if p.startswith("/"):
        return "absolute path"
    for part in p.split("/"):
        if part == "":
            return "empty component"
        if part in (".", ".."):
            return f"{part!r} component"
    return None


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
