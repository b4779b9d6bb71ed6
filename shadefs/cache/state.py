"""The per-file state of the read path: one table of typed records and the named transitions between them.

Every file of the namespace is in exactly one :class:`FileState` at every instant (docs/architecture.md,
"The per-file state machine"); the state is not stored twice but read from where the file's bytes are:

- ``absent``: no record in :attr:`StateTable.flights`, in neither tier;
- ``fetching``: a :class:`Fetch` record in :attr:`StateTable.flights` (bytes reserved in one tier, or in
  the loose working set, or in none: read whole to serve and offer to the group);
- ``ram``: in the RAM store (``MemoryTier``; its index holds exactly the store's files);
- ``disk``: in the disk index (one entry file, or one record in a segment);
- ``moving``: a :class:`Move` record in :attr:`StateTable.flights` (a RAM victim's bytes, on their way to
  the disk tier by the mover).

A disk entry a file leaves (a disk victim, a promotion, an entry found corrupt, a file changed at the
source) is a :class:`DyingEntry` (entry state ``deleting``): its bytes stay counted in the disk budget
until the mover unlinks it (:meth:`StateTable.entry_unlinked`); the file itself is already in its next
state.

Each transition is one method of :class:`StateTable`, called under the cache lock (dict and index updates
only, no I/O); it checks that the file is in one of the transition's source states
(:data:`TRANSITIONS`) and raises :class:`IllegalTransition` otherwise. What the design rules out by
construction:

- **a victim never waits for another file's read**: :meth:`StateTable.begin_move` is called in the
  critical section that evicts the victim and its :class:`Move` is handed to the mover before that read
  starts; a :class:`Move` has nothing to wait on (no event): an open of a moving file is served from
  ``Move.data`` (a RAM hit);
- **no reader thread writes or unlinks for another file**: a :class:`Move` and a :class:`DyingEntry` are
  only ever consumed by :class:`shadefs.cache.movers.Mover`;
- **every open has exactly one outcome**: a :class:`Fetch` says where its bytes came from (its
  ``source``: :data:`SOURCE_BACKEND`, :data:`SOURCE_SHARED` or :data:`SOURCE_WINDOW`), never an
  outcome; the outcome of an open that led it and of one that joined it are looked up in
  :data:`LEADER_OUTCOME` and :data:`JOINER_OUTCOME`, which map every source.
"""
from __future__ import annotations

import enum
import threading
from typing import Dict, NamedTuple, Optional

from .counters import Outcome

__all__ = ["FileState", "Pin", "Fetch", "Move", "DyingEntry", "StateTable", "IllegalTransition", "TRANSITIONS",
           "ENTRY_TRANSITIONS", "PIN_TIER", "PIN_DYING", "PIN_LOOSE", "SOURCE_BACKEND", "SOURCE_SHARED",
           "SOURCE_WINDOW", "LEADER_OUTCOME", "JOINER_OUTCOME"]


class FileState(str, enum.Enum):
    """The state of one file (the value is what :meth:`shadefs.cache.core.TieredCache.state` returns)."""

    ABSENT = "absent"
    FETCHING = "fetching"
    RAM = "ram"
    DISK = "disk"
    MOVING = "moving"


ABSENT, FETCHING, RAM, DISK, MOVING = (FileState.ABSENT, FileState.FETCHING, FileState.RAM, FileState.DISK,
                                       FileState.MOVING)

