"""Triton block-sparse GEMMs of a linear layer whose weight W (N x K) keeps only some (BS x BS)
blocks.

    forward      y  = x @ W_b^T (+ b)   grid (M tiles, N blocks): loop over the kept K-blocks of the block row (CSR)
    input grad   dx = dy @ W_b          grid (M tiles, K blocks): loop over the kept N-blocks of the block column
    weight grad  dW = dy^T @ x on the kept blocks only (zero elsewhere): one program per kept block, loop over M

Index lists come from `sparsity.block_sparse.BlockLayout`. Accumulation in fp32; outputs in the
input dtype. Under the CPU interpreter the operands are up-cast to fp32 before `tl.dot` (its bf16
dot is wrong); fp32 operands use input_precision="ieee" (no TF32), like torch's default fp32 matmul.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparsity.kernels._util import check_launchable, interpreting


@triton.jit
def _dot(a, b, acc, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _bsmm_fwd_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    row_ptr,
    row_cols,
    M,
    N,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    HAS_BIAS: tl.constexpr,
    BS: tl.constexpr,
    BM: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    nb = tl.program_id(1)
    rb = tl.arange(0, BS)
    m_ok = rm < M
    rn = nb * BS + rb
    acc = tl.zeros((BM, BS), dtype=tl.float32)
    start = tl.load(row_ptr + nb)
    end = tl.load(row_ptr + nb + 1)
    for i in range(start, end):
        rk = tl.load(row_cols + i) * BS + rb
        a = tl.load(
            x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk, mask=m_ok[:, None], other=0.0
        )
        wt = tl.load(
            w_ptr + rn[None, :] * stride_wn + rk[:, None] * stride_wk
        )  # (BS_k, BS_n) = block of W^T
        acc = _dot(a, wt, acc, UPCAST, IEEE)
    if HAS_BIAS:
        acc = acc + tl.load(b_ptr + rn).to(tl.float32)[None, :]
    tl.store(
        y_ptr + rm[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None]
    )


@triton.jit
def _bsmm_dgrad_kernel(
    dy_ptr,
    w_ptr,
    dx_ptr,
    col_ptr,
    col_rows,
    M,
    K,
    stride_dm,
    stride_dn,
    stride_wn,
    stride_wk,
    BS: tl.constexpr,
    BM: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    kb = tl.program_id(1)
    rb = tl.arange(0, BS)
    m_ok = rm < M
    rk = kb * BS + rb
    acc = tl.zeros((BM, BS), dtype=tl.float32)
    start = tl.load(col_ptr + kb)
    end = tl.load(col_ptr + kb + 1)
    for i in range(start, end):
        rn = tl.load(col_rows + i) * BS + rb
        a = tl.load(
            dy_ptr + rm[:, None] * stride_dm + rn[None, :] * stride_dn,
            mask=m_ok[:, None],
            other=0.0,
        )
        w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :] * stride_wk)  # (BS_n, BS_k)
        acc = _dot(a, w, acc, UPCAST, IEEE)
    tl.store(
        dx_ptr + rm[:, None] * K + rk[None, :], acc.to(dx_ptr.dtype.element_ty), mask=m_ok[:, None]
    )


@triton.jit
def _bsmm_wgrad_kernel(
    dy_ptr,
    x_ptr,
    dw_ptr,
    blocks,
    M,
    K,
    stride_dm,
    stride_dn,
    stride_xm,
    stride_xk,
    BS: tl.constexpr,
    BM: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
):
    blk = tl.program_id(0)
    rn = tl.load(blocks + 2 * blk) * BS + tl.arange(0, BS)
    rk = tl.load(blocks + 2 * blk + 1) * BS + tl.arange(0, BS)
    acc = tl.zeros((BS, BS), dtype=tl.float32)
    for m0 in range(0, M, BM):
        rm = m0 + tl.arange(0, BM)
        m_ok = rm < M
        dyt = tl.load(
            dy_ptr + rn[:, None] * stride_dn + rm[None, :] * stride_dm,
            mask=m_ok[None, :],
            other=0.0,
        )
        a = tl.load(
            x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk, mask=m_ok[:, None], other=0.0
        )
        acc = _dot(dyt, a, acc, UPCAST, IEEE)
    tl.store(dw_ptr + rn[:, None] * K + rk[None, :], acc.to(dw_ptr.dtype.element_ty))


def _flags(dtype: torch.dtype):
    upcast = interpreting()
    return upcast, upcast or dtype == torch.float32


def _bm(m: int) -> int:
    return 128 if interpreting() else 64


def bsmm_forward(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, layout
) -> torch.Tensor:
    """x (M, K) @ (W * block mask)^T + bias -> (M, N) in x.dtype."""
    check_launchable(x, w)
    (m, _), n, bs = x.shape, w.shape[0], layout.block_size  # x must be 2-D
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    upcast, ieee = _flags(x.dtype)
    bm = _bm(m)
    _bsmm_fwd_kernel[(triton.cdiv(m, bm), n // bs)](
        x,
        w,
        bias if bias is not None else w,
        y,
        layout.row_ptr,
        layout.row_cols,
        m,
        n,
        x.stride(0),
        x.stride(1),
        w.stride(0),
        w.stride(1),
        HAS_BIAS=bias is not None,
        BS=bs,
        BM=bm,
        UPCAST=upcast,
        IEEE=ieee,
        num_warps=4,
    )
    return y


def bsmm_input_grad(dy: torch.Tensor, w: torch.Tensor, layout) -> torch.Tensor:
    """dy (M, N) @ (W * block mask) -> (M, K) in dy.dtype."""
    check_launchable(dy, w)
    (m, _), k, bs = dy.shape, w.shape[1], layout.block_size
    dx = torch.empty((m, k), dtype=dy.dtype, device=dy.device)
    if m == 0:
        return dx
    upcast, ieee = _flags(dy.dtype)
    bm = _bm(m)
    _bsmm_dgrad_kernel[(triton.cdiv(m, bm), k // bs)](
        dy,
        w,
        dx,
        layout.col_ptr,
        layout.col_rows,
        m,
        k,
        dy.stride(0),
        dy.stride(1),
        w.stride(0),
        w.stride(1),
        BS=bs,
        BM=bm,
        UPCAST=upcast,
        IEEE=ieee,
        num_warps=4,
    )
    return dx


def bsmm_weight_grad(dy: torch.Tensor, x: torch.Tensor, layout) -> torch.Tensor:
    """(dy^T @ x) on the kept blocks, zero elsewhere -> (N, K) in dy.dtype."""
    check_launchable(dy, x)
    (m, n), k = dy.shape, x.shape[1]
    dw = torch.zeros((n, k), dtype=dy.dtype, device=dy.device)
    n_blocks = layout.blocks.shape[0]
    if n_blocks == 0:
        return dw
    upcast, ieee = _flags(dy.dtype)
    _bsmm_wgrad_kernel[(n_blocks,)](
        dy,
        x,
        dw,
        layout.blocks,
        m,
        k,
        dy.stride(0),
        dy.stride(1),
        x.stride(0),
        x.stride(1),
        BS=layout.block_size,
        BM=_bm(m),
        UPCAST=upcast,
        IEEE=ieee,
        num_warps=4,
    )
    return dw
