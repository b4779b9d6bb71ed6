"""``fifo``: first in, first out; a hit does not change the order."""
from __future__ import annotations

from .base import register
from .lru import LRUPolicy


@register
class FIFOPolicy(LRUPolicy):
    """Admit every file that fits in the tier; evict the earliest admitted first."""

    name = "fifo"
    touch_on_hit = False
