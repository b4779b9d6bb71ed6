"""Misses of a directory source served on the reader thread that read their OPEN (no hand-off to a worker),
counted exactly (the default; ``SHADEFS_FUSE_READER_MISSES=0`` sends them to workers). A miss that holds its
reader for a few ms gets a spare reader started in its place, so a hung source never blocks the other opens;
the replaced reader ends once its miss is over. A read stuck on the source is answered EIO at
``--backend-timeout``."""
import errno
import os
import re
import threading
import time

import pytest

from mountutil import read, wait_for

pytestmark = pytest.mark.usefixtures("fuse")


def reader_misses(log: str):
    """(misses served on a reader thread, backoffs, spare readers) from the unmount log line."""
    m = re.search(r"kernel front end: (\d+) misses served on a reader thread \((\d+) times slower .*?\), "
                  r"(\d+) spare readers started", log)
    assert m, log
    return tuple(int(x) for x in m.groups())


def reader_threads(pid: int) -> int:
    """Reader threads of the daemon ``pid`` alive now (named fuse-reader-N, or fuse-reader-spare)."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                n += f.read().startswith("fuse-reader")
        except OSError:
            pass
    return n


def fifo_in_place_of(src, rel: str) -> str:
    """Replace the source file ``rel`` by a FIFO (the snapshot still says a regular file: the source's
    open() of it blocks until a writer comes); returns its path."""
    fifo = os.path.join(src, rel)
    os.remove(fifo)
    os.mkfifo(fifo)
    return fifo


def unblock(fifo: str) -> None:
    """A writer that appears and leaves: the stuck open() of ``fifo`` returns."""
    for _ in range(20):
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            break


@pytest.mark.parametrize("env, on_reader", [(None, 10), ({"SHADEFS_FUSE_READER_MISSES": "0"}, 0)])
def test_every_miss_of_a_directory_source_is_served_on_a_reader(small_tree, mount, env, on_reader):
    src, spec = small_tree
    e = None if env is None else {**os.environ, **env}
    m = mount(src, "--ram-cache", "0", env=e)
    for rel, data in sorted(spec.items()):        # ten misses, one at a time: each leads its own read
        assert read(os.path.join(m.path, rel)) == data
    s = m.stats()
    assert s["opens"] == s["misses"] == 10
    assert m.umount() is None
    assert reader_misses(m.log()) == (on_reader, 0, 0)


def test_a_miss_stuck_on_a_reader_is_eio_at_the_deadline_and_a_spare_reader_serves(small_tree, mount):
    src, spec = small_tree
    m = mount(src, "--ram-cache", "0", "--backend-timeout", "1")
    fifo = fifo_in_place_of(src, "dog/04.bin")
    try:
        with pytest.raises(OSError) as e:
            read(os.path.join(m.path, "dog/04.bin"))   # the first miss: on a reader (no backoff yet)
        assert e.value.errno == errno.EIO
        for rel, data in sorted(spec.items()):        # served meanwhile, by workers (the backoff)
            if rel != "dog/04.bin":
                assert read(os.path.join(m.path, rel)) == data
    finally:
        unblock(fifo)
    assert m.umount() is None
    # one miss on a reader (the stuck one), one backoff (started at its deadline; its late return does not
    # count again), one spare reader (started a few ms into the stuck miss)
    assert reader_misses(m.log()) == (1, 1, 1)


@pytest.mark.parametrize("readers", [1, 2])
def test_a_hung_miss_on_every_reader_leaves_the_other_opens_served_by_spare_readers(small_tree, mount, readers):
    """Every reader thread held by a miss of a hung source file (the deadline far off): the other opens,
    misses on readers too, are served by the spare readers at once; once the hung opens return, the
    replaced readers end and the mount has its configured readers again."""
    src, spec = small_tree
    hung = sorted(spec)[:readers]
    m = mount(src, "--ram-cache", "0", "--backend-timeout", "600", "--fuse-readers", str(readers))
    fifos = [fifo_in_place_of(src, rel) for rel in hung]
    errors = []

    def hung_open(rel):
        try:
            read(os.path.join(m.path, rel))
        except OSError as e:
            errors.append(e.errno)

    threads = [threading.Thread(target=hung_open, args=(rel,)) for rel in hung]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: reader_threads(m.pid) == 2 * readers, timeout=20)  # a spare for each held reader
        for rel, data in sorted(spec.items()):
            if rel not in hung:
                assert read(os.path.join(m.path, rel)) == data
        assert all(t.is_alive() for t in threads)   # still hung in the source's open()
        # held well past 32 x READER_MISS_MAX_S (0.032 s): each hung miss alone makes the moving average of
        # a reader miss slow when it returns (a backoff each)
        time.sleep(0.3)
    finally:
        # a writer comes and goes until the hung opens are answered: the source's open() of the FIFO
        # returns, and the file is refused (no longer a regular file: ESTALE, which the kernel's path walk
        # retries once: a second OPEN, on a worker, as the first one's time started a backoff)
        for _ in range(2000):
            for fifo in fifos:
                unblock(fifo)
            if not any(t.is_alive() for t in threads):
                break
            time.sleep(0.01)
    for t in threads:
        t.join(20)
    assert errors == [errno.ESTALE] * readers
    wait_for(lambda: reader_threads(m.pid) == readers, timeout=20)  # the replaced readers ended
    for rel, data in sorted(spec.items()):   # served after the hung opens too (misses, by workers: backoff)
        if rel not in hung:
            assert read(os.path.join(m.path, rel)) == data
    s = m.stats()
    # each hung file opened twice (the kernel's retry of ESTALE), every other file twice (two passes)
    assert s["opens"] == s["misses"] == 2 * readers + 2 * (10 - readers)
    assert m.umount() is None
    # the first pass on readers (the hung opens included); each hung open's time made the moving average
    # slow (a backoff each, before its ESTALE answer: the retried OPENs and the second pass went to workers);
    # one spare reader per hung open
    assert reader_misses(m.log()) == (10, readers, readers)
