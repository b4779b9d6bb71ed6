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
        self._order: "OrderedDict[int, int]" = OrderedDict()  # fid -> size, oldest first

    def on_hit(self, fid):
        if self.touch_on_hit:
            self._order.move_to_end(fid)

    def on_insert(self, fid, size):
        self._order[fid] = size

    def on_remove(self, fid):
        self._order.pop(fid, None)

    def victims(self, fid, size, free_bytes) -> Optional[List[int]]:
        if size > self.capacity_bytes:
            return None
        return sizes_to_free(iter(self._order), self._order, size - free_bytes)
