"""The metadata snapshot: every directory and file of the source, scanned once at mount.

Node ids are dense integers: files ``0..num_files-1`` (sorted by path, as Python sorts strings),
directories ``num_files..num_nodes-1`` (the root first, then in path order). lookup/getattr/readdir are
answered from here and never touch the backend; the dataset is taken to be immutable while mounted (the
kernel is told so through long entry/attr timeouts).

Layout (no Python object per file; about 60 bytes per file for ImageNet-like names, docs/performance.md):

- every node's name (one path component, UTF-8 with ``surrogateescape``) in one byte blob, with an
  offset array (uint32, or int64 past 4 GiB of names) and a parent array (int32);
- per file ``sizes`` (int64 bytes) and ``mtimes_ns`` (int64 nanoseconds, exactly the source's); per
  node an index into a small table of distinct (permission bits, uid, gid);
- children of each directory as one CSR array sorted by name (readdir);
- a lookup table: ``xxh3_64(name)`` mixed with the parent's id, sorted, with the node id of each
  (``child()`` is one binary search plus one name comparison; no per-directory dict);
- directory paths (one Python string per directory, not per file), their size, and their mtime and
  ctime, which validate a persisted snapshot (:meth:`Namespace.save` / :meth:`Namespace.load`).

Must never: hold a Python object per file, or answer a query by touching the backend.
"""
from __future__ import annotations

import logging
import os
import posixpath
import stat as stat_mod
import struct
import time
from bisect import bisect_left
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from xxhash import xxh3_64_intdigest, xxh3_128_hexdigest

from .backends.base import BackendError, DirChunk, Entry, ScanReport, chunks_from_entries
from .fsutil import removing_on_error
from .namespace_scan import scan
from .namespace_snapshot import ARRAYS, load as load_snapshot, write

__all__ = ["Namespace", "normalize", "SNAPSHOT_FILE"]

log = logging.getLogger("shadefs.namespace")

ROOT = ""
SNAPSHOT_FILE = "namespace.bin"
_DIR_MODE = stat_mod.S_IFDIR | 0o555
_FILE_MODE = stat_mod.S_IFREG | 0o444
_SERVED_BITS = 0o555      # read-only mount: no write bits, no setuid/setgid/sticky
_K = 0x9E3779B97F4A7C15   # golden-ratio multiplier: mixes the parent id into a name hash
_M64 = (1 << 64) - 1


def normalize(path: str) -> Optional[str]:
    """Turn a FUSE path (``/a/b``) or a mount-relative path (``a/b``) into the snapshot key (``a/b``).

    Returns None for a path that is absolute after stripping one leading slash twice, contains
    ``..`` or ``.`` components, empty components, or NUL: such paths name nothing in the snapshot.
    """
    if "\x00" in path:
        return None
    p = path[1:] if path.startswith("/") else path
    if p == "":
        return ROOT
    parts = p.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            return None
    return p


def _encode(name: str) -> Optional[bytes]:
    try:
        return name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate no decoded name can contain
        return None


