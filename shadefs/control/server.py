"""The daemon's control endpoint: one ZeroMQ ROUTER socket per mount, served on a daemon thread.

It receives ``scores`` (one-way), answers ``resident``, ``stats`` and ``warm`` (docs/protocol.md; warm on a
worker thread, the reply sent by the control thread when it is done), validates every
message with :mod:`shadefs.control.protocol` and resolves paths against the mount's snapshot. A bad
message is counted under its reason and logged (at most once a second); it never stops the thread, and
neither does an exception from the handler (logged with its traceback, answered with ``error``).

It must never start before the FUSE daemon forks: :meth:`ControlServer.start` creates the ZeroMQ context,
binds and starts the thread, so call it from FUSE ``init()``. :func:`validate_endpoint` has no side
effects and is what the CLI calls before forking, so a bad ``--control`` fails in the foreground.
"""
from __future__ import annotations

import concurrent.futures as cf
import errno
import hashlib
import ipaddress
import logging
import os
import queue
import socket
import stat
import threading
import time
from typing import Dict, Optional

import numpy as np

from ..logutil import RateLimitedLog
from . import protocol as P

__all__ = ["ControlServer", "validate_endpoint", "runtime_dir", "load_curve_secret", "load_authorized_keys"]

log = logging.getLogger("shadefs.control")

#: ZMQ_MAXMSGSIZE is per frame; anything above the codec's limit is still received (and counted as
#: ``oversize``) up to this slack, beyond which ZeroMQ itself drops the connection.
MAXMSGSIZE_SLACK = 2**20
_IPC_PATH_MAX = 107  # sun_path is 108 bytes with the terminating NUL


# -- endpoints ----------------------------------------------------------------------------------

def validate_endpoint(url: Optional[str], allow_remote: bool = False, *,
                      curve_secret_key_file: Optional[str] = None) -> Optional[str]:
    """Check a ``--control`` endpoint before the daemon forks; no side effects.

    Accepted: ``None`` (the private default ``ipc://`` socket), ``ipc:///absolute/path`` in an existing
    directory, ``tcp://HOST:PORT`` where HOST is a loopback address (``127.0.0.0/8``, ``[::1]``,
    ``localhost``) unless ``allow_remote``, and PORT is a number (0 or ``*``: any free port).

    Args:
        url: the endpoint URL or None.
        allow_remote: allow a non-loopback TCP host (any interface, ``*``, ``0.0.0.0``, a hostname).
        curve_secret_key_file: a CURVE secret key file (TCP only; see :func:`load_curve_secret`).

    Returns:
        ``url`` unchanged (None for the default).

    Raises:
        ValueError: the endpoint or the key file is unusable; the message says what to pass instead.
    """
    if url is None:
        if curve_secret_key_file:
            raise ValueError("CURVE encryption applies to tcp:// control endpoints only; "
                             "pass --control tcp://127.0.0.1:PORT with the key file")
        return None
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("ipc", "tcp"):
        raise ValueError(f"control endpoint {url!r}: use ipc:///absolute/path.sock or tcp://127.0.0.1:PORT")
    if scheme == "ipc":
        if curve_secret_key_file:
            raise ValueError("CURVE encryption applies to tcp:// control endpoints only")
        if rest.startswith("@"):
            raise ValueError(f"control endpoint {url!r}: abstract unix sockets have no permissions; "
                             "use a path (ipc:///path.sock)")
        if not os.path.isabs(rest):
            raise ValueError(f"control endpoint {url!r}: the ipc path must be absolute (ipc:///path.sock)")
        if len(os.fsencode(rest)) > _IPC_PATH_MAX:
            raise ValueError(f"control endpoint {url!r}: ipc paths are limited to {_IPC_PATH_MAX} bytes")
        if not os.path.isdir(os.path.dirname(rest)):
            raise ValueError(f"control endpoint {url!r}: directory {os.path.dirname(rest)!r} does not exist")
        return url
    host, port = _split_host_port(url, rest)
    if not _is_loopback(host) and not allow_remote:
        raise ValueError(
            f"control endpoint {url!r} is not a loopback address: anyone who can reach it could send "
            "scores and read stats. Use tcp://127.0.0.1:PORT, or pass --control-allow-remote "
            "(preferably with a CURVE key) to bind it anyway")
    if curve_secret_key_file:
        load_curve_secret(curve_secret_key_file)
    return url


