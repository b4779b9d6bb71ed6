"""torch.distributed helpers for the hooks: who am I, gather a minibatch's scores, share sampler state.

Every collective here must be called by every rank of the default process group, in the same order;
the sampler and reporter call them at points every rank reaches (the start of an epoch's iteration,
each ``report``). Object collectives (``all_gather_object``/``broadcast_object_list``) work on gloo
and NCCL alike; on NCCL they stage through the current CUDA device, so set it
(``torch.cuda.set_device(local_rank)``) as DDP requires anyway.

Never imports torch unless torch is already imported: a process that never imported torch cannot
have initialised torch.distributed.
"""
from __future__ import annotations

import socket
import sys
from typing import Any, Hashable, List, Optional, Sequence, Set, Tuple

__all__ = ["dist_info", "is_distributed", "all_gather", "broadcast_from_rank0", "sender_ranks", "node_key"]


def _dist():
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def dist_info() -> Tuple[bool, int, int]:
    """(initialised, world size, rank) of the default process group; (False, 1, 0) without one."""
    dist = _dist()
    if dist is None:
        return False, 1, 0
    return True, dist.get_world_size(), dist.get_rank()


def is_distributed(num_replicas: int) -> bool:
    """True if a default group is up and its world size is ``num_replicas`` > 1 (the sampler's split)."""
    up, world, _ = dist_info()
    return up and world > 1 and world == num_replicas


def all_gather(obj: Any) -> List[Any]:
    """Every rank's ``obj``, in rank order (identical list on every rank). Collective."""
    dist = _dist()
    if dist is None:
        return [obj]
    out: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_from_rank0(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank. Collective."""
    dist = _dist()
    if dist is None:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def node_key(endpoint: Optional[str]) -> Optional[Tuple[str, str]]:
    """Identify one daemon: (hostname, endpoint). None for a rank without a daemon.

    The hostname is part of the key because ``ipc://`` endpoints on different nodes can share a path.
    """
    if endpoint is None:
        return None
    return socket.gethostname(), endpoint


def sender_ranks(keys: Sequence[Optional[Hashable]]) -> Set[int]:
    """The lowest rank per distinct non-None key: one sender per daemon (the node's local rank 0)."""
    first = {}
    for rank, key in enumerate(keys):
        if key is not None and key not in first:
            first[key] = rank
    return set(first.values())
