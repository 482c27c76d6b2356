"""The MVUE weight gradient on the 2:4 tensor cores: dW = MVUE(dy^T) @ x as one cuSPARSELt GEMM.

dy^T (out x tokens) is pruned 2:4 along tokens, the GEMM's reduction dim, and compressed in the same
pass (`sparsity.kernels.mvue.mvue_pack_t`: one read of dy, no dense pruned copy); the GEMM reads it
as A, x (tokens x in, row-major) as B, and writes dW (out x in) row-major:

    D (out x in, ROW) = A (out x tokens: dy's memory read column-major, 2:4 along tokens) . B (tokens x in, ROW)

which is the plan of a layer's input-gradient GEMM with dy in the weight's place (`kind="dgrad"`,
out_features = tokens) and B, D row-major. cuSPARSELt needs the reduction dim in multiples of 16,
the layout's kernel 64: the last tokens % 64 tokens go through a dense GEMM, exact
(`sparsity.mvue_grad` defines the estimator this way on every device and backend). Measured against
the dense GEMM at ViT-L's MLP shapes in `scripts/bench_sparse.py --ops wgrad`.
"""

from __future__ import annotations

import torch

from sparsity.mvue_grad import TOKEN_BLOCK, mvue_sparse_tokens
from sparsity.packing import layout as L

from .library import ORDER_ROW
from .search import get_plan

DTYPES = (torch.float16, torch.bfloat16)


def row_major_aligned(x: torch.Tensor) -> bool:
    """Whether the GEMM reads the 2-D `x` in place as its B operand: row-major and 16-byte
    aligned."""
    return x.stride(1) == 1 and x.stride(0) == x.shape[1] and x.data_ptr() % 16 == 0


def can_run(dy: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether this GEMM runs here: CUDA fp16/bf16 2-D operands of one dtype, out % 16 == 0 (the
    structured operand's rows), in % 8 == 0 (B's and D's leading dim), at least 64 tokens, x
    row-major and 16-byte aligned."""
    if (
        dy.device.type != "cuda"
        or dy.dtype not in DTYPES
        or x.dtype != dy.dtype
        or dy.dim() != 2
        or x.dim() != 2
    ):
        return False
    tokens, out = dy.shape
    return (
        x.shape[0] == tokens
        and out % 16 == 0
        and x.shape[1] % 8 == 0
        and tokens >= TOKEN_BLOCK
        and row_major_aligned(x)
    )


def mvue_weight_grad(
    dy: torch.Tensor, x: torch.Tensor, seed: int | torch.Tensor, search: str
) -> torch.Tensor:
    """MVUE(dy[:n]^T) @ x[:n] + dy[n:]^T @ x[n:] with n = `mvue_sparse_tokens(tokens)`: (out x in)
    in dy's dtype. `seed`: an int, or one int64 on dy's device (a compiled backward's draw).
    `search`: how a new shape's algorithm is chosen (`BackendSettings.cslt_search`). Check `can_run`
    first."""
    # Triton (an optional dependency on CPU) is imported by the kernel modules, on first use
    from sparsity.kernels.mvue import mvue_pack_t

    tokens, out = dy.shape
    in_features = x.shape[1]
    n = mvue_sparse_tokens(tokens)
    packed = mvue_pack_t(dy[:n], seed)
    xs = x[:n]

    # (in x out): what the plan's D is compared with, once per shape, to check its algorithm
    def reference():
        return xs.t() @ L.unpack_reference(packed, out, n, "col", dy.dtype).t()

    plan = get_plan(
        n,
        out,
        "dgrad",
        in_features,
        dy.dtype,
        dy.device.index if dy.device.index is not None else torch.cuda.current_device(),
        mode=search,
        b_transposed=False,
        d_order=ORDER_ROW,
        a_compressed=packed,
        b=xs,
        reference=reference,
    )
    dw = torch.empty(out, in_features, dtype=dy.dtype, device=dy.device)
    plan.run(packed, xs, dw)
    if n < tokens:
        dw.addmm_(dy[n:].t(), x[n:])
    return dw


def maybe_mvue_weight_grad(
    dy: torch.Tensor, x: torch.Tensor, seed: int, search: str
) -> torch.Tensor | None:
    """`mvue_weight_grad` where `can_run`, else None (the caller's dense GEMM on the pruned
    operand)."""
    return mvue_weight_grad(dy, x, seed, search) if can_run(dy, x) else None
