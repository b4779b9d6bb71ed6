"""Client side of the control protocol: what the training hook and ``shadefs stats`` talk through.

:class:`ControlClient` creates its ZeroMQ context and DEALER socket lazily, in the process that uses
it, and again after a fork (DataLoader workers fork; ZeroMQ contexts are not fork-safe). Scores are
fire-and-forget and never block training: when the send queue is full the batch is dropped and counted.
Never imports torch.
"""
from __future__ import annotations

import os
import time
import weakref
from typing import Optional, Sequence

import numpy as np

from ..config import Environment
from . import protocol as P

__all__ = ["ControlClient", "ControlError", "EndpointNotFound", "find_endpoint", "load_credentials", "ENV_ENDPOINT",
           "ENV_CREDENTIALS", "XATTR"]

# the variables' names, for messages; their values are read by shadefs.config.Environment
ENV_ENDPOINT, ENV_CREDENTIALS = "SHADEFS_ENDPOINT", "SHADEFS_CREDENTIALS"
XATTR = "user.shadefs.endpoint"


def load_credentials(path: str) -> dict:
    """Read a CURVE credentials file (JSON with ``server_public``, ``client_public``, ``client_secret``,
    Z85 strings): the mount registry's entry of a ``tcp://`` daemon is one, and so is a copy of it.

    Raises:
        ValueError: the file is unreadable or lacks a key.
    """
    import json

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"credentials file {path!r}: {e}") from None
    doc = doc.get("credentials", doc) if isinstance(doc, dict) else doc
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), str)
                                            for k in ("server_public", "client_public", "client_secret")):
        raise ValueError(f"credentials file {path!r} lacks server_public/client_public/client_secret")
    return doc


class EndpointNotFound(RuntimeError):
    """No control endpoint: ``SHADEFS_ENDPOINT`` is unset and the path is not inside a shadefs mount.

    Attributes:
        errno: the error of reading the path's ``user.shadefs.endpoint`` attribute (``ENODATA``: not on a
            shadefs mount; ``ENOTCONN``: a mount whose daemon is gone; ``ENOENT``: no such path), or None.
    """

    def __init__(self, message: str, errno: Optional[int] = None):
        super().__init__(message)
        self.errno = errno


class ControlError(RuntimeError):
    """The daemon answered a request with ``error``.

    Attributes:
        reason: the protocol rejection reason (``bad_path``, ``unknown_path``, ...), or ``"error"`` when
            the daemon failed while answering.
    """

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def find_endpoint(path_inside_mount: str) -> str:
    """Return the control endpoint URL of the shadefs mount holding ``path_inside_mount``.

    ``$SHADEFS_ENDPOINT`` wins when set and non-empty; then this user's mount registry
    (:mod:`shadefs.registry`: no access to the mount, so a hung mount cannot hang this); otherwise the
    extended attribute ``user.shadefs.endpoint`` of the path (any file or directory of the mount answers it).

    Raises:
        EndpointNotFound: none is available (the message says how to fix it).
    """
    env = Environment.from_env().endpoint
    if env:
        return env
    from .. import registry

    entry = registry.lookup_path(path_inside_mount)
    if entry is not None:
        return entry.endpoint
    try:
        raw = os.getxattr(path_inside_mount, XATTR)
    except OSError as e:
        raise EndpointNotFound(
            f"no shadefs control endpoint for {path_inside_mount!r} ({e.strerror or e}): pass a path "
            f"inside a shadefs mount or set {ENV_ENDPOINT} (see 'shadefs endpoint MOUNTPOINT')", e.errno) from None
    url = raw.decode("utf-8", "replace").strip("\0").strip()
    if not url:
        raise EndpointNotFound(f"{path_inside_mount!r} has an empty {XATTR} attribute; set {ENV_ENDPOINT}")
    return url


