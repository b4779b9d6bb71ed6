"""The regime users have: a training job with less memory than its dataset.

A figure about epoch time, prefetch or hits means nothing for users if the kernel's page cache held the
whole dataset: then every repeat read is served by the kernel, whatever the cache does. Two ways to put a
reader on one machine in the regime of a dataset many times larger than the node's memory:

- :class:`MemoryCgroup`: the reader (the training job and its DataLoader workers, which inherit it) runs in
  a memory cgroup smaller than the dataset, a child of this process's own cgroup (cgroup v1
  ``memory.limit_in_bytes``, or v2 ``memory.max``). The kernel charges the pages of files the reader reads
  through the mount to that cgroup, so it keeps what fits and reclaims the rest, as on a node whose memory
  the dataset outgrows. The cgroup is removed on exit.
- :func:`read_dropping` / :func:`pil_loader_dropping`: a loader that drops each file's pages
  (``posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)``) after reading it, on the same open: the kernel keeps
  nothing between opens, so every count is exact (no reclaim timing decides what a repeat open finds).

Each benchmark prints :func:`describe` of the regime it ran in. This module never writes
``/proc/sys/vm/drop_caches`` (it is global: other jobs on a shared machine lose their pages too).
"""
from __future__ import annotations

import io
import os
import uuid
from typing import Callable, List, Optional

__all__ = ["MemoryCgroup", "cgroup_unavailable", "read_dropping", "pil_loader_dropping", "describe",
           "REGIMES", "popen_in"]

#: the regimes a benchmark may run a reader in (``--regime``): a memory cgroup smaller than the dataset,
#: the page-dropping loader, or (never for a headline figure) the page cache unbounded
REGIMES = ("cgroup", "dontneed", "page-cache")


def _own_cgroup() -> Optional[tuple]:
    """``(version, directory)`` of this process's memory cgroup, or None when no memory controller is
    mounted where this module looks (``/sys/fs/cgroup``)."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            lines = [ln.rstrip("\n").split(":", 2) for ln in f]
    except OSError:
        return None
    for hid, ctrls, path in lines:  # cgroup v1: "N:memory:/path"
        if "memory" in ctrls.split(","):
            d = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
            if os.path.exists(os.path.join(d, "memory.limit_in_bytes")):
                return 1, d
    for hid, ctrls, path in lines:  # cgroup v2: "0::/path"
        if hid == "0" and ctrls == "":
            d = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
            if os.path.exists(os.path.join(d, "cgroup.controllers")):
                return 2, d
    return None


def cgroup_unavailable() -> Optional[str]:
    """None when :class:`MemoryCgroup` can be created here, else why not (a sentence)."""
    own = _own_cgroup()
    if own is None:
        return "no memory cgroup controller under /sys/fs/cgroup for this process"
    version, d = own
    if not os.access(d, os.W_OK):
        return f"cannot create a child of {d} (not writable)"
    if version == 2:
        try:
            with open(os.path.join(d, "cgroup.subtree_control"), encoding="utf-8") as f:
                if "memory" not in f.read().split():
                    return f"{d} does not delegate the memory controller to its children"
        except OSError as e:
            return f"{d}: {e.strerror}"
    return None


class MemoryCgroup:
    """A memory cgroup, a child of this process's own, limiting its members' memory, page cache included.

    Use as a context manager (created on enter, removed on exit)::

        with MemoryCgroup(64 << 20) as cg:
            subprocess.run(argv, preexec_fn=cg.enter_self)   # the child and its children in the cgroup

    Args:
        limit_bytes: the memory limit (bytes); it must be above the reader's own RSS (else the kernel's OOM
            killer ends it) and below its RSS plus the dataset's bytes (else nothing is ever reclaimed).
        name: the child's directory name (default a unique ``shadefs-regime-...``).

    Raises:
        OSError: on enter, when the cgroup cannot be created (:func:`cgroup_unavailable` says why).
    """

    def __init__(self, limit_bytes: int, name: Optional[str] = None):
        self.limit_bytes = int(limit_bytes)
        self.name = name or f"shadefs-regime-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.version: Optional[int] = None
        self.path: Optional[str] = None
        self._parent: Optional[str] = None

    # -- lifecycle --------------------------------------------------------------------------------
    def create(self) -> "MemoryCgroup":
        """Create the cgroup and set its limit. Raises OSError where it cannot."""
        why = cgroup_unavailable()
        if why:
            raise OSError(why)
        self.version, self._parent = _own_cgroup()
        self.path = os.path.join(self._parent, self.name)
        os.mkdir(self.path)
        try:
            if self.version == 1:
                self._write("memory.limit_in_bytes", str(self.limit_bytes))
            else:
                self._write("memory.max", str(self.limit_bytes))
                if os.path.exists(os.path.join(self.path, "memory.swap.max")):
                    self._write("memory.swap.max", "0")
        except OSError:
            os.rmdir(self.path)
            raise
        return self

    def remove(self) -> None:
        """Move any process still in the cgroup back to the parent, then remove the cgroup. Idempotent."""
        if self.path is None or not os.path.isdir(self.path):
            return
        for pid in self.pids():
            try:
                with open(os.path.join(self._parent, "cgroup.procs"), "w", encoding="ascii") as f:
                    f.write(str(pid))
            except OSError:
                pass  # it exited meanwhile
        try:
            os.rmdir(self.path)
        except OSError:
            pass  # a member still exiting: the kernel removes nothing while it lives; leave the directory
        self.path = self.path if os.path.isdir(self.path) else None

    def __enter__(self) -> "MemoryCgroup":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.remove()

    # -- members ----------------------------------------------------------------------------------
    def add(self, pid: int) -> None:
        """Move process ``pid`` (not its running children; those forked later inherit it) into the
        cgroup."""
        self._write("cgroup.procs", str(int(pid)))

    def enter_self(self) -> None:
        """Move the calling process into the cgroup: a ``preexec_fn`` for ``subprocess.Popen``."""
        self.add(os.getpid())

    def pids(self) -> List[int]:
        """The processes in the cgroup now."""
        try:
            with open(os.path.join(self.path, "cgroup.procs"), encoding="ascii") as f:
                return [int(x) for x in f.read().split()]
        except (OSError, TypeError):
            return []

    # -- readings ---------------------------------------------------------------------------------
    def stat(self) -> dict:
        """``memory.stat`` as ``{name: int}`` (bytes for sizes)."""
        out = {}
        with open(os.path.join(self.path, "memory.stat"), encoding="ascii") as f:
            for line in f:
                k, _, v = line.partition(" ")
                if v.strip().isdigit():
                    out[k] = int(v)
        return out

    def page_cache_bytes(self) -> int:
        """Bytes of file pages charged to the cgroup now (v1 ``cache``, v2 ``file``)."""
        s = self.stat()
        return int(s.get("cache", s.get("file", 0)))

    def peak_bytes(self) -> int:
        """The most memory charged to the cgroup since it was created (bytes)."""
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            with open(os.path.join(self.path, name), encoding="ascii") as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return 0

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w", encoding="ascii") as f:
            f.write(value)


def read_dropping(path: str) -> bytes:
    """The whole file at ``path``, read with one open, whose pages are then dropped from the kernel's page
    cache on that same open (``POSIX_FADV_DONTNEED``): the next open of the file finds none of them, as
    with a dataset larger than the reader's memory."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return b"".join(chunks)


