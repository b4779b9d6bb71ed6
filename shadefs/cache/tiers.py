"""Where cached bytes live: :class:`MemoryTier` (RAM) and :class:`DiskTier` (an NVMe directory).

A tier stores and returns exact copies of source files keyed by file id. It never decides what to keep:
admission, eviction and the byte budget belong to :class:`shadefs.cache.index.TierIndex` and its policy.
Tier methods are called without the cache lock held, so they must be safe from several threads.

Disk entries are written atomically (a temporary file in the same filesystem, then ``rename``) under
names hashed from the source URL and the file's path, so two mounts of different sources can share a
cache directory without colliding, and a crash leaves either a whole entry or none under its final name.
Each entry's name also carries a generation number (unique, growing) and the xxh3_64 checksum of its
bytes: a delete of an old generation can never remove a newer entry of the same file, and every disk
hit is verified against the checksum before it is served.
Each entry carries the source file's mtime (set before the rename), so a restarted daemon can tell a
valid entry from a stale one with one ``stat`` and without reading data (:mod:`shadefs.cache.persist`).
One daemon at a time owns a namespace: an ``flock`` on ``<namespace>/lock``, released by the kernel
when the daemon dies, however it dies.
Entries smaller than ``pack_below`` bytes (with their record header) are not files: they are records in
the append-only segments of a :class:`~shadefs.cache.segments.SegmentStore` under ``<namespace>/seg/``,
read with one ``pread`` on an open fd. The tier's budget is in device bytes (:meth:`DiskTier.cost`,
:meth:`DiskTier.bind`).
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import itertools
import shutil
import time
from typing import Dict, Iterable, Optional

import numpy as np
import xxhash

from ..fsutil import removing_on_error, rename_into
from .segments import (HEADER, PACK_BELOW, SEG_DIR, SLACK_SHARE, CorruptEntry, SegmentStore,  # noqa: F401
                       segment_bytes_for)

__all__ = ["MemoryTier", "DiskTier", "EntryTable", "CorruptEntry", "DiskFloorReached", "CompactionBehind",
           "CacheDirInUse",
           "entry_name", "entry_cost", "ENTRY_NAME_LEN"]

ENTRY_NAME_LEN = 64 + 1 + 16 + 1 + 16  # <sha256 hex>.<generation, 16 hex>.<xxh3_64, 16 hex>


def entry_cost(size: int, pack_below: int, block: int = 4096) -> int:
    """Device bytes a disk-tier entry of ``size`` bytes is charged: when its record (``HEADER + size``) is
    below ``pack_below`` (packed into a segment), the record and a :data:`SLACK_SHARE`-th of it (the dead
    bytes compaction lets lie, :meth:`SegmentStore.slack_limit`), else its file's blocks (``size``
    rounded up to ``block``). The disk tier and the simulator (``shadefs simulate --disk-pack-below``)
    charge this."""
    if size + HEADER < pack_below:
        return size + HEADER + (size + HEADER) // SLACK_SHARE
    return -(-size // block) * block


def entry_name(digest_hex: str, gen: int, csum: int) -> str:
    """The file name of one generation of an entry: ``<sha256(path) hex>.<gen:016x>.<xxh3_64:016x>``."""
    return f"{digest_hex}.{gen:016x}.{csum:016x}"


class EntryTable:
    """Generation and checksum (xxh3_64) of each file's disk entry, by file id: 16 bytes per file of
    the snapshot. Meaningful only for files resident in the disk tier; written under the cache lock."""

    def __init__(self, num_files: int):
        self.gen = np.zeros(int(num_files), dtype=np.uint64)
        self.csum = np.zeros(int(num_files), dtype=np.uint64)


class DiskFloorReached(OSError):
    """A write was refused because it would leave less than ``--disk-min-free`` on the cache filesystem."""

    def __init__(self, message: str):
        super().__init__(message)
        self.errno = errno.ENOSPC


class CompactionBehind(OSError):
    """A fill was refused: its packed victims' records would not fit in the segments' slack within the
    wait (the compaction thread fell behind). Counted with ``disk_writes_refused``."""

    def __init__(self, message: str):
        super().__init__(message)
        self.errno = errno.ENOSPC


class CacheDirInUse(OSError):
    """Another live daemon owns this cache namespace (same source, same cache directory)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.errno = errno.EBUSY


