"""Trace replay: how would each policy, and Belady's OPT, have done on a recorded access trace?

``shadefs mount --trace FILE`` records one CSV row per file open; :func:`read_trace` loads it,
:func:`simulate` replays it through one :class:`~shadefs.cache.index.TierIndex` driven by a registered
policy class -- the very classes and accounting the daemon uses, so a single-tier replay counts the
same hits -- and :func:`belady` gives the offline optimum (OPT) to measure them against.
:func:`run` sweeps policies x cache sizes into the JSON of ``shadefs simulate``; :func:`main_simulate`
is that subcommand. The format of the score files (``--scores``) is defined here, writer and reader.

Must never: hold file data, touch the filesystem being simulated, or keep a second copy of policy
logic (a policy that behaves differently here than in the daemon would make every number a lie).
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import heapq
import io
import json
import math
import os
import sys
from array import array
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .cache.chunks import CHUNK_MARK
from .cache.index import TierIndex
from .cache.tiers import entry_cost
from .cache.trace import HEADER as TRACE_HEADER
from .config import Size, format_bytes, parse_size
from .fsutil import atomic_write
from .namespace import normalize
from .policies.base import Importance, PolicyError, get_policy, policy_names

__all__ = [
    "OPT", "SCORES_HEADER", "Trace", "Result", "read_trace", "simulate", "simulate_plan", "next_use", "belady",
    "run",
    "read_scores", "load_scores", "scores_to_importance", "write_scores", "format_table", "plot",
    "add_simulate_arguments", "main_simulate",
]

OPT = "opt"
"""The policy name of Belady's MIN in results (not a registered, online policy)."""

SCORES_HEADER = ("path", "importance")
"""The header row of a scores file (see :func:`write_scores`)."""

_ENCODING = dict(encoding="utf-8", errors="surrogateescape")  # as the daemon's trace writer


# -- traces ----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False)
class Trace:
    """A sequence of whole-file accesses, with dense ids.

    Attributes:
        ids: ``np.ndarray[int64]`` of shape (requests,): the file id of each access, in trace order;
            ids are dense, numbered by first appearance.
        sizes: ``np.ndarray[int64]`` of shape (distinct_files,): bytes per file id.
        paths: path per file id, relative to the mount root.

    ``requests``, ``distinct_files``, ``distinct_bytes`` (the working set, which percentage cache sizes
    refer to) and ``request_bytes`` are derived.
    """

    ids: np.ndarray
    sizes: np.ndarray
    paths: List[str]

    @property
    def requests(self) -> int:
        """Number of accesses (file opens)."""
        return int(self.ids.shape[0])

    @property
    def distinct_files(self) -> int:
        return len(self.paths)

    @functools.cached_property
    def distinct_bytes(self) -> int:
        """Bytes of all distinct files: the working set, which percentage cache sizes refer to."""
        return int(self.sizes.sum())

    @functools.cached_property
    def request_bytes(self) -> int:
        """Bytes of all accesses (the denominator of the byte hit ratio)."""
        return int(self.sizes[self.ids].sum()) if self.requests else 0

    @functools.cached_property
    def namespace_ids(self) -> np.ndarray:
        """The daemon's numbering of the trace's files: ``namespace_ids[trace_id]`` is the file's rank
        among the trace's paths in sorted order, as :class:`shadefs.namespace.Namespace` numbers files.
        Shape (distinct_files,), int64. Replays use it so that a policy comparing file ids (ties) orders
        files as the daemon did."""
        order = sorted(range(len(self.paths)), key=self.paths.__getitem__)
        rank = np.empty(len(self.paths), dtype=np.int64)
        rank[np.array(order, dtype=np.int64)] = np.arange(len(self.paths), dtype=np.int64)
        return rank

    @classmethod
    def from_requests(cls, paths: Iterable[str], sizes: Optional[Iterable[int]] = None) -> "Trace":
        """Build a trace from per-access ``paths`` and per-access ``sizes`` (bytes; default 1 each).

        Raises:
            ValueError: a path is invalid, a size is negative, or one path comes with two sizes.
        """
        paths = list(paths)
        sizes = [1] * len(paths) if sizes is None else list(sizes)
        if len(sizes) != len(paths):
            raise ValueError(f"{len(paths)} paths but {len(sizes)} sizes")
        b = _Builder("<requests>")
        for i, (p, s) in enumerate(zip(paths, sizes)):
            b.add(i + 1, p, int(s))
        return b.trace()


