"""The posix backend: a local directory or an NFS / parallel-filesystem mount.

The listing is a parallel ``os.scandir`` over directories (metadata round trips dominate on NFS, so
several in flight at once); a large local tree is listed by several processes (CPU-bound there). Reads are one ``open`` + ``readinto`` of exactly the snapshot size; a
file whose length changed since the scan is an error, never a short file. A missing file is ENOENT,
unless the whole source is gone (an empty or missing root: an NFS or bind mount went away), which is
an error (EIO) that heals when the source comes back.

Every open and stat of a file resolves its path beneath the root with no symlink followed
(:mod:`~shadefs.backends.beneath`); a path through a symlink is opened only as the scan serves it (its
real path, inside the tree, opened the same way; anywhere with ``--follow-symlinks``). The opened file
must then still be the one the snapshot describes, checked with ``fstat`` on the opened descriptor: a
regular file with the same inode number (the listing's per-file tag, :func:`identity_tag`, on filesystems
whose inode numbers are stable: :data:`STABLE_INODE_FS`), else the open fails
with ESTALE (:class:`~shadefs.backends.base.StaleSource`, logged as a refusal); the same size and mtime,
else EIO (the file changed under the mount). Nothing of such a file is served.
"""
from __future__ import annotations

import concurrent.futures as cf
import errno
import logging
import operator
import os
import signal
import stat as stat_mod
import struct
import time
from typing import Any, Dict, FrozenSet, Iterator, List, Optional, Tuple

import numpy as np
from xxhash import xxh3_64_intdigest as _xxh3

from ..logutil import RateLimitedLog
from ..procutil import can_fork, die_with
from .base import Backend, BackendError, DirChunk, Entry, ScanReport, StaleSource
from .beneath import open_beneath

__all__ = ["PosixBackend", "identity_tag"]

log = logging.getLogger("shadefs.backends.posix")

_K = 0x9E3779B97F4A7C15   # golden-ratio multiplier (odd: distinct inodes get distinct tags)
_M64 = (1 << 64) - 1
_O_PATH = getattr(os, "O_PATH", 0)


def identity_tag(ino: int) -> int:
    """The 64-bit tag the snapshot keeps of a file's inode number in ``etags`` (never 0 = unknown):
    another inode at the same path (a file replaced by rename, a symlink swapped in) has another tag.

    The device number is left out on purpose: a network or FUSE filesystem gets another one at each
    mount (an NFS remount, a reboot), which would make every file of it look replaced; and only root can
    put another filesystem at a path beneath the source root."""
    return (ino * _K) & _M64 or 1


def _identity_tags(inos: np.ndarray) -> np.ndarray:
    """:func:`identity_tag` of an array of inode numbers (uint64)."""
    with np.errstate(over="ignore"):
        tags = inos.astype(np.uint64) * np.uint64(_K)
    tags[tags == 0] = 1
    return tags

#: filesystems whose ``stat`` never waits on a network: listed by one thread
LOCAL_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "zfs", "f2fs", "overlay",
                      "jfs", "reiserfs", "bcachefs", "vfat", "exfat", "hfsplus", "apfs"})
REMOTE_SCAN_WORKERS = 16
#: filesystems whose inode numbers name a file for as long as it exists, across remounts (the server's
#: file ids on NFS): the listing tags each file with its inode (:func:`identity_tag`). Elsewhere (FUSE
#: sources such as sshfs or another shadefs number inodes per mount; SMB may) files carry no tag, and
#: an opened file is checked by size and mtime only
STABLE_INODE_FS = LOCAL_FS | frozenset({"nfs", "nfs4", "lustre", "gpfs", "ceph", "beegfs", "orangefs"})


#: a 1-thread listing still running after this many seconds hands the subtrees left to helper processes
#: started as fresh interpreters (~0.2 s of CPU each to start)
SCAN_PROCESSES_AFTER_S = 1.0
#: the same, where the helpers can be forked (no other thread in this process; a fork costs milliseconds)
SCAN_FORK_AFTER_S = 0.1
#: helper processes of such a listing (at most the CPU count): each lists whole subtrees outside this
#: process's GIL and sends their chunks back (a warm 1M-file scan is CPU-bound: docs/performance.md)
SCAN_PROCESSES = 4


