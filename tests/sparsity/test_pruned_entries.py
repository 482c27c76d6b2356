"""The pruned entries' remedies and statistics (`sparsity.pruned_entries`, the converter's
`pruned_grad` and `pruned_decay`), each against a case computed by hand: a 4x4 weight whose
transposable tile mask is its two diagonal 2x2 blocks, and 2x4 weights pruned row by row.

Eager and compiled (the traced form torch.compile sees) give the same hand-computed gradients; the
decay uses the mask of the dtype the forward pruned in; the flip rate, pruned share and
gradient-to-weight ratio are the numbers a pencil gives.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from sparsity import SemiSparseLinear, SparseThenDense
from sparsity.pruned_entries import MaskStats, decay_pruned_grads, weight_mask

# |w| order puts 9, 8, 7, 6 in the top-left block and 5, 4, 3, 2 in the bottom-right one: the tile walk keeps those
# two blocks (each row and column then holds two), and drops the small off-diagonal entries
W_TILE = torch.tensor(
    [[9.0, 8.0, 0.1, -0.2], [7.0, -6.0, 0.3, 0.4], [0.5, -0.6, 5.0, 4.0], [0.7, 0.8, -3.0, 2.0]]
)
KEPT_TILE = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
X = torch.tensor([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.5, 0.0, 2.0]])  # 2 tokens
DY = torch.tensor([[1.0, 0.0, -1.0, 2.0], [0.5, 1.0, 0.0, -1.0]])


def _layer(weight: torch.Tensor, **opts) -> SemiSparseLinear:
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(weight)
    return SemiSparseLinear.from_dense(lin, backend="dense", **opts)


def _weight_grad(layer: nn.Module, fn=None) -> torch.Tensor:
    layer.weight.grad = None
    y = (layer if fn is None else fn)(X)
    y.backward(DY)
    return layer.weight.grad


def test_the_hand_computed_mask():
    assert torch.equal(weight_mask(W_TILE, "tile_greedy"), KEPT_TILE)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_ste_and_masked_gradients(compiled):
    dense_grad = (
        DY.t() @ X
    )  # dL/dW of y = x W_s^T for the straight-through estimator: the whole dy^T x
    for masked, want in ((False, dense_grad), (True, dense_grad * KEPT_TILE)):
        layer = _layer(W_TILE, pruning="tile_greedy", masked_grad=masked)
        fn = torch.compile(layer, backend="aot_eager", fullgraph=True) if compiled else None
        torch.testing.assert_close(_weight_grad(layer, fn), want)
        # the forward is the pruned weight's either way
        torch.testing.assert_close(
            (layer if fn is None else fn)(X).detach(), X @ (W_TILE * KEPT_TILE).t()
        )


def test_converter_pruned_grad_sets_the_layers_and_refuses_other_kinds():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    conv = SparseThenDense(4, modules=r"\d", backend="dense", pruned_grad="masked")
    conv.convert(model)
    assert all(m.masked_grad for m in model)
    assert "pruned entries get no gradient" in conv.describe()
    with pytest.raises(ValueError, match="sparsity.pruned_grad='none' is not one of ste, masked"):
        SparseThenDense(4, pruned_grad="none")
    with pytest.raises(ValueError, match="apply to sparsity.kind=weight only, not activation"):
        SparseThenDense(4, kind="activation", pruned_grad="masked")
    with pytest.raises(ValueError, match="apply to sparsity.kind=weight only, not block"):
        SparseThenDense(4, kind="block", pruned_decay=1e-3)
    with pytest.raises(ValueError, match="needs a masking sparsity.pruning, not soft_threshold"):
        SparseThenDense(4, pruning="soft_threshold", pruned_decay=1e-3)
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        SparseThenDense(4, pruned_decay=-1.0)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_decay_adds_strength_times_the_pruned_weights(compiled):
    strength = 0.25
    model = nn.Sequential(nn.Linear(4, 4, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(W_TILE)
    conv = SparseThenDense(
        10, modules="0", backend="dense", pruning="tile_greedy", pruned_decay=strength
    )
    conv.convert(model)
    fn = torch.compile(model, backend="aot_eager", fullgraph=True) if compiled else None
    grad = _weight_grad(model[0], fn).clone()
    assert conv.decay_pruned() == 1
    # by hand: only the 8 off-diagonal entries change, each by 0.25 x its own value
    want = grad + strength * torch.where(KEPT_TILE, torch.zeros(()), W_TILE)
    torch.testing.assert_close(model[0].weight.grad, want)
    assert model[0].weight.grad[2, 0].item() == pytest.approx(
        grad[2, 0].item() + 0.125
    )  # 0.5 x 0.25
    # the dense phase decays nothing; a weight without gradient is skipped
    conv.revert(model)
    before = model[0].weight.grad.clone()
    assert conv.decay_pruned() == 0 and torch.equal(model[0].weight.grad, before)
    conv.convert(model)
    model[0].weight.grad = None
    assert conv.decay_pruned() == 0


@pytest.mark.parametrize("scale", [0.5, torch.tensor(0.5)])
def test_a_scaled_decay_adds_its_share_of_the_strength(scale):
    """A ramp's step: grad += strength x scale x the pruned weights, the scale a float or a 0-d
    tensor (what a captured CUDA graph reads from device memory)."""
    layer = _layer(W_TILE)
    grad = _weight_grad(layer).clone()
    assert decay_pruned_grads([layer], 0.25, scale=scale) == 1
    # by hand: the off-diagonal entries, each by 0.25 x 0.5 x its own value; 0.5 -> +0.0625
    torch.testing.assert_close(
        layer.weight.grad, grad + 0.125 * torch.where(KEPT_TILE, torch.zeros(()), W_TILE)
    )
    assert layer.weight.grad[2, 0].item() == pytest.approx(grad[2, 0].item() + 0.0625)
    assert layer.weight.grad[0, 0].item() == grad[0, 0].item()  # a kept entry: untouched


def test_decay_uses_the_mask_of_the_forward_dtype():
    # fp32 keeps 1.002 and 1.001; in bf16 all three round to 1.0, and the tie keeps the first two
    # positions
    w = torch.tensor([[1.002, 1.0, 1.001, 0.0], [0.1, 0.2, 0.3, 0.4]])
    assert weight_mask(w, "rowwise")[0].tolist() == [True, False, True, False]
    assert weight_mask(w, "rowwise", torch.bfloat16)[0].tolist() == [True, True, False, False]
    for dtype, decayed in ((None, 1), (torch.bfloat16, 2)):
        layer = _layer(w, pruning="rowwise")
        layer.weight.grad = torch.zeros_like(w)
        decay_pruned_grads([layer], 1.0, dtype)
        got = layer.weight.grad[0]
        assert got.nonzero().flatten().tolist() == [decayed], dtype
        assert got[decayed].item() == pytest.approx(w[0, decayed].item())
        torch.testing.assert_close(layer.weight.grad[1], torch.tensor([0.1, 0.2, 0.0, 0.0]))


def test_mask_stats_by_hand():
    # rowwise 2:4: row 0 keeps 4 and 3, row 1 keeps 3 and 4
    w = nn.Parameter(torch.tensor([[4.0, -1.0, 3.0, 0.5], [1.0, 2.0, 3.0, 4.0]]))
    other = nn.Parameter(
        torch.tensor([[0.0, 0.0, 1.0, -1.0]])
    )  # keeps the two nonzero entries: nothing pruned
    stats = MaskStats("rowwise")
    first = stats.update({"a": w, "b": other})
    assert (
        first.flip_rate == {"a": None, "b": None} and first.total_flip_rate is None
    )  # nothing to compare yet
    assert first.pruned_share["a"] == pytest.approx((1 + 0.5 + 1 + 2) / (8.5 + 10))
    assert first.pruned_share["b"] == 0.0
    assert first.total_pruned_share == pytest.approx(4.5 / 20.5)
    assert first.grad_to_weight == {"a": None, "b": None} and first.total_grad_to_weight is None

    with torch.no_grad():
        w[0, 2] = 0.1  # row 0 now keeps 4 and -1: two entries of eight changed
    w.grad = torch.tensor([[9.0, 3.0, 9.0, 4.0], [0.0, 1.0, 9.0, 9.0]])
    other.grad = torch.zeros_like(other)
    second = stats.update({"a": w, "b": other})
    assert second.flip_rate == {"a": 2 / 8, "b": 0.0}
    assert second.total_flip_rate == pytest.approx(2 / 12)
    # pruned in a: 0.1, 0.5 (row 0), 1, 2 (row 1); their gradients 9, 4, 0, 1
    assert second.grad_to_weight["a"] == pytest.approx(
        math.sqrt((81 + 16 + 0 + 1) / (0.01 + 0.25 + 1 + 4))
    )
    assert second.total_grad_to_weight == pytest.approx(
        second.grad_to_weight["a"]
    )  # b prunes nothing
    third = stats.update({"a": w, "b": other})
    assert third.flip_rate["a"] == 0.0
    stats.reset()
    assert stats.update({"a": w}).flip_rate["a"] is None