# transition name -> (source states, target states). The one list of the state machine: the methods of
# StateTable below are exactly these names, and docs/architecture.md draws exactly this table
# (tests/unit/test_state_table.py compares the three).
TRANSITIONS: Dict[str, tuple] = {
    "begin_fetch": ((ABSENT,), (FETCHING,)),        # a miss (or a read ahead) reserved a tier, or none
    "commit_fetch": ((FETCHING,), (RAM, DISK)),     # the bytes are in the tier that reserved them
    "release_fetch": ((FETCHING,), (ABSENT,)),      # read whole, kept by no tier (served from the buffer)
    "abort_fetch": ((FETCHING,), (ABSENT,)),        # the read failed (every waiter gets its error)
    "begin_move": ((RAM,), (MOVING,)),              # a RAM victim a lower tier may take
    "commit_move": ((MOVING,), (DISK,)),            # the mover wrote it to the disk tier
    "drop_move": ((MOVING,), (ABSENT,)),            # the disk tier refused it, its write failed, no queue room
    "evict_ram": ((RAM,), (ABSENT,)),               # a RAM victim no lower tier takes (or no room to move it)
    "promote": ((DISK,), (RAM,)),                   # a disk hit RAM admits: its old entry -> deleting
    "evict_disk": ((DISK,), (ABSENT,)),             # a disk victim: its entry -> deleting
    "drop_entry": ((DISK,), (ABSENT,)),             # its entry is corrupt, or the source changed: -> deleting
}
# the entry files a file left: deleting until the mover unlinks them
ENTRY_TRANSITIONS: Dict[str, tuple] = {
    "entry_unlinked": (("deleting",), ("gone",)),
}

# where the bytes of a RAM buffer record (Pin) are counted
PIN_TIER, PIN_DYING, PIN_LOOSE = 0, 1, 2  # the tier's own (resident), the RAM index's dying bytes, loose

# where a fetch's bytes came from
SOURCE_BACKEND = "backend"   # read from the backend by this fetch
SOURCE_SHARED = "shared"     # the group's shared tier held them
SOURCE_WINDOW = "window"     # the plan prefetcher's window held them (its open was counted ready or late)
# the outcome of the open that led a fetch (a window fetch's open is counted before it leads it) ...
LEADER_OUTCOME = {SOURCE_BACKEND: Outcome.MISS, SOURCE_SHARED: Outcome.SHARED}
# ... and of an open that waited for it: a backend or group read it shared (a miss, counted ``joined``, or a
# shared hit), or the admission of prefetched bytes (it waited for a prefetch: ``late``)
JOINER_OUTCOME = {SOURCE_BACKEND: Outcome.MISS, SOURCE_SHARED: Outcome.SHARED, SOURCE_WINDOW: Outcome.LATE}


class IllegalTransition(RuntimeError):
    """A transition was asked of a file in none of its source states (a bug; the table is unchanged)."""


class Pin:
    """A RAM buffer that open handles (and a :class:`Move`) hold: ``refs`` holders of ``size`` bytes of
    file ``fid``, counted ``where`` (:data:`PIN_TIER`: in the tier, as a resident; :data:`PIN_DYING`: out
    of it, in the RAM index's dying bytes; :data:`PIN_LOOSE`: out of it, against ``LOOSE_BUFFERS``)."""

    __slots__ = ("refs", "size", "where", "fid")

    def __init__(self, refs: int, size: int, where: int, fid: int):
        self.refs = refs
        self.size = size
        self.where = where
        self.fid = fid


class Fetch:
    """A file in state ``fetching``: one leader reads it, every other open waits on :attr:`done`.

    Attributes:
        tier: where the bytes go: ``"ram"``, ``"disk"`` (reserved there), ``"memory"`` (a buffer no tier
            keeps); once done: where they ended, ``"ram"``, ``"disk"`` or None (no tier).
        source: where the bytes came from (:data:`SOURCE_BACKEND`, :data:`SOURCE_SHARED`,
            :data:`SOURCE_WINDOW`).
        data: the bytes once read (the RAM tier's own, or a buffer waiting opens are served from).
        error: the exception the read raised (every waiter raises it).
        gen, csum: the disk entry written (``"disk"``).
        reservation: ``"disk"``: (generation, the victims' :class:`DyingEntry` records).
        loose: bytes reserved in the loose working set for the first handle (``"memory"``).
    """

    __slots__ = ("tier", "data", "error", "source", "gen", "csum", "reservation", "loose", "done")
    kind = "fetch"

    def __init__(self, tier: str, source: str = SOURCE_BACKEND):
        self.tier: Optional[str] = tier
        self.source = source
        self.data: Optional[bytes] = None
        self.error: Optional[BaseException] = None
        self.gen = 0
        self.csum = 0
        self.reservation = None
        self.loose = 0
        self.done = threading.Event()


