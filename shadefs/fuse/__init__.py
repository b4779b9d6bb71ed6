"""shadefs' FUSE front ends, behind one interface: ``make_frontend(impl, ...) -> frontend``, ``frontend.run()``
blocks until unmounted (calling ``daemon.on_mounted()`` once the mount exists).

- ``kernel`` (:mod:`shadefs.fuse.kernel`, the default on Linux): the kernel protocol spoken on /dev/fuse
  directly; hits answered inline, misses on workers with asynchronous replies, INTERRUPT honoured,
  FUSE passthrough for NVMe hits and for files served from a directory source.
- ``libfuse`` (:mod:`shadefs.fuse.libfuse`): mfusepy over libfuse 3 (``--fuse-loop multi|single``), for
  other platforms and as a fallback; its callbacks are :class:`shadefs.fuse.libfuse_ops.ShadeOperations`.
"""
from __future__ import annotations

import sys

__all__ = ["IMPLS", "DEFAULT_IMPL", "make_frontend"]

IMPLS = ("kernel", "libfuse")
DEFAULT_IMPL = "kernel" if sys.platform.startswith("linux") else "libfuse"


def make_frontend(impl: str, namespace, cache, daemon, cfg, fsname: str):
    """Build the front end ``impl`` for one mount (``cfg``: a :class:`~shadefs.config.MountConfig`).

    Raises:
        ValueError: unknown ``impl``.
    """
    if impl == "kernel":
        from .kernel import KernelFrontend

        return KernelFrontend(namespace, cache, daemon, mountpoint=cfg.mountpoint, fsname=fsname,
                              allow_other=cfg.allow_other, kernel_cache=cfg.kernel_cache,
                              passthrough=cfg.passthrough, readers=cfg.fuse_readers,
                              source_passthrough=getattr(cfg, "source_passthrough", "untiered"))
    if impl == "libfuse":
        from .libfuse import LibfuseFrontend

        return LibfuseFrontend(namespace, cache, daemon, cfg, fsname)
    raise ValueError(f"unknown FUSE front end {impl!r}: choose one of {', '.join(IMPLS)}")
