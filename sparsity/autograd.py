"""Autograd functions of 2:4-sparse linear layers.

`semi_sparse_linear(x, weight, bias, ...)`: the weight is re-pruned on every call (by the backend's
`sparsify`),

    forward      y  = x  @ W_s^T + b      sparse GEMM   (SparseWeight.matmul)
    input grad   dx = dy @ W_s            sparse GEMM when the pruning is transposable (SparseWeight.matmul_t)
    weight grad  dW = dy^T @ x            dense GEMM, straight-through to the dense master weight (optionally
                                          masked: `masked_grad=True` gives dW * mask); on CUDA one cuBLASLt call
                                          that also reduces the bias gradient and writes fp32 directly
                                          (`weight_grad.py`; off with the backend setting fused_wgrad=False),
                                          else the torch ops; with `weight_grad="mvue24"` dW = MVUE24(dy^T) @ x,
                                          dy^T pruned 2:4 along tokens, unbiased, on the backend's 2:4 GEMM
                                          where it has one (`mvue_grad.py`; compiled: on cuSPARSELt only)

`semi_sparse_activation_linear(x, weight, bias, ...)`: torchao's SemiSparseActivationLinear
semantics: the input x (tokens x in) is pruned 2:4 along features, y = x_s @ W^T + b, dW = dy^T @
x_s, dx = dy @ W (straight-through to x).

Under torch.compile both route to `sparsity.traced`, the same math written as ops the compiler sees.

Both run in the *compute dtype*: the autocast dtype when autocast is enabled for x's device, else
x.dtype. Weight, bias and x are cast to it inside the function (so fp32 master weights under bf16
autocast work), x may have any leading dims and need not be contiguous, and gradients come back in
the dtypes of the inputs. Only x (cast to the compute dtype) and the backend's SparseWeight are kept
for backward.
"""

from __future__ import annotations

import torch

from sparsity import traced
from sparsity.backends import Backend, get_backend
from sparsity.backends.base import cast
from sparsity.mvue_grad import check_weight_grad, mvue_weight_grad
from sparsity.pruning import check_method
from sparsity.weight_grad import weight_bias_grad


