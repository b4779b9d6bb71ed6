"""``lru``: least recently used. The page-cache baseline: under uniform random sampling it reaches
only about (cache fraction)^2 / 2 per epoch."""
from __future__ import annotations

from collections import OrderedDict
from typing import List, Optional

from .base import Policy, register, sizes_to_free


@register
class LRUPolicy(Policy):
    """Admit every file that fits in the tier; evict the least recently used first."""

    name = "lru"
    touch_on_hit = True

    def __init__(self, capacity_bytes, importance=None):
        super().__init__(capacity_bytes, importance)
        self._order: "OrderedDict[int, None]" = OrderedDict()  # resident ids, oldest first (sizes: self.sizes)
        if self.touch_on_hit and type(self).on_hit is LRUPolicy.on_hit:
            # the RAM-hit path calls on_hit under the cache lock: the OrderedDict's own method, no
            # Python frame (docs/performance.md, "Lock hold")
            self.on_hit = self._order.move_to_end  # type: ignore[method-assign]

    def on_hit(self, fid):
        """A hit moves ``fid`` to the most recently used end (``touch_on_hit``; O(1))."""
        if self.touch_on_hit:
            self._order.move_to_end(fid)

    def on_insert(self, fid, size):
        self._order[fid] = None
        if self.owns_sizes:
            self.sizes[fid] = size

    def on_remove(self, fid):
        self._order.pop(fid, None)
        if self.owns_sizes:
            self.sizes.pop(fid, None)

    def victims(self, fid, size, free_bytes) -> Optional[List[int]]:
        if size > self.capacity_bytes:
            return None
        return sizes_to_free(iter(self._order), self.sizes, size - free_bytes)
