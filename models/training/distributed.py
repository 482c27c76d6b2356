"""Process-group set-up from the launcher's environment, returned as a value (no module-level globals).

Single process: nothing to initialise. Under `torchrun` (RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set):
NCCL on GPUs, gloo on CPU.
"""

import os
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.distributed as dist

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def init_distributed() -> DistContext:
    present = [v for v in _TORCHRUN_VARS if v in os.environ]
    if 0 < len(present) < len(_TORCHRUN_VARS):
        missing = sorted(set(_TORCHRUN_VARS) - set(present))
        raise RuntimeError(f"partial distributed environment: {', '.join(missing)} unset (launch with torchrun)")
    cuda = torch.cuda.is_available()
    if not present or int(os.environ["WORLD_SIZE"]) == 1:
        return DistContext(0, 1, 0, torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu"))
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return DistContext(rank, world, local, torch.device("cuda", local) if cuda else torch.device("cpu"))


def all_reduce_mean_(tensors: Iterable[torch.Tensor], ctx: DistContext) -> None:
    """Average tensors across ranks in place, through one flat buffer per dtype (few large collectives)."""
    if not ctx.is_distributed:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for group in by_dtype.values():
        flat = torch.cat([t.reshape(-1) for t in group])
        dist.all_reduce(flat)
        flat /= ctx.world_size
        offset = 0
        for t in group:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def shutdown(ctx: DistContext) -> None:
    if ctx.is_distributed and dist.is_initialized():
        dist.destroy_process_group()