def _split_host_port(url: str, rest: str):
    if ";" in rest:
        raise ValueError(f"control endpoint {url!r}: source-address syntax is not supported")
    if rest.startswith("["):
        host, sep, tail = rest[1:].partition("]")
        if not sep or not tail.startswith(":"):
            raise ValueError(f"control endpoint {url!r}: write IPv6 as tcp://[::1]:PORT")
        port = tail[1:]
    else:
        host, sep, port = rest.rpartition(":")
        if not sep or not host:
            raise ValueError(f"control endpoint {url!r}: expected tcp://HOST:PORT")
    if port != "*":
        if not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"control endpoint {url!r}: port must be 0-65535 or *")
    return host, port


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # '*', an interface name or a hostname: could be anything
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def load_curve_secret(path: str):
    """Read a CURVE secret key file as written by ``zmq.auth.create_certificates(dir, name)``
    (``name.key_secret``: a ZPL text file with ``curve: public-key = "..."`` and ``secret-key = "..."``,
    Z85-encoded). Returns ``(public_key, secret_key)`` (bytes, Z85).

    Raises:
        ValueError: the file is missing, unreadable or holds no secret key.
    """
    import zmq.auth

    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"CURVE key file {path!r}: {e}") from None
    if not secret:
        raise ValueError(f"CURVE key file {path!r} holds no secret key; pass the NAME.key_secret file "
                         "written by zmq.auth.create_certificates")
    return public, secret


def load_authorized_keys(path: str) -> set:
    """Read a file of CURVE client public keys: one Z85 key (40 characters, 32 bytes) a line; blank lines
    and lines starting with ``#`` are ignored. Returns the keys (a set of bytes, Z85), at least one.

    The file must belong to this process's user or root and be writable by no one else: whoever can
    write it can admit a key of their own.

    Raises:
        ValueError: the file is unreadable, writable by others, holds no key, or a line is not a Z85
            public key (named by its line number).
    """
    from zmq.utils import z85

    try:
        with open(path, encoding="ascii", errors="replace") as f:
            st = os.fstat(f.fileno())
            lines = f.read().splitlines()
    except OSError as e:
        raise ValueError(f"{path!r}: {e.strerror}") from None
    if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
        owner = "root" if os.geteuid() == 0 else f"uid {os.geteuid()} or root"
        raise ValueError(f"{path!r} can be changed by others (owner uid {st.st_uid}, mode "
                         f"{stat.S_IMODE(st.st_mode):o}): whoever writes it admits their keys; "
                         f"chmod go-w it and keep it owned by {owner}")
    keys = set()
    for n, line in enumerate(lines, 1):
        key = line.strip()
        if not key or key.startswith("#"):
            continue
        try:
            ok = len(key) == 40 and len(z85.decode(key.encode())) == 32
        except (ValueError, KeyError, TypeError, UnicodeEncodeError):
            ok = False
        if not ok:
            raise ValueError(f"{path!r} line {n}: not a CURVE public key (40 Z85 characters, as in the "
                             "public-key line of a zmq.auth certificate)")
        keys.add(key.encode())
    if not keys:
        raise ValueError(f"{path!r} holds no public key")
    return keys


