#!/usr/bin/env python3
"""A loopback proxy that makes a fast local server look like storage across a network link.

For machines without ``tc qdisc ... netem`` (the kernel module ``sch_netem`` is missing on many
containers and VMs), this proxy puts an emulated link between a client and a server on loopback:

- **one-way delay**: every chunk of bytes is delivered ``delay_ms`` after it reached the proxy, in
  both directions (1 ms each way = 2 ms RTT: every request/response exchange costs at least one RTT,
  as through ``netem delay 1ms`` on both ends). Chunks are queued, not delayed one after the other,
  so a long response costs one delay, not one per chunk (a delay *line*, like netem).
- **rate**: each direction is one link shared by all connections, serialising bytes at ``rate``
  bits/s (a token bucket with no burst allowance, like ``netem rate``): a chunk leaves the link
  ``len * 8 / rate`` seconds after the previous one left, then arrives ``delay_ms`` later.
- **connection set-up**: a new client connection costs one RTT before any byte flows (the handshake).

Two modes:

- ``http`` (default): the emulated link sits between the client and the proxy, and the proxy keeps
  the client's HTTP/1.1 connections alive, as S3 and every object store front end does. Each request
  is forwarded over a fresh, undelayed loopback connection to the server and its whole response is
  sent back on the kept-alive client connection (``Connection: close`` removed, a chunked body
  re-framed with Content-Length). Needed for moto: its werkzeug development server answers every
  request with ``Connection: close``, so without this each GET would pay a TCP handshake across the
  emulated link, which no S3 client pays against real S3. Requests with a body need Content-Length
  (``Expect: 100-continue`` is answered by the proxy).
- ``tcp``: a plain byte pipe through the link; any protocol, the server's connection handling kept.

TCP_NODELAY is set on every socket, so the proxy adds no Nagle/delayed-ACK stalls of its own.

Timing is done with threads and ``time.sleep``: on an idle machine a chunk arrives within ~0.1 ms of
its due time; on a loaded one it can be late by a scheduler tick. The proxy reports the mean and the
99th percentile of this lateness on exit, so a run can say how faithful the link was.

Command line (prints ``PORT <n>`` and a settings line on stdout once listening; SIGUSR1 prints one JSON
line of counters so far; SIGTERM/SIGINT stop it and print one JSON line of counters)::

    python -m shadefs.testing.latency_proxy --upstream 127.0.0.1:5000 [--port 0] [--delay-ms 1] \
        [--rate 1gbit] [--mode http]

As a library: ``LatencyProxy(upstream_port, delay_s=0.001, rate_bps=1e9).start()`` ... ``.close()``
(in-process), or :class:`shadefs.testing.s3.LatencyProxyProcess` (a child process, its own GIL).
"""
from __future__ import annotations

import argparse
import json
import queue
import re
import signal
import socket
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

__all__ = ["Link", "LatencyProxy", "parse_rate", "format_rate"]

CHUNK = 65536
MODES = ("http", "tcp")
_RATE = re.compile(r"^\s*([0-9.]+(?:e[0-9]+)?)\s*([kmgt]?)(bit|bps|b)?(?:/s)?\s*$", re.IGNORECASE)
_MULT = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_HOP = (b"connection", b"keep-alive", b"transfer-encoding", b"proxy-connection")


def parse_rate(text: str) -> float:
    """Return bits/s from ``1gbit``, ``100mbit``, ``1e9``, ``0`` (0 = unlimited).

    Raises:
        ValueError: not a rate.
    """
    m = _RATE.match(str(text))
    if not m:
        raise ValueError(f"not a rate: {text!r} (examples: 1gbit, 100mbit, 0 = unlimited)")
    return float(m.group(1)) * _MULT[m.group(2).lower()]


def format_rate(bps: float) -> str:
    if not bps:
        return "unlimited rate"
    for unit, mult in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= mult:
            return f"{bps / mult:g} {unit}"
    return f"{bps:g} bit/s"


