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


class TakeRows(torch.autograd.Function):
    """(x, x[rows]): the stream and its rows `rows` (unique indices) for a residual branch, with one
    backward for both uses of x: the branch's gradient added into the rows of the stream's own
    gradient, summed in the gradients' dtype and rounded once, as autograd's sum of the two would
    be. Written out because autograd's backward of the gather alone scatters the rows into a zero
    tensor of the whole batch, which its engine then adds to the stream's gradient: two more
    passes over the stream per branch (results/bench/NOTES.md, "What the 'norms and elementwise'
    class is made of")."""

    @staticmethod
    def forward(x: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
        return x.view_as(x), x[rows]

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[1])

    @staticmethod
    def backward(ctx, grad: Tensor, grad_rows: Tensor):
        (rows,) = ctx.saved_tensors
        return grad.index_put((rows,), grad[rows] + grad_rows), None


def take_rows(x: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """`(x, x[rows])` for a branch on the rows `rows` (from randperm: unique) whose output is added
    back to x; use the returned x for that add. Values are those of plain indexing, and so is x's
    gradient; it is computed as a gather-add-scatter of the branch's rows into the stream's gradient
    instead of a zero tensor of the batch, a scatter into it and an add."""
    return TakeRows.apply(x, rows)


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
