"""Weight gradients from an MVUE 2:4-sparse output gradient (the config's
`sparsity.weight_grad=mvue24`).

    dense   dW = dy^T @ x                 (the default)
    mvue24  dW = MVUE24(dy^T) @ x         dy^T (out x tokens) pruned 2:4 along tokens, the GEMM's reduction dim,
                                          by the unbiased stochastic `sparsity.pruning.mvue` (Chmiel et al., "Minimum
                                          Variance Unbiased N:M Sparsity for the Neural Gradients"; S-STE's gradient
                                          path): E[dW] is the dense dW, and the GEMM's A operand is 2:4 along K.

The first tokens - tokens % 64 tokens are pruned; the last tokens % 64 (fewer than 64) enter dW
exactly, on every device and backend, so that one seed gives one estimate everywhere (the 2:4 GEMM
needs whole blocks of 64 tokens). Where the layer's backend has a 2:4 GEMM for it
(`Backend.mvue_weight_grad`: `cusparselt`, and `auto` where cuSPARSELt runs, fp16/bf16 on CUDA) the
product runs on the sparse tensor cores, its operand compressed by the pruning pass itself
(`sparsity.backends.cusparselt.wgrad`); elsewhere it is a dense GEMM on the pruned operand. The bias
gradient stays the exact sum of dy.

Eagerly, each call draws its MVUE seed from torch's default CPU generator; under torch.compile
(cuSPARSELt only: `sparsity::cslt_linear`'s backward) from torch's CUDA generator on the GPU, so the
seed never stops the host and the step can be one CUDA graph. Either way a run is reproducible from
its seed, and a resumed run (the checkpoint holds every rank's RNG states) draws the same seeds.
Compiled on another backend or off CUDA the layer refuses (`train.compile=false` runs it eagerly).
"""

from __future__ import annotations

import torch

from sparsity.options import WEIGHT_GRADS
from sparsity.pruning import mvue

SEED_HIGH = 2**62
TOKEN_BLOCK = (
    64  # tokens are pruned in whole blocks of this many (the 2:4 GEMM's operand kernel needs it)
)

_counts = {"mvue24": 0}


def check_weight_grad(name: str) -> str:
    if name not in WEIGHT_GRADS:
        raise ValueError(f"weight_grad={name!r} is not one of {', '.join(WEIGHT_GRADS)}")
    return name


def mvue_calls() -> int:
    """How many weight gradients MVUE has estimated in this process (for the run log and tests)."""
    return _counts["mvue24"]


def mvue_sparse_tokens(tokens: int) -> int:
    """How many of `tokens` the estimator prunes (whole blocks of 64); the rest enter dW exactly."""
    return tokens - tokens % TOKEN_BLOCK


def mvue_weight_grad(dy2: torch.Tensor, x2: torch.Tensor, backend=None) -> torch.Tensor:
    """MVUE24(dy2[:n]^T) @ x2[:n] + dy2[n:]^T @ x2[n:] (n = `mvue_sparse_tokens`) for dy2 (tokens x
    out) and x2 (tokens x in) of one dtype: (out x in) in that dtype, on `backend`'s 2:4 GEMM where
    it has one."""
    seed = int(torch.randint(0, SEED_HIGH, ()))
    _counts["mvue24"] += 1
    if backend is not None:
        dw = backend.mvue_weight_grad(dy2, x2, seed)
        if dw is not None:
            return dw
    n = mvue_sparse_tokens(dy2.shape[0])
    dw = mvue(dy2[:n].t(), seed) @ x2[:n]
    return dw if n == dy2.shape[0] else dw.addmm(dy2[n:].t(), x2[n:])
