"""GPU tests of the fused weight gradient (one cuBLASLt GEMM, bias gradient in its epilogue, fp32
outputs).

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu/test_fused_wgrad.py`. Fresh random inputs
for every check; results are compared with fp32 references by relative Frobenius error.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sparsity.backends.cuda import (
    rel_err as _rel,
)  # relative Frobenius error against an fp32 reference

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def wg():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from sparsity import weight_grad as W

    if W._lib() is None:
        pytest.skip(f"cuBLASLt through nvmath unavailable: {W._load_error}")
    return W


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "tokens,in_f,out_f", [(4096, 1024, 4096), (4100, 4096, 1024), (37, 64, 48), (1000, 96, 160)]
)
@pytest.mark.parametrize(
    "w_dtype,b_dtype", [(torch.float32, torch.float32), (torch.float32, None), ("same", "same")]
)
def test_weight_bias_grad_matches_fp32(wg, dtype, tokens, in_f, out_f, w_dtype, b_dtype):
    w_dtype = dtype if w_dtype == "same" else w_dtype
    b_dtype = dtype if b_dtype == "same" else b_dtype
    dy = torch.randn(tokens, out_f, device="cuda", dtype=dtype)
    x = torch.randn(tokens, in_f, device="cuda", dtype=dtype)
    got = wg.weight_bias_grad(dy, x, w_dtype, b_dtype)
    key = (
        torch.cuda.current_device(),
        dtype,
        tokens,
        in_f,
        out_f,
        torch.float32 if w_dtype == torch.float32 else dtype,
        b_dtype is not None,
    )
    rec = wg._decisions[key]
    # allowed only when the decision says why (no algorithm, or the torch ops were faster)
    if got is None:
        assert not rec["fused"] and ("reason" in rec or rec["torch_ms"] < rec["fused_ms"]), rec
        pytest.skip(f"torch ops chosen for this shape: {rec}")
    dw, db = got
    assert dw.dtype == w_dtype and dw.shape == (out_f, in_f)
    assert _rel(dw, dy.float().t() @ x.float()) < 1e-2
    if b_dtype is None:
        assert db is None
    else:
        assert db.dtype == b_dtype and db.shape == (out_f,)
        assert _rel(db, dy.float().sum(0)) < 1e-2
    # a second call (the cached plan, no check) on fresh inputs
    dy2, x2 = torch.randn_like(dy), torch.randn_like(x)
    dw2, db2 = wg.weight_bias_grad(dy2, x2, w_dtype, b_dtype)
    assert _rel(dw2, dy2.float().t() @ x2.float()) < 1e-2
    if b_dtype is not None:
        assert _rel(db2, dy2.float().sum(0)) < 1e-2


def test_non_contiguous_and_misaligned_inputs(wg):
    dy_big = torch.randn(2048, 4096 + 8, device="cuda", dtype=torch.bfloat16)
    dy = dy_big[:, 8:]  # rows strided, not contiguous
    x = torch.randn(2049 * 1024 + 3, device="cuda", dtype=torch.bfloat16)[3:].view(2049, 1024)[
        1:
    ]  # misaligned
    dw, db = wg.weight_bias_grad(dy, x, torch.float32, torch.float32) or pytest.skip(
        "torch ops chosen"
    )
    assert _rel(dw, dy.float().t() @ x.float()) < 1e-2
    assert _rel(db, dy.float().sum(0)) < 1e-2


def test_sparse_linear_gradients_with_fused_wgrad_under_autocast_and_graph(wg):
    """SemiSparseLinear over fp32 master weights under bf16 autocast: dW and db from the fused path
    equal the dense-masked reference's, eagerly and on CUDA-graph replays with new inputs."""
    from sparsity import SemiSparseLinear, get_backend

    torch.manual_seed(0)
    lin = nn.Linear(1024, 4096, device="cuda")
    sparse = SemiSparseLinear.from_dense(lin, backend="cusparselt")
    x = torch.randn(4096, 1024, device="cuda", requires_grad=True)
    dy = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def step():
        lin.weight.grad = lin.bias.grad = x.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = sparse(x)
        y.backward(dy)

    def reference():
        pruned = get_backend("cusparselt").sparsify(
            lin.weight.detach().to(torch.bfloat16), "tile_greedy"
        )
        wp = pruned.to_dense().float()
        return (
            dy.float().t() @ x.detach().to(torch.bfloat16).float(),
            dy.float().sum(0),
            dy.float() @ wp,
        )

    step()
    ref_w, ref_b, ref_x = reference()
    assert lin.weight.grad.dtype == torch.float32 and lin.bias.grad.dtype == torch.float32
    assert (
        _rel(lin.weight.grad, ref_w) < 1e-2
        and _rel(lin.bias.grad, ref_b) < 1e-2
        and _rel(x.grad, ref_x) < 1e-2
    )
    assert any(
        r["fused"] and r["in_features"] == 1024 and r["out_features"] == 4096
        for r in wg.decisions()
    )

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for _ in range(2):
        with torch.no_grad():
            x.copy_(torch.randn_like(x))
            dy.copy_(torch.randn_like(dy))
            lin.weight.add_(0.01 * torch.randn_like(lin.weight))
        g.replay()
        torch.cuda.synchronize()
        ref_w, ref_b, ref_x = reference()
        assert _rel(lin.weight.grad, ref_w) < 1e-2 and _rel(lin.bias.grad, ref_b) < 1e-2
        assert _rel(x.grad, ref_x) < 1e-2
