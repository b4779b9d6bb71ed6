"""``lru``: least recently used. The page-cache baseline: under uniform random sampling it reaches
only about (cache fraction)^2 / 2 per epoch."""
from __future__ import annotations

import collections
from collections import OrderedDict
from typing import List, Optional

from .base import Policy, register, sizes_to_free


@register
class LRUPolicy(Policy):
    """Admit every file that fits in the tier; evict the least recently used first.

    Exact LRU in both of its modes:

    - immediate (a policy on its own, the simulator): a hit moves the file to the most recently used end
      of one ``OrderedDict`` (``on_hit`` is that dict's own ``move_to_end``: no Python frame);
    - deferred (the daemon, after :meth:`defer`): a hit only appends its id to a deque (``on_hit`` is
      the deque's ``append``, ~0.03 us, where ``move_to_end`` at 1M residents costs 1-1.5 us of cache
      misses); the daemon's background thread applies the queued touches in bounded slices
      (:meth:`apply_pending`), and every call that reads or changes the order (:meth:`victims`,
      :meth:`on_insert`, :meth:`on_remove`) applies all of them first, in order, so each decision is
      the one the immediate mode makes (tests/integration/test_sim_vs_daemon.py checks equality).
    """

    name = "lru"
    touch_on_hit = True

    def __init__(self, capacity_bytes, importance=None):
        super().__init__(capacity_bytes, importance)
        self._order: "OrderedDict[int, int]" = OrderedDict()  # fid -> size, oldest first
        self._touches: "Optional[collections.deque[int]]" = None  # deferred hits, oldest first
        if self.touch_on_hit and type(self).on_hit is LRUPolicy.on_hit:
            # the hit path calls on_hit under the cache lock: the OrderedDict's own method, no frame
            self.on_hit = self._order.move_to_end  # type: ignore[method-assign]

    def on_hit(self, fid):
        """A hit moves ``fid`` to the most recently used end (``touch_on_hit``; O(1))."""
        if self.touch_on_hit:
            self._order.move_to_end(fid)

    def defer(self, wake=None) -> bool:
        """Queue hits instead of applying them (see the class docstring). Returns True when hits change
        the order (``lru``), False when they don't (``fifo``: nothing to defer)."""
        if not self.touch_on_hit or type(self).on_hit is not LRUPolicy.on_hit:
            return False
        if self._touches is None:
            self._touches = collections.deque()
            self.on_hit = self._touches.append  # type: ignore[method-assign]
        return True

    def pending(self) -> int:
        """Hits queued and not applied yet."""
        return len(self._touches) if self._touches is not None else 0

    def apply_pending(self, limit: int = 256) -> bool:
        """Apply at most ``limit`` queued hits, oldest first (tier's lock held). Returns True while
        some remain."""
        touches = self._touches
        if not touches:
            return False
        move, pop = self._order.move_to_end, touches.popleft
        for _ in range(min(limit, len(touches))):
            try:
                move(pop())
            except KeyError:
                pass         # removed since its hit (see on_remove)
        return bool(touches)

    def _apply_all(self) -> None:
        touches = self._touches
        if touches:
            move, pop = self._order.move_to_end, touches.popleft
            for _ in range(len(touches)):
                try:
                    move(pop())
                except KeyError:
                    pass

    def on_insert(self, fid, size):
        if self._touches:
            self._apply_all()
        self._order[fid] = size

    def on_remove(self, fid):
        # queued touches of fid stay queued: applied later they find it absent and are skipped (and
        # on_insert applies them all before fid can be resident again), so no decision changes
        self._order.pop(fid, None)

    def victims(self, fid, size, free_bytes) -> Optional[List[int]]:
        if size > self.capacity_bytes:
            return None
        if self._touches:
            self._apply_all()
        return sizes_to_free(iter(self._order), self._order, size - free_bytes)
