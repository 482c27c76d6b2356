"""Triton MVUE 2:4 (unbiased stochastic pruning along the last dim), bit-identical to
`reference.mvue24`.

    mvue24(x, seed)         x pruned along its last dim, dense output (zeros where pruned)
    mvue_pack_t(dy, seed)   dy (tokens x out) row-major: A = MVUE(dy^T) (out x tokens, 2:4 along tokens) written
                            straight in cuSPARSELt's compressed "col" layout (`sparsity.packing.layout`), the A
                            operand of the weight-gradient GEMM dW = A @ x; one read of dy, no dense pruned copy

(u1, u2) as `reference.mvue_uniforms`: groups 2h and 2h + 1 share one tl.rand4x(seed, h), g the
group's row-major index in the pruned tensor's (..., C/4) layout (for mvue_pack_t: in dy^T's, g = o
* tokens/4 + t/4). The arithmetic follows the reference expression by expression in fp32: the draws
compare products and sums only, the six divisions of a group (four w_i, two kept values) are
IEEE-rounded (tl.math.div_rn; Triton's `/` is approximate on GPUs), and the launches disable FMA
contraction (enable_fp_fusion=False) so that every product rounds as in torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparsity.kernels._util import check_launchable, interpreting
from sparsity.kernels.pack_cusparselt import _meta_addr
from sparsity.packing import layout as L
from sparsity.pruning.reference import MVUE_EPS


@triton.jit
def _div(x, y, EXACT: tl.constexpr = True):
    if EXACT:
        return tl.math.div_rn(
            x, y
        )  # IEEE round-to-nearest, like torch; `/` compiles to the approximate div.full.f32
    return x / y  # within 2 ulp of it, a handful of instructions instead of ~20


@triton.jit
def _mvue_group(x0, x1, x2, x3, u1, u2, EPS: tl.constexpr, EXACT: tl.constexpr = True):
    """Groups (x0, x1, x2, x3) in fp32: the kept indices lo < hi and their values x_i * S / (a_i (1
    + W - w_i)), as `reference.mvue24` computes them (its comments say why the draws need no
    division)."""
    a0 = tl.abs(x0) + EPS
    a1 = tl.abs(x1) + EPS
    a2 = tl.abs(x2) + EPS
    a3 = tl.abs(x3) + EPS
    c1 = a0 + a1
    c2 = c1 + a2
    s = c2 + a3
    us = u1 * s
    i1 = (us > a0).to(tl.int32) + (us > c1).to(tl.int32) + (us > c2).to(tl.int32)
    r0 = tl.where(i1 == 0, a1, a0)
    r1 = tl.where(i1 <= 1, a2, a1)
    r2 = tl.where(i1 <= 2, a3, a2)
    e1 = r0 + r1
    tt = u2 * (e1 + r2)
    m = (tt > r0).to(tl.int32) + (tt > e1).to(tl.int32)
    i2 = m + (m >= i1).to(tl.int32)
    w0 = _div(a0, s - a0, EXACT)
    w1 = _div(a1, s - a1, EXACT)
    w2 = _div(a2, s - a2, EXACT)
    w3 = _div(a3, s - a3, EXACT)
    big_w = ((w0 + w1) + w2) + w3
    lo = tl.minimum(i1, i2)  # in {0, 1, 2}
    hi = tl.maximum(i1, i2)  # in {1, 2, 3}
    x_lo = tl.where(lo == 0, x0, tl.where(lo == 1, x1, x2))
    a_lo = tl.where(lo == 0, a0, tl.where(lo == 1, a1, a2))
    w_lo = tl.where(lo == 0, w0, tl.where(lo == 1, w1, w2))
    x_hi = tl.where(hi == 3, x3, tl.where(hi == 2, x2, x1))
    a_hi = tl.where(hi == 3, a3, tl.where(hi == 2, a2, a1))
    w_hi = tl.where(hi == 3, w3, tl.where(hi == 2, w2, w1))
    q_lo = _div(x_lo * s, a_lo * (1.0 + (big_w - w_lo)), EXACT)
    q_hi = _div(x_hi * s, a_hi * (1.0 + (big_w - w_hi)), EXACT)
    return lo, hi, q_lo, q_hi


@triton.jit
def _uniforms(seed, g):
    """(u1, u2) of groups g: groups 2h and 2h + 1 share tl.rand4x(seed, h)
    (`reference.mvue_uniforms`)."""
    r0, r1, r2, r3 = tl.rand4x(seed, g // 2)
    odd = (g % 2) == 1
    return tl.where(odd, r2, r0), tl.where(odd, r3, r1)


@triton.jit
def _mvue24_kernel(
    x_ptr,
    out_ptr,
    seed,
    n_groups,
    groups_per_row,
    stride_r,
    stride_c,
    n_cols,
    EPS: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    g = tl.program_id(0) * BLOCK_G + tl.arange(0, BLOCK_G)
    valid = g < n_groups
    r = g // groups_per_row
    c = (g % groups_per_row) * 4
    src = x_ptr + r * stride_r + c * stride_c
    x0 = tl.load(src, mask=valid, other=0.0).to(tl.float32)
    x1 = tl.load(src + stride_c, mask=valid, other=0.0).to(tl.float32)
    x2 = tl.load(src + 2 * stride_c, mask=valid, other=0.0).to(tl.float32)
    x3 = tl.load(src + 3 * stride_c, mask=valid, other=0.0).to(tl.float32)
    u1, u2 = _uniforms(seed, g)
    lo, hi, q_lo, q_hi = _mvue_group(x0, x1, x2, x3, u1, u2, EPS)
    dst = out_ptr + r * n_cols + c
    ty = out_ptr.dtype.element_ty
    tl.store(dst, tl.where(lo == 0, q_lo, 0.0).to(ty), mask=valid)
    tl.store(dst + 1, tl.where(lo == 1, q_lo, tl.where(hi == 1, q_hi, 0.0)).to(ty), mask=valid)
    tl.store(dst + 2, tl.where(lo == 2, q_lo, tl.where(hi == 2, q_hi, 0.0)).to(ty), mask=valid)
    tl.store(dst + 3, tl.where(hi == 3, q_hi, 0.0).to(ty), mask=valid)


@triton.jit
def _pack_t_group(dy_ptr, val_ptr, g, o, ok, O, u1, u2, EPS: tl.constexpr, EXACT: tl.constexpr):
    """MVUE of the groups (tokens 4g..4g+3, feature o) of dy; stores their two values in the "col"
    values region ((2G x O) row-major: slots 2g and 2g + 1 of row o of A) and returns their metadata
    nibbles lo | hi << 2."""
    src = dy_ptr + (4 * g) * O + o
    x0 = tl.load(src, mask=ok, other=0.0).to(tl.float32)
    x1 = tl.load(src + O, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(src + 2 * O, mask=ok, other=0.0).to(tl.float32)
    x3 = tl.load(src + 3 * O, mask=ok, other=0.0).to(tl.float32)
    lo, hi, q_lo, q_hi = _mvue_group(x0, x1, x2, x3, u1, u2, EPS, EXACT)
    ty = val_ptr.dtype.element_ty
    tl.store(val_ptr + (2 * g) * O + o, q_lo.to(ty), mask=ok)
    tl.store(val_ptr + (2 * g + 1) * O + o, q_hi.to(ty), mask=ok)
    return lo | (hi << 2)


@triton.jit
def _pack_t_feature(dy_ptr, val_ptr, seed, h, o, ok, O, G, EPS: tl.constexpr, EXACT: tl.constexpr):
    """Groups 2h and 2h + 1 of feature o (one Philox draw: its group pair index is o * G/2 + h);
    their nibbles."""
    r0, r1, r2, r3 = tl.rand4x(seed, o * (G // 2) + h)
    even = _pack_t_group(dy_ptr, val_ptr, 2 * h, o, ok, O, r0, r1, EPS, EXACT)
    odd = _pack_t_group(dy_ptr, val_ptr, 2 * h + 1, o, ok, O, r2, r3, EPS, EXACT)
    return even, odd


@triton.jit
def _mvue_pack_t_kernel(
    dy_ptr,
    val_ptr,
    meta_ptr,
    seed,
    O,
    G,
    NKT,
    EPS: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_H: tl.constexpr,
    SEED_IN_MEMORY: tl.constexpr,
    EXACT: tl.constexpr,
):
    # a thread: token groups 2h and 2h + 1 (one Philox draw each) of features o and o + 8 (o % 16 <
    # 8: the two rows of A whose nibbles share a metadata byte, so every byte is written whole by
    # one thread)
    # a device tensor: drawn inside a compiled (or CUDA-graph) backward, never seen by the host
    if SEED_IN_MEMORY:
        seed = tl.load(seed)
    h = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)[:, None]
    j = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)[None, :]
    o = 16 * (j // 8) + j % 8
    ok = (2 * h < G) & (o < O)  # G even, O % 16 == 0: o + 8 < O too
    lo_even, lo_odd = _pack_t_feature(dy_ptr, val_ptr, seed, h, o, ok, O, G, EPS, EXACT)
    hi_even, hi_odd = _pack_t_feature(dy_ptr, val_ptr, seed, h, o + 8, ok, O, G, EPS, EXACT)
    tl.store(meta_ptr + _meta_addr(o, 2 * h, NKT), (lo_even | (hi_even << 4)).to(tl.uint8), mask=ok)
    tl.store(
        meta_ptr + _meta_addr(o, 2 * h + 1, NKT), (lo_odd | (hi_odd << 4)).to(tl.uint8), mask=ok
    )


def mvue24(x: torch.Tensor, seed: int) -> torch.Tensor:
    """Triton version of `reference.mvue24` (any leading dims, any strides); returns a contiguous
    tensor."""
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
            x2,
            out,
            int(seed),
            n_groups,
            cols // 4,
            x2.stride(0),
            x2.stride(1),
            cols,
            EPS=MVUE_EPS,
            BLOCK_G=block,
            num_warps=4,
            enable_fp_fusion=False,
        )
    return out.reshape(shape)


def mvue_pack_t(dy: torch.Tensor, seed, exact: bool = True) -> torch.Tensor:
    """A = MVUE(dy^T) compressed for cuSPARSELt, "col" orientation: dy (tokens x out, fp16/bf16,
    row-major) with tokens % 64 == 0 and out % 16 == 0 -> the uint8 buffer of
    `layout.compressed_size(out, tokens)` bytes that `layout.unpack_reference(buf, out, tokens,
    "col", dtype)` decodes to `reference.mvue24(dy.t(), seed)`. `seed`: an int, or a one-element
    int64 tensor on dy's device (read by the kernel: no host synchronisation). `exact=False` divides
    approximately on a GPU (the draws are division-free, so the kept entries are the same; their
    values move by an fp32 ulp or two, rarely a rounding of the 16-bit result)."""
    if dy.dim() != 2 or dy.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(
            f"mvue_pack_t needs a 2-D fp16/bf16 tensor, got {tuple(dy.shape)} {dy.dtype}"
        )
    tokens, out = dy.shape
    if tokens % 64 or out % 16 or not tokens or not out:
        raise ValueError(
            f"mvue_pack_t needs tokens % 64 == 0 and out % 16 == 0, got {tuple(dy.shape)}"
        )
    in_memory = isinstance(seed, torch.Tensor)
    if in_memory:
        if seed.dtype != torch.int64 or seed.numel() != 1 or seed.device != dy.device:
            raise ValueError(
                f"a seed tensor must be one int64 on {dy.device}, got {seed.dtype} "
                f"{tuple(seed.shape)} "
                f"on {seed.device}"
            )
    elif not 0 <= int(seed) < 2**63:
        raise ValueError(f"seed must be in [0, 2**63), got {seed}")
    check_launchable(dy)
    dy = dy.contiguous()
    size = L.compressed_size(out, tokens)
    # metadata rows past `out` in a partial band of 64 are never written: zeros, as the library
    # leaves defined bytes
    buf = (torch.empty if out % 64 == 0 else torch.zeros)(size, dtype=torch.uint8, device=dy.device)
    values = buf[: L.values_bytes(out, tokens)].view(dy.dtype)
    groups = tokens // 4
    block_p, block_h = (32, 64) if interpreting() else (8, 32)
    grid = (triton.cdiv(groups // 2, block_p), triton.cdiv(out // 2, block_h))
    _mvue_pack_t_kernel[grid](
        dy,
        values,
        buf[L.values_bytes(out, tokens) :],
        seed if in_memory else int(seed),
        out,
        groups,
        -(-tokens // 32),
        EPS=MVUE_EPS,
        BLOCK_P=block_p,
        BLOCK_H=block_h,
        SEED_IN_MEMORY=in_memory,
        EXACT=exact,
        num_warps=4,
        enable_fp_fusion=False,
    )
    return buf