class _Builder:
    """Dense ids for paths, in order of first appearance; checks that a path keeps one size.

    The row loops inline the common case (a known path with its known size) for speed.
    """

    def __init__(self, source: str):
        self.source = source
        self.index: Dict[str, int] = {}  # path as written -> id ('/a' and 'a' name one file)
        self.paths: List[str] = []
        self.sizes: List[int] = []
        self.first_line: List[int] = []
        self.ids = array("q")

    def add(self, line: int, raw: str, size: int) -> None:
        fid = self.index.get(raw)
        if fid is None:
            fid = self.new(line, raw, size)
        elif self.sizes[fid] != size:
            self.mismatch(line, fid, size)
        self.ids.append(fid)

    def new(self, line: int, raw: str, size: int) -> int:
        path = normalize(raw)
        if not path:
            raise ValueError(f"{self.source}:{line}: invalid path {raw!r} (want a file path relative to "
                             f"the mount root, without '.', '..' or empty components)")
        fid = self.index.get(path)
        if fid is None:
            if size < 0:
                raise ValueError(f"{self.source}:{line}: negative size {size}")
            fid = len(self.paths)
            self.paths.append(path)
            self.sizes.append(size)
            self.first_line.append(line)
            self.index[path] = fid
        elif self.sizes[fid] != size:
            self.mismatch(line, fid, size)
        self.index[raw] = fid
        return fid

    def mismatch(self, line: int, fid: int, size: int) -> None:
        raise ValueError(f"{self.source}:{line}: {self.paths[fid]!r} has size {size} bytes here but "
                         f"{self.sizes[fid]} bytes on line {self.first_line[fid]}")

    def trace(self) -> Trace:
        ids = np.frombuffer(self.ids, dtype=np.int64).copy() if self.ids else np.zeros(0, np.int64)
        return Trace(ids=ids, sizes=np.array(self.sizes, dtype=np.int64), paths=self.paths)


def read_trace(path: str) -> Trace:
    """Load an access trace.

    Two formats are accepted:

    - the daemon's trace (``shadefs mount --trace FILE``): CSV with the header
      ``time_s,path,size_bytes,outcome``; only ``path`` and ``size_bytes`` are used (``time_s`` must be
      a number; other columns are ignored). Rows are replayed in file order.
    - one path per line, without a header or with the header ``path``; every file then counts 1 byte.

    Paths are relative to the mount root (one leading ``/`` is ignored); CSV quoting applies to both
    formats, so quote a path that contains a comma. Blank lines are skipped.

    Returns:
        the :class:`Trace`.

    Raises:
        ValueError: a malformed row (the message names the line), a path given two different sizes,
            an unrecognised header, or no requests at all.
        OSError: the file cannot be read.
    """
    b = _Builder(path)
    with open(path, "r", newline="", **_ENCODING) as f:
        reader = csv.reader(f, strict=True)
        try:
            _read_rows(b, reader)
        except csv.Error as e:
            raise ValueError(f"{path}:{reader.line_num}: {e}") from None
    trace = b.trace()
    if trace.requests == 0:
        raise ValueError(f"{path}: the trace has no requests")
    return trace


def _read_rows(b: _Builder, reader) -> None:
    first = next((row for row in reader if row), None)
    if first is None:
        return
    header = [c.strip() for c in first]
    if "path" in header and "size_bytes" in header:
        _read_csv(b, reader, header)
    elif header == ["path"]:
        _read_paths(b, reader)
    elif len(first) == 1:
        b.add(reader.line_num, first[0], 1)
        _read_paths(b, reader)
    else:
        raise ValueError(f"{b.source}:{reader.line_num}: unrecognised header {','.join(first)!r}; expected "
                         f"{','.join(TRACE_HEADER)!r}, 'path', or one path per line")


def _rows(reader, width: int, source: str, want: str) -> Iterator[List[str]]:
    """The non-blank rows of ``reader``; ValueError naming the line for a row not ``width`` fields wide."""
    for row in reader:
        if len(row) != width:
            if not row:
                continue
            raise ValueError(f"{source}:{reader.line_num}: expected {want}, got {len(row)} fields")
        yield row


def _read_csv(b: _Builder, reader, header: List[str]) -> None:
    width = len(header)
    p_col, s_col = header.index("path"), header.index("size_bytes")
    t_col = header.index("time_s") if "time_s" in header else None
    index, sizes, append = b.index, b.sizes, b.ids.append
    for row in _rows(reader, width, b.source, f"{width} fields ({','.join(header)})"):
        try:
            size = int(row[s_col])
        except ValueError:
            raise ValueError(f"{b.source}:{reader.line_num}: size_bytes {row[s_col]!r} is not a whole number"
                             ) from None
        if t_col is not None:
            try:
                float(row[t_col])
            except ValueError:
                raise ValueError(f"{b.source}:{reader.line_num}: time_s {row[t_col]!r} is not a number") from None
        fid = index.get(row[p_col])
        if fid is None:
            fid = b.new(reader.line_num, row[p_col], size)
        elif sizes[fid] != size:
            b.mismatch(reader.line_num, fid, size)
        append(fid)


