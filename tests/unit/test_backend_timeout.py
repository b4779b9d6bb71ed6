"""TimeoutBackend (``--backend-timeout``): a read past the deadline is EIO with the path, the stuck thread
is abandoned and replaced, stuck threads are bounded, and a FIFO (open() blocks in the kernel) through the
real posix backend turns into EIO at the deadline."""
import logging
import os
import threading
import time

import pytest

from shadefs.backends.base import Backend, BackendError
from shadefs.backends.posix import PosixBackend
from shadefs.backends.timeout import TimeoutBackend, on_deadline


class Gated(Backend):
    """A backend double whose reads of ``stuck/*`` block until ``release`` is set."""

    def __init__(self):
        super().__init__("gated://")
        self.release = threading.Event()
        self.finished = []

    def walk(self):
        return iter(())

    def read(self, path, size):
        if path.startswith("stuck/"):
            self.release.wait(30)
        self.finished.append(path)
        return path.encode().ljust(size, b".")[:size]


def test_deadline_is_eio_with_the_path_and_other_reads_go_on(caplog):
    inner = Gated()
    b = TimeoutBackend(inner, 0.3)
    t0 = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="shadefs.backends.timeout"):
        with pytest.raises(BackendError, match=r"read 'stuck/a': no answer from the backend within 0.3 s"):
            b.read("stuck/a", 10)
    took = time.monotonic() - t0
    assert 0.29 <= took < 2.0
    assert "stuck/a" in caplog.text
    assert b.stuck == 1 and b.timeouts == 1
    # the stuck worker does not serve: the next read gets a fresh thread and its exact bytes
    assert b.read("ok/b", 6) == b"ok/b.."
    assert b.read("ok/c", 2) == b"ok"
    assert b.threads == 2                     # one stuck, one idle (reused for both reads)
    inner.release.set()                       # the stuck read returns: its result is dropped
    deadline = time.monotonic() + 5
    while b.stuck and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b.stuck == 0 and b.threads == 1 and inner.finished[-1] == "stuck/a"


def test_errors_pass_through_and_fast_reads_are_unchanged(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"0123456789")
    b = TimeoutBackend(PosixBackend(str(tmp_path)), 5)
    assert b.read("a.bin", 10) == b"0123456789"
    assert b.read_range("a.bin", 3, 4) == b"3456"
    assert b.stat("a.bin")[0] == 10
    with pytest.raises(FileNotFoundError):
        b.read("missing.bin", 1)
    with pytest.raises(BackendError, match="changed under the mount"):
        b.read("a.bin", 11)
    assert b.root == str(tmp_path) and b.describe() == str(tmp_path)   # the inner backend's
    assert b.timeouts == 0 and b.stuck == 0


def test_stuck_threads_are_bounded():
    inner = Gated()
    b = TimeoutBackend(inner, 0.1, max_stuck=2)
    for name in ("stuck/1", "stuck/2"):
        with pytest.raises(BackendError, match="no answer"):
            b.read(name, 1)
    with pytest.raises(BackendError, match="2 backend reads are stuck"):
        b.read("ok/x", 1)                      # refused at once: no third thread to hang
    # refused, not timed out: no deadline ran for it (timeouts stays at the two stuck reads') and no thread
    # was started for it
    assert b.refused == 1 and b.timeouts == 2 and b.threads == 2 and "ok/x" not in inner.finished
    inner.release.set()
    deadline = time.monotonic() + 5
    while b.stuck and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b.read("ok/x", 4) == b"ok/x"       # healed: reads are served again


