"""The training side of the control protocol: find a mount's daemon and talk to it without blocking.

:class:`Client` wraps :class:`shadefs.control.client.ControlClient` (the ZeroMQ codec and socket) and
adds what a training job needs: endpoint and mount-root discovery from any path inside the mount, and
sends that never raise into the training loop. :class:`DatasetPaths` maps dataset indices to the
paths relative to the mount root that the protocol speaks (docs/protocol.md).

Never imports torch. The ZeroMQ socket is created lazily per process by ``ControlClient``, so a
``Client`` built before DataLoader workers fork is safe to use in any of them.
"""
from __future__ import annotations

import errno as _errno
import logging
import os
import sys
import warnings
from typing import List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["Client", "DatasetPaths", "EndpointNotFound", "XATTR_ENDPOINT", "find_mount_root", "warn_user",
           "discover", "no_daemon_reason", "socket_missing"]

log = logging.getLogger(__name__)

XATTR_ENDPOINT = "user.shadefs.endpoint"
ENV_ENDPOINT = "SHADEFS_ENDPOINT"  # its name, for messages; shadefs.config.Environment reads it


try:  # the daemon-side codec is optional at import time; see _control_module()
    from shadefs.control.client import EndpointNotFound  # type: ignore
except Exception:  # pragma: no cover - depends on what is installed beside the hooks

    class EndpointNotFound(LookupError):  # type: ignore[no-redef]
        """No shadefs endpoint: not inside a mount and ``SHADEFS_ENDPOINT`` unset."""


_HOOKS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _internal(filename: str) -> bool:
    """A frame of the hooks, of torch (the DataLoader calls ``iter(sampler)``), or of the import machinery."""
    if filename.startswith(_HOOKS_DIR) or filename.startswith("<frozen "):
        return True
    torch = sys.modules.get("torch")
    tdir = os.path.dirname(getattr(torch, "__file__", "") or "")
    return bool(tdir) and filename.startswith(tdir + os.sep)


def warn_user(message: str, category=RuntimeWarning) -> None:
    """``warnings.warn`` attributed to the user's line: the first frame outside ``shadefs.hooks`` and torch.

    A sampler's warning raised under ``for x in loader`` then names the training script's ``for`` line (what
    ``stacklevel`` is for), whichever path inside the hooks and the DataLoader led to it. Called off the
    main thread (no user frame on the stack), it names the outermost frame.
    """
    level = 2  # the caller of warn_user
    f = sys._getframe(1)
    while f.f_back is not None and _internal(f.f_code.co_filename):
        f = f.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


def no_daemon_reason(exc: BaseException) -> str:
    """Why discovery found no daemon, in plain words (``exc`` from :class:`Client`'s constructor)."""
    if isinstance(exc, ImportError):
        return f"the shadefs control client is not installed ({exc})"
    if isinstance(exc, EndpointNotFound):
        code = getattr(exc, "errno", None)
        if code in (_errno.ENODATA, _errno.ENOTSUP, _errno.EOPNOTSUPP):
            return f"it is not on a shadefs mount, and {ENV_ENDPOINT} is not set"
        if code in (_errno.ENOTCONN, _errno.ECONNABORTED):
            return "the shadefs mount there has no running daemon (its daemon stopped or crashed)"
        if code == _errno.ENOENT:
            return "the path does not exist"
        if code is not None:
            return f"its {XATTR_ENDPOINT} attribute could not be read ({os.strerror(code)})"
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def socket_missing(endpoint: str) -> Optional[str]:
    """For an ``ipc://`` endpoint whose socket file does not exist, why no daemon can answer; else None."""
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://"):]
        if not os.path.exists(path):
            return f"its control socket {path} does not exist (no daemon listens there)"
    return None


def discover(root) -> "Tuple[Optional[Client], str, str]":
    """The :class:`Client` of the daemon serving ``root`` (a path inside a mount), or why there is none.

    Returns:
        ``(client, "", "")``, or ``(None, where, why)``: ``where`` names what was asked ("for '/path'" or
        "at ipc://..."), ``why`` says in plain words why no daemon can answer (:func:`no_daemon_reason`,
        :func:`socket_missing`). Never raises.
    """
    try:
        client = Client(root)
    except Exception as exc:  # EndpointNotFound, ImportError, a bad endpoint
        return None, f"for {root!r}", no_daemon_reason(exc)
    why = socket_missing(client.endpoint)
    if why is not None:
        client.close()
        return None, f"at {client.endpoint}", why
    return client, "", ""


