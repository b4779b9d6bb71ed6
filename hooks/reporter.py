"""ScoreReporter: per-sample losses of each minibatch -> the sampler's weights and the daemon's scores.

One call per training step, ``reporter.report(loss)`` with the ``reduction="none"`` loss. The batch
is mapped to dataset indices by the order the :class:`~shadefs.hooks.ShadeSampler` yielded (or by
explicit indices), which fixes the reference code's mapping of scores to the raw draw instead of the
loaded order (SHADE.md §2.5). Under torch.distributed every rank's minibatch is all-gathered, so each
rank's sampler holds the global scores and one rank per daemon sends them all.

Never blocks on the daemon (sends are queued or dropped); never imports torch itself.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional, Set, Union

import numpy as np

from . import distributed as _dist
from .client import Client, DatasetPaths, dataset_root, discover, find_mount_root, warn_user

if TYPE_CHECKING:  # pragma: no cover
    from .sampler import ShadeSampler

__all__ = ["ScoreReporter"]

log = logging.getLogger(__name__)


def _as_losses(losses) -> np.ndarray:
    """A (B,) float32 numpy copy of a tensor or array-like (detached, on the CPU)."""
    if hasattr(losses, "detach"):  # torch.Tensor, without importing torch
        losses = losses.detach().float().cpu().numpy()
    arr = np.array(losses, dtype=np.float32, copy=True)
    if arr.ndim != 1:
        raise ValueError(
            f"report() wants per-sample losses of shape (B,), got shape {arr.shape}; "
            'compute the loss with reduction="none"'
        )
    return arr


class ScoreReporter:
    """Report per-sample losses: update the sampler's importance and send scores to the daemon.

    Args:
        dataset: the training dataset (an ImageFolder on the mount, or a Subset of one, for sends).
        sampler: the :class:`~shadefs.hooks.ShadeSampler` the DataLoader draws from. Without it, pass
            ``indices`` to :meth:`report`; nothing is updated locally then, scores are only sent.
        client: the daemon client; default the sampler's, else discovered from the dataset root
            (silently absent if there is none: the sampler already warned). False: never send.
        batch_size: the DataLoader's batch size; if given, every report but an epoch's last must have
            exactly this many losses (catches a loader that is not the one driving the sampler).

    The DataLoader must use ``sampler`` with ``shuffle=False`` and no ``batch_sampler``; every batch it
    yields must be reported once, in order (``num_workers > 0`` keeps the sampler order; a dropped last
    batch is fine). If that cannot hold (gradient accumulation skipping reports, a dataset returning
    its own indices), pass ``indices=`` explicitly.
    """

    def __init__(
        self,
        dataset,
        sampler: Optional["ShadeSampler"] = None,
        client: Union[Client, None, bool] = None,
        batch_size: Optional[int] = None,
    ):
        self.dataset = dataset
        self.sampler = sampler
        self.batch_size = None if batch_size is None else int(batch_size)
        self.client: Optional[Client] = None
        self.paths: Optional[DatasetPaths] = None
        if client is not False:
            if client is None and sampler is not None:
                self.client, self.paths = sampler.client, sampler.paths
            else:
                self.client = client if client is not None else self._discover()
                if self.client is not None:
                    root = self.client.mount_root
                    if root is None:
                        root = find_mount_root(dataset_root(dataset) or ".")
                    if root is not None:
                        try:
                            self.paths = DatasetPaths(dataset, root)
                        except TypeError as exc:
                            warn_user(f"shadefs: {exc}; scores are not sent")
        self._generation = -1
        self._cursor = 0
        self._senders: Optional[Set[int]] = None
        self.batches = 0  # minibatches reported by this rank
        self.sent = 0  # minibatches queued to the daemon by this rank (global ones included)

    def _discover(self) -> Optional[Client]:
        client, where, why = discover(dataset_root(self.dataset))
        if client is None:
            log.info("shadefs: no daemon for the reporter %s: %s", where, why)
        return client

    # ---------------------------------------------------------------------------------- report
    def report(self, losses, indices=None) -> None:
        """Report one minibatch's per-sample losses (shape (B,), e.g. ``reduction="none"``).

        Args:
            losses: tensor or array of B losses; detached and copied to the CPU as float32.
            indices: the B dataset indices; default the next B of the sampler's yielded order.

        Raises:
            ValueError: wrong shape, or more losses than the sampler yielded this epoch (the loader
                is not driven by this sampler, or batches were reported twice).

        Under torch.distributed (the sampler split over the whole default group) this is a
        collective: every rank must call it once per step.
        """
        vals = _as_losses(losses)
        idx = self._next_indices(vals.size) if indices is None else self._given_indices(indices, vals.size)
        self.batches += 1
        up, world, rank = _dist.dist_info()
        if self.sampler is not None:
            distributed = _dist.is_distributed(self.sampler.num_replicas)
        else:
            distributed = up and world > 1
        if distributed:
            sends = self.client is not None and self.paths is not None
            key = _dist.node_key(self.client.endpoint if sends else None)
            gathered = _dist.all_gather((idx, vals, key))
            if self._senders is None:
                self._senders = _dist.sender_ranks([g[2] for g in gathered])
            batches = [(g[0], g[1]) for g in gathered]
            send = rank in self._senders
        else:
            batches = [(idx, vals)]
            send = True
        for b_idx, b_vals in batches:  # one minibatch at a time: the rank is within a minibatch
            if self.sampler is not None:
                self.sampler.update_scores(b_idx, b_vals)
            if send:
                self._send(b_idx, b_vals)

    def _next_indices(self, n: int) -> np.ndarray:
        s = self.sampler
        if s is None or s.plan is None:
            raise ValueError("report() without indices needs a ShadeSampler that the DataLoader iterates")
        if s.generation != self._generation:  # a new epoch was planned
            self._generation, self._cursor = s.generation, 0
        order = s.plan.order
        if self._cursor + n > order.size:
            raise ValueError(
                f"report(): {n} losses but only {order.size - self._cursor} of this epoch's "
                f"{order.size} sampler positions are unreported; is the DataLoader using this sampler?"
            )
        if self.batch_size is not None and n != self.batch_size:
            if not (n < self.batch_size and self._cursor + n == order.size):
                raise ValueError(
                    f"report(): {n} losses, but the batch size is {self.batch_size} and only an epoch's "
                    "last batch may be short"
                )
        idx = order[self._cursor : self._cursor + n].copy()
        self._cursor += n
        return idx

    def _given_indices(self, indices, n: int) -> np.ndarray:
        if hasattr(indices, "detach"):
            indices = indices.detach().cpu().numpy()
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size != n:
            raise ValueError(f"report(): {n} losses vs {idx.size} indices")
        return idx

    def _send(self, idx: np.ndarray, vals: np.ndarray) -> None:
        if self.client is None or self.paths is None:
            return
        ok = np.isfinite(vals)
        rel = self.paths.rel_paths(idx)
        keep = [i for i, p in enumerate(rel) if p is not None and ok[i]]
        if not keep:
            return
        if self.client.send_scores([rel[i] for i in keep], vals[keep]):
            self.sent += 1

    # ------------------------------------------------------------------------------- forwarding
    def report_accuracy(self, accuracy: float) -> None:
        """Forward a validation accuracy to the sampler's PADS trend (rank 0's value is used)."""
        if self.sampler is not None:
            self.sampler.report_accuracy(accuracy)

    def on_epoch_end(self, mean_loss: Optional[float] = None) -> None:
        """Optional: close the epoch's smoothing update now (done for you at the next epoch)."""
        if self.sampler is not None:
            self.sampler.on_epoch_end(mean_loss)

    @property
    def dropped(self) -> int:
        """Score batches the client could not queue."""
        return 0 if self.client is None else self.client.dropped
