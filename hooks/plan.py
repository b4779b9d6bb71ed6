"""PlanSampler: announce each epoch's sample order to the shadefs daemon, so it prefetches ahead of the
reader and evicts by the known future (clairvoyant caching; docs/hooks.md).

The one changed line of a training script::

    sampler = PlanSampler(dataset, seed=0)                           # instead of shuffle=True
    sampler = PlanSampler(dataset, sampler=DistributedSampler(dataset))   # or wrap any sampler

It yields exactly what it wraps (default: a seeded uniform permutation per epoch, as ``RandomSampler``
with a seeded ``torch.Generator``). At ``__iter__`` -- in the DataLoader's main process, whatever the
number of workers or the start method -- it hands the epoch's order, and ``lookahead_epochs`` more where
they are computable (the default permutation, or a wrapped sampler with ``set_epoch`` such as
``DistributedSampler``), to a background thread that sends them (docs/protocol.md ``register`` /
``plan``); ``__iter__`` itself only computes the order it yields anyway. Without a daemon it warns once
and is a plain sampler.

:class:`PlanAnnouncer` is the sending half, shared with :class:`~shadefs.hooks.ShadeSampler` (which
announces its PADS draw, repeats included).
"""
from __future__ import annotations

import atexit
import logging
import os
import queue
import sys
import threading
import weakref
from typing import Iterator, List, Optional, Sequence, Union

import numpy as np
import torch.utils.data

from . import distributed as _dist
from .client import Client, DatasetPaths, dataset_root, discover, warn_user

__all__ = ["PlanSampler", "PlanAnnouncer"]

log = logging.getLogger(__name__)

_PLAN_STREAM = 0x5EED_0003
_WITHDRAW = "withdraw"  # a queue item's orders: end the stream's plan (docs/protocol.md ``withdraw``)

_LIVE: "weakref.WeakSet" = weakref.WeakSet()  # announcers that sent a plan: withdrawn at a clean exit


def _withdraw_dropped(state: dict) -> None:
    """An announcer was collected with plans still on the daemon (its ``__dict__``: the announcer is gone).
    Its thread had gone idle (a live thread holds the announcer), so its socket is free to send on."""
    if sys.is_finalizing() or state.get("_pid") != os.getpid():
        return
    sender, handle, planned = state.get("_sender"), state.get("_handle"), state.get("_planned")
    if not planned or sender is None or handle is None:
        return
    try:
        for stream in sorted(planned):
            sender.withdraw_plan(handle, stream)
        planned.clear()
        sender.close()
    except Exception:  # pragma: no cover - never raise from a finalizer
        pass


