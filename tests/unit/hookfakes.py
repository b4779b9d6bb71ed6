"""What the hook unit tests share: an ImageFolder stand-in, and a REAL daemon to talk to.

:class:`FakeDataset` is just what the hooks read from a torchvision ImageFolder (``samples``, ``len``).
:class:`LiveDaemon` is the real thing the hooks talk to, without a FUSE mount: a real
:class:`shadefs.daemon.Daemon` (posix backend scan, Namespace, tiered cache, importance, score transform)
over a real directory holding the dataset's files, behind a real :class:`ControlServer` on a private
ipc socket. Tests use the real :class:`shadefs.hooks.Client` against it.
"""
import os
import shutil
import tempfile

import numpy as np

MOUNT = "/mnt/fake-shadefs"


class FakeDataset:
    """Just what the hooks read from an ImageFolder: ``samples`` (absolute path, class) and ``len``."""

    def __init__(self, n, root=MOUNT + "/train"):
        self.root = root
        self.samples = [(f"{root}/c{i % 3}/img{i:05d}.png", i % 3) for i in range(n)]

    def __len__(self):
        return len(self.samples)


class LiveDaemon:
    """A real daemon for ``FakeDataset(n, root=ROOT/train)``: its files are written under ``root`` (100
    bytes each), ``root`` is the daemon's source and the client's mount root.

    ``score_transform``: the daemon's ``--score-transform`` ("raw" keeps the sent losses as importance,
    so a test can read back exactly what arrived). ``resident``: dataset indices fetched into the RAM
    tier at start (through the cache's own prefetch). Use as a context manager, or call close()."""

    def __init__(self, root, n, score_transform="raw", resident=()):
        from shadefs.config import MountConfig, Size
        from shadefs.control.server import ControlServer
        from shadefs.daemon import Daemon

        self.root = str(root)
        self.dataset = FakeDataset(n, root=os.path.join(self.root, "train"))
        for i, (path, _) in enumerate(self.dataset.samples):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(i.to_bytes(4, "little") * 25)
        cfg = MountConfig(source=self.root, mountpoint=self.root, ram_cache=Size(fraction=1.0), policy="lru",
                          score_transform=score_transform)
        self.daemon = Daemon(cfg)
        self.daemon.build()
        self._sockdir = tempfile.mkdtemp(prefix="sfh")  # ipc paths must stay under 108 bytes
        self.server = ControlServer(f"ipc://{self._sockdir}/c.sock", self.daemon, mountpoint=self.root)
        self.server.start()
        self.endpoint = self.server.endpoint
        for i in resident:
            assert self.daemon.cache.prefetch(self.fid(i)) == "ram"

    def rel(self, index):
        return os.path.relpath(self.dataset.samples[index][0], self.root)

    def fid(self, index) -> int:
        """The daemon's file id of dataset index ``index`` (ids are by sorted path, not by index)."""
        fid = self.daemon.namespace.file_id(self.rel(index))
        assert fid is not None, self.rel(index)
        return fid

    def importance(self, indices) -> np.ndarray:
        """The daemon's importance of these dataset indices, shape (len(indices),)."""
        return self.daemon.importance.values[[self.fid(i) for i in indices]].astype(np.float64)

    def client(self, **kw):
        from shadefs.hooks import Client

        return Client(endpoint=self.endpoint, mount_root=self.root, **kw)

    def close(self):
        self.server.stop()
        shutil.rmtree(self._sockdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