def test_a_path_whose_read_is_stuck_fails_fast_until_it_returns(caplog):
    """A streamed file's every READ is one backend call: after the first deadline, further reads of the
    same path (any range, and its stat) fail at once instead of each waiting a deadline of its own; other
    paths are served; when the stuck call returns, the path is read normally again."""
    class GatedRanges(Gated):
        def read_range(self, path, offset, length):
            return self.read(path, offset + length)[offset:]

        def stat(self, path):
            if path.startswith("stuck/"):
                self.release.wait(30)
            return (7, 1.0)

    inner = GatedRanges()
    b = TimeoutBackend(inner, 0.3)
    with caplog.at_level(logging.ERROR, logger="shadefs.backends.timeout"):
        with pytest.raises(BackendError, match=r"read 'stuck/a' at 0: no answer .* 0.3 s"):
            b.read_range("stuck/a", 0, 4)
        for call in (lambda: b.read_range("stuck/a", 4096, 4), lambda: b.read("stuck/a", 8),
                     lambda: b.stat("stuck/a")):
            with pytest.raises(BackendError, match=r"an earlier read of this file has been stuck"):
                call()
    assert caplog.text.count("an earlier read of this file") == 1   # logged once per stuck episode
    # no deadline of their own: refused (3) without a thread, the one timeout is the first read's
    assert b.stuck == 1 and b.threads == 1 and b.refused == 3 and b.timeouts == 1
    assert b.read_range("ok/b", 1, 3) == b"k/b"       # another path is served meanwhile
    inner.release.set()
    deadline = time.monotonic() + 5
    while b.stuck and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b.stuck == 0
    inner.release.clear()
    threading.Timer(0.05, inner.release.set).start()
    assert b.read("stuck/a", 9) == b"stuck/a.."   # tried normally again (and answers within the deadline)


def test_bad_arguments():
    with pytest.raises(ValueError, match="> 0"):
        TimeoutBackend(Gated(), 0)
    with pytest.raises(ValueError, match="max_stuck"):
        TimeoutBackend(Gated(), 1, max_stuck=0)


def test_a_fifo_blocks_open_in_the_kernel_and_becomes_eio_at_the_deadline(tmp_path):
    fifo = tmp_path / "pipe.bin"
    os.mkfifo(fifo)
    b = TimeoutBackend(PosixBackend(str(tmp_path)), 0.5)
    t0 = time.monotonic()
    with pytest.raises(BackendError, match=r"read 'pipe.bin': no answer .* 0.5 s"):
        b.read("pipe.bin", 100)
    assert 0.49 <= time.monotonic() - t0 < 3
    assert b.stuck == 1
    # unblock the stuck open(): a writer appears and leaves at once (EOF), the thread ends
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    os.close(fd)
    deadline = time.monotonic() + 5
    while b.stuck and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b.stuck == 0


def test_a_watched_read_runs_on_the_caller_and_its_deadline_calls_the_handlers():
    """Under ``on_deadline`` the read runs on the calling thread (no worker thread); at the deadline the
    watchdog counts it stuck and calls the thread's handlers, innermost first, with the error; the stuck
    caller, when its read returns, gets that error too (its result dropped), and is no longer stuck."""
    inner = Gated()
    b = TimeoutBackend(inner, 0.2)
    calls = []
    answered = threading.Event()
    with on_deadline(lambda e: calls.append(("outer", str(e)))):
        assert b.read("ok/a", 4) == b"ok/a"
    assert b.watched == 1 and b.threads == 0        # the caller's own thread read it

    out = {}

    def caller():
        with on_deadline(lambda e: (calls.append(("request", str(e))), answered.set())):
            with on_deadline(lambda e: calls.append(("fetch", str(e))), answers=False):
                try:
                    out["got"] = b.read("stuck/b", 3)
                except BackendError as e:
                    out["err"] = str(e)

    t = threading.Thread(target=caller)
    t.start()
    assert answered.wait(10)
    msg = "read 'stuck/b': no answer from the backend within 0.2 s (--backend-timeout)"
    assert calls == [("fetch", msg), ("request", msg)]  # innermost first
    assert b.stuck == 1 and b.timeouts == 1 and b.threads == 0 and t.is_alive()
    with pytest.raises(BackendError, match="an earlier read of this file has been stuck"):
        b.read("stuck/b", 3)                          # the stuck path fails at once meanwhile
    inner.release.set()
    t.join(10)
    assert out["err"].startswith(msg + "; answered after") and "got" not in out
    assert b.stuck == 0 and b.refused == 1 and inner.finished[-1] == "stuck/b"
    assert b.read("stuck/b", 3) == b"stu"             # tried normally again


def test_a_handler_that_does_not_answer_leaves_the_read_to_a_worker():
    """``answers=False`` alone (a fetch's leader on a thread nobody answers for): handed to a worker, so
    the caller gets the error at the deadline itself."""
    inner = Gated()
    b = TimeoutBackend(inner, 0.2)
    told = []
    with on_deadline(told.append, answers=False):
        with pytest.raises(BackendError, match="no answer from the backend within 0.2 s"):
            b.read("stuck/c", 1)
    assert b.threads == 1 and b.watched == 0 and told == []
    inner.release.set()
