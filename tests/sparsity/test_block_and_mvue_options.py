"""The converter's block-sparse kind and MVUE weight gradient (the config's sparsity.kind=block,
sparsity.block_density / block_size, sparsity.weight_grad=mvue24)."""

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparsity import SemiSparseLinear, SparseThenDense
from sparsity.block_sparse import BlockSparseLinear
from sparsity.mvue_grad import mvue_calls, mvue_weight_grad
from sparsity.pruning import mvue


def mlp(width=64, hidden=128):
    torch.manual_seed(0)
    return nn.ModuleDict({"fc1": nn.Linear(width, hidden), "fc2": nn.Linear(hidden, width)})


def test_block_kind_converts_to_block_sparse_layers_and_back():
    model = mlp()
    weights = [model.fc1.weight, model.fc2.weight]
    conv = SparseThenDense(2, modules=r"fc[12]", kind="block", block_density=0.25, block_size=32)
    assert conv.convert(model) == ["fc1", "fc2"]
    for m in (model.fc1, model.fc2):
        assert type(m) is BlockSparseLinear and m.block_size == 32 and m.density == 0.25
        assert int(m.block_mask.sum()) == m.block_mask.numel() // 4
    assert [model.fc1.weight, model.fc2.weight] == weights  # the same Parameters
    assert "block-sparse (density 0.25, 32x32 blocks)" in conv.describe()
    x = torch.randn(5, 64)
    y = model.fc2(model.fc1(x))
    dense_mask = model.fc1.block_mask.repeat_interleave(32, 0).repeat_interleave(32, 1)
    torch.testing.assert_close(
        model.fc1(x), F.linear(x, model.fc1.weight * dense_mask, model.fc1.bias)
    )
    y.sum().backward()
    assert torch.equal(
        model.fc1.weight.grad[~dense_mask], torch.zeros(int((~dense_mask).sum()))
    )  # frozen blocks
    assert conv.revert(model) == ["fc1", "fc2"]
    assert type(model.fc1) is nn.Linear and "block_mask" not in model.fc1.state_dict()


def test_block_sparse_layer_compiles_to_the_same_math():
    model = mlp()
    SparseThenDense(1, modules=r"fc[12]", kind="block", block_density=0.5, block_size=32).convert(
        model
    )
    seq = nn.Sequential(model.fc1, nn.GELU(), model.fc2)
    x = torch.randn(6, 64)
    ref = seq(x)
    ref.sum().backward()
    grads = [p.grad.clone() for p in seq.parameters()]
    seq.zero_grad()
    out = torch.compile(seq, backend="eager", fullgraph=True)(x)
    out.sum().backward()
    torch.testing.assert_close(out, ref)
    for p, g in zip(seq.parameters(), grads):
        torch.testing.assert_close(p.grad, g)


@pytest.mark.parametrize(
    "values, key",
    [
        (dict(kind="block", block_size=40), "sparsity.block_size=40"),  # 40 does not divide 64
        (dict(kind="block", block_density=0.0), "sparsity.block_density=0.0"),
        (dict(kind="block", block_density=1.5), "sparsity.block_density=1.5"),
        (dict(kind="block", block_size=0), "sparsity.block_size=0"),
        (dict(weight_grad="mvue"), "sparsity.weight_grad='mvue'"),
        (
            dict(kind="activation", weight_grad="mvue24", pruning="rowwise"),
            "sparsity.weight_grad=mvue24",
        ),
        (dict(kind="block", weight_grad="mvue24"), "sparsity.weight_grad=mvue24"),
    ],
)
def test_bad_values_name_the_config_key(values, key):
    with pytest.raises(ValueError, match=key.replace("(", r"\(").replace(".", r"\.")):
        SparseThenDense(1, modules=r"fc[12]", backend="dense", **values).convert(mlp())