def _read_paths(b: _Builder, reader) -> None:
    index, append = b.index, b.ids.append
    for row in _rows(reader, 1, b.source, "one path per line (quote a path that contains a comma)"):
        fid = index.get(row[0])
        if fid is None:
            fid = b.new(reader.line_num, row[0], 1)
        append(fid)


# -- replay ----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Result:
    """The outcome of replaying one trace through one policy at one cache size.

    ``hit_ratio`` = hits / requests and ``byte_hit_ratio`` = hit_bytes / request_bytes (0.0 when the
    denominator is 0), as the daemon's stats define them.
    """

    policy: str
    cache_bytes: int
    hits: int
    requests: int
    hit_bytes: int
    request_bytes: int
    hit_ratio: float
    byte_hit_ratio: float
    residents: Optional[Tuple[str, ...]] = None  # the tier's files at the end (``residents=True``), sorted


def _result(policy: str, cache_bytes: int, hits: int, hit_bytes: int, trace: Trace,
            residents: Optional[Tuple[str, ...]] = None) -> Result:
    return Result(policy=policy, cache_bytes=cache_bytes, hits=hits, requests=trace.requests,
                  hit_bytes=hit_bytes, request_bytes=trace.request_bytes,
                  hit_ratio=hits / trace.requests if trace.requests else 0.0,
                  byte_hit_ratio=hit_bytes / trace.request_bytes if trace.request_bytes else 0.0,
                  residents=residents)


def _cache_bytes(cache_bytes: int) -> int:
    cache_bytes = int(cache_bytes)
    if cache_bytes < 0:
        raise ValueError(f"cache size must not be negative, got {cache_bytes}")
    return cache_bytes


def simulate(trace: Trace, policy_name: str, cache_bytes: int,
             importance: Optional[Importance] = None, pack_below: Optional[int] = None,
             block: int = 4096, residents: bool = False) -> Result:
    """Replay ``trace`` through one tier of ``cache_bytes`` run by the registered policy ``policy_name``.

    Exactly the daemon's single-tier read path, without data: an access to a resident file is a hit
    (``index.hit(fid)``); any other access is a miss, offered to the tier at once
    (``index.admit(fid, size)``, i.e. reserve + commit). The daemon's concurrent fills (single-flight)
    are sequential here. Files are numbered as the daemon numbers them (:attr:`Trace.namespace_ids`).
    ``policy_name`` ``"opt"`` runs :func:`belady` instead.

    Args:
        trace: the accesses.
        policy_name: a name from :func:`shadefs.policies.policy_names`, or ``"opt"``.
        cache_bytes: the tier's budget in bytes (0: no cache).
        importance: per-file importance indexed by trace id (``load_scores``), or None for the default
            1.0 everywhere. Copied, so policies never see each other's subscriptions.
        pack_below: replay the NVMe tier, whose entries take device bytes
            (:func:`shadefs.cache.tiers.entry_cost`: a record of 64 + size bytes below ``pack_below``,
            else whole ``block``-byte blocks); ``cache_bytes`` is then the tier's budget for entries (its
            ``entry_bytes`` in ``shadefs stats --json``: the size less metadata and segment slack).
            None: bytes as they are (the RAM tier).
        residents: also return the files resident at the end (``Result.residents``, sorted paths).

    Raises:
        PolicyError: unknown policy name, or ``opt`` with ``pack_below``.
        ValueError: negative cache size, or ``importance`` of a different length than the trace's files.
    """
    if policy_name == OPT and pack_below is not None:
        raise PolicyError("opt replays bytes as they are; it has no --disk-pack-below")
    if policy_name == OPT:
        return belady(trace, cache_bytes)
    cls = get_policy(policy_name)
    cache_bytes = _cache_bytes(cache_bytes)
    rank = trace.namespace_ids  # replay under the daemon's relative file order
    imp = Importance(trace.distinct_files)
    if importance is not None:
        if len(importance) != trace.distinct_files:
            raise ValueError(f"importance has {len(importance)} files, the trace {trace.distinct_files}")
        imp.values[rank] = importance.values
    index = TierIndex("ram" if pack_below is None else "disk", cache_bytes, cls(cache_bytes, imp))
    if pack_below is not None:
        index.charge = functools.partial(entry_cost, pack_below=int(pack_below), block=int(block))
    sizes = np.empty_like(trace.sizes)
    sizes[rank] = trace.sizes
    sizes = sizes.tolist()
    hits = hit_bytes = 0
    for fid in rank[trace.ids].tolist():
        if fid in index:
            index.hit(fid)
            hits += 1
            hit_bytes += sizes[fid]
        else:
            index.admit(fid, sizes[fid])
    kept = None
    if residents:
        path_of = np.empty(len(rank), dtype=np.int64)
        path_of[rank] = np.arange(len(rank))
        kept = tuple(sorted(trace.paths[int(path_of[f])] for f in index.sizes))
    return _result(cls.name, cache_bytes, hits, hit_bytes, trace, kept)


