"""torch.compile (aot_eager, fullgraph) of a model with sparse linears gives the eager outputs and
gradients, and a swap back to dense after compiling is picked up (recompilation), not silently
ignored."""

import pytest
import torch
import torch._dynamo
from torch import nn

from sparsity import (
    SemiSparseActivationLinear,
    SemiSparseLinear,
    swap_linear_modules,
    swap_to_dense,
)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)
        self.fc3 = nn.Linear(16, 16)

    def forward(self, x):
        return self.fc3(torch.nn.functional.gelu(self.fc2(torch.nn.functional.gelu(self.fc1(x)))))


def _model():
    torch.manual_seed(0)
    m = Mlp()
    swap_linear_modules(m, pattern="fc1", pruning="tile_greedy")
    swap_linear_modules(m, pattern="fc2", pruning="soft_threshold", masked_grad=True)
    swap_linear_modules(m, pattern="fc3", module_cls=SemiSparseActivationLinear)
    return m


def _fwd_bwd(model, x, run=None):
    x = x.detach().clone().requires_grad_()
    for p in model.parameters():
        p.grad = None
    y = (model if run is None else run)(x)
    y.square().sum().backward()
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_equals_eager():
    model = _model()
    assert isinstance(model.fc1, SemiSparseLinear) and isinstance(
        model.fc3, SemiSparseActivationLinear
    )
    x = torch.randn(2, 6, 16)
    y_e, dx_e, g_e = _fwd_bwd(model, x)
    compiled = torch.compile(
        model, backend="aot_eager", fullgraph=True
    )  # fullgraph: no graph breaks allowed
    y_c, dx_c, g_c = _fwd_bwd(model, x, run=compiled)
    torch.testing.assert_close(y_c, y_e, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dx_c, dx_e, rtol=1e-6, atol=1e-6)
    for n in g_e:
        torch.testing.assert_close(g_c[n], g_e[n], rtol=1e-6, atol=1e-6, msg=n)


def test_swap_to_dense_after_compile_recompiles():
    model = _model()
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randn(4, 16)
    y_sparse = compiled(x)
    swap_to_dense(model)
    y_dense_eager = model(x)
    y_dense = compiled(x)
    assert not torch.allclose(y_sparse, y_dense)
    torch.testing.assert_close(y_dense, y_dense_eager, rtol=1e-6, atol=1e-6)
