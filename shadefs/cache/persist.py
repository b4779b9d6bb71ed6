"""What survives a daemon restart or crash: the NVMe tier's entries and the importance scores.

Every disk entry is written atomically under ``<sha256(path)>.<generation>.<xxh3_64 of its bytes>`` and
stamped with the source file's mtime (:class:`~shadefs.cache.tiers.DiskTier`), so the directory itself is
a valid index after any crash.
:func:`reload_disk_tier` rebuilds the tier's :class:`~shadefs.cache.index.TierIndex` at mount, before
the first open, and never reads cached data:

1. take the manifest ``index.bin`` (digest, size, mtime, generation of every resident entry, in index
   order), written
   by :class:`Checkpointer` right after the mount, every ``interval`` seconds when the tier changed, and
   at unmount, and delete it before anything is written, so a manifest on disk was always written by the
   last daemon that wrote entries;
2. list the ``<namespace>/<2 hex>/<64 hex>.<16 hex>.<16 hex>`` entries by name only (``getdents``, no
   ``stat``); anything else there (a misplaced or misnamed file, or one that is not a regular file) is
   corrupt and deleted; of two generations of one file (a crash before a delete) the older is stale;
3. map names to file ids by hashing every snapshot path once (vectorised matching; the digests are
   cached in ``pathdigests.bin`` under a fingerprint of the path list, so an unchanged dataset skips
   the hashing); names no snapshot path hashes to are stale (the file left the source);
4. take size and mtime from the manifest row of the same generation; ``stat`` only entries it does not
   list (after a crash: those
   written since the last checkpoint, at most one interval of writes; every entry when there is none);
5. keep an entry only if size and mtime equal the snapshot's, and, where both the manifest row and the
   listing carry one (S3), the ETag too: another mtime or ETag means the source changed (stale); the
   same mtime with another size is a partial entry (corrupt); dropped entries are deleted.
   An entry whose bytes were lost or changed after the manifest was written (power loss, a flipped bit)
   is caught at its first read (:class:`~shadefs.cache.tiers.CorruptEntry`: length and checksum) and
   read from the backend;
6. re-admit the rest in manifest order, then by ctime (which the final ``rename`` sets): all at once
   when they fit the budget, else one by one through the policy, deleting what it refuses or evicts (the
   budget shrank), so the byte budget holds and LRU/FIFO order is approximately kept.

Importance scores are checkpointed to ``scores.bin`` beside it (paths + float32) by the same
:class:`Checkpointer` and reloaded by :func:`load_scores` before the disk tier, so an importance-aware
policy ranks the reloaded entries. Every file is written to ``tmp/`` and renamed into place.

Packed entries (records in the segments of :class:`~shadefs.cache.segments.SegmentStore`) are not in the
manifest: their headers carry digest, size, mtime and generation, and the segments are read whole at
mount (each record's header CRC and checksum checked; a torn record ends its segment), then matched like
the entry files. The dead bytes left in the segments are their slack until compaction reclaims them.

Must never: read cached data at mount (but the segments), keep an entry whose size or mtime differs from the snapshot,
trust a manifest another daemon may have outdated, or leave the tier over its byte budget.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import stat as stat_mod
import struct
import threading
import time
import zlib
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..fsutil import atomic_write
from ..namespace import Namespace
from ..policies.base import Importance
from .index import TierIndex
from .segments import HEADER
from .tiers import ENTRY_NAME_LEN, DiskTier

__all__ = ["ReloadReport", "reload_disk_tier", "PathDigests", "path_digests", "write_index", "read_index",
           "save_scores", "read_scores", "load_scores", "Checkpointer", "SCORES_FILE", "DIGESTS_FILE",
           "INDEX_FILE"]

log = logging.getLogger("shadefs.persist")

SCORES_FILE = "scores.bin"
DIGESTS_FILE = "pathdigests.bin"
INDEX_FILE = "index.bin"
_INDEX_MAGIC = b"SHADEFS-DISKINDEX-2\n"
_SCORES_MAGIC = b"SHADEFS-SCORES-1\n"
_DIGESTS_MAGIC = b"SHADEFS-PATHDIGESTS-1\n"

# hex digit -> value, 255 for anything else
_HEX = np.full(256, 255, dtype=np.uint8)
_HEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10, dtype=np.uint8)
_HEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16, dtype=np.uint8)


@dataclasses.dataclass
class ReloadReport:
    """What :func:`reload_disk_tier` found (entry counts; seconds of wall time)."""

    loaded: int = 0
    loaded_bytes: int = 0
    stale: int = 0          # the source file changed or is gone
    corrupt: int = 0        # partial entries, foreign or misplaced files
    over_budget: int = 0    # valid, but the policy and budget keep no room for them
    tmp_leftovers: int = 0  # writes a crash interrupted (removed when the tier opened)
    from_manifest: int = 0  # entries whose size and mtime came from the manifest
    statted: int = 0        # entries that needed a stat (not in the manifest)
    scan_seconds: float = 0.0
    digest_seconds: float = 0.0
    seconds: float = 0.0

    def summary(self) -> str:
        return (f"reloaded {self.loaded} entries ({self.loaded_bytes} bytes) in {self.seconds:.2f} s "
                f"(listing {self.scan_seconds:.2f} s, path hashes {self.digest_seconds:.2f} s, "
                f"{self.from_manifest} from the manifest, {self.statted} stat'ed); dropped "
                f"{self.stale} stale, {self.corrupt} corrupt, {self.over_budget} over budget, "
                f"{self.tmp_leftovers} unfinished writes")


# -- path digests -------------------------------------------------------------------------------------

def _fingerprint(paths: Sequence[str]) -> bytes:
    return hashlib.sha256("\0".join(paths).encode("utf-8", "surrogateescape")).digest()


def path_digests(paths: Sequence[str], cache_file: Optional[str] = None,
                 fingerprint: Optional[str] = None) -> np.ndarray:
    """sha256 of every path: shape (n, 32) uint8, row i = ``bytes.fromhex(DiskTier.key(paths[i]))``.

    With ``cache_file``, reuse the digests stored there when they were computed for the same path list
    (a fingerprint and a CRC guard it), else compute them and store them (atomically) for next time.
    ``fingerprint`` (e.g. :attr:`shadefs.namespace.Namespace.fingerprint`) stands for the path list when
    given, so an unchanged dataset needs no pass over its paths.
    """
    if not cache_file:
        fp = b""
    elif fingerprint is not None:
        fp = hashlib.sha256(b"namespace:" + fingerprint.encode()).digest()
    else:
        fp = _fingerprint(paths)
    n = len(paths)
    if cache_file:
        try:
            with open(cache_file, "rb") as f:
                blob = f.read()
            head = len(_DIGESTS_MAGIC) + 32 + 12
            if blob.startswith(_DIGESTS_MAGIC) and blob[len(_DIGESTS_MAGIC):len(_DIGESTS_MAGIC) + 32] == fp:
                count, crc = struct.unpack_from("<QI", blob, len(_DIGESTS_MAGIC) + 32)
                body = memoryview(blob)[head:]
                if count == n and len(body) == 32 * n and zlib.crc32(body) == crc:
                    return np.frombuffer(body, dtype=np.uint8).reshape(n, 32)
        except (OSError, struct.error):
            pass
    sha = hashlib.sha256
    body = b"".join([sha(p.encode("utf-8", "surrogateescape")).digest() for p in paths])
    if cache_file:
        blob = _DIGESTS_MAGIC + fp + struct.pack("<QI", n, zlib.crc32(body)) + body
        try:
            _atomic_write(cache_file, blob, fsync=False)
        except OSError as e:
            log.warning("cannot store path digests in %s: %s", cache_file, e)
    return np.frombuffer(body, dtype=np.uint8).reshape(n, 32)


class PathDigests:
    """:func:`path_digests` of a snapshot, computed (or loaded from ``cache_file``) on first use only."""

    def __init__(self, paths: Sequence[str], cache_file: Optional[str] = None, fingerprint: Optional[str] = None):
        self._paths, self._file, self._fingerprint = paths, cache_file, fingerprint
        self._value: Optional[np.ndarray] = None
        self._lock = threading.Lock()

    def get(self) -> np.ndarray:
        """All digests, shape (n, 32) uint8."""
        with self._lock:
            if self._value is None:
                self._value = path_digests(self._paths, self._file, self._fingerprint)
            return self._value

    def rows(self, fids: np.ndarray) -> np.ndarray:
        """Digests of ``fids`` (shape (k, 32)); hashes only those while few and the table is not loaded."""
        if self._value is None and len(fids) * 4 < len(self._paths):
            sha, paths = hashlib.sha256, self._paths
            body = b"".join([sha(paths[i].encode("utf-8", "surrogateescape")).digest() for i in fids.tolist()])
            return np.frombuffer(body, dtype=np.uint8).reshape(len(fids), 32)
        return self.get()[fids]


def _keys(digests: np.ndarray) -> np.ndarray:
    """The first 8 bytes of each digest as one uint64 (for sorting and searching)."""
    return np.ascontiguousarray(digests[:, :8]).view(">u8").ravel().astype(np.uint64)


# -- the disk tier ------------------------------------------------------------------------------------

def _list(directory: str):
    """List ``directory``'s shard folders by name only (``getdents``, no ``stat``). Returns (names, shard
    index of each name (m,), shard paths, paths of names that are not 64 characters long)."""
    names: List[str] = []
    counts: List[int] = []
    paths: List[str] = []
    bad: List[str] = []
    try:
        shards = [de for de in os.scandir(directory)
                  if len(de.name) == 2 and de.name == de.name.lower() and de.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        shards = []
    for shard in shards:
        try:
            files = os.listdir(shard.path)
        except OSError as e:
            log.warning("cannot list %s: %s", shard.path, e)
            continue
        if files and not min(map(len, files)) == max(map(len, files)) == ENTRY_NAME_LEN:  # rare: foreign
            bad.extend(os.path.join(shard.path, n) for n in files if len(n) != ENTRY_NAME_LEN)
            files = [n for n in files if len(n) == ENTRY_NAME_LEN]
        names.extend(files)
        counts.append(len(files))
        paths.append(shard.path)
    shard_idx = np.repeat(np.arange(len(paths)), counts)
    return names, shard_idx, paths, bad


def _decode(names: List[str], shard_idx: np.ndarray, shard_paths: List[str]):
    """Entry names -> (names, digests (m, 32) uint8, generations (m,) uint64, checksums (m,) uint64,
    foreign paths): a name is an entry when it is ``<64 hex>.<16 hex>.<16 hex>`` (lowercase) and sits in
    the shard folder named by its first two digits (vectorised)."""
    n = ENTRY_NAME_LEN
    ascii_ = np.ones(len(names), dtype=bool)
    blob = "".join(names).encode("utf-8", "surrogateescape")
    if len(blob) != n * len(names):  # a non-ASCII name (rare): drop those first
        ascii_ = np.fromiter((x.isascii() for x in names), dtype=bool, count=len(names))
        blob = "".join(x for x, a in zip(names, ascii_.tolist()) if a).encode("ascii")
    keep = np.flatnonzero(ascii_)
    raw = np.frombuffer(blob, dtype=np.uint8).reshape(len(keep), n)
    prefix = np.array([list(os.path.basename(p).encode("utf-8", "surrogateescape")[:2].ljust(2, b"?"))
                       for p in shard_paths], dtype=np.uint8).reshape(-1, 2)
    hexpos = np.r_[0:64, 65:81, 82:98]
    nib = _HEX[raw[:, hexpos]]
    ok = ((nib != 255).all(axis=1) & (raw[:, 64] == ord(".")) & (raw[:, 81] == ord("."))
          & (raw[:, :2] == prefix[shard_idx[keep]]).all(axis=1))
    good = keep[ok]
    foreign: List[str] = []
    if len(good) != len(names):
        out = np.ones(len(names), dtype=bool)
        out[good] = False
        foreign = [os.path.join(shard_paths[shard_idx[i]], names[i]) for i in np.flatnonzero(out).tolist()]
        names = [names[i] for i in good.tolist()]
        nib = nib[ok]
    digests = (nib[:, 0:64:2] << 4) | nib[:, 1:64:2]
    word = np.zeros(len(names), dtype=np.uint64)
    gens, csums = word.copy(), word.copy()
    for k in range(16):
        gens = (gens << np.uint64(4)) | nib[:, 64 + k].astype(np.uint64)
        csums = (csums << np.uint64(4)) | nib[:, 80 + k].astype(np.uint64)
    return names, digests, gens, csums, foreign


def _entry_path(directory: str, name: str) -> str:
    return os.path.join(directory, name[:2], name)


def _remove(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


def write_index(path: str, digests: np.ndarray, sizes: np.ndarray, mtimes: np.ndarray,
                gens: Optional[np.ndarray] = None, etags: Optional[np.ndarray] = None) -> None:
    """Write the disk tier manifest atomically: ``k`` rows of (sha256 of the path, source size in bytes,
    source mtime in ns, entry generation, xxh3_64 of the source's ETag or 0 when unknown) in index order
    (oldest first). Format: magic line, ``<Q`` k, the digests (k*32 bytes), sizes, mtimes (``<i8``),
    generations, ETag hashes (``<u8``), CRC32 (``<I``) of everything before."""
    k = len(sizes)
    zeros = np.zeros(k, dtype="<u8")
    blob = b"".join((_INDEX_MAGIC, struct.pack("<Q", k), np.ascontiguousarray(digests, np.uint8).tobytes(),
                     np.asarray(sizes, "<i8").tobytes(), np.asarray(mtimes, "<i8").tobytes(),
                     (zeros if gens is None else np.asarray(gens, "<u8")).tobytes(),
                     (zeros if etags is None else np.asarray(etags, "<u8")).tobytes()))
    _atomic_write(path, blob + struct.pack("<I", zlib.crc32(blob)), fsync=True)


def read_index(path: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read a manifest written by :func:`write_index`: (digests (k, 32) uint8, sizes, mtimes (int64),
    generations, ETag hashes (uint64)).

    Raises:
        FileNotFoundError: no manifest.
        ValueError: truncated, corrupt, or of an older format.
    """
    with open(path, "rb") as f:
        blob = f.read()
    head = len(_INDEX_MAGIC) + 8
    if not blob.startswith(_INDEX_MAGIC) or len(blob) < head + 4:
        raise ValueError(f"{path}: not a shadefs disk index (format 2)")
    (k,) = struct.unpack_from("<Q", blob, len(_INDEX_MAGIC))
    if head + 64 * k + 4 != len(blob):
        raise ValueError(f"{path}: inconsistent length")
    if zlib.crc32(memoryview(blob)[:-4]) != struct.unpack_from("<I", blob, len(blob) - 4)[0]:
        raise ValueError(f"{path}: checksum mismatch (a damaged manifest)")
    digests = np.frombuffer(blob, np.uint8, count=32 * k, offset=head).reshape(k, 32)
    sizes = np.frombuffer(blob, "<i8", count=k, offset=head + 32 * k).astype(np.int64)
    mtimes = np.frombuffer(blob, "<i8", count=k, offset=head + 40 * k).astype(np.int64)
    gens = np.frombuffer(blob, "<u8", count=k, offset=head + 48 * k).astype(np.uint64)
    etags = np.frombuffer(blob, "<u8", count=k, offset=head + 56 * k).astype(np.uint64)
    return digests, sizes, mtimes, gens, etags


def _take_manifest(directory: str):
    """Read and delete the manifest (None when absent or damaged): once this daemon may write entries,
    the previous daemon's manifest could be outdated, and a crash must not leave it behind."""
    path = os.path.join(directory, INDEX_FILE)
    try:
        manifest = read_index(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("ignoring the disk tier manifest: %s", e)
        manifest = None
    os.unlink(path)  # an error here means the cache directory is not writable: the mount fails
    return manifest


def _match(table: np.ndarray, table_keys_sorted: np.ndarray, order: np.ndarray, ent: np.ndarray,
           ent_keys: np.ndarray) -> np.ndarray:
    """Row of ``table`` (k, 32) equal to each row of ``ent`` (m, 32), or -1 (vectorised)."""
    out = np.full(len(ent), -1, dtype=np.int64)
    if len(table) == 0 or len(ent) == 0:
        return out
    pos = np.minimum(np.searchsorted(table_keys_sorted, ent_keys), len(table_keys_sorted) - 1)
    cand = order[pos]
    hit = (table_keys_sorted[pos] == ent_keys) & (table[cand] == ent).all(axis=1)
    out[hit] = cand[hit]
    return out


def _sorted_keys(table: np.ndarray):
    keys = _keys(table)
    order = np.argsort(keys, kind="stable")
    return keys[order], order


def reload_disk_tier(disk: DiskTier, index: TierIndex, ns: Namespace,
                     digests: Optional[PathDigests] = None) -> ReloadReport:
    """Rebuild ``index`` (empty) from the entries in ``disk``'s namespace directory; delete the rest.

    Args:
        disk: the tier's store (its directory is listed; dropped entries are deleted from it).
        index: the tier's empty index; its policy sees the reloaded entries via ``on_insert`` (or
            ``reserve``/``commit`` when they exceed the budget).
        ns: the snapshot just scanned; entries are checked against its sizes and mtimes.
        digests: the snapshot's path digests (shared with the :class:`Checkpointer`); default: computed
            here, cached in the namespace directory.

    Returns:
        A :class:`ReloadReport`. Never raises for a bad entry.

    Raises:
        OSError: the namespace directory cannot be modified (the previous manifest cannot be deleted).
    """
    t0 = time.monotonic()
    rep = ReloadReport(tmp_leftovers=disk.tmp_leftovers)
    manifest = _take_manifest(disk.dir)
    names, shard_idx, shard_paths, bad = _list(disk.dir)
    names, ent, gens, csums, foreign = _decode(names, shard_idx, shard_paths)
    seg = disk.segments
    nfile = len(names)
    if seg is not None:  # packed records: size and mtime from their headers, checked as they are read
        callbacks = seg.on_reclaimed, seg.on_dead
        seg.on_reclaimed = seg.on_dead = None  # reload settles the dead bytes at its end
        p_dig, p_gens, p_csums, p_sizes, p_mtimes = seg.scan()
        rep.corrupt += seg.torn
        if len(p_gens):
            names = names + [""] * len(p_gens)
            ent = np.concatenate([ent, p_dig]) if nfile else p_dig
            gens = np.concatenate([gens, p_gens])
            csums = np.concatenate([csums, p_csums])
    rep.scan_seconds = time.monotonic() - t0
    for p in bad + foreign:
        _remove(p)
    rep.corrupt += len(bad) + len(foreign)
    try:
        _reload(disk, index, ns, digests, rep, manifest, names, ent, gens, csums, nfile,
                (p_sizes, p_mtimes) if seg is not None else None)
    finally:
        if seg is not None:
            seg.on_reclaimed, seg.on_dead = callbacks
            # every dead byte of the segments (records dropped now or before the restart, padding) is
            # their slack (kept from entries by the index's headroom), reclaimed by compaction
    rep.seconds = time.monotonic() - t0
    return rep


def _reload(disk: DiskTier, index: TierIndex, ns: Namespace, digests: Optional[PathDigests],
            rep: ReloadReport, manifest, names: List[str], ent: np.ndarray, gens: np.ndarray,
            csums: np.ndarray, nfile: int, packed_rows) -> None:
    # the body of reload_disk_tier: names[nfile:] are packed records (no file), whose sizes and mtimes
    # are packed_rows
    def remove(i: int) -> None:
        if i >= nfile:
            disk.segments.delete(int(gens[i]))
        else:
            _remove(_entry_path(disk.dir, names[i]))

    if not names:
        return
    disk.seen_gen(int(gens.max()))
    ent_keys = _keys(ent)
    # two generations of one file (a crash before the old one's delete): the newest wins
    order = np.lexsort((gens, ent_keys))
    same = (ent_keys[order][1:] == ent_keys[order][:-1]) & (ent[order][1:] == ent[order][:-1]).all(axis=1)
    superseded = np.zeros(len(names), dtype=bool)
    superseded[order[:-1][same]] = True
    t1 = time.monotonic()
    if digests is None:
        digests = PathDigests(ns.paths, os.path.join(disk.dir, DIGESTS_FILE), getattr(ns, "fingerprint", None))
    table = digests.get() if ns.num_files else np.zeros((0, 32), np.uint8)
    fids = _match(table, *_sorted_keys(table), ent, ent_keys)
    rep.digest_seconds = time.monotonic() - t1
    m = len(names)
    sizes = np.full(m, -1, dtype=np.int64)
    mtimes = np.full(m, -1, dtype=np.int64)
    order = np.zeros(m, dtype=np.int64)
    row = np.full(m, -1, dtype=np.int64)
    etag_of = np.zeros(m, dtype=np.uint64)  # the source's ETag when the entry was written (0: unknown)
    if manifest is not None:
        mdig, msizes, mmtimes, mgens, metags = manifest
        row = _match(mdig, *_sorted_keys(mdig), ent, ent_keys)
        found = row >= 0
        found[found] = mgens[row[found]] == gens[found]  # a row describes one generation only
        row[~found] = -1
        sizes[found], mtimes[found], order[found] = msizes[row[found]], mmtimes[row[found]], row[found]
        etag_of[found] = metags[row[found]]
    known = (fids >= 0) & ~superseded
    exp_mtime_all = ns.mtimes_ns
    packed = np.arange(m) >= nfile
    if packed_rows is not None and packed.any():
        sizes[packed], mtimes[packed] = packed_rows
        row[packed & (row < 0)] = -2  # never stat'ed (no file); ordered after the manifest's rows
    rest = np.flatnonzero(known & (row == -1))  # only entries of snapshot files need a stat
    ctimes = np.zeros(len(rest), dtype=np.int64)
    gone = np.zeros(m, dtype=bool)
    for j, i in enumerate(rest.tolist()):
        try:
            st = os.lstat(_entry_path(disk.dir, names[i]))
        except OSError:
            gone[i] = True
            continue
        if not stat_mod.S_ISREG(st.st_mode):
            sizes[i] = -2  # never a snapshot size: dropped as corrupt below
            mtimes[i] = exp_mtime_all[fids[i]]
            continue
        sizes[i], mtimes[i], ctimes[j] = st.st_size, st.st_mtime_ns, st.st_ctime_ns
    base = len(manifest[0]) if manifest is not None else 0
    order[rest] = base + np.argsort(np.argsort(ctimes, kind="stable"), kind="stable")
    late = np.flatnonzero(row == -2)
    order[late] = base + len(rest) + np.arange(len(late))  # packed records: in segment order
    rep.from_manifest = int(np.count_nonzero(known & (row >= 0)))
    rep.statted = len(rest)
    safe = np.maximum(fids, 0)
    exp_size = np.where(known, ns.sizes[safe] if ns.num_files else -1, -1)
    exp_mtime = np.where(known, exp_mtime_all[safe] if ns.num_files else 0, 0)
    tol = disk.mtime_tolerance_ns()
    mtime_ok = known & ~gone & (np.abs(mtimes - exp_mtime) <= tol)
    size_ok = sizes == exp_size
    ns_etags = getattr(ns, "etags", None)
    if ns_etags is not None and ns.num_files:  # same size and mtime, another ETag: the object changed
        now = ns_etags[safe]
        mtime_ok &= ~((etag_of != 0) & (now != 0) & (etag_of != now))
    good = mtime_ok & size_ok
    partial = mtime_ok & ~size_ok
    rep.corrupt += int(np.count_nonzero(partial))
    rep.stale += int(np.count_nonzero(~good & ~partial & ~gone))
    for i in np.flatnonzero(~good & ~gone).tolist():
        remove(i)
    idx = np.flatnonzero(good)
    idx = idx[np.argsort(order[idx], kind="stable")]  # oldest first
    g_fids, g_sizes = fids[idx], sizes[idx]
    entries = disk.table(ns.num_files)
    entries.gen[g_fids] = gens[idx]
    entries.csum[g_fids] = csums[idx]
    charge = index.charge
    need = sum(map(charge, g_sizes.tolist())) if charge is not None else int(g_sizes.sum())
    if need <= index.free_bytes:
        index.restore(g_fids.tolist(), g_sizes.tolist())
        rep.loaded, rep.loaded_bytes = len(idx), int(g_sizes.sum())
    else:  # the budget shrank (or another policy): let the policy choose, oldest offered first
        def delete(fid):
            disk.delete(ns.path(fid), int(entries.gen[fid]), int(entries.csum[fid]))

        for fid, size in zip(g_fids.tolist(), g_sizes.tolist()):
            victims = index.admit(fid, size)
            if victims is None:
                delete(fid)
                rep.over_budget += 1
                continue
            for v in victims:
                delete(v)
            rep.over_budget += len(victims)
        index.evictions = 0  # reload decisions are not evictions of this mount
        rep.loaded, rep.loaded_bytes = len(index), index.used_bytes


# -- importance scores --------------------------------------------------------------------------------

def save_scores(path: str, paths: Sequence[str], values: np.ndarray) -> None:
    """Write ``paths`` (relative, shape (n,)) and their importance ``values`` (float32, shape (n,))
    atomically to ``path`` (fsync'd temporary file + rename).

    Format: magic line, ``<QQ`` count and path-bytes length, ``count`` little-endian float32, the paths
    UTF-8 (surrogateescape) joined by NUL, then a CRC32 (``<I``) of everything before it.
    """
    values = np.asarray(values, dtype="<f4").reshape(-1)
    if len(paths) != len(values):
        raise ValueError(f"save_scores: {len(paths)} paths vs {len(values)} values")
    names = "\0".join(paths).encode("utf-8", "surrogateescape")
    blob = _SCORES_MAGIC + struct.pack("<QQ", len(values), len(names)) + values.tobytes() + names
    _atomic_write(path, blob + struct.pack("<I", zlib.crc32(blob)), fsync=True)


def read_scores(path: str) -> Tuple[List[str], np.ndarray]:
    """Read a file written by :func:`save_scores`: (paths, float32 values).

    Raises:
        FileNotFoundError: no checkpoint.
        ValueError: the file is truncated or corrupt.
    """
    with open(path, "rb") as f:
        blob = f.read()
    head = len(_SCORES_MAGIC) + 16
    if not blob.startswith(_SCORES_MAGIC) or len(blob) < head + 4:
        raise ValueError(f"{path}: not a shadefs scores checkpoint")
    if zlib.crc32(memoryview(blob)[:-4]) != struct.unpack_from("<I", blob, len(blob) - 4)[0]:
        raise ValueError(f"{path}: checksum mismatch (a damaged checkpoint)")
    count, nbytes = struct.unpack_from("<QQ", blob, len(_SCORES_MAGIC))
    if head + 4 * count + nbytes + 4 != len(blob):
        raise ValueError(f"{path}: inconsistent lengths")
    values = np.frombuffer(blob, dtype="<f4", count=count, offset=head).astype(np.float32)
    raw = blob[head + 4 * count:head + 4 * count + nbytes]
    paths = raw.decode("utf-8", "surrogateescape").split("\0") if count else []
    if len(paths) != count:
        raise ValueError(f"{path}: {len(paths)} paths for {count} values")
    return paths, values


def load_scores(path: str, ns: Namespace, importance: Importance) -> Tuple[int, int]:
    """Apply a checkpoint to ``importance``. Returns (restored, skipped): skipped paths are no longer
    in the snapshot or had a non-finite value. A missing file restores nothing; a corrupt one is logged
    and ignored (importance starts from the default, as on a first mount)."""
    try:
        paths, values = read_scores(path)
    except FileNotFoundError:
        return 0, 0
    except (OSError, ValueError) as e:
        log.warning("ignoring the importance checkpoint: %s", e)
        return 0, 0
    file_id = ns.file_id
    fids = np.fromiter((-1 if (f := file_id(p)) is None else f for p in paths), dtype=np.int64, count=len(paths))
    keep = (fids >= 0) & np.isfinite(values)
    importance.update(fids[keep], values[keep])
    return int(keep.sum()), int((~keep).sum())


class Checkpointer:
    """Checkpoint importance (``scores.bin``) and the disk tier manifest (``index.bin``) at :meth:`start`,
    then every ``interval_s`` seconds when they changed, and at :meth:`stop` (unmount).

    Start it after the mount exists (FUSE ``init``). Only O(1) reads and a copy of the residency array
    (1 byte per file id) happen under ``lock`` (the cache lock, which index changes hold); everything
    else, files included, outside it (:meth:`save`).

    Args:
        directory: the disk tier's namespace directory.
        ns, importance: the snapshot and its importance.
        index: the disk tier's index, or None (scores only).
        digests: the snapshot's path digests (the manifest names entries by them).
        lock: the cache lock.
        entries: the disk tier's :class:`~shadefs.cache.tiers.EntryTable` (entry generations).
        interval_s: seconds between checkpoints; 0 = only at :meth:`start` and :meth:`stop`.
        pack_below: the disk tier's :attr:`~shadefs.cache.tiers.DiskTier.pack_below`: packed entries are
            left out of the manifest (their record headers carry size, mtime and generation), so it
            holds at most one row per file entry.
        ids: the entry ids the manifest lists, when they are more than the files (a
            :class:`~shadefs.cache.chunks.EntryIds`: the chunks of large files too; ``digests`` must be
            its paths'); default ``ns``.
    """

    def __init__(self, directory: str, ns: Namespace, importance: Importance, index: Optional[TierIndex],
                 digests: PathDigests, lock: threading.Lock, interval_s: float = 60.0, entries=None,
                 pack_below: int = 0, ids=None):
        # the entry ids of the manifest: the namespace's files, or (a namespace with chunks) a
        # shadefs.cache.chunks.EntryIds over the files and their chunks; scores are the files'
        self.ids = ns if ids is None else ids
        self.entries = entries       # the disk tier's EntryTable (generations in the manifest)
        self.pack_below = int(pack_below)  # packed entries (size + header below it) carry their own row
        self.scores_path = os.path.join(directory, SCORES_FILE)
        self.index_path = os.path.join(directory, INDEX_FILE)
        self.ns = ns
        self.importance = importance
        self.index = index
        self.digests = digests
        self.lock = lock
        self.interval_s = float(interval_s)
        self._version = 0            # bumped by every importance update
        self._saved_scores = 0
        self._saved_index = None     # index.changes when the manifest was last written
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._save_lock = threading.Lock()
        self.saves = 0
        importance.subscribe(self._changed)

    def _changed(self, fids) -> None:
        self._version += 1

    def start(self) -> None:
        """Start the thread (after the mount exists). Idempotent."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="shadefs-checkpoint", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        # at once: the reload took the previous manifest, and a crash before the first interval should
        # not cost the next mount a stat per entry
        self.save()
        while self.interval_s > 0 and not self._stop.wait(self.interval_s):
            self.save()

    def save(self) -> bool:
        """Write what changed since the last checkpoint. Returns whether anything was written; a
        failure is logged, never raised.

        The cache lock is held only to read two counters and, when the index keeps a residency array
        (:meth:`TierIndex.track_residency`), to copy it: one byte per file id, a memcpy (~50 us per
        million files). Importance is copied without the lock (the version is read first, so an update
        racing the copy is written again by the next save). Entries are whole files or chunks, so their
        sizes are the snapshot's (``ids``). Without a residency array the index's dict is walked under the lock.
        """
        with self._save_lock:
            wrote = False
            fids = flags = None
            with self.lock:
                version = self._version
                index = self.index
                changes = index.changes if index is not None else None
                if index is not None and changes != self._saved_index:
                    if index.flags is not None:
                        flags = index.flags.copy()
                    else:
                        n = len(index.sizes)
                        fids = np.fromiter(index.sizes.keys(), dtype=np.int64, count=n)
                        sizes = np.fromiter(index.sizes.values(), dtype=np.int64, count=n)
            # the files' scores (a chunk's is its file's)
            values = self.importance.values[:self.ns.num_files].copy() if version != self._saved_scores else None
            ids = self.ids
            if flags is not None:
                fids = np.flatnonzero(flags[:ids.num_files] & index.bit)
                if index.order is not None:  # oldest first (read racily: only the order of files
                    fids = fids[np.argsort(index.order[fids], kind="stable")]  # changing now may move)
                sizes = ids.sizes[fids]
            if fids is not None and self.pack_below:
                files = sizes + HEADER >= self.pack_below
                fids, sizes = fids[files], sizes[files]
            # generations read without the lock: a row whose file changed generation meanwhile names the
            # wrong one, and the reload then stats that entry instead of trusting the row
            gens = self.entries.gen[fids] if (fids is not None and self.entries is not None) else None
            try:
                if values is not None:
                    scored = np.flatnonzero(values != self.importance.default)
                    save_scores(self.scores_path, [self.ns.paths[i] for i in scored.tolist()], values[scored])
                    self._saved_scores = version
                    wrote = True
                if fids is not None:
                    etags = getattr(ids, "etags", None)
                    write_index(self.index_path, self.digests.rows(fids), sizes,
                                ids.mtimes_ns[fids], gens, None if etags is None else etags[fids])
                    self._saved_index = changes
                    wrote = True
            except OSError as e:
                log.warning("checkpoint in %s failed: %s", os.path.dirname(self.index_path), e)
            if wrote:
                self.saves += 1
            return wrote

    def stop(self) -> None:
        """Stop the thread and write a final checkpoint of what changed. Idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(30)
        self._thread = None
        self.save()


def _atomic_write(path: str, blob: bytes, fsync: bool) -> None:
    # checkpoints are written through the namespace's tmp/ directory when there is one
    tmp_dir = os.path.join(os.path.dirname(path), "tmp")
    atomic_write(path, blob, tmp_dir=tmp_dir if os.path.isdir(tmp_dir) else None, fsync=fsync)
