"""Passthrough backing ids of the kernel front end: per file, the io mode the kernel holds for its open
files (passthrough on one backing id, or cached), the entry generation each backing id was registered
from, and the ids kept registered between opens (:class:`_Modes`)."""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, NamedTuple, Optional

from ..cache.counters import DISK
from . import protocol as P

__all__ = ["BackingConflict", "KEEP_BACKING_IDS", "RELEASE_WAIT_S"]

log = logging.getLogger("shadefs.fuse")

# backing ids kept between opens, at most: each holds ~0.5 KB of unreclaimable kernel memory (a struct file and
# a fuse_backing: measured +192 B filp and +64 B kmalloc-64 slab objects per id, 470 B of SUnreclaim) and keeps
# its entry's inode and dentry (~1.3 KB) from being reclaimed; 65536 ids: ~32 MiB + ~85 MiB. (It was 256 MiB
# of entry bytes: 2,400 ids for ~110 KB files, too few for an epoch to find its id again, and up to 900k ids
# for ~300 B files. Bytes do not matter: an evicted entry's id is closed by the entry_unlinked hook.)
KEEP_BACKING_IDS = 65536
# seconds an open of a file waits for the RELEASEs of opens of a dropped (corrupt) disk entry generation that
# hold its passthrough backing id (another reader thread is handling them), before it is refused with EIO
RELEASE_WAIT_S = 2.0


class BackingConflict(OSError):
    """An open of a file while opens of a dropped generation of its disk entry hold the kernel's backing file
    for it (:meth:`_Modes.acquire`): answered EIO. ``first``: the first of the mount (logged)."""

    def __init__(self, fid: int, gen: int, opens: int, first: bool):
        super().__init__(errno.EIO, f"{opens} open(s) of the dropped disk entry generation {gen} still hold its "
                                    "passthrough backing file")
        self.fid, self.first = fid, first


class _Kept(NamedTuple):
    """A backing id kept registered after its file's last release: ``bid``, the entry's ``size`` in bytes, the
    entry generation ``gen`` it was registered from."""
    bid: int
    size: int
    gen: int


@dataclass(slots=True)
class _FileMode:
    """The io mode the kernel holds for one file while it is open: ``bid`` its backing id (None: cached mode),
    ``opens`` the opens not yet released, ``size`` the entry's bytes, ``keep`` whether the id is kept at the
    last release, ``gen`` the entry generation the id was registered from (-1: the source file's)."""
    bid: Optional[int]
    opens: int
    size: int
    keep: bool
    gen: int