PLAN_SUFFIX = "+plan"
"""Results of :func:`simulate_plan` are named ``<policy>+plan``."""


def simulate_plan(trace: Trace, policy_name: str, cache_bytes: int,
                  importance: Optional[Importance] = None, hit_mask: Optional[np.ndarray] = None) -> Result:
    """Replay ``trace`` with its future known: the daemon's Belady-on-plan, reported as ``<policy>+plan``.

    The whole trace is announced as one plan (:class:`shadefs.plan.plans.PlanRegistry`) and the tier runs
    :class:`shadefs.plan.policy.PlanPolicy` around ``policy_name`` -- the classes the daemon runs when a
    training job announces its order. Each access first advances the plan's cursor (as the daemon's open
    does), then hits or is offered to the tier. With the whole future known it makes Belady's MIN
    decisions, so its hits equal :func:`belady`'s (tests check this); files the plan no longer names fall
    back to ``policy_name``.

    Chunk rows (``<file>/@chunk/<k>``: a large file's chunks, as the daemon traces them) are planned as the
    daemon plans them: the plan names their file, once per open of it (the rows of the chunks one open
    reads are back to back: a run of rows of one file, none repeated), the cursor advances at that open,
    and each chunk's next use is its file's next use. So a chunk that one epoch reads and the next does
    not is ranked by its file's next use, as the daemon ranks it, not by a future the daemon cannot know.

    Args and raises: as :func:`simulate`; ``hit_mask`` as :func:`belady`.
    """
    from .plan.plans import PlanRegistry
    from .plan.policy import PlanPolicy

    cls = get_policy(policy_name)
    cache_bytes = _cache_bytes(cache_bytes)
    rank = trace.namespace_ids
    imp = Importance(trace.distinct_files)
    if importance is not None:
        if len(importance) != trace.distinct_files:
            raise ValueError(f"importance has {len(importance)} files, the trace {trace.distinct_files}")
        imp.values[rank] = importance.values
    fids = rank[trace.ids]
    owners = _ChunkOwners.of(trace)
    if owners is None:  # every row a whole file: each one a use of the plan
        plans = PlanRegistry(trace.distinct_files)
        uses = fids
        starts = [True] * trace.requests
    else:  # chunk rows: the plan names their files, and a file's next use is the next use of its chunks
        plans = PlanRegistry(owners.num_ids)
        plans.aliases = owners
        starts = owners.use_starts(fids)
        uses = owners.owner_ids(fids)
    handle, _ = plans.register(None, np.arange(plans.num_files, dtype=np.int64))
    planned = uses[np.asarray(starts, dtype=bool)] if owners is not None else fids
    if len(planned):
        plans.announce(handle, 0, 0, [len(planned)], planned.astype(np.uint32))
    index = TierIndex("ram", cache_bytes, PlanPolicy(cls(cache_bytes, imp), plans))
    sizes = np.empty_like(trace.sizes)
    sizes[rank] = trace.sizes
    sizes = sizes.tolist()
    uses = uses.tolist()
    hits = hit_bytes = 0
    for i, fid in enumerate(fids.tolist()):
        if starts[i]:
            plans.observe(uses[i])  # the daemon observes a chunked file's open, before its chunks' opens
        if fid in index:
            index.hit(fid)
            hits += 1
            hit_bytes += sizes[fid]
            if hit_mask is not None:
                hit_mask[i] = True
        else:
            index.admit(fid, sizes[fid])
    return _result(cls.name + PLAN_SUFFIX, cache_bytes, hits, hit_bytes, trace)