def test_mvue_weight_grad_is_the_mvue_of_dy_times_x_and_leaves_dx_db_exact():
    torch.manual_seed(1)
    x = torch.randn(
        2, 70, 16, requires_grad=True
    )  # 140 tokens: the first 128 pruned, the last 12 exact
    dense = nn.Linear(16, 8)
    mv = SemiSparseLinear.from_dense(nn.Linear(16, 8), backend="dense", weight_grad="mvue24")
    with torch.no_grad():
        mv.weight.copy_(dense.weight)
        mv.bias.copy_(dense.bias)
    ref_layer = SemiSparseLinear.from_dense(dense, backend="dense")
    dy = torch.randn(2, 70, 8)
    ref_layer(x).backward(dy)
    dx_ref, db_ref, dw_ref = x.grad.clone(), dense.bias.grad.clone(), dense.weight.grad.clone()
    x.grad = None
    before = mvue_calls()
    torch.manual_seed(5)
    mv(x).backward(dy)
    assert mvue_calls() == before + 1
    torch.manual_seed(5)
    seed = int(torch.randint(0, 2**62, ()))
    dy2, x2 = dy.reshape(140, 8), x.detach().reshape(140, 16)
    pruned = mvue(dy2[:128].t(), seed, impl="reference")
    assert ((pruned.reshape(8, 32, 4) != 0).sum(-1) == 2).all()  # 2:4 along tokens
    expected = pruned @ x2[:128] + dy2[128:].t() @ x2[128:]
    torch.testing.assert_close(mv.weight.grad, expected)
    assert not torch.allclose(mv.weight.grad, dw_ref)  # an estimate, not the dense gradient
    torch.testing.assert_close(x.grad, dx_ref)
    torch.testing.assert_close(mv.bias.grad, db_ref)
    assert "weight_grad=mvue24" in repr(mv)


def test_mvue_weight_grad_is_unbiased_and_exact_on_the_last_tokens():
    torch.manual_seed(2)
    dy2, x2 = torch.randn(76, 4, dtype=torch.float64), torch.randn(76, 3, dtype=torch.float64)
    draws = torch.stack([mvue_weight_grad(dy2, x2) for _ in range(4000)])
    torch.testing.assert_close(draws.mean(0), dy2.t() @ x2, atol=0.5, rtol=0.05)
    assert draws.std(0).min() > 0.1  # the first 64 tokens are drawn
    short = torch.stack([mvue_weight_grad(dy2[:63], x2[:63]) for _ in range(3)])
    assert torch.equal(short[0], short[1]) and torch.equal(
        short[0], short[2]
    )  # under 64 tokens: exact
    torch.testing.assert_close(short[0], dy2[:63].t() @ x2[:63])


def test_mvue_converter_and_compile():
    model = mlp()
    conv = SparseThenDense(1, modules=r"fc[12]", backend="dense", weight_grad="mvue24")
    conv.convert(model)
    assert all(m.weight_grad == "mvue24" for m in (model.fc1, model.fc2))
    assert "weight gradient mvue24" in conv.describe()
    before = mvue_calls()
    model.fc2(model.fc1(torch.randn(8, 64))).sum().backward()
    assert mvue_calls() == before + 2
    with pytest.raises(Exception, match="train.compile=false"):
        torch.compile(model.fc1, backend="eager", fullgraph=True)(torch.randn(8, 64))


def test_mvue_on_the_linears_weight_grad_modules_picks_and_the_dense_weight_gradient_elsewhere():
    model = mlp(width=16, hidden=32)
    conv = SparseThenDense(
        1, modules=r"fc[12]", backend="dense", weight_grad="mvue24", weight_grad_modules="fc2"
    )
    conv.convert(model)
    assert (model.fc1.weight_grad, model.fc2.weight_grad) == ("dense", "mvue24")
    assert "weight gradient mvue24 on fc2" in conv.describe()
    x = torch.randn(70, 16)  # 70 tokens: MVUE draws on the first 64
    h = model.fc1(x)
    h.retain_grad()
    before = mvue_calls()
    model.fc2(h).square().sum().backward()
    assert mvue_calls() == before + 1
    # fc1's weight gradient is the straight-through one, dy^T @ x, computed here by hand
    torch.testing.assert_close(model.fc1.weight.grad, h.grad.t() @ x)
    conv.revert(model)
    conv.convert(model)  # a second sparse phase picks the same linears
    assert (model.fc1.weight_grad, model.fc2.weight_grad) == ("dense", "mvue24")


@pytest.mark.parametrize(
    "values, message",
    [
        (
            dict(weight_grad_modules="fc2"),
            "sparsity.weight_grad_modules='fc2' picks the linears of sparsity.weight_grad",
        ),
        (
            dict(weight_grad="mvue24", weight_grad_modules="fc["),
            "sparsity.weight_grad_modules='fc[' is not a valid",
        ),
        (
            dict(weight_grad="mvue24", weight_grad_modules="fc3"),
            "sparsity.weight_grad_modules='fc3' matches none of "
            "the linears sparsity.modules selects (fc1, fc2)",
        ),
    ],
)
def test_weight_grad_modules_that_mean_nothing_are_refused_naming_the_key(values, message):
    from sparsity.converter import ConversionError

    model = mlp()
    with pytest.raises(ConversionError, match=re.escape(message)):
        SparseThenDense(1, modules=r"fc[12]", backend="dense", **values).convert(model)
    assert isinstance(model.fc1, nn.Linear) and not isinstance(
        model.fc1, SemiSparseLinear
    )  # nothing converted
