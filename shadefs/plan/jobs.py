"""Which job an open belongs to: the process the FUSE request names (its opener, handed with the open to
:meth:`PlanRegistry.observe <shadefs.plan.plans.PlanRegistry.observe>`) and the processes it descends from (:func:`ancestry`, read from ``/proc``), matched to the job that announced
a plan (:class:`JobKey`: a pid and its start time, so a reused pid is not taken for the job)."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple


__all__ = ["JobKey", "ancestry", "proc_start_time"]


@dataclasses.dataclass(frozen=True)
class JobKey:
    """The job a plan belongs to: its announcing process (``pid`` in the daemon's pid namespace) and that
    process's start time (clock ticks after boot, ``/proc/PID/stat`` field 22), which tells it apart from
    a later process given the same pid. Its opens are its own and those of its descendants (DataLoader
    workers, a forkserver's children)."""

    pid: int
    start: int


def proc_start_time(pid: int) -> Optional[int]:
    """``pid``'s start time (``/proc/PID/stat`` field 22, clock ticks after boot), or None if there is no
    such process (or no ``/proc``)."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _tgid_and_ppid(pid: int) -> Tuple[int, int]:
    """(thread group id, parent's pid) of process or thread ``pid``; (0, 0) if it is gone."""
    tgid = ppid = 0
    try:
        with open(f"/proc/{int(pid)}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    tgid = int(line.split()[1])
                elif line.startswith(b"PPid:"):
                    ppid = int(line.split()[1])
                    break
    except (OSError, ValueError, IndexError):
        return 0, 0
    return tgid, ppid


def ancestry(pid: int, limit: int = 64) -> Tuple[int, ...]:
    """The processes ``pid`` descends from, itself first: thread ids resolve to their process; stops at
    pid 1 (not included), a process that is gone, or ``limit`` levels."""
    out: List[int] = []
    tgid, ppid = _tgid_and_ppid(pid)
    while tgid > 1 and len(out) < limit:
        out.append(tgid)
        if ppid <= 1:
            break
        tgid, ppid = _tgid_and_ppid(ppid)
    return tuple(out)