def _unique(a: np.ndarray, few: int = 8) -> Tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_inverse=True)`` (a 1-D), in ``few`` passes over ``a`` instead of a sort when
    it holds at most ``few`` distinct values (a tree's owners and permission classes: usually 1-3)."""
    vals: List[Any] = []
    rest = a
    while len(rest) and len(vals) < few:
        vals.append(rest[0])
        rest = rest[rest != rest[0]]
    if len(rest):
        return np.unique(a, return_inverse=True)
    uniq = np.sort(np.array(vals, dtype=a.dtype))
    inverse = np.searchsorted(uniq, a).astype(np.intp)
    return uniq, inverse

class _Paths(Sequence):
    """``ns.paths``: file paths by id, built on access (the namespace keeps no string per file)."""

    def __init__(self, ns: "Namespace"):
        self._ns = ns

    def __len__(self) -> int:
        return self._ns.num_files

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._ns.path(j) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._ns.path(i)

    def __iter__(self) -> Iterator[str]:
        return self._ns.iter_paths()


class Namespace:
    """An immutable tree of files and directories (see the module docstring for the layout).

    Build it with ``Namespace(entries)`` (flat :class:`~shadefs.backends.base.Entry` records; directories
    inferred from paths) or :meth:`scan` (a backend's structured listing, empty directories and source
    permissions included), or :meth:`load` a persisted snapshot.

    Attributes:
        num_files, num_dirs, num_nodes: counts; ``root`` is the root directory's id (``num_files``).
        sizes: ``np.ndarray[int64]`` of shape (num_files,), bytes.
        mtimes_ns: ``np.ndarray[int64]`` of shape (num_files,), nanoseconds since the epoch.
        total_bytes: sum of ``sizes``.
        paths: a read-only sequence of file paths (built per access).
        dir_paths: directory paths by ``id - num_files`` (``""`` = the root).
        report: :class:`~shadefs.backends.base.ScanReport` of what the scan left out.
        scan_seconds: seconds spent building (or loading) this namespace.
        from_snapshot: True when loaded from a persisted snapshot.
        fingerprint: hex digest of names and tree shape (changes when any path does).
    """

    def __init__(self, entries: Iterable[Entry] = ()):
        report = ScanReport()
        self._build(chunks_from_entries(entries, report), report)

    @classmethod
    def scan(cls, backend, follow_symlinks: bool = False, isolate: bool = False,
             snapshot_key: Optional[Dict[str, Any]] = None, progress=None) -> "Namespace":
        """Scan ``backend`` (:meth:`~shadefs.backends.base.Backend.scan`) and build the namespace.

        With ``isolate`` (the daemon's choice), a backend whose listing may run in a forked process
        (``scan_in_child``: posix) is scanned and built in a child process forked for it, which hands the
        finished namespace back as one buffer in the :meth:`save` format (a ``memfd``): this process then
        holds the arrays only, exactly as after :meth:`load`, and none of the heap the listing used (its
        millions of short-lived objects and temporary arrays die with the child; docs/performance.md,
        "Namespace"). Only where it is safe to fork: Linux, and no other thread in this process;
        otherwise, and without ``isolate``, the scan runs in this process. ``snapshot_key``: the key
        the caller will :meth:`save` it with (an isolated scan's buffer is then written as it is).
        ``progress(files, dirs)``: called as directories are listed (counts so far; in the scan's process,
        so with ``isolate`` possibly a forked child: it must not rely on this process's threads).

        Raises:
            FileNotFoundError: the source root does not exist.
            BackendError: the root cannot be listed, or listing failed (or the scan process died).
        """
        return scan(cls, backend, follow_symlinks, isolate, snapshot_key, progress)

    # -- construction ------------------------------------------------------------------------------
    def _build(self, chunks: Iterable[DirChunk], report: ScanReport) -> None:
        t0 = time.monotonic()
        by_path: Dict[str, DirChunk] = {}
        for c in chunks:
            by_path[c.path] = c
        if ROOT not in by_path:
            raise BackendError("the source root could not be listed")
        dirs = [ROOT] + sorted((p for p in by_path if p), key=lambda p: p + "/")  # preorder = path order
        nf = sum(c.num_files for c in by_path.values())
        nd = len(dirs)
        n = nf + nd
        dir_id = {p: nf + i for i, p in enumerate(dirs)}
        chunk_list = [by_path[p] for p in dirs]
        del by_path
        # byte offsets of names inside each chunk, and the chunk's names as strings where needed
        offs = [np.concatenate(([0], np.cumsum(c.name_lens))) for c in chunk_list]
        decoded: Dict[int, List[str]] = {}

        def names_of(ci: int) -> List[str]:
            if ci not in decoded:
                c, o = chunk_list[ci], offs[ci].tolist()
                decoded[ci] = [c.names[o[i]:o[i + 1]].decode("utf-8", "surrogateescape")
                               for i in range(c.num_files)]
            return decoded[ci]

        # the files of one directory are split where a subdirectory's subtree sorts between them
        # ("a/b.txt" < "a/b/x" < "a/b0"): sort those runs by their first path
        segments: List[Tuple[str, int, int, int]] = []
        present_subdirs: List[List[str]] = []
        for ci, c in enumerate(chunk_list):
            base = f"{c.path}/" if c.path else ""
            subs = [s for s in c.subdirs if (base + s) in dir_id]
            present_subdirs.append(subs)
            k = c.num_files
            if not k:
                continue
            if subs:
                names = names_of(ci)
                cuts = sorted({bisect_left(names, s + "/") for s in subs} - {0, k})
            else:
                cuts = []
            bounds = [0, *cuts, k]
            first = c.names[:int(c.name_lens[0])].decode("utf-8", "surrogateescape") if not cuts else None
            for a, b in zip(bounds, bounds[1:]):
                name = first if first is not None else names_of(ci)[a]
                segments.append((base + name, ci, a, b))
        segments.sort(key=lambda s: s[0])
        # files, in id order
        pieces_names, lens, sizes, mtimes_ns, modes, uids, gids, hashes, parents, etags = ([] for _ in range(10))
        chunk_fids: List[List[np.ndarray]] = [[] for _ in chunk_list]
        next_id = 0
        for _, ci, a, b in segments:
            c, o = chunk_list[ci], offs[ci]
            pieces_names.append(c.names[int(o[a]):int(o[b])])
            lens.append(c.name_lens[a:b])
            sizes.append(c.sizes[a:b])
            mtimes_ns.append(c.mtimes_ns[a:b])
            etags.append(c.etags[a:b] if c.etags is not None else np.zeros(b - a, np.uint64))
            modes.append(c.modes[a:b])
            uids.append(c.uids[a:b])
            gids.append(c.gids[a:b])
            hashes.append(c.name_hashes[a:b])
            parents.append(np.full(b - a, nf + ci, dtype=np.int64))
            chunk_fids[ci].append(np.arange(next_id, next_id + b - a, dtype=np.int64))
            next_id += b - a
        assert next_id == nf
        # directories, in id order
        dnames = [_encode(posixpath.basename(p)) or b"" for p in dirs]
        pieces_names.extend(dnames)
        lens.append(np.fromiter(map(len, dnames), dtype=np.int64, count=nd))
        modes.append(np.array([c.mode for c in chunk_list], dtype=np.uint16))
        uids.append(np.array([c.uid for c in chunk_list], dtype=np.uint32))
        gids.append(np.array([c.gid for c in chunk_list], dtype=np.uint32))
        hashes.append(np.fromiter(map(xxh3_64_intdigest, dnames), dtype=np.uint64, count=nd))
        parents.append(np.array([dir_id[posixpath.dirname(p)] if p else nf for p in dirs], dtype=np.int64))
        blob = b"".join(pieces_names)
        del pieces_names, dnames
        all_lens = np.concatenate(lens)
        off_dtype = np.uint32 if len(blob) < 2**32 else np.int64
        self._off = np.zeros(n + 1, dtype=off_dtype)
        np.cumsum(all_lens, out=self._off[1:])
        del lens, all_lens
        self._blob = memoryview(blob)
        id_dtype = np.int32 if n < 2**31 else np.int64
        parent = np.concatenate(parents)
        self._parent = parent.astype(id_dtype)
        self.sizes = np.concatenate(sizes) if nf else np.zeros(0, np.int64)
        self.mtimes_ns = np.concatenate(mtimes_ns).astype(np.int64) if nf else np.zeros(0, np.int64)
        self.etags = np.concatenate(etags).astype(np.uint64) if nf else np.zeros(0, np.uint64)
        del sizes, mtimes_ns, etags
        # distinct (permission bits, uid, gid)
        all_modes = (np.concatenate(modes).astype(np.uint32) & _SERVED_BITS)
        all_uids, all_gids = np.concatenate(uids), np.concatenate(gids)
        del modes, uids, gids
        owner = (all_uids.astype(np.uint64) << np.uint64(32)) | all_gids.astype(np.uint64)
        owners, owner_idx = _unique(owner)
        classes, perm = _unique((owner_idx.astype(np.uint64) << np.uint64(12)) | all_modes)
        cls_owner = owners[(classes >> np.uint64(12)).astype(np.int64)]
        self._perm_table = np.stack([(classes & np.uint64(0o7777)).astype(np.uint32),
                                     (cls_owner >> np.uint64(32)).astype(np.uint32),
                                     (cls_owner & np.uint64(0xFFFFFFFF)).astype(np.uint32)], axis=1)
        self._perm = perm.reshape(-1).astype(np.uint16 if len(classes) < 2**16 else np.uint32)
        del all_modes, all_uids, all_gids, owner, owner_idx, perm
        # lookup table: (name hash ^ mixed parent) sorted, with the node of each
        keys = np.concatenate(hashes) ^ ((parent.astype(np.uint64) + np.uint64(1)) * np.uint64(_K))
        del hashes, parent, parents
        order = np.argsort(keys)   # quicksort: 1.5x faster than a stable sort on 1M keys
        self._keys = keys[order]
        if (self._keys[1:] == self._keys[:-1]).any():  # equal keys (a hash collision): their ids in order
            order = np.argsort(keys, kind="stable")
            self._keys = keys[order]
        self._key_ids = order.astype(id_dtype)
        del keys, order
        # children of each directory, sorted by name (files and subdirectories merged)
        kids: List[np.ndarray] = []
        starts = np.zeros(nd + 1, dtype=np.int64)
        nlink = np.full(nd, 2, dtype=np.int64)
        for ci, c in enumerate(chunk_list):
            fids = np.concatenate(chunk_fids[ci]) if chunk_fids[ci] else np.zeros(0, np.int64)
            subs = present_subdirs[ci]
            if subs:
                base = f"{c.path}/" if c.path else ""
                sub_ids = np.array([dir_id[base + s] for s in subs], dtype=np.int64)
                pos = [bisect_left(names_of(ci), s) for s in subs] if c.num_files else [0] * len(subs)
                fids = np.insert(fids, pos, sub_ids)
                nlink[ci] += len(subs)
            kids.append(fids)
            starts[ci + 1] = starts[ci] + len(fids)
            decoded.pop(ci, None)
        self._kids = (np.concatenate(kids) if kids else np.zeros(0, np.int64)).astype(id_dtype)
        self._dir_start = starts
        self._dir_nlink = nlink.astype(np.uint32)
        self._dir_mtime_ns = np.array([c.mtime_ns for c in chunk_list], dtype=np.int64)
        self._dir_ctime_ns = np.array([c.ctime_ns for c in chunk_list], dtype=np.int64)
        self._dir_size = np.array([c.size for c in chunk_list], dtype=np.int64)
        del chunk_list, chunk_fids, kids, offs
        self._finish(nf, dirs, report, time.monotonic() - t0, from_snapshot=False,
                     fingerprint=self._compute_fingerprint())

    def _finish(self, nf: int, dirs: List[str], report: ScanReport, seconds: float, from_snapshot: bool,
                fingerprint: str) -> None:
        self.num_files = nf
        self.dir_paths: List[str] = dirs
        self.num_dirs = len(dirs)
        self.num_nodes = nf + len(dirs)
        self.root = nf
        self._dir_ids: Dict[str, int] = {p: nf + i for i, p in enumerate(dirs)}
        self.total_bytes = int(self.sizes.sum()) if nf else 0
        self.report = report
        self.scan_seconds = seconds
        self.from_snapshot = from_snapshot
        self.fingerprint = fingerprint
        # files whose record came from a persisted snapshot and was not yet compared with the source
        # (TieredCache.recheck, at each one's first open): shape (num_files,) bool, or None (a fresh scan)
        self.unchecked: Optional[np.ndarray] = np.ones(nf, dtype=np.bool_) if from_snapshot else None
        self.revised = 0   # records revise() changed since this namespace was built or loaded
        self.mount_time = time.time()
        self._mount_ns = int(self.mount_time * 1e9)
        self._uid, self._gid = os.getuid(), os.getgid()
        self.paths = _Paths(self)
        # memoryviews of the arrays: indexing one gives a Python int or float without a numpy scalar
        # (3-10x cheaper per access); they share the arrays' memory
        self._m_keys = memoryview(self._keys)
        self._m_key_ids = memoryview(self._key_ids)
        self._m_parent = memoryview(self._parent)
        self._m_off = memoryview(self._off)
        self._m_perm = memoryview(self._perm)
        self._m_sizes = memoryview(self.sizes)
        self._m_mtimes = memoryview(self.mtimes_ns)
        self._perms = [tuple(r) for r in self._perm_table.tolist()]

    def _compute_fingerprint(self) -> str:
        h = xxh3_128_hexdigest(self._blob)
        return xxh3_128_hexdigest(h.encode() + self._parent.tobytes() + struct.pack("<Q", len(self.sizes)))

    @property
    def skipped(self) -> List[str]:
        """Paths of files skipped because they are also directory prefixes (first few)."""
        return list(self.report.examples.get("conflicts", ()))

    # -- queries ---------------------------------------------------------------------------------
    def _name_bytes(self, node: int) -> bytes:
        o = self._m_off
        return bytes(self._blob[o[node]:o[node + 1]])

    def name(self, node: int) -> str:
        """The last path component of ``node`` (``""`` for the root)."""
        return self._name_bytes(node).decode("utf-8", "surrogateescape")

    def lookup(self, path: str) -> Optional[int]:
        """Return the id of ``path`` (FUSE ``/a/b`` or relative ``a/b``), or None if absent."""
        key = normalize(path)
        if key is None:
            return None
        d = self._dir_ids.get(key)
        if d is not None:
            return d
        head, _, tail = key.rpartition("/")
        parent = self._dir_ids.get(head)
        return None if parent is None else self._child(parent, tail)

    def file_id(self, relpath: str) -> Optional[int]:
        """Return the file id of a relative file path, or None (directories and bad paths: None)."""
        if relpath.startswith("/"):
            return None
        node = self.lookup(relpath)
        return node if node is not None and node < self.num_files else None

    def file_ids(self, relpaths: Iterable[str]) -> np.ndarray:
        """File ids of relative paths, -1 where a path names no file. Shape (n,), int64."""
        fid = self.file_id
        return np.fromiter((-1 if (f := fid(p)) is None else f for p in relpaths), dtype=np.int64)

    def is_dir(self, node: int) -> bool:
        return node >= self.num_files

    def child(self, parent: int, name: str) -> Optional[int]:
        """Return the id of entry ``name`` directly below directory ``parent``, or None.

        ``name`` is one path component (no ``/``); ``.``, ``..``, ``""`` and a file ``parent`` give None.
        One ``xxh3_64`` of the name, one binary search, one name comparison.
        """
        if not self.num_files <= parent < self.num_nodes or name in ("", ".", "..") \
                or "/" in name or "\x00" in name:
            return None
        return self._child(parent, name)

    def _child(self, parent: int, name: str) -> Optional[int]:
        b = _encode(name)
        if b is None:
            return None
        k = xxh3_64_intdigest(b) ^ (((parent + 1) * _K) & _M64)
        keys = self._m_keys
        i = bisect_left(keys, k)
        n = len(keys)
        while i < n and keys[i] == k:
            node = self._m_key_ids[i]
            if self._m_parent[node] == parent:
                o = self._m_off
                if self._blob[o[node]:o[node + 1]] == b:
                    return node
            i += 1
        return None

    def parent(self, node: int) -> int:
        """Return the id of the directory holding ``node``; the root is its own parent."""
        return self._m_parent[node]

    def _kid_ids(self, node: int) -> np.ndarray:
        d = node - self.num_files
        return self._kids[int(self._dir_start[d]):int(self._dir_start[d + 1])]

    def listdir(self, node: int) -> List[Tuple[str, int]]:
        """``(name, node_id)`` for each entry directly below directory ``node``, sorted by name."""
        name = self.name
        return [(name(i), i) for i in self._kid_ids(node).tolist()]

    def listdir_slice(self, node: int, start: int, stop: int) -> List[Tuple[str, int]]:
        """``listdir(node)[start:stop]`` (``start``, ``stop`` >= 0), building only those entries: a READDIR
        reply of a large directory costs its own entries, not the whole listing."""
        name = self.name
        return [(name(i), i) for i in self._kid_ids(node)[start:stop].tolist()]

    def children(self, node: int) -> Tuple[str, ...]:
        """Names directly below directory ``node``, sorted."""
        name = self.name
        return tuple(name(i) for i in self._kid_ids(node).tolist())

    def entries(self, node: int) -> List[Tuple[str, int, int]]:
        """``(name, st_mode, 0)`` for each entry directly below directory ``node``, sorted by name.

        readdir reports each entry's type (d_type) from this, so a directory walk (ImageFolder) needs no
        LOOKUP round trip per file. Built per call: a readdir is rare next to opens.
        """
        nf, name = self.num_files, self.name
        return [(name(i), _DIR_MODE if i >= nf else _FILE_MODE, 0) for i in self._kid_ids(node).tolist()]

    def path(self, fid: int) -> str:
        """The path of node ``fid`` relative to the root (``""`` for the root)."""
        if fid >= self.num_files:
            return self.dir_paths[fid - self.num_files]
        d = self.dir_paths[self._m_parent[fid] - self.num_files]
        name = self.name(fid)
        return f"{d}/{name}" if d else name

    def iter_paths(self, batch: int = 65536) -> Iterator[str]:
        """Every file path in id order, built batch by batch (bounded transient memory)."""
        nf, dirs = self.num_files, self.dir_paths
        prefixes = [f"{d}/" if d else "" for d in dirs]
        blob = self._blob
        for lo in range(0, nf, batch):
            hi = min(nf, lo + batch)
            o = self._off[lo:hi + 1].tolist()
            par = self._parent[lo:hi].tolist()
            for j in range(hi - lo):
                yield prefixes[par[j] - nf] + bytes(blob[o[j]:o[j + 1]]).decode("utf-8", "surrogateescape")

    def size(self, fid: int) -> int:
        return self._m_sizes[fid]

    def revise(self, fid: int, size: int, mtime_ns: int, tag: int) -> None:
        """Replace file ``fid``'s record (size in bytes, mtime in ns, version tag, 0 = none) with
        what the source holds now: a file a reused snapshot described before it changed. The caller
        serializes revisions of one file; :attr:`revised` counts them (the snapshot is then saved again)."""
        self.total_bytes += int(size) - int(self.sizes[fid])
        self.sizes[fid] = size
        self.mtimes_ns[fid] = mtime_ns
        self.etags[fid] = tag
        self._image = None   # an isolated scan's buffer no longer matches the arrays
        self.revised += 1

    def attr(self, node: int) -> Tuple[int, int, int, int, int, int]:
        """``(st_mode, size in bytes, mtime in ns, uid, gid, nlink)`` of ``node``.

        Permission bits, uid and gid are the source's (write, setuid, setgid and sticky bits cleared:
        the mount is read-only); an object store's files are 0444 and directories 0555, owned by the
        daemon's user. Sizes and mtimes are the source's, to the nanosecond (a directory's mtime is the
        mount time for object stores, its size 0 where the source reports none).
        """
        bits, uid, gid = self._perms[self._m_perm[node]]
        if node >= self.num_files:
            d = node - self.num_files
            mt = int(self._dir_mtime_ns[d]) or self._mount_ns
            return stat_mod.S_IFDIR | bits, int(self._dir_size[d]), mt, uid, gid, int(self._dir_nlink[d])
        return stat_mod.S_IFREG | bits, self._m_sizes[node], self._m_mtimes[node], uid, gid, 1

    def stat(self, node: int) -> dict:
        """A ``struct stat`` as the dict fusepy expects (times in integer nanoseconds, ``use_ns``)."""
        mode, size, t, uid, gid, nlink = self.attr(node)
        st = {"st_mode": mode, "st_nlink": nlink, "st_size": size, "st_uid": uid, "st_gid": gid,
              "st_mtime": t, "st_ctime": t, "st_atime": t}
        if node < self.num_files:
            st["st_blocks"] = (size + 511) // 512
        return st

    def info(self) -> Dict[str, Any]:
        """Counts for the stats JSON: files, directories, scan seconds, snapshot use, skips by reason."""
        return {"files": self.num_files, "directories": self.num_dirs, "scan_seconds": round(self.scan_seconds, 3),
                "from_snapshot": self.from_snapshot, "skipped": self.report.as_dict()}

    # -- snapshots ---------------------------------------------------------------------------------
    _ARRAYS = ARRAYS

    def save(self, path: str, key: Dict[str, Any]) -> int:
        """Persist this namespace to ``path`` atomically (temporary file + rename), tagged with ``key``
        (what the source and scan options were; :meth:`load` rejects a snapshot whose key differs).

        Format: magic line, ``<Q`` header length, a JSON header (key, counts, report, directory paths,
        each array's dtype, shape and offset), the name blob and the arrays (64-byte aligned), then an
        ``xxh3_64`` (``<Q``) of everything before it. Returns the bytes written.

        Raises:
            OSError: the file cannot be written.
        """
        d = os.path.dirname(os.path.abspath(path))
        tmp_dir = os.path.join(d, "tmp") if os.path.isdir(os.path.join(d, "tmp")) else d
        tmp = os.path.join(tmp_dir, f".{os.path.basename(path)}.{os.getpid()}.tmp")
        image = getattr(self, "_image", None)
        with removing_on_error(tmp):
            with open(tmp, "wb") as f:
                if image is not None and image[1] == key:  # an isolated scan's buffer: already this format
                    f.write(memoryview(image[0]))
                    written = len(image[0])
                else:
                    written = write(self, f, key)
            os.replace(tmp, path)
        return written

    @classmethod
    def load(cls, path: str, key: Dict[str, Any]) -> Tuple[Optional["Namespace"], str]:
        """Read a snapshot written by :meth:`save`. Returns (namespace, "") or (None, why not): missing,
        damaged (checksum), another format, or written for another ``key``. Never raises."""
        return load_snapshot(cls, path, key)

    def snapshot_dirs(self) -> Tuple[List[str], np.ndarray, np.ndarray]:
        """Directory paths with their source mtime and ctime (ns), to validate a loaded snapshot."""
        return self.dir_paths, self._dir_mtime_ns, self._dir_ctime_ns