class _ChunkOwners:
    """The chunk rows of a trace (``<file>/@chunk/<k>``) and the files they belong to, for a replay with
    a plan: the daemon's plans name files, and a chunk's next use is its file's
    (:class:`shadefs.cache.chunks.ChunkMap` in the daemon). Ids: the trace's entries in namespace order
    (``0 .. distinct_files - 1``), then one id per chunked file (``distinct_files ..``), which no row
    names. The ``owner_id``, ``owner_ids`` and ``alias_ids`` of a ChunkMap."""

    def __init__(self, owner: np.ndarray, members: Dict[int, range]):
        self.owner = owner          # id -> the id its plans name (itself unless a chunk); int64 (num_ids,)
        self.members = members      # chunked file's id -> its chunk rows' ids
        self.num_ids = len(owner)

    @classmethod
    def of(cls, trace: "Trace") -> Optional["_ChunkOwners"]:
        """None when no row is a chunk."""
        rank = trace.namespace_ids
        files: Dict[str, int] = {}
        owner = np.arange(trace.distinct_files, dtype=np.int64)
        members: Dict[int, list] = {}
        for t, p in enumerate(trace.paths):
            cut = p.rfind(CHUNK_MARK)
            if cut < 0:
                continue
            f = files.setdefault(p[:cut], trace.distinct_files + len(files))
            owner[rank[t]] = f
            members.setdefault(f, []).append(int(rank[t]))
        if not files:
            return None
        owner = np.concatenate([owner, np.arange(trace.distinct_files, trace.distinct_files + len(files),
                                                 dtype=np.int64)])
        return cls(owner, {f: tuple(sorted(ids)) for f, ids in members.items()})

    def owner_id(self, i: int) -> int:
        return int(self.owner[i])

    def owner_ids(self, ids: np.ndarray) -> np.ndarray:
        return self.owner[np.asarray(ids, dtype=np.int64)]

    def alias_ids(self, fid: int):
        return self.members.get(fid, ())

    def use_starts(self, ids: np.ndarray) -> List[bool]:
        """Per row: whether it starts a use of its file (an open). A whole file's row always does; a
        chunk row does unless the row before it is a chunk of the same file not yet read in that run
        (the chunks one open of a chunked file reads are traced back to back)."""
        out = []
        prev = -1
        seen: set = set()
        owner = self.owner
        for i in np.asarray(ids, dtype=np.int64).tolist():
            o = int(owner[i])
            if o == i:
                out.append(True)
                prev = -1
                continue
            if o != prev or i in seen:
                out.append(True)
                seen = {i}
            else:
                out.append(False)
                seen.add(i)
            prev = o
        return out


def next_use(ids: np.ndarray) -> np.ndarray:
    """For each access ``i``, the index of the next access to the same file, or ``len(ids)`` if none.

    One stable sort groups each file's accesses in trace order; each points at its successor.
    O(n log n) time, vectorised. Shape (n,) int64.
    """
    ids = np.asarray(ids, dtype=np.int64)
    n = ids.shape[0]
    out = np.full(n, n, dtype=np.int64)
    if n > 1:
        order = np.argsort(ids, kind="stable")
        same = ids[order[1:]] == ids[order[:-1]]
        out[order[:-1][same]] = order[1:][same]
    return out


def belady(trace: Trace, cache_bytes: int, hit_mask: Optional[np.ndarray] = None) -> Result:
    """Belady's MIN (OPT), offline, with bypass; reported as policy ``"opt"``.

    ``hit_mask``, if given (bool, shape (requests,)), is set True at every request OPT hits, for
    per-epoch or per-phase breakdowns.

    On a miss the file is admitted if it fits in the free bytes. Otherwise the cached files whose next
    use lies furthest in the future (never used again = infinitely far) are evicted, furthest first,
    until it fits -- unless the newcomer is itself never used again, or that would evict a file needed
    sooner than the newcomer: then the newcomer is not admitted (bypass) and nothing is evicted.
    Files larger than the cache are never admitted.

    For unit sizes this maximises hits (Belady, "A study of replacement algorithms for a virtual-storage
    computer", IBM Systems Journal 5(2), 1966; bypassing a newcomer that would be the furthest victim
    never loses a hit; the unit tests check optimality by exhaustive search). For files of
    different sizes it is the usual size-unaware heuristic, **not** optimal in hits nor in bytes
    (optimal variable-size caching is NP-hard; see Berger et al., "Practical Bounds on Optimal Caching
    with Variable Object Sizes", SIGMETRICS 2018). Read it as a strong reference, not a bound.

    O(n log n): next uses from :func:`next_use`, cached files in a max-heap keyed by next use with lazy
    invalidation (compacted when stale entries outnumber live ones).
    """
    cache_bytes = _cache_bytes(cache_bytes)
    if cache_bytes == 0:
        return _result(OPT, 0, 0, 0, trace)  # as TierIndex: capacity 0 turns the tier off
    n = trace.requests
    ids = trace.ids.tolist()
    nxt = next_use(trace.ids).tolist()
    sizes = trace.sizes.tolist()
    # Key of a cached file = the index of its next access, or n + fid when there is none (so keys are
    # unique ints and a key names its file: ids[key] or key - n). The heap holds -key.
    live: Dict[int, int] = {}  # cached fid -> its current key
    heap: List[int] = []
    free = cache_bytes
    hits = hit_bytes = 0
    for i in range(n):
        fid = ids[i]
        j = nxt[i]
        key = j if j < n else n + fid
        size = sizes[fid]
        if fid in live:
            hits += 1
            hit_bytes += size
            if hit_mask is not None:
                hit_mask[i] = True
            live[fid] = key
            heapq.heappush(heap, -key)
            if len(heap) > 2 * len(live) + 64:
                heap = [-k for k in live.values()]
                heapq.heapify(heap)
            continue
        if size > free:
            if j >= n or size > cache_bytes:
                continue  # never used again, or can never fit: bypass
            victims: List[int] = []
            freed = 0
            while free + freed < size:
                k = -heap[0]
                v = ids[k] if k < n else k - n
                if live.get(v) != k:
                    heapq.heappop(heap)  # stale: that file was hit (or evicted) since
                    continue
                if k < key:
                    break  # would evict a file needed sooner than the newcomer: bypass
                heapq.heappop(heap)
                victims.append(k)
                freed += sizes[v]
            if free + freed < size:
                for k in victims:
                    heapq.heappush(heap, -k)
                continue
            for k in victims:
                del live[ids[k] if k < n else k - n]
            free += freed
        live[fid] = key
        heapq.heappush(heap, -key)
        free -= size
    return _result(OPT, cache_bytes, hits, hit_bytes, trace)