class _Modes:
    """Per file: the io mode the kernel holds for its open files (passthrough on one backing id, or cached)
    and how many of our handles are open in it. Only used when passthrough was negotiated.

    Each backing id is tied to the disk entry generation it was registered from (``Handle.gen``): an open
    of a file with a backing id in use or kept (:meth:`gen_of`) is first offered to
    ``cache.open_kept(fid, gen)``, which counts the hit without opening the entry when that generation is
    still resident and verified; a backing id is reused for a disk hit only of the same generation."""

    def __init__(self, dev_fd: int, keep_ids: int = KEEP_BACKING_IDS):
        self.dev_fd = dev_fd
        self.lock = threading.Lock()
        # notified when the last open of a dropped generation is released (acquire may wait for it)
        self.cond = threading.Condition(self.lock)
        self.files: Dict[int, _FileMode] = {}   # fid -> its mode while open
        # backing ids kept registered after the last release of an NVMe hit, so that the next NVMe hit of
        # the file opens nothing and makes no ioctl (cache.open_kept); at most keep_ids (least recently
        # released first out), closed as soon as their entry is unlinked (forget) or an open of the file is
        # not an NVMe hit of the same generation
        self.kept: "OrderedDict[int, _Kept]" = OrderedDict()   # fid -> its kept backing id
        self.kept_bytes = 0                # entry bytes of the kept ids (a figure, not a bound)
        self.keep_ids = keep_ids
        # fid -> generation of its disk entry dropped as corrupt, while a state or kept id may hold it
        self.bad: Dict[int, int] = {}
        self.release_wait_s = RELEASE_WAIT_S
        self.conflicts = 0                 # opens refused: a dropped generation was still open (EIO)
        self.waits = 0                     # opens that waited for the release of a dropped generation's opens
        self.backing_errors = 0
        self.first_error: Optional[str] = None

    def gen_of(self, fid: int) -> Optional[int]:
        """The entry generation of the backing id open or kept for ``fid``, or None (no lock: a hint that
        ``cache.open_kept`` checks, and :meth:`acquire` checks again; None for the source file's)."""
        st = self.files.get(fid)
        if st is not None:
            return st.gen if st.bid is not None and st.gen >= 0 else None
        kept = self.kept.get(fid)
        return kept.gen if kept is not None else None

    def acquire(self, fid: int, h, may_wait: bool = True, source_fd: Optional[int] = None) -> Optional[int]:
        """Count one open of ``fid`` served by ``h``; returns the backing id to answer it with (None: cached
        mode). ``source_fd``: the source file, for an open served from the source (``cache.source_fd``):
        registered as the backing file when no open of ``fid`` holds an io mode (else the open joins that
        mode: a backing id of a disk entry serves the same bytes); never kept past the last release, so
        that every later open opens and checks the source file again. Its generation is -1.

        While opens of ``fid`` are counted on a backing id of a disk entry generation that was dropped as
        corrupt (:meth:`dropped`) and ``h`` is not of that generation, the kernel would read the dropped
        entry's bytes through that id: this waits up to :data:`RELEASE_WAIT_S` for their RELEASEs (handled on
        another reader thread; ``may_wait`` False: on the only one, so none can come meanwhile), then
        registers ``h``'s own backing file. Any other generation's id is reused (an evicted or promoted
        entry holds the same bytes: the snapshot does not change).

        Raises:
            BackingConflict: those opens are still open (the file's holders read the dropped entry until
                they close it; a new open cannot be given another backing file meanwhile).
        """
        stale = None
        gen = getattr(h, "gen", 0)
        with self.cond:
            st = self.files.get(fid)
            if self._on_dropped(fid, st, gen):
                if may_wait:
                    self.waits += 1
                    deadline = time.monotonic() + self.release_wait_s
                    while self._on_dropped(fid, st, gen):
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self.cond.wait(left)
                        st = self.files.get(fid)
                if self._on_dropped(fid, st, gen):
                    self.conflicts += 1
                    first = self.conflicts == 1
                    raise BackingConflict(fid, st.gen, st.opens, first)
            if st is None:
                bid = None
                kept = self.kept.get(fid)
                keep = True
                if h.outcome == DISK and kept is not None and kept.gen == gen:
                    bid = kept.bid
                else:
                    stale = kept
                    bfd = h.backing_fd()
                    if bfd is not None:
                        bid = self._backing_open(bfd)
                        # unlinked since the handle opened it (forget() ran before this file had a state)
                        keep = os.fstat(bfd).st_nlink > 0
                    elif source_fd is not None:
                        bid = self._backing_open(source_fd)
                        keep = False
                        gen = -1
                if gen >= 0 and self.bad.get(fid, gen) != gen:
                    del self.bad[fid]  # a newer generation is open: the dropped one is never opened again
                st = self.files[fid] = _FileMode(bid, 0, h.size, keep, gen)
                if kept is not None:  # after the state is set: gen_of (no lock) finds one or the other
                    del self.kept[fid]
                    self.kept_bytes -= kept.size
            st.opens += 1
            bid = st.bid
        if stale is not None:
            self._backing_close(stale[0])
        return bid

    def conflicted(self, fid: int, gen: int) -> bool:
        """Whether an open of ``fid``'s generation ``gen`` would wait in :meth:`acquire` now: opens of a
        dropped (corrupt) generation of it are still counted on that generation's backing id. A hint
        read without the lock."""
        return self._on_dropped(fid, self.files.get(fid), gen)

    def _on_dropped(self, fid: int, st: Optional[_FileMode], gen: int) -> bool:
        # opens of fid (mode st) are counted on the backing id of a dropped generation other than gen
        return st is not None and st.bid is not None and st.gen != gen and self.bad.get(fid) == st.gen

    def on_entry(self, fid: int) -> bool:
        """Whether opens of ``fid`` are counted on a backing id of a disk entry now: a new open of it joins
        that id (:meth:`acquire`: the same bytes), so an open served from the source need not open the
        source file (an open that joins the source file's own id still does: its handle serves the
        read-ahead READs from it). A hint read without the lock (the mode may end meanwhile: the open is
        then served without passthrough, by the daemon)."""
        st = self.files.get(fid)
        return st is not None and st.bid is not None and st.gen >= 0

    def wait_uncached(self, fid: int, timeout: float) -> None:
        """Wait up to ``timeout`` seconds while opens of ``fid`` are counted in cached mode (their RELEASEs
        may be in flight)."""
        with self.cond:
            deadline = None
            while True:
                st = self.files.get(fid)
                if st is None or st.bid is not None:
                    return
                now = time.monotonic()
                if deadline is None:
                    deadline = now + timeout
                if now >= deadline:
                    return
                self.cond.wait(deadline - now)

    def dropped(self, fid: int, gen: int) -> None:
        """Generation ``gen`` of ``fid``'s disk entry was dropped as corrupt (``cache.entry_dropped``): a
        backing id of it is never given to an open of another generation (:meth:`acquire`)."""
        with self.cond:
            self.bad[fid] = gen
            st = self.files.get(fid)
            if st is not None and st.gen == gen:
                st.keep = False  # closed at its last release, never kept
            kept = self._take_kept(fid, gen)
        if kept is not None:
            self._backing_close(kept)

    def _take_kept(self, fid: int, gen: int) -> Optional[int]:
        # under the lock: the backing id kept for generation ``gen`` of ``fid``, taken off the kept ids (the
        # caller closes it outside the lock); None when none is kept for that generation
        kept = self.kept.get(fid)
        if kept is None or kept.gen != gen:
            return None
        del self.kept[fid]
        self.kept_bytes -= kept.size
        return kept.bid

    def release(self, fid: int) -> None:
        with self.cond:
            st = self.files.get(fid)
            if st is None:
                return
            st.opens -= 1
            if st.opens > 0:
                return
            drop = []
            if st.bid is not None:
                if st.keep and self.keep_ids > 0:
                    # kept before the state goes: gen_of (no lock) finds the id in one or the other
                    self.kept[fid] = _Kept(st.bid, st.size, st.gen)
                    self.kept_bytes += st.size
                    while len(self.kept) > self.keep_ids:
                        _, (bid, size, _) = self.kept.popitem(last=False)
                        self.kept_bytes -= size
                        drop.append(bid)
                else:
                    drop.append(st.bid)
            del self.files[fid]
            # an open of a newer generation may wait for the last open of a dropped one (acquire), an open
            # of the source file for the last cached one (wait_uncached)
            self.cond.notify_all()
        for bid in drop:
            self._backing_close(bid)

    def forget(self, fid: int, gen: int) -> None:
        """Generation ``gen`` of ``fid``'s disk entry was unlinked (``cache.entry_unlinked``): close a backing
        id kept for that generation (it pins the unlinked file on the cache filesystem, outside the disk
        budget), and keep none of it at its last release. A backing id of another generation stays: the
        mover may unlink an old generation after a refill of the file wrote a new one and its open
        registered (and kept) the new entry's id."""
        with self.lock:
            kept = self._take_kept(fid, gen)
            st = self.files.get(fid)
            if st is not None and st.gen == gen:
                st.keep = False  # its entry is gone: closed at the last release
        if kept is not None:
            self._backing_close(kept)

    def _backing_close(self, bid: int) -> None:
        try:
            fcntl.ioctl(self.dev_fd, P.DEV_IOC_BACKING_CLOSE, bytearray(P.struct.pack("=I", bid)), True)
        except OSError as e:
            log.warning("FUSE_DEV_IOC_BACKING_CLOSE %d: %s", bid, e)

    def _backing_open(self, bfd: int) -> Optional[int]:
        try:
            return fcntl.ioctl(self.dev_fd, P.DEV_IOC_BACKING_OPEN, bytearray(P.BACKING_MAP.pack(bfd, 0, 0)), True)
        except OSError as e:
            self.backing_errors += 1
            if self.first_error is None:
                self.first_error = str(e)
                log.warning("passthrough: FUSE_DEV_IOC_BACKING_OPEN failed (%s); serving NVMe hits through the "
                            "daemon instead (logged once)", e)
            return None
