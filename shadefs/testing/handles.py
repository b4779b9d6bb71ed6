"""Reading through :class:`shadefs.cache.core.TieredCache` in process, for the unit tests."""
from __future__ import annotations

from typing import Tuple

__all__ = ["open_read"]


def open_read(cache, fid: int) -> Tuple[bytes, str]:
    """Open file id ``fid`` through ``cache``, read it whole, release the handle.

    Returns ``(bytes of the file, the open's outcome)``; errors of ``open``/``read`` (``OSError``) propagate.
    """
    h = cache.open(fid)
    try:
        return bytes(h.read(0, h.size)), h.outcome
    finally:
        h.release()