def _control_module():
    """Import ``shadefs.control.client`` lazily; the hooks must import even where it is missing."""
    from shadefs.control import client as control_client

    return control_client


def _read_endpoint_xattr(path: str) -> Optional[str]:
    try:
        raw = os.getxattr(path, XATTR_ENDPOINT)
    except (OSError, AttributeError):  # ENODATA / ENOTSUP / not Linux
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def find_mount_root(path_inside_mount: str) -> Optional[str]:
    """Return the root of the shadefs mount that contains ``path_inside_mount``, or None.

    Walks up the *lexical* path (``abspath``, no symlink resolution, so the result is a prefix of the
    paths an ImageFolder built from the same root stores) while the ``user.shadefs.endpoint`` extended
    attribute is present with the same value, and stops at a mount point. If no ancestor carries the
    attribute (an endpoint given by ``SHADEFS_ENDPOINT`` for a path outside any mount), returns None.
    """
    path = os.path.abspath(path_inside_mount)
    if not os.path.isdir(path):
        path = os.path.dirname(path)
    first = _read_endpoint_xattr(path)
    if first is None:
        return None
    root = path
    while True:
        if os.path.ismount(root):
            return root
        parent = os.path.dirname(root)
        if parent == root or _read_endpoint_xattr(parent) != first:
            return root
        root = parent


class DatasetPaths:
    """Dataset index -> path relative to the mount root (``/``-separated), or None outside the mount.

    Reads the paths of a torchvision ``DatasetFolder``/``ImageFolder`` (``dataset.samples``, or
    ``dataset.imgs``); a ``Subset``-like wrapper (``.dataset`` + ``.indices``) is followed. The
    relative paths are sliced on demand from the dataset's own strings, so no second copy of N paths
    is kept. Relative sample paths (``ImageFolder("m/train")``) are taken against the working directory
    at construction (or against ``cwd``), so a later ``chdir`` changes nothing.

    Args:
        dataset: the training dataset.
        mount_root: path of the mount root (made absolute against the same directory).
        cwd: the directory relative paths are taken against (default: the working directory now); a
            sampler passes the one it saw at its own construction.
        warn: how the outside-the-mount warning is given (default :func:`warn_user`; a background thread
            passes a function that queues it for the user's thread).

    Raises:
        TypeError: the dataset exposes no per-sample paths.

    Warns (RuntimeWarning, once per instance): most of a sample of up to 1000 evenly spaced indices lie
    outside the mount, so importance scores and residency are not used for them.
    """

    CHECK = 1000

    def __init__(self, dataset, mount_root: str, *, cwd: Optional[str] = None, warn=None):
        self._abs, self._subset = _sample_paths(dataset)
        self._cwd = os.path.abspath(cwd) if cwd is not None else os.getcwd()
        self.mount_root = absolute(mount_root, self._cwd)
        self._prefix = self.mount_root.rstrip("/") + "/"
        self._warn = warn if warn is not None else warn_user
        self.outside_fraction = self._check_inside()

    def _check_inside(self) -> float:
        n = len(self)
        if n == 0:
            return 0.0
        idx = np.unique(np.linspace(0, n - 1, num=min(n, self.CHECK)).astype(np.int64))
        outside = sum(self.rel_path(int(i)) is None for i in idx)
        frac = outside / idx.size
        if frac > 0.5:
            self._warn(
                f"shadefs: {outside} of {idx.size} sampled dataset paths (e.g. {self.abs_path(int(idx[0]))!r}) "
                f"lie outside the mount {self.mount_root!r}: importance scores and cache residency are not "
                "used for them")
        return frac

    def __len__(self) -> int:
        return len(self._subset) if self._subset is not None else len(self._abs)

    def abs_path(self, index: int) -> str:
        i = int(index)
        if self._subset is not None:
            i = int(self._subset[i])
        item = self._abs[i]
        path = os.fspath(item[0] if isinstance(item, (tuple, list)) else item)
        return path if path.startswith("/") else os.path.join(self._cwd, path)

    def rel_path(self, index: int) -> Optional[str]:
        p = os.path.normpath(self.abs_path(index))
        if not p.startswith(self._prefix):
            return None
        rel = p[len(self._prefix):]
        return rel or None

    def rel_paths(self, indices: Sequence[int]) -> List[Optional[str]]:
        return [self.rel_path(i) for i in np.asarray(indices, dtype=np.int64).tolist()]


