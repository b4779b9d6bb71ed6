"""``static``: admit until full, never evict (CoorDL's MinIO policy).

Under uniform random sampling every file is read once per epoch, so no policy can beat a hit ratio
of cache size / dataset size per epoch, and this one reaches it (Mohan et al., "Analyzing and
Mitigating Data Stalls in DNN Training", VLDB 2021, section 4.1). The default policy.
"""
from __future__ import annotations

from typing import List, Optional

from .base import Policy, register


@register
class StaticPolicy(Policy):
    """Admit while the file fits; once full, refuse everything."""

    name = "static"

    def victims(self, fid: int, size: int, free_bytes: int) -> Optional[List[int]]:
        return [] if size <= free_bytes else None
