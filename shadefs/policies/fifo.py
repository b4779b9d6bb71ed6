"""``fifo``: first in, first out; a hit does not change the order."""
from __future__ import annotations

from .base import register
from .lru import LRUPolicy


@register
class FIFOPolicy(LRUPolicy):
    """Admit every file that fits in the tier; evict the earliest admitted first."""

    name = "fifo"
    touch_on_hit = False

    def on_hit(self, fid):
        """A hit does not change the order (no attribute check on the hit path)."""
