"""A real S3 server for tests and benchmarks: ``python -m moto.server`` and the latency proxy, as processes.

- :class:`MotoServer`: moto's S3 server as a child process on a free loopback port. ``stop()`` kills it
  (an outage); ``start()`` again brings it back on the same port (moto keeps no state: seed again).
- :class:`LatencyProxyProcess`: :mod:`shadefs.testing.latency_proxy` as a child process (its own GIL,
  away from the code measured), adding a one-way delay and a rate limit in front of moto.
- :data:`DUMMY_AWS_ENV`: credentials and settings so that boto3/s3fs never reach a real AWS account,
  proxy or instance-metadata endpoint.

Needs the ``test`` extra (moto[server], boto3, s3fs).
"""
from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, Optional

__all__ = ["DUMMY_AWS_ENV", "AWS_ENV_DROP", "free_port", "stop_process", "MotoServer", "LatencyProxyProcess"]

#: environment for S3 clients and daemons talking to moto (dummy keys, no shared config, no proxy)
DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/nonexistent/shadefs-test-aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/shadefs-test-aws-credentials",
    "AWS_EC2_METADATA_DISABLED": "true", "NO_PROXY": "127.0.0.1,localhost",
}
#: variables to remove from that environment
AWS_ENV_DROP = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "HTTP_PROXY", "HTTPS_PROXY",
                "http_proxy", "https_proxy")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (bound to port 0, then released)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def stop_process(proc: Optional[subprocess.Popen], timeout: float = 10.0) -> None:
    """SIGTERM, wait up to ``timeout`` s, then SIGKILL; a no-op for None or an exited process."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


class _LoopbackServer:
    """What both servers below share: a child process ``proc`` serving HTTP on ``127.0.0.1:port``;
    ``with`` starts it (unless started already) and stops it. Subclasses set ``proc`` and ``port`` and give
    ``start()`` and ``stop()``."""

    proc: Optional[subprocess.Popen]
    port: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc else None

    def __enter__(self):
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class MotoServer(_LoopbackServer):
    """``python -m moto.server -H 127.0.0.1 -p PORT`` as a child process.

    ``port`` 0 picks a free one. ``start(timeout_s)`` returns once ``/moto-api/`` answers, raising
    RuntimeError if the process exits or does not answer in time. ``stop()`` kills it (SIGKILL: an
    outage, not a shutdown). ``log_file``: where its output goes (default: discarded). ``own_group``: start
    it in a session (so a process group) of its own, so that a terminal's Ctrl-C reaches only its parent,
    which stops it when it is done with it."""

    def __init__(self, port: int = 0, log_file: Optional[str] = None, own_group: bool = False):
        self.port = port or free_port()
        self.log_file = log_file
        self.own_group = own_group
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout_s: float = 60.0) -> "MotoServer":
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                          "-p", str(self.port)], stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=self.own_group)
        finally:
            if self.log_file:
                out.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode} (port {self.port})")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
                conn.request("GET", "/moto-api/")
                conn.getresponse().read()
                conn.close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"moto server did not answer on port {self.port} within {timeout_s:g} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def reset(self) -> None:
        """Drop every bucket and object (moto's ``/moto-api/reset``)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("POST", "/moto-api/reset")
        conn.getresponse().read()
        conn.close()

    def client(self):
        """A boto3 S3 client for this server (region us-east-1)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")



class LatencyProxyProcess(_LoopbackServer):
    """``python -m shadefs.testing.latency_proxy`` in front of ``127.0.0.1:upstream_port``.

    ``delay_ms``: one-way delay per direction (ms); ``rate``: per-direction rate ("1gbit"); ``mode``:
    "http" (keep-alive to the client) or "tcp"; ``own_group``: as :class:`MotoServer`'s. After ``start()``:
    ``port``, ``endpoint``, ``settings`` (its one-line description). After ``stop()``: ``counters`` (its
    final JSON line: requests, connections, lateness of its timers)."""

    def __init__(self, upstream_port: int, delay_ms: float, rate: str, mode: str = "http",
                 own_group: bool = False):
        self.args = [sys.executable, "-m", "shadefs.testing.latency_proxy", "--upstream",
                     f"127.0.0.1:{upstream_port}", "--delay-ms", str(delay_ms), "--rate", rate, "--mode", mode]
        self.proc: Optional[subprocess.Popen] = None
        self.own_group = own_group
        self.port = 0
        self.settings = ""
        self.counters: Dict[str, Any] = {}

    def start(self) -> "LatencyProxyProcess":
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, text=True,
                                     start_new_session=self.own_group)
        first = self.proc.stdout.readline().split()
        if len(first) != 2 or first[0] != "PORT":
            stop_process(self.proc)
            raise RuntimeError(f"latency proxy did not start: {first}")
        self.port = int(first[1])
        self.settings = self.proc.stdout.readline().strip()
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=10)
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            if lines:
                self.counters = json.loads(lines[-1])
        except (subprocess.TimeoutExpired, ValueError):
            pass
        stop_process(self.proc)
        self.proc = None

    def snapshot(self) -> Dict[str, Any]:
        """The proxy's counters so far (SIGUSR1; it answers with one JSON line on its stdout):
        ``requests``, ``gets`` (GET requests forwarded), ``get_body_bytes`` (bytes of the objects those
        GETs returned), ``methods``, ``bytes_up`` / ``bytes_down`` (all bytes across the emulated
        link), ``connections``.

        Raises:
            RuntimeError: the proxy is not running, or exited before answering.
        """
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError("latency proxy is not running")
        self.proc.send_signal(signal.SIGUSR1)
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("latency proxy exited before answering")
            if line.startswith("{"):
                return json.loads(line)

