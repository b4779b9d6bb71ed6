"""Shared fixtures: real FUSE mounts started through the real CLI, and small source trees."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

SHADEFS = [sys.executable, "-m", "shadefs"]


def run_cli(*args, check=True, timeout=60):
    """Run ``shadefs ARGS`` in a subprocess; returns CompletedProcess (text)."""
    r = subprocess.run(SHADEFS + [str(a) for a in args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"shadefs {' '.join(map(str, args))} failed ({r.returncode}): {r.stderr}{r.stdout}")
    return r


def is_mounted(path) -> bool:
    path = os.path.realpath(str(path))
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


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
