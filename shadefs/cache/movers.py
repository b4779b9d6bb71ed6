"""The mover: the read path's disk work for files other than the one an open asked for, off the reader threads.

A RAM victim in state ``moving`` (:class:`~shadefs.cache.state.Move`) is written to the disk tier when
its policy admits it (``commit_move``) or dropped (``drop_move``, offered to the group's shared tier);
a disk entry in state ``deleting`` (:class:`~shadefs.cache.state.DyingEntry`: a promoted file's old
entry, one found corrupt, one of a file changed at the source) is unlinked (``entry_unlinked``). Both
are queued by :meth:`Mover.submit` the moment a transition creates them (under no lock, before the read
that evicted a victim starts) and done by one thread, ``shadefs-mover``
(:meth:`~shadefs.cache.core.TieredCache.start_background`); before it starts and after
:meth:`Mover.close` they are done by the thread that submits them (no FUSE reader exists then).

Bounds: at most :data:`MOVE_QUEUE` submissions with victims wait at once; victims beyond it are dropped
on the submitting thread (``demotions_skipped``: one critical section, no I/O), as when ``LOOSE_BUFFERS``
has no room for their bytes. Deletes are never dropped and never done by the submitting thread: the list
of dying entries is bounded by the entries the disk tier holds (each is deleting at most once), and
their bytes stay counted in the disk budget until they are unlinked.
"""
from __future__ import annotations

import collections
import logging
import threading
from typing import List, Optional, Tuple

from ..procutil import name_thread
from .state import DyingEntry, Move

__all__ = ["Mover", "MOVE_QUEUE"]

log = logging.getLogger("shadefs.cache")

# submissions with RAM victims waiting for the mover; victims beyond it are dropped (not demoted)
MOVE_QUEUE = 1024

Victim = Tuple[int, bytes, Optional[Move]]  # (fid, bytes, its Move; None: not demoted, offered to the group)


class Mover:
    """The mover of one :class:`~shadefs.cache.core.TieredCache` (its lock, state table, tiers, counters).

    Attributes:
        capacity: :data:`MOVE_QUEUE` (submissions with victims that may wait).
        thread_name: the mover thread's name.
    """

    thread_name = "shadefs-mover"

    def __init__(self, cache):
        self.cache = cache
        self.capacity = MOVE_QUEUE
        self._cond = threading.Condition()
        self._jobs: collections.deque = collections.deque()   # (victims, dying entries)
        self._queued_victims = 0     # jobs in _jobs that carry victims
        self._running = 0            # jobs being done by the thread
        self._accepting = False      # the thread runs and takes jobs
        self._thread: Optional[threading.Thread] = None

    # -- submitting --------------------------------------------------------------------------------------
    def submit(self, victims: List[Victim], dying: List[DyingEntry] = (),
               done: Optional[threading.Event] = None) -> None:
        """Outside the cache lock: hand RAM victims (as :meth:`TieredCache._evict_ram` returns them) and
        dying disk entries to the mover; never waits for their I/O (inline before :meth:`start`).
        ``done``: set once this job's deletes and writes are done."""
        if not victims and not dying:
            if done is not None:
                done.set()
            return
        skipped: List[Victim] = []
        with self._cond:
            inline = not self._accepting
            if not inline:
                if victims and self._queued_victims >= self.capacity:
                    skipped, victims = victims, []
                if victims or dying:
                    self._jobs.append((victims, list(dying), done))
                    done = None
                    self._queued_victims += bool(victims)
                    self._cond.notify()
        try:
            if inline:
                self.run(victims, dying)
            elif skipped:
                self.skip(skipped)
        finally:
            if done is not None:  # not queued: done here
                done.set()

    def start(self) -> None:
        """Start the mover thread (idempotent)."""
        with self._cond:
            if self._thread is not None:
                return
            self._accepting = True
            self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking jobs (later ones are done by their submitter), let the thread finish the queued
        ones (up to ``timeout`` seconds) and end. Idempotent."""
        with self._cond:
            self._accepting = False
            self._cond.notify_all()
            t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no job is queued or running (tests, checkpoints); returns whether it is idle."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._jobs and not self._running, timeout)

    def pending(self) -> Tuple[int, int]:
        """(jobs queued, of them with victims)."""
        with self._cond:
            return len(self._jobs), self._queued_victims

    def _loop(self) -> None:
        name_thread()
        cond = self._cond
        while True:
            with cond:
                while not self._jobs and self._accepting:
                    cond.wait()
                if not self._jobs:
                    return
                victims, dying, done = self._jobs.popleft()
                self._queued_victims -= bool(victims)
                self._running += 1
            try:
                self.run(victims, dying)
            except Exception:  # a bug must not stop the mover (every later victim would stay moving)
                log.exception("moving RAM victims / deleting a disk entry failed")
            finally:
                if done is not None:
                    done.set()
                with cond:
                    self._running -= 1
                    cond.notify_all()

    # -- the work ----------------------------------------------------------------------------------------
    def run(self, victims: List[Victim], dying: List[DyingEntry]) -> None:
        for entry in dying:
            self.unlink(entry)
        self.demote(victims)

    def unlink(self, entry: DyingEntry) -> None:
        """deleting -> gone: delete the entry's file (one generation: never a newer entry of the file),
        tell the front end (``entry_unlinked`` hooks, with the generation: the file may have a newer entry
        by now, whose passthrough backing id stays), then stop counting its bytes."""
        c = self.cache
        c.disk.delete(c.ns.path(entry.fid), entry.gen, entry.csum)
        c._unlinked_hooks(entry.fid, entry.gen)
        with c.lock:
            c.table.entry_unlinked(entry)

    def skip(self, victims: List[Victim]) -> None:
        """Victims that will not be written: moving -> absent (``demotions_skipped``); every one is
        offered to the group, as a victim no disk tier takes."""
        c = self.cache
        for fid, data, mv in victims:
            if mv is not None:
                with c.lock:
                    c.counts.demotions_skipped += 1
                    c.table.drop_move(fid, mv)
                    c._unpin_locked(mv.pin, 0)
            c._offer_shared(fid, data)

    def demote(self, victims: List[Victim]) -> None:
        """Write each moving RAM victim to the disk tier if its policy admits it (moving -> resident(disk)),
        else drop it (moving -> absent) and offer it to the group. A victim without a Move was not
        demoted: it is offered to the group only."""
        c = self.cache
        for fid, data, mv in victims:
            if mv is None:
                c._offer_shared(fid, data)
                continue
            gen = csum = 0
            with c.lock:
                reservation = c._reserve_disk(fid, len(data))
            ok = False
            try:
                if reservation is not None:
                    gen, doomed = reservation
                    c._clear_victims(fid, doomed)
                    csum = c.disk.put(c.ns.path(fid), gen, (data,), len(data), mtime_ns=c._mtime_ns(fid))
                    ok = True
            except Exception as e:
                with c.lock:
                    c._count_write_failure(e)
            finally:
                with c.lock:
                    if ok:
                        c.table.commit_move(fid, mv, gen, csum)
                        c.counts.demotions += 1
                    else:
                        if reservation is not None:
                            c.disk_index.abort(fid)
                        c.table.drop_move(fid, mv)
                    c._unpin_locked(mv.pin, 0)  # the bytes are on disk (or dropped): the move's ref
            if not ok:
                c._offer_shared(fid, data)  # a RAM victim no disk tier takes goes to the group
