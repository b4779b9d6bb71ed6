"""Reading ahead of opens: warm-up (``shadefs warm``, the group's files at mount) into the tiers through
their policies, and the plan prefetcher's reads into its window (:mod:`shadefs.plan.prefetch`), both
through the same single-flight as an open (:mod:`shadefs.cache.fetch`): a file is never read twice."""
from __future__ import annotations

import concurrent.futures as cf

from ..backends.timeout import on_deadline
from ..cache.state import SOURCE_SHARED, Move

__all__ = ["Fill", "PrefetchFuture"]


class PrefetchFuture(cf.Future):
    """The in-flight table's entry for a read ahead (:meth:`TieredCache.prefetch` with ``hold``): resolves
    to ``(bytes, source)`` (source ``"miss"``: the backend, ``"shared"``: the group), or None if the read
    failed (the waiting open then reads the file itself)."""

    prefetch = True


def _resolve(fut: PrefetchFuture, result) -> None:
    # the first of the read's return and its deadline (the watchdog's thread) resolves the entry
    try:
        fut.set_result(result)
    except cf.InvalidStateError:
        pass


class Fill:
    """Reading ahead of opens (mixed into :class:`~shadefs.cache.core.TieredCache`): warm-up into the tiers
    and the plan prefetcher's reads into its window, through the open's single-flight."""

    def fetchable(self, fid: int) -> bool:
        """Whether a read ahead of ``fid`` would start now: in no tier, not moving, no read of it in flight
        (an open's or a prefetch's); never a chunked file (its chunks are read as its READs reach them).
        Caller holds :attr:`lock`."""
        return (self._absent(fid) and fid not in self._inflight
                and (self.chunks is None or not self.chunks.is_chunked(fid)))

    def prefetch(self, fid: int, hold=None, keep_only: bool = False) -> str:
        """Read ``fid`` ahead of its open without counting an open, through the same single-flight as
        :meth:`open`: the one entry point for reading ahead (``warm``, the plan prefetcher).

        Args:
            hold: None (warm-up): the bytes go into the tiers through their policies, as a miss's do.
                Else ``hold(fid, data, source) -> bool`` (the plan prefetcher's window), called under
                :attr:`lock` once the bytes are read, ``source`` ``"shared"`` (the group held them; asked
                first, within its deadline) or ``"miss"`` (the backend): the tiers are not offered the
                bytes now but at the file's open, so they decide the same with and without prefetching.
                While the read is in flight, an open of ``fid`` waits for it (counted ``late``) and never
                starts another; the bytes ``hold`` keeps are taken by the open (``ready``).
            keep_only: warm-up: a file no tier of this node admits is not read (without it, a mount with a
                shared tier reads it to offer it to the group, as a miss does).

        Returns:
            ``"resident"`` (already cached or moving: nothing read); warm-up: ``"ram"`` / ``"disk"``
            (admitted there) or ``"rejected"`` (the policies did not admit it, or the disk write failed);
            with ``hold``: ``"fetching"`` (a read of it is in flight already: nothing started), ``"held"``
            or ``"dropped"`` (read, and ``hold`` returned True / False).

        Raises:
            FileNotFoundError, OSError: as :meth:`open` (with ``hold``: the in-flight entry is resolved to
                None first, so a waiting open reads the file itself).
        """
        fid = int(fid)
        if self._unchecked is not None and self._unchecked[fid]:
            self.recheck(fid)
        if self.chunks is not None and self.chunks.is_chunked(fid):
            return self._prefetch_chunks(fid, hold, keep_only)
        size = int(self.ns.size(fid))
        if hold is not None:
            return self._read_ahead(fid, size, hold)
        with self.lock:
            if fid in self.ram_index or (self.disk_index is not None and fid in self.disk_index):
                return "resident"
            fl = self._flights.get(fid)
            if type(fl) is Move:
                return "resident"
            leader = fl is None
            if leader:
                fl, demote = self._start_fetch(fid, size, memory=not keep_only)
                if fl is None:
                    return "rejected"
        if leader:
            self._lead(fid, size, fl, demote)
        else:
            fl.done.wait()
            if fl.error is not None:
                raise fl.error
        return fl.tier or "rejected"

    def _prefetch_chunks(self, fid: int, hold, keep_only: bool) -> str:
        """:meth:`prefetch` of a chunked file: warm-up reads each chunk into the tiers (``"ram"`` /
        ``"disk"`` when one was admitted there, RAM first, else ``"rejected"``); a read ahead into a
        plan's window (``hold``) reads nothing (``"resident"``: its chunks are read at its READs)."""
        if hold is not None:
            return "resident"
        first, count = self.chunks.span(fid)
        got = {self.prefetch(first + k, keep_only=keep_only) for k in range(count)}
        return next((t for t in ("ram", "disk", "resident") if t in got), "rejected")

    def _read_ahead(self, fid: int, size: int, hold) -> str:
        """:meth:`prefetch` into ``hold`` (its docstring): registered in the in-flight table, read from the
        group or the backend outside the lock, handed to ``hold`` under it."""
        with self.lock:
            fl = self._flights.get(fid)
            if fid in self.ram_index or (self.disk_index is not None and fid in self.disk_index) or \
                    type(fl) is Move:
                return "resident"
            if fl is not None or fid in self._inflight:
                return "fetching"
            fut = PrefetchFuture()
            self._inflight[fid] = fut
        data, source, err = None, "miss", None
        try:
            # a backend read of this thread past its deadline (the backend's watchdog) lets the opens
            # waiting on it go on at once: each reads the file itself (and fails fast while it is stuck)
            with on_deadline(lambda e: self._read_ahead_abandoned(fid, fut), answers=False):
                shared = self.shared
                if shared is not None and size <= shared.max_file:
                    data = shared.get(self.shared_key(fid), size)  # None past its deadline: read the backend
                if data is None:
                    data = self._backend_read(fid, size)
                else:
                    source = "shared"
        except BaseException as e:
            err = e
        kept = False
        try:
            with self.lock:
                if self._inflight.get(fid) is fut:  # (else let go at its deadline)
                    del self._inflight[fid]
                if err is None:
                    if source == "miss":
                        self.counts.backend_bytes += size
                    kept = bool(hold(fid, data, source))
                else:
                    self.counts.backend_errors += not isinstance(err, FileNotFoundError)
        finally:
            _resolve(fut, None if err is not None else (data, source))
        if err is not None:
            raise err
        return "held" if kept else "dropped"

    def _read_ahead_abandoned(self, fid: int, fut: PrefetchFuture) -> None:
        # the backend's watchdog, for a read ahead past its deadline: out of the in-flight table, and the
        # opens waiting on it look again (none finds it in flight now: each reads the file itself)
        with self.lock:
            if self._inflight.get(fid) is fut:
                del self._inflight[fid]
        _resolve(fut, None)

    def warm_shared(self, fids) -> int:
        """Read the files of ``fids`` the group holds in one pipelined batch and admit them to this node's
        tiers through the state machine (``warm``); not counted as opens. Returns how many came from the
        shared tier and were admitted."""
        if self.shared is None:
            return 0
        with self.lock:
            todo = [int(f) for f in fids if self._absent(int(f))]
        todo = [f for f in todo if self._checked(f) and int(self.ns.size(f)) <= self.shared.max_file
                and (self.chunks is None or not self.chunks.is_chunked(f))]
        n = 0
        for i in range(0, len(todo), 64):
            batch = todo[i:i + 64]
            got = self.shared.get_many([self.shared_key(f) for f in batch], [int(self.ns.size(f)) for f in batch])
            for f, data in zip(batch, got):
                if data is None:
                    continue
                with self.lock:
                    if not self._absent(f):
                        continue
                    fl, demote = self._start_fetch(f, len(data), source=SOURCE_SHARED)
                if fl is None:
                    continue
                self._lead(f, len(data), fl, demote, data=data)
                n += fl.tier is not None
        return n
