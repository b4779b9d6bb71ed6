"""``--backend-timeout`` on a real mount: a source file replaced by a FIFO after the scan makes the
backend's open() block in the kernel; the reader gets EIO at the deadline (logged with the path) while
the other files keep being served, and the stuck thread does not take serving capacity."""
import errno
import os
import threading
import time

import pytest

from mountutil import read, wait_for

pytestmark = pytest.mark.usefixtures("fuse")


def unblock(fifo):
    """A writer that appears and leaves at once: every open() stuck on the FIFO returns (then EOF)."""
    for _ in range(20):
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # ENXIO: no reader (left already)
            return
        time.sleep(0.05)


def test_a_read_stuck_in_the_kernel_is_eio_at_the_deadline_and_others_are_served(small_tree, mount):
    src, spec = small_tree
    # through the daemon (the fetch other opens join); an open of the source file for passthrough to it
    # under the deadline: tests/integration/test_reader_misses.py
    m = mount(src, "--ram-cache", "0", "--backend-timeout", "1.5", "--source-passthrough", "off")
    fifo = os.path.join(src, "dog/04.bin")
    os.remove(fifo)
    os.mkfifo(fifo)          # the snapshot still says a 5000-byte regular file
    results = {}

    def stuck_reader(i):
        t0 = time.monotonic()
        try:
            read(os.path.join(m.path, "dog/04.bin"))
            results[i] = ("data", time.monotonic() - t0)
        except OSError as e:
            results[i] = (e.errno, time.monotonic() - t0)

    try:
        threads = [threading.Thread(target=stuck_reader, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        # meanwhile every other file is served, exact (each open is a backend read: --ram-cache 0)
        t0 = time.monotonic()
        for _ in range(3):
            for rel, data in sorted(spec.items()):
                if rel != "dog/04.bin":
                    assert read(os.path.join(m.path, rel)) == data
        served_in = time.monotonic() - t0
        for t in threads:
            t.join(20)
        assert served_in < 1.5, served_in       # not queued behind the stuck reads
        # every reader sees EIO, none a short or empty file, all within one deadline. With --ram-cache 0
        # no tier admits the file: one whole read into a transient buffer, which the other opens join,
        # and the kernel retries a failed read; after the first deadline every further read of the stuck
        # path fails at once, so no reader waits a deadline of its own behind the same hung open()
        assert sorted(results) == [0, 1, 2]
        took = sorted(t for _, t in results.values())
        assert all(err == errno.EIO for err, _ in results.values())
        assert 1.3 <= took[0] and took[-1] < 4.0, took   # one deadline (1.5 s) plus scheduling, not 2k
        # again, while the backend's open() is still stuck: EIO at once (never a short or empty file),
        # and no second thread is left hanging on the same file
        t0 = time.monotonic()
        with pytest.raises(OSError) as e:
            read(os.path.join(m.path, "dog/04.bin"))
        assert e.value.errno == errno.EIO and time.monotonic() - t0 < 1.4   # under the 1.5 s deadline
        for rel, data in sorted(spec.items()):
            if rel != "dog/04.bin":
                assert read(os.path.join(m.path, rel)) == data
    finally:
        unblock(fifo)
    log = m.log()
    assert "read 'dog/04.bin': no answer from the backend within 1.5 s (--backend-timeout)" in log
    # the read ran on the worker of the first open, under the backend's watchdog: at the deadline the
    # watchdog logged it once, answered that open EIO and failed the fetch the other opens had joined;
    # every later open joined the same failed fetch (the leader was still stuck) and got its error at once:
    # two joiners and the open "again", each logged by the front end
    deadline = "read 'dog/04.bin': no answer from the backend within 1.5 s (--backend-timeout)"
    assert log.count(f"ERROR shadefs.backends.timeout: {deadline}") == 1
    assert log.count(f"open dog/04.bin: backend error: {deadline}") == 3
    s = m.stats()
    assert s["opens"] == sum(s["hits"].values()) + s["misses"]


def test_a_prefetch_stuck_in_the_kernel_lets_the_open_waiting_on_it_go_at_the_deadline(small_tree, mount):
    """A plan's prefetch reads on the prefetch thread itself, under the backend's watchdog: a read stuck on a
    FIFO holds that thread, and the open of the file, which waits on the prefetch in flight, is let go at
    the deadline (EIO: the path is stuck, it fails at once); the other planned files are served from their
    prefetches, and the stuck read counts as a prefetch error once it returns."""
    import numpy as np

    from shadefs.control.client import ControlClient, find_endpoint

    src, spec = small_tree
    m = mount(src, "--ram-cache", "0", "--backend-timeout", "1", "--source-passthrough", "off",
              "--prefetch-concurrency", "2")
    fifo = os.path.join(src, "dog/04.bin")
    os.remove(fifo)
    os.mkfifo(fifo)          # the snapshot still says a 5000-byte regular file
    order = ["dog/04.bin"] + [r for r in sorted(spec) if r != "dog/04.bin"]
    got = {}

    def stuck_open():
        try:
            got["data"] = read(os.path.join(m.path, "dog/04.bin"))
        except OSError as e:
            got["errno"] = e.errno

    c = ControlClient(find_endpoint(m.path))
    try:
        handle, _ = c.register(order)
        c.send_plan(handle, 0, 0, [len(order)], np.arange(len(order), dtype=np.uint32))
        # the nine other files prefetched into the window, the FIFO's read stuck on a prefetch thread
        wait_for(lambda: c.stats()["prefetch"]["fetched_bytes"] == sum(len(spec[r]) for r in order[1:]),
                 timeout=20, what="the other files prefetched")
        t = threading.Thread(target=stuck_open)
        t.start()
        t.join(20)
        assert not t.is_alive() and got == {"errno": errno.EIO}
        for rel in order[1:]:
            assert read(os.path.join(m.path, rel)) == spec[rel]
        assert c.stats()["prefetch"]["ready"] == 9
        # the stuck read holds a prefetch thread, not a thread of the backend's (none was started)
        names = [_comm(m.pid, tid) for tid in os.listdir(f"/proc/{m.pid}/task")]
        assert "shadefs-backend" not in names and "shadefs-deadlin" in names   # (comm: 15 characters)
    finally:
        unblock(fifo)
    wait_for(lambda: c.stats()["prefetch"]["errors"] == 1, timeout=20, what="the stuck prefetch returned")
    c.close()
    assert "read 'dog/04.bin': no answer from the backend within 1 s (--backend-timeout)" in m.log()


def _comm(pid: int, tid: str) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:  # ended meanwhile
        return ""
