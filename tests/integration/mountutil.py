"""Helpers shared by the operations tests (persistence, faults, load, metrics, security)."""
from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def read(path) -> bytes:
    """Read a whole file with raw ``os.read`` (no ``isatty`` round trip)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                return b"".join(chunks)
            chunks.append(b)
    finally:
        os.close(fd)


def metrics_port(m) -> int:
    """The real port of a mount started with ``--metrics-port``, from its log."""
    found = re.search(r"Prometheus metrics on http://[^:]+:(\d+)/metrics", m.log())
    assert found, m.log()
    return int(found.group(1))


def scrape(port: int, host: str = "127.0.0.1") -> dict:
    """``{(sample name, ((label, value), ...)): value}`` from one scrape of ``/metrics``."""
    text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def wait_for(predicate, timeout=10.0, interval=0.05):
    """Poll ``predicate`` until it is truthy; returns its value or raises AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)


def pid_gone(pid: int, timeout: float = 10.0) -> bool:
    def gone():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # a zombie child of ours counts as gone
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(") ")[1].startswith("Z")
        except FileNotFoundError:
            return True
    return wait_for(gone, timeout)


def force_unmount(path) -> None:
    subprocess.run(["fusermount", "-uz", str(path)], capture_output=True)
    subprocess.run(["umount", "-l", str(path)], capture_output=True)