# -- sweeps ----------------------------------------------------------------------------------------

def _policy_list(policies: Union[str, Sequence[str]]) -> List[str]:
    if isinstance(policies, str):
        policies = policy_names() if policies == "all" else [p.strip() for p in policies.split(",")]
    out: List[str] = []
    for name in policies:
        if name == "all":
            names = policy_names()
        else:
            if name != OPT:
                get_policy(name)  # raises PolicyError listing the valid names
            names = [name]
        out.extend(n for n in names if n != OPT and n not in out)
    return out


def run(trace: Trace, sizes: Sequence[Union[Size, str]], policies: Union[str, Sequence[str]] = "all",
        scores: Optional[Importance] = None, plan: bool = False, pack_below: Optional[int] = None) -> dict:
    """Replay ``trace`` for every cache size and policy, plus ``"opt"``.

    Args:
        trace: the accesses.
        sizes: cache sizes (:class:`~shadefs.config.Size` or text such as ``"10%"``, ``"64MiB"``);
            percentages are of ``trace.distinct_bytes``.
        policies: ``"all"`` (every registered policy), a name, a comma-separated list, or a list of
            names. ``"opt"`` (Belady) is always included, last at each size.
        scores: per-file importance (:func:`load_scores`) for importance-aware policies.
        plan: also replay every policy with the future known (:func:`simulate_plan`), as ``<policy>+plan``
            right after the policy itself.
        pack_below: replay the NVMe tier (see :func:`simulate`): the sizes are its budget for entries;
            Belady's OPT (bytes as they are) and ``plan`` are then left out.

    Returns:
        ``{"requests", "distinct_files", "distinct_bytes", "results": [{"policy", "cache_bytes",
        "hit_ratio", "byte_hit_ratio"}, ...]}``, results ordered by size (as given), then policy.

    Raises:
        PolicyError: an unknown policy name.
        ConfigError: a size text that does not parse.
    """
    names = _policy_list(policies) + ([OPT] if pack_below is None else [])
    caps = [(parse_size(s) if isinstance(s, str) else s).resolve(trace.distinct_bytes) for s in sizes]
    results = []
    for cap in caps:
        for name in names:
            runs = [simulate(trace, name, cap, scores, pack_below=pack_below)]
            if plan and name != OPT and pack_below is None:
                runs.append(simulate_plan(trace, name, cap, scores))
            for r in runs:
                results.append({"policy": r.policy, "cache_bytes": r.cache_bytes,
                                "hit_ratio": r.hit_ratio, "byte_hit_ratio": r.byte_hit_ratio})
    return {"requests": trace.requests, "distinct_files": trace.distinct_files,
            "distinct_bytes": trace.distinct_bytes, "results": results}


# -- scores files ------------------------------------------------------------------------------------

