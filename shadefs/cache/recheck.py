"""A reused snapshot: each file's record is compared with the source (one ``stat``) at the file's first
open; a changed file gets the source's record and its cached copies are dropped."""
from __future__ import annotations

import logging

from .chunks import take_disk_chunks

log = logging.getLogger("shadefs.cache")


class Recheck:
    """A reused snapshot's records compared with the source at their file's first open (mixed into
    :class:`~shadefs.cache.core.TieredCache`; ``_unchecked``: the namespace's not-yet-compared flags)."""

    @property
    def rechecks(self) -> bool:
        """Whether the namespace came from a reused snapshot whose records are compared with the source at
        their file's first open (:meth:`unchecked` may be True for some file)."""
        return self._unchecked is not None

    def unchecked(self, fid: int) -> bool:
        """Whether file ``fid``'s record came from a reused snapshot and was not compared with the
        source yet (then :meth:`recheck` stats the source before anything of it is served)."""
        return self._unchecked is not None and bool(self._unchecked[fid])

    def _checked(self, fid: int) -> bool:
        """:meth:`recheck` ``fid`` if it is unchecked; False (logged) when the source cannot say."""
        if self._unchecked is None or not self._unchecked[fid]:
            return True
        try:
            self.recheck(fid)
            return True
        except OSError as e:
            log.info("%r: not checked against the source (%s)", self.ns.path(fid), e)
            return False

    def recheck(self, fid: int) -> bool:
        """Compare file ``fid``'s snapshot record with the source (one ``stat``: size, mtime and, where
        the backend has one, its version tag). A changed file gets the source's record (its new size and
        mtime are served from now on) and its cached copies are dropped (a reused disk entry is deleted),
        so it is read again. Done once per file after a snapshot is reused; returns True if it changed.
        The stat runs on the calling thread (the open waits for it); the old entry's unlink is the mover's.

        Raises:
            FileNotFoundError: the file is gone from the source (ENOENT; checked again at the next open).
            OSError: the stat failed (EIO; likewise).
        """
        ns = self.ns
        path = ns.path(fid)
        size, mtime, tag = self.backend.identify(path)
        old_tag = int(ns.etags[fid])
        changed = (size != int(ns.sizes[fid]) or mtime != int(ns.mtimes_ns[fid])
                   or (tag != 0 and old_tag != 0 and tag != old_tag))
        drop = None
        chunk_drops: list = []
        with self.lock:
            if not self._unchecked[fid]:
                return False  # another open of it checked it meanwhile
            if changed:
                self._settle_due()
                old = int(ns.sizes[fid])
                if self.disk_index is not None and fid in self.disk_index and fid not in self._flights:
                    drop = self.table.drop_entry(fid, old)
                if self.chunks is not None and self.chunks.is_chunked(fid):
                    chunk_drops = take_disk_chunks(self, fid)  # reloaded chunk entries of the old version
                    if size != old:
                        self.chunks.retire(fid)  # its chunk layout is the old size's: a whole file now
                ns.revise(fid, size, mtime, tag)
                self.counts.source_changes += 1
            self._unchecked[fid] = False
        if changed:
            log.info("%r changed at the source since the snapshot (now %d bytes, mtime %d ns): its cached "
                     "copies are dropped and it is read again", path, size, mtime)
        if drop is not None or chunk_drops:
            self.mover.submit([], ([drop] if drop is not None else []) + chunk_drops)
        return changed