def drop_tree_pages(root: str) -> int:
    """Drop the page cache of every regular file under ``root`` (``POSIX_FADV_DONTNEED`` on each; no
    symlink followed): what a reboot leaves of their pages, for this tree only, with no write to
    ``/proc/sys/vm/drop_caches`` (a machine-wide drop). Dentries and inodes stay cached. Returns the number
    of files dropped; a file that cannot be opened is skipped."""
    n = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            finally:
                os.close(fd)
    return n


def pil_loader_dropping(path: str):
    """A ``loader`` for ``torchvision.datasets.ImageFolder`` that reads with :func:`read_dropping`: the
    same RGB image as torchvision's default loader, and the kernel keeps none of the file's pages."""
    from PIL import Image

    with Image.open(io.BytesIO(read_dropping(path))) as img:
        return img.convert("RGB")


def describe(regime: str, limit_bytes: int = 0, dataset_bytes: int = 0) -> str:
    """One line naming the regime a figure was measured in, for a benchmark's header.

    Args:
        regime: one of :data:`REGIMES`.
        limit_bytes: the reader's memory cgroup limit (``cgroup``).
        dataset_bytes: the bytes of the files read.

    Raises:
        ValueError: for a regime not in :data:`REGIMES`.
    """
    mib = lambda n: f"{n / 2**20:.0f} MiB"  # noqa: E731
    if regime == "cgroup":
        return (f"regime: reader in a {mib(limit_bytes)} memory cgroup, dataset {mib(dataset_bytes)} "
                f"({dataset_bytes / max(1, limit_bytes):.1f}x the reader's memory)")
    if regime == "dontneed":
        return (f"regime: reader drops each file's pages after reading it (POSIX_FADV_DONTNEED), "
                f"dataset {mib(dataset_bytes)}: the kernel keeps nothing between opens")
    if regime == "page-cache":
        return (f"regime: page cache unbounded, dataset {mib(dataset_bytes)}: NOT the regime users have "
                "(repeat reads may be served by the kernel)")
    raise ValueError(f"unknown regime {regime!r}; one of {', '.join(REGIMES)}")


def popen_in(cgroup: Optional[MemoryCgroup]) -> Callable[[], None]:
    """A ``preexec_fn`` that puts the child in ``cgroup`` (None: a no-op)."""
    return cgroup.enter_self if cgroup is not None else (lambda: None)