class Move:
    """A file in state ``moving``: a RAM victim's bytes (``data``, held by one ref on ``pin``) on their way
    to the disk tier. Nothing waits for it: an open of it is served from ``data``."""

    __slots__ = ("data", "pin")
    kind = "demote"

    def __init__(self, data: bytes, pin: Pin):
        self.data = data
        self.pin = pin


class DyingEntry(NamedTuple):
    """A disk entry a file left (``deleting``): generation ``gen`` (checksum ``csum``) of file ``fid``'s
    entry, ``size`` bytes still counted in the disk tier's budget until it is unlinked."""

    fid: int
    gen: int
    csum: int
    size: int


class StateTable:
    """The per-file state of one mount: the records and the transitions of :data:`TRANSITIONS`.

    Every method runs under the cache lock. Args: ``ram_index``, ``ram_data`` (the RAM store's dict),
    ``disk_index``, ``entries`` (the disk tier's generation/checksum table, or None) and ``verified`` (per
    file: its resident generation passed its checksum)."""

    def __init__(self, ram_index, ram_data: dict, disk_index=None, entries=None, verified=None):
        self.ram_index = ram_index
        self.ram_data = ram_data
        self.disk_index = disk_index
        self.entries = entries
        self.verified = verified
        self.flights: Dict[int, object] = {}   # fid -> Fetch | Move
        # RAM buffers open handles hold: fid -> Pin (PIN_TIER while resident); out of the tier (evicted while
        # held, or moving), a record is in ``held`` (id -> Pin) until its last ref goes
        self.pins: Dict[int, Pin] = {}
        self.held: Dict[int, Pin] = {}

    # -- reading the state ------------------------------------------------------------------------------
    def state(self, fid: int) -> FileState:
        fl = self.flights.get(fid)
        if fl is not None:
            return FETCHING if fl.kind == "fetch" else MOVING
        if fid in self.ram_data:
            return RAM
        if self.disk_index is not None and fid in self.disk_index:
            return DISK
        return ABSENT

    def _check(self, fid: int, name: str, state: Optional[FileState] = None) -> None:
        state = self.state(fid) if state is None else state
        if state not in TRANSITIONS[name][0]:
            raise IllegalTransition(f"{name} of file {fid} in state {state.value}")

    def _dying(self, fid: int, size: int) -> DyingEntry:
        return DyingEntry(fid, int(self.entries.gen[fid]), int(self.entries.csum[fid]), size)

    # -- fetching ---------------------------------------------------------------------------------------
    def begin_fetch(self, fid: int, tier: str, source: str = SOURCE_BACKEND) -> Fetch:
        """absent -> fetching: ``tier`` is reserved (``"ram"``, ``"disk"``) or none keeps it (``"memory"``)."""
        self._check(fid, "begin_fetch")
        fl = self.flights[fid] = Fetch(tier, source)
        return fl

    def commit_fetch(self, fid: int, fl: Fetch, data: Optional[bytes], ram_store=None, gen: int = 0,
                     csum: int = 0) -> None:
        """fetching -> resident(ram) (``ram_store.put``) or resident(disk) (generation ``gen``, checksum
        ``csum``), as ``fl.tier`` reserved; ``data``: the bytes waiting opens are served from."""
        if self.flights.get(fid) is not fl:
            raise IllegalTransition(f"commit_fetch of file {fid}: not its fetch")
        del self.flights[fid]
        if fl.tier == "ram":
            ram_store.put(fid, data)
            self.ram_index.commit(fid)
        elif fl.tier == "disk":
            self.disk_index.commit(fid)
            self.entries.gen[fid] = gen
            self.entries.csum[fid] = csum
            self.verified[fid] = False  # written, not yet read back: its first hit verifies it
            fl.gen, fl.csum = gen, csum
        else:
            raise IllegalTransition(f"commit_fetch of file {fid} into tier {fl.tier}")
        fl.data = data

    def release_fetch(self, fid: int, fl: Fetch, data: Optional[bytes]) -> None:
        """fetching -> absent: read whole (``data``), kept by no tier; waiting opens are served from it.
        A disk reservation whose write failed is aborted here."""
        if self.flights.get(fid) is not fl:
            raise IllegalTransition(f"release_fetch of file {fid}: not its fetch")
        del self.flights[fid]
        if fl.tier == "disk":
            self.disk_index.abort(fid)
        fl.tier = None
        fl.data = data

    def abort_fetch(self, fid: int, fl: Fetch) -> None:
        """fetching -> absent: the read failed; the reservation is released."""
        if fl.tier == "ram":
            self.ram_index.abort(fid)
        elif fl.tier == "disk":
            self.disk_index.abort(fid)
        if self.flights.get(fid) is fl:
            del self.flights[fid]
        fl.tier = None

    # -- RAM victims ------------------------------------------------------------------------------------
    def begin_move(self, fid: int, data: bytes, pin: Pin) -> Move:
        """resident(ram) -> moving: a RAM victim (just out of the RAM index) whose bytes ``data`` (held by
        ``pin``, which the move takes one ref on) go to the mover. The caller pops it from the store."""
        self._check(fid, "begin_move")
        pin.refs += 1
        mv = self.flights[fid] = Move(data, pin)
        return mv

    def commit_move(self, fid: int, mv: Move, gen: int, csum: int) -> None:
        """moving -> resident(disk): the mover wrote generation ``gen`` (checksum ``csum``)."""
        if self.flights.get(fid) is not mv:
            raise IllegalTransition(f"commit_move of file {fid}: not its move")
        del self.flights[fid]
        self.disk_index.commit(fid)
        self.entries.gen[fid] = gen
        self.entries.csum[fid] = csum
        self.verified[fid] = False

    def drop_move(self, fid: int, mv: Move) -> None:
        """moving -> absent: the disk tier refused it, its write failed, or the mover had no room for it."""
        if self.flights.get(fid) is not mv:
            raise IllegalTransition(f"drop_move of file {fid}: not its move")
        del self.flights[fid]

    def evict_ram(self, fid: int) -> None:
        """resident(ram) -> absent: a RAM victim (just out of the RAM index) that no lower tier takes. The
        caller pops it from the store."""
        self._check(fid, "evict_ram")

    # -- disk entries ------------------------------------------------------------------------------------
    def promote(self, fid: int, size: int, data: bytes, ram_store) -> DyingEntry:
        """resident(disk) -> resident(ram) (RAM reserved its ``size`` bytes): the old entry is deleting."""
        self._check(fid, "promote")
        old = self._dying(fid, size)
        self.disk_index.remove(fid, dying=True)
        ram_store.put(fid, data)
        self.ram_index.commit(fid)
        return old

    def evict_disk(self, fid: int) -> DyingEntry:
        """resident(disk) -> absent: a disk victim (the disk index's ``reserve`` took it out); its entry
        is deleting (its bytes credited to the fill that evicted it, so ``size`` 0)."""
        state = self.state(fid)
        if state is DISK or (state is not ABSENT and state not in TRANSITIONS["evict_disk"][0]):
            # a victim is out of the disk index already (the reserve that chose it), and in no other record
            raise IllegalTransition(f"evict_disk of file {fid} in state {state.value}")
        return self._dying(fid, 0)

    def drop_entry(self, fid: int, size: int) -> DyingEntry:
        """resident(disk) -> absent: its entry is corrupt, or the source changed; the entry (``size``
        bytes, still counted) is deleting."""
        self._check(fid, "drop_entry")
        old = self._dying(fid, size)
        self.disk_index.remove(fid, dying=True)
        return old

    def entry_unlinked(self, entry: DyingEntry) -> None:
        """deleting -> gone: the entry's file is unlinked; its bytes leave the budget (a disk victim's were
        credited to its fill: ``size`` 0)."""
        if entry.size:
            self.disk_index.unlinked(entry.size)