class ControlClient:
    """Talk to one daemon's control endpoint. Not thread-safe: use one client per thread.

    Args:
        endpoint: the URL (see :func:`find_endpoint`).
        timeout_s: how long :meth:`resident` and :meth:`stats` wait for a reply (seconds).
        send_hwm: messages queued before :meth:`send_scores` starts dropping batches.
        linger_s: at :meth:`close`, how long queued scores may still be delivered (seconds).
        curve_server_key: the server's public key file (``NAME.key``) for a CURVE-encrypted TCP endpoint.
        curve_client_key: this client's secret key file (``NAME.key_secret``); a fresh key pair when None
            (enough unless the daemon restricts clients with ``curve_authorized_clients``).
        credentials: CURVE credentials of a ``tcp://`` endpoint, a dict ``{"server_public",
            "client_public", "client_secret"}`` (Z85 strings) or the path of a JSON file holding them
            (docs/operations.md, "Security"). None: ``$SHADEFS_CREDENTIALS`` (a file), else the mount
            registry's entry for this endpoint, else none (a daemon requiring them ignores the client);
            False: none.

    Pickling keeps the settings and drops the socket; the copy connects on first use in its process.

    Attributes:
        dropped: score batches dropped because the send queue was full.
        sent: score batches queued for sending.
    """

    def __init__(self, endpoint: str, timeout_s: float = 5.0, *, send_hwm: int = 1000, linger_s: float = 1.0,
                 curve_server_key: Optional[str] = None, curve_client_key: Optional[str] = None,
                 credentials=None):
        self.endpoint = endpoint
        self._credentials = credentials
        self.timeout_s = float(timeout_s)
        self.send_hwm = int(send_hwm)
        self.linger_s = float(linger_s)
        self._curve_server_key = curve_server_key
        self._curve_client_key = curve_client_key
        self.dropped = 0
        self.sent = 0
        self._pid: Optional[int] = None
        self.plan_format = P.PLAN_FORMAT  # the newest plan meta the daemon reads (its register reply says)
        self._ctx = None
        self._sock = None
        self._finalizer = None

    def _socket(self):
        import zmq

        pid = os.getpid()
        if self._sock is not None and self._pid == pid:
            return self._sock
        # After a fork the parent's context and socket must not be touched (not even closed) here;
        # pyzmq skips closing objects created in another process when they are collected.
        self._sock = self._ctx = self._finalizer = None
        ctx = zmq.Context()
        try:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.SNDHWM, self.send_hwm)
            sock.setsockopt(zmq.LINGER, int(self.linger_s * 1000))
            sock.setsockopt(zmq.MAXMSGSIZE, P.MAX_MESSAGE_BYTES + 2**20)
            if self.endpoint.startswith("tcp://["):
                sock.setsockopt(zmq.IPV6, 1)
            creds = self._resolve_credentials() if not self._curve_server_key else None
            if creds:
                sock.curve_serverkey = creds["server_public"].encode()
                sock.curve_publickey = creds["client_public"].encode()
                sock.curve_secretkey = creds["client_secret"].encode()
            elif self._curve_server_key:
                import zmq.auth

                server_public, _ = zmq.auth.load_certificate(self._curve_server_key)
                if self._curve_client_key:
                    public, secret = zmq.auth.load_certificate(self._curve_client_key)
                    if not secret:
                        raise ValueError(f"{self._curve_client_key!r} holds no secret key")
                else:
                    public, secret = zmq.curve_keypair()
                sock.curve_serverkey = server_public
                sock.curve_publickey = public
                sock.curve_secretkey = secret
            sock.connect(self.endpoint)
        except BaseException:
            ctx.destroy(linger=0)
            raise
        self._ctx, self._sock, self._pid = ctx, sock, pid
        # A client dropped without close() must still close its socket before its context terminates.
        # Left to the garbage collector, a client in a reference cycle (a failed test's traceback, a
        # sampler and its announcer) takes its context and socket with it, and the collector may finalize
        # the context first: zmq_ctx_term then waits forever for the socket. The finalizer holds both, so
        # neither is garbage, and closes them in order (in the creating process only).
        self._finalizer = weakref.finalize(self, _close_zmq, sock, ctx, pid)
        self._finalizer.atexit = False
        return sock

    def _resolve_credentials(self) -> Optional[dict]:
        creds = self._credentials
        if creds is False:
            return None
        if creds is None and self.endpoint.startswith("tcp://"):
            env = Environment.from_env().credentials
            if env:
                creds = env
            else:
                from .. import registry

                for e in registry.entries():
                    if e.endpoint == self.endpoint and e.credentials:
                        creds = e.credentials
                        break
        if isinstance(creds, (str, os.PathLike)):
            creds = load_credentials(os.fspath(creds))
        return creds or None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_ctx"] = state["_sock"] = state["_pid"] = state["_finalizer"] = None  # sockets never cross processes
        return state

    def send_scores(self, paths: Sequence[str], values) -> bool:
        """Queue the raw per-sample values (e.g. losses) of one minibatch; never blocks.

        Args:
            paths: mount-relative file paths, shape (n,).
            values: n finite numbers (sent as float32).

        Returns:
            True if queued; False if the queue was full and the batch was dropped (counted in ``dropped``).

        Raises:
            ProtocolError: the batch is invalid (bad path, wrong length, NaN/inf, too large).
        """
        return self._send_oneway(P.encode_scores(paths, values))

    def resident(self, paths: Sequence[str]) -> np.ndarray:
        """Which of ``paths`` (mount-relative) are in a cache tier now: bool array of shape (n,).

        Raises:
            TimeoutError: no reply within ``timeout_s``.
            ControlError: the daemon rejected the request (e.g. ``unknown_path``).
        """
        rid = P.new_request_id()
        reply = self._request(rid, P.encode_resident_request(rid, paths))
        if not isinstance(reply, P.ResidentReply) or reply.flags.shape[0] != len(paths):
            raise P.ProtocolError("malformed", "resident reply does not match the request")
        return reply.flags

    def warm(self, paths: Sequence[str], timeout_s: Optional[float] = None) -> dict:
        """Read ``paths`` into the cache through the policies; returns outcome counts
        (``resident``, ``ram``, ``disk``, ``rejected``, ``failed``, ``bytes``).

        Raises:
            TimeoutError: no reply within ``timeout_s`` (default: the client's timeout).
            ControlError: the daemon rejected the request (e.g. ``unknown_path``).
        """
        rid = P.new_request_id()
        saved = self.timeout_s
        self.timeout_s = timeout_s or saved
        try:
            reply = self._request(rid, P.encode_warm_request(rid, paths))
        finally:
            self.timeout_s = saved
        if not isinstance(reply, P.WarmReply):
            raise P.ProtocolError("malformed", "warm reply expected")
        return reply.result

    def register(self, paths: Sequence[str], handle: bytes = b"") -> "tuple[bytes, int]":
        """Upload (part of) a dataset's path table for plans: ``handle`` b"" creates a table, an 8-byte
        handle appends to it. Returns (handle, table size so far).

        Raises:
            TimeoutError, ControlError (``unknown_path``, ``unknown_handle``, ``flood``), ProtocolError.
        """
        rid = P.new_request_id()
        reply = self._request(rid, P.encode_register_request(rid, handle, paths))
        if not isinstance(reply, P.RegisterReply):
            raise P.ProtocolError("malformed", "register reply expected")
        self.plan_format = reply.plan_format
        return reply.handle, reply.size

    def send_plan(self, handle: bytes, stream: int, first_epoch: int, segments: Sequence[int], ids, *,
                  window: int = 0, job: Optional[tuple] = None) -> bool:
        """Announce epochs ``first_epoch, ...`` of stream ``stream`` (uint32 table indices); never blocks.
        ``job``: ``(pid, start time)`` of the announcing process, sent (plan format 2) when the daemon's
        ``register`` reply said it reads it, else left out (format 1: the plan follows every open).

        Returns:
            True if queued, False if the send queue was full (counted in ``dropped``).

        Raises:
            ProtocolError: the plan is invalid (see :func:`shadefs.control.protocol.encode_plan`).
        """
        if self.plan_format < P.PLAN_FORMAT_JOB:
            job = None
        return self._send_oneway(P.encode_plan(handle, stream, first_epoch, segments, ids, window=window, job=job))

    def withdraw_plan(self, handle: bytes, stream: int) -> bool:
        """End stream ``stream``'s plan of table ``handle`` (``withdraw``, one-way; never blocks): the daemon
        drops it at once. Sent on the socket that sent the plans, it arrives after them.

        Returns:
            True if queued, False if the send queue was full (counted in ``dropped``).
        """
        return self._send_oneway(P.encode_withdraw(handle, stream))

    def stats(self) -> dict:
        """The daemon's stats JSON (``shadefs stats --json``), with ``scores_received``/``scores_rejected``.

        Raises:
            TimeoutError: no reply within ``timeout_s``.
            ControlError: the daemon failed to answer.
        """
        rid = P.new_request_id()
        reply = self._request(rid, P.encode_stats_request(rid))
        if not isinstance(reply, P.StatsReply):
            raise P.ProtocolError("malformed", "stats reply expected")
        return reply.stats

    def _send_oneway(self, frames) -> bool:
        """Queue a one-way message without blocking; False (counted in ``dropped``) when the queue is full."""
        import zmq

        try:
            self._socket().send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.dropped += 1
            return False
        self.sent += 1
        return True

    def _request(self, rid: bytes, frames):
        import zmq

        sock = self._socket()
        deadline = time.monotonic() + self.timeout_s
        if not sock.poll(self._ms_left(deadline), zmq.POLLOUT):
            raise TimeoutError(f"control endpoint {self.endpoint} did not accept a request within "
                               f"{self.timeout_s:g} s (is the shadefs daemon running?)")
        sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        while True:
            ms = self._ms_left(deadline)
            if ms <= 0 or not sock.poll(ms, zmq.POLLIN):
                raise TimeoutError(f"no reply from control endpoint {self.endpoint} within {self.timeout_s:g} s "
                                   "(is the shadefs daemon running?)")
            reply = P.decode_reply(sock.recv_multipart())
            if reply.request_id == rid:
                break
            if isinstance(reply, P.ErrorReply) and reply.request_id == b"":
                break  # the daemon could not read our id; nothing else is in flight on this socket
            # else: a late reply to an earlier request that timed out: skip it
        if isinstance(reply, P.ErrorReply):
            raise ControlError(reply.reason, f"control endpoint {self.endpoint}: {reply.message}")
        return reply

    @staticmethod
    def _ms_left(deadline: float) -> int:
        return max(0, int((deadline - time.monotonic()) * 1000))

    def close(self) -> None:
        """Close the socket (queued scores get ``linger_s`` to leave). Safe to call twice or after a fork."""
        fin = self._finalizer
        if fin is not None and self._pid == os.getpid():
            fin()  # closes the socket (queued scores get linger_s), then terminates the context
        elif fin is not None:
            fin.detach()  # created in the parent before a fork: never touched here
        self._sock = self._ctx = self._finalizer = None
        self._pid = None

    def __enter__(self) -> "ControlClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _close_zmq(sock, ctx, pid: int) -> None:
    # the socket first (its LINGER bounds how long queued messages may still leave), then the context
    if os.getpid() != pid:
        return  # a forked child's copy: the parent's objects are not touched
    sock.close()
    ctx.term()
