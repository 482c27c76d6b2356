"""Weight gradients from an MVUE 2:4-sparse output gradient (the config's `sparsity.weight_grad=mvue24`).

    dense   dW = dy^T @ x                 (the default)
    mvue24  dW = MVUE24(dy^T) @ x         dy^T (out x tokens) pruned 2:4 along tokens, the GEMM's reduction dim,
                                          by the unbiased stochastic `sparsity.pruning.mvue` (Chmiel et al., "Minimum
                                          Variance Unbiased N:M Sparsity for the Neural Gradients"; S-STE's gradient
                                          path): E[dW] is the dense dW, and the GEMM's A operand is 2:4 along K.

The product runs as a dense GEMM on the pruned operand (the estimator, not a sparse-GEMM speed-up: the operand
changes every call, and compressing it for cuSPARSELt would cost more than the GEMM saves at these sizes). Token
counts that are not a multiple of 4 are padded with zero rows (their gradient contribution is zero). The bias
gradient stays the exact sum of dy.

Each call draws its MVUE seed from torch's default CPU generator, so a run is reproducible from its seed and a
resumed run (the checkpoint holds every rank's RNG states) draws the same seeds. Eager only: under torch.compile
the layer refuses (`sparsity.weight_grad=mvue24` needs `train.compile=false`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sparsity.pruning import mvue

WEIGHT_GRADS = ("dense", "mvue24")
SEED_HIGH = 2**62

_counts = {"mvue24": 0}


def check_weight_grad(name: str) -> str:
    if name not in WEIGHT_GRADS:
        raise ValueError(f"weight_grad={name!r} is not one of {', '.join(WEIGHT_GRADS)}")
    return name


def mvue_calls() -> int:
    """How many weight gradients MVUE has estimated in this process (for the run log and tests)."""
    return _counts["mvue24"]


def mvue_weight_grad(dy2: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """MVUE24(dy2^T) @ x2 for dy2 (tokens x out) and x2 (tokens x in) of one dtype: (out x in) in that dtype."""
    pad = -dy2.shape[0] % 4
    if pad:
        dy2, x2 = F.pad(dy2, (0, 0, 0, pad)), F.pad(x2, (0, 0, 0, pad))
    seed = int(torch.randint(0, SEED_HIGH, ()))
    _counts["mvue24"] += 1
    return mvue(dy2.t(), seed) @ x2