def absolute(path, cwd: Optional[str] = None) -> str:
    """``os.path.abspath(path)`` taken against ``cwd`` (default: the working directory now), normalized."""
    path = os.fspath(path)
    return os.path.normpath(path if path.startswith("/") else os.path.join(cwd or os.getcwd(), path))


def _sample_paths(dataset):
    """(list of (path, ...) or paths, subset index list or None) for ``dataset``."""
    subset = None
    ds = dataset
    while not hasattr(ds, "samples") and not hasattr(ds, "imgs"):
        if hasattr(ds, "dataset") and hasattr(ds, "indices"):
            idx = np.asarray(ds.indices, dtype=np.int64)
            subset = idx if subset is None else idx[subset]
            ds = ds.dataset
        else:
            raise TypeError(
                f"{type(dataset).__name__} has no per-sample paths: shadefs hooks need a torchvision "
                "DatasetFolder/ImageFolder (dataset.samples) or a Subset of one"
            )
    samples = ds.samples if hasattr(ds, "samples") else ds.imgs
    return samples, subset


def dataset_root(dataset, cwd: Optional[str] = None) -> Optional[str]:
    """A directory of ``dataset`` that lies inside its mount: ``.root``, else the first sample's dir.

    Relative paths are taken against ``cwd`` (default: the working directory now); absolute result."""
    ds = dataset
    while hasattr(ds, "dataset") and not hasattr(ds, "samples"):
        ds = ds.dataset
    root = getattr(ds, "root", None)
    if isinstance(root, (str, os.PathLike)) and os.path.isdir(absolute(root, cwd)):
        return absolute(root, cwd)
    try:
        samples, _ = _sample_paths(dataset)
    except TypeError:
        return None
    if len(samples) == 0:
        return None
    first = samples[0][0] if isinstance(samples[0], (tuple, list)) else samples[0]
    return os.path.dirname(absolute(first, cwd))


