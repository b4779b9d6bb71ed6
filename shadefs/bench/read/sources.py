"""The FUSE sources the read benchmark mounts shadefs over, each run as its own process
(``python -m shadefs.bench.read.sources MODE ...``, started by :meth:`shadefs.bench.read.rig.Mounts`):
``_slowfs``, a passthrough whose every READ sleeps, and ``_gatedfs``, a view whose opens of ``hang/``
files block until released."""
from __future__ import annotations

import json
import os
import sys
import time

def slowfs_main(source: str, mnt: str, delay_ms: float, stats_file: str) -> int:
    """A read-only passthrough of ``source`` at ``mnt`` whose every READ sleeps ``delay_ms`` (multithreaded loop)."""
    import threading

    from mfusepy import FUSE

    delay = delay_ms / 1000.0

    class SlowPassthrough:
        use_ns = True

        def __init__(self):
            self.reads = 0
            self.opens = 0
            self.lock = threading.Lock()

        def getattr(self, path, fh=None):
            st = os.lstat(source + path)
            return {"st_mode": st.st_mode, "st_nlink": st.st_nlink, "st_size": st.st_size, "st_uid": st.st_uid,
                    "st_gid": st.st_gid, "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns,
                    "st_ctime": st.st_ctime_ns}

        def readdir(self, path, fh):
            return [".", "..", *os.listdir(source + path)]

        def open(self, path, flags):
            with self.lock:
                self.opens += 1
            return os.open(source + path, os.O_RDONLY)

        def read(self, path, size, offset, fh):
            time.sleep(delay)
            with self.lock:
                self.reads += 1
            return os.pread(fh, size, offset)

        def release(self, path, fh):
            os.close(fh)
            return 0

        def destroy(self, path):
            with open(stats_file, "w") as f:
                json.dump({"reads": self.reads, "opens": self.opens}, f)

    FUSE(SlowPassthrough(), mnt, foreground=True, ro=True, fsname="bench_read_slowfs",
         attr_timeout=3600, entry_timeout=3600, negative_timeout=3600)
    return 0


def gatedfs_main(source: str, mnt: str, gate_file: str) -> int:
    """A read-only FUSE view of ``source`` (shadefs' kernel front end over a tiny "cache") whose opens of
    files below ``hang/`` block, in the kernel, until ``gate_file`` exists: hung backend reads on demand."""
    import logging

    from shadefs.backends.posix import PosixBackend
    from shadefs.fuse.kernel import KernelFrontend
    from shadefs.namespace import Namespace
    from shadefs.testing.gated import GatedCache

    logging.basicConfig(level=logging.INFO)
    ns = Namespace(PosixBackend(source).walk())

    def wait_for_the_gate_file() -> None:
        # block without using CPU: opening a FIFO for reading waits for a writer (the release)
        while not os.path.exists(gate_file):
            os.close(os.open(gate_file + ".fifo", os.O_RDONLY))

    KernelFrontend(ns, GatedCache(ns, source, wait_for_the_gate_file), None, mountpoint=mnt,
                   fsname="bench_read_gatedfs", passthrough=False).run()
    return 0


if __name__ == "__main__":  # a FUSE source of the read benchmark, as its own process (Mounts._spawn_source)
    if sys.argv[1] == "_gatedfs":
        sys.exit(gatedfs_main(sys.argv[2], sys.argv[3], sys.argv[4]))
    if sys.argv[1] == "_slowfs":
        sys.exit(slowfs_main(sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]))