class Link:
    """One direction of the emulated network: serialisation at ``rate_bps``, then ``delay_s``.

    ``due(n)`` returns the monotonic time at which a chunk of ``n`` bytes that reached the proxy now
    is to be delivered. Thread-safe; shared by every connection, like a real link.
    """

    def __init__(self, delay_s: float, rate_bps: float):
        self.delay_s = float(delay_s)
        self.bytes_per_s = float(rate_bps) / 8.0
        self._free_at = 0.0
        self._lock = threading.Lock()
        self.bytes = 0
        self.chunks = 0
        self.late_s: List[float] = []  # lateness of deliveries (the first 200k)

    def due(self, n: int, now: Optional[float] = None) -> float:
        now = time.monotonic() if now is None else now
        with self._lock:
            self.bytes += n
            self.chunks += 1
            if self.bytes_per_s > 0:
                self._free_at = max(now, self._free_at) + n / self.bytes_per_s
                leave = self._free_at
            else:
                leave = now
        return leave + self.delay_s

    def wait_until(self, due: float) -> None:
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        if len(self.late_s) < 200_000:
            self.late_s.append(max(0.0, time.monotonic() - due))


def _nodelay(s: socket.socket) -> None:
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


def _close(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            s.close()
        except OSError:
            pass


def _headers(head: bytes) -> Tuple[bytes, List[Tuple[bytes, bytes]]]:
    lines = head.split(b"\r\n")
    out = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        out.append((name.strip(), value.strip()))
    return lines[0], out


def _header(headers: List[Tuple[bytes, bytes]], name: bytes) -> Optional[bytes]:
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


def _dechunk(body: bytes) -> bytes:
    out, pos = [], 0
    while True:
        end = body.index(b"\r\n", pos)
        size = int(body[pos:end].split(b";", 1)[0], 16)
        pos = end + 2
        if size == 0:
            return b"".join(out)
        out.append(body[pos:pos + size])
        pos += size + 2


class LatencyProxy:
    """Listen on ``host:port`` and forward to ``upstream_host:upstream_port`` through two
    :class:`Link` objects (client->server, server->client); ``mode`` is ``"http"`` or ``"tcp"``."""

    def __init__(self, upstream_port: int, delay_s: float = 0.001, rate_bps: float = 1e9,
                 port: int = 0, upstream_host: str = "127.0.0.1", host: str = "127.0.0.1",
                 mode: str = "http"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.upstream = (upstream_host, int(upstream_port))
        self.delay_s = float(delay_s)
        self.rate_bps = float(rate_bps)
        self.mode = mode
        self.up = Link(delay_s, rate_bps)     # client -> server (requests)
        self.down = Link(delay_s, rate_bps)   # server -> client (responses)
        self.connections = 0
        self.requests = 0
        self.methods: Dict[str, int] = {}     # requests forwarded, by HTTP method
        self.get_body_bytes = 0               # response body bytes of successful GETs (the objects read)
        self.upstream_errors = 0
        self._count_lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(256)
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def settings(self) -> str:
        how = ("HTTP keep-alive to the client, a fresh loopback connection to the server per request"
               if self.mode == "http" else "plain TCP pipe")
        return (f"latency proxy 127.0.0.1:{self.port} -> {self.upstream[0]}:{self.upstream[1]}: "
                f"{self.delay_s * 1e3:g} ms each way ({2 * self.delay_s * 1e3:g} ms RTT), "
                f"{format_rate(self.rate_bps)} per direction, +1 RTT per new connection; {how}")

    def start(self) -> "LatencyProxy":
        self._thread = threading.Thread(target=self._accept_loop, name="proxy-accept", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def counters(self) -> Dict[str, object]:
        def late(link: Link) -> Dict[str, float]:
            xs = sorted(link.late_s)
            if not xs:
                return {"mean_ms": 0.0, "p99_ms": 0.0}
            return {"mean_ms": 1e3 * sum(xs) / len(xs), "p99_ms": 1e3 * xs[int(0.99 * (len(xs) - 1))]}

        with self._count_lock:
            methods = dict(self.methods)
        return {"mode": self.mode, "connections": self.connections, "requests": self.requests,
                "methods": methods, "gets": methods.get("GET", 0), "get_body_bytes": self.get_body_bytes,
                "upstream_errors": self.upstream_errors,
                "bytes_up": self.up.bytes, "bytes_down": self.down.bytes,
                "late_up": late(self.up), "late_down": late(self.down),
                "delay_ms": self.delay_s * 1e3, "rate_bps": self.rate_bps}

    # -- plumbing ----------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            target = self._serve_http if self.mode == "http" else self._serve_tcp
            threading.Thread(target=target, args=(conn,), name="proxy-conn", daemon=True).start()

    def _handshake(self) -> None:
        # One RTT before the first byte may flow; what the client sends meanwhile waits in the kernel.
        if self.delay_s > 0:
            time.sleep(2 * self.delay_s)

    @staticmethod
    def _reader(src: socket.socket, link: Link, q: "queue.Queue") -> None:
        """Bytes from ``src`` onto ``q``, each stamped with its due time on ``link``; None at the end."""
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                q.put((link.due(len(data)), data))
        except OSError:
            pass
        q.put((0.0, None))

    @staticmethod
    def _writer(dst: socket.socket, link: Link, q: "queue.Queue", on_error) -> None:
        """Deliver ``q``'s chunks to ``dst`` at their due times; a None chunk half-closes ``dst``."""
        try:
            while True:
                due, data = q.get()
                if data is None:
                    dst.shutdown(socket.SHUT_WR)
                    return
                link.wait_until(due)
                dst.sendall(data)
        except OSError:
            on_error()

    # -- tcp mode ----------------------------------------------------------------------------------
    def _serve_tcp(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream, timeout=30)
        except OSError:
            self.upstream_errors += 1
            _close(client)
            return
        server.settimeout(None)
        _nodelay(client)
        _nodelay(server)
        self._handshake()
        threads = []
        for src, dst, link in ((client, server, self.up), (server, client, self.down)):
            q: "queue.Queue" = queue.Queue()
            threads.append(threading.Thread(target=self._reader, args=(src, link, q), daemon=True))
            threads.append(threading.Thread(target=self._writer, daemon=True,
                                            args=(dst, link, q, lambda: _close(client, server))))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _close(client, server)

    # -- http mode ---------------------------------------------------------------------------------
    def _serve_http(self, client: socket.socket) -> None:
        _nodelay(client)
        self._handshake()
        q_in: "queue.Queue" = queue.Queue()
        q_out: "queue.Queue" = queue.Queue()
        reader = threading.Thread(target=self._reader, args=(client, self.up, q_in), daemon=True)
        writer = threading.Thread(target=self._writer, args=(client, self.down, q_out, lambda: _close(client)),
                                  daemon=True)
        reader.start()
        writer.start()
        buf = b""
        eof = False
        try:
            while not eof:
                # The next complete request, as it arrives across the link.
                while True:
                    request = self._take_request(buf)
                    if request is not None:
                        break
                    due, data = q_in.get()
                    if data is None:
                        eof = True
                        break
                    self.up.wait_until(due)
                    buf += data
                if request is None:
                    break
                head, body, buf, expect = request
                if expect:
                    self._send(q_out, b"HTTP/1.1 100 Continue\r\n\r\n")
                    continue  # the body follows; the request is taken again once it is complete
                response, close = self._forward(head, body)
                self._send(q_out, response)
                if close:
                    break
        except Exception:  # noqa: BLE001 - any failure ends this connection only; the client sees it
            self.upstream_errors += 1
        q_out.put((0.0, None))
        writer.join()
        _close(client)
        reader.join(timeout=5)

    def _send(self, q_out: "queue.Queue", data: bytes) -> None:
        for i in range(0, len(data), CHUNK):
            piece = data[i:i + CHUNK]
            q_out.put((self.down.due(len(piece)), piece))

    @staticmethod
    def _take_request(buf: bytes):
        """``(head, body, rest, expect_pending)`` once ``buf`` holds a whole request, else None.

        A request with ``Expect: 100-continue`` and no body yet returns once with expect_pending True
        (and the buffer untouched except that the Expect header is removed, so it returns only once).
        """
        if b"\r\n\r\n" not in buf:
            return None
        head, _, rest = buf.partition(b"\r\n\r\n")
        _, headers = _headers(head)
        if _header(headers, b"transfer-encoding") is not None:
            raise ValueError("chunked request bodies are not supported by the http mode")
        length = int(_header(headers, b"content-length") or 0)
        expect = (_header(headers, b"expect") or b"").lower() == b"100-continue"
        if expect:
            head = b"\r\n".join(ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"expect:"))
            if len(rest) < length:
                return head, b"", head + b"\r\n\r\n" + rest, True
        if len(rest) < length:
            return None
        return head, rest[:length], rest[length:], False

    @staticmethod
    def _read_response(up: socket.socket, method: bytes) -> Tuple[bytes, List[Tuple[bytes, bytes]], bytes]:
        """Read one response from ``up``: (status line, headers, de-chunked body).

        The body is delimited by Content-Length or chunking, as the client would delimit it (not by
        the server closing the connection: werkzeug closes it only some ms after the response).
        """
        buf = b""

        def more() -> bytes:
            data = up.recv(1 << 20)
            if not data:
                raise EOFError
            return data

        while True:
            try:
                while b"\r\n\r\n" not in buf:
                    buf += more()
            except EOFError:
                raise ValueError("truncated response from the server") from None
            head, _, buf = buf.partition(b"\r\n\r\n")
            status, headers = _headers(head)
            code = int(status.split(b" ")[1])
            if code >= 200:
                break  # else an interim 1xx response: the real one follows
        if method == b"HEAD" or code in (204, 304):
            return status, headers, b""
        if (_header(headers, b"transfer-encoding") or b"").lower() == b"chunked":
            while True:
                try:
                    return status, headers, _dechunk(buf)
                except (ValueError, IndexError):
                    try:
                        buf += more()
                    except EOFError:
                        raise ValueError("truncated chunked response from the server") from None
        length = _header(headers, b"content-length")
        try:
            if length is None:  # delimited by the end of the connection
                while True:
                    buf += more()
            while len(buf) < int(length):
                buf += more()
        except EOFError:
            if length is not None:
                raise ValueError("truncated response from the server") from None
        return status, headers, buf if length is None else buf[:int(length)]

    def _forward(self, head: bytes, body: bytes) -> Tuple[bytes, bool]:
        """One request over a fresh loopback connection; returns (response for the client, close?)."""
        start, headers = _headers(head)
        method = start.split(b" ", 1)[0].upper()
        name = method.decode("ascii", "replace")
        with self._count_lock:
            self.requests += 1
            self.methods[name] = self.methods.get(name, 0) + 1
        client_close = (_header(headers, b"connection") or b"").lower() == b"close"
        out_head = b"\r\n".join([start] + [k + b": " + v for k, v in headers if k.lower() not in _HOP]
                                + [b"Connection: close"]) + b"\r\n\r\n"
        with socket.create_connection(self.upstream, timeout=60) as up:
            _nodelay(up)
            up.sendall(out_head + body)
            status, rheaders, rbody = self._read_response(up, method)
        code = int(status.split(b" ")[1])
        if method == b"GET" and 200 <= code < 300:
            with self._count_lock:
                self.get_body_bytes += len(rbody)
        kept = [(k, v) for k, v in rheaders if k.lower() not in _HOP]
        if method != b"HEAD" and code >= 200 and code not in (204, 304):
            kept = [(k, v) for k, v in kept if k.lower() != b"content-length"]
            kept.append((b"Content-Length", str(len(rbody)).encode()))
        if client_close:
            kept.append((b"Connection", b"close"))
        return b"\r\n".join([status] + [k + b": " + v for k, v in kept]) + b"\r\n\r\n" + rbody, client_close


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Loopback proxy adding a fixed one-way delay and a rate "
                                            "limit per direction (a netem stand-in).")
    p.add_argument("--upstream", required=True, metavar="HOST:PORT", help="the server to forward to")
    p.add_argument("--port", type=int, default=0, help="listen port on 127.0.0.1 (default: a free one)")
    p.add_argument("--delay-ms", type=float, default=1.0, help="one-way delay per direction (default 1)")
    p.add_argument("--rate", default="1gbit", help="rate per direction: 1gbit, 100mbit, 0 = unlimited")
    p.add_argument("--mode", choices=MODES, default="http",
                   help="http: keep client connections alive (default); tcp: plain byte pipe")
    args = p.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    proxy = LatencyProxy(int(port), args.delay_ms / 1e3, parse_rate(args.rate), port=args.port,
                         upstream_host=host or "127.0.0.1", mode=args.mode)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # SIGUSR1: print the counters so far (one JSON line), e.g. per epoch of a benchmark
    signal.signal(signal.SIGUSR1, lambda *_: print(json.dumps(proxy.counters()), flush=True))
    proxy.start()
    print(f"PORT {proxy.port}", flush=True)
    print(proxy.settings(), flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        proxy.close()
        print(json.dumps(proxy.counters()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