class Client:
    """Talk to the shadefs daemon serving a mount: scores out, residency and stats in.

    Args:
        path_inside_mount: any path inside the mount (e.g. the ImageFolder root). Resolves the endpoint
            (``SHADEFS_ENDPOINT`` overrides, else the ``user.shadefs.endpoint`` xattr) and the mount root.
        endpoint: the daemon's ZeroMQ URL; skips discovery.
        mount_root: the mount root, when it cannot be discovered (an endpoint given explicitly or
            through ``SHADEFS_ENDPOINT`` for a path whose xattr is not visible).
        timeout_s: reply timeout of ``resident`` and ``stats`` queries, seconds.
        credentials: CURVE credentials of a ``tcp://`` endpoint (a dict or a JSON file, see
            :class:`shadefs.control.client.ControlClient`); default ``$SHADEFS_CREDENTIALS``, else the
            mount registry of this user (docs/operations.md, "Security").

    Raises:
        EndpointNotFound: neither ``endpoint`` nor a discoverable one.
        ImportError: ``shadefs.control.client`` is not installed.

    ``send_scores`` never blocks and never raises: a full queue or a broken socket drops the batch and
    counts it in :attr:`dropped`. ``resident`` and ``stats`` wait up to ``timeout_s`` and raise on
    failure; callers that must not fail (the sampler) catch and degrade.
    """

    RESIDENT_CHUNK = 65536

    def __init__(
        self,
        path_inside_mount: Optional[str] = None,
        endpoint: Optional[str] = None,
        *,
        mount_root: Optional[str] = None,
        timeout_s: float = 5.0,
        credentials=None,
    ):
        cc = _control_module()
        if endpoint is None:
            if path_inside_mount is None:
                from shadefs.config import Environment

                env = Environment.from_env().endpoint
                if not env:
                    raise EndpointNotFound(
                        f"no endpoint: pass endpoint=, a path inside the mount, or set {ENV_ENDPOINT}"
                    )
                endpoint = env
            else:
                endpoint = cc.find_endpoint(os.fspath(path_inside_mount))
        if mount_root is None and path_inside_mount is not None:
            from shadefs import registry

            entry = registry.lookup_path(os.fspath(path_inside_mount))  # touches nothing on the mount
            if entry is not None and entry.endpoint == endpoint:
                mount_root = entry.mountpoint
            else:
                mount_root = find_mount_root(os.fspath(path_inside_mount))
        self.endpoint: str = endpoint
        self.mount_root: Optional[str] = (
            os.path.normpath(os.path.abspath(mount_root)) if mount_root is not None else None
        )
        self.timeout_s = float(timeout_s)
        self.credentials = credentials
        self._cc = cc.ControlClient(endpoint, timeout_s=timeout_s, credentials=credentials)
        self._send_errors = 0

    def twin(self) -> "Client":
        """A new client of the same daemon with the same settings and a socket of its own (another thread's)."""
        return Client(endpoint=self.endpoint, mount_root=self.mount_root, timeout_s=self.timeout_s,
                      credentials=self.credentials)

    @property
    def dropped(self) -> int:
        """Score batches not delivered: queue full or send error."""
        return int(getattr(self._cc, "dropped", 0)) + self._send_errors

    def send_scores(self, paths: Sequence[str], scores) -> bool:
        """Queue one minibatch's raw per-sample losses for the daemon; never blocks, never raises.

        Args:
            paths: n paths relative to the mount root.
            scores: n losses (any array-like; sent as float32).

        Returns:
            True if queued, False if dropped.
        """
        values = np.ascontiguousarray(np.asarray(scores, dtype=np.float32).reshape(-1))
        if len(paths) != values.size:
            raise ValueError(f"send_scores: {len(paths)} paths vs {values.size} scores")
        if values.size == 0:
            return True
        try:
            return bool(self._cc.send_scores(list(paths), values))
        except Exception as exc:  # a broken socket must not stop training
            self._send_errors += 1
            if self._send_errors == 1:
                log.warning("shadefs: dropping scores for %s: %s", self.endpoint, exc)
            return False

    def resident(self, paths: Sequence[str]) -> np.ndarray:
        """Which of ``paths`` (relative to the mount root) are in a cache tier: bool array of len(paths).

        Asks in requests of at most :attr:`RESIDENT_CHUNK` paths (the protocol caps a message's size).
        Raises what the control client raises: TimeoutError, ControlError (e.g. an unknown path).
        """
        paths = list(paths)
        out = np.zeros(len(paths), dtype=bool)
        for start in range(0, len(paths), self.RESIDENT_CHUNK):
            chunk = paths[start : start + self.RESIDENT_CHUNK]
            flags = np.asarray(self._cc.resident(chunk), dtype=bool)
            if flags.shape != (len(chunk),):
                raise ValueError(f"resident: {flags.shape} flags for {len(chunk)} paths")
            out[start : start + len(chunk)] = flags
        return out

    def stats(self) -> dict:
        """The daemon's stats object (same as ``shadefs stats --json``)."""
        return self._cc.stats()

    REGISTER_CHUNK = 262144

    def register_paths(self, paths: Sequence[str]) -> bytes:
        """Upload a path table (mount-relative paths, in table order) in chunks; returns its 8-byte handle.

        Raises what the control client raises (TimeoutError, ControlError such as ``unknown_path``).
        """
        paths = list(paths)
        handle = b""
        size = 0
        for start in range(0, max(1, len(paths)), self.REGISTER_CHUNK):
            handle, size = self._cc.register(paths[start:start + self.REGISTER_CHUNK], handle)
        if size != len(paths):
            raise ValueError(f"register: the daemon holds {size} paths of {len(paths)}")
        return handle

    def send_plan(self, handle: bytes, stream: int, first_epoch: int, segments, ids, window: int = 0,
                  job: Optional[Tuple[int, int]] = None) -> bool:
        """Queue a ``plan`` message; never blocks. Returns False when dropped (queue full, socket error).
        ``job``: the announcing process's ``(pid, start time)`` (docs/protocol.md, plan format 2)."""
        try:
            return bool(self._cc.send_plan(handle, stream, first_epoch, segments, ids, window=window, job=job))
        except Exception as exc:
            self._send_errors += 1
            if self._send_errors == 1:
                log.warning("shadefs: dropping a plan for %s: %s", self.endpoint, exc)
            return False

    def withdraw_plan(self, handle: bytes, stream: int) -> bool:
        """Queue a ``withdraw`` (the stream's plan is over); never blocks, never raises. False when dropped."""
        try:
            return bool(self._cc.withdraw_plan(handle, stream))
        except Exception as exc:
            self._send_errors += 1
            log.warning("shadefs: could not withdraw a plan at %s: %s", self.endpoint, exc)
            return False

    def close(self) -> None:
        self._cc.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client(endpoint={self.endpoint!r}, mount_root={self.mount_root!r})"
