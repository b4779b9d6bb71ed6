"""NVMe hits: a disk entry opened, checked per ``--verify-entries`` and served (by ``pread``, passthrough or
from its bytes read whole), promoted to RAM when the RAM tier admits it; an entry that fails its check
is dropped as corrupt (its delete is the mover's) and the open reads the source."""
from __future__ import annotations

import errno
import logging
import os
import threading
from typing import List, Optional

from .counters import DISK, Outcome
from .handle import Handle, _pread_exact
from .movers import Victim
from .tiers import CorruptEntry

log = logging.getLogger("shadefs.cache")

# the errnos of opening a disk entry that mean the entry itself is gone or damaged (dropped as corrupt);
# any other (EMFILE, ENFILE: the daemon is out of descriptors) fails that open and keeps the entry
ENTRY_GONE_ERRNOS = frozenset({errno.ENOENT, errno.EIO})


class DiskHits:
    """Disk hits (mixed into :class:`~shadefs.cache.core.TieredCache`): an entry opened and checked
    (:meth:`_disk_hit`, :meth:`_packed_hit`), or one the caller holds already (:meth:`open_kept`);
    promotion to RAM; corrupt entries dropped."""

    def _current(self, fid: int, gen: int) -> bool:
        # under self.lock: is generation ``gen`` the resident disk entry of ``fid``?
        return fid in self.disk_index and int(self.entries.gen[fid]) == gen

    def open_kept(self, fid: int, gen: int, opener: Optional[int] = None) -> Optional[Handle]:
        """An NVMe hit whose entry the caller already holds open: generation ``gen`` of ``fid``'s disk
        entry (a FUSE passthrough backing id the kernel front end kept, which pins that entry file), for
        process ``opener``.

        Counted as one disk hit, exactly as :meth:`open_nowait` counts it, when that generation is still
        the resident entry, under ``--verify-entries first-hit``, has passed its check (its first hit
        verified it: ``verified[fid]``), would not be promoted (the RAM tier would not admit it now) and is neither
        fetching nor moving. The handle opens no entry and has no fd (:meth:`Handle.backing_fd` None):
        the caller serves the open from its own reference (a read through it, not expected, is served by
        ranges from the backend). One critical section; no path hash, no ``open``/``close``.

        Returns None, and nothing is counted, otherwise (evicted, replaced by a newer generation, dropped
        as corrupt, not yet verified, ``every-open``, promotable): the caller then opens the file the
        usual way (:meth:`open_nowait`) and must not use its reference to generation ``gen``.
        """
        with self.lock:
            self._settle_due()
            if (self.verify_entries != "first-hit" or self.disk_index is None or fid not in self.disk_index
                    or fid in self._flights or not self.verified[fid] or int(self.entries.gen[fid]) != gen):
                return None
            size = int(self.ns.size(fid))
            if self._promotable(fid, size):
                return None  # _disk_hit reads and verifies it to promote it
            self.disk_index.hit(fid)
            self._count(fid, size, DISK, opener)
        return Handle(self, fid, size, DISK, gen=gen)

    def _disk_hit(self, fid: int, size: int, gen: int, csum: int,
                  opener: Optional[int] = None) -> Optional[Handle]:
        """Serve a disk-resident file: open its entry, verify its checksum, count the hit, promote it to
        RAM when RAM admits it. None (nothing counted) when the entry was dropped, moved or corrupt. A
        packed entry: :meth:`_packed_hit`."""
        if self.disk.segments is not None and self.disk.packed(size):
            return self._packed_hit(fid, size, gen, csum, opener)
        try:
            fd = self.disk.open_entry(self.ns.path(fid), gen, csum)
        except CorruptEntry as e:
            self._drop_corrupt(fid, gen, csum, size, f"{e} ({self.ns.path(fid)!r})")
            return None
        except OSError as e:
            if e.errno not in ENTRY_GONE_ERRNOS:
                # out of descriptors (EMFILE, ENFILE) or another failure of this open, not of the entry:
                # the open fails with that errno and the entry stays
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    self.fds.out_of_descriptors()
                raise
            self._entry_gone(fid, gen, csum, size, e)
            return None
        with self.lock:  # the RAM tier would admit it now: the bytes we verify are kept to promote it
            keep = self._promotable(fid, size)
        if not keep and self.verify_entries == "first-hit":
            with self.lock:  # this generation passed at an earlier hit (cleared with every new one)
                passed = self._current(fid, gen) and self.verified[fid]
                if passed:
                    self._count(fid, size, DISK, opener)
            if passed:
                return self._entry_handle(fid, size, DISK, fd, gen, csum)
        grant = self.fills.take(size) if keep else 0  # an entry read whole is a fill buffer until promoted
        try:
            data = self.disk.verify(fd, size, csum, keep=keep)
        except CorruptEntry as e:
            self.fills.give(grant)
            os.close(fd)
            self._drop_corrupt(fid, gen, csum, size, f"{e} ({self.ns.path(fid)!r})")
            return None
        except BaseException:
            self.fills.give(grant)
            raise
        demote: List[Victim] = []
        promoted = old = None
        with self.lock:
            self._settle_due()  # (it may promote: a reservation decides on pins)
            if self._current(fid, gen):
                self.verified[fid] = True
            self._count(fid, size, DISK, opener)
            if keep:
                self.counts.entry_loads += 1
            if data is not None and self._current(fid, gen):
                demote, old, promoted = self._promote_locked(fid, size, data)
        self.fills.give(grant)
        if promoted is not None:
            os.close(fd)
            self.mover.submit(demote, [old])  # the old entry's unlink and the victims' writes
            return Handle(self, fid, size, DISK, data=data, pin=promoted)
        return self._entry_handle(fid, size, DISK, fd, gen, csum, data)

    def _entry_handle(self, fid: int, size: int, outcome: Outcome, fd: int, gen: int, csum: int,
                      data: Optional[bytes] = None) -> Handle:
        """A handle serving generation ``gen`` of ``fid``'s disk entry from ``fd`` (already checked as the
        caller's ``--verify-entries`` requires), which the handle then owns. Past the descriptor reserve
        (:class:`~shadefs.procutil.FdReserve`) the open holds no descriptor: its bytes (``data`` when the
        caller read them already) are read now and ``fd`` is closed; they are served from a buffer counted
        against :data:`LOOSE_BUFFERS`, or, with no room there, by ranges from the backend."""
        if self.fds.hold(fd):
            h = Handle(self, fid, size, outcome, fd=fd, gen=gen)
            h._csum = csum   # names the entry file again after close_entry_fd
            return h
        try:
            if data is None and size <= self.loose_budget - self.loose_bytes:  # a hint: _loose_handle decides
                data = _pread_exact(fd, size, 0)
        except OSError:
            data = None  # the entry failed mid-read: served by ranges from the backend
        finally:
            os.close(fd)
        self._fd_log(logging.WARNING, "descriptor reserve reached (soft limit %d, %d kept free for control, the "
                     "tiers and the source): NVMe hits are served without holding their entry's descriptor "
                     "(counted in stats 'descriptors', refused)", self.fds.limit(), self.fds.reserve)
        return self._loose_handle(fid, size, outcome, data)

    def _entry_gone(self, fid: int, gen: int, csum: int, size: int, e: OSError) -> None:
        # a disk hit's entry could not be opened or read (ENTRY_GONE_ERRNOS): dropped as corrupt when it
        # is still the resident generation, else it was evicted or promoted meanwhile (nothing to do)
        with self.lock:
            corrupt = self._current(fid, gen)
        if corrupt:
            self._drop_corrupt(fid, gen, csum, size, f"disk entry for {self.ns.path(fid)!r}: {e.strerror or e}")

    def _packed_hit(self, fid: int, size: int, gen: int, csum: int,
                    opener: Optional[int] = None) -> Optional[Handle]:
        """A disk hit of a packed entry (a record in a segment): one read of its header and bytes together
        (:meth:`SegmentStore.read`), checked (header always, the bytes' xxh3_64 per ``--verify-entries``),
        then counted and served from those bytes: its READs never read the record again; promoted to RAM
        with them when the RAM tier admits it. None (nothing counted) when the record was dropped, moved or
        corrupt (a corrupt one is dropped: the open reads the source)."""
        try:
            data = self.disk.segments.read(gen, csum, size,
                                           self.verify_entries != "first-hit" or not self.verified[fid])
        except CorruptEntry as e:
            self._drop_corrupt(fid, gen, csum, size, f"{e} ({self.ns.path(fid)!r})")
            return None
        except OSError as e:
            if e.errno not in ENTRY_GONE_ERRNOS:
                raise  # another failure of this open, not of the entry: the open fails, the entry stays
            self._entry_gone(fid, gen, csum, size, e)
            return None
        demote: List[Victim] = []
        promoted = old = None
        with self.lock:
            self._settle_due()  # (it may promote, or hold the bytes against the loose budget)
            current = self._current(fid, gen)
            if current:
                self.verified[fid] = True
            self._count(fid, size, DISK, opener)
            if current and self.ram_index.capacity_bytes > 0:
                demote, old, promoted = self._promote_locked(fid, size, data)
            if promoted is None:
                if self.loose_bytes + size <= self.loose_budget:
                    self.loose_bytes += size  # the record's bytes, held by the handle (LOOSE_BUFFERS)
                    return Handle(self, fid, size, DISK, data, None, None, size)
        if promoted is not None:
            self.mover.submit(demote, [old])  # the old entry's unlink and the victims' writes
            return Handle(self, fid, size, DISK, data=data, pin=promoted)
        return Handle(self, fid, size, DISK)  # no loose room: served by ranges from the backend

    def _promote_locked(self, fid: int, size: int, data: bytes):
        # under self.lock, settled (_settle_due), for a verified disk hit of ``fid`` with its bytes in hand:
        # promote it to RAM if the RAM tier takes it (resident(ram); its old entry: deleting). Returns (RAM
        # victims to demote, the old entry to unlink, the pin), ([], None, None) when RAM refuses it
        victims = self.ram_index.reserve(fid, size)
        if victims is None:
            return [], None, None
        demote = self._evict_ram(victims)
        old = self.table.promote(fid, size, data, self.ram)
        self.counts.promotions += 1
        return demote, old, self._pin_ram(fid, size)

    def _promotable(self, fid: int, size: int) -> bool:
        # under self.lock: would a disk hit of ``fid`` be promoted now (the RAM tier's policy admits it and
        # its victims free the room)? Only then is its entry read whole into the daemon; otherwise it is
        # served from the entry (pread or passthrough) and, when checked, checked by pieces
        return self.ram_index.would_admit(fid, size)

    def _drop_corrupt(self, fid: int, gen: int, csum: int, size: int, why: str) -> None:
        # resident(disk) -> absent; the entry (deleting) is unlinked by the mover, never on this thread
        with self.lock:
            if not self._current(fid, gen) or fid in self._flights:
                return  # evicted meanwhile, not corrupt
            dying = self.table.drop_entry(fid, size)
            self.counts.corrupt_entries += 1
            self._stale_pages.add(fid)
            # the file's next open waits for this delete (on a thread that may block: open(), never
            # open_nowait) when its refill needs the entry's bytes back in the budget
            done = self._unlinking[fid] = threading.Event()
        log.warning("dropping corrupt disk entry: %s", why)
        for hook in self.entry_dropped:
            hook(fid, gen)
        self.mover.submit([], [dying], done)

    def _unlinked_hooks(self, fid: int, gen: int) -> None:
        for hook in self.entry_unlinked:
            hook(fid, gen)