def this_job() -> Optional[tuple]:
    """``(pid, start time)`` of this process (``/proc/self/stat`` field 22, clock ticks after boot), the job
    its plans belong to: the daemon follows with them only the opens of this process and its descendants
    (DataLoader workers). None where there is no ``/proc``: the plan then follows every open."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        return os.getpid(), int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@atexit.register
def _withdraw_at_exit() -> None:
    """A job that exits without close() still ends its plans (a crash leaves them to the daemon's expiry)."""
    for announcer in list(_LIVE):
        try:
            announcer.close(timeout=2.0, warn=False)  # no one is left to read a warning
        except Exception:  # pragma: no cover - never fail the interpreter's exit
            pass


class PlanAnnouncer:
    """Send a sampler's epoch orders (dataset indices) to the daemon, from a background thread.

    Args:
        dataset: the dataset the orders index (an ImageFolder on a shadefs mount, or a Subset of one).
        client: a :class:`~shadefs.hooks.Client`; None discovers the daemon from the dataset root (one
            warning if there is none: announcing is then off); False turns announcing off.
        stream: the stream id the daemon keys the plan by (default: the torch.distributed rank, else 0).
        owner: names the sampler in the warning.

    The first announcement registers the dataset's path table (once per announcer); then each
    announcement is one ``plan`` message of 4 bytes per sample. Indices outside the mount are left out.
    Announcements queue (the newest wins when the thread falls behind); :meth:`flush` waits for them.
    :meth:`close` -- called for you at a clean interpreter exit, and a withdraw is also sent when the
    announcer is garbage-collected -- withdraws the plans it announced, so the daemon drops them at once
    instead of following the last (lookahead) epoch until it expires them.
    Picklable (the thread and sockets are not carried; a copy announces on its own once used).
    """

    def __init__(self, dataset, client: Union[Client, None, bool] = None, *, stream: Optional[int] = None,
                 owner: str = "PlanSampler"):
        self.dataset = dataset
        self.owner = owner
        self._stream = stream
        self.enabled = client is not False
        self._client = client if isinstance(client, Client) else None
        self._discovered = client is not None
        # a relative dataset root is taken against the working directory now, in the user's thread: the
        # discovery and the path table (first announcement, background thread) use this one, so a chdir
        # between construction and the first epoch changes nothing
        self._cwd = os.getcwd()
        self._init_runtime()
        self.sent = 0
        self.failed = 0
        self.withdrawn = 0

    #: seconds the background thread waits for an announcement before it ends (the next one starts another)
    IDLE_S = 60.0

    def _init_runtime(self) -> None:
        self._queue: "queue.Queue" = queue.Queue(maxsize=4)
        self._thread: Optional[threading.Thread] = None
        self._handle: Optional[bytes] = None
        self._table_index: Optional[np.ndarray] = None  # dataset index -> table index (-1: not on the mount)
        self._sender = None
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._notices: List[str] = []
        self._planned: set = set()             # streams with a plan on the daemon (sent, not withdrawn)
        self.unanswered_warned = False         # the no-answer warning was given (once; the owner may say it)
        # dropped without close() (e.g. a training function's local sampler): withdraw on collection; at
        # exit, _withdraw_at_exit closes the ones still alive
        old = self.__dict__.get("_finalizer")
        if old is not None:
            old.detach()
        self._finalizer = weakref.finalize(self, _withdraw_dropped, self.__dict__)
        self._finalizer.atexit = False

    def __getstate__(self):
        state = dict(self.__dict__)
        for k in ("_queue", "_thread", "_handle", "_table_index", "_sender", "_lock", "_pid", "_notices",
                  "_planned", "unanswered_warned", "_finalizer"):
            state.pop(k, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.setdefault("_cwd", os.getcwd())
        self._init_runtime()

    # -- discovery ----------------------------------------------------------------------------------
    def _ensure_client(self) -> Optional[Client]:
        if not self.enabled:
            return None
        if self._client is None and not self._discovered:
            self._discovered = True
            root = dataset_root(self.dataset, self._cwd)
            client, where, why = discover(root)
            if client is None:
                self._no_daemon(where, why)
                return None
            self._client = client
        if self._client is None or self._client.mount_root is None:
            if self._client is not None:
                warn_user(f"shadefs: the mount root of {self._client.endpoint} is unknown (pass "
                          f"Client(mount_root=...)); {self.owner} announces no plan, so training continues "
                          "without prefetch")
            self.enabled = False
            return None
        return self._client

    def _no_daemon(self, where: str, why: str) -> None:
        """The one no-daemon warning (docs/hooks.md): announcing is off for good."""
        self.enabled = False
        warn_user(f"shadefs: no daemon answered {where}: {why}. {self.owner} yields its order as usual, but "
                  "the plan is not announced, so training continues without prefetch (mount the dataset "
                  "with 'shadefs mount' and check that its daemon runs, or pass client=False to turn this "
                  "warning off)")

    def _notify(self, message: str) -> None:
        """Queue a warning found on the background thread; the next announce/flush/close on the caller's
        thread gives it (so it names the user's line, not the thread)."""
        self._notices.append(message)

    def _give_notices(self) -> None:
        while self._notices:
            warn_user(self._notices.pop(0))

    @property
    def stream(self) -> int:
        if self._stream is None:
            _, _, rank = _dist.dist_info()
            return int(rank)
        return int(self._stream)

    # -- announcing ------------------------------------------------------------------------------------
    def announce(self, epoch: int, orders) -> None:
        """Queue epochs ``epoch, epoch + 1, ...`` (one int array of dataset indices each); never blocks.

        ``orders`` may also be a callable ``f(client) -> orders or None``, run on the background thread
        with the thread's own :class:`Client` (ShadeSampler's provisional draw: computed off the training
        loop); None sends nothing.
        """
        self._give_notices()
        if not self.enabled or orders is None or (not callable(orders) and not orders):
            return
        if self._ensure_client() is None:
            return
        if self._pid != os.getpid():  # a forked copy: its own thread and socket
            self._init_runtime()
        stream = self.stream
        if not callable(orders):
            orders = [np.asarray(o, dtype=np.int64) for o in orders]
        self._put((int(epoch), orders, stream))

    def _put(self, item) -> None:
        while True:
            try:
                self._queue.put_nowait(item)
                break
            except queue.Full:
                try:
                    self._queue.get_nowait()  # drop the oldest: the newest order is what matters
                    self._queue.task_done()
                except queue.Empty:
                    pass
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="shadefs-plan", daemon=True)
                self._thread.start()
            _LIVE.add(self)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued announcement was sent (or failed); returns whether it finished in time."""
        ok = self._flush(timeout)
        self._give_notices()
        return ok

    def _flush(self, timeout: float) -> bool:
        if self._thread is None:
            return True
        done = threading.Event()

        def waiter():
            self._queue.join()
            done.set()

        threading.Thread(target=waiter, daemon=True).start()
        return done.wait(timeout)

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self.IDLE_S)
            except queue.Empty:
                return  # idle: the next announce starts a fresh thread
            try:
                if item[1] is _WITHDRAW:
                    self._withdraw(item[2])
                elif self._send(*item):
                    self.sent += 1
                    self._planned.add(item[2])
            except TimeoutError:  # the endpoint exists, nobody answers the path table's registration
                self.failed += 1
                if not self.unanswered_warned:
                    self.unanswered_warned = True
                    self._notify(f"shadefs: no daemon answered at {self._client.endpoint} within "
                                 f"{self._sender.timeout_s:g} s: {self.owner}'s plan is not announced "
                                 "(tried again each epoch), so training continues without prefetch")
            except Exception as exc:  # never into the training loop
                self.failed += 1
                if self.failed == 1:
                    log.warning("shadefs: %s could not announce a plan: %s", self.owner, exc)
            finally:
                self._queue.task_done()

    def _send(self, epoch: int, orders, stream: int) -> bool:
        if self._sender is None:
            self._sender = self._client.twin()  # this thread's own socket
        if self._handle is None:
            self._register()
        if self._handle is None:
            return False
        if callable(orders):
            orders = orders(self._sender)
            if not orders:
                return False
            orders = [np.asarray(o, dtype=np.int64) for o in orders]
        tindex = self._table_index
        ids, segments = [], []
        for o in orders:
            t = tindex[o]
            t = t[t >= 0]
            ids.append(t)
            segments.append(t.size)
        return self._sender.send_plan(self._handle, stream, epoch, segments,
                                      np.concatenate(ids).astype(np.uint32) if ids else np.zeros(0, np.uint32),
                                      job=this_job())

    def _withdraw(self, stream: int) -> None:
        # on the socket that sent the plans: the daemon reads the withdraw after them
        if self._sender is not None and self._handle is not None and self._sender.withdraw_plan(self._handle, stream):
            self.withdrawn += 1
        self._planned.discard(stream)

    def _register(self) -> None:
        paths = DatasetPaths(self.dataset, self._client.mount_root, cwd=self._cwd, warn=self._notify)
        prefix = paths.mount_root.rstrip("/") + "/"
        n = len(paths)
        tindex = np.full(n, -1, dtype=np.int64)
        table: List[str] = []
        for i in range(n):
            p = os.path.normpath(paths.abs_path(i))  # absolute: against the cwd at construction
            if p.startswith(prefix) and len(p) > len(prefix):
                tindex[i] = len(table)
                table.append(p[len(prefix):])
        if not table:
            self._notify(f"shadefs: no sample of the dataset lies in the mount {paths.mount_root}: {self.owner} "
                         "announces no plan, so training continues without prefetch")
            self.enabled = False
            return
        self._handle = self._sender.register_paths(table)
        self._table_index = tindex

    def close(self, timeout: float = 5.0, *, warn: bool = True) -> None:
        """End this announcer's plans on the daemon (``withdraw``) and close its socket.

        Waits up to ``timeout`` seconds for queued announcements, then for the withdraw; the daemon drops
        the plans at once, and what it had prefetched for them and not yet handed to an open counts as
        ``prefetch.wasted_bytes``. Called for you at a clean interpreter exit; a job that crashes leaves its
        plans to the daemon's expiry (300 s without a match). Idempotent; a later :meth:`announce` announces
        again. A forked copy in another process does nothing. ``warn``: give the warnings the background
        thread found (False at exit: nobody is left to read them).
        """
        if self._pid != os.getpid():
            return
        _LIVE.discard(self)
        idle = self._flush(timeout)
        if self._planned:
            for stream in sorted(self._planned):
                self._put((None, _WITHDRAW, stream))
            _LIVE.discard(self)
            idle = self._flush(timeout)
        if warn:
            self._give_notices()
        else:
            self._notices.clear()
        if idle and self._sender is not None:  # (a thread still sending keeps its socket: one thread each)
            self._sender.close()
            self._sender = None


class PlanSampler(torch.utils.data.Sampler):
    """A sampler that announces its order (module docstring).

    Args:
        dataset: the training dataset (``len(dataset)`` = N).
        sampler: the sampler to wrap (any iterable of indices with a length); None: a seeded uniform
            permutation of range(N) per epoch, as ``RandomSampler(dataset, generator=g)`` with ``g`` seeded
            from (seed, epoch).
        seed: seeds the default permutation (ignored with ``sampler``).
        lookahead_epochs: further epochs announced with each epoch where their order is computable now:
            the default permutation, or a wrapped sampler with ``set_epoch`` (``DistributedSampler``), whose
            epoch is set, iterated and set back. A wrapped sampler without ``set_epoch`` is never iterated
            ahead (that would change what it yields).
        client: as :class:`PlanAnnouncer`.
        epochs: the number of epochs the job runs (epochs 0 .. epochs - 1), or None (unknown): no epoch
            from ``epochs`` on is announced, so the daemon reads nothing ahead for an epoch that never
            runs. ``set_epoch(epoch, last=True)`` says the same for a job that learns it late.

    The epoch advances with :meth:`set_epoch` (forwarded to the wrapped sampler), or by one on each further
    ``iter()`` without it.

    Raises:
        ValueError: ``lookahead_epochs`` or ``seed`` below 0, ``epochs`` below 1.
    """

    def __init__(self, dataset, sampler=None, *, seed: int = 0, lookahead_epochs: int = 1,
                 client: Union[Client, None, bool] = None, epochs: Optional[int] = None):
        if int(lookahead_epochs) < 0:
            raise ValueError(f"lookahead_epochs must be >= 0, got {lookahead_epochs}")
        if epochs is not None and int(epochs) < 1:
            raise ValueError(f"epochs must be >= 1 (or None), got {epochs}")
        self.epochs = None if epochs is None else int(epochs)
        if int(seed) < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.dataset = dataset
        self.sampler = sampler
        self.seed = int(seed)
        self.lookahead_epochs = int(lookahead_epochs)
        self.epoch = 0
        self._epoch_set = False
        self._iterated = False
        self.announcer = PlanAnnouncer(dataset, client, owner="PlanSampler")  # stream = the DDP rank

    def __len__(self) -> int:
        return len(self.sampler) if self.sampler is not None else len(self.dataset)

    def set_epoch(self, epoch: int, last: bool = False) -> None:
        """The next ``iter()`` yields ``epoch``; ``last``: it is the job's last epoch (nothing after it is
        announced, as with ``epochs=epoch + 1``)."""
        self.epoch = int(epoch)
        self._epoch_set = True
        if last:
            self.epochs = self.epoch + 1
        if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)

    def _lookahead(self) -> int:
        """Epochs announced after the current one: ``lookahead_epochs``, none beyond the last."""
        if self.epochs is None:
            return self.lookahead_epochs
        return max(0, min(self.lookahead_epochs, self.epochs - 1 - self.epoch))

    def order(self, epoch: int) -> np.ndarray:
        """The default permutation of ``epoch`` (int64, shape (N,)): ``torch.randperm`` with a generator
        seeded from (seed, epoch)."""
        seed = int(np.random.SeedSequence([self.seed, int(epoch), _PLAN_STREAM]).generate_state(1, np.uint64)[0])
        g = torch.Generator()
        g.manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)
        return torch.randperm(len(self.dataset), generator=g).numpy().astype(np.int64)

    def _wrapped_order(self, epoch: int) -> Optional[np.ndarray]:
        s = self.sampler
        if epoch == self.epoch:
            return np.fromiter(iter(s), dtype=np.int64)
        if not hasattr(s, "set_epoch"):
            return None
        s.set_epoch(epoch)
        try:
            return np.fromiter(iter(s), dtype=np.int64)
        finally:
            s.set_epoch(self.epoch)

    def __iter__(self) -> Iterator[int]:
        if self._iterated and not self._epoch_set:
            self.epoch += 1
            if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
                self.sampler.set_epoch(self.epoch)
        self._epoch_set = False
        self._iterated = True
        if self.sampler is None:
            current = self.order(self.epoch)
            ahead = [self.order(self.epoch + k) for k in range(1, self._lookahead() + 1)]
        else:
            current = self._wrapped_order(self.epoch)
            ahead = []
            for k in range(1, self._lookahead() + 1):
                o = self._wrapped_order(self.epoch + k)
                if o is None:
                    break
                ahead.append(o)
        self.announcer.announce(self.epoch, [current] + ahead)
        return iter(current.tolist())

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until the announcements so far reached the daemon's socket (tests, benchmarks)."""
        return self.announcer.flush(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Tell the daemon the job is done with its plan (:meth:`PlanAnnouncer.close`): it drops the last
        announced epochs at once instead of prefetching for and evicting by them until they expire. Called
        for you at a clean exit; ``with PlanSampler(...) as sampler:`` calls it at the block's end."""
        self.announcer.close(timeout)

    def __enter__(self) -> "PlanSampler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"PlanSampler(N={len(self.dataset)}, sampler={type(self.sampler).__name__ if self.sampler is not None else None}, "
                f"seed={self.seed}, lookahead_epochs={self.lookahead_epochs}, epochs={self.epochs}, epoch={self.epoch})")