def runtime_dir() -> str:
    """Create (0700) or check the private directory for default control sockets, and return it.

    ``$XDG_RUNTIME_DIR/shadefs`` if that variable is set, else ``/run/shadefs`` for root when ``/run`` is
    writable, else ``/tmp/shadefs-<uid>``.

    Raises:
        PermissionError: the directory exists but is not ours, not a directory, or group/other can
            access it (a symlink or someone else's directory in /tmp could intercept our scores).
        OSError: it cannot be created.
    """
    from ..fsutil import private_dir

    return private_dir(_runtime_dir_path(), "the control socket")


def _runtime_dir_path() -> str:
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "shadefs")
    if os.geteuid() == 0 and os.access("/run", os.W_OK):
        return "/run/shadefs"
    return f"/tmp/shadefs-{os.geteuid()}"


def default_socket_name(mountpoint: str, pid: int) -> str:
    """``<16 hex digits>.sock`` from a hash of the absolute mountpoint and the daemon's pid."""
    # abspath, not realpath: stat-ing the mountpoint from FUSE init() would wait on ourselves.
    key = f"{os.path.abspath(mountpoint)}\0{pid}".encode("utf-8", "surrogateescape")
    return hashlib.sha256(key).hexdigest()[:16] + ".sock"


def _check_ipc_path_free(path: str) -> None:
    # ZeroMQ unlinks whatever is at an ipc path before binding: never let it delete a file or steal a
    # live daemon's socket.
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ValueError(f"{path} exists and is not a socket; refusing to replace it")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(path)
    except OSError:
        return  # stale socket of a dead daemon: ZeroMQ replaces it
    finally:
        s.close()
    raise ValueError(f"{path} is in use by a running process; pick another control endpoint")


# -- the server ---------------------------------------------------------------------------------
#: Warm requests queued or running at once (one runs at a time); one more is refused (``flood``).
MAX_WARM_QUEUED = 4
# seconds between two checks of the descriptors free while serving (ControlServer._guard_listener)
LISTENER_CHECK_S = 0.1
# descriptors a ZeroMQ context needs to start serving: its pollers and mailboxes (epoll, eventfd: 6), the
# socket's mailbox, the listener, the CURVE authenticator's sockets; libzmq aborts the process, not fails,
# when it cannot create a poller (EMFILE), so ControlServer.start refuses with fewer free
CONTEXT_DESCRIPTORS = 16


class _AllowedKeys:
    """ZAP CURVE credentials provider: a client may connect if its public key (Z85) is in ``keys``
    (or any key, for an explicitly configured server key without a client list)."""

    def __init__(self, keys, any_key: bool = False):
        self.keys = set(keys)
        self.any_key = any_key

    def callback(self, domain, key: bytes) -> bool:
        return self.any_key or key in self.keys


