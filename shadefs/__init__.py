"""shadefs: a read-only caching FUSE filesystem for deep-learning training data.

RAM and NVMe tiers in front of slow storage, with importance-aware admission and eviction following
SHADE (Khan et al., USENIX FAST '23). The daemon never imports torch; the optional training hook lives
in :mod:`shadefs.hooks`.
"""
__version__ = "0.1.0"