class MemoryTier:
    """Bytes in a dict, fid -> immutable ``bytes`` (shared with readers without copying)."""

    name = "ram"

    def __init__(self):
        self._data: Dict[int, bytes] = {}

    def get(self, fid: int) -> Optional[bytes]:
        return self._data.get(fid)

    def put(self, fid: int, data: bytes) -> None:
        self._data[fid] = data

    def pop(self, fid: int) -> Optional[bytes]:
        return self._data.pop(fid, None)

    def clear(self) -> None:
        self._data.clear()


class DiskTier:
    """Whole-file entries in a directory on local (NVMe) storage.

    Layout: ``DIR/<namespace>/<h[:2]>/<h>.<gen:016x>.<xxh3_64:016x>`` where ``namespace`` = sha256(source URL)[:16] and ``h`` =
    sha256(relative path) hex; temporary files go to ``DIR/<namespace>/tmp/`` (emptied at start: a
    leftover there is a write a crash interrupted). The namespace directory is 0700 and entries 0600:
    cached training data is as private as the daemon's user.

    Args:
        root: the cache directory (created if missing).
        source_url: the mounted source, which names this cache's namespace inside ``root``.
        min_free: bytes to keep free on the cache filesystem; a write that would go below is refused
            with :class:`DiskFloorReached` (0: no floor).
        lock: take the namespace lock (a second daemon on the same source and directory fails).
        lock_wait_s: how long to wait for the lock (a daemon that was just unmounted may still be
            writing its last checkpoint).
        pack_below: entries whose size plus the 64-byte record header is below this many bytes are
            packed into segments (0: every entry is a file; a multiple of the filesystem block size).
        segment_bytes: the size at which a segment is sealed (default: :func:`segment_bytes_for` the
            budget given to :meth:`bind`).

    Raises:
        CacheDirInUse: ``lock`` and another process holds the namespace after ``lock_wait_s``.
        OSError: the directory cannot be created.
    """

    name = "disk"
    LOCK_FILE = "lock"
    REWRITTEN = ("index.bin", "scores.bin")  # checkpoints: a second copy exists while one is replaced
    DIGESTS_FILE = "pathdigests.bin"

    @staticmethod
    def dir_for(root: str, source_url: str) -> str:
        """The namespace directory of ``source_url`` inside the cache directory ``root``."""
        ns = hashlib.sha256(source_url.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        return os.path.join(os.path.abspath(root), ns)

    def __init__(self, root: str, source_url: str, min_free: int = 0, lock: bool = True,
                 lock_wait_s: float = 5.0, pack_below: int = 0, segment_bytes: Optional[int] = None):
        self.root = os.path.abspath(root)
        self.dir = self.dir_for(root, source_url)
        self.tmp_dir = os.path.join(self.dir, "tmp")
        os.makedirs(self.tmp_dir, mode=0o700, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self._lock_file = None
        if lock:
            self._lock_file = open(os.path.join(self.dir, self.LOCK_FILE), "a+")
            deadline = time.monotonic() + lock_wait_s  # a daemon just unmounted may still be checkpointing
            while True:
                try:
                    fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() < deadline:
                        time.sleep(0.05)
                        continue
                    self._lock_file.seek(0)
                    owner = self._lock_file.read().strip() or "another process"
                    self._lock_file.close()
                    raise CacheDirInUse(f"cache directory {self.root!r} is in use for this source "
                                        f"by {owner}; give each mount of the same source its own --disk-cache")
            self._lock_file.seek(0)
            self._lock_file.truncate()
            self._lock_file.write(f"pid {os.getpid()}\n")
            self._lock_file.flush()
        # leftovers of a crash mid-write are never valid entries
        self.tmp_leftovers = 0
        for name in os.listdir(self.tmp_dir):
            try:
                os.unlink(os.path.join(self.tmp_dir, name))
                self.tmp_leftovers += 1
            except OSError:
                pass
        self.min_free = int(min_free)
        self._table: Optional[EntryTable] = None
        self._gen_floor = 0
        self._gen = itertools.count(time.time_ns())  # generations only grow, across restarts too
        st = os.statvfs(self.dir)
        self.block = max(512, st.f_frsize or 4096)  # allocation unit of the cache filesystem
        self.pack_below = int(pack_below)
        if self.pack_below and self.pack_below % self.block:
            raise ValueError(f"pack_below ({self.pack_below}) must be a multiple of the filesystem block "
                             f"({self.block} bytes)")
        self.segments: Optional[SegmentStore] = None
        self._segment_bytes_set = segment_bytes is not None
        if self.pack_below:
            self.segments = SegmentStore(os.path.join(self.dir, SEG_DIR), segment_bytes or (64 << 20))
        self.overhead_bytes = 0  # device bytes kept from entries: metadata, page slack (set by bind)

    # -- device bytes ----------------------------------------------------------------------------------
    def packed(self, size: int) -> bool:
        """Whether an entry of ``size`` bytes is a record in a segment (else a file of its own)."""
        return size + HEADER < self.pack_below

    def cost(self, size: int) -> int:
        """Device bytes an entry of ``size`` bytes is charged (:func:`entry_cost`): its record and its
        share of the segments' slack when packed, else its file's allocated blocks."""
        return entry_cost(size, self.pack_below, self.block)

    def metadata_bytes(self) -> int:
        """Allocated bytes (``st_blocks * 512``) of the namespace's files that are not entries: the
        lock, the snapshot, the manifest, the path digests, the scores, temporaries."""
        total = 0
        for top, dirs, files in os.walk(self.dir):
            rel = os.path.relpath(top, self.dir)
            if rel != "." and (len(rel) == 2 or rel == SEG_DIR):
                dirs[:] = []
                continue
            for name in files:
                if rel == "." and name in self.REWRITTEN:
                    continue  # counted by their allowance (account)
                try:
                    total += os.lstat(os.path.join(top, name)).st_blocks * 512
                except OSError:
                    pass
        return total

    def account(self, index) -> int:
        """Set ``index.overhead_bytes`` to the device bytes the tier needs besides its entries: the
        metadata on disk now, room to rewrite the manifest and scores (a second copy while each is
        replaced; the manifest at 64 bytes per file entry, at most ``budget / pack_below`` of them), one
        page of the active segment, one page of a seal's padding. Returns it."""
        self.overhead_bytes = self._overhead(index.capacity_bytes, self.metadata_bytes())
        index.overhead_bytes = self.overhead_bytes
        return self.overhead_bytes

    def _overhead(self, capacity: int, meta: int) -> int:
        files = capacity // max(self.pack_below, self.block) + 1  # file entries cost >= pack_below
        manifest = -(-(64 + 64 * files) // self.block) * self.block
        scores = 0
        try:
            scores = os.lstat(os.path.join(self.dir, "scores.bin")).st_blocks * 512
        except OSError:
            pass
        if self._table is not None and not os.path.exists(os.path.join(self.dir, self.DIGESTS_FILE)):
            meta += -(-(64 + 32 * len(self._table.gen)) // self.block) * self.block  # written at a checkpoint
        pages = 2 * self.block if self.segments is not None else 0  # the active segment's tail, a seal's pad
        return meta + 2 * manifest + 2 * max(scores, self.block) + pages

    def footprint(self, sizes: np.ndarray, extra: int = 0) -> int:
        """The budget (device bytes) that holds entries of every one of ``sizes`` (source bytes) and
        the tier's overhead (:meth:`account`), with ``extra`` metadata bytes still to be written."""
        sizes = np.asarray(sizes, dtype=np.int64)
        packed = sizes + HEADER < self.pack_below
        need = int(np.sum(np.where(packed, (sizes + HEADER) + (sizes + HEADER) // SLACK_SHARE,
                                   -(-sizes // self.block) * self.block)))
        meta = self.metadata_bytes() + -(-int(extra) // self.block) * self.block
        budget = need
        for _ in range(4):
            budget = need + self._overhead(budget, meta)
            if self.segments is not None:  # the segments' slack (bind)
                budget += self.slack_for(budget)
        return budget

    def slack_for(self, budget: int) -> int:
        """Device bytes a tier of ``budget`` bytes keeps from its entries for the segments' slack, besides
        each record's share (:func:`entry_cost`): ``2 * pack_below`` of dead records (a fill's victims
        always fit) and one segment for a compaction's copy. 0 without packing."""
        if self.segments is None:
            return 0
        return 2 * self.pack_below + self._segment_bytes_for(budget)

    def _segment_bytes_for(self, budget: int) -> int:
        if self._segment_bytes_set:
            return self.segments.segment_bytes
        return max(self.pack_below, segment_bytes_for(budget))

    def bind(self, index, lock) -> None:
        """Make ``index`` (this tier's :class:`~shadefs.cache.index.TierIndex`) count device bytes:
        entries by :meth:`cost`, the metadata as overhead (:meth:`account`) and, with packing, the
        segments' slack (:meth:`slack_for`) as headroom. A packed victim's record frees its bytes for
        admission at once, as a file victim's does: the dead record is the segments' slack, which a fill
        keeps within :meth:`SegmentStore.slack_limit` (``2 * pack_below`` and each live record's share)
        by waiting for compaction (:meth:`make_room`) before it deletes its victims. So admission follows
        the policy's ranking whatever the packing, and the segments never take more than their entries and
        the slack. ``lock`` is unused (kept for callers)."""
        index.charge = self.cost
        index.pack_below = self.pack_below if self.segments is not None else 0
        if self.segments is None:
            self.account(index)
            return
        seg = self.segments
        if not self._segment_bytes_set:
            seg.segment_bytes = max(self.pack_below, segment_bytes_for(index.capacity_bytes))
        seg.on_reclaimed = seg.on_dead = seg.on_hold = seg.on_unhold = None
        seg.slack_base = 2 * self.pack_below
        index.headroom_bytes = seg.slack_base + seg.segment_bytes
        self.account(index)

    def make_room(self, gens, timeout: float) -> bool:
        """Before a fill deletes its victims (generations ``gens``): wait until their packed records fit
        in the segments' slack (:meth:`SegmentStore.make_room`). True when granted or nothing is packed;
        False after ``timeout`` seconds (compaction behind: the caller refuses the fill)."""
        if self.segments is None:
            return True
        return self.segments.make_room(gens, timeout)

    @staticmethod
    def key(relpath: str) -> str:
        return hashlib.sha256(relpath.encode("utf-8", "surrogateescape")).hexdigest()

    def entry_file(self, relpath: str, gen: int, csum: int) -> str:
        """Path of generation ``gen`` of ``relpath``'s entry, whose bytes hash to ``csum`` (xxh3_64)."""
        h = self.key(relpath)
        return os.path.join(self.dir, h[:2], entry_name(h, gen, csum))

    def table(self, num_files: int) -> "EntryTable":
        """The generation and checksum of every resident entry, by entry id (created on first use, for
        ``num_files`` ids; a table created for more, the chunks' ids above the files', serves too)."""
        if self._table is None:
            self._table = EntryTable(num_files)
        elif len(self._table.gen) < num_files:
            raise ValueError(f"entry table has {len(self._table.gen)} files, not {num_files}")
        return self._table

    def next_gen(self) -> int:
        """A generation number never used before in this namespace (thread-safe)."""
        return next(self._gen)

    def seen_gen(self, gen: int) -> None:
        """A reload found ``gen`` on disk: later generations start above it."""
        if gen >= self._gen_floor:
            self._gen_floor = gen + 1
            self._gen = itertools.count(max(self._gen_floor, time.time_ns()))

    def free_bytes(self) -> int:
        """Bytes available to us on the cache filesystem now (``statvfs``)."""
        st = os.statvfs(self.dir)
        return st.f_bavail * st.f_frsize

    def total_bytes(self) -> int:
        """Size of the cache filesystem in bytes (``statvfs``)."""
        st = os.statvfs(self.dir)
        return st.f_blocks * st.f_frsize

    def mtime_tolerance_ns(self) -> int:
        """How far an entry's mtime may be from the one we set (the filesystem's timestamp granularity).

        Probed with one temporary file: ext4/xfs/btrfs/tmpfs keep nanoseconds (tolerance 1 us: entries
        stamped from float seconds, as earlier versions did, are within it); a filesystem that keeps
        seconds gets 1 s.
        """
        probe = os.path.join(self.tmp_dir, f"probe.{os.getpid()}")
        want = 1_600_000_000_123_456_789
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.utime(fd, ns=(want, want))
            diff = abs(os.fstat(fd).st_mtime_ns - want)
        finally:
            os.close(fd)
            os.unlink(probe)
        return 1000 if diff < 1000 else 10 ** len(str(diff))

    def open_entry(self, relpath: str, gen: int, csum: int) -> int:
        """An ``O_RDONLY`` fd of an entry (the caller closes it).

        Raises:
            FileNotFoundError: no such entry (deleted, or never written).
            OSError: the cache disk failed.
        """
        return os.open(self.entry_file(relpath, gen, csum), os.O_RDONLY | os.O_CLOEXEC)

    @staticmethod
    def verify(fd: int, size: int, csum: int, keep: bool, chunk: int = 1 << 20) -> Optional[bytes]:
        """Read the entry open on ``fd`` from offset 0 and check its length and xxh3_64 checksum.

        Args:
            keep: return the bytes, read into one buffer of ``size`` bytes (one ``pread`` of ``size + 1``
                bytes: a promotion's bytes exist once, never as pieces and their join); else they are
                read in ``chunk``-byte pieces and dropped.

        Returns:
            The ``size`` bytes when ``keep``, else None.

        Raises:
            CorruptEntry: the entry is not exactly ``size`` bytes, its checksum differs, or it cannot be read.
        """
        if keep:
            return DiskTier._load(fd, size, csum)
        h = xxhash.xxh3_64()
        got = 0
        try:
            # each pread asks for one byte more than is left: a short read is the end of the file, so an
            # entry below ``chunk`` bytes is checked with one pread (and one past its end shows it longer)
            while True:
                want = min(chunk, size - got + 1)
                piece = os.pread(fd, want, got)
                got += len(piece)
                if got > size:
                    break
                h.update(piece)
                if len(piece) < want:
                    break
        except OSError as e:
            raise CorruptEntry(f"disk entry unreadable: {e.strerror or e}") from e
        DiskTier._check(got, size, h.intdigest(), csum)
        return None

    @staticmethod
    def _load(fd: int, size: int, csum: int) -> bytes:
        # the whole entry in one bytes object: pread allocates size + 1 bytes and shrinks the object in
        # place to what it read (a short read, legal but not seen on a regular file, is completed by
        # pieces joined once)
        try:
            data = os.pread(fd, size + 1, 0)
            if 0 < len(data) < size:
                parts = [data]
                got = len(data)
                while got <= size:
                    piece = os.pread(fd, size + 1 - got, got)
                    if not piece:
                        break
                    parts.append(piece)
                    got += len(piece)
                data = b"".join(parts)
        except OSError as e:
            raise CorruptEntry(f"disk entry unreadable: {e.strerror or e}") from e
        DiskTier._check(len(data), size, xxhash.xxh3_64_intdigest(data) if len(data) == size else 0, csum)
        return data

    @staticmethod
    def _check(got: int, size: int, digest: int, csum: int) -> None:
        if got != size:
            raise CorruptEntry(f"disk entry has {got if got < size else 'more than ' + str(size)} bytes, "
                               f"expected {size}")
        if digest != csum:
            raise CorruptEntry(f"disk entry checksum {digest:016x} differs from {csum:016x}")

    def check_floor(self, size: int) -> None:
        """Raises :class:`DiskFloorReached` when writing ``size`` bytes would go below ``min_free``."""
        if self.min_free:
            free = self.free_bytes()
            if free - size < self.min_free:
                raise DiskFloorReached(f"{free} bytes free on the cache filesystem, writing {size} "
                                       f"would go below --disk-min-free ({self.min_free} bytes)")

    def put(self, relpath: str, gen: int, chunks: Iterable[bytes], size: int,
            mtime_ns: Optional[int] = None) -> int:
        """Write generation ``gen`` of ``relpath``'s entry atomically: the ``chunks`` (``size`` bytes in
        all) go to a temporary file in ``tmp/``, stamped with the source's ``mtime_ns``, then renamed to
        :meth:`entry_file` (which names the checksum). Returns the checksum (xxh3_64 of the bytes).

        Raises:
            DiskFloorReached: the write would leave less than ``min_free`` bytes free (nothing written).
            OSError: the write failed (for example ENOSPC); nothing is left behind.
            ValueError: the chunks were not ``size`` bytes (nothing is left behind).
            Exception: whatever iterating ``chunks`` raises (nothing is left behind).
        """
        self.check_floor(size)
        if self.segments is not None and self.packed(size):
            data = b"".join(chunks)
            if len(data) != size:
                raise ValueError(f"entry of {relpath!r}: {len(data)} bytes written, expected {size}")
            digest = hashlib.sha256(relpath.encode("utf-8", "surrogateescape")).digest()
            return self.segments.append(digest, gen, 0 if mtime_ns is None else mtime_ns, data)
        h = self.key(relpath)
        tmp = os.path.join(self.tmp_dir, f"{h}.{gen:016x}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with removing_on_error(tmp):
            x = xxhash.xxh3_64()
            written = 0
            try:
                for c in chunks:
                    x.update(c)
                    view = memoryview(c)
                    while view:
                        view = view[os.write(fd, view):]
                    written += len(c)
                if written != size:
                    raise ValueError(f"entry of {relpath!r}: {written} bytes written, expected {size}")
                if mtime_ns is not None:
                    os.utime(fd, ns=(mtime_ns, mtime_ns))
            finally:
                os.close(fd)
            csum = x.intdigest()
            rename_into(tmp, os.path.join(self.dir, h[:2], entry_name(h, gen, csum)))
        return csum

    def delete(self, relpath: str, gen: int, csum: int, promised: bool = False) -> None:
        """Unlink one generation of an entry (missing is fine; a failing disk is ignored: the entry is out
        of the index already, and the next reload drops what is left). A packed entry's record is marked
        dead: its bytes are the segments' slack until its segment is reclaimed (``promised``: granted by
        :meth:`make_room`)."""
        if self.segments is not None and gen in self.segments:
            self.segments.delete(gen, promised=promised)
            return
        self.delete_entry(self.entry_file(relpath, gen, csum))

    @staticmethod
    def delete_entry(path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            pass

    def clear(self) -> None:
        """Remove every entry of this namespace (keeps the directory, the lock and the tmp folder)."""
        for name in os.listdir(self.dir):
            if len(name) == 2:
                shutil.rmtree(os.path.join(self.dir, name), ignore_errors=True)
        if self.segments is not None:
            self.segments.clear()

    def close(self) -> None:
        """Stop compaction, close the segments, release the namespace lock. Idempotent."""
        if self.segments is not None:
            self.segments.close()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None