def compute_dtype_for(x: torch.Tensor) -> torch.dtype:
    """The dtype a linear layer computes in for input x: autocast's when it is on for x's device,
    else x.dtype."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return x.dtype


class AutocastOff:
    """`with AutocastOff(device_type):` autocast off for that device type inside the block.

    The same as `torch.autocast(device_type, enabled=False)`, whose constructor costs tens of
    microseconds of host time on every call (this runs twice per sparse layer and step). While
    torch.compile is at work it uses torch.autocast (the 2:4 layers themselves trace through
    `sparsity.traced` and need no context manager)."""

    __slots__ = ("device_type", "ctx", "was_on")

    def __init__(self, device_type: str):
        self.device_type = device_type
        self.ctx = None

    def __enter__(self):
        self.was_on = torch.is_autocast_enabled(self.device_type)
        if not self.was_on:
            return
        if not torch.compiler.is_compiling():
            try:
                torch.set_autocast_enabled(self.device_type, False)
                return
            except TypeError:  # a torch without the per-device-type signature
                pass
        self.ctx = torch.autocast(self.device_type, enabled=False)
        self.ctx.__enter__()

    def __exit__(self, *exc):
        if self.ctx is not None:
            self.ctx.__exit__(*exc)
        elif self.was_on:
            torch.set_autocast_enabled(self.device_type, True)


def _rows(t: torch.Tensor, features: int) -> torch.Tensor:
    return t if t.dim() == 2 else t.reshape(-1, features)


def record_input_meta(
    ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> None:
    """Keep what backward needs to return gradients in the inputs' shapes and dtypes (not the
    tensors)."""
    ctx.x_meta = (x.shape, x.dtype)
    ctx.w_dtype = weight.dtype
    ctx.b_dtype = None if bias is None else bias.dtype


class SemiSparseWeightFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        x,
        weight,
        bias,
        backend: Backend,
        pruning: str,
        masked_grad: bool,
        scale,
        dtype,
        weight_grad: str = "dense",
    ):
        # (inside forward nothing is tracked by autograd: no .detach() needed; no-op casts are
        # skipped, they cost host time on every step)
        with AutocastOff(x.device.type):
            x2 = cast(_rows(x, weight.shape[1]), dtype)
            sw = backend.sparsify(cast(weight, dtype), pruning)
            if scale is None:
                y = sw.matmul(
                    x2, bias
                )  # backends cast the bias themselves (cuSPARSELt's plan copy casts it)
            else:
                y = sw.matmul(x2) * scale
                if bias is not None:
                    y = y + cast(bias, dtype)
        ctx.sw = sw
        ctx.masked_grad = masked_grad
        ctx.fused_wgrad = backend.settings.fused_wgrad
        ctx.weight_grad = weight_grad
        ctx.backend = backend  # its 2:4 GEMM runs the MVUE weight gradient where it has one
        record_input_meta(ctx, x, weight, bias)
        ctx.save_for_backward(x2 if ctx.needs_input_grad[1] else None, scale)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        x2, scale = ctx.saved_tensors
        sw = ctx.sw
        x_shape, x_dtype = ctx.x_meta
        dx = dw = db = None
        with AutocastOff(dy.device.type):
            dy2 = _rows(dy, dy.shape[-1])  # in the compute dtype, like y
            if ctx.needs_input_grad[0]:
                dx = sw.matmul_t(dy2)
                if scale is not None:
                    dx = dx * scale
                dx = cast(dx if len(x_shape) == 2 else dx.reshape(x_shape), x_dtype)
            if ctx.needs_input_grad[1]:
                # one cuBLASLt GEMM with the bias gradient in its epilogue where it applies (and the
                # backend's settings allow it), else the torch ops
                fused = None
                if ctx.weight_grad == "mvue24":
                    fused = (
                        mvue_weight_grad(dy2, x2, ctx.backend),
                        None,
                    )  # the bias gradient stays the exact sum
                elif ctx.fused_wgrad:
                    fused = weight_bias_grad(
                        dy2, x2, ctx.w_dtype, ctx.b_dtype if ctx.needs_input_grad[2] else None
                    )
                dw, db = fused if fused is not None else (dy2.t() @ x2, None)
                if scale is not None:
                    dw = dw * scale
                if ctx.masked_grad:
                    dw = torch.where(
                        sw.mask(), dw, torch.zeros((), dtype=dw.dtype, device=dw.device)
                    )
                dw = cast(dw, ctx.w_dtype)
            if ctx.needs_input_grad[2] and db is None:
                db = cast(dy2.sum(0), ctx.b_dtype)
        return dx, dw, db, None, None, None, None, None, None


class SemiSparseActivationFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, backend: Backend, pruning: str, dtype):
        with AutocastOff(x.device.type):
            x2 = cast(_rows(x, weight.shape[1]), dtype)
            w = cast(weight, dtype)
            sx = backend.sparsify(x2, pruning)  # x_s (tokens x in), 2:4 along features
            y = sx.matmul(w).t()  # (W @ x_s^T)^T
            if bias is not None:
                y = y + cast(bias, dtype)
        ctx.sx = sx
        record_input_meta(ctx, x, weight, bias)
        ctx.save_for_backward(w if ctx.needs_input_grad[0] else None)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        (w,) = ctx.saved_tensors
        sx = ctx.sx
        x_shape, x_dtype = ctx.x_meta
        dx = dw = db = None
        with AutocastOff(dy.device.type):
            dy2 = _rows(dy, dy.shape[-1])  # in the compute dtype, like y
            if ctx.needs_input_grad[0]:
                dx = (dy2 @ w).reshape(x_shape).to(x_dtype)  # straight-through to the dense x
            if ctx.needs_input_grad[1]:
                dw = sx.matmul_t(dy2.t()).to(
                    ctx.w_dtype
                )  # dy^T @ x_s: sparse when the pruning is transposable
            if ctx.needs_input_grad[2]:
                db = dy2.sum(0).to(ctx.b_dtype)
        return dx, dw, db, None, None, None


def semi_sparse_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    backend: str = "dense",
    pruning: str = "tile_greedy",
    masked_grad: bool = False,
    scale: torch.Tensor | None = None,
    weight_grad: str = "dense",
) -> torch.Tensor:
    """y = x @ prune(weight)^T [* scale] + bias with straight-through weight gradients (see the
    module docstring).

    `scale`: optional 0-d tensor multiplying the pruned weight (S-STE's beta for
    pruning="soft_threshold"). `weight_grad`: "dense" (dy^T @ x) | "mvue24" (MVUE24(dy^T) @ x,
    `sparsity.mvue_grad`; under torch.compile on cuSPARSELt only).
    """
    check_method(pruning)
    check_weight_grad(weight_grad)
    # the compiler's form: ops it can see and fuse (sparsity/traced.py)
    if torch.compiler.is_compiling():
        return traced.semi_sparse_linear(
            x, weight, bias, backend, pruning, masked_grad, scale, compute_dtype_for(x), weight_grad
        )
    return SemiSparseWeightFunction.apply(
        x,
        weight,
        bias,
        get_backend(backend),
        pruning,
        masked_grad,
        scale,
        compute_dtype_for(x),
        weight_grad,
    )


def semi_sparse_activation_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    backend: str = "dense",
    pruning: str = "rowwise",
) -> torch.Tensor:
    """y = prune(x) @ weight^T + bias, x pruned 2:4 along its last dim, straight-through gradient to
    x."""
    check_method(pruning)
    if torch.compiler.is_compiling():
        return traced.semi_sparse_activation_linear(x, weight, bias, pruning, compute_dtype_for(x))
    return SemiSparseActivationFunction.apply(
        x, weight, bias, get_backend(backend), pruning, compute_dtype_for(x)
    )
