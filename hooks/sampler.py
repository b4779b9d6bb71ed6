"""ShadeSampler: SHADE's PADS importance sampler (Khan et al., FAST '23, §3), made deterministic and
distributed-correct, with cache awareness through the shadefs daemon.

Each epoch draws the whole epoch with replacement from weights (ln(10 + rank) of each sample's last
per-minibatch loss rank, 1.0 if never scored) plus SHADE's smoothing term, splits the one global draw
into disjoint per-rank shards, and puts the draws that are already cached first, repeated
``rep_factor`` times. docs/hooks.md has the procedure step by step and the fixes against the
reference code (github.com/R-I-S-Khan/SHADE, ``shade_utils/shadesampler.py``).

Never touches global RNG state: every random step is keyed by (seed, epoch[, rank]) -- counter-based
hashes per sample with the default ``draw="stable"`` (:func:`race_draw`, :func:`keyed_shuffle`), a
``numpy.random.Generator`` with ``draw="cdf"``. Never blocks on the daemon for longer than one residency
query per epoch. With a daemon it announces each epoch's draw and a provisional draw of the next epoch
(computed on the announcer's thread; docs/hooks.md).
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from typing import Iterator, List, Optional, Union

import numpy as np
import torch.utils.data

from . import distributed as _dist
from .client import Client, DatasetPaths, dataset_root, discover, warn_user

__all__ = ["ShadeSampler", "EpochPlan", "rank_transform", "pads_sort", "race_draw", "keyed_shuffle"]

log = logging.getLogger(__name__)


MODES = ("auto", "aggressive", "relaxed")

# Domain tags keep the global and the per-rank random streams of one (seed, epoch) independent.
_GLOBAL_STREAM = 0x5EED_0001
_RANK_STREAM = 0x5EED_0002
_TIE_STREAM = 0x5EED_0003

DRAWS = ("stable", "cdf")

_U64 = np.uint64
_GOLD = _U64(0x9E37_79B9_7F4A_7C15)
_MIX1 = _U64(0xBF58_476D_1CE4_E5B9)
_MIX2 = _U64(0x94D0_49BB_1331_11EB)


def _stream_key(*parts: int) -> np.uint64:
    """One 64-bit key per random stream, from (seed, epoch, domain tag, ...)."""
    return _U64(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, np.uint64)[0])


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (Steele et al., OOPSLA '14), elementwise on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> _U64(30))
    x = x * _MIX1
    x = x ^ (x >> _U64(27))
    x = x * _MIX2
    return x ^ (x >> _U64(31))


def hash_bits(key: np.uint64, a: np.ndarray, b=0) -> np.ndarray:
    """64 random bits per (key, a[j], b[j]) pair, uint64 of a's shape: a counter-based stream.

    Unlike a Generator's sequence, the value of one pair does not depend on which other pairs are asked
    for, which is what keeps the ``stable`` draw stable (:meth:`ShadeSampler.global_draw`).
    """
    with np.errstate(over="ignore"):
        x = _mix(np.asarray(a, dtype=np.uint64) * _GOLD + key)
        return _mix(x + np.asarray(b, dtype=np.uint64) * _MIX1 + _GOLD)


def _hash_exponential(key: np.uint64, a: np.ndarray, b) -> np.ndarray:
    """Exp(1) variates, float64, one per (key, a[j], b) pair (inverse CDF of a uniform in (0, 1))."""
    u = ((hash_bits(key, a, b) >> _U64(11)).astype(np.float64) + 0.5) * (1.0 / (1 << 53))
    return -np.log(u)


def race_draw(weights: np.ndarray, n: int, key: np.uint64) -> np.ndarray:
    """``n`` draws with replacement, P(i) = w_i / sum(w), in draw order: the ``stable`` draw.

    Each sample i runs its own Poisson process of rate w_i (arrival gaps Exp(1) / w_i, from
    :func:`hash_bits` keyed by (key, i, k) for its k-th arrival); the draw is the labels of the first
    ``n`` arrivals of all processes together, in time order. The labels of a superposition of independent
    Poisson processes are i.i.d. with P(i) = w_i / sum(w), so this is exactly the multinomial sequence that
    inverse-CDF sampling gives; but a change of w_j moves only j's arrivals (and the cut at n), so a draw
    from slightly different weights keeps almost every pick (inverse CDF over a cumulative sum moves every
    pick past j). Weights <= 0 are never drawn. Cost: about 2 hashes per sample plus one sort of ~n
    arrival times.

    Raises:
        ValueError: no weight is > 0.
    """
    w = np.asarray(weights, dtype=np.float64)
    live = np.flatnonzero(w > 0)
    if live.size == 0:
        raise ValueError("race_draw: no sample has a weight > 0")
    total = float(w[live].sum())
    horizon = (n + 8.0 * math.sqrt(n) + 16.0) / total  # the n-th arrival lies below it almost surely
    while True:
        times, labels = [], []
        items = live
        t = np.zeros(items.size, dtype=np.float64)
        k = 0
        count = 0
        while items.size:
            t = t + _hash_exponential(key, items, k) / w[items]
            ok = t <= horizon
            items, t = items[ok], t[ok]
            times.append(t)
            labels.append(items)
            count += items.size
            k += 1
        if count >= n:
            break
        horizon *= 1.5  # (rare) fewer than n arrivals below the horizon: the same arrivals, further out
    times = np.concatenate(times)
    labels = np.concatenate(labels)
    first = np.argpartition(times, n - 1)[:n] if times.size > n else np.arange(times.size)
    first = first[np.argsort(times[first], kind="stable")]
    return labels[first].astype(np.int64)


def keyed_shuffle(values: np.ndarray, key: np.uint64) -> np.ndarray:
    """A uniformly random order of the multiset ``values`` (int, shape (n,)), stable under edits.

    Sorts by a hash of (value, occurrence: how many equal values come before it), so adding or removing
    one entry moves no other entry's relative order (``rng.permutation`` reshuffles everything when the
    length changes).
    """
    v = np.asarray(values, dtype=np.int64).reshape(-1)
    if v.size <= 1:
        return v.copy()
    srt = np.argsort(v, kind="stable")
    sv = v[srt]
    starts = np.flatnonzero(np.r_[True, sv[1:] != sv[:-1]])
    occ_sorted = np.arange(v.size) - np.repeat(starts, np.diff(np.r_[starts, v.size]))
    occ = np.empty(v.size, dtype=np.int64)
    occ[srt] = occ_sorted
    return v[np.argsort(hash_bits(key, v, occ), kind="stable")]

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


def pads_sort(draw: np.ndarray, rng: Optional[np.random.Generator] = None,
              key: Optional[np.uint64] = None) -> np.ndarray:
    """Group a draw by sample, most-drawn first: SHADE's ``pads_sort``, deterministic.

    Ties (samples drawn equally often) are ordered by a random key: with ``key``, a hash of (key, sample)
    (:func:`hash_bits`: a sample's key does not depend on which others were drawn); else from ``rng``
    when given (one per distinct sample, in index order); else by index. The sampler passes keys seeded
    with (seed, epoch) only, so every rank gets the same order: index order is class order in an
    ImageFolder, and contiguous per-rank blocks of an index-ordered tie group would give each rank a few
    classes only.
    """
    uniq, counts = np.unique(np.asarray(draw, dtype=np.int64), return_counts=True)
    if key is not None:
        tie_key = hash_bits(key, uniq)
    else:
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


class _LookaheadTrigger:
    """An empty iterable that, when ``itertools.chain`` reaches it, starts the provisional lookahead."""

    __slots__ = ("sampler", "generation", "epoch", "order")

    def __init__(self, sampler, generation: int, epoch: int, order: np.ndarray):
        self.sampler, self.generation, self.epoch, self.order = sampler, generation, epoch, order

    def __iter__(self):
        s = self.sampler
        if s.generation == self.generation and s.announcer is not None:
            s._announce_provisional(self.generation, self.epoch, self.order)
        return iter(())


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
        lookahead_at: with ``announce_plan``, the fraction of an epoch's indices taken from the iterator
            after which a *provisional* draw of the next epoch (the same procedure with the scores and
            residency known then) is computed and announced in the background, after this epoch's order;
            the real draw replaces it at the next ``iter()``. 1.0 (default): when the iterator is
            exhausted, which the DataLoader reaches ``prefetch_factor x num_workers`` batches before the
            epoch's last step. None: no provisional lookahead. Changes nothing that is yielded.
        draw: ``"stable"`` (default): the with-replacement draw and every shuffle use counter-based random
            keys per sample (:func:`race_draw`, :func:`keyed_shuffle`), so a draw from slightly different
            scores or residency keeps almost every pick, which is what makes the provisional lookahead
            worth announcing; ``"cdf"``: inverse-CDF sampling and Generator permutations (the draw
            without the provisional lookahead; the same distribution). Both draw exactly
            the same distribution: P(i) = (w_i + ls) / sum_j (w_j + ls), uniform shuffles.
        epochs: the number of epochs the job runs (0 .. epochs - 1), or None (unknown): the last one
            announces no provisional draw, so the daemon reads nothing ahead for an epoch that never runs
            (``set_epoch(epoch, last=True)`` says the same late).

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
        lookahead_at: Optional[float] = 0.0,
        draw: str = "stable",
        epochs: Optional[int] = None,
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
        if lookahead_at is not None and not 0.0 <= lookahead_at <= 1.0:
            raise ValueError(f"lookahead_at must be in [0, 1] or None, got {lookahead_at}")
        if draw not in DRAWS:
            raise ValueError(f"draw must be one of {DRAWS}, got {draw!r}")
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
        self.lookahead_at = None if lookahead_at is None else float(lookahead_at)
        self.draw = draw
        if epochs is not None and int(epochs) < 1:
            raise ValueError(f"epochs must be >= 1 (or None), got {epochs}")
        self.epochs = None if epochs is None else int(epochs)
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
        self.provisional: Optional[EpochPlan] = None  # the last provisional draw announced (tests, benchmarks)
        self.provisional_failed = 0
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
            client, where, why = discover(dataset_root(self.dataset))
            if client is None:
                self._no_daemon(where, why)
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
            warn_user(f"shadefs: {reason}; ShadeSampler runs without cache awareness")

    @staticmethod
    def _no_daemon(where: str, why: str) -> None:
        warn_user(f"shadefs: no daemon answered {where}: {why}. ShadeSampler samples by importance without "
                  "cache awareness, announces no plan and sends no scores; training continues without "
                  "prefetch (mount the dataset with 'shadefs mount' and check that its daemon runs, or pass "
                  "client=False to turn this warning off)")

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
        self.ls = self._next_ls(mean_loss)
        self._prev_mean_loss = mean_loss

    def _next_ls(self, mean_loss: float) -> float:
        """The smoothing term after an epoch of mean loss ``mean_loss`` (pure)."""
        prev = self._prev_mean_loss
        if prev is None:
            return self.smoothing * mean_loss
        if prev > 0:
            return self.ls * math.exp((mean_loss - prev) / prev)
        return self.ls

    def _predicted_ls(self) -> float:
        """The ``ls`` the next ``iter()`` will use if no more losses come (pure; the provisional draw)."""
        n, total = self._loss_n, self._loss_sum
        if n == 0:
            return self.ls
        mean_loss = float(total / n)
        return self._next_ls(mean_loss) if math.isfinite(mean_loss) else self.ls

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
    def set_epoch(self, epoch: int, last: bool = False) -> None:
        """Seed the next ``iter()`` with ``epoch`` (call it on every rank, as for DistributedSampler);
        ``last``: the job's last epoch (no provisional draw of a next one, as with ``epochs=epoch + 1``)."""
        self.epoch = int(epoch)
        self._epoch_set = True
        if last:
            self.epochs = self.epoch + 1

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
        order = self.plan.order.tolist()
        if self.announcer is None:
            return iter(order)
        # the PADS draw, repeats included; sent in the background. It replaces whatever this
        # stream announced before, the provisional draw of this epoch included.
        self.announcer.announce(self.epoch, [self.plan.order])
        if self.lookahead_at is None or (self.epochs is not None and self.epoch + 1 >= self.epochs):
            return iter(order)
        # The provisional next draw, started when the DataLoader takes index k of this epoch: chain()
        # asks for the trigger's iterator only then, so the loop pays nothing per index.
        k = min(len(order), math.ceil(self.lookahead_at * len(order)))
        trigger = _LookaheadTrigger(self, self.generation, self.epoch, self.plan.order)
        return itertools.chain(order[:k], trigger, order[k:])

    def close(self, timeout: float = 5.0) -> None:
        """Tell the daemon the job is done with this sampler's plan (``withdraw``: it drops the last
        announced draws at once instead of following them until they expire), then close the client's
        socket. Called for you at a clean exit for the plan; ``with ShadeSampler(...) as sampler:`` calls it
        at the block's end. The sampler still samples afterwards (a later epoch announces again)."""
        if self.announcer is not None:
            self.announcer.close(timeout)
        if self.client is not None:
            self.client.close()

    def __enter__(self) -> "ShadeSampler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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

    def global_draw(self, epoch: int, weights: Optional[np.ndarray] = None) -> np.ndarray:
        """The raw with-replacement draw of ``epoch``, shape (total_size,), identical on every rank.

        P(i) = (w_i + ls) / sum_j (w_j + ls) (``weights``: those sampling weights instead of
        :meth:`sampling_weights`). ``draw="stable"``: :func:`race_draw` keyed by (seed, epoch), in draw
        order; ``draw="cdf"``: inverse-CDF sampling of ``total_size`` uniforms from a Generator seeded
        with (seed, epoch).
        """
        w = self.sampling_weights() if weights is None else np.asarray(weights, dtype=np.float64)
        if self.draw == "stable":
            return race_draw(w, self.total_size, _stream_key(self.seed, int(epoch), _GLOBAL_STREAM))
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, int(epoch), _GLOBAL_STREAM])))
        cdf = np.cumsum(w)
        u = rng.random(self.total_size) * cdf[-1]
        return np.minimum(np.searchsorted(cdf, u, side="right"), self.N - 1).astype(np.int64)

    def plan_epoch(self, epoch: int, *, weights: Optional[np.ndarray] = None, mode: Optional[str] = None,
                   resident=None) -> EpochPlan:
        """Plan ``epoch`` for this rank (pure apart from one residency query).

        Args:
            weights: the sampling weights to draw from (default :meth:`sampling_weights`).
            mode: "aggressive" or "relaxed" (default :meth:`current_mode`).
            resident: ``f(paths) -> bool array`` for the residency query (default this sampler's client).
        """
        mode = self.current_mode(epoch) if mode is None else mode
        draw = self.global_draw(epoch, weights)
        ns, r = self.num_samples, self.rank
        stable = self.draw == "stable"
        if mode == "aggressive":
            # Most-drawn first, then contiguous blocks: a sample's repeats stay on one rank (one node's
            # cache), the most-drawn go to the lowest ranks. Ties in a seeded random order (the same on
            # every rank), so that a rank's block is not a run of neighbouring indices (= a few classes).
            if stable:
                global_order = pads_sort(draw, key=_stream_key(self.seed, int(epoch), _TIE_STREAM))
            else:
                tie_rng = np.random.Generator(
                    np.random.PCG64(np.random.SeedSequence([self.seed, int(epoch), _TIE_STREAM])))
                global_order = pads_sort(draw, tie_rng)
            positions = np.arange(r * ns, (r + 1) * ns, dtype=np.int64)
        else:
            global_order = draw
            positions = np.arange(r, self.total_size, self.num_replicas, dtype=np.int64)
        shard = global_order[positions]
        if stable:
            k = _stream_key(self.seed, int(epoch), _RANK_STREAM, r)
            shuffle = lambda v, part: keyed_shuffle(v, k ^ _U64(part))  # noqa: E731
        else:
            rng = np.random.Generator(
                np.random.PCG64(np.random.SeedSequence([self.seed, int(epoch), _RANK_STREAM, r]))
            )
            shuffle = lambda v, part: rng.permutation(v)  # noqa: E731
        order, hits, resident_n = self._hits_first(shard, shuffle, resident)
        return EpochPlan(int(epoch), mode, global_order, positions, order, hits, resident_n)

    def _hits_first(self, shard: np.ndarray, shuffle, resident=None):
        """SHADE's ``prepare_hits``: resident draws repeated ``rep_factor`` times and first (shuffled),
        misses after (shuffled), cut to ``num_samples`` keeping at least ``min_miss_fraction`` misses."""
        flags = self._resident(shard, resident)
        if flags is None or not flags.any():
            return shuffle(shard, 0), 0, 0
        hits, misses = shard[flags], shard[~flags]
        whole = int(math.floor(self.rep_factor))
        extra = int(math.floor((self.rep_factor - whole) * hits.size))
        repeated = shuffle(np.concatenate([np.tile(hits, whole), hits[:extra]]), 1)
        misses = shuffle(misses, 2)
        ns = self.num_samples
        keep_misses = min(misses.size, math.ceil(self.min_miss_fraction * ns))
        n_hits = min(repeated.size, ns - keep_misses)
        order = np.concatenate([repeated[:n_hits], misses[: ns - n_hits]])
        return order, n_hits, int(hits.size)

    def _resident(self, shard: np.ndarray, resident=None) -> Optional[np.ndarray]:
        """Residency of each shard entry (one query for the distinct ones), or None if unknown."""
        if self.client is None or self.paths is None:
            return None
        uniq = np.unique(shard)
        rel = self.paths.rel_paths(uniq)
        inside = np.array([p is not None for p in rel], dtype=bool)
        try:
            flags = (self.client.resident if resident is None else resident)([p for p in rel if p is not None])
        except Exception as exc:  # daemon gone or slow: sample without cache awareness this epoch
            if resident is not None:
                raise  # the provisional draw: its caller counts the failure
            self._resident_failures += 1
            if self.announcer is not None:
                self.announcer.unanswered_warned = True  # this warning says it; the plan's would repeat it
            if self._resident_failures == 1:
                warn_user(
                    f"shadefs: the residency query failed ({exc}); this epoch is planned without cache "
                    "awareness (retried next epoch, warned once)")
            return None
        res_u = np.zeros(uniq.size, dtype=bool)
        res_u[inside] = flags
        return res_u[np.searchsorted(uniq, shard)]

    # ------------------------------------------------------------------- provisional lookahead
    def provisional_plan(self, epoch: int, resident=None) -> EpochPlan:
        """What ``plan_epoch(epoch)`` would give if the next ``iter()`` came now: the current weights, the
        smoothing term the losses reported so far would give, the current mode, and residency now
        (``resident``: the query to use; default this sampler's client). Changes no state.
        """
        weights = self.weights + self._predicted_ls()
        return self.plan_epoch(int(epoch), weights=weights, mode=self.current_mode(int(epoch)),
                               resident=resident)

    def _announce_provisional(self, generation: int, epoch: int, order: np.ndarray) -> None:
        """Queue the provisional draw of ``epoch + 1`` on the announcer's thread (never blocks)."""
        sampler = self

        def job(client):
            if sampler.generation != generation:
                return None  # the next epoch started meanwhile: its real draw is announced instead
            try:
                plan = sampler.provisional_plan(epoch + 1, resident=client.resident)
            except Exception as exc:  # daemon gone or slow: no lookahead this epoch
                sampler.provisional_failed += 1
                log.debug("shadefs: provisional draw of epoch %d failed: %s", epoch + 1, exc)
                return None
            if sampler.generation != generation:
                return None
            sampler.provisional = plan
            return [order, plan.order]

        self.announcer.announce(epoch, job)

    def __repr__(self) -> str:
        return (
            f"ShadeSampler(N={self.N}, rep_factor={self.rep_factor}, seed={self.seed}, "
            f"rank={self.rank}/{self.num_replicas}, mode={self.mode!r}, epoch={self.epoch}, "
            f"cache_aware={self.paths is not None})"
        )
