"""The read path (RAM tier -> NVMe tier -> backend), its tiers and their byte-budget accounting."""
from .core import TieredCache  # noqa: F401
from .index import TierIndex  # noqa: F401
from .tiers import CorruptEntry, DiskTier, MemoryTier  # noqa: F401
