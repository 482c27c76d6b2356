"""Block-sparse linear layers: only `density` of the (block_size x block_size) blocks of W are used
and trained.

Blocks are kept by magnitude (sum of squares of the block, fp32; ties to the lower row-major block
index) when the module is created and whenever `select_blocks()` is called. Forward y = x @ (W *
M)^T + b, input grad dx = dy @ (W * M), weight grad dy^T @ x on the kept blocks only (zero
elsewhere: the pruned blocks are frozen, as in pytorch_block_sparse, which stores only the kept
blocks). On CUDA the three products are Triton block-sparse GEMMs (`sparsity.kernels.block_sparse`),
skipping pruned blocks; elsewhere, and under torch.compile, they are dense torch ops on the masked
weight.

The block mask is the persistent buffer ``block_mask`` (bool, (out/block, in/block)); loading a
state dict without it (e.g. an nn.Linear one) re-selects blocks from the loaded weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sparsity.autograd import AutocastOff, compute_dtype_for, record_input_meta
from sparsity.modules import SparseLinearMixin

IMPLS = ("auto", "torch", "triton")


def select_blocks(weight: torch.Tensor, density: float, block_size: int) -> torch.Tensor:
    """Bool (out/bs, in/bs): the round(density * n_blocks) (at least 1) blocks of largest sum of
    squares."""
    rows, cols = weight.shape
    if rows % block_size or cols % block_size:
        raise ValueError(
            f"block_size {block_size} must divide the weight shape, got {tuple(weight.shape)}"
        )
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density}")
    nr, nc = rows // block_size, cols // block_size
    score = (
        weight.detach()
        .float()
        .reshape(nr, block_size, nc, block_size)
        .square()
        .sum((1, 3))
        .flatten()
    )
    n_keep = max(1, round(density * score.numel()))
    order = torch.sort(score, descending=True, stable=True).indices[:n_keep]
    mask = torch.zeros(score.numel(), dtype=torch.bool, device=weight.device)
    mask[order] = True
    return mask.reshape(nr, nc)


@dataclass
class BlockLayout:
    """Index lists of a block mask (nr x nc) for the kernels: CSR by block row (forward), CSR by
    block column (input grad), and the flat list of kept blocks (weight grad). Built once per mask
    (it synchronises on CUDA)."""

    mask: torch.Tensor
    block_size: int
    row_ptr: torch.Tensor  # (nr + 1,) int32
    row_cols: torch.Tensor  # (nnz,) int32 block columns, by block row
    col_ptr: torch.Tensor  # (nc + 1,) int32
    col_rows: torch.Tensor  # (nnz,) int32 block rows, by block column
    blocks: torch.Tensor  # (nnz, 2) int32 (block row, block col)

    @classmethod
    def from_mask(cls, mask: torch.Tensor, block_size: int) -> BlockLayout:
        def csr(m):
            counts = m.sum(1).to(torch.int32)
            ptr = torch.zeros(m.shape[0] + 1, dtype=torch.int32, device=m.device)
            ptr[1:] = torch.cumsum(counts, 0)
            return ptr, m.nonzero()[:, 1].to(torch.int32).contiguous()

        row_ptr, row_cols = csr(mask)
        col_ptr, col_rows = csr(mask.t())
        return cls(
            mask.clone(),
            block_size,
            row_ptr,
            row_cols,
            col_ptr,
            col_rows,
            mask.nonzero().to(torch.int32).contiguous(),
        )

    def dense_mask(self) -> torch.Tensor:
        b = self.block_size
        return self.mask.repeat_interleave(b, 0).repeat_interleave(b, 1)


def _use_triton(x: torch.Tensor, impl: str) -> bool:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    return impl == "triton" or (impl == "auto" and x.is_cuda)


class BlockSparseFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layout: BlockLayout, impl: str, dtype):
        with AutocastOff(x.device.type):
            x2 = x.reshape(-1, weight.shape[1]).to(dtype)
            w = weight.detach().to(dtype)
            b = None if bias is None else bias.to(dtype)
            if _use_triton(x2, impl):
                # Triton (an optional dependency on CPU) is imported by the kernel module, on first
                # use
                from sparsity.kernels import block_sparse as k

                y = k.bsmm_forward(x2, w, b, layout)
            else:
                w = w * layout.dense_mask()
                y = F.linear(x2, w, b)
        ctx.layout, ctx.impl = layout, impl
        record_input_meta(ctx, x, weight, bias)
        ctx.save_for_backward(
            x2 if ctx.needs_input_grad[1] else None, w if ctx.needs_input_grad[0] else None
        )
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        x2, w = ctx.saved_tensors
        layout = ctx.layout
        x_shape, x_dtype = ctx.x_meta
        dx = dw = db = None
        with AutocastOff(dy.device.type):
            dy2 = dy.reshape(-1, dy.shape[-1])
            triton_path = _use_triton(dy2, ctx.impl)
            if triton_path:
                # Triton (an optional dependency on CPU) is imported by the kernel module, on first
                # use
                from sparsity.kernels import block_sparse as k
            if ctx.needs_input_grad[0]:
                dx = (
                    k.bsmm_input_grad(dy2, w, layout) if triton_path else dy2 @ w
                )  # w already masked (torch)
                dx = dx.reshape(x_shape).to(x_dtype)
            if ctx.needs_input_grad[1]:
                if triton_path:
                    dw = k.bsmm_weight_grad(dy2, x2, layout)
                else:
                    dw = (dy2.t() @ x2) * layout.dense_mask()
                dw = dw.to(ctx.w_dtype)
            if ctx.needs_input_grad[2]:
                db = dy2.sum(0).to(ctx.b_dtype)
        return dx, dw, db, None, None, None


def block_sparse_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    layout: BlockLayout,
    *,
    impl: str = "auto",
) -> torch.Tensor:
    """y = x @ (W * M)^T + b with M the block mask of `layout`; gradients masked to the kept
    blocks."""
    return BlockSparseFunction.apply(x, weight, bias, layout, impl, compute_dtype_for(x))


class BlockSparseLinear(SparseLinearMixin, nn.Linear):
    """nn.Linear using only `density` of its (block_size x block_size) weight blocks (see the module
    docstring).

    `from_dense(linear, density=, block_size=, impl=, inplace=False)` / `to_dense(inplace=False)`
    share the Parameter objects (`sparsity.modules.SparseLinearMixin`).
    """

    _SPARSE_ATTRS = ("density", "block_size", "impl", "_layout", "_layout_key")
    _SPARSE_BUFFERS = ("block_mask",)

    def _init_sparse(
        self, *, density: float = 0.5, block_size: int = 32, impl: str = "auto"
    ) -> None:
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        try:
            mask = select_blocks(self.weight, float(density), int(block_size))
        except ValueError as e:
            raise ValueError(
                f"BlockSparseLinear: weight (out, in) = {tuple(self.weight.shape)}: {e}"
            ) from None
        self.density, self.block_size, self.impl = float(density), int(block_size), impl
        self.register_buffer("block_mask", mask, persistent=True)
        self._layout: BlockLayout | None = None
        self._layout_key = None

    @torch.no_grad()
    def select_blocks(self) -> torch.Tensor:
        """Re-select the kept blocks from the current weight magnitudes; returns the new block
        mask."""
        self.block_mask.copy_(select_blocks(self.weight, self.density, self.block_size))
        self._layout = None
        return self.block_mask

    def layout(self) -> BlockLayout:
        """The kernels' index lists, rebuilt only when block_mask changed (in place, replaced or
        moved)."""
        m = self.block_mask
        key = (m.data_ptr(), m.device, m._version)
        if self._layout is None or self._layout_key != key:
            self._layout = BlockLayout.from_mask(m, self.block_size)
            self._layout_key = key
        return self._layout

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, *args
    ):
        key = prefix + "block_mask"
        reselect = key not in state_dict
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, *args
        )
        if reselect:
            if key in missing_keys:
                missing_keys.remove(key)
            self.select_blocks()
        self._layout = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            # the compiler's form: the same math on the masked weight, as ops it can see (the layout
            # cache reads data pointers and the Triton kernels take a Python layout object; neither
            # traces). The gradient of W * M is dy^T x * M: the pruned blocks stay frozen as in the
            # eager path.
            b = self.block_size
            mask = self.block_mask.repeat_interleave(b, 0).repeat_interleave(b, 1)
            return F.linear(x, self.weight * mask, self.bias)
        return block_sparse_linear(x, self.weight, self.bias, self.layout(), impl=self.impl)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, density={self.density}, block_size={self.block_size}"
