"""``--backend-timeout`` on a real mount: a source file replaced by a FIFO after the scan makes the
backend's open() block in the kernel; the reader gets EIO at the deadline (logged with the path) while
the other files keep being served, and the stuck thread does not take serving capacity."""
import errno
import os
import threading
import time

import pytest

from mountutil import read

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
