"""torch.distributed helpers for the losses: no-ops when the process group is not initialised."""

import torch
import torch.distributed as dist


def is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_dist() else 1


def all_reduce_sum_(t: torch.Tensor) -> torch.Tensor:
    """In-place synchronous SUM over ranks (identity on one process)."""
    if is_dist():
        dist.all_reduce(t)
    return t
