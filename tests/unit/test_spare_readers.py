"""ReaderWatch: a reader held by a slow miss is replaced by exactly one spare reader, and ends after it."""
import threading

import pytest

from shadefs.fuse.spare import ReaderWatch
from shadefs.testing.mounts import wait_for


def _watch(**kw):
    started = []
    lock = threading.Lock()

    def start(fd):
        with lock:
            started.append(fd)
    return ReaderWatch(start, **kw), started


def test_a_miss_over_before_the_threshold_starts_no_spare():
    w, started = _watch(after_s=60.0)
    try:
        for _ in range(100):
            assert w.end(w.begin(7)) is False
        assert (started, w.spares, w.replaced, w.begun) == ([], 0, 0, 100)
    finally:
        w.close()


def test_a_held_miss_gets_one_spare_on_its_fd_and_its_reader_ends_after_it():
    w, started = _watch(after_s=0.002)
    try:
        rec = w.begin(9)
        wait_for(lambda: started == [9], timeout=10)
        assert (w.spares, w.replaced) == (1, 1)
        other = w.begin(11)          # the spare's own quick miss: not replaced
        assert w.end(other) is False
        spares = w.spares
        wait_for(lambda: w.begun == 2 and w.replaced == 1, timeout=10)
        assert started == [9] and spares == 1   # one spare per held miss, however many polls see it
        assert w.end(rec) is True    # its reader ends: the spare serves in its place
        assert (w.spares, w.replaced) == (1, 0)
    finally:
        w.close()


def test_room_is_refused_at_max_replaced_and_given_back_when_a_replaced_miss_ends():
    w, started = _watch(after_s=0.002, max_replaced=2)
    try:
        recs = [w.begin(fd) for fd in (1, 2)]
        wait_for(lambda: len(started) == 2, timeout=10)
        assert sorted(started) == [1, 2] and w.room() is False
        assert w.end(recs[0]) is True and w.room() is True
        assert w.end(recs[1]) is True and w.replaced == 0
    finally:
        w.close()


def test_the_watch_goes_idle_and_a_new_miss_wakes_it():
    w, started = _watch(after_s=0.002, idle_s=0.01)
    try:
        w.end(w.begin(3))
        wait_for(lambda: w._idle, timeout=10)
        rec = w.begin(4)             # wakes the sleeping watch thread
        wait_for(lambda: started == [4], timeout=10)
        assert w.end(rec) is True
    finally:
        w.close()


@pytest.mark.parametrize("kw", [{"after_s": 0}, {"max_replaced": 0}])
def test_bad_arguments_are_refused(kw):
    with pytest.raises(ValueError):
        ReaderWatch(lambda fd: None, **kw)
