"""The descriptor reserve (``shadefs.procutil.FdReserve``): holds granted while ``reserve`` descriptors stay
free below the soft NOFILE limit, refused past it; a disk hit refused a held entry fd is served from a buffer.
Real limits (``setrlimit`` on this process, restored), real descriptors, a real disk tier in tmp_path."""
import errno
import os
import resource

import pytest

from shadefs.procutil import FdReserve
from shadefs.testing.handles import open_read

from test_cache import build, fid


@pytest.fixture
def soft_limit():
    """Sets this process's soft NOFILE limit for the test; restores it after."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)

    def set_soft(n):
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, before[1]))
    yield set_soft
    resource.setrlimit(resource.RLIMIT_NOFILE, before)


def test_holds_are_granted_until_reserve_descriptors_are_left_free(soft_limit):
    r = FdReserve(reserve=8, count_every_s=0.0)   # counted at every hold: exact
    base = FdReserve.count()
    soft_limit(base + 20)
    assert FdReserve.limit() == base + 20
    fds, granted = [], []
    try:
        for _ in range(16):
            fd = os.open(os.devnull, os.O_RDONLY)
            fds.append(fd)
            granted.append(r.hold(fd))
        # the i-th open leaves base + 20 - (base + i + 1) free: granted while that is >= 8, i.e. i <= 11
        assert granted == [True] * 12 + [False] * 4
        s = r.stats()
        assert (s["limit"], s["reserve"], s["held"], s["refused"], s["failed"]) == (base + 20, 8, 12, 4, 0)
        assert s["open"] == base + 16
        assert not r.room()
        for _ in range(12):
            r.drop()
        for fd in fds[8:]:
            os.close(fd)
        del fds[8:]
        assert r.room() and r.stats()["held"] == 0
    finally:
        for fd in fds:
            os.close(fd)


def test_the_descriptor_number_alone_refuses_past_the_reserve(soft_limit):
    # counted long ago (count_every_s large): the fd number still tells every lower number is in use
    r = FdReserve(reserve=8, count_every_s=3600.0)
    base = r.stats()["open"]   # the count the next holds start from
    fds = [os.open(os.devnull, os.O_RDONLY)]
    try:
        while fds[-1] < base + 2:   # past the holes of this process's table: a number above the count
            fds.append(os.open(os.devnull, os.O_RDONLY))
        soft_limit(fds[-1] + 8)     # the stale count leaves >= 10 free, the number only 7
        assert not r.hold(fds[-1])
        assert (r.stats()["refused"], r.held) == (1, 0)
    finally:
        for fd in fds:
            os.close(fd)


def test_no_descriptor_left_to_count_with_refuses_every_hold(soft_limit):
    r = FdReserve(reserve=8, count_every_s=0.0)
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        soft_limit(FdReserve.count())   # every descriptor below the limit in use: the listing itself fails
        assert not r.hold(fd) and r.free() == 0 and not r.room()
        assert (r.refused, r.held) == (1, 0)
    finally:
        os.close(fd)


def test_reserve_zero_grants_every_hold_and_a_negative_one_is_refused():
    r = FdReserve(reserve=0)
    assert all(r.hold(fd) for fd in range(3)) and r.held == 3 and r.refused == 0 and r.room()
    r.out_of_descriptors()
    assert r.stats()["failed"] == 1
    with pytest.raises(ValueError):
        FdReserve(reserve=-1)


def test_a_disk_hit_past_the_reserve_is_served_from_a_buffer_without_a_held_fd(small_tree, tmp_path):
    src, spec = small_tree
    cache, ns, backend = build(src, tmp_path, "static", ram=0, disk=100000)
    name = "cat/09.bin"   # 10000 bytes
    f = fid(ns, name)
    assert open_read(cache, f) == (spec[name], "miss")
    h = cache.open(f)     # room: the handle holds its entry's fd
    assert (h.outcome, h.source) == ("disk", "entry") and cache.fds.held == 1
    h.release()
    assert cache.fds.held == 0
    cache.fds = FdReserve(reserve=FdReserve.limit())   # no room at all: every hold refused
    h = cache.open(f)
    assert (h.outcome, h.source, h.backing_fd()) == ("disk", "memory", None)
    assert h.read(0, 20000) == spec[name]
    h.release()
    d = cache.fds.stats()
    assert (d["held"], d["refused"], d["failed"]) == (0, 1, 0)
    s = cache.stats()
    assert (s["opens"], s["hits"]["disk"], s["misses"]) == (3, 2, 1) and len(backend.reads) == 1
    assert cache.loose_bytes == 0   # the buffer's bytes were handed back at release (settled by stats)


def test_the_control_server_refuses_to_start_a_zeromq_context_without_descriptors_for_it(soft_limit, tmp_path):
    # libzmq aborts the process when its pollers cannot be created (EMFILE): start() refuses first
    from shadefs.control.server import CONTEXT_DESCRIPTORS, ControlServer

    srv = ControlServer(f"ipc://{tmp_path}/c.sock", object(), mountpoint="/mnt/x")
    srv.fds = FdReserve(count_every_s=0.0)
    soft_limit(FdReserve.count() + CONTEXT_DESCRIPTORS - 1)
    with pytest.raises(OSError) as e:
        srv.start()
    assert e.value.errno == errno.EMFILE and "a ZeroMQ context needs 16" in str(e.value)
    assert srv.endpoint is None and not os.path.exists(f"{tmp_path}/c.sock")


def test_a_disk_hit_that_closed_its_entry_fd_reads_the_entry_per_read_else_the_backend(small_tree, tmp_path):
    # a passthrough open closes its handle's entry fd (the kernel reads the entry itself); a READ that
    # still comes (read-ahead) opens the entry for that read, or reads the backend when the entry is gone
    src, spec = small_tree
    cache, ns, backend = build(src, tmp_path, "static", ram=0, disk=100000)
    name = "cat/09.bin"
    f = fid(ns, name)
    assert open_read(cache, f) == (spec[name], "miss")
    h = cache.open(f)
    assert (h.outcome, h.source, cache.fds.held) == ("disk", "entry", 1)
    h.close_entry_fd()
    assert (h.backing_fd(), cache.fds.held) == (None, 0)
    assert h.read(100, 5000) == spec[name][100:5100]   # from the entry
    assert (len(backend.reads), cache.range_reads) == (1, 0)
    os.unlink(cache.disk.entry_file(name, h.gen, h._csum))
    assert h.read(0, 20000) == spec[name]               # from the backend, by ranges
    assert (len(backend.reads), cache.range_reads) == (1, 1)
    h.release()
