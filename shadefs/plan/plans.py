"""Announced sample orders (plans) and the cursors that follow their consumption.

A training job announces each epoch's order (:mod:`shadefs.hooks.plan`, docs/protocol.md ``register`` /
``plan``): first its dataset's path table, once, which the daemon resolves to file ids and keeps under a
handle; then, per epoch, the order as uint32 indices into that table. :class:`PlanRegistry` keeps the
tables and one :class:`Plan` per stream (a handle and a stream id: one DDP rank, one sampler).

A plan's **cursor** follows the opens the daemon sees. DataLoader workers reorder the plan: batch k goes
to worker k mod W, each worker keeps ``prefetch_factor`` batches in flight, so opens arrive up to about
W x prefetch_factor x batch_size positions ahead of the oldest unconsumed one, interleaved. An open of
file f therefore consumes f's earliest unconsumed planned position if it lies within ``window`` positions
of the cursor (the lowest unconsumed position); repeats (with-replacement draws) are separate positions
of the same file, consumed in order. An open of a file the plan does not name (the test split, another
job) is not this plan's business and is ignored. An open of a file the plan names, but not within the
window, is *unmatched*; a plan with ``unmatched_limit`` unmatched opens since its last match, or no match
for ``idle_s`` seconds, is **retired** (its reader stopped following it: the job changed its mind,
crashed or ended), logged once and counted. A plan whose every position was consumed is *finished*. A
job that ends cleanly **withdraws** its plans (``withdraw``, docs/protocol.md), which drops them at once;
the retirement after ``idle_s`` remains for a job that crashed.
Neither state pins cache space: a plan only ranks files (Belady on the known future,
:mod:`shadefs.plan.policy`) and lends the prefetcher its order (:mod:`shadefs.plan.prefetch`).

Not thread-safe by itself: every method runs under ``lock`` (the cache's lock in the daemon), which
:meth:`PlanRegistry.announce` and :meth:`PlanRegistry.register` take themselves.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["Plan", "PlanRegistry", "PlanError", "NOT_PLANNED"]

log = logging.getLogger("shadefs.plan")

NOT_PLANNED = np.iinfo(np.int64).max
"""Distance of a file with no planned use ("never": infinitely far, as Belady's MIN has it)."""


class PlanError(ValueError):
    """A plan or table message the registry refuses.

    Attributes:
        reason: a reason of :data:`shadefs.control.protocol.REASONS` (``unknown_handle``,
            ``unknown_path``, ``oversize``, ``flood``).
    """

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class Plan:
    """One stream's announced future: its announced epochs, concatenated, and a cursor over them.

    Args:
        key: (handle, stream).
        fids: file ids in plan order, int64, shape (L,).
        segments: ``[(epoch, length), ...]`` in order; lengths sum to L.
        num_files: the namespace's file count (ids are < it).
        window: how far ahead of the cursor an open may match (positions).
        now: the clock at announcement (seconds).

    Attributes:
        pos: the cursor, the lowest unconsumed position (L when finished).
        matched, unmatched, skipped: opens that consumed a position; opens of a planned file outside the
            window; positions the cursor passed without an open (a sample whose open never came).
    """

    def __init__(self, key: Tuple[bytes, int], fids: np.ndarray, segments: Sequence[Tuple[int, int]],
                 num_files: int, window: int, now: float):
        self.key = key
        self.ids = np.ascontiguousarray(fids, dtype=np.int64)
        self.segments = [(int(e), int(n)) for e, n in segments]
        self.window = max(1, int(window))
        L = self.ids.shape[0]
        self.consumed = np.zeros(L, dtype=bool)
        # Positions grouped by file (stable sort keeps each file's positions ascending).
        self.positions = np.argsort(self.ids, kind="stable").astype(np.int64)
        uniq, starts, counts = np.unique(self.ids[self.positions], return_index=True, return_counts=True)
        self.group = np.full(int(num_files), -1, dtype=np.int32)
        self.group[uniq] = np.arange(uniq.size, dtype=np.int32)
        self.gend = (starts + counts).astype(np.int64)
        self.ptr = starts.astype(np.int64)     # per file: index into positions of its first unconsumed use
        self.pos = 0
        self.matched = 0
        self.unmatched = 0
        self.unmatched_since_match = 0
        self.block_opens = 0                   # opens of planned files in the current block
        self.block_unmatched = 0
        self.skipped = 0
        self.last_match = now
        self.created = now
        self.prefetch_pos = 0                  # the prefetcher's scan position (>= pos)
        self.moved = None                      # callback(plan, fid): fid's next planned use moved later

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    @property
    def finished(self) -> bool:
        return self.pos >= len(self)

    def segment_of(self, epoch: int) -> Optional[Tuple[int, int]]:
        """(start, length) of ``epoch``'s positions, or None if it was not announced in this plan."""
        start = 0
        for e, n in self.segments:
            if e == epoch:
                return start, n
            start += n
        return None

    def next_position(self, fid: int) -> Optional[int]:
        """The position of ``fid``'s next unconsumed planned use, or None."""
        if not 0 <= fid < self.group.shape[0]:
            return None
        g = self.group[fid]
        if g < 0 or self.ptr[g] >= self.gend[g]:
            return None
        return int(self.positions[self.ptr[g]])

    def next_positions(self, fids: np.ndarray) -> np.ndarray:
        """Each file's next unconsumed planned position (int64, shape like ``fids``); -1 where none."""
        fids = np.asarray(fids, dtype=np.int64)
        out = np.full(fids.shape, -1, dtype=np.int64)
        if fids.size == 0:
            return out
        ok = (fids >= 0) & (fids < self.group.shape[0])
        g = np.full(fids.shape, -1, dtype=np.int64)
        g[ok] = self.group[fids[ok]]
        has = g >= 0
        p = np.zeros(fids.shape, dtype=np.int64)
        p[has] = self.ptr[g[has]]
        has[has] = p[has] < self.gend[g[has]]
        out[has] = self.positions[p[has]]
        return out

    def distances(self, fids: np.ndarray) -> np.ndarray:
        """Positions from the cursor to each file's next planned use (int64, shape like ``fids``);
        :data:`NOT_PLANNED` where there is none."""
        nxt = self.next_positions(fids)
        return np.where(nxt >= 0, nxt - self.pos, NOT_PLANNED)

    def observe(self, fid: int, now: float) -> Optional[bool]:
        """An open of ``fid``: consume its earliest unconsumed position if within the window.

        Returns:
            True (matched), False (a planned file, not within the window: unmatched), or None (the
            plan does not name ``fid``).
        """
        if not 0 <= fid < self.group.shape[0]:
            return None
        g = self.group[fid]
        if g < 0:
            return None
        self.block_opens += 1
        i = self.ptr[g]
        if i >= self.gend[g]:
            return self._unmatched()
        p = int(self.positions[i])
        if p >= self.pos + self.window:
            return self._unmatched()
        self.consumed[p] = True
        self.ptr[g] = i + 1
        if self.moved is not None:
            self.moved(self, fid)
        self.matched += 1
        self.unmatched_since_match = 0
        self.last_match = now
        if p == self.pos:
            self._advance()
        elif p - self.pos > self.window // 2:
            self._skip_to(p - self.window // 2)
        return True

    def _unmatched(self) -> bool:
        self.unmatched += 1
        self.unmatched_since_match += 1
        self.block_unmatched += 1
        return False

    def stopped_matching(self, limit: int) -> bool:
        """Whether the reader no longer follows this plan (module docstring); closes a full block."""
        if self.unmatched_since_match > limit:
            return True
        if self.block_opens >= limit:
            bad = self.block_unmatched * 2 > self.block_opens
            self.block_opens = self.block_unmatched = 0
            return bad
        return False

    def _advance(self) -> None:
        L = len(self)
        pos = self.pos
        consumed = self.consumed
        while pos < L and consumed[pos]:
            pos += 1
        self.pos = pos
        if self.prefetch_pos < pos:
            self.prefetch_pos = pos

    def _skip_to(self, target: int) -> None:
        """Pass positions below ``target`` whose open never came (counted as skipped)."""
        moved = self.moved
        for q in range(self.pos, target):
            if not self.consumed[q]:
                self.consumed[q] = True
                fid = int(self.ids[q])
                self.ptr[self.group[fid]] += 1  # q is that file's earliest unconsumed use (those below are consumed)
                self.skipped += 1
                if moved is not None:
                    moved(self, fid)
        self.pos = max(self.pos, target)
        self._advance()

    def describe(self) -> str:
        epochs = ",".join(str(e) for e, _ in self.segments)
        return (f"plan {self.key[0].hex()}/{self.key[1]} (epochs {epochs}, {len(self)} positions, at {self.pos}, "
                f"{self.matched} matched, {self.unmatched} unmatched, {self.skipped} skipped)")


@dataclasses.dataclass
class _Table:
    fids: np.ndarray          # int64, table index -> file id
    last_used: float


class PlanRegistry:
    """Path tables and plans of one mount.

    Args:
        num_files: the namespace's file count.
        lock: the lock every method runs under (the cache's); a fresh one by default.
        window: default matching window in positions (a plan may ask for more).
        unmatched_limit: unmatched opens since the last match that retire a plan (default ``window``).
        idle_s: seconds without a match that retire a plan.
        max_tables, max_table_paths, max_plans: limits (beyond them: ``flood`` / ``oversize``).
        announce_burst, announce_rate: per-stream token bucket on plan announcements (burst, per second).
        clock: monotonic seconds.
    """

    def __init__(self, num_files: int, lock: Optional[threading.Lock] = None, *, window: int = 8192,
                 unmatched_limit: Optional[int] = None, idle_s: float = 300.0, max_tables: int = 64,
                 max_table_paths: int = 1 << 27, max_plans: int = 64, announce_burst: int = 32,
                 announce_rate: float = 4.0, clock=time.monotonic):
        self.num_files = int(num_files)
        self.lock = lock if lock is not None else threading.Lock()
        self.window = int(window)
        self.unmatched_limit = int(unmatched_limit if unmatched_limit is not None else max(64, window))
        self.idle_s = float(idle_s)
        self.max_tables = int(max_tables)
        self.max_table_paths = int(max_table_paths)
        self.max_plans = int(max_plans)
        self.announce_burst = float(announce_burst)
        self.announce_rate = float(announce_rate)
        self.clock = clock
        self.tables: Dict[bytes, _Table] = {}
        self.plans: Dict[Tuple[bytes, int], Plan] = {}
        self._buckets: Dict[Tuple[bytes, int], Tuple[float, float]] = {}
        self.version = 0                       # bumped whenever the set of plans changes
        self.announced = 0
        self.retired = 0
        self.finished = 0
        self.withdrawn = 0
        self.listeners: List = []              # callback(plan, why) when a plan ends (prefetcher waste)
        self.watchers: List = []               # callback((plan, fid)) when fid's next use in plan moved later

    # -- tables ----------------------------------------------------------------------------------
    def register(self, handle: Optional[bytes], fids: np.ndarray) -> Tuple[bytes, int]:
        """Create a path table (``handle`` None) or append ``fids`` to table ``handle``.

        Args:
            fids: file ids (int64, shape (n,)), already resolved from paths by the caller.

        Returns:
            (handle: 8 bytes, table size after the call).

        Raises:
            PlanError: ``unknown_handle``; ``oversize`` (the table would exceed ``max_table_paths``);
                ``flood`` (``max_tables`` tables exist and every one has an active plan).
        """
        fids = np.asarray(fids, dtype=np.int64).reshape(-1)
        with self.lock:
            now = self.clock()
            if handle is None:
                if len(self.tables) >= self.max_tables and not self._drop_idle_table():
                    raise PlanError("flood", f"{len(self.tables)} path tables with active plans; "
                                             "register fewer datasets")
                if fids.size > self.max_table_paths:
                    raise PlanError("oversize", f"a table of {fids.size} paths exceeds {self.max_table_paths}")
                handle = os.urandom(8)
                self.tables[handle] = _Table(fids.copy(), now)
                return handle, int(fids.size)
            t = self.tables.get(bytes(handle))
            if t is None:
                raise PlanError("unknown_handle", f"no path table {bytes(handle).hex()}")
            if t.fids.size + fids.size > self.max_table_paths:
                raise PlanError("oversize", f"a table of {t.fids.size + fids.size} paths exceeds "
                                            f"{self.max_table_paths}")
            t.fids = np.concatenate([t.fids, fids])
            t.last_used = now
            return bytes(handle), int(t.fids.size)

    def _drop_idle_table(self) -> bool:
        busy = {k[0] for k in self.plans}
        idle = [(t.last_used, h) for h, t in self.tables.items() if h not in busy]
        if not idle:
            return False
        del self.tables[min(idle)[1]]
        return True

    # -- plans -------------------------------------------------------------------------------------
    def announce(self, handle: bytes, stream: int, first_epoch: int, segments: Sequence[int],
                 ids: np.ndarray, window: int = 0) -> Plan:
        """Install the order of epochs ``first_epoch, first_epoch + 1, ...`` for stream ``(handle, stream)``.

        Args:
            segments: positions per epoch (ints), summing to ``len(ids)``.
            ids: table indices (uint32, shape (L,)), in plan order.
            window: the client's matching window (0: the registry's default); the larger of the two is used.

        If the stream's current plan holds ``first_epoch`` with the same order, that epoch keeps its
        consumption (a lookahead announced before is confirmed); epochs before it are dropped.

        Raises:
            PlanError: ``unknown_handle``, ``unknown_path`` (an index beyond the table), ``flood`` (too many
                streams, or announcements faster than the stream's token bucket).
        """
        ids = np.asarray(ids)
        with self.lock:
            now = self.clock()
            t = self.tables.get(bytes(handle))
            if t is None:
                raise PlanError("unknown_handle", f"no path table {bytes(handle).hex()}")
            if ids.size and int(ids.max()) >= t.fids.size:
                raise PlanError("unknown_path", f"plan index {int(ids.max())} beyond the table's {t.fids.size} paths")
            key = (bytes(handle), int(stream))
            if key not in self.plans and len(self.plans) >= self.max_plans:
                self._expire(now)
                if len(self.plans) >= self.max_plans:
                    raise PlanError("flood", f"{len(self.plans)} active plans; the limit is {self.max_plans}")
            tokens, last = self._buckets.get(key, (self.announce_burst, now))
            tokens = min(self.announce_burst, tokens + (now - last) * self.announce_rate)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                raise PlanError("flood", f"stream {stream} announces faster than {self.announce_rate:g} plans/s")
            self._buckets[key] = (tokens - 1.0, now)
            t.last_used = now
            fids = t.fids[ids.astype(np.int64)]
            segs = [(int(first_epoch) + i, int(n)) for i, n in enumerate(segments)]
            old = self.plans.get(key)
            plan = Plan(key, fids, segs, self.num_files, max(self.window, int(window)), now)
            if old is not None:
                self._carry(old, plan, int(first_epoch))
                self._end(old, "replaced")
            plan.moved = self._moved
            self.plans[key] = plan
            self.version += 1
            self.announced += 1
            return plan

    @staticmethod
    def _carry(old: Plan, new: Plan, epoch: int) -> None:
        """Keep ``epoch``'s consumption when ``old`` had announced it with the same order."""
        seg = old.segment_of(epoch)
        n = new.segments[0][1] if new.segments else 0
        if seg is None or seg[1] != n or not np.array_equal(old.ids[seg[0]:seg[0] + n], new.ids[:n]):
            return
        done = np.flatnonzero(old.consumed[seg[0]:seg[0] + n])
        for q in done.tolist():  # replay the consumption in position order (keeps per-file pointers exact)
            g = new.group[new.ids[q]]
            new.consumed[q] = True
            new.ptr[g] += 1
        new.matched = int(done.size)
        new.last_match = old.last_match
        new._advance()
        new.prefetch_pos = max(new.pos, old.prefetch_pos - seg[0])

    def observe(self, fid: int) -> int:
        """Follow one open of ``fid`` in every plan; retire plans that stopped matching.

        Returns the number of plans whose position it consumed. Caller holds :attr:`lock`.
        """
        if not self.plans:
            return 0
        now = self.clock()
        matched = 0
        ended = None
        for plan in self.plans.values():
            r = plan.observe(fid, now)
            if r:
                matched += 1
                if plan.finished:
                    ended = (ended or []) + [(plan, "finished")]
            if r is not None and plan.stopped_matching(self.unmatched_limit):
                ended = (ended or []) + [(plan, "most opens of its files did not match it")]
        if ended:
            for plan, why in ended:
                self._remove(plan, why)
        return matched

    def expire(self) -> None:
        """Retire plans without a match for ``idle_s`` seconds. Caller holds :attr:`lock`."""
        self._expire(self.clock())

    def _expire(self, now: float) -> None:
        for plan in [p for p in self.plans.values() if now - p.last_match > self.idle_s]:
            self._remove(plan, f"no open matched it for {now - plan.last_match:.0f} s")

    def _moved(self, plan: Plan, fid: int) -> None:
        if self.watchers:
            item = (plan, fid)
            for cb in self.watchers:
                cb(item)

    def _remove(self, plan: Plan, why: str) -> None:
        if self.plans.get(plan.key) is plan:
            del self.plans[plan.key]
            self.version += 1
        self._end(plan, why)

    def _end(self, plan: Plan, why: str) -> None:
        if why == "finished":
            self.finished += 1
        elif why == "withdrawn":
            self.withdrawn += 1
        elif why != "replaced":
            self.retired += 1
            log.warning("retired %s: %s", plan.describe(), why)  # once per plan: it is gone now
        for cb in self.listeners:
            cb(plan, why)

    def withdraw(self, handle: bytes, stream: int) -> Optional[Plan]:
        """End stream ``(handle, stream)``'s plan now: the job is done with it (``withdraw``). Listeners see
        it end as ``"withdrawn"`` (the prefetcher counts its window entries as wasted). Takes :attr:`lock`.

        Returns:
            the plan dropped, or None when the registry holds none for that stream (it finished or was
            retired before, or was never announced): nothing changes then.
        """
        with self.lock:
            plan = self.plans.get((bytes(handle), int(stream)))
            if plan is not None:
                self._remove(plan, "withdrawn")
            return plan

    def retire_all(self, why: str = "unmounted") -> None:
        for plan in list(self.plans.values()):
            self._remove(plan, why)

    # -- queries (Belady on the plan, the prefetcher) ---------------------------------------------
    def active(self) -> List[Plan]:
        return list(self.plans.values())

    def distances(self, fids: np.ndarray) -> np.ndarray:
        """Per file, positions to its nearest next planned use over all plans (int64);
        :data:`NOT_PLANNED` where no plan names it again."""
        fids = np.asarray(fids, dtype=np.int64)
        out = np.full(fids.shape, NOT_PLANNED, dtype=np.int64)
        for plan in self.plans.values():
            np.minimum(out, plan.distances(fids), out=out)
        return out

    def distance(self, fid: int) -> int:
        best = NOT_PLANNED
        for plan in self.plans.values():
            p = plan.next_position(fid)
            if p is not None and p - plan.pos < best:
                best = p - plan.pos
        return best

    def counters(self) -> dict:
        return {"plans_active": len(self.plans), "plans_retired": self.retired,
                "plans_finished": self.finished, "plans_withdrawn": self.withdrawn,
                "plans_announced": self.announced,
                "tables": len(self.tables)}
