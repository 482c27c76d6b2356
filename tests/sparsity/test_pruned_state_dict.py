"""Exporting the 2:4 network: `pruned_state_dict` bakes each SemiSparseLinear's pruning into a plain
weight, so the same architecture with nn.Linear layers loads it and computes the sparse forward's
function (a state_dict saved in the sparse phase holds the dense weights: loaded into a plain model
it is another network)."""

import pytest
import torch
from torch import nn

from sparsity import SemiSparseActivationLinear, pruned_state_dict, swap_linear_modules
from sparsity.swap import swap_to_dense


def _mlp():
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64), nn.LayerNorm(64))


@pytest.mark.parametrize("pruning", ["tile_greedy", "tile_optimal", "rowwise", "soft_threshold"])
def test_a_plain_model_loading_it_computes_the_sparse_forward(pruning):
    torch.manual_seed(0)
    sparse = _mlp()
    swap_linear_modules(sparse, pattern=r"[02]", backend="dense", pruning=pruning)
    x = torch.randn(16, 64)
    with torch.no_grad():
        expected = sparse(x)
    dense_before = sparse[0].weight.detach().clone()
    plain = _mlp()
    plain.load_state_dict(pruned_state_dict(sparse))  # strict: exactly the plain model's keys
    with torch.no_grad():
        assert torch.allclose(plain(x), expected, atol=1e-6, rtol=1e-5)
        # the dense weights' state_dict is another network: what the export exists for
        naive = _mlp()
        naive.load_state_dict(swap_to_dense(sparse) and sparse.state_dict())
        assert not torch.allclose(naive(x), expected, atol=1e-3)
    for layer in (
        plain[0],
        plain[2],
    ):  # 2:4 along rows: at most 2 nonzeros in every 4 consecutive weights
        assert int((layer.weight.reshape(-1, 4) != 0).sum(1).max()) <= 2
    assert torch.equal(sparse[0].weight, dense_before)  # the model's own weights are untouched


def test_a_module_not_sparse_in_its_weight_is_named():
    model = _mlp()
    swap_linear_modules(model, pattern="0", module_cls=SemiSparseActivationLinear, backend="dense")
    with pytest.raises(
        ValueError, match="^0: SemiSparseActivationLinear is not sparse in its weight"
    ):
        pruned_state_dict(model)
