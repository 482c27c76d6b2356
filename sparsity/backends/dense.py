"""The reference backend: prune, keep the pruned weight dense, run both products as dense GEMMs.

Runs anywhere (CPU included) for every pruning method; every other backend must match its results.
Pruning uses the Triton kernels on CUDA and the torch references elsewhere
(`sparsity.pruning.prune`).

`dense_sparsify` is the cheapest dense path on a GPU (what `auto` falls back to and what a compiled
dense layer prunes with): tile_greedy by the fused kernel's dense-output mode (`prune_dense`, one
read and one write of W) rather than the generic pruning kernel; other methods and devices as
`DenseBackend`.
"""

from __future__ import annotations

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

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
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


class FastDenseSparseWeight(SparseWeight):
    """W pruned (tile_greedy) by the fused kernel's dense-output mode, multiplied densely."""

    def __init__(self, values: torch.Tensor, tile_bits: torch.Tensor, shape):
        self.values = values
        self._bits = tile_bits
        self._mask = None
        self.shape = torch.Size(shape)

    def matmul(self, x, bias=None):
        return F.linear(x, self.values, cast(bias, x.dtype))

    def matmul_t(self, dy):
        return dy @ self.values

    def to_dense(self):
        return self.values

    def mask(self):
        if self._mask is None:
            # Triton (an optional dependency on CPU) is imported by the kernel modules, on first use
            from sparsity.kernels.pack_cusparselt import tile_bits_to_mask

            self._mask = tile_bits_to_mask(self._bits)
        return self._mask


def dense_sparsify(weight: torch.Tensor, pruning: str) -> SparseWeight:
    """The fast fused pruning where it applies (tile_greedy, CUDA, 16-bit, dims multiples of 16),
    else `prune`."""
    R, C = weight.shape
    if (
        pruning == "tile_greedy"
        and weight.is_cuda
        and weight.dtype in (torch.float16, torch.bfloat16)
        and R % 16 == 0
        and C % 16 == 0
    ):
        # Triton (an optional dependency on CPU) is imported by the kernel modules, on first use
        from sparsity.kernels.pack_cusparselt import prune_dense

        values, bits = prune_dense(weight.detach())
        return FastDenseSparseWeight(values, bits, weight.shape)
    values, mask = prune(weight, pruning)
    return DenseSparseWeight(values, mask)


class FastDenseBackend(Backend):
    """`dense_sparsify` as a Backend object (auto times its dense path through the real autograd
    function)."""

    name = "auto-dense"

    def check(self, device, dtype) -> None:
        return None

    def sparsify(self, weight: torch.Tensor, pruning: str) -> SparseWeight:
        return dense_sparsify(weight, pruning)
