"""Misses of a directory source served on the reader thread that read their OPEN (no hand-off to a worker),
counted exactly; ``SHADEFS_FUSE_READER_MISSES=1`` serves each miss of a directory source on a reader (default: workers); a read stuck on the source
is answered EIO at ``--backend-timeout`` and a spare reader takes the stuck one's place."""
import errno
import os
import re

import pytest

from mountutil import read

pytestmark = pytest.mark.usefixtures("fuse")


def reader_misses(log: str):
    """(misses served on a reader thread, backoffs, spare readers) from the unmount log line."""
    m = re.search(r"kernel front end: (\d+) misses served on a reader thread \((\d+) times slower .*?\), "
                  r"(\d+) spare readers started", log)
    assert m, log
    return tuple(int(x) for x in m.groups())


@pytest.mark.parametrize("env, on_reader", [({"SHADEFS_FUSE_READER_MISSES": "1"}, 10), (None, 0)])
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
    m = mount(src, "--ram-cache", "0", "--backend-timeout", "1", env={**os.environ, "SHADEFS_FUSE_READER_MISSES": "1"})
    fifo = os.path.join(src, "dog/04.bin")
    os.remove(fifo)
    os.mkfifo(fifo)          # the snapshot still says a regular file: the source's open() blocks
    try:
        with pytest.raises(OSError) as e:
            read(os.path.join(m.path, "dog/04.bin"))   # the first miss: on a reader (no backoff yet)
        assert e.value.errno == errno.EIO
        for rel, data in sorted(spec.items()):        # served meanwhile, by workers (the backoff)
            if rel != "dog/04.bin":
                assert read(os.path.join(m.path, rel)) == data
    finally:
        for _ in range(20):  # a writer that appears and leaves: the stuck open() returns
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                break
    assert m.umount() is None
    # one miss on a reader (the stuck one), one backoff (started at its deadline; its late return does not
    # count again), one spare reader
    assert reader_misses(m.log()) == (1, 1, 1)