def write_scores(path: str, paths: Sequence[str], values: Sequence[float]) -> None:
    """Write a scores file: CSV, header ``path,importance``, one row per file.

    ``path`` is relative to the mount root, as in traces; ``importance`` is the file's value in the
    daemon's importance array (after the score transform), written with 9 significant digits, which
    round-trips float32 exactly. The file is replaced atomically (temporary file + rename).

    Raises:
        ValueError: lengths differ, or a value is not finite.
        OSError: the file cannot be written.
    """
    values = np.asarray(values, dtype=np.float32)
    if values.ndim != 1 or len(paths) != values.shape[0]:
        raise ValueError(f"{len(paths)} paths but {values.size} values")
    if not np.all(np.isfinite(values)):
        raise ValueError("scores must be finite")
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(SCORES_HEADER)
    w.writerows((p, f"{v:.9g}") for p, v in zip(paths, values.tolist()))
    atomic_write(path, buf.getvalue().encode(**_ENCODING), mode=0o644)


def read_scores(path: str) -> Dict[str, float]:
    """Read a scores file (:func:`write_scores`) into ``{path: importance}``; a repeated path takes its
    last value.

    Raises:
        ValueError: missing or wrong header, a malformed row or a non-finite value (with the line).
        OSError: the file cannot be read.
    """
    out: Dict[str, float] = {}
    with open(path, "r", newline="", **_ENCODING) as f:
        reader = csv.reader(f, strict=True)
        try:
            header = next((row for row in reader if row), None)
            if header is None or tuple(c.strip() for c in header) != SCORES_HEADER:
                raise ValueError(f"{path}:{reader.line_num}: expected the header {','.join(SCORES_HEADER)!r}")
            for row in _rows(reader, 2, path, "2 fields (path,importance)"):
                try:
                    value = float(row[1])
                except ValueError:
                    value = math.nan
                if not math.isfinite(value):
                    raise ValueError(f"{path}:{reader.line_num}: importance {row[1]!r} is not a finite number")
                p = normalize(row[0])
                out[p if p else row[0]] = value
        except csv.Error as e:
            raise ValueError(f"{path}:{reader.line_num}: {e}") from None
    return out


def load_scores(path: str, trace: Trace) -> Importance:
    """Importance per trace file id from a scores file: paths not in the trace are ignored, trace paths
    not in the file weigh 1.0 (the default of a never-scored sample).

    Raises:
        ValueError, OSError: as :func:`read_scores`.
    """
    return scores_to_importance(read_scores(path), trace)


def scores_to_importance(scores: Dict[str, float], trace: Trace) -> Importance:
    """Importance per trace file id from ``{path: importance}``; unlisted trace paths weigh 1.0. A
    chunk of a large file (``<file>/@chunk/<k>``, as the daemon traces it) weighs what its file weighs."""
    imp = Importance(trace.distinct_files)
    for fid, p in enumerate(trace.paths):
        v = scores.get(p)
        if v is None and CHUNK_MARK in p:
            v = scores.get(p[:p.rindex(CHUNK_MARK)])
        if v is not None:
            imp.values[fid] = v
    return imp


# -- output ----------------------------------------------------------------------------------------

def _size_label(cache_bytes: int, total: int) -> str:
    label = format_bytes(cache_bytes)
    return f"{label} ({100.0 * cache_bytes / total:.1f}%)" if total > 0 else label


