"""Triton MVUE 2:4 (unbiased stochastic pruning along the last dim), bit-identical to `reference.mvue24`.

One program handles BLOCK_G groups of 4 as four (BLOCK_G,) vectors; (u1, u2) = the first two outputs of
tl.rand4x(seed, g), g = the group's row-major index. The arithmetic follows the reference expression by expression
in fp32, with IEEE-rounded divisions (tl.math.div_rn; Triton's `/` is approximate on GPUs), and the launch disables
FMA contraction (enable_fp_fusion=False) so that p_i = t_i + a_i * (k - k_i) rounds exactly as in torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparsity.kernels._util import check_launchable, interpreting
from sparsity.pruning.reference import MVUE_EPS


@triton.jit
def _div(x, y):
    return tl.math.div_rn(x, y)  # IEEE round-to-nearest, like torch; `/` compiles to the approximate div.full.f32


@triton.jit
def _mvue24_kernel(x_ptr, out_ptr, seed, n_groups, groups_per_row, stride_r, stride_c, n_cols, EPS: tl.constexpr,
                   BLOCK_G: tl.constexpr):
    g = tl.program_id(0) * BLOCK_G + tl.arange(0, BLOCK_G)
    valid = g < n_groups
    r = g // groups_per_row
    c = (g % groups_per_row) * 4
    src = x_ptr + r * stride_r + c * stride_c
    x0 = tl.load(src, mask=valid, other=0.0).to(tl.float32)
    x1 = tl.load(src + stride_c, mask=valid, other=0.0).to(tl.float32)
    x2 = tl.load(src + 2 * stride_c, mask=valid, other=0.0).to(tl.float32)
    x3 = tl.load(src + 3 * stride_c, mask=valid, other=0.0).to(tl.float32)
    u1, u2, _, _ = tl.rand4x(seed, g)
    a0 = tl.abs(x0) + EPS
    a1 = tl.abs(x1) + EPS
    a2 = tl.abs(x2) + EPS
    a3 = tl.abs(x3) + EPS
    s = a0 + a1 + a2 + a3
    t0 = _div(a0, s)
    t1 = _div(a1, s)
    t2 = _div(a2, s)
    t3 = _div(a3, s)
    k0 = _div(t0, s - a0)
    k1 = _div(t1, s - a1)
    k2 = _div(t2, s - a2)
    k3 = _div(t3, s - a3)
    k = k0 + k1 + k2 + k3
    p0 = t0 + a0 * (k - k0)
    p1 = t1 + a1 * (k - k1)
    p2 = t2 + a2 * (k - k2)
    p3 = t3 + a3 * (k - k3)
    c0 = t0
    c1 = c0 + t1
    c2 = c1 + t2
    i1 = (u1 > c0).to(tl.int32) + (u1 > c1).to(tl.int32) + (u1 > c2).to(tl.int32)
    r0 = tl.where(i1 == 0, a1, a0)
    r1 = tl.where(i1 <= 1, a2, a1)
    r2 = tl.where(i1 <= 2, a3, a2)
    e0 = r0
    e1 = e0 + r1
    tt = u2 * (e1 + r2)
    m = (tt > e0).to(tl.int32) + (tt > e1).to(tl.int32)
    i2 = m + (m >= i1).to(tl.int32)
    dst = out_ptr + r * n_cols + c
    ty = out_ptr.dtype.element_ty
    tl.store(dst, tl.where((i1 == 0) | (i2 == 0), _div(x0, p0), 0.0).to(ty), mask=valid)
    tl.store(dst + 1, tl.where((i1 == 1) | (i2 == 1), _div(x1, p1), 0.0).to(ty), mask=valid)
    tl.store(dst + 2, tl.where((i1 == 2) | (i2 == 2), _div(x2, p2), 0.0).to(ty), mask=valid)
    tl.store(dst + 3, tl.where((i1 == 3) | (i2 == 3), _div(x3, p3), 0.0).to(ty), mask=valid)


def mvue24(x: torch.Tensor, seed: int) -> torch.Tensor:
    """Triton version of `reference.mvue24` (any leading dims, any strides); returns a contiguous tensor."""
    if x.shape[-1] % 4:
        raise ValueError(f"mvue24 needs the last dim divisible by 4, got shape {tuple(x.shape)}")
    if not 0 <= int(seed) < 2**63:
        raise ValueError(f"seed must be in [0, 2**63), got {seed}")
    check_launchable(x)
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]) if x.dim() != 2 else x
    rows, cols = x2.shape
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    n_groups = rows * cols // 4
    if n_groups:
        block = 4096 if interpreting() else 512
        _mvue24_kernel[(triton.cdiv(n_groups, block),)](
            x2, out, int(seed), n_groups, cols // 4, x2.stride(0), x2.stride(1), cols, EPS=MVUE_EPS, BLOCK_G=block,
            num_warps=4, enable_fp_fusion=False,
        )
    return out.reshape(shape)
