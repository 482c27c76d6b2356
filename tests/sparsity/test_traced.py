"""The traced (torch.compile) form of the 2:4 layers on a CPU: equal to the eager autograd functions
for every pruning method, fullgraph (no graph break), under static and symbolic shapes; the
cuSPARSELt custom ops' fake implementations and autograd formula trace with symbolic sizes (their
kernels need a GPU: tests/gpu/test_compile_gpu.py).
"""

import pytest
import torch
import torch._dynamo
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import sparsity.backends.cusparselt.ops as ops
from sparsity import SemiSparseActivationLinear, SemiSparseLinear, swap_linear_modules
from sparsity.packing import layout as L

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _layer(cls, **opts):
    torch.manual_seed(0)
    holder = nn.Sequential(nn.Linear(32, 48))
    swap_linear_modules(holder, pattern="0", module_cls=cls, **opts)
    return holder[0]


def _fwd_bwd(fn, layer, x, autocast):
    x = x.detach().clone().requires_grad_()
    for p in layer.parameters():
        p.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = fn(x)
    (y.float() * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
    return [y.detach().float(), x.grad, layer.weight.grad, layer.bias.grad]


CASES = [
    (SemiSparseLinear, dict(pruning="tile_greedy")),
    (SemiSparseLinear, dict(pruning="tile_optimal", masked_grad=True)),
    (SemiSparseLinear, dict(pruning="rowwise")),
    (SemiSparseLinear, dict(pruning="soft_threshold")),
    (
        SemiSparseLinear,
        dict(pruning="tile_greedy", backend="auto"),
    ),  # auto is the dense math on a CPU
    (SemiSparseActivationLinear, dict(pruning="rowwise")),
]


@pytest.mark.parametrize("cls,opts", CASES, ids=[f"{c.__name__}-{o}" for c, o in CASES])
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_equals_eager_fp32(cls, opts, dynamic):
    layer = _layer(cls, **opts)
    x = torch.randn(3, 7, 32)  # 21 tokens: not a multiple of 4 or 8
    want = _fwd_bwd(layer, layer, x, autocast=False)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    got = _fwd_bwd(compiled, layer, x, autocast=False)
    for name, g, w in zip(("y", "dx", "dW", "db"), got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize(
    "cls,opts", CASES[:2] + CASES[-1:], ids=["tile_greedy", "tile_optimal-masked", "activation"]
)
def test_compiled_equals_eager_under_bf16_autocast_inductor(cls, opts):
    """fp32 master weights under bf16 autocast, as in training; inductor fuses the casts and the
    straight-through sum, so the results agree to bf16 rounding."""
    layer = _layer(cls, **opts)
    x = torch.randn(40, 32)
    want = _fwd_bwd(layer, layer, x, autocast=True)
    got = _fwd_bwd(torch.compile(layer, fullgraph=True), layer, x, autocast=True)
    for name, g, w in zip(("y", "dx", "dW", "db"), got, want):
        assert g.dtype == w.dtype, name
        rel = ((g.float() - w.float()).norm() / w.float().norm()).item()
        assert rel < 1e-2, (name, rel)


def test_compressed_size_matches_the_layout_for_ints():
    for m, k in [(16, 16), (48, 80), (256, 512), (4096, 1024), (1024, 4096), (96, 160)]:
        assert ops.compressed_size(m, k) == L.compressed_size(m, k)


def test_custom_op_fakes_and_autograd_trace_with_symbolic_shapes():
    """make_fx in symbolic mode runs only the fake implementations (and the registered backward), as
    torch.compile does with dynamic shapes: no TypeError on SymInts, and output sizes as the real
    ops'."""

    def step(w, x):
        fwd, dgrad, bits = torch.ops.sparsity.cslt_prune_pack(w.detach(), None, True)
        y = torch.ops.sparsity.cslt_linear(x, w, None, fwd, dgrad, w.shape[0], True, None)
        (dx, dw) = torch.autograd.grad(y.sum(), (x, w))
        return fwd, dgrad, bits, y, dx, dw

    w = torch.randn(64, 32, dtype=torch.bfloat16, requires_grad=True)
    x = torch.randn(24, 32, dtype=torch.bfloat16, requires_grad=True)
    gm = make_fx(step, tracing_mode="symbolic")(w, x)
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert {
        "sparsity.cslt_prune_pack.default",
        "sparsity.cslt_linear.default",
        "sparsity.cslt_mm.default",
    } <= targets
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert any(isinstance(d, torch.SymInt) for n in placeholders for d in n.meta["val"].shape)
    by_name = {str(n.target): n.meta["val"] for n in gm.graph.nodes if n.op == "call_function"}
    packed = by_name["sparsity.cslt_prune_pack.default"]
    assert [t.dtype for t in packed] == [torch.uint8, torch.uint8, torch.int16]
    assert by_name["sparsity.cslt_mm.default"].shape[1] == 32  # dx = dy @ W_s: (tokens, in)


def test_prune_op_equals_the_reference_and_traces():
    from sparsity.pruning import prune_reference

    w = torch.randn(16, 32)
    for method in ("tile_greedy", "tile_optimal", "rowwise", "soft_threshold"):
        values, mask = torch.ops.sparsity.prune(w, method, True)
        ref_values, ref_mask = prune_reference(w, method)
        assert torch.equal(values, ref_values) and torch.equal(mask, ref_mask), method
        values, empty = torch.ops.sparsity.prune(w, method, False)
        assert torch.equal(values, ref_values) and empty.numel() == 0, method
    gm = make_fx(
        lambda t: torch.ops.sparsity.prune(t, "tile_greedy", True), tracing_mode="symbolic"
    )(w)
    assert "sparsity.prune.default" in {str(n.target) for n in gm.graph.nodes}


def test_row_padding_appends_zero_rows_and_its_gradient_drops_them_under_symbolic_shapes():
    """The 2:4 op's row padding (a concatenation, and a split back): hand-computed rows and
    gradients, eager and traced with a symbolic token count (the compiled step's dynamic shapes)."""
    from sparsity.traced import _pad_rows, _unpad_rows

    x = torch.arange(6.0).reshape(3, 2).requires_grad_()
    padded = _pad_rows(x, 5)
    assert padded.tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]] + [[0.0, 0.0]] * 5
    (padded * torch.arange(1.0, 9.0)[:, None]).sum().backward()
    assert x.grad.tolist() == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]  # the zero rows give none back
    y = torch.arange(16.0).reshape(8, 2).requires_grad_()
    kept = _unpad_rows(y, 3)
    assert kept.tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    kept.sum().backward()
    assert y.grad.tolist() == [[1.0, 1.0]] * 3 + [[0.0, 0.0]] * 5

    def round_trip(t):
        return _unpad_rows(_pad_rows(t, 8 - t.shape[0] % 8) * 2, t.shape[0])

    gm = make_fx(round_trip, tracing_mode="symbolic")(torch.randn(11, 4))
    shapes = [n.meta["val"].shape for n in gm.graph.nodes if n.op == "placeholder"]
    assert isinstance(shapes[0][0], torch.SymInt)
    t = torch.randn(13, 4)
    torch.testing.assert_close(gm(t), t * 2, rtol=0, atol=0)
    # why a split and not a slice: the slice's gradient (slice_backward, a slice_scatter into zeros)
    # does not fuse with the concatenation that makes a one-matrix block's output gradient; the
    # split's is a concatenation
    grad = make_fx(
        lambda t: torch.autograd.grad(_unpad_rows(t, 5), t, torch.ones(5, 4))[0],
        tracing_mode="symbolic",
    )(torch.randn(8, 4, requires_grad=True))
    ops_used = {str(n.target) for n in grad.graph.nodes if n.op == "call_function"}
    assert "aten.cat.default" in ops_used, ops_used
    assert not any("slice_backward" in op or "slice_scatter" in op for op in ops_used), ops_used
