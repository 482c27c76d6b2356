"""The pruned entries' remedies on a CUDA GPU, for every GEMM backend, eager and compiled
(inductor): the masked gradient is zero exactly where the forward pruned (the mask
`sparsity.pruned_entries.weight_mask` computes, which the masked decay uses, is the forward's own:
the fused cuSPARSELt packer's and the Triton prune kernel's agree in bf16), and the decay adds
strength x W there and nothing elsewhere. Run with `pytest -m gpu`."""

import pytest
import torch
from torch import nn

from sparsity import swap_linear_modules
from sparsity.pruned_entries import decay_pruned_grads, weight_mask

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_dynamo")]


@pytest.mark.parametrize("backend", ["cusparselt", "dense", "auto"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("pruning", ["tile_greedy", "rowwise"])
def test_masked_gradient_and_decay_use_the_forward_mask(backend, compiled, pruning):
    torch.manual_seed(0)
    holder = nn.Sequential(
        nn.Linear(768, 192)
    ).cuda()  # a ViT-Ti fc2, fp32 master weights under bf16 autocast
    swap_linear_modules(holder, pattern="0", backend=backend, pruning=pruning, masked_grad=True)
    layer = holder[0]
    fn = torch.compile(layer, fullgraph=True, dynamic=False) if compiled else layer
    x = torch.randn(4096, 768, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = fn(x)
    y.float().square().mean().backward()
    kept = weight_mask(layer.weight, pruning, torch.bfloat16)
    grad = layer.weight.grad.clone()
    assert torch.isfinite(grad).all()
    assert (grad[~kept] == 0).all()  # the forward's mask: no gradient where it pruned
    assert (
        grad[kept] != 0
    ).float().mean() > 0.99  # and the straight-through gradient where it kept
    decay_pruned_grads([layer], 0.5, torch.bfloat16)
    want = torch.where(kept, grad, 0.5 * layer.weight.detach())
    assert torch.equal(layer.weight.grad, want)