def _whole(value, name: str, default: int) -> int:
    if value in (None, ""):
        return default
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1 or str(value).strip() != str(n):
        raise BackendError(f"backend option {name}={value}: must be a whole number >= 1")
    return n


def _fs_type(path: str) -> str:
    """The type of the filesystem ``path`` lies on (``/proc/self/mountinfo``, longest mount point), or ""."""
    try:
        real = os.path.realpath(path)
        best, kind = -1, ""
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                mnt = left.split()[4].replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > best:
                    best, kind = len(mnt), right.split()[0]
        return kind
    except (OSError, IndexError):
        return ""


class PosixBackend(Backend):
    """Files under the directory ``url`` (a path, or ``file://`` + path).

    Options:
        scan_workers (int): directories listed in parallel. Default: 1 on a local filesystem (the scan is
            CPU-bound there, and threads contending for the GIL made a warm 1M-file scan 5.6x slower with
            16 than with 1: docs/performance.md), 16 on a network or FUSE filesystem (each ``stat`` waits
            on a server: threads overlap the waits).
        scan_processes (int): processes that list a local tree (this one included; default
            ``min(4, CPUs)``). A 1-thread listing still running after ``SCAN_PROCESSES_AFTER_S`` (1 s)
            deals the subtrees it has not listed yet to ``scan_processes - 1`` helper processes (fresh
            interpreters) and lists its own share: the warm scan is CPU-bound in Python, and processes do
            not share a GIL. Small trees are listed in process alone. 1: never.
    """

    etags_are_versions = False  # its tags are inode numbers (identity, not content)

    scheme = "file"
    #: the listing may run in a forked child (:meth:`Namespace.scan` ``isolate``): it uses no thread, lock
    #: or connection made before the fork
    scan_in_child = True

    def __init__(self, url: str, scan_workers=None, scan_processes=None, **options):
        super().__init__(url, **options)
        root = url[len("file://"):] if url.startswith("file://") else url
        self.root = os.path.abspath(root)
        self.scan_processes = _whole(scan_processes, "scan_processes", min(SCAN_PROCESSES, os.cpu_count() or 1))
        self.scan_after_s: Optional[float] = None   # None: SCAN_FORK_AFTER_S or SCAN_PROCESSES_AFTER_S
        self._real_root = os.path.realpath(self.root)
        self._ns = None          # the served namespace (attach): each opened file is checked against it
        self._follow = False     # --follow-symlinks: a symlink may lead out of the tree
        self._refusals = RateLimitedLog(log, 10.0)
        fs = _fs_type(self.root)
        self.inode_tags = fs in STABLE_INODE_FS   # the listing tags each file with its inode number
        if scan_workers in (None, ""):
            self.scan_workers = 1 if fs in LOCAL_FS else REMOTE_SCAN_WORKERS
            return
        try:
            self.scan_workers = int(scan_workers)
        except (TypeError, ValueError):
            self.scan_workers = 0
        if self.scan_workers < 1 or str(scan_workers).strip() != str(self.scan_workers):
            raise BackendError(f"backend option scan_workers={scan_workers}: must be a whole number >= 1")

    def _full(self, path: str) -> str:
        return os.path.join(self.root, path)

    # -- listing -------------------------------------------------------------------------------------
    def walk(self) -> Iterator[Entry]:
        """Yield every served regular file (the rules of :meth:`scan`, without symlink following)."""
        chunks, _ = self.scan()
        for c in chunks:
            prefix = f"{c.path}/" if c.path else ""
            offs = np.concatenate(([0], np.cumsum(c.name_lens))).tolist()
            for i in range(c.num_files):
                name = c.names[offs[i]:offs[i + 1]].decode("utf-8", "surrogateescape")
                yield Entry(prefix + name, int(c.sizes[i]), int(c.mtimes_ns[i]), int(c.modes[i]),
                            int(c.uids[i]), int(c.gids[i]))

    def scan(self, follow_symlinks: bool = False) -> Tuple[Iterator[DirChunk], ScanReport]:
        """List the tree, one :class:`DirChunk` per directory (empty ones included), in parallel.

        The rules (docs/operations.md, "Security"):

        - a symlink is served as its target when the target lies inside the source tree (its real path
          is below the root's real path); outside it, it is skipped (``symlinks_outside``) unless
          ``follow_symlinks``; a dangling one is skipped (``symlinks_dangling``);
        - a directory whose (st_dev, st_ino) is one of its ancestors' is a loop and skipped (``loops``),
          so symlink loops (``a/l -> .``) cost one ``stat`` each;
        - a directory that cannot be listed, or a file the daemon may not read (its permission bits
          against the daemon's uid, groups and capabilities), is skipped (``unreadable``); the rest of
          the tree is served;
        - fifos, sockets and devices are skipped (``special``).

        Raises:
            FileNotFoundError: the root is not a directory.
        """
        try:
            st = os.stat(self.root)
        except FileNotFoundError:
            raise FileNotFoundError(f"source {self.root!r} is not a directory") from None
        if not stat_mod.S_ISDIR(st.st_mode):
            raise FileNotFoundError(f"source {self.root!r} is not a directory")
        report = ScanReport()
        chunks = self._scan(st, follow_symlinks, report)
        return (chunks if self.inode_tags else _untagged(chunks)), report

    def _scan(self, root_st, follow: bool, report: ScanReport) -> Iterator[DirChunk]:
        real_root = os.path.realpath(self.root)
        check = _ReadCheck()
        workers = max(1, self.scan_workers)
        root_task = (self.root, "", frozenset([(root_st.st_dev, root_st.st_ino)]), root_st)
        if workers == 1:
            stack = [root_task]
            fork = can_fork()
            after = self.scan_after_s if self.scan_after_s is not None else \
                SCAN_FORK_AFTER_S if fork else SCAN_PROCESSES_AFTER_S
            deadline = time.monotonic() + after
            while stack:
                chunk, tasks, rep = _scan_dir(*stack.pop(), real_root, follow, check)
                report.merge(rep)
                stack.extend(tasks)
                if chunk is not None:
                    yield chunk
                if self.scan_processes > 1 and len(stack) >= 2 * self.scan_processes \
                        and time.monotonic() > deadline:
                    deal = self._scan_in_forks if fork else self._scan_in_processes
                    yield from deal(stack, real_root, follow, check, report)
                    return
            return
        with cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="scan") as pool:
            pending = {pool.submit(_scan_dir, *root_task, real_root, follow, check)}
            while pending:
                done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    chunk, tasks, rep = fut.result()
                    report.merge(rep)
                    for t in tasks:
                        pending.add(pool.submit(_scan_dir, *t, real_root, follow, check))
                    if chunk is not None:
                        yield chunk

    def _scan_in_processes(self, stack: List["Task"], real_root: str, follow: bool, check: "_ReadCheck",
                           report: ScanReport) -> Iterator[DirChunk]:
        """List the subtrees of ``stack`` in this process and ``scan_processes - 1`` helper processes (a
        fresh interpreter each, ``python -c``: nothing of this process, its threads or its main module is
        inherited), each task's subtree whole in one of them, dealt round-robin in the 1-thread order;
        a helper's chunks come back pickled on its stdout. The same rules as in process
        (:func:`_scan_dir`). Raises BackendError if a helper fails."""
        import pickle
        import subprocess
        import sys

        tasks = stack[::-1]   # the order the 1-thread loop would have taken them in
        k = min(self.scan_processes, len(tasks))
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([pkg_root, *filter(None, [os.environ.get("PYTHONPATH")])]))
        helpers = []
        try:
            for i in range(1, k):
                p = subprocess.Popen([sys.executable, "-c", "from shadefs.backends.posix import _helper_main; "
                                      "_helper_main()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
                p.stdin.write(pickle.dumps((tasks[i::k], real_root, follow, check), pickle.HIGHEST_PROTOCOL))
                p.stdin.close()
                helpers.append(p)
            for t in tasks[0::k]:      # this process's share, while the helpers list theirs
                chunks, rep = _scan_subtree(t, real_root, follow, check)
                report.merge(rep)
                yield from chunks
            for p in helpers:
                try:
                    chunks, rep = pickle.load(p.stdout)   # streamed: no second copy of the pickled bytes
                except (EOFError, pickle.UnpicklingError, ValueError) as e:
                    raise BackendError(f"listing {self.root!r}: a scan helper process failed "
                                       f"(exit {p.wait()}: {e})") from None
                if p.wait() != 0:
                    raise BackendError(f"listing {self.root!r}: a scan helper process failed (exit {p.returncode})")
                report.merge(rep)
                yield from chunks
                del chunks
        finally:
            for p in helpers:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                p.stdout.close()

    def _scan_in_forks(self, stack: List["Task"], real_root: str, follow: bool, check: "_ReadCheck",
                       report: ScanReport) -> Iterator[DirChunk]:
        """List the subtrees of ``stack`` in this process and ``scan_processes - 1`` forked helpers (only
        where :func:`~shadefs.procutil.can_fork`: no other thread), each subtree whole in one process. Work is claimed,
        not dealt: the subtrees' indices wait in a pipe, and each process reads the next one (4 bytes: one
        read of a pipe is atomic) when it is done with the last, so a process the machine's other load
        slows down lists fewer. A helper's chunks come back pickled through its own pipe. The same rules
        as in process (:func:`_scan_dir`). Raises BackendError if a helper fails."""
        import pickle

        tasks = stack[::-1]   # the order the 1-thread loop would have taken them in
        k = min(self.scan_processes, len(tasks))
        # one unit = a run of subtrees; at most 16384 units, so that every index fits the pipe's 64 KiB
        per = -(-len(tasks) // _MAX_UNITS)
        units = [tasks[i:i + per] for i in range(0, len(tasks), per)]
        qr, qw = os.pipe()
        helpers: List[Tuple[int, int]] = []   # (pid, read end of its result pipe)
        try:
            data = b"".join(struct.pack("<I", i) for i in range(len(units)))
            for i in range(0, len(data), 4096):  # writes of <= PIPE_BUF bytes are atomic
                os.write(qw, data[i:i + 4096])
            os.close(qw)
            qw = -1
            parent = os.getpid()
            for _ in range(1, k):
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:  # a helper: never returns
                    code = 1
                    try:
                        os.close(r)
                        for _, hr in helpers:
                            os.close(hr)
                        die_with(parent)
                        out: List[DirChunk] = []
                        rep = ScanReport()
                        for u in _claims(qr):
                            for t in units[u]:
                                chunks, r2 = _scan_subtree(t, real_root, follow, check)
                                rep.merge(r2)
                                out.extend(chunks)
                        with open(w, "wb", closefd=False) as f:
                            pickle.dump((out, rep), f, pickle.HIGHEST_PROTOCOL)
                        code = 0
                    finally:
                        os._exit(code)
                os.close(w)
                helpers.append((pid, r))
            for u in _claims(qr):   # this process's share, while the helpers list theirs
                for t in units[u]:
                    chunks, rep = _scan_subtree(t, real_root, follow, check)
                    report.merge(rep)
                    yield from chunks
            while helpers:
                pid, r = helpers[0]
                try:
                    with open(r, "rb", closefd=False) as f:
                        chunks, rep = pickle.load(f)
                except (EOFError, pickle.UnpicklingError, ValueError) as e:
                    _, status = os.waitpid(pid, 0)
                    raise BackendError(f"listing {self.root!r}: a scan helper process failed "
                                       f"(status {status}: {e})") from None
                _, status = os.waitpid(pid, 0)
                os.close(r)
                helpers.pop(0)
                if status != 0:
                    raise BackendError(f"listing {self.root!r}: a scan helper process failed (status {status})")
                report.merge(rep)
                yield from chunks
                del chunks
        finally:
            if qw >= 0:
                os.close(qw)
            os.close(qr)
            for pid, r in helpers:
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
                os.close(r)

    # -- snapshots -----------------------------------------------------------------------------------
    def snapshot_key(self, follow_symlinks: bool) -> Optional[Dict[str, Any]]:
        """The root's real path, the symlink rule, who reads (uid, groups, capabilities) and whether files
        carry inode tags (a snapshot listed without them is scanned again)."""
        c = _ReadCheck()
        return {"backend": "posix", "root": os.path.realpath(self.root), "follow_symlinks": bool(follow_symlinks),
                "euid": c.euid, "groups": sorted(c.groups), "override": c.override,
                "tags": "ino" if self.inode_tags else None}

    def snapshot_changed(self, dir_paths: List[str], mtimes_ns: np.ndarray, ctimes_ns: np.ndarray,
                         watched: List[Tuple[str, int, int]]) -> Optional[str]:
        """Compare every directory's mtime and ctime (one ``stat`` each) with the snapshot's: an entry
        added, removed or renamed changes its directory's mtime, a chmod or chown its ctime."""
        m = mtimes_ns.tolist()
        c = ctimes_ns.tolist()
        items = [(p, m[i], c[i]) for i, p in enumerate(dir_paths)] + list(watched)
        for rel, mt, ct in items:
            try:
                st = os.stat(os.path.join(self.root, rel) if rel else self.root)
            except OSError as e:
                return f"{rel or '.'}: {e.strerror or e}"
            if st.st_mtime_ns != mt or st.st_ctime_ns != ct:
                return f"directory {rel or '.'!r} changed"
        return None

    # -- reads: beneath the root, and only the file the snapshot describes ------------------------------
    def attach(self, namespace, follow_symlinks: bool = False) -> None:
        """Check every opened file against ``namespace``'s record of it (tag, size, mtime); with
        ``follow_symlinks`` a symlink may lead out of the tree, as the scan allowed."""
        self._ns = namespace
        self._follow = bool(follow_symlinks)

    def _refuse(self, path: str, why: str) -> StaleSource:
        self._refusals(logging.WARNING, "refused to serve %r: %s", path, why)
        return StaleSource(f"{path!r}: {why}")

    def _open(self, path: str, flags: int) -> int:
        """A descriptor of ``path`` opened with ``flags``, resolved beneath the root with no symlink
        followed; a path through a symlink is opened as the scan serves it (its real path inside the
        tree, again with no symlink followed; anywhere with ``--follow-symlinks``).

        Raises:
            FileNotFoundError: no such file.
            StaleSource: a symlink the scan would not serve (outside the tree), or swapped meanwhile.
            OSError: the open failed otherwise.
        """
        root = os.open(self.root, _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            try:
                return open_beneath(root, path, flags)
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
            # a symlink on the path: resolved as the scan resolved it
            real = os.path.realpath(os.path.join(self.root, path))
            inside = real.startswith(self._real_root.rstrip("/") + "/")
            if not inside:
                if not self._follow:
                    raise self._refuse(path, f"a symlink to {real!r}, outside the source tree")
                return os.open(real, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                return open_beneath(root, real[len(self._real_root.rstrip("/")) + 1:], flags)
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
                raise self._refuse(path, "a symlink on its path changed while it was opened") from None
        finally:
            os.close(root)

    def _check(self, fd: int, path: str, size: Optional[int]) -> os.stat_result:
        """``fstat`` the opened ``fd`` of ``path``: a regular file, ``size`` bytes (when given) and, once a
        namespace is attached, the inode, size and mtime its snapshot record says.

        Raises:
            StaleSource: another file than the snapshot's (ESTALE): not a regular file, another inode.
            BackendError: the same file with another size or mtime: it changed under the mount (EIO).
        """
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            raise self._refuse(path, "no longer a regular file")
        ns = self._ns
        fid = ns.file_id(path) if ns is not None else None
        if fid is not None:
            size = int(ns.sizes[fid])
            tag = int(ns.etags[fid])
            if tag and identity_tag(st.st_ino) != tag:
                raise self._refuse(path, "another file than the snapshot's (replaced, or a symlink swapped in)")
            if st.st_mtime_ns != int(ns.mtimes_ns[fid]):
                raise BackendError(f"read {path!r}: mtime {st.st_mtime_ns} ns, the snapshot says {int(ns.mtimes_ns[fid])} "
                                   f"(the file changed under the mount)")
        if size is not None and st.st_size != size:
            raise BackendError(f"read {path!r}: {st.st_size} bytes, the snapshot says {size} (the file changed "
                               f"under the mount)")
        return st

    def _open_checked(self, path: str, size: Optional[int]) -> int:
        try:
            fd = self._open(path, os.O_RDONLY)
        except FileNotFoundError:
            if self._source_gone(self._full(path)):
                raise BackendError(f"read {path!r}: the source {self.root!r} is unreachable (empty or "
                                   f"missing: an unmounted NFS or bind mount?)") from None
            raise
        except BackendError:
            raise
        except OSError as e:
            raise BackendError(e.errno, f"read {path!r}: {e.strerror or e}") from e
        try:
            self._check(fd, path, size)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_source(self, path: str, size: int) -> int:
        """An ``O_RDONLY`` descriptor of the source file ``path`` (``size`` bytes), opened and checked as a
        read opens it (beneath the root, no symlink followed; ``fstat`` against the snapshot's inode,
        size and mtime), for the kernel front end to register as a FUSE passthrough backing file (the
        kernel then reads the source file itself). The caller closes it.

        Raises:
            FileNotFoundError, StaleSource, BackendError: as :meth:`read` (gone, refused, changed).
        """
        return self._open_checked(path, size)

    def read(self, path: str, size: int) -> bytes:
        fd = self._open_checked(path, size)
        try:
            # os.read allocates the bytes object it returns: one buffer, no copy (a short read asks again;
            # one byte more than the snapshot's size shows a file that grew). No FileIO around the fd: its
            # constructor would fstat the file a second time
            parts = []
            got = 0
            while got <= size:
                piece = os.read(fd, size + 1 - got)
                if not piece:
                    break
                parts.append(piece)
                got += len(piece)
        except OSError as e:
            raise BackendError(f"read {path!r}: {e.strerror or e}") from e
        finally:
            os.close(fd)
        if got != size:
            raise BackendError(f"read {path!r}: {got if got <= size else 'more than'} bytes, "
                               f"the snapshot says {size} (the file changed under the mount)")
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _source_gone(self, full: str) -> bool:
        """For a missing file: is the whole source gone rather than this file? An unmounted NFS or bind
        mount leaves an empty directory (or none) where the dataset was; that is EIO, not ENOENT."""
        parent = os.path.dirname(full)
        try:
            if parent != self.root and os.path.isdir(parent):
                return False  # the file's directory is there: the file itself was removed
            with os.scandir(self.root) as it:
                return next(it, None) is None
        except OSError:
            return True

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        fd = self._open_checked(path, None)
        try:
            return os.pread(fd, length, offset)
        except OSError as e:
            raise BackendError(f"read {path!r} at {offset}: {e.strerror or e}") from e
        finally:
            os.close(fd)

    def _stat(self, path: str) -> os.stat_result:
        fd = self._open(path, _O_PATH)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            raise FileNotFoundError(errno.ENOENT, "not a regular file", path)
        return st

    def stat(self, path: str) -> Tuple[int, int]:
        st = self._stat(path)
        return st.st_size, st.st_mtime_ns

    def identify(self, path: str) -> Tuple[int, int, int]:
        """(size in bytes, mtime in ns, :func:`identity_tag`) of ``path`` now, resolved as a read resolves it."""
        try:
            st = self._stat(path)
        except (FileNotFoundError, BackendError):
            raise
        except OSError as e:
            raise BackendError(e.errno, f"stat {path!r}: {e.strerror or e}") from e
        return st.st_size, st.st_mtime_ns, identity_tag(st.st_ino) if self.inode_tags else 0


_MAX_UNITS = 16384


def _untagged(chunks: Iterator[DirChunk]) -> Iterator[DirChunk]:
    """The chunks without inode tags (a source whose inode numbers are not stable: STABLE_INODE_FS)."""
    for c in chunks:
        c.etags = None
        yield c


def _claims(fd: int) -> Iterator[int]:
    """Unit indices read from the claim pipe ``fd`` (4 bytes each) until it is empty."""
    while True:
        b = os.read(fd, 4)
        if len(b) < 4:
            return
        yield struct.unpack("<I", b)[0]


_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2
# a stat_result's mode, inode, uid, gid and size are tuple items (cheaper than attributes); the integer
# nanosecond mtime is not (the float st_mtime would lose the nanoseconds: ~240 ns steps at today's dates)
_MODE, _INO, _UID, _GID, _SIZE = (operator.itemgetter(i) for i in (0, 1, 4, 5, 6))
_MTIME_NS = operator.attrgetter("st_mtime_ns")


class _ReadCheck:
    """May this process read a file, judged from its mode, uid and gid (no syscall per file)?

    The kernel's rule: the owner's bits apply to the owner, the group's to members, the others' to the
    rest; CAP_DAC_OVERRIDE or CAP_DAC_READ_SEARCH read anything. ACLs are not evaluated (a file an ACL
    denies is listed and its reads fail with EIO).
    """

    def __init__(self):
        self.euid = os.geteuid()
        self.groups = frozenset(os.getgroups()) | {os.getegid()}
        self.override = False
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("CapEff:"):
                        eff = int(line.split()[1], 16)
                        self.override = bool(eff & ((1 << _CAP_DAC_OVERRIDE) | (1 << _CAP_DAC_READ_SEARCH)))
        except OSError:
            self.override = self.euid == 0
        self._groups = np.array(sorted(self.groups), dtype=np.uint32)

    def readable(self, modes: np.ndarray, uids: np.ndarray, gids: np.ndarray) -> np.ndarray:
        if self.override:
            return np.ones(len(modes), dtype=bool)
        own = uids == self.euid
        grp = ~own & np.isin(gids, self._groups)
        oth = ~own & ~grp
        return ((own & (modes & 0o400 != 0)) | (grp & (modes & 0o040 != 0)) | (oth & (modes & 0o004 != 0)))


Task = Tuple[str, str, FrozenSet[Tuple[int, int]], os.stat_result]


def _scan_dir(full: str, rel: str, ancestors: FrozenSet[Tuple[int, int]], dst: os.stat_result, real_root: str,
              follow: bool, check: _ReadCheck) -> Tuple[Optional[DirChunk], List[Task], ScanReport]:
    """List one directory: its chunk (None if it cannot be listed), the subdirectories to list next,
    and what was skipped. Never raises for one bad entry."""
    rep = ScanReport()
    files: Dict[str, os.stat_result] = {}   # name -> stat: one store per file, sorted by name once at the end
    tasks: List[Task] = []
    subdirs: List[str] = []
    prefix = f"{rel}/" if rel else ""
    try:
        fd = os.open(full, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None, tasks, rep  # vanished during the scan
    except OSError:
        rep.add("unreadable", rel or ".")
        return None, tasks, rep
    try:
        with os.scandir(fd) as it:
            for de in it:
                name = de.name
                try:
                    if de.is_file(follow_symlinks=False):
                        files[name] = de.stat(follow_symlinks=False)
                        continue
                    if de.is_dir(follow_symlinks=False):
                        st = de.stat(follow_symlinks=False)
                    elif de.is_symlink():
                        st = _resolve_link(os.path.join(full, name), prefix + name, real_root, follow, rep)
                        if st is None:
                            continue
                        if stat_mod.S_ISREG(st.st_mode):
                            files[name] = st
                            continue
                        if not stat_mod.S_ISDIR(st.st_mode):
                            rep.add("special", prefix + name)
                            continue
                    else:
                        rep.add("special", prefix + name)
                        continue
                except PermissionError:
                    rep.add("unreadable", prefix + name)
                    continue
                except FileNotFoundError:
                    continue  # vanished during the scan
                key = (st.st_dev, st.st_ino)
                if key in ancestors:
                    rep.add("loops", prefix + name)
                    continue
                subdirs.append(name)
                tasks.append((os.path.join(full, name), prefix + name, ancestors | {key}, st))
    except OSError:
        rep.add("unreadable", rel or ".")
        return None, [], rep
    finally:
        os.close(fd)
    # sorted by name as Python sorts strings (the namespace's order); per file: one C-level pass per field
    names = sorted(files)
    sts = list(map(files.__getitem__, names))
    del files
    n = len(names)
    modes = np.fromiter(map(_MODE, sts), dtype=np.uint16, count=n) & 0o7777
    uids = np.fromiter(map(_UID, sts), dtype=np.uint32, count=n)
    gids = np.fromiter(map(_GID, sts), dtype=np.uint32, count=n)
    sizes = np.fromiter(map(_SIZE, sts), dtype=np.int64, count=n)
    mtimes = np.fromiter(map(_MTIME_NS, sts), dtype=np.int64, count=n)
    tags = _identity_tags(np.fromiter(map(_INO, sts), dtype=np.uint64, count=n))
    del sts
    if n:
        ok = check.readable(modes, uids, gids)
        if not ok.all():
            bad = np.flatnonzero(~ok)
            for i in bad[:ScanReport.EXAMPLES].tolist():
                rep.add("unreadable", prefix + names[i], 0)
            rep.counts["unreadable"] = rep.counts.get("unreadable", 0) + len(bad)
            keep = np.flatnonzero(ok)
            names = [names[i] for i in keep.tolist()]
            modes, uids, gids, sizes, mtimes = modes[keep], uids[keep], gids[keep], sizes[keep], mtimes[keep]
            tags = tags[keep]
            n = len(names)
    joined = "".join(names)
    try:
        blob = joined.encode("utf-8")
        encoded = None if len(blob) == len(joined) else [x.encode("utf-8") for x in names]
    except UnicodeEncodeError:  # undecodable bytes in a name (surrogateescape)
        encoded = [x.encode("utf-8", "surrogateescape") for x in names]
        blob = b"".join(encoded)
    if encoded is None:  # ASCII: a name's length in characters is its length in bytes
        lens = np.fromiter(map(len, names), dtype=np.int64, count=n)
        hashes = np.fromiter(map(_xxh3, map(str.encode, names)), dtype=np.uint64, count=n)
    else:
        lens = np.fromiter(map(len, encoded), dtype=np.int64, count=n)
        hashes = np.fromiter(map(_xxh3, encoded), dtype=np.uint64, count=n)
    chunk = DirChunk(rel, dst.st_mode & 0o7777, dst.st_uid, dst.st_gid, dst.st_mtime_ns, dst.st_ctime_ns,
                     blob, lens, hashes, sizes, mtimes, modes, uids, gids, sorted(subdirs), size=dst.st_size,
                     etags=tags)
    return chunk, tasks, rep


def _helper_main() -> None:
    """A scan helper process (:meth:`PosixBackend._scan_in_processes`): reads (tasks, real_root, follow,
    check) pickled on stdin, writes (chunks, report) pickled on stdout."""
    import pickle
    import sys

    tasks, real_root, follow, check = pickle.loads(sys.stdin.buffer.read())
    report = ScanReport()
    out: List[DirChunk] = []
    for t in tasks:
        chunks, rep = _scan_subtree(t, real_root, follow, check)
        report.merge(rep)
        out.extend(chunks)
    pickle.dump((out, report), sys.stdout.buffer, pickle.HIGHEST_PROTOCOL)
    sys.stdout.buffer.flush()


def _scan_subtree(task: "Task", real_root: str, follow: bool, check: "_ReadCheck") -> Tuple[List[DirChunk], ScanReport]:
    """A scan helper process: list ``task``'s directory and everything below it (the 1-thread order)."""
    report = ScanReport()
    out: List[DirChunk] = []
    stack = [task]
    while stack:
        chunk, tasks, rep = _scan_dir(*stack.pop(), real_root, follow, check)
        report.merge(rep)
        stack.extend(tasks)
        if chunk is not None:
            out.append(chunk)
    return out, report


def _resolve_link(path: str, rel: str, real_root: str, follow: bool, rep: ScanReport) -> Optional[os.stat_result]:
    """The stat of a symlink's target, or None (skipped and counted): dangling, or outside the tree
    and not ``follow``."""
    try:
        st = os.stat(path)
    except PermissionError:
        rep.add("unreadable", rel)
        return None
    except OSError:  # missing target, ELOOP
        rep.add("symlinks_dangling", rel)
        return None
    if not follow:
        real = os.path.realpath(path)
        if real != real_root and not real.startswith(real_root.rstrip("/") + "/"):
            rep.add("symlinks_outside", rel)
            return None
    return st
