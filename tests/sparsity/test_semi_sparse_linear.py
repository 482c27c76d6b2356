"""SemiSparseLinear / SemiSparseActivationLinear on the dense backend: forward = F.linear on the
pruned weight (or input), straight-through gradients, the masked_grad option, autocast over fp32
master weights, the soft_threshold scale buffer, and the backend registry."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sparsity.backends as backends
from sparsity import (
    BackendUnavailable,
    SemiSparseActivationLinear,
    SemiSparseLinear,
    get_backend,
    is_transposable,
    prune,
    semi_sparse_linear,
    soft_threshold_scale,
)
from sparsity.backends.dense import DenseBackend
from sparsity.pruning import METHODS


def _linear(in_f=32, out_f=16, bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(in_f, out_f, bias=bias)


def _reference_weight_path(lin, x, method, dy):
    """Autograd through F.linear(x, W_s [* beta], b) with W_s a leaf: W_s.grad is the
    straight-through (unmasked) gradient (S-STE: the weight used is beta * S(W), and the gradient
    reaching S(W) passes to W unchanged)."""
    values, mask = prune(lin.weight.detach(), method, impl="reference")
    ws = values.clone().requires_grad_()
    xr = x.detach().clone().requires_grad_()
    br = None if lin.bias is None else lin.bias.detach().clone().requires_grad_()
    y = F.linear(
        xr, ws * soft_threshold_scale(lin.weight) if method == "soft_threshold" else ws, br
    )
    y.backward(dy)
    return y, xr.grad, ws.grad, None if br is None else br.grad, mask


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("bias", [True, False])
def test_forward_and_ste_gradients_equal_masked_linear(method, bias):
    lin = _linear(bias=bias)
    m = SemiSparseLinear.from_dense(lin, pruning=method)
    x = torch.randn(3, 5, 32, requires_grad=True)
    dy = torch.randn(3, 5, 16)
    y = m(x)
    y.backward(dy)
    y_ref, dx_ref, dw_ref, db_ref, _ = _reference_weight_path(lin, x, method, dy)
    torch.testing.assert_close(y, y_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad, dx_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        lin.weight.grad, dw_ref, rtol=1e-6, atol=1e-6
    )  # STE: dense, unmasked
    assert (lin.weight.grad != 0).float().mean() > 0.9
    if bias:
        torch.testing.assert_close(lin.bias.grad, db_ref)


@pytest.mark.parametrize("method", ["tile_greedy", "rowwise", "soft_threshold"])
def test_masked_grad_option(method):
    lin = _linear()
    m = SemiSparseLinear.from_dense(lin, pruning=method, masked_grad=True)
    x = torch.randn(7, 32, requires_grad=True)
    dy = torch.randn(7, 16)
    m(x).backward(dy)
    _, dx_ref, dw_ref, _, mask = _reference_weight_path(lin, x, method, dy)
    torch.testing.assert_close(lin.weight.grad, dw_ref * mask, rtol=1e-6, atol=1e-6)
    assert (lin.weight.grad[~mask] == 0).all()
    torch.testing.assert_close(x.grad, dx_ref, rtol=1e-6, atol=1e-6)
    assert "masked_grad=True" in repr(m)


def test_activation_variant_forward_and_ste():
    lin = _linear()
    m = SemiSparseActivationLinear.from_dense(lin)
    assert m.pruning == "rowwise"
    x = torch.randn(
        2, 7, 32, requires_grad=True
    )  # 14 tokens: any number of tokens works for rowwise
    dy = torch.randn(2, 7, 16)
    y = m(x)
    y.backward(dy)
    xs, _ = prune(x.detach().reshape(-1, 32), "rowwise", impl="reference")
    xs = xs.reshape(2, 7, 32).requires_grad_()
    w = lin.weight.detach().clone().requires_grad_()
    b = lin.bias.detach().clone().requires_grad_()
    y_ref = F.linear(xs, w, b)
    y_ref.backward(dy)
    torch.testing.assert_close(y, y_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad, xs.grad, rtol=1e-6, atol=1e-6)  # STE to the dense input
    torch.testing.assert_close(lin.weight.grad, w.grad, rtol=1e-6, atol=1e-6)  # dW = dy^T x_s
    torch.testing.assert_close(lin.bias.grad, b.grad)


def test_activation_variant_transposable_pruning_and_errors():
    lin = _linear()
    m = SemiSparseActivationLinear.from_dense(lin, pruning="tile_greedy")
    x = torch.randn(8, 32, requires_grad=True)
    m(x).sum().backward()
    with pytest.raises(ValueError, match=r"\(6, 32\)"):
        m(torch.randn(6, 32))  # 6 tokens cannot form 4x4 tiles
    with pytest.raises(ValueError, match="soft_threshold"):
        SemiSparseActivationLinear.from_dense(lin, pruning="soft_threshold")
    with pytest.raises(ValueError, match="in_features = 30"):
        SemiSparseActivationLinear.from_dense(nn.Linear(30, 8))


@pytest.mark.parametrize("cls", [SemiSparseLinear, SemiSparseActivationLinear])
def test_bf16_autocast_over_fp32_master_weights(cls):
    lin = _linear()
    m = cls.from_dense(lin)
    x = torch.randn(4, 6, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x)
        assert y.dtype == torch.bfloat16
        loss = y.float().square().sum()
    loss.backward()
    assert lin.weight.grad.dtype == torch.float32 and lin.bias.grad.dtype == torch.float32
    assert x.grad.dtype == torch.float32
    # same as the module run in bf16 on bf16 copies (the weight is cast inside the function)
    mb = cls.from_dense(nn.Linear(32, 16).to(torch.bfloat16))
    with torch.no_grad():
        mb.weight.copy_(lin.weight)
        mb.bias.copy_(lin.bias)
    yb = mb(x.detach().to(torch.bfloat16))
    assert torch.equal(y, yb)


def test_compute_dtype_without_autocast_follows_x():
    m = SemiSparseLinear.from_dense(_linear())
    y = m(torch.randn(4, 32, dtype=torch.float64))
    assert y.dtype == torch.float64
    m.weight.grad = None


def test_non_contiguous_input_and_frozen_parts():
    lin = _linear()
    m = SemiSparseLinear.from_dense(lin)
    base = torch.randn(32, 10, requires_grad=True)
    x = base.t()  # (10, 32), non-contiguous
    y = m(x)
    torch.testing.assert_close(y, F.linear(x, prune(lin.weight, "tile_greedy")[0], lin.bias))
    y.sum().backward()
    assert base.grad.shape == (32, 10)
    # weight frozen, input without grad: only what is needed is computed
    lin.weight.requires_grad_(False)
    lin.bias.grad = None
    m(torch.randn(4, 32)).sum().backward()
    assert lin.bias.grad is not None


def test_functional_scale_applies_to_output_and_both_grads():
    lin = _linear()
    x = torch.randn(5, 32, requires_grad=True)
    scale = torch.tensor(1.5)
    y = semi_sparse_linear(x, lin.weight, lin.bias, pruning="rowwise", scale=scale)
    values = prune(lin.weight.detach(), "rowwise")[0]
    torch.testing.assert_close(y, F.linear(x, values * 1.5, lin.bias))
    dy = torch.randn(5, 16)
    y.backward(dy)
    torch.testing.assert_close(x.grad, dy @ (values * 1.5))
    torch.testing.assert_close(lin.weight.grad, 1.5 * dy.t() @ x.detach())
    torch.testing.assert_close(lin.bias.grad, dy.sum(0))


def test_soft_threshold_scale_buffer_state_dict_and_resume():
    lin = _linear()
    m = SemiSparseLinear.from_dense(lin, pruning="soft_threshold")
    assert set(m.state_dict()) == {"weight", "bias", "soft_threshold_scale"}
    beta0 = m.soft_threshold_scale.clone()
    assert torch.equal(beta0, soft_threshold_scale(lin.weight))
    # weights move on; the stored beta does not
    with torch.no_grad():
        lin.weight.mul_(3.0)
    assert torch.equal(m.soft_threshold_scale, beta0)
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    # a fresh module (beta computed from other weights) loads the stored value exactly
    other = SemiSparseLinear.from_dense(_linear(seed=5), pruning="soft_threshold")
    other.load_state_dict(sd)
    assert torch.equal(other.soft_threshold_scale, beta0)
    # an nn.Linear state dict (no key): beta recomputed from the loaded weight, strict loading still
    # passes
    other.load_state_dict({"weight": sd["weight"], "bias": sd["bias"]})
    assert torch.equal(other.soft_threshold_scale, soft_threshold_scale(sd["weight"]))
    # switching methods adds / removes the buffer
    other.configure(pruning="tile_greedy")
    assert set(other.state_dict()) == {"weight", "bias"}


def test_shape_errors_name_the_shape():
    with pytest.raises(ValueError, match=r"\(16, 30\)"):
        SemiSparseLinear.from_dense(nn.Linear(30, 16))
    with pytest.raises(ValueError, match=r"\(6, 32\)"):
        SemiSparseLinear.from_dense(nn.Linear(32, 6), pruning="tile_optimal")
    SemiSparseLinear.from_dense(
        nn.Linear(32, 6), pruning="rowwise"
    )  # rows are free for row-wise methods
    with pytest.raises(TypeError):
        SemiSparseLinear.from_dense(nn.Conv1d(4, 4, 1))


def test_constructor_and_repr():
    m = SemiSparseLinear(32, 16, backend="dense", pruning="tile_optimal")
    assert repr(m) == (
        "SemiSparseLinear(in_features=32, out_features=16, bias=True, backend=dense, "
        "pruning=tile_optimal)"
    )
    assert m(torch.randn(2, 32)).shape == (2, 16)
    assert SemiSparseActivationLinear(32, 16, bias=False).pruning == "rowwise"


def test_backend_registry():
    assert get_backend("dense") is get_backend("dense")
    assert isinstance(get_backend("dense"), DenseBackend)
    with pytest.raises(ValueError, match="unknown sparse backend"):
        get_backend("cublas")
    with pytest.raises(ValueError, match="unknown sparse backend"):
        SemiSparseLinear.from_dense(_linear(), backend="cublas")
    assert "dense" in backends.available_backends(torch.device("cpu"), torch.float32)


def test_missing_backend_module_is_unavailable(monkeypatch):
    monkeypatch.setitem(
        backends._IMPLEMENTATIONS, "ghost", ("sparsity.backends.no_such_module", "Ghost")
    )
    with pytest.raises(BackendUnavailable, match="not available in this build"):
        get_backend("ghost")


@pytest.mark.parametrize("method", METHODS)
def test_dense_backend_contract(method):
    w = torch.randn(16, 32)
    sw = get_backend("dense").sparsify(w, method)
    values, mask = prune(w, method)
    assert (
        torch.equal(sw.to_dense(), values) and torch.equal(sw.mask(), mask) and sw.shape == w.shape
    )
    x, dy = torch.randn(5, 32), torch.randn(5, 16)
    b = torch.randn(16)
    torch.testing.assert_close(sw.matmul(x, b), x @ values.t() + b)
    torch.testing.assert_close(sw.matmul_t(dy), dy @ values)
    assert is_transposable(method) == (
        method in ("tile_greedy", "tile_greedy_signed", "tile_optimal")
    )


def test_autocast_off_restores_the_callers_state_even_on_error():
    from sparsity.autograd import AutocastOff

    with torch.autocast("cpu", dtype=torch.bfloat16):
        with AutocastOff("cpu"):
            assert not torch.is_autocast_enabled("cpu")
        assert (
            torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        )
        with pytest.raises(ZeroDivisionError):
            with AutocastOff("cpu"):
                1 / 0
        assert torch.is_autocast_enabled("cpu")
    with AutocastOff("cpu"):  # autocast was off: stays off, and is not switched on afterwards
        assert not torch.is_autocast_enabled("cpu")
    assert not torch.is_autocast_enabled("cpu")
