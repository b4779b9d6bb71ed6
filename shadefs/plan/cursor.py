"""A plan and its cursor: one stream's announced order of file ids and how far its opens consumed it.

:class:`Plan` holds the order of the epochs a stream announced, concatenated, and the cursor that follows
the opens the daemon sees (the matching window, repeats, unmatched opens, skips: :mod:`shadefs.plan.plans`
describes the rules); its distances (positions to each file's next use) are what Belady's rule reads.
:func:`carry`, :func:`carry_positions` and :func:`carry_rest` move what a stream's plan consumed of an
epoch into the plan that confirms that epoch (the same order announced again with the next lookahead).

Not thread-safe: the registry calls it under its lock, or on a plan no other thread sees yet.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from .jobs import JobKey

__all__ = ["Plan", "NOT_PLANNED", "STRIDE_SHIFT", "STRIDE_ONE", "carry", "carry_positions", "carry_rest"]

NOT_PLANNED = np.iinfo(np.int64).max
"""Distance of a file with no planned use ("never": infinitely far, as Belady's MIN has it)."""

STRIDE_SHIFT = 8
STRIDE_ONE = 1 << STRIDE_SHIFT
"""A plan's :attr:`Plan.stride` when the plan gets every open of the mount (one open per position)."""

_HASH_MUL = 0x9E3779B1  # Fibonacci hashing: the top bits of the 32-bit product index the table


def _hash(fids: np.ndarray, shift: int) -> np.ndarray:
    return ((fids.astype(np.uint64) * np.uint64(_HASH_MUL)) & np.uint64(0xFFFFFFFF)) >> np.uint64(shift)


class Plan:
    """One stream's announced future: its announced epochs, concatenated, and a cursor over them.

    Args:
        key: (handle, stream).
        fids: file ids in plan order, shape (L,) (each < 2**31).
        segments: ``[(epoch, length), ...]`` in order; lengths sum to L.
        num_files: the namespace's file count (ids are < it).
        window: how far ahead of the cursor an open may match (positions).
        now: the clock at announcement (seconds).
        owner: the announcing job (:class:`JobKey`), or None: the plan follows every open (a client that
            did not say who it is, the simulator).

    Memory is O(L), whatever the namespace's size: ~9 bytes per position (file id, position by file,
    consumed flag) plus ~24 bytes per distinct file (its group's bounds and an open-addressing hash
    from file id to group at load <= 1/2). Built without any lock (a new plan is private until the
    registry installs it).

    Attributes:
        pos: the cursor, the lowest unconsumed position (L when finished).
        matched, unmatched, skipped: opens that consumed a position; opens of a planned file outside the
            window; positions the cursor passed without an open (a sample whose open never came).
    """

    def __init__(self, key: Tuple[bytes, int], fids: np.ndarray, segments: Sequence[Tuple[int, int]],
                 num_files: int, window: int, now: float, owner: Optional[JobKey] = None):
        self.key = key
        self.owner = owner
        self.ids = np.ascontiguousarray(fids, dtype=np.int32)
        self.segments = [(int(e), int(n)) for e, n in segments]
        self.window = max(1, int(window))
        L = self.ids.shape[0]
        if L >= 2**31:
            raise ValueError(f"a plan of {L} positions (at most 2**31 - 1)")
        self.consumed = np.zeros(L, dtype=bool)
        # Positions grouped by file (stable sort keeps each file's positions ascending).
        positions = np.argsort(self.ids, kind="stable").astype(np.int32)
        by_file = self.ids[positions]
        bounds = np.flatnonzero(by_file[1:] != by_file[:-1]).astype(np.int32) + 1
        starts = np.concatenate([np.zeros(min(L, 1), np.int32), bounds])
        uniq = by_file[starts]
        self.gend = np.concatenate([bounds, np.full(min(L, 1), L, np.int32)])
        self.ptr = starts.copy()              # per file: index into positions of its first unconsumed use
        self.positions = positions
        self.files = int(uniq.size)
        self._build_hash(uniq)
        # memoryviews: scalar reads and writes as Python ints, no numpy scalar per open
        self._mv_pos, self._mv_ptr, self._mv_gend = memoryview(positions), memoryview(self.ptr), memoryview(self.gend)
        self._mv_consumed = memoryview(self.consumed)
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
        # opens of the mount per position of this plan, in 1/STRIDE_ONE units (the registry measures it):
        # distances in this plan's positions times the stride are distances in the mount's opens, so
        # plans that advance at different speeds compare their next uses in one unit
        self.stride = STRIDE_ONE
        self._matched_mark = 0
        self.moved = None                      # callback(plan, fid): fid's next planned use moved later
        # entry ids planned as another id (the chunks of a chunked file are used when their file is):
        # ``owner_ids(ids) -> file ids`` (shadefs.cache.chunks.ChunkMap), or None
        self.alias = None
        # while an announcement that confirms this plan's epoch is prepared: the positions consumed since
        # it began (appended by observe and _skip_to), carried into the new plan; else None
        self.journal: Optional[List[int]] = None

    def _build_hash(self, uniq: np.ndarray) -> None:
        """File id -> group (index into ptr / gend): linear probing, capacity a power of two >= 2 x files."""
        bits = max(4, int(2 * max(1, uniq.size) - 1).bit_length())
        cap = 1 << bits
        self._hshift = 32 - bits
        self._hmask = cap - 1
        keys = np.full(cap, -1, dtype=np.int32)
        vals = np.zeros(cap, dtype=np.int32)
        slot = _hash(uniq, self._hshift).astype(np.int64)
        todo = np.arange(uniq.size, dtype=np.int64)
        while todo.size:                       # one probe step per round, for every key not yet placed
            s = slot[todo]
            free = keys[s] == -1
            cand, cs = todo[free], s[free]
            _, first = np.unique(cs, return_index=True)
            keys[cs[first]] = uniq[cand[first]]
            vals[cs[first]] = cand[first]
            placed = np.zeros(todo.size, dtype=bool)
            placed[np.flatnonzero(free)[first]] = True
            todo = todo[~placed]
            slot[todo] = (slot[todo] + 1) & self._hmask
        self._hkeys, self._hvals = keys, vals
        self._mv_keys, self._mv_vals = memoryview(keys), memoryview(vals)

    def _group(self, fid: int) -> int:
        """``fid``'s group (index into ptr / gend), or -1 if the plan does not name it."""
        keys, mask = self._mv_keys, self._hmask
        i = ((fid * _HASH_MUL) & 0xFFFFFFFF) >> self._hshift
        while True:
            k = keys[i]
            if k == fid:
                return self._mv_vals[i]
            if k < 0:
                return -1
            i = (i + 1) & mask

    def groups(self, fids: np.ndarray) -> np.ndarray:
        """Each file's group (int64, shape like ``fids``); -1 where the plan does not name it."""
        fids = np.asarray(fids, dtype=np.int64)
        out = np.full(fids.shape, -1, dtype=np.int64)
        ok = np.flatnonzero((fids >= 0) & (fids < 2**31))
        if ok.size == 0:
            return out
        f = fids.reshape(-1)[ok]
        slot = _hash(f, self._hshift).astype(np.int64)
        keys, mask = self._hkeys, self._hmask
        todo = np.arange(f.size, dtype=np.int64)
        flat = out.reshape(-1)
        while todo.size:
            k = keys[slot[todo]]
            hit = k == f[todo]
            flat[ok[todo[hit]]] = self._hvals[slot[todo[hit]]]
            todo = todo[~hit & (k >= 0)]
            slot[todo] = (slot[todo] + 1) & mask
        return out

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    @property
    def finished(self) -> bool:
        return self.pos >= len(self)

    def nbytes(self) -> int:
        """Bytes of the plan's arrays."""
        return int(self.ids.nbytes + self.consumed.nbytes + self.positions.nbytes + self.gend.nbytes
                   + self.ptr.nbytes + self._hkeys.nbytes + self._hvals.nbytes)

    def segment_of(self, epoch: int) -> Optional[Tuple[int, int]]:
        """(start, length) of ``epoch``'s positions, or None if it was not announced in this plan."""
        start = 0
        for e, n in self.segments:
            if e == epoch:
                return start, n
            start += n
        return None

    def segment_end(self, q: int) -> int:
        """The end (exclusive) of the segment holding position ``q`` (``len(self)`` beyond the last)."""
        end = 0
        for _, n in self.segments:
            end += n
            if q < end:
                return end
        return end

    def next_position(self, fid: int) -> Optional[int]:
        """The position of ``fid``'s next unconsumed planned use, or None."""
        if self.alias is not None:
            fid = self.alias.owner_id(fid)
        if not 0 <= fid < 2**31:
            return None
        g = self._group(fid)
        if g < 0:
            return None
        i = self._mv_ptr[g]
        if i >= self._mv_gend[g]:
            return None
        return self._mv_pos[i]

    def next_positions(self, fids: np.ndarray) -> np.ndarray:
        """Each file's next unconsumed planned position (int64, shape like ``fids``); -1 where none."""
        fids = np.asarray(fids, dtype=np.int64)
        out = np.full(fids.shape, -1, dtype=np.int64)
        if fids.size == 0:
            return out
        if self.alias is not None:
            fids = self.alias.owner_ids(fids)
        g = self.groups(fids)
        has = g >= 0
        p = np.zeros(fids.shape, dtype=np.int64)
        p[has] = self.ptr[g[has]]
        has[has] = p[has] < self.gend[g[has]]
        out[has] = self.positions[p[has]]
        return out

    def distances(self, fids: np.ndarray) -> np.ndarray:
        """Distance to each file's next planned use: positions from the cursor times :attr:`stride` (the
        mount's opens per position, in 1/:data:`STRIDE_ONE` units; int64, shape like ``fids``);
        :data:`NOT_PLANNED` where there is none."""
        nxt = self.next_positions(fids)
        return np.where(nxt >= 0, (nxt - self.pos) * self.stride >> STRIDE_SHIFT, NOT_PLANNED)

    def observe(self, fid: int, now: float) -> Optional[bool]:
        """An open of ``fid``: consume its earliest unconsumed position if within the window.

        Returns:
            True (matched), False (a planned file, not within the window: unmatched), or None (the
            plan does not name ``fid``).
        """
        if not 0 <= fid < 2**31:
            return None
        g = self._group(fid)
        if g < 0:
            return None
        self.block_opens += 1
        ptr = self._mv_ptr
        i = ptr[g]
        if i >= self._mv_gend[g]:
            return self._unmatched()
        p = self._mv_pos[i]
        if p >= self.pos + self.window:
            return self._unmatched()
        self._mv_consumed[p] = True
        ptr[g] = i + 1
        journal = self.journal
        if journal is not None:
            journal.append(p)
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
        consumed = self._mv_consumed
        while pos < L and consumed[pos]:
            pos += 1
        self.pos = pos
        if self.prefetch_pos < pos:
            self.prefetch_pos = pos

    def _skip_to(self, target: int) -> None:
        """Pass positions below ``target`` whose open never came (counted as skipped)."""
        moved, journal = self.moved, self.journal
        consumed, ptr = self._mv_consumed, self._mv_ptr
        for q in range(self.pos, target):
            if not consumed[q]:
                consumed[q] = True
                if journal is not None:
                    journal.append(q)
                fid = int(self.ids[q])
                g = self._group(fid)
                ptr[g] += 1  # q is that file's earliest unconsumed use (those below are consumed)
                self.skipped += 1
                if moved is not None:
                    moved(self, fid)
        self.pos = max(self.pos, target)
        self._advance()

    def describe(self) -> str:
        epochs = ",".join(str(e) for e, _ in self.segments)
        who = f", job {self.owner.pid}" if self.owner is not None else ""
        return (f"plan {self.key[0].hex()}/{self.key[1]} (epochs {epochs}, {len(self)} positions{who}, at {self.pos}, "
                f"{self.matched} matched, {self.unmatched} unmatched, {self.skipped} skipped)")


# -- a confirmation: what the stream's old plan consumed of the epoch its new plan begins with ----------
def carry(old: Plan, new: Plan, start: int, lo: int, hi: int) -> List[int]:
    """Copy what ``old`` consumed of its positions ``start + lo .. start + hi`` (of the epoch ``new``
    begins with, in the same order) into ``new``'s positions ``lo .. hi``; returns the files newly
    consumed."""
    lo, hi = max(0, int(lo)), max(0, int(hi))
    lo = min(lo, hi)
    done = np.flatnonzero(old.consumed[start + lo:start + hi] & ~new.consumed[lo:hi]) + lo
    return _consume(old, new, start, done)


def carry_positions(old: Plan, new: Plan, start: int, n: int, positions: List[int]) -> List[int]:
    """Carry ``old``'s consumed ``positions`` (its journal's, any order) that lie in the epoch ``new``
    begins with (``start .. start + n``) into ``new``; returns the files newly consumed. Numpy: off
    the lock."""
    q = np.asarray(positions, dtype=np.int64) - start
    q = q[(q >= 0) & (q < n)]
    return _consume(old, new, start, q[~new.consumed[q]])


def _consume(old: Plan, new: Plan, start: int, done: np.ndarray) -> List[int]:
    if done.size:
        new.consumed[done] = True
        # per file, the consumed positions of the epoch are a prefix of its positions: count them
        np.add.at(new.ptr, new.groups(new.ids[done].astype(np.int64)), 1)
    new.matched += int(done.size)
    _follow(old, new, start)
    return new.ids[done].tolist()


def carry_rest(old: Plan, new: Plan, start: int, n: int, positions: List[int]) -> List[int]:
    """:func:`carry_positions` in plain Python, for the few positions a journal got since its last
    carry: it runs under the lock, at the swap."""
    consumed, ptr, ids = new._mv_consumed, new._mv_ptr, memoryview(new.ids)
    fids = []
    for p in positions:
        q = p - start
        if 0 <= q < n and not consumed[q]:
            consumed[q] = True
            fid = ids[q]
            ptr[new._group(fid)] += 1
            fids.append(fid)
    new.matched += len(fids)
    _follow(old, new, start)
    return fids


def _follow(old: Plan, new: Plan, start: int) -> None:
    """``new`` takes ``old``'s speed, last match and prefetch position; its cursor passes what it
    consumed."""
    new.stride = old.stride
    new._matched_mark = new.matched + new.skipped
    new.last_match = old.last_match
    new._advance()
    new.prefetch_pos = max(new.pos, old.prefetch_pos - start)
