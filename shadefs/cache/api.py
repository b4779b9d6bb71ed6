"""What the FUSE front ends call on the cache: :class:`CacheAPI`, exactly that, and nothing else.

:class:`~shadefs.cache.core.TieredCache` implements it; the front ends (:mod:`shadefs.fuse.kernel` and its
parts, :mod:`shadefs.fuse.libfuse_ops`) call it directly, never probing for a method. A source with no tiers
(a test's or a benchmark's stand-in for the cache, e.g. :class:`shadefs.testing.gated.GatedCache`) derives
from :class:`BareCache`, which answers everything beyond ``open``/``open_nowait`` as a cache that holds
nothing would.

``opener``, wherever it appears: the pid of the process whose open this is (the FUSE request's ``pid``),
which the plans follow (:meth:`PlanRegistry.observe <shadefs.plan.plans.PlanRegistry.observe>`); None:
unknown (every plan follows it).
"""
from __future__ import annotations

from typing import Callable, List, Optional, Protocol, Union

from ..procutil import FdReserve
from .handle import Handle, OpenTicket

__all__ = ["CacheAPI", "BareCache"]

#: ``hook(file id, entry generation)``: called after that generation of the file's disk entry is unlinked
#: (``entry_unlinked``) or dropped as corrupt (``entry_dropped``)
EntryHook = Callable[[int, int], None]


class CacheAPI(Protocol):
    """The cache as the FUSE front ends see it.

    Attributes:
        backend: the backend the cache reads (the kernel front end serves misses on the reader where its
            ``scheme`` is ``"file"``), or None.
        opens_source: whether the backend opens source files (passthrough to the source is possible).
        disk: the NVMe tier (a :class:`~shadefs.cache.tiers.DiskTier`), or None: with none, passthrough is
            asked for only for the source file.
        verify_entries: ``"every-open"`` or ``"first-hit"`` (``--verify-entries``): only under
            ``first-hit`` may a kept backing id be reused by :meth:`open_kept`.
        source_passthrough: ``"off"``, ``"untiered"`` or ``"large"``: what the kernel front end granted at
            INIT (it sets it).
        entry_unlinked, entry_dropped: lists of :data:`EntryHook` the front end appends to at INIT.
        prefetcher: the plan prefetcher (:class:`~shadefs.plan.prefetch.Prefetcher`), or None; the kernel
            front end sets its ``page_probe`` and ``page_open``.
        fds: the daemon's descriptor reserve (``hold`` a source file's fd for an open's handle).
        rechecks: whether some file records of a reused snapshot are still to be compared with the source
            (:meth:`unchecked`, :meth:`recheck`); False for a fresh snapshot.
    """

    backend: object
    opens_source: bool
    disk: Optional[object]
    verify_entries: str
    source_passthrough: str
    entry_unlinked: List[EntryHook]
    entry_dropped: List[EntryHook]
    prefetcher: Optional[object]
    fds: FdReserve
    rechecks: bool

    def open(self, fid: int, opener: Optional[int] = None) -> Handle:
        """Open file ``fid``, counted once; may block on the backend. Raises FileNotFoundError, OSError."""

    def open_nowait(self, fid: int, ticket: bool = False,
                    opener: Optional[int] = None) -> Union[Handle, OpenTicket, None]:
        """A hit's handle, counted; else None (``ticket``: an :class:`OpenTicket` to serve with
        :meth:`open_ticket` on a thread that may block). Never blocks on the backend."""

    def open_ticket(self, t: OpenTicket) -> Handle:
        """Serve the open ``t`` names (exactly once; may block). Raises as :meth:`open`."""

    def open_kept(self, fid: int, gen: int, opener: Optional[int] = None) -> Optional[Handle]:
        """An NVMe hit of generation ``gen`` of ``fid``'s entry, whose file the caller keeps open (a backing
        id), counted without opening the entry; None (nothing counted) when that is not possible."""

    def unchecked(self, fid: int) -> bool:
        """Whether ``fid``'s record came from a reused snapshot and was not compared with the source."""

    def recheck(self, fid: int) -> bool:
        """Compare ``fid``'s record with the source (one stat); True if it changed. Raises OSError."""

    def source_fd(self, h: Handle) -> Optional[int]:
        """An fd of the source file for open ``h`` to be answered by passthrough to it, or None."""

    def source_opened(self, h: Handle) -> None:
        """``h``'s open was answered by passthrough to the source file: count it."""

    def attach_residents(self, residents) -> bool:
        """Publish RAM hits to ``residents`` (the compiled loop's table); False when the cache never does."""

    def apply_hits(self) -> None:
        """Apply the RAM hits the compiled loop logged (thread-safe; never raises)."""


class BareCache:
    """The :class:`CacheAPI` of a cache that holds nothing: a subclass implements ``open_nowait(fid,
    ticket=False, opener=None)`` (a handle, or None to be opened on a worker) and ``open(fid, opener=None)``;
    it gets no tickets, no kept or source passthrough, no rechecks, no residents."""

    backend = None
    opens_source = False
    disk = None
    verify_entries = "every-open"
    source_passthrough = "off"
    prefetcher = None
    rechecks = False

    def __init__(self):
        self.entry_unlinked: List[EntryHook] = []
        self.entry_dropped: List[EntryHook] = []
        self.fds = FdReserve()

    def open_ticket(self, t: OpenTicket) -> Handle:
        raise ValueError(f"ticket for file {t.fid}: this cache issues none")

    def open_kept(self, fid: int, gen: int, opener: Optional[int] = None) -> Optional[Handle]:
        return None

    def unchecked(self, fid: int) -> bool:
        return False

    def recheck(self, fid: int) -> bool:
        return False

    def source_fd(self, h: Handle) -> Optional[int]:
        return None

    def source_opened(self, h: Handle) -> None:
        pass

    def attach_residents(self, residents) -> bool:
        return False

    def apply_hits(self) -> None:
        pass
