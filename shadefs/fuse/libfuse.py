"""The libfuse front end: mfusepy's high-level API over libfuse 3 (``--fuse-impl libfuse``).

Path-based callbacks (:class:`shadefs.fuse.libfuse_ops.ShadeOperations`) on libfuse's loop:
``--fuse-loop multi`` (default; libfuse's worker pool: a hit does not wait behind a miss until the pool is
used up by blocked misses) or ``single`` (one thread: fastest hits, but every request waits behind a miss).
"""
from __future__ import annotations

import logging
import os
import sys

__all__ = ["LibfuseFrontend", "select_libfuse"]

log = logging.getLogger("shadefs.fuse")


def select_libfuse() -> None:
    """Prefer libfuse 3 when it is installed (mfusepy would load libfuse 2 first).

    libfuse 3's multithreaded loop keeps idle worker threads instead of waking new ones, which measured
    about 1.4x more RAM-hit opens per second and 30 % less daemon CPU per open (docs/performance.md).
    ``FUSE_LIBRARY_PATH`` set by the user wins. Must run before mfusepy is first imported.
    """
    if "FUSE_LIBRARY_PATH" in os.environ or "mfusepy" in sys.modules:
        return
    from ctypes.util import find_library

    lib = find_library("fuse3")
    if lib:
        os.environ["FUSE_LIBRARY_PATH"] = lib


class LibfuseFrontend:
    """mfusepy's ``FUSE(ops, mountpoint, ...)`` with shadefs' mount options (read-only, default
    permissions, 3600 s entry/attr/negative timeouts). :meth:`run` blocks until unmounted."""

    def __init__(self, namespace, cache, daemon, cfg, fsname: str):
        self.ns, self.cache, self.daemon, self.cfg, self.fsname = namespace, cache, daemon, cfg, fsname

    def run(self) -> None:
        select_libfuse()
        from mfusepy import FUSE, fuse_version_major, fuse_version_minor

        from .libfuse_ops import ShadeOperations

        cfg = self.cfg
        ops = ShadeOperations(self.ns, self.cache, daemon=self.daemon, kernel_cache=cfg.kernel_cache)
        options = dict(foreground=True, nothreads=not cfg.fuse_threads, ro=True, raw_fi=True,
                       fsname=self.fsname, subtype="shadefs", default_permissions=True,
                       attr_timeout=3600, entry_timeout=3600, negative_timeout=3600)
        if cfg.allow_other:
            options["allow_other"] = True
        log.info("libfuse %d.%d, %s loop", fuse_version_major, fuse_version_minor,
                 "multithreaded" if cfg.fuse_threads else "single-threaded")
        try:
            FUSE(ops, cfg.mountpoint, **options)
        except RuntimeError as e:
            # libfuse 3's fuse_main returns 8 whenever its loop ends with a status, and a stop by
            # SIGTERM/SIGINT/SIGHUP (libfuse's own handlers) sets the signal number as that status: a normal
            # stop, not a failure, once libfuse has unmounted
            from ..cmdutil import is_mounted

            if e.args != (8,) or is_mounted(cfg.mountpoint):
                raise
            log.info("FUSE loop ended with libfuse status 8 (a termination signal, or a loop error); unmounted")
