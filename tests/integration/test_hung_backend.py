"""Hung backend reads (an NFS server that stops answering, an S3 GET that stalls) must not stall the mount.

The source of the shadefs mount under test is itself a small FUSE filesystem run in this process (the
kernel front end over a namespace and a gated "cache"): opening one of its ``hang/`` files blocks in the
kernel until the test opens the gate. With 16 such backend reads in flight, hits and other misses through
the shadefs mount are served, and a reader killed while its miss hangs exits at once (shadefs answers the
kernel's INTERRUPT), never left in D state. Kernel front end only: libfuse's worker pool is what runs out.
"""
import os
import signal
import threading
import time

import pytest

from mountutil import gated_fuse_source, read, wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse") or os.geteuid() != 0,
                                reason="needs /dev/fuse and root (an in-process FUSE source)")

HUNG = 16


@pytest.fixture
def gated_source(tmp_path):
    """``(mountpoint, {relpath: bytes}, gate, cache)`` of a FUSE source whose ``hang/`` opens block."""
    spec = {f"hit/{i:02d}.bin": os.urandom(2000 + i) for i in range(8)}
    spec.update({f"miss/{i:02d}.bin": os.urandom(3000 + i) for i in range(8)})
    spec.update({f"hang/{i:02d}.bin": os.urandom(1000 + i) for i in range(HUNG)})
    gate = threading.Event()

    def wait_for_the_gate():
        assert gate.wait(60), "the test never opened the gate"

    with gated_fuse_source(tmp_path, spec, gate, wait_for_the_gate) as (mp, cache):
        yield mp, spec, gate, cache


def _spawn_reader(path):
    """A child process that reads ``path`` whole and exits 0 if it got ``len > 0`` bytes."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if read(path) else 3)
        except BaseException:
            os._exit(4)
    return pid


def _state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(") ", 1)[1][0]


def test_hung_backend_reads_leave_hits_and_misses_served_and_killed_readers_free(gated_source, mount):
    src, spec, gate, cache = gated_source
    m = mount(src, "--ram-cache", "1MiB", "--no-kernel-cache", "--fuse-impl", "kernel")
    hits = sorted(r for r in spec if r.startswith("hit/"))
    for rel in hits:  # now RAM hits
        assert read(os.path.join(m.path, rel)) == spec[rel]
    hung = [_spawn_reader(os.path.join(m.path, f"hang/{i:02d}.bin")) for i in range(HUNG)]
    try:
        wait_for(lambda: cache.waiting == HUNG, timeout=20)  # 16 backend reads hang in the source
        for _ in range(3):
            for rel in hits:
                assert read(os.path.join(m.path, rel)) == spec[rel]
        for rel in sorted(r for r in spec if r.startswith("miss/")):  # misses on other files go through
            assert read(os.path.join(m.path, rel)) == spec[rel]
        assert cache.waiting == HUNG
        # readers blocked on a hung miss sleep interruptibly, and a killed one exits at once
        assert {_state(pid) for pid in hung} == {"S"}
        victims = hung[:4]
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        for pid in victims:
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == -signal.SIGKILL
        assert time.monotonic() - t0 < 5
        assert cache.waiting == HUNG  # their backend reads still hang; nobody waits for them
    finally:
        gate.set()
    for pid in hung[4:]:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    s = m.stats()
    # every open counted once: 8 warm-up misses, 24 hits, 8 other misses, 16 hung misses
    assert s["opens"] == 8 + 24 + 8 + HUNG and s["hits"]["ram"] == 24 and s["misses"] == 8 + 8 + HUNG
    for i in range(HUNG):  # every released read was admitted, the killed readers' ones too: hits now
        rel = f"hang/{i:02d}.bin"
        assert read(os.path.join(m.path, rel)) == spec[rel]
    assert m.stats()["hits"]["ram"] == 24 + HUNG
    assert "Traceback" not in m.log()