def format_table(result: dict) -> str:
    """A fixed-width table of a :func:`run` result: policy, cache size (and % of the distinct bytes),
    hit ratio %, byte hit ratio %; a summary line of the trace first."""
    total = result["distinct_bytes"]
    rows = [(r["policy"], _size_label(r["cache_bytes"], total),
             f"{100.0 * r['hit_ratio']:.2f}", f"{100.0 * r['byte_hit_ratio']:.2f}")
            for r in result["results"]]
    head = ("policy", "cache size", "hit ratio %", "byte hit ratio %")
    w = [max([len(head[c])] + [len(r[c]) for r in rows]) for c in range(4)]
    fmt = f"{{:<{w[0]}}}  {{:>{w[1]}}}  {{:>{w[2]}}}  {{:>{w[3]}}}"
    lines = [f"trace: {result['requests']} requests, {result['distinct_files']} distinct files, "
             f"{format_bytes(total)} distinct",
             fmt.format(*head)]
    lines += [fmt.format(*r) for r in rows]
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    """Write a PNG of hit ratio vs cache size, one line per policy (``opt`` dashed).

    Uses matplotlib's Agg canvas directly (no pyplot, no global backend switch).

    Raises:
        ImportError: matplotlib is not installed (``pip install 'shadefs[plot]'``).
        OSError: the file cannot be written.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'shadefs[plot]'") from None
    total = result["distinct_bytes"]
    lines: Dict[str, List[Tuple[float, float]]] = {}
    for r in result["results"]:
        x = 100.0 * r["cache_bytes"] / total if total > 0 else r["cache_bytes"]
        lines.setdefault(r["policy"], []).append((x, 100.0 * r["hit_ratio"]))
    fig = Figure(figsize=(6.4, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for name, pts in lines.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name,
                linestyle="--" if name == OPT else "-", color="black" if name == OPT else None)
    ax.set_xlabel("cache size (% of distinct bytes)" if total > 0 else "cache size (bytes)")
    ax.set_ylabel("hit ratio (%)")
    ax.set_title(f"{result['requests']} requests, {result['distinct_files']} files")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# -- command line ------------------------------------------------------------------------------------

def add_simulate_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register the options of ``shadefs simulate`` on ``parser`` (for :func:`main_simulate`)."""
    parser.add_argument("trace", metavar="TRACE",
                        help="access trace: CSV from 'shadefs mount --trace' (time_s,path,size_bytes,outcome) "
                             "or one path per line (every file then counts 1 byte)")
    parser.add_argument("--cache-size", action="append", required=True, metavar="SIZE",
                        help="cache size: bytes with a unit (512MiB, 2GiB) or a percentage of the trace's "
                             "distinct bytes (10%%); repeat for several")
    parser.add_argument("--policy", default="all", metavar="NAME|all",
                        help="policy to replay, a comma-separated list, or 'all' (default); "
                             "Belady's OPT is always reported as 'opt'")
    parser.add_argument("--disk-pack-below", metavar="SIZE",
                        help="replay the NVMe tier of a mount with this --disk-pack-below (its default is "
                             "64KiB; 0: no packing): each file is charged its device bytes (a record of 64 + "
                             "its bytes and an eighth of both below SIZE, else whole 4 KiB blocks), and "
                             "--cache-size is the tier's budget for entries (entry_bytes in 'shadefs stats "
                             "--json': its size less metadata and segment slack); opt is not replayed")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--plot", metavar="FILE.png", help="also write a plot of hit ratio vs cache size")
    parser.add_argument("--scores", metavar="FILE",
                        help="importance per file (CSV path,importance, as the daemon writes it) for "
                             "importance-aware policies; unlisted files weigh 1.0")
    parser.add_argument("--plan", action="store_true",
                        help="also replay each policy with the trace's future known, as a training job "
                             "announcing its order makes the daemon do (Belady on the plan); reported as "
                             "POLICY+plan")
    return parser


def _in_words(what: str, path: str, e: BaseException) -> str:
    """One line naming the input (``what``, the file ``path`` if it is one) and the problem in words: an
    OSError's strerror, not ``[Errno 2] ...``; a message that names its file and line already is kept."""
    if isinstance(e, OSError):
        return f"cannot {'write' if what.startswith('--plot') else 'read'} {what}: {e.strerror or e}"
    text = str(e)
    if path and text.startswith(path):
        return text  # "PATH:LINE: problem"
    return f"{what}: {text.split(': ', 1)[-1] if text.startswith('invalid size') else text}"


def main_simulate(args: argparse.Namespace) -> int:
    """Run ``shadefs simulate``: print the table (or JSON) and return 0; on bad input print one line
    to stderr and return 2."""
    what, path = "--cache-size", ""
    try:
        sizes = []
        for text in args.cache_size:
            what = f"--cache-size {text!r}"
            sizes.append(parse_size(text))
        what = "--policy"
        policies = _policy_list(args.policy)
        what, path = f"the trace {args.trace!r}", args.trace
        trace = read_trace(args.trace)
        scores = None
        if args.scores:
            what, path = f"--scores {args.scores!r}", args.scores
            scored = read_scores(args.scores)
            if scored and not any(p in scored for p in trace.paths):
                print(f"shadefs simulate: warning: no path in {args.scores} occurs in the trace; "
                      f"every file weighs 1.0", file=sys.stderr)
            scores = scores_to_importance(scored, trace)
        pack_below = None
        if getattr(args, "disk_pack_below", None) is not None:
            what, path = f"--disk-pack-below {args.disk_pack_below!r}", ""
            pb = parse_size(args.disk_pack_below)
            if pb.nbytes is None or pb.nbytes % 4096:
                raise ValueError("a byte size, a multiple of 4 KiB (e.g. 64KiB, or 0)")
            pack_below = pb.nbytes
        what, path = "the replay", ""
        result = run(trace, sizes, policies, scores, plan=getattr(args, "plan", False), pack_below=pack_below)
        if args.plot:
            what, path = f"--plot {args.plot!r}", args.plot
            plot(result, args.plot)
    except (ValueError, OSError, ImportError) as e:
        print(f"shadefs simulate: error: {_in_words(what, path, e)}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0