class ControlServer:
    """Serve the control protocol for one mount.

    Args:
        endpoint: a URL accepted by :func:`validate_endpoint`, or None for a private ``ipc://`` socket in
            :func:`runtime_dir` named by :func:`default_socket_name`.
        handler: the daemon: ``namespace`` (:class:`shadefs.namespace.Namespace`), ``stats() -> dict``,
            ``apply_scores(fids int64 (n,), values float32 (n,))`` (RAW values of one minibatch),
            ``resident(fids int64 (n,)) -> bool (n,)``, ``warm(fids int64 (n,)) -> dict``. Called from the
            server thread only, except ``warm``, which runs on one worker thread (one warm at a time) so
            that scores, residency and stats are answered while a warm reads.
        mountpoint: names the default socket.
        allow_remote: allow a non-loopback TCP endpoint.
        curve_secret_key_file: enable CURVE encryption (TCP) with this server secret key file.
        curve_authorized_clients: with CURVE, a directory of client public key files (``*.key``); only
            those clients (and the generated one, see below) may connect.
        curve_authorized_keys: with CURVE, a file of client public keys (:func:`load_authorized_keys`,
            ``--control-authorized-keys``); only those clients (and the generated one) may connect.
            Without either, and with ``curve_secret_key_file``, any client knowing the server's public
            key may (the CLI refuses that).
        insecure: serve a ``tcp://`` endpoint without CURVE (``--control-insecure``): any local user can
            then send scores and warm requests.

    A ``tcp://`` endpoint is CURVE-encrypted and authenticated unless ``insecure``: the server key pair is
    ``curve_secret_key_file``'s or generated at :meth:`start`, and a client key pair is generated there
    too; :attr:`credentials` holds ``{"server_public", "client_public", "client_secret"}`` (Z85 str),
    which the daemon writes into its 0600 registry file for clients of the same user to find
    (:mod:`shadefs.registry`). A client without them gets no answer; its messages are never read.
        max_message_bytes, max_paths: the ``oversize`` limits (default: the protocol's).

    Raises:
        ValueError: the endpoint or key file is invalid (as :func:`validate_endpoint`).
    """

    def __init__(self, endpoint: Optional[str], handler, *, mountpoint: str, allow_remote: bool = False,
                 curve_secret_key_file: Optional[str] = None, curve_authorized_clients: Optional[str] = None,
                 curve_authorized_keys: Optional[str] = None, insecure: bool = False,
                 max_message_bytes: int = P.MAX_MESSAGE_BYTES, max_paths: int = P.MAX_PATHS):
        self._requested = validate_endpoint(endpoint, allow_remote, curve_secret_key_file=curve_secret_key_file)
        self._handler = handler
        self._mountpoint = mountpoint
        self._curve = load_curve_secret(curve_secret_key_file) if curve_secret_key_file else None
        self._curve_clients = curve_authorized_clients
        if curve_authorized_clients and not self._curve:
            raise ValueError("curve_authorized_clients needs curve_secret_key_file")
        if curve_authorized_keys and not self._curve:
            raise ValueError("curve_authorized_keys needs curve_secret_key_file")
        self._curve_keys = load_authorized_keys(curve_authorized_keys) if curve_authorized_keys else set()
        self._insecure = bool(insecure)
        if self._insecure and self._curve:
            raise ValueError("--control-insecure and a CURVE key exclude each other")
        #: CURVE credentials a client needs (``tcp://`` without ``insecure``), set by :meth:`start`.
        self.credentials: Optional[dict] = None
        self.max_message_bytes = int(max_message_bytes)
        self.max_paths = int(max_paths)
        self._endpoint: Optional[str] = None
        self._ipc_path: Optional[str] = None
        self._lock = threading.Lock()
        self._received = 0
        self._plans = 0
        self._rejected: Dict[str, int] = {r: 0 for r in P.REASONS}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._ctx = self._sock = self._auth = None
        self._term_on_exit = False
        self._log_reject = RateLimitedLog(log)
        self._log_error = RateLimitedLog(log)
        # warm requests run on a worker; their replies come back through this queue and the control
        # thread sends them (a ZeroMQ socket stays on one thread)
        self._warm_pool: Optional[cf.ThreadPoolExecutor] = None
        self._warm_done: "queue.SimpleQueue" = queue.SimpleQueue()
        self._warm_pending = 0
        #: the daemon's descriptor reserve (:class:`shadefs.procutil.FdReserve`), or None: with it the
        #: endpoint is unbound while descriptors run out (:meth:`_guard_listener`)
        self.fds = None
        self._guard_at = 0.0
        self._unbound = False

    # -- lifecycle --------------------------------------------------------------------------------
    @property
    def endpoint(self) -> Optional[str]:
        """The bound URL (for ``tcp://…:0`` with the real port); None before :meth:`start`."""
        return self._endpoint

    def start(self) -> None:
        """Create the ZeroMQ context, bind and start serving on a daemon thread (after the FUSE fork).

        Raises:
            RuntimeError: already started.
            PermissionError, ValueError, zmq.ZMQError: the endpoint cannot be bound (nothing is left running).
            OSError: EMFILE, fewer than :data:`CONTEXT_DESCRIPTORS` file descriptors free below the soft
                limit (with :attr:`fds`): libzmq would abort the process creating its pollers.
        """
        import zmq

        if self._thread is not None:
            raise RuntimeError("control server already started")
        free = self.fds.free() if self.fds is not None else CONTEXT_DESCRIPTORS
        if free < CONTEXT_DESCRIPTORS:
            raise OSError(errno.EMFILE, f"control endpoint not started: {free} file descriptors free below the "
                          f"soft limit, a ZeroMQ context needs {CONTEXT_DESCRIPTORS}")
        url = self._requested
        if url is None:
            url = "ipc://" + os.path.join(runtime_dir(), default_socket_name(self._mountpoint, os.getpid()))
        if url.startswith("ipc://"):
            _check_ipc_path_free(url[len("ipc://"):])
        ctx = zmq.Context()
        try:
            sock = ctx.socket(zmq.ROUTER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes + MAXMSGSIZE_SLACK)
            if url.startswith("tcp://["):
                sock.setsockopt(zmq.IPV6, 1)
            tcp = url.startswith("tcp://")
            curve = self._curve
            if curve is None and tcp and not self._insecure:
                curve = zmq.curve_keypair()  # a fresh server key pair for this mount
            if curve:
                from zmq.auth.thread import ThreadAuthenticator

                client_public, client_secret = zmq.curve_keypair()
                allowed = _AllowedKeys({client_public} | self._curve_keys,
                                       any_key=bool(self._curve and not self._curve_clients and not self._curve_keys))
                if self._curve_clients:
                    import zmq.auth

                    allowed.keys.update(zmq.auth.load_certificates(self._curve_clients))
                self._auth = ThreadAuthenticator(ctx, log=logging.getLogger("shadefs.control.auth"))
                self._auth.start()
                self._auth.configure_curve_callback(domain="*", credentials_provider=allowed)
                sock.curve_publickey, sock.curve_secretkey = curve
                sock.curve_server = True
                self.credentials = {"server_public": curve[0].decode(), "client_public": client_public.decode(),
                                    "client_secret": client_secret.decode()}
            elif tcp:
                log.warning("control endpoint %s accepts unauthenticated, unencrypted clients "
                            "(--control-insecure): any local user can send scores and warm requests", url)
            sock.bind(url)
            self._endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            if url.startswith("ipc://"):
                self._ipc_path = url[len("ipc://"):]
                os.chmod(self._ipc_path, 0o600)
        except BaseException:
            if self._auth is not None:
                self._auth.stop()
                self._auth = None
            ctx.destroy(linger=0)
            raise
        self._ctx, self._sock = ctx, sock
        self._stop.clear()
        self._term_on_exit = False
        self._warm_pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="shadefs-warm")
        self._thread = threading.Thread(target=self._serve, name="shadefs-control", daemon=True)
        self._thread.start()
        log.info("control endpoint %s%s", self._endpoint,
                 " (CURVE: clients need this mount's credentials, see docs/operations.md)" if self.credentials else "")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving, close the socket and remove an ipc socket file. Idempotent."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        if self._warm_pool is not None:  # a warm in progress finishes its current reads; its reply is dropped
            self._warm_pool.shutdown(wait=False, cancel_futures=True)
            self._warm_pool = None
        if thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if thread is threading.current_thread():
            self._term_on_exit = True  # called from a handler: the loop terminates the context on exit
        elif thread.is_alive():
            # A handler call is stuck: terminating the context would block on its socket; leak it.
            log.error("control server thread did not stop within %g s", timeout)
        else:
            self._ctx.term()
            self._ctx = None
        if self._ipc_path:
            try:
                os.unlink(self._ipc_path)
            except FileNotFoundError:
                pass
            self._ipc_path = None

    def __enter__(self) -> "ControlServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def counters(self) -> dict:
        """``{"scores_received": int, "plans_received": int, "scores_rejected": {reason: int}}``.

        ``scores_received`` counts accepted ``scores`` messages, ``plans_received`` accepted ``plan``
        messages; ``scores_rejected`` counts every rejected
        inbound message (whatever its kind: one that fails early has no kind to trust) by reason, all
        reasons present.
        """
        with self._lock:
            return {"scores_received": self._received, "plans_received": self._plans,
                    "scores_rejected": dict(self._rejected)}

    # -- the thread -------------------------------------------------------------------------------
    def _serve(self) -> None:
        import zmq

        sock = self._sock
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                try:
                    ready = poller.poll(5 if self._warm_pending else 100)
                    self._guard_listener(sock)
                    self._send_warm_replies(sock)
                    if not ready:
                        continue
                    for _ in range(1000):  # drain a burst, then look at the stop flag again
                        try:
                            ident = sock.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        frames, total = self._recv_rest(sock)
                        self._handle(sock, ident, frames, total)
                except zmq.ContextTerminated:
                    break
                except Exception:  # never let the thread die
                    self._log_error(logging.ERROR, "control server loop failed", exc_info=True)
                    time.sleep(0.01)  # a persistent socket error must not spin a core
        finally:
            sock.close(linger=0)  # stop() terminates the context, after the authenticator
            self._sock = None
            if self._term_on_exit:
                self._ctx.term()
                self._ctx = None

    def _guard_listener(self, sock) -> None:
        # libzmq's ipc listener aborts the whole process when an accept fails with EMFILE (its tcp listener
        # drops the connection instead): with fewer than a quarter of the reserve free (2 at least) the
        # endpoint is unbound, so that no accept runs at the limit; clients' connects are refused and
        # retried (ZeroMQ reconnects) until it is bound again, with half the reserve free (4 at least).
        # Connected clients keep being served. Checked at most every LISTENER_CHECK_S.
        fds = self.fds
        now = time.monotonic()
        if fds is None or now - self._guard_at < LISTENER_CHECK_S:
            return
        self._guard_at = now
        free = fds.free()
        if not self._unbound and free < max(2, fds.reserve // 4):
            try:
                sock.unbind(self._endpoint)
            except Exception as e:  # noqa: BLE001  (zmq.ZMQError: it stays bound; tried again next check)
                self._log_error(logging.WARNING, "control: unbinding %s failed (%s)", self._endpoint, e)
                return
            self._unbound = True
            log.warning("control endpoint %s closed: %d file descriptors free below the soft limit %d (a "
                        "connection accepted at the limit would abort the daemon); open again once %d are free",
                        self._endpoint, free, fds.limit(), max(4, fds.reserve // 2))
        elif self._unbound and free >= max(4, fds.reserve // 2):
            try:
                sock.bind(self._endpoint)
                if self._ipc_path:
                    os.chmod(self._ipc_path, 0o600)
            except Exception as e:  # noqa: BLE001  (zmq.ZMQError, OSError: tried again next check)
                self._log_error(logging.WARNING, "control: binding %s again failed (%s)", self._endpoint, e)
                return
            self._unbound = False
            log.warning("control endpoint %s open again: %d file descriptors free", self._endpoint, free)

    def _recv_rest(self, sock):
        # Keep at most MAX_FRAMES + 1 frames and at most max_message_bytes; count the true total.
        import zmq

        frames, total = [], 0
        while sock.getsockopt(zmq.RCVMORE):
            f = sock.recv()
            total += len(f)
            if len(frames) <= P.MAX_FRAMES and total <= self.max_message_bytes:
                frames.append(f)
        return frames, total

    def _handle(self, sock, ident: bytes, frames, total: int) -> None:
        try:
            msg = P.decode_request(frames, total_bytes=total, max_bytes=self.max_message_bytes,
                                   max_paths=self.max_paths)
            if isinstance(msg, P.StatsRequest):
                self._reply(sock, ident, P.encode_stats_reply(msg.request_id, self._stats()))
                return
            if isinstance(msg, P.PlanMessage):
                self._handler.apply_plan(msg)  # raises ProtocolError (unknown_handle, unknown_path, flood)
                with self._lock:
                    self._plans += 1
                return
            if isinstance(msg, P.PlanWithdraw):
                self._handler.withdraw_plan(msg.handle, msg.stream)
                return
            fids = self._file_ids(msg.paths)
            if isinstance(msg, P.RegisterRequest):
                handle, size = self._handler.register_paths(msg.handle or None, fids)
                self._reply(sock, ident, P.encode_register_reply(msg.request_id, handle, size))
                return
            if isinstance(msg, P.Scores):
                with self._lock:
                    self._received += 1
                self._handler.apply_scores(fids, msg.values)
            elif isinstance(msg, P.WarmRequest):
                self._start_warm(ident, msg.request_id, fids)
            else:
                flags = np.asarray(self._handler.resident(fids), dtype=bool).reshape(-1)
                if flags.shape != fids.shape:
                    raise RuntimeError(f"resident() answered {flags.shape[0]} flags for {fids.shape[0]} paths")
                self._reply(sock, ident, P.encode_resident_reply(msg.request_id, flags))
        except P.ProtocolError as e:
            with self._lock:
                self._rejected[e.reason] += 1
            self._log_reject(logging.WARNING, "control: rejected a message (%s)", e)
            if P.wants_reply(frames):
                self._reply(sock, ident, P.encode_error_reply(P.error_reply_id(frames), str(e)))
        except Exception as e:
            self._log_error(logging.ERROR, "control: handler failed", exc_info=True)
            if P.wants_reply(frames):
                self._reply(sock, ident, P.encode_error_reply(
                    P.error_reply_id(frames), f"internal error: {type(e).__name__}: {e}"[:500]))

    def _start_warm(self, ident: bytes, request_id: bytes, fids: np.ndarray) -> None:
        """Run ``handler.warm`` on the warm worker; the control thread keeps answering meanwhile and sends
        the reply when the worker is done (:meth:`_send_warm_replies`). Warm requests run one at a time."""

        def job():
            try:
                frames = P.encode_warm_reply(request_id, self._handler.warm(fids))
            except Exception as e:
                self._log_error(logging.ERROR, "control: warm failed", exc_info=True)
                frames = P.encode_error_reply(request_id, f"internal error: {type(e).__name__}: {e}"[:500])
            self._warm_done.put((ident, frames))

        if self._warm_pending >= MAX_WARM_QUEUED:  # each holds its ids until it runs: bound them
            raise P.ProtocolError("flood", f"{self._warm_pending} warm requests are queued already (at most "
                                  f"{MAX_WARM_QUEUED}); send the next one when one is answered")
        self._warm_pending += 1
        try:
            self._warm_pool.submit(job)
        except RuntimeError:  # shutting down
            self._warm_pending -= 1

    def _send_warm_replies(self, sock) -> None:
        while True:
            try:
                ident, frames = self._warm_done.get_nowait()
            except queue.Empty:
                return
            self._warm_pending -= 1
            self._reply(sock, ident, frames)

    def _file_ids(self, paths) -> np.ndarray:
        ns = self._handler.namespace
        fids = np.empty(len(paths), dtype=np.int64)
        for i, p in enumerate(paths):
            fid = ns.file_id(p)
            if fid is None:
                raise P.ProtocolError("unknown_path", f"not a file of this mount: {p!r}"[:300])
            fids[i] = fid
        return fids

    def _stats(self) -> dict:
        stats = dict(self._handler.stats())
        stats.update(self.counters())
        return stats

    def _reply(self, sock, ident: bytes, frames) -> None:
        import zmq

        try:
            sock.send_multipart([ident] + frames, flags=zmq.NOBLOCK)
        except zmq.ZMQError as e:  # the peer is gone or its queue is full: the reply is dropped
            self._log_error(logging.WARNING, "control: reply dropped (%s)", e)
