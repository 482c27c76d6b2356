"""BlockSparseLinear: block selection, the torch path against dense masked math, the Triton
block-sparse GEMMs (interpreted on CPU) against the torch path, state dict and re-selection."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparsity import BlockSparseLinear, block_sparse_linear, select_blocks
from sparsity.block_sparse import BlockLayout

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _dense_mask(mask, bs):
    return mask.repeat_interleave(bs, 0).repeat_interleave(bs, 1)


def test_select_blocks_by_magnitude_with_ties():
    w = torch.zeros(8, 12)
    w[4:8, 0:4] = 3.0  # block (1, 0): largest
    w[0:4, 8:12] = 1.0  # block (0, 2)
    w[4:8, 8:12] = -1.0  # block (1, 2): ties with (0, 2), higher index
    m = select_blocks(w, density=2 / 6, block_size=4)
    assert m.tolist() == [[False, False, True], [True, False, False]]
    assert select_blocks(w, density=0.01, block_size=4).sum() == 1  # at least one block
    with pytest.raises(ValueError, match=r"\(8, 12\)"):
        select_blocks(w, 0.5, 8)
    with pytest.raises(ValueError, match="density"):
        select_blocks(w, 0.0, 4)


def test_torch_path_equals_masked_linear_with_masked_grads():
    torch.manual_seed(0)
    lin = nn.Linear(32, 24)
    m = BlockSparseLinear.from_dense(lin, density=0.4, block_size=8, impl="torch")
    assert m.weight is lin.weight and m.bias is lin.bias
    mask = _dense_mask(m.block_mask, 8)
    x = torch.randn(3, 5, 32, requires_grad=True)
    dy = torch.randn(3, 5, 24)
    y = m(x)
    y.backward(dy)
    wm = (lin.weight.detach() * mask).requires_grad_()
    xr = x.detach().clone().requires_grad_()
    y_ref = F.linear(xr, wm, lin.bias.detach())
    y_ref.backward(dy)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(lin.weight.grad, wm.grad * mask)  # pruned blocks get no gradient
    assert (lin.weight.grad[~mask] == 0).all()
    torch.testing.assert_close(lin.bias.grad, dy.sum((0, 1)))


def _run(impl, x, w, b, layout, dy):
    if impl == "triton":
        pytest.importorskip("triton")
    x = x.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    b = None if b is None else b.detach().clone().requires_grad_()
    y = block_sparse_linear(x, w, b, layout, impl=impl)
    y.backward(dy)
    return y, x.grad, w.grad, None if b is None else b.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "block_size,density,bias", [(16, 0.5, True), (32, 0.25, False), (16, 0.1, True)]
)
def test_triton_kernels_equal_torch_path(dtype, block_size, density, bias):
    g = torch.Generator().manual_seed(block_size)
    n, k, m = (
        64,
        96,
        37,
    )  # m not a multiple of the row tile; at density 0.1 some block rows/cols are empty
    w = torch.randn(n, k, generator=g).to(dtype).to(DEVICE)
    b = torch.randn(n, generator=g).to(dtype).to(DEVICE) if bias else None
    x = torch.randn(m, k, generator=g).to(dtype).to(DEVICE)
    dy = torch.randn(m, n, generator=g).to(dtype).to(DEVICE)
    layout = BlockLayout.from_mask(select_blocks(w, density, block_size), block_size)
    ref = _run("torch", x, w, b, layout, dy)
    got = _run("triton", x, w, b, layout, dy)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    for name, a, r in zip(("y", "dx", "dw", "db"), got, ref):
        if r is None:
            assert a is None
            continue
        assert a.dtype == r.dtype, name
        torch.testing.assert_close(a.float(), r.float(), rtol=tol, atol=tol * 4, msg=name)
    mask = _dense_mask(layout.mask, block_size)
    assert (got[2][~mask] == 0).all()


def test_triton_kernels_non_contiguous_and_leading_dims():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(32, 64, generator=g).to(DEVICE)
    layout = BlockLayout.from_mask(select_blocks(w, 0.5, 16), 16)
    x = torch.randn(64, 2, 9, generator=g).to(DEVICE).permute(1, 2, 0)  # (2, 9, 64), non-contiguous
    dy = torch.randn(2, 9, 32, generator=g).to(DEVICE)
    for a, r in zip(
        _run("triton", x, w, None, layout, dy)[:3], _run("torch", x, w, None, layout, dy)[:3]
    ):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5)


def test_state_dict_reselect_and_layout_cache():
    torch.manual_seed(0)
    m = BlockSparseLinear(32, 16, density=0.5, block_size=8)
    assert set(m.state_dict()) == {"weight", "bias", "block_mask"}
    assert "density=0.5, block_size=8" in repr(m)
    lay = m.layout()
    assert m.layout() is lay  # cached
    with torch.no_grad():
        m.weight.copy_(torch.randn(16, 32))
    m.select_blocks()
    assert m.layout() is not lay and torch.equal(m.layout().mask, m.block_mask)
    other = BlockSparseLinear(32, 16, density=0.5, block_size=8)
    other.load_state_dict(m.state_dict())
    assert torch.equal(other.block_mask, m.block_mask) and torch.equal(
        other.layout().mask, m.block_mask
    )
    # an nn.Linear state dict: blocks re-selected from the loaded weight
    other.load_state_dict({"weight": m.weight.detach() * 2, "bias": m.bias.detach()})
    assert torch.equal(other.block_mask, select_blocks(m.weight * 2, 0.5, 8))
    dense = other.to_dense()
    assert type(dense) is nn.Linear and dense.weight is other.weight


def test_autocast_bf16_over_fp32_weights():
    torch.manual_seed(0)
    m = BlockSparseLinear(32, 16, density=0.5, block_size=8)
    x = torch.randn(4, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert m.weight.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
