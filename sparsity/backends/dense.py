"""The reference backend: prune, keep the pruned weight dense, run both products as dense GEMMs.

Runs anywhere (CPU included) for every pruning method; every other backend must match its results. Pruning uses the
Triton kernels on CUDA and the torch references elsewhere (`sparsity.pruning.prune`).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sparsity.pruning import prune

from .base import Backend, SparseWeight, cast


class DenseSparseWeight(SparseWeight):
    """A pruned weight held dense (zeros where pruned) with its mask."""

    def __init__(self, values: torch.Tensor, mask: torch.Tensor):
        self.values = values
        self._mask = mask
        self.shape = values.shape

    def matmul(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return F.linear(x, self.values, cast(bias, x.dtype))

    def matmul_t(self, dy: torch.Tensor) -> torch.Tensor:
        return dy @ self.values

    def to_dense(self) -> torch.Tensor:
        return self.values

    def mask(self) -> torch.Tensor:
        return self._mask


class DenseBackend(Backend):
    name = "dense"

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        return None

    def sparsify(self, weight: torch.Tensor, pruning: str) -> DenseSparseWeight:
        values, mask = prune(weight, pruning)
        return DenseSparseWeight(values, mask)
