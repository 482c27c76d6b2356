"""GPU tests of GELU in cuSPARSELt's epilogue (`sparsity.gelu_fusion`, `activation="gelu"` plans): the GEMM's output
against an fp32 reference computed here (the pruned weight's product, the bias, then GELU), including token counts
that are not a multiple of 8 and out features padded to 16; which form of GELU the epilogue computes (the
`plans.CSLT_GELU` the search's check assumes); the fused MLP of a compiled, gradient-free forward (an EMA teacher)
against the unfused one, and its plans built with the epilogue.

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu/test_gelu_epilogue_gpu.py`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cs():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from sparsity.backends import BackendUnavailable, get_backend

    b = get_backend("cusparselt")
    try:
        b.check(torch.device("cuda"), torch.bfloat16)
    except BackendUnavailable as e:
        pytest.skip(f"cusparselt unavailable: {e}")
    return b


def _pruned(out_f, in_f, seed):
    """A bf16 weight already 2:4 (the reference's tile-greedy mask): pruning it again keeps it as it is."""
    from sparsity.pruning.reference import tile_greedy_mask

    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(out_f, in_f, device="cuda", generator=g).bfloat16()
    return w * tile_greedy_mask(w.float()).to(w.dtype)


@pytest.mark.parametrize("tokens,out_f,in_f", [(4096, 4096, 1024), (4101, 1024, 4096), (203, 1000, 256)])
def test_gelu_epilogue_is_gelu_of_the_biased_product(cs, tokens, out_f, in_f):
    w = _pruned(out_f, in_f, 1)
    sw = cs.sparsify(w, "tile_greedy")
    x = torch.randn(tokens, in_f, device="cuda").bfloat16()
    bias = torch.randn(out_f, device="cuda")  # fp32, as a master bias under autocast
    pre = x.float() @ w.float().t() + bias
    y = sw.matmul_gelu(x, bias, "none")
    assert y.shape == (tokens, out_f) and y.dtype == torch.bfloat16
    from sparsity.backends.cusparselt.plans import CSLT_GELU

    torch.testing.assert_close(y.float(), F.gelu(pre, approximate=CSLT_GELU), rtol=2e-2, atol=2e-2)
    plain = sw.matmul(x, bias)  # the plain plan of the same shape is not the epilogue's
    torch.testing.assert_close(plain.float(), pre, rtol=2e-2, atol=5e-2)


def test_the_epilogue_computes_the_declared_form_of_gelu(cs):
    """Where the exact and tanh forms differ most (|x| about 1.5-4), the bf16 output's error, projected on the
    direction from the tanh form to the exact one, is ~0 for the form the epilogue computes and ~the gap for the
    other (rounding averages out over ~10^6 such entries)."""
    from sparsity.backends.cusparselt.plans import CSLT_GELU

    w = _pruned(4096, 1024, 2)
    sw = cs.sparsify(w, "tile_greedy")
    x = (torch.randn(8192, 1024, device="cuda") * 0.12).bfloat16()
    pre = x.float() @ w.float().t()
    y = sw.matmul_gelu(x, None, "none").float()
    exact, tanh = F.gelu(pre), F.gelu(pre, approximate="tanh")
    far = (exact - tanh).abs() > 2e-4
    assert far.sum() > 100_000, "the inputs should reach where the two forms differ"
    direction = torch.sign(exact - tanh)[far]
    gap = (exact - tanh).abs()[far].mean().item()
    toward_exact = ((y - tanh)[far] * direction).mean().item()
    form = "tanh" if abs(toward_exact) < gap / 3 else "none" if abs(toward_exact - gap) < gap / 3 else "neither"
    assert form == CSLT_GELU, (f"the epilogue's GELU looks like approximate={form!r} (error toward the exact form "
                               f"{toward_exact:.3g}, gap {gap:.3g}); plans.CSLT_GELU says {CSLT_GELU!r}")


def test_compiled_teacher_mlp_runs_gelu_in_the_epilogue(cs):
    from sparsity import fuse_gelu, swap_linear_modules
    from sparsity.backends.cusparselt.search import plan_records
    from sparsity.torchvision_compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    from timm.layers import Mlp

    torch.manual_seed(0)
    plain = nn.Sequential(Mlp(1024, 4096, act_layer=nn.GELU)).cuda()
    fused = nn.Sequential(Mlp(1024, 4096, act_layer=nn.GELU)).cuda()
    fused.load_state_dict(plain.state_dict())
    for model in (plain, fused):
        swap_linear_modules(model, pattern=r"0\.fc[12]", backend="cusparselt")
        model.requires_grad_(False)  # an EMA teacher
    assert fuse_gelu(fused) == ["0.fc1"]
    x = torch.randn(6304, 1024, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want = torch.compile(plain)(x)
        got = torch.compile(fused)(x)
    assert any("'gelu'" in key for key in plan_records()) or _epilogue_plans_built()
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)
    # a student's forward (gradients asked) takes the module's own GELU after the GEMM, and trains
    fused.requires_grad_(True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = torch.compile(fused)(x.requires_grad_())
    out.float().square().mean().backward()
    assert fused[0].fc1.weight.grad is not None and torch.isfinite(x.grad).all()


def _epilogue_plans_built() -> bool:
    """Whether this thread built a plan with the GELU epilogue (plans are recorded only where a search ran)."""
    from sparsity.backends.cusparselt import search

    return any(plan.activation == "gelu" for plan in search._plans.by_key.values())
