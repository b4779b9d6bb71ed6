"""What ``shadefs mount`` checks before it forks the daemon (:func:`preflight`, :func:`check_machine`,
:func:`check_trace_overwrite`): the mountpoint, the source, /dev/fuse and fusermount, the cache directory
and its free space. Each failure is one UserError naming what to fix."""
from __future__ import annotations

import os
import sys
import time
from typing import Optional

from ..cmdutil import UserError, is_mounted
from ..cmdutil import is_stale as _is_stale
from ..config import MountConfig, format_bytes
from .fusermount import _forget_dead, _fusermount, _registry, _unmount


def _inside(path: str, mountpoint: str) -> bool:
    """Whether ``path`` lies inside (or is) ``mountpoint``; resolves symlinks of existing parents only."""
    mp = os.path.realpath(mountpoint)
    p = os.path.realpath(path)
    return p == mp or p.startswith(mp.rstrip("/") + "/")


def _existing_ancestor(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def _check_writable_dir(path: str, what: str) -> None:
    """``path`` is a writable directory, or can be created as one; creates nothing (raises UserError)."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise UserError(f"{what} {path!r} is not writable (Not a directory)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UserError(f"{what} {path!r} is not writable (Permission denied)")
        return
    anc = _existing_ancestor(path)
    if not os.path.isdir(anc):
        raise UserError(f"{what} {path!r} is not writable (Not a directory: {anc!r})")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise UserError(f"{what} {path!r} is not writable (Permission denied on {anc!r})")


def _check_writable_file(path: str, option: str) -> None:
    """``path`` can be opened for appending; creates nothing (raises UserError)."""
    if os.path.isdir(path):
        raise UserError(f"{option} {path!r}: Is a directory")
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise UserError(f"{option} {path!r}: Permission denied")
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UserError(f"{option} {path!r}: directory {parent!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path!r}: Permission denied on {parent!r}")


FUSE_DEVICE = "/dev/fuse"
FUSE_MAJOR, FUSE_MINOR = 10, 229  # Documentation/admin-guide/devices.txt: misc 229 = /dev/fuse


def check_fuse_device(path: str = FUSE_DEVICE) -> None:
    """``path`` is the FUSE character device (10, 229) and opens read-write (raises UserError)."""
    import stat as stat_mod

    try:
        st = os.stat(path)
    except OSError as e:
        raise UserError(f"{path} is missing ({e.strerror}); load the fuse module (modprobe fuse), or in a "
                        f"container pass --device /dev/fuse") from None
    if not stat_mod.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != (FUSE_MAJOR,
                                                                                          FUSE_MINOR):
        kind = (f"character device {os.major(st.st_rdev)},{os.minor(st.st_rdev)}" if stat_mod.S_ISCHR(st.st_mode)
                else "block device" if stat_mod.S_ISBLK(st.st_mode) else "directory"
                if stat_mod.S_ISDIR(st.st_mode) else "regular file" if stat_mod.S_ISREG(st.st_mode) else "not a device")
        raise UserError(f"{path} is not the FUSE device (it is a {kind}; FUSE is character device "
                        f"{FUSE_MAJOR},{FUSE_MINOR}); in a container pass --device /dev/fuse")
    try:
        fd = os.open(path, os.O_RDWR)
        os.close(fd)
    except OSError as e:
        raise UserError(f"{path} is not usable ({e.strerror}); in a container pass --device /dev/fuse "
                        f"and CAP_SYS_ADMIN") from None


def _check_cache_dir_free(cfg: MountConfig) -> None:
    """Refuse a cache directory whose namespace for this source another live daemon holds (its flock)."""
    import fcntl

    from ..cache.tiers import DiskTier

    lock = os.path.join(DiskTier.dir_for(cfg.disk_cache_dir, cfg.source), DiskTier.LOCK_FILE)
    try:
        f = open(lock, "r")
    except OSError:
        return  # no lock file: nobody holds it (and we create nothing here)
    with f:
        deadline = time.monotonic() + 5.0  # a daemon just unmounted may still be writing its checkpoint
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(f, fcntl.LOCK_UN)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    owner = f.read().strip() or "another process"
                    raise UserError(f"cache directory {cfg.disk_cache_dir!r} is in use for this source by "
                                    f"{owner}; give each mount of the same source its own --disk-cache") from None
                time.sleep(0.05)


def _source_dir(source: str) -> Optional[str]:
    """The local directory of a path or ``file://`` source; None for an object store."""
    if "://" not in source:
        return source
    return source[len("file://"):] if source.startswith("file://") else None


def _check_outside_source(cfg: MountConfig) -> None:
    """Refuse what shadefs writes, and the mountpoint, inside a local source (and the source inside the
    cache directory): the scan at the next mount would serve the cache's own files (``index.bin``,
    ``lock``, entries), the trace or the log as part of the dataset, and a mountpoint inside the source
    shows the mount in its own source. Real paths are compared (raises UserError)."""
    src = _source_dir(cfg.source)
    if src is None:
        return
    if _inside(cfg.mountpoint, src):
        raise UserError("the mountpoint must not be inside the source")
    for path, what in ((cfg.disk_cache_dir, "the cache directory"), (cfg.trace, "the --trace file"),
                       (cfg.log_file, "the --log-file")):
        if path and _inside(path, src):
            raise UserError(f"{what} must not be inside the source")
    if cfg.disk_cache_dir and _inside(src, cfg.disk_cache_dir):
        raise UserError("the source must not be inside the cache directory")


def preflight(cfg: MountConfig) -> None:
    """Check everything a mount needs before forking (raises UserError).

    Nothing is created or changed before every check passed: the only side effect, once they have, is
    clearing a dead shadefs mount at the mountpoint (a stale FUSE entry whose daemon died).
    """
    mp = cfg.mountpoint
    for path, what in ((cfg.disk_cache_dir, "the cache directory"), (cfg.trace, "the --trace file"),
                       (cfg.log_file, "the --log-file")):
        if path and _inside(path, mp):
            raise UserError(f"{what} must not be inside the mountpoint")
    _check_outside_source(cfg)
    if cfg.disk_cache_dir:
        parent = os.path.dirname(cfg.disk_cache_dir.rstrip("/")) or "/"
        if os.path.lexists(parent) and not os.path.isdir(parent):
            raise UserError(f"--disk-cache {cfg.disk_cache_dir!r}: not writable: {parent!r} is not a directory")
        if not os.path.isdir(parent):  # a typo must not become a tree of new folders (and a full disk)
            raise UserError(f"--disk-cache {cfg.disk_cache_dir!r}: its parent directory {parent!r} does not "
                            f"exist; create it first (shadefs creates only the last folder)")
        _check_writable_dir(cfg.disk_cache_dir, "cache directory")
        _check_cache_dir_free(cfg)
    for path, option in ((cfg.trace, "--trace"), (cfg.log_file, "--log-file")):
        if path:
            _check_writable_file(path, option)
            if os.path.islink(path):  # a link planted at the name must not redirect what a root daemon writes
                raise UserError(f"{option} {path!r} is a symlink; give the file it names")
    check_fuse_device()
    if _fusermount() is None:
        raise UserError("fusermount is missing; install it with: apt-get install fuse3")
    stale = _is_stale(mp)
    if stale and not _registry().is_shadefs(_registry().mount_entry(mp)):
        raise UserError(f"mountpoint {mp!r} is a dead mount that shadefs did not make; unmount it first")
    if not stale:
        if not os.path.isdir(mp):
            raise UserError(f"mountpoint {mp!r} is not a directory" if os.path.exists(mp)
                            else f"mountpoint {mp!r} does not exist")
        if os.path.ismount(mp) or is_mounted(mp):
            raise UserError(f"mountpoint {mp!r} is already mounted")
        if os.listdir(mp):
            raise UserError(f"mountpoint {mp!r} is not empty")
    else:
        _unmount(mp, lazy=True)
        print(f"shadefs: cleared a stale mount at {mp} (its daemon had died)", file=sys.stderr)
        _forget_dead(mp)
        if os.path.isdir(mp) and os.listdir(mp):
            raise UserError(f"mountpoint {mp!r} is not empty")


def check_trace_overwrite(cfg: MountConfig, overwrite: bool) -> None:
    """Refuse a ``--trace`` file that exists and holds something, unless ``overwrite`` (raises UserError):
    the daemon truncates it, and a trace is the record of a past run."""
    if cfg.trace and not overwrite:
        try:
            size = os.stat(cfg.trace).st_size
        except OSError:
            return  # absent (or not stat-able: the writability check names it)
        if size:
            raise UserError(f"--trace {cfg.trace!r} exists ({format_bytes(size)}); pass --trace-overwrite to "
                            "replace it, or choose another file")


def check_machine(cfg: MountConfig) -> None:
    """What the machine cannot give the mount, refused before the fork (raises UserError): a RAM tier
    larger than the memory this process may use, a cache directory on a pseudo filesystem."""
    from ..sysinfo import memory_limit, pseudo_fs

    if cfg.ram_cache.nbytes:
        limit, what = memory_limit()
        if limit and cfg.ram_cache.nbytes > limit:
            raise UserError(f"--ram-cache {format_bytes(cfg.ram_cache.nbytes)} is more than {what} "
                            f"({format_bytes(limit)})")
    if cfg.disk_cache_dir:
        kind = pseudo_fs(cfg.disk_cache_dir)
        if kind:
            raise UserError(f"cache directory {cfg.disk_cache_dir!r} is on {kind}, a pseudo filesystem that "
                            "cannot hold a cache; choose a directory on a disk (NVMe) filesystem")
