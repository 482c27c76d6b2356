"""Stochastic depth by batch subset, as the reference (`dinov2/layers/block.py`): a residual branch
runs on a random subset of the batch and is added back to those rows, scaled by batch / subset."""

import torch
from torch import Tensor

SUBSET_DROP_PATH_MIN_RATE = (
    0.1  # single-tensor forward: above this rate, drop by batch subset (reference)
)


def kept_samples(batch: int, rate: float) -> int:
    """How many of `batch` samples a residual branch runs on at drop-path `rate` (the reference's
    subset size)."""
    return max(int(batch * (1 - rate)), 1)


def batch_subset(batch: int, rate: float, device) -> tuple[Tensor, int, float]:
    """The reference's `get_branges_scales`: kept sample indices, their count and the residual
    scale."""
    keep = kept_samples(batch, rate)
    brange = torch.randperm(batch, device=device)[:keep]
    return brange, keep, batch / keep


class AddToRows(torch.autograd.Function):
    """out = x with `scale * residual` added to its rows `rows` (unique indices), summed in at least
    fp32 and rounded once. Backward is index_add's: x's gradient passes through untouched, the
    residual's is the gradient's rows times `scale`. Written out because autograd's own backward of
    a gather-add-scatter zeroes the rows of x's gradient and adds them back (two more passes over
    the stream per call, +15 ms of a compiled ViT-L step on one H100, results/bench/NOTES.md, "The
    gather-add-scatter of stochastic depth and its backward, measured (2026-11-26)")."""

    @staticmethod
    def forward(x: Tensor, rows: Tensor, residual: Tensor, scale: float) -> Tensor:
        acc = torch.promote_types(x.dtype, torch.float32)
        return x.index_put((rows,), (x[rows].to(acc) + residual.to(acc) * scale).to(x.dtype))

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, rows, residual, scale = inputs
        ctx.save_for_backward(rows)
        ctx.scale, ctx.residual_dtype = scale, residual.dtype

    @staticmethod
    def backward(ctx, grad: Tensor):
        (rows,) = ctx.saved_tensors
        return grad, None, (grad[rows] * ctx.scale).to(ctx.residual_dtype), None


def add_to_subset(x: Tensor, brange: Tensor, residual: Tensor, scale: float) -> Tensor:
    """`x` with `scale * residual` added to its rows `brange`: the reference's `torch.index_add(x,
    0, brange, residual, alpha=scale)`. The indices come from randperm, so they are unique and a
    gather-add-scatter computes the same sums without atomics; torch.compile lowers an index_add of
    a bf16 residual stream to ATen's bf16 atomic kernel, 12 ms of a ViT-L step on one H100
    (results/bench/NOTES.md, "What do the reference's numerics cost?"). The sum is rounded once,
    from at least fp32. An fp32 stream keeps index_add, which inductor fuses with atomics (fast, and
    the same fp32 sums), until the hand-written backward is timed against it on the GPU (same
    report, "The hand-written stochastic-depth backward, timed (2026-11-26)")."""
    if x.dtype in (torch.float32, torch.float64):
        return torch.index_add(x, 0, brange, residual.to(x.dtype), alpha=scale)
    return AddToRows.apply(x, brange, residual, scale)
