"""2:4 pruning: pure-PyTorch oracles (`reference`) and one dispatcher that runs Triton kernels on
CUDA and the greedy tile walk by a transition table on the CPU (`greedy_table`), each equal to the
oracle bit for bit.

`prune(w, method)` -> (pruned values in w.dtype, bool mask). Methods: see `reference.METHODS`;
`is_transposable(method)` says whether W^T is 2:4 too (only then may the input-gradient GEMM run
sparse). Triton is imported only when a kernel is first needed.
"""

from __future__ import annotations

import torch

from . import greedy_table
from .reference import (
    METHODS,
    MVUE_EPS,
    ROW_PAIRS,
    TILE_PATTERN_BITS,
    TILE_PATTERNS,
    TRANSPOSABLE_METHODS,
    check_method,
    check_shape,
    is_transposable,
    masked_values,
    mvue24,
    philox_uniform4,
    prune_reference,
    rowwise_mask,
    soft_threshold,
    soft_threshold_scale,
    tile_greedy_mask,
    tile_greedy_signed_mask,
    tile_optimal_mask,
    tile_pattern_scores,
)

IMPLS = ("auto", "reference", "triton")


def _use_triton(t: torch.Tensor, impl: str) -> bool:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    return impl == "triton" or (impl == "auto" and t.is_cuda)


def prune(w: torch.Tensor, method: str, *, impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Prune a 2-D tensor with `method`: (values in w.dtype, bool mask), identical for every impl.

    impl: "auto" = Triton kernel on CUDA tensors, the table walk for the greedy tile methods on the
    CPU, the torch reference elsewhere; "reference"; "triton" (forced; on CPU it needs
    TRITON_INTERPRET=1 set before the kernels are first imported).
    """
    check_shape(w.shape, method)
    if _use_triton(w, impl):
        # Triton (an optional dependency on CPU) is imported by the kernel modules, on first use
        from sparsity.kernels import prune as kernels

        return kernels.prune(w.detach(), method)
    if impl == "auto" and method in greedy_table.METHODS and w.device.type == "cpu":
        mask = greedy_table.greedy_mask(w, method)
        return masked_values(w, mask), mask
    return prune_reference(w, method)


def mvue(x: torch.Tensor, seed: int, *, impl: str = "auto") -> torch.Tensor:
    """`reference.mvue24` (unbiased stochastic 2:4 along the last dim), by Triton on CUDA."""
    if _use_triton(x, impl):
        # Triton (an optional dependency on CPU) is imported by the kernel modules, on first use
        from sparsity.kernels import mvue as kernels

        return kernels.mvue24(x.detach(), seed)
    return mvue24(x, seed)


__all__ = [
    "IMPLS",
    "METHODS",
    "MVUE_EPS",
    "ROW_PAIRS",
    "TILE_PATTERNS",
    "TILE_PATTERN_BITS",
    "TRANSPOSABLE_METHODS",
    "check_method",
    "check_shape",
    "is_transposable",
    "mvue",
    "mvue24",
    "philox_uniform4",
    "prune",
    "prune_reference",
    "rowwise_mask",
    "soft_threshold",
    "soft_threshold_scale",
    "tile_greedy_mask",
    "tile_greedy_signed_mask",
    "tile_optimal_mask",
    "tile_pattern_scores",
]
