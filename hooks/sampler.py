"""ShadeSampler: SHADE's PADS importance sampler (Khan et al., FAST '23, §3), made deterministic and
distributed-correct, with cache awareness through the shadefs daemon.

Each epoch draws the whole epoch with replacement from weights (ln(10 + rank) of each sample's last
per-minibatch loss rank, 1.0 if never scored) plus SHADE's smoothing term, splits the one global draw
into disjoint per-rank shards, and puts the draws that are already cached first, repeated
``rep_factor`` times. docs/hooks.md has the procedure step by step and the fixes against the
reference code (github.com/R-I-S-Khan/SHADE, ``shade_utils/shadesampler.py``).

Never touches global RNG state: every random step uses a ``numpy.random.Generator`` seeded from
(seed, epoch[, rank]). Never blocks on the daemon for longer than one residency query per epoch.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Iterator, List, Optional, Union

import numpy as np
import torch.utils.data

from . import distributed as _dist
from .client import Client, DatasetPaths, dataset_root

__all__ = ["ShadeSampler", "EpochPlan", "rank_transform", "pads_sort"]


MODES = ("auto", "aggressive", "relaxed")

# Domain tags keep the global and the per-rank random streams of one (seed, epoch) independent.
_GLOBAL_STREAM = 0x5EED_0001
_RANK_STREAM = 0x5EED_0002
_TIE_STREAM = 0x5EED_0003

_rank_transform_impl = None


def rank_transform(losses) -> np.ndarray:
    """SHADE's importance of one minibatch: ascending loss rank k -> ln(10 + k), float32, shape (B,).

    Uses :func:`shadefs.policies.shade.rank_transform` (the daemon's own, so both sides agree) when it
    is installed, else the same formula here (stable sort: tied losses rank in batch order).
    Source: SHADE ``shadesampler.py`` ``set_importance_per_batch``.
    """
    global _rank_transform_impl
    if _rank_transform_impl is None:
        try:
            from shadefs.policies.shade import rank_transform as impl
        except Exception:  # the daemon package may be absent where only the hooks are used
            impl = _rank_transform_local
        _rank_transform_impl = impl
    return np.asarray(_rank_transform_impl(np.asarray(losses, dtype=np.float32)), dtype=np.float32)


def _rank_transform_local(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float32).reshape(-1)
    out = np.empty(values.size, dtype=np.float32)
    out[np.argsort(values, kind="stable")] = np.log(10.0 + np.arange(values.size))
    return out


def pads_sort(draw: np.ndarray, rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """Group a draw by sample, most-drawn first: SHADE's ``pads_sort``, deterministic.

    Ties (samples drawn equally often) are ordered by a random key from ``rng`` when given, else by index.
    The sampler passes a Generator seeded with (seed, epoch) only, so every rank gets the same order:
    index order is class order in an ImageFolder, and contiguous per-rank blocks of an index-ordered tie
    group would give each rank a few classes only.
    """
    uniq, counts = np.unique(np.asarray(draw, dtype=np.int64), return_counts=True)
    tie_key = uniq if rng is None else rng.random(uniq.size)
    order = np.lexsort((tie_key, -counts))
    return np.repeat(uniq[order], counts[order])


@dataclasses.dataclass(frozen=True, eq=False)
class EpochPlan:
    """What the sampler decided for one epoch on this rank (for the reporter, tests and debugging).

    Attributes:
        epoch: the epoch number the draw was seeded with.
        mode: "aggressive" or "relaxed".
        global_order: the global draw after the mode's ordering, shape (total_size,); identical on
            every rank.
        positions: the positions of ``global_order`` that form this rank's shard, shape (num_samples,);
            disjoint across ranks, their union is every position.
        order: the dataset indices this rank yields, in order, shape (num_samples,).
        hits: the leading entries of ``order`` that were resident when the epoch was planned.
        resident: entries of the shard that were resident, before repetition.
    """

    epoch: int
    mode: str
    global_order: np.ndarray
    positions: np.ndarray
    order: np.ndarray
    hits: int
    resident: int

    @property
    def shard(self) -> np.ndarray:
        return self.global_order[self.positions]


class ShadeSampler(torch.utils.data.Sampler):
    """SHADE's PADS sampler: per epoch, ``ceil(N / num_replicas)`` dataset indices per rank, drawn with
    replacement by importance, cached samples first and repeated.

    Args:
        dataset: the training dataset (``len(dataset)`` = N). A torchvision ImageFolder (or a Subset of
            one) on a shadefs mount enables cache awareness and score reporting; any sized dataset
            works for plain importance sampling.
        rep_factor: how many times each resident draw is repeated (SHADE ``rep``, default 3; a
            fractional part f adds the first ``floor(f * hits)`` resident draws once more). >= 1.
        seed: seeds every random step together with the epoch (and the rank for rank-local shuffles).
        num_replicas: ranks the draw is split over; default the torch.distributed world size, else 1.
        rank: this rank; default the torch.distributed rank, else 0.
        smoothing: SHADE's ``ls_init_fac``: after the first epoch the additive term
            ``ls = smoothing * mean_loss(epoch 0)``, then ``ls *= exp((L_t - L_{t-1}) / L_{t-1})``.
            Sampling weight of sample i = ``weights[i] + ls``.
        client: a :class:`~shadefs.hooks.Client`; None discovers the daemon from the dataset root (one
            warning if none: the sampler then works without cache awareness); False disables it.
        mode: "auto" (SHADE: aggressive after epoch 0 while the validation trend is > 0), or force
            "aggressive" / "relaxed".
        min_miss_fraction: the least fraction of each epoch left to draws that were not resident (as
            far as there are any), so repeated hits can never crowd out every miss and freeze the
            cache. 0.0 is the reference behaviour. See docs/hooks.md.
        announce_plan: announce each epoch's order to the daemon (:class:`~shadefs.hooks.plan.PlanAnnouncer`),
            so it prefetches ahead and evicts by the known future (Belady on the plan).

    Raises:
        ValueError: an argument out of range.

    Weights are a float64 array of length N (:attr:`weights`), 1.0 until a sample is scored. The
    epoch advances with :meth:`set_epoch`, or by one on each further ``iter()`` without it.
    """

    def __init__(
        self,
        dataset,
        rep_factor: float = 3.0,
        seed: int = 0,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        smoothing: float = 1e-2,
        client: Union[Client, None, bool] = None,
        mode: str = "auto",
        min_miss_fraction: float = 0.1,
        announce_plan: bool = True,
    ):
        n = len(dataset)
        if n <= 0:
            raise ValueError("ShadeSampler: empty dataset")
        if not rep_factor >= 1.0:
            raise ValueError(f"rep_factor must be >= 1, got {rep_factor}")
        if int(seed) < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        if not smoothing >= 0.0:
            raise ValueError(f"smoothing must be >= 0, got {smoothing}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not 0.0 <= min_miss_fraction <= 1.0:
            raise ValueError(f"min_miss_fraction must be in [0, 1], got {min_miss_fraction}")
        up, world, dist_rank = _dist.dist_info()
        if num_replicas is None:
            num_replicas = world if up else 1
        if rank is None:
            rank = dist_rank if up else 0
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"invalid rank {rank} for num_replicas {num_replicas}")

        self.dataset = dataset
        self.N = n
        self.rep_factor = float(rep_factor)
        self.seed = int(seed)
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.smoothing = float(smoothing)
        self.mode = mode
        self.min_miss_fraction = float(min_miss_fraction)
        self.num_samples = math.ceil(n / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

        self.weights = np.ones(n, dtype=np.float64)
        self.ls = 0.0
        self.val_trend = 100.0
        self._accuracies: List[float] = []
        self._prev_mean_loss: Optional[float] = None
        self._loss_sum = 0.0
        self._loss_n = 0
        self._nonfinite = 0

        self.epoch = 0
        self._epoch_set = False
        self._iterated = False
        self.generation = 0
        self.plan: Optional[EpochPlan] = None
        self._resident_failures = 0

        self.client: Optional[Client] = None
        self.paths: Optional[DatasetPaths] = None
        self._attach(client)
        self.announcer = None
        if announce_plan and self.client is not None and self.paths is not None:
            from .plan import PlanAnnouncer

            self.announcer = PlanAnnouncer(dataset, self.client, stream=self.rank, owner="ShadeSampler")

    # ----------------------------------------------------------------------------------- daemon
    def _attach(self, client) -> None:
        if client is False:
            return
        if client is None:
            root = dataset_root(self.dataset)
            try:
                client = Client(root)
            except Exception as exc:  # EndpointNotFound, ImportError, a bad endpoint
                warnings.warn(
                    f"shadefs: no daemon for {root!r} ({exc}); ShadeSampler runs importance "
                    "sampling without cache awareness and reports go nowhere",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return
        self.client = client
        root = getattr(client, "mount_root", None)
        reason = None
        if root is None:
            reason = "the mount root is unknown (pass Client(mount_root=...))"
        else:
            try:
                self.paths = DatasetPaths(self.dataset, root)
            except TypeError as exc:
                reason = str(exc)
        if reason is not None:
            warnings.warn(
                f"shadefs: {reason}; ShadeSampler runs without cache awareness", RuntimeWarning, stacklevel=3
            )

    # ----------------------------------------------------------------------------- SHADE state
    def update_scores(self, indices, losses) -> None:
        """Score one minibatch: ``weights[indices] = rank_transform(losses)``; count the losses toward
        this epoch's mean loss (the smoothing term).

        Args:
            indices: dataset indices, shape (B,), int.
            losses: their per-sample losses, shape (B,). Non-finite entries are dropped (counted in
                :attr:`nonfinite`). An index twice in one batch keeps its last score.

        Raises:
            ValueError: shapes differ or an index is out of range.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        vals = np.asarray(losses, dtype=np.float32).reshape(-1)
        if idx.shape != vals.shape:
            raise ValueError(f"update_scores: {idx.size} indices vs {vals.size} losses")
        if idx.size and (idx.min() < 0 or idx.max() >= self.N):
            raise ValueError(f"update_scores: index out of range [0, {self.N})")
        ok = np.isfinite(vals)
        if not ok.all():
            self._nonfinite += int((~ok).sum())
            idx, vals = idx[ok], vals[ok]
        if idx.size == 0:
            return
        self.weights[idx] = rank_transform(vals)
        self._loss_sum += float(vals.astype(np.float64).sum())
        self._loss_n += int(vals.size)

    @property
    def nonfinite(self) -> int:
        """Non-finite losses dropped so far."""
        return self._nonfinite

    def on_epoch_end(self, mean_loss: Optional[float] = None) -> None:
        """Update SHADE's smoothing term ``ls`` from the epoch's mean loss (``on_epoch_end``, l. 202-212).

        Called for you at the next epoch's ``iter()`` with the mean of the losses reported this epoch;
        call it yourself only to use another mean. ``mean_loss=None`` uses the reported losses.
        """
        if mean_loss is None:
            if self._loss_n == 0:
                return
            mean_loss = self._loss_sum / self._loss_n
        self._loss_sum, self._loss_n = 0.0, 0
        mean_loss = float(mean_loss)
        if not math.isfinite(mean_loss):
            return
        prev = self._prev_mean_loss
        if prev is None:
            self.ls = self.smoothing * mean_loss
        elif prev > 0:
            self.ls = self.ls * math.exp((mean_loss - prev) / prev)
        self._prev_mean_loss = mean_loss

    def report_accuracy(self, accuracy: float) -> None:
        """Record one validation accuracy; sets the PADS trend (SHADE ``bench_cifar10.py`` l. 634-643).

        ``val_trend`` = mean of the last 3 epoch-to-epoch deltas (the first delta is 0); it starts at
        100, so without validation the sampler turns aggressive after epoch 0. Under torch.distributed
        rank 0's value wins (it is shared at the next epoch), so calling this on rank 0 only is enough.
        """
        self._accuracies.append(float(accuracy))
        a = self._accuracies
        deltas = [0.0] + [a[i] - a[i - 1] for i in range(1, len(a))]
        last = deltas[-3:]
        self.val_trend = float(sum(last) / len(last))

    def sampling_weights(self) -> np.ndarray:
        """``weights + ls``: the unnormalised probabilities of the next draw, shape (N,)."""
        return self.weights + self.ls

    def current_mode(self, epoch: Optional[int] = None) -> str:
        epoch = self.epoch if epoch is None else epoch
        if self.mode != "auto":
            return self.mode
        return "aggressive" if epoch > 0 and self.val_trend > 0 else "relaxed"

    # ----------------------------------------------------------------------------- Sampler API
    def set_epoch(self, epoch: int) -> None:
        """Seed the next ``iter()`` with ``epoch`` (call it on every rank, as for DistributedSampler)."""
        self.epoch = int(epoch)
        self._epoch_set = True

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        if self._iterated and not self._epoch_set:
            self.epoch += 1
        self._epoch_set = False
        self._iterated = True
        self.on_epoch_end(None)  # no-op unless losses were reported since the last epoch
        if _dist.is_distributed(self.num_replicas):
            self._sync_state_from_rank0()
        self.plan = self.plan_epoch(self.epoch)
        self.generation += 1
        if self.announcer is not None:  # the PADS draw, repeats included (issue 11); sent in the background
            self.announcer.announce(self.epoch, [self.plan.order])
        return iter(self.plan.order.tolist())

    @property
    def yielded_order(self) -> Optional[np.ndarray]:
        """The dataset indices of the current epoch, in the order ``iter()`` yields them."""
        return None if self.plan is None else self.plan.order

    # --------------------------------------------------------------------------------- planning
    def _sync_state_from_rank0(self) -> None:
        """Adopt rank 0's sampling state so every rank draws the same global list (collective)."""
        state = (self.epoch, self.weights, self.ls, self._prev_mean_loss, self.val_trend, list(self._accuracies))
        epoch, weights, ls, prev, trend, accs = _dist.broadcast_from_rank0(state)
        if self.rank != 0:
            self.epoch, self.ls, self._prev_mean_loss, self.val_trend = epoch, ls, prev, trend
            self._accuracies = list(accs)
            self.weights[:] = weights

    def global_draw(self, epoch: int) -> np.ndarray:
        """The raw with-replacement draw of ``epoch``, shape (total_size,), identical on every rank.

        Inverse-CDF sampling of ``total_size`` uniforms from a Generator seeded with (seed, epoch):
        P(i) = (w_i + ls) / sum_j (w_j + ls).
        """
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, int(epoch), _GLOBAL_STREAM])))
        cdf = np.cumsum(self.sampling_weights())
        u = rng.random(self.total_size) * cdf[-1]
        return np.minimum(np.searchsorted(cdf, u, side="right"), self.N - 1).astype(np.int64)

    def plan_epoch(self, epoch: int) -> EpochPlan:
        """Plan ``epoch`` for this rank with the current weights (pure apart from one residency query)."""
        mode = self.current_mode(epoch)
        draw = self.global_draw(epoch)
        ns, r = self.num_samples, self.rank
        if mode == "aggressive":
            # Most-drawn first, then contiguous blocks: a sample's repeats stay on one rank (one node's
            # cache), the most-drawn go to the lowest ranks. Ties in a seeded random order (the same on
            # every rank), so that a rank's block is not a run of neighbouring indices (= a few classes).
            tie_rng = np.random.Generator(
                np.random.PCG64(np.random.SeedSequence([self.seed, int(epoch), _TIE_STREAM])))
            global_order = pads_sort(draw, tie_rng)
            positions = np.arange(r * ns, (r + 1) * ns, dtype=np.int64)
        else:
            global_order = draw
            positions = np.arange(r, self.total_size, self.num_replicas, dtype=np.int64)
        shard = global_order[positions]
        rng = np.random.Generator(
            np.random.PCG64(np.random.SeedSequence([self.seed, int(epoch), _RANK_STREAM, r]))
        )
        order, hits, resident = self._hits_first(shard, rng)
        return EpochPlan(int(epoch), mode, global_order, positions, order, hits, resident)

    def _hits_first(self, shard: np.ndarray, rng: np.random.Generator):
        """SHADE's ``prepare_hits``: resident draws repeated ``rep_factor`` times and first (shuffled),
        misses after (shuffled), cut to ``num_samples`` keeping at least ``min_miss_fraction`` misses."""
        flags = self._resident(shard)
        if flags is None or not flags.any():
            return rng.permutation(shard), 0, 0
        hits, misses = shard[flags], shard[~flags]
        whole = int(math.floor(self.rep_factor))
        extra = int(math.floor((self.rep_factor - whole) * hits.size))
        repeated = rng.permutation(np.concatenate([np.tile(hits, whole), hits[:extra]]))
        misses = rng.permutation(misses)
        ns = self.num_samples
        keep_misses = min(misses.size, math.ceil(self.min_miss_fraction * ns))
        n_hits = min(repeated.size, ns - keep_misses)
        order = np.concatenate([repeated[:n_hits], misses[: ns - n_hits]])
        return order, n_hits, int(hits.size)

    def _resident(self, shard: np.ndarray) -> Optional[np.ndarray]:
        """Residency of each shard entry (one query for the distinct ones), or None if unknown."""
        if self.client is None or self.paths is None:
            return None
        uniq = np.unique(shard)
        rel = self.paths.rel_paths(uniq)
        inside = np.array([p is not None for p in rel], dtype=bool)
        try:
            flags = self.client.resident([p for p in rel if p is not None])
        except Exception as exc:  # daemon gone or slow: sample without cache awareness this epoch
            self._resident_failures += 1
            if self._resident_failures == 1:
                warnings.warn(
                    f"shadefs: residency query failed ({exc}); this epoch is planned without cache "
                    "awareness (retried next epoch, warned once)",
                    RuntimeWarning,
                    stacklevel=4,
                )
            return None
        res_u = np.zeros(uniq.size, dtype=bool)
        res_u[inside] = flags
        return res_u[np.searchsorted(uniq, shard)]

    def __repr__(self) -> str:
        return (
            f"ShadeSampler(N={self.N}, rep_factor={self.rep_factor}, seed={self.seed}, "
            f"rank={self.rank}/{self.num_replicas}, mode={self.mode!r}, epoch={self.epoch}, "
            f"cache_aware={self.paths is not None})"
        )
