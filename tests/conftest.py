"""Shared fixtures: real FUSE mounts started through the real CLI, and small source trees."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from shadefs.cli import is_mounted  # noqa: F401  (tests import it from here)

SHADEFS = [sys.executable, "-m", "shadefs"]


def run_cli(*args, check=True, timeout=60):
    """Run ``shadefs ARGS`` in a subprocess; returns CompletedProcess (text)."""
    r = subprocess.run(SHADEFS + [str(a) for a in args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"shadefs {' '.join(map(str, args))} failed ({r.returncode}): {r.stderr}{r.stdout}")
    return r


class Mount:
    """A running shadefs mount (started with the CLI)."""

    def __init__(self, source, mountpoint, args, log_file):
        self.source = str(source)
        self.path = str(mountpoint)
        self.args = list(args)
        self.log_file = str(log_file)
        self.pid = None

    def start(self):
        r = run_cli("mount", self.source, self.path, "--log-file", self.log_file, *self.args)
        self.pid = int(r.stdout.split("(pid ")[1].split(",")[0])
        return self

    def stats(self) -> dict:
        return json.loads(run_cli("stats", self.path, "--json").stdout)

    def full_stats(self) -> dict:
        from shadefs.control.client import ControlClient, find_endpoint

        c = ControlClient(find_endpoint(self.path))
        try:
            return c.stats()
        finally:
            c.close()

    def log(self) -> str:
        try:
            with open(self.log_file) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def umount(self):
        if is_mounted(self.path):
            run_cli("umount", self.path, check=False)
        if self.pid is not None:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    os.kill(self.pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)


@pytest.fixture
def mount(tmp_path):
    """Factory: ``mount(source, *cli_args) -> Mount``; every mount is unmounted at teardown, and the
    test fails if its daemon logged a traceback it did not expect."""
    mounts = []

    def _mount(source, *args, name=None):
        mp = tmp_path / (name or f"mnt{len(mounts)}")
        mp.mkdir()
        m = Mount(source, mp, args, tmp_path / f"{mp.name}.log")
        mounts.append(m)
        return m.start()

    yield _mount
    for m in mounts:
        m.umount()
        if is_mounted(m.path):
            subprocess.run(["fusermount", "-uz", m.path], capture_output=True)
        assert not is_mounted(m.path), f"{m.path} still mounted"


def make_tree(root, spec):
    """Create files under ``root`` from ``{relpath: bytes}``; returns root."""
    for rel, data in spec.items():
        p = os.path.join(str(root), rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    return root


@pytest.fixture
def small_tree(tmp_path):
    """Ten files of 1000..10000 bytes in two class folders, deterministic content."""
    import random

    rng = random.Random(7)
    spec = {}
    for i in range(10):
        spec[f"{'cat' if i % 2 else 'dog'}/{i:02d}.bin"] = bytes(rng.getrandbits(8) for _ in range(1000 * (i + 1)))
    src = tmp_path / "src"
    make_tree(src, spec)
    return src, spec


@pytest.fixture
def cli():
    """``cli(*args, check=True)``: run the real ``shadefs`` command."""
    return run_cli


def set_dummy_aws_env(mp) -> None:
    """Dummy S3 credentials for this test process only: no shared config, no proxy, no instance metadata.

    ``mp`` is a ``pytest.MonkeyPatch`` (undone when its context ends)."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "HTTP_PROXY", "HTTPS_PROXY",
                 "http_proxy", "https_proxy"):
        mp.delenv(name, raising=False)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1"),
                        ("AWS_CONFIG_FILE", "/nonexistent/shadefs-test-aws-config"),
                        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/shadefs-test-aws-credentials"),
                        ("AWS_EC2_METADATA_DISABLED", "true"), ("NO_PROXY", "127.0.0.1,localhost")):
        mp.setenv(name, value)
