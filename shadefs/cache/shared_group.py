"""A shared-tier member's membership in its group: heartbeats (join, renew, leave), the group's budget
split over the partitions and applied in batches when the membership changes, and the group's figures.
:class:`GroupMembership` is a part of :class:`shadefs.cache.shared.SharedTier`."""
from __future__ import annotations

import logging
from typing import List, Optional

from .shared_calls import SKIP
from .shared_scripts import HEARTBEAT, SET_CAP
from .shared_values import HEADER

__all__ = ["GroupMembership"]

log = logging.getLogger("shadefs.shared")


class GroupMembership:
    """Membership and the group's budget, for :class:`~shadefs.cache.shared.SharedTier` (its calls,
    keys, lock and counters)."""

    def heartbeat(self, leave: bool = False) -> bool:
        """Renew (or end) this membership; apply the group's budget to every partition when it changed.

        Returns True when the heartbeat reached Redis."""
        ttl_ms = int(self.heartbeat_s * 3000)
        args = (self.member_id, -1 if leave else self.size_bytes, ttl_ms)
        res = self._run(lambda c: self._script(c, HEARTBEAT, self._group_keys, args), None,
                        max(1.0, self.timeout_s * 20))
        if res is SKIP:
            return False
        gen, total, count = int(res[0]), int(res[1]), int(res[2])
        with self._lock:
            changed = gen != self.gen
            self.group_capacity, self.members = total, count
        if changed or leave:
            self.apply_caps(gen, total)
        if not leave:
            self.joined = True
        self.refresh()
        return True

    def caps(self, total: int) -> List[int]:
        """Partition budgets for a group budget of ``total`` bytes (they sum to ``total`` exactly)."""
        q, r = divmod(int(total), self.K)
        return [q + (p < r) for p in range(self.K)]

    def apply_caps(self, gen: int, total: int) -> int:
        """Set every partition's budget for membership ``gen``, evicting the least important excess in
        batches of at most :attr:`cap_batch` values per script call (Redis runs one script at a time: a
        shrink that evicts 150,000 values in one call blocked it for seconds). Rounds of one pipelined call
        per partition still over its cap, until none is. Returns the number evicted (-1 when Redis failed;
        retried on the next heartbeat; the batches already applied stay applied)."""
        caps = self.caps(total)
        todo = list(range(self.K))
        n = 0
        calls = 0
        while todo:
            def call(c, todo=todo):
                pipe = c.pipeline(transaction=False)
                for p in todo:
                    pipe.execute_command("EVAL", SET_CAP, 3, *self._pkeys(p), caps[p], gen, self._tags[p] + "v:",
                                         self.cap_batch)
                return pipe.execute()

            res = self._run(call, None, max(2.0, self.timeout_s * 40))
            if res is SKIP:
                with self._lock:
                    self.cap_calls += calls
                    self.cap_evictions += n
                return -1
            calls += len(todo)
            n += sum(int(r[1]) for r in res)
            todo = [p for p, r in zip(todo, res) if len(r) > 2 and int(r[2])]
        with self._lock:
            self.gen = gen
            self.cap_calls += calls
            self.cap_evictions += n
        if n:
            log.info("shared tier: group budget now %d bytes (%d members); evicted %d files over it",
                     total, self.members, n)
        return n

    def refresh(self) -> Optional[dict]:
        """Read every partition's byte counter (pipelined) into the group figures of :meth:`stats`."""
        def call(c):
            pipe = c.pipeline(transaction=False)
            for p in range(self.K):
                pipe.hmget(self._pkeys(p)[2], "used", "files", "evictions", "cap")
            return pipe.execute()

        res = self._run(call, None, max(1.0, self.timeout_s * 20))
        if res is SKIP:
            return None
        g = {"used_bytes": 0, "files": 0, "evictions": 0, "cap_bytes": 0}
        free = []
        for row in res:
            for name, v in zip(("used_bytes", "files", "evictions", "cap_bytes"), row):
                g[name] += int(v or 0)
            free.append(int(row[3] or 0) - int(row[0] or 0))
        with self._lock:
            self._group = g
            self._free = free
        return g

    def partition_figures(self) -> List[dict]:
        """Per partition: cap, used, files, and the exact sum of stored value sizes (tests, ``shadefs
        stats --json`` debugging). Blocking; raises redis errors."""
        c = self._client()
        out = []
        for p in range(self.K):
            z, s, m = self._pkeys(p)
            meta = c.hgetall(m)
            sizes = c.hgetall(s)
            members = c.zrange(z, 0, -1)
            pipe = c.pipeline(transaction=False)
            for h in members:
                pipe.strlen(self._tags[p] + "v:" + h.decode())
            lens = pipe.execute() if members else []
            out.append({"cap": int(meta.get(b"cap", 0)), "used": int(meta.get(b"used", 0)),
                        "files": int(meta.get(b"files", 0)), "members": len(members),
                        "sizes_sum": sum(int(v) for v in sizes.values()),
                        "values_sum": sum(n - HEADER for n in lens)})
        return out

    def _heartbeat_loop(self) -> None:
        n = 0
        while not self._stop.wait(self.heartbeat_s):
            n += 1
            self.heartbeat()
            if n % 10 == 0 and self.gen >= 0:  # re-apply now and then: a member may have died mid-apply
                self.apply_caps(self.gen, self.group_capacity)
