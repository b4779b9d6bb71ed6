"""The daemon out of file descriptors: a reader holding many opens of NVMe hits, the soft NOFILE limit lowered
with ``prlimit`` close to (or below) the daemon's use. The daemon must live, ``shadefs stats`` must answer
(libzmq's ipc listener aborts the process when an accept fails with EMFILE) and every reader must read the
right bytes; the ``descriptors`` stats count what happened."""
from __future__ import annotations

import os
import subprocess

import pytest

from conftest import Mount, make_tree
from mountutil import read
from shadefs.testing.mounts import pid_alive, wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/prlimit") and not os.path.exists("/bin/prlimit"),
                                reason="needs prlimit (util-linux)")

FILES = 300
HELD = 200
RESERVE = 64


def _spec() -> dict:
    # distinct contents per file, 1-2 KB: each a disk entry file of its own (--disk-pack-below 0)
    return {f"c{i % 4}/{i:03d}.bin": os.urandom(1000 + 3 * i) for i in range(FILES)}


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _soft_nofile(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as f:
        line = next(ln for ln in f if ln.startswith("Max open files"))
    return int(line.split()[3])


def _prlimit(pid: int, soft: int) -> None:
    subprocess.run(["prlimit", "--pid", str(pid), f"--nofile={soft}:"], check=True)
    assert _soft_nofile(pid) == soft


def _warm(tmp_path, *args, fuse_impl=None) -> tuple:
    """A mount with a disk tier holding all FILES files (read once: each a miss that fills the tier)."""
    spec = _spec()
    src = tmp_path / "src"
    make_tree(src, spec)
    mp = tmp_path / "mp"
    mp.mkdir()
    m = Mount(src, mp, ("--disk-cache", tmp_path / "cache", "--disk-cache-size", "64MiB", "--disk-pack-below", "0",
                        *args), tmp_path / "mp.log", fuse_impl=fuse_impl)
    m.start()
    for rel, data in spec.items():
        assert read(os.path.join(m.path, rel)) == data
    wait_for(lambda: m.stats()["tiers"]["disk"]["files"] == FILES)
    return m, spec


def _check_bytes(held: dict, spec: dict) -> None:
    for rel, fd in held.items():
        assert os.pread(fd, len(spec[rel]) + 1, 0) == spec[rel], rel


def test_a_reader_holding_opens_past_the_limit_leaves_the_daemon_answering(tmp_path):
    # passthrough (the default where the kernel offers it): the kernel reads each NVMe hit's entry file
    # through its backing id, so the opens a reader holds take no descriptor of the daemon
    m, spec = _warm(tmp_path)
    try:
        if "passthrough on" not in m.log():
            pytest.skip("FUSE passthrough not available here (needs Linux >= 6.9, root)")
        rest = _fds(m.pid)
        rels = list(spec)
        held = {rel: os.open(os.path.join(m.path, rel), os.O_RDONLY) for rel in rels[:HELD]}
        try:
            _prlimit(m.pid, rest + 40)   # 40 above its use at rest: inside the reserve of 64
            s = m.stats()                # a new control connection: accepted, answered
            assert _fds(m.pid) == rest   # 200 NVMe hits open, no descriptor held for them
            d = s["descriptors"]
            assert (d["limit"], d["reserve"], d["held"], d["refused"], d["failed"]) == (rest + 40, RESERVE, 0, 0, 0)
            assert s["hits"]["disk"] == HELD and s["misses"] == FILES
            _check_bytes(held, spec)
            # the other 100 files, opened inside the reserve: served from a buffer, none holds a descriptor
            more = {rel: os.open(os.path.join(m.path, rel), os.O_RDONLY) for rel in rels[HELD:]}
            held.update(more)
            _check_bytes(held, spec)
            s = m.stats()
            d = s["descriptors"]
            assert (d["held"], d["refused"], d["failed"]) == (0, FILES - HELD, 0)
            assert s["hits"]["disk"] == FILES and s["misses"] == FILES
            assert d["open"] < d["limit"] and pid_alive(m.pid)
            assert "descriptor reserve reached (soft limit %d, 64 kept free" % (rest + 40) in m.log()
        finally:
            for fd in held.values():
                os.close(fd)
    finally:
        m.umount()
    assert not m.tracebacks()


@pytest.mark.both_frontends
def test_without_passthrough_opens_past_the_reserve_hold_no_descriptor(tmp_path, fuse_impl, cli):
    # without passthrough (or through libfuse) each open NVMe hit reads its entry fd: held until RELEASE,
    # up to the reserve
    m, spec = _warm(tmp_path, "--no-passthrough", fuse_impl=fuse_impl)
    try:
        rest = _fds(m.pid)
        rels = list(spec)
        held = {rel: os.open(os.path.join(m.path, rel), os.O_RDONLY) for rel in rels[:HELD]}
        try:
            assert _fds(m.pid) == rest + HELD
            _prlimit(m.pid, rest + HELD + 40)  # 40 free: inside the reserve of 64
            more = {rel: os.open(os.path.join(m.path, rel), os.O_RDONLY) for rel in rels[HELD:]}
            held.update(more)
            assert _fds(m.pid) == rest + HELD    # the last 100 opens: from a buffer, no descriptor held
            s = m.stats()
            d = s["descriptors"]
            assert (d["limit"], d["reserve"], d["held"], d["refused"], d["failed"]) == \
                (rest + HELD + 40, RESERVE, HELD, FILES - HELD, 0)
            assert s["hits"]["disk"] == FILES and s["misses"] == FILES
            _check_bytes(held, spec)
            text = cli("stats", m.path).stdout
            assert f"(reserve 64), {HELD} held by open files, {FILES - HELD} opens served without one, 0 failed" \
                in text
        finally:
            for fd in held.values():
                os.close(fd)
        # the opens released, the reserve has room again: the next opens hold their entry fds
        wait_for(lambda: m.stats()["descriptors"]["held"] == 0)
        again = {rel: os.open(os.path.join(m.path, rel), os.O_RDONLY) for rel in rels[:10]}
        try:
            _check_bytes(again, spec)
            d = m.stats()["descriptors"]
            assert (d["held"], d["refused"], d["failed"]) == (10, FILES - HELD, 0)
        finally:
            for fd in again.values():
                os.close(fd)
        assert pid_alive(m.pid)
    finally:
        m.umount()
    assert not m.tracebacks()


def test_a_limit_lowered_below_the_descriptors_open_closes_the_control_endpoint_until_they_are_free(tmp_path, cli):
    # without passthrough, 200 open NVMe hits hold 200 entry fds; the limit is then lowered below them:
    # no descriptor is free, so the control endpoint is unbound (an accept there would abort the daemon),
    # readers keep reading, and once the opens are released it is bound again
    m, spec = _warm(tmp_path, "--no-passthrough")
    try:
        rest = _fds(m.pid)
        rels = list(spec)
        held = {rel: os.open(os.path.join(m.path, rel), os.O_RDONLY) for rel in rels[:HELD]}
        try:
            _prlimit(m.pid, rest + 40)   # 40 above its use at rest, 160 below its use now
            wait_for(lambda: "control endpoint" in m.log() and " closed: 0 file descriptors free" in m.log())
            r = cli("stats", m.path, "--json", "--timeout", "1", check=False)
            assert r.returncode != 0 and "did not answer" in r.stderr and pid_alive(m.pid)
            _check_bytes(held, spec)     # the held entry fds serve their reads
            assert _fds(m.pid) == rest + HELD - 1   # the unbound listener's descriptor is free
            # new opens: each entry opened on that one free descriptor, read into a buffer, closed
            for rel in rels[HELD:HELD + 3]:
                assert read(os.path.join(m.path, rel)) == spec[rel]
        finally:
            for fd in held.values():
                os.close(fd)
        wait_for(lambda: " open again: " in m.log())
        # bound again at 32 free, while the kernel's background RELEASEs of the rest may still be coming
        wait_for(lambda: m.stats()["descriptors"]["held"] == 0)
        s = m.stats()
        d = s["descriptors"]
        assert (d["limit"], d["held"], d["refused"], d["failed"]) == (rest + 40, 0, 3, 0)
        for rel in rels[HELD:]:          # 40 free: opens inside the reserve, from buffers, the bytes right
            assert read(os.path.join(m.path, rel)) == spec[rel]
        d = m.stats()["descriptors"]
        assert (d["held"], d["refused"], d["failed"]) == (0, 3 + FILES - HELD, 0) and pid_alive(m.pid)
    finally:
        m.umount()
    assert not m.tracebacks()
