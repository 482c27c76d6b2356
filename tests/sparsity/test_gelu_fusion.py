"""GELU taken into a 2:4 fc1 (`sparsity.gelu_fusion`): the fused MLP computes the function of a hand-written
reference (row-wise 2:4 by |w|, top two of each four, straight-through weight gradients), with and without
gradients; the module tree, the state dict and the GELU module itself come back on unfusing; only timm's `Mlp` (or
the parents named) is fused; without gradients the layer asks its backend for the GELU epilogue
(`SparseWeight.matmul_gelu`), with gradients it does not."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparsity import SparseThenDense, fuse_gelu, swap_linear_modules, swap_to_dense, unfuse_gelu
from sparsity.backends.base import SparseWeight
from sparsity.modules import SemiSparseLinear
from sparsity.torchvision_compat import ensure_torchvision_importable

ensure_torchvision_importable()  # before timm (CPU-only torch with PyPI's torchvision)

from timm.layers import GluMlp, Mlp  # noqa: E402

FC = r"mlp\.fc[12]"


class Net(nn.Module):
    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        return self.mlp(x)


def _net(seed=0, dim=32, hidden=64, approximate="none"):
    torch.manual_seed(seed)
    return Net(Mlp(dim, hidden, act_layer=lambda: nn.GELU(approximate=approximate)))


def _rowwise_2to4(w: torch.Tensor) -> torch.Tensor:
    """The two largest |w| of each group of four consecutive entries of a row kept, written out here."""
    groups = w.reshape(w.shape[0], -1, 4)
    keep = torch.zeros_like(groups, dtype=torch.bool)
    keep.scatter_(-1, groups.abs().topk(2, dim=-1).indices, True)
    return (groups * keep).reshape(w.shape)


def _reference(net: Net, x: torch.Tensor, approximate: str):
    """The MLP on pruned weights given as leaves (their gradients are the straight-through ones), and the leaves."""
    mlp = net.mlp
    w1 = _rowwise_2to4(mlp.fc1.weight.detach()).requires_grad_()
    w2 = _rowwise_2to4(mlp.fc2.weight.detach()).requires_grad_()
    b1, b2 = (mlp.fc1.bias.detach().clone().requires_grad_(), mlp.fc2.bias.detach().clone().requires_grad_())
    h = F.gelu(x @ w1.t() + b1, approximate=approximate)
    return h @ w2.t() + b2, (w1, w2, b1, b2)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_fused_mlp_computes_the_reference_with_and_without_gradients(approximate):
    net = _net(approximate=approximate)
    swap_linear_modules(net, pattern=FC, backend="dense", pruning="rowwise")
    assert fuse_gelu(net) == ["mlp.fc1"]
    assert isinstance(net.mlp.act, nn.Identity) and net.mlp.fc1.gelu == approximate
    x = torch.randn(10, 32, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    want, leaves = _reference(net, xr, approximate)
    with torch.no_grad():
        torch.testing.assert_close(net(x), want.detach(), rtol=1e-5, atol=1e-6)
    got = net(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    dy = torch.randn_like(got)
    got.backward(dy)
    want.backward(dy)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-6)
    mlp = net.mlp
    for param, leaf in zip((mlp.fc1.weight, mlp.fc2.weight, mlp.fc1.bias, mlp.fc2.bias), leaves):
        torch.testing.assert_close(param.grad, leaf.grad, rtol=1e-5, atol=1e-6)


def test_unfusing_puts_the_same_gelu_module_back_and_keeps_the_state_dict():
    net = _net()
    act = net.mlp.act
    keys = list(net.state_dict())
    swap_linear_modules(net, pattern=FC, backend="dense")
    fuse_gelu(net)
    assert list(net.state_dict()) == keys
    assert "gelu=none" in repr(net.mlp.fc1)
    assert unfuse_gelu(net) == ["mlp.fc1"]
    assert net.mlp.act is act and net.mlp.fc1.gelu is None
    fuse_gelu(net)
    assert swap_to_dense(net) == ["mlp.fc1", "mlp.fc2"]  # unfuses first
    assert net.mlp.act is act and type(net.mlp.fc1) is nn.Linear and "gelu" not in net.mlp.fc1.__dict__
    assert list(net.state_dict()) == keys
    assert unfuse_gelu(net) == []


def test_only_named_parents_with_an_exact_gelu_after_a_2to4_fc1_are_fused():
    torch.manual_seed(0)
    glu = Net(GluMlp(32, 64, act_layer=nn.GELU))  # splits fc1's output before its GELU: must not be fused
    swap_linear_modules(glu, pattern=FC, backend="dense")
    assert fuse_gelu(glu) == [] and isinstance(glu.mlp.act, nn.GELU)
    relu = Net(Mlp(32, 64, act_layer=nn.ReLU))
    swap_linear_modules(relu, pattern=FC, backend="dense")
    assert fuse_gelu(relu) == []
    dense_fc1 = _net()
    swap_linear_modules(dense_fc1, pattern=r"mlp\.fc2", backend="dense")
    assert fuse_gelu(dense_fc1) == []  # fc1 is not 2:4

    class MyMlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    mine = Net(MyMlp())
    swap_linear_modules(mine, pattern=FC, backend="dense")
    assert fuse_gelu(mine) == []  # not timm's Mlp
    assert fuse_gelu(mine, parents=(MyMlp,)) == ["mlp.fc1"]


def test_the_epilogue_is_asked_for_only_where_no_gradient_is(monkeypatch):
    calls = []
    plain = SparseWeight.matmul_gelu

    def spy(self, x, bias, approximate):
        calls.append(approximate)
        return plain(self, x, bias, approximate)

    monkeypatch.setattr(SparseWeight, "matmul_gelu", spy)
    net = _net(approximate="tanh")
    swap_linear_modules(net, pattern=FC, backend="dense")
    fuse_gelu(net)
    x = torch.randn(6, 32)
    net(x)  # parameters require gradients: the GEMM, then the module's GELU
    assert calls == []
    with torch.no_grad():
        net(x)
    assert calls == ["tanh"]
    for p in net.parameters():  # an EMA teacher's: no gradients asked although grad mode is on
        p.requires_grad_(False)
    net(x)
    assert calls == ["tanh", "tanh"]


def test_compiled_fused_mlp_equals_eager():
    net = _net()
    swap_linear_modules(net, pattern=FC, backend="dense", pruning="rowwise")
    fuse_gelu(net)
    x = torch.randn(12, 32)
    compiled = torch.compile(net, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        want, _ = _reference(net, x, "none")
        torch.testing.assert_close(compiled(x), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled(x), want, rtol=1e-5, atol=1e-6)


def test_converter_fuses_in_the_sparse_phase_and_restores_at_the_switch():
    net = _net()
    act = net.mlp.act
    conv = SparseThenDense(sparse_steps=5, modules=FC, backend="dense", fuse_gelu=True)
    conv.apply(net, 0)
    assert isinstance(net.mlp.fc1, SemiSparseLinear) and net.mlp.fc1.gelu == "none"
    assert isinstance(net.mlp.act, nn.Identity) and "GELU" in conv.describe()
    conv.apply(net, 5)
    assert net.mlp.act is act and type(net.mlp.fc1) is nn.Linear
    assert SparseThenDense(sparse_steps=5, modules=FC, backend="dense").fuse_gelu is False
    with pytest.raises(ValueError, match=r"sparsity\.fuse_gelu=true applies to sparsity\.kind=weight only"):
        SparseThenDense(sparse_steps=5, modules=FC, kind="block", fuse_gelu=True)
