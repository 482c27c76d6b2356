"""GPU tests of the CUTLASS backend (torch core's sm8x 2:4 kernels). The GEMM tests need an sm8x GPU
(A100) and skip elsewhere with the reason; the tie-breaking check of torch's tile pruner runs on any
CUDA GPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytestmark = pytest.mark.gpu


def _rel(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _is_sm8x():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 8


needs_sm8x = pytest.mark.skipif(
    not _is_sm8x(),
    reason="torch's CUTLASS 2:4 GEMM supports only compute capability 8.x (run on an A100)",
)


def test_check_reason_off_sm8x():
    if not torch.cuda.is_available() or _is_sm8x():
        pytest.skip("needs a CUDA GPU that is not sm8x")
    from sparsity.backends import BackendUnavailable, get_backend

    with pytest.raises(BackendUnavailable, match="supports only compute capability 8.x"):
        get_backend("cutlass").check(torch.device("cuda"), torch.bfloat16)


def test_torch_tile_mask_vs_reference_ties():
    """torch's fused tile pruner (runs on sm90 too) against our tile_greedy: same on tie-free
    inputs; differences confined to tiles with exactly equal |w| otherwise."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from sparsity.pruning.reference import tile_greedy_mask

    for dtype in (torch.bfloat16, torch.float16):
        w = torch.randn(1024, 1024, device="cuda", dtype=torch.float32)
        w = (w + torch.arange(w.numel(), device="cuda").reshape(w.shape) * 1e-7).to(
            dtype
        )  # few ties
        *_, bitmask = torch._sparse_semi_structured_tile(
            w, "largest_abs_values_greedy", use_cutlass=True
        )
        theirs = torch._sparse_semi_structured_apply_dense(w, bitmask) != 0
        ours = tile_greedy_mask(w) & (w != 0)
        tiles_t = theirs.reshape(256, 4, 256, 4).permute(0, 2, 1, 3).reshape(-1, 16)
        tiles_o = ours.reshape(256, 4, 256, 4).permute(0, 2, 1, 3).reshape(-1, 16)
        diff = (tiles_t != tiles_o).any(1)
        mags = w.abs().float().reshape(256, 4, 256, 4).permute(0, 2, 1, 3).reshape(-1, 16)
        s = mags.sort(1).values
        has_tie = (s[:, 1:] == s[:, :-1]).any(1)
        assert not bool((diff & ~has_tie).any()), (
            "torch's tile pruner differs on a tile without ties"
        )
        print(
            f"{dtype}: tiles differing {int(diff.sum())} / {diff.numel()} (tiles with ties "
            f"{int(has_tie.sum())})"
        )


@needs_sm8x
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cutlass_matmul_matches_dense(dtype):
    from sparsity.backends import get_backend

    cb = get_backend("cutlass")
    w = torch.randn(4096, 1024, device="cuda", dtype=dtype)
    sw = cb.sparsify(w, "tile_greedy")
    wp = sw.to_dense().float()
    x = torch.randn(2048, 1024, device="cuda", dtype=dtype)
    dy = torch.randn(2048, 4096, device="cuda", dtype=dtype)
    b = torch.randn(4096, device="cuda", dtype=dtype)
    assert _rel(sw.matmul(x, b), x.float() @ wp.t() + b.float()) < 1e-2
    assert _rel(sw.matmul_t(dy), dy.float() @ wp) < 1e-2


@needs_sm8x
def test_cutlass_semisparse_linear():
    from sparsity import SemiSparseLinear

    torch.manual_seed(0)
    lin = nn.Linear(1024, 4096, device="cuda")
    m = SemiSparseLinear.from_dense(lin, backend="cutlass")
    x = torch.randn(4096, 1024, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = m(x)
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and lin.weight.grad is not None and x.grad is not None
