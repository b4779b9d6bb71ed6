"""The FUSE front end: a thin adapter from fusepy (mfusepy) callbacks to the core.

Each operation looks the path up in the metadata snapshot, calls the cache, and maps errors to an errno
in exactly one place (:func:`errno_boundary`): a missing path is ENOENT, a backend failure EIO with the
cause logged, anything unexpected EIO with one logged traceback (never EINVAL, never a dead daemon).

Only the handlers that a read-only dataset needs are defined: fusepy registers every method it finds,
and each registered handler the kernel calls is a round trip (flush, access, ...). Writes never reach
us: the mount is ``ro`` and the kernel answers EROFS itself. This class must never import torch and
never do work that belongs to the cache.
"""
from __future__ import annotations

import errno
import functools
import itertools
import logging
import os

from mfusepy import FuseOSError, fuse_get_context

from ..backends.base import BackendError, reply_errno
from ..namespace import _DIR_MODE, Namespace

__all__ = ["ShadeOperations", "ENDPOINT_XATTR"]

log = logging.getLogger("shadefs.fuse")

ENDPOINT_XATTR = "user.shadefs.endpoint"
ENOATTR = getattr(errno, "ENOATTR", errno.ENODATA)


def errno_boundary(func):
    """Map every exception of a FUSE operation to an errno, once, here."""

    @functools.wraps(func)
    def wrapper(self, *args):
        try:
            return func(self, *args)
        except FuseOSError:
            raise
        except FileNotFoundError:
            raise FuseOSError(errno.ENOENT)
        except (BackendError, OSError) as e:
            log.error("%s %s: backend error: %s", func.__name__, args[0] if args else "", e)
            raise FuseOSError(reply_errno(e))   # ESTALE, EMFILE, ENFILE as they are; else EIO
        except Exception:
            log.exception("%s %s: unexpected error", func.__name__, args[0] if args else "")
            raise FuseOSError(errno.EIO)

    return wrapper


class ShadeOperations:
    """fusepy operations over a :class:`~shadefs.namespace.Namespace` and a cache.

    Args:
        namespace: the metadata snapshot.
        cache: the read path (:class:`~shadefs.cache.api.CacheAPI`: ``open``, ``unchecked``, ``recheck``).
        daemon: notified in :meth:`init` (starts threads after the mount) and :meth:`destroy`;
            ``daemon.endpoint`` is served as the ``user.shadefs.endpoint`` extended attribute.
        kernel_cache: let the kernel keep a file's pages between opens when the open is a hit or the file
            is in no tier (``Handle.keep_pages``).
    """

    use_ns = True  # times are integer nanoseconds

    def __init__(self, namespace: Namespace, cache, daemon=None, kernel_cache: bool = True):
        self.ns = namespace
        self.cache = cache
        self.daemon = daemon
        self.kernel_cache = kernel_cache
        self._handles = {}
        self._next_fh = itertools.count(1)

    # -- lifecycle -----------------------------------------------------------------------------------
    def init(self, path):
        if self.daemon is not None:
            self.daemon.on_mounted()

    def destroy(self, path):
        if self.daemon is not None:
            self.daemon.on_unmount()

    # -- metadata --------------------------------------------------------------------------------------
    @errno_boundary
    def getattr(self, path, fh=None):
        node = self.ns.lookup(path)
        if node is None:
            raise FuseOSError(errno.ENOENT)
        if node < self.ns.num_files and self.cache.unchecked(node):
            try:  # a reused snapshot's record: compared with the source before the kernel caches its size
                self.cache.recheck(node)
            except OSError as e:  # gone or unreachable: the open reports it
                log.info("getattr %s: %s", path, e)
        return self.ns.stat(node)

    @errno_boundary
    def readdir(self, path, fh):
        node = self.ns.lookup(path)
        if node is None:
            raise FuseOSError(errno.ENOENT)
        if not self.ns.is_dir(node):
            raise FuseOSError(errno.ENOTDIR)
        return [(".", _DIR_MODE, 0), ("..", _DIR_MODE, 0), *self.ns.entries(node)]

    @errno_boundary
    def statfs(self, path):
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": (self.ns.total_bytes + 4095) // 4096,
                "f_bfree": 0, "f_bavail": 0, "f_files": self.ns.num_files, "f_ffree": 0,
                "f_namemax": 255}

    @errno_boundary
    def getxattr(self, path, name, position=0):
        if self.ns.lookup(path) is None:
            raise FuseOSError(errno.ENOENT)
        endpoint = getattr(self.daemon, "endpoint", None)
        if name == ENDPOINT_XATTR and endpoint:
            return endpoint.encode("utf-8")
        raise FuseOSError(ENOATTR)

    @errno_boundary
    def listxattr(self, path):
        if self.ns.lookup(path) is None:
            raise FuseOSError(errno.ENOENT)
        return [ENDPOINT_XATTR] if getattr(self.daemon, "endpoint", None) else []

    # -- data ------------------------------------------------------------------------------------------
    @errno_boundary
    def open(self, path, fi):
        if fi.flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise FuseOSError(errno.EROFS)
        fid = self.ns.lookup(path)
        if fid is None:
            raise FuseOSError(errno.ENOENT)
        if self.ns.is_dir(fid):
            raise FuseOSError(errno.EISDIR)
        h = self.cache.open(fid, fuse_get_context()[2])  # the opener's pid: plans follow its job's opens only
        fh = next(self._next_fh)
        self._handles[fh] = h
        fi.fh = fh
        # A hit, or a file no tier holds, serves the same bytes the kernel may still hold (the mount is a
        # snapshot): let it keep them. A miss that fills a tier drops them (Handle.keep_pages).
        fi.keep_cache = 1 if (self.kernel_cache and h.keep_pages) else 0
        return 0

    @errno_boundary
    def read(self, path, size, offset, fi):
        h = self._handles.get(fi.fh)
        if h is None:
            raise FuseOSError(errno.EBADF)
        return h.read(offset, size)

    @errno_boundary
    def release(self, path, fi):
        h = self._handles.pop(fi.fh, None)
        if h is not None:
            h.release()
        return 0
