"""The read path's counters: every open counted under exactly one outcome, and the tier and backend figures.

All fields are updated and read under the cache lock (:mod:`shadefs.metrics` and the stats JSON read one
consistent snapshot). An outcome is one of :data:`OUTCOMES`; :meth:`OpenCounters.count` refuses any other
string (a ValueError), so no open can be counted under none: ``opens == hits_ram + hits_disk + hits_shared
+ misses + ready + late`` (``ready`` and ``late`` are the prefetcher's own counters of the ``"prefetch"``
and ``"late"`` outcomes).
"""
from __future__ import annotations

import enum

__all__ = ["OpenCounters", "Outcome", "OUTCOMES", "COUNTER_NAMES", "RAM", "DISK", "SHARED", "MISS", "PREFETCH",
           "LATE"]


class Outcome(str, enum.Enum):
    """The one outcome every open is counted under (:meth:`OpenCounters.count`). A ``str``: the value is
    what the counters, the stats JSON and the trace say (``Outcome.RAM == "ram"``, ``str(Outcome.RAM) ==
    "ram"``)."""

    RAM = "ram"            # a hit of the RAM tier (or of a RAM victim's bytes still in memory)
    DISK = "disk"          # a hit of the NVMe tier
    SHARED = "shared"      # the group's shared tier served it
    MISS = "miss"          # the backend served it (a fetch led or joined, or a stream)
    PREFETCH = "prefetch"  # a completed read ahead was taken (the prefetcher counts it ``ready``)
    LATE = "late"          # it waited for a read ahead in flight (the prefetcher counts it ``late``)

    __str__ = str.__str__        # the value, as a plain string would print: the trace's CSV, log lines
    __format__ = str.__format__


# the members as module constants, for the read path: reading an Enum class's attribute costs ~80 ns (its
# metaclass), a module global a few
RAM, DISK, SHARED, MISS, PREFETCH, LATE = (Outcome.RAM, Outcome.DISK, Outcome.SHARED, Outcome.MISS,
                                           Outcome.PREFETCH, Outcome.LATE)

# an open's outcome: a hit of one tier, a miss, a completed prefetch taken ("prefetch", counted ready by the
# prefetcher) or a prefetch waited for ("late")
OUTCOMES = tuple(Outcome)

COUNTER_NAMES = (
    "opens", "hits_ram", "hits_disk", "hits_shared", "misses",
    "joined",               # misses that waited for another open's backend read
    "streamed",             # misses no tier admitted: served by ranges
    "backend_reads",        # whole-file backend reads (fills)
    "range_reads",          # backend reads of one range (streamed files)
    "open_bytes", "hit_bytes", "backend_bytes", "backend_errors", "corrupt_entries",
    "disk_write_errors",
    "disk_writes_refused",  # refused by --disk-min-free, or compaction behind (not an error)
    "promotions", "demotions",
    "entry_loads",          # disk entries read whole into memory (disk hits the RAM tier would admit)
    "demotions_skipped",    # RAM victims not demoted: no loose room, or no room in the mover's queue
    "loose_refused",        # opens with bytes in hand served by ranges: no loose room
    "source_changes",       # files a reused snapshot described before they changed (recheck)
    "source_opens",         # opens answered by FUSE passthrough to the source file (counted misses, streamed)
    # source files opened and checked for such an open (source_opens of them given to the kernel; the
    # rest found the file's mode taken by another open meanwhile, and were closed)
    "source_checks",
    # bytes the kernel may read from the source file by passthrough: the file's size at each such open
    # (the daemon reads none of them: not in backend_bytes)
    "source_passthrough_bytes",
)

class OpenCounters:
    """The counters of one mount (:data:`COUNTER_NAMES`, all ints, bytes where named so)."""

    __slots__ = COUNTER_NAMES

    def __init__(self):
        for name in COUNTER_NAMES:
            setattr(self, name, 0)

    def count(self, outcome: Outcome, size: int) -> None:
        """One open of ``size`` bytes counted ``outcome`` (an :class:`Outcome`, or its value; ValueError otherwise,
        nothing counted). ``"prefetch"`` and ``"late"`` raise only ``opens`` here: the prefetcher counts
        them (ready, late)."""
        if outcome == "ram":
            self.hits_ram += 1
            self.hit_bytes += size
        elif outcome == "disk":
            self.hits_disk += 1
            self.hit_bytes += size
        elif outcome == "miss":
            self.misses += 1
        elif outcome == "shared":
            self.hits_shared += 1
            self.hit_bytes += size
        elif outcome != "prefetch" and outcome != "late":
            raise ValueError(f"no such outcome: {outcome!r}")
        self.opens += 1
        self.open_bytes += size

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in COUNTER_NAMES}
