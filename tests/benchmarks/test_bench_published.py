"""The published-benchmark script's pieces on CPU: the 2:4 copy of a timm ViT shares the dense one's
weights and swaps exactly its MLP linears; a training pass gives gradients; rows take turns and the
ratio is dense / 2:4."""

import pytest
import torch

from scripts import bench_published as B
from sparsity import SemiSparseLinear


def test_the_two_models_differ_only_in_their_mlp_linears():
    models = B.build_models("vit_tiny_patch16_224", "dense", torch.device("cpu"), torch.float32)
    dense, sparse = models["dense"], models["2:4"]
    swapped = [n for n, m in sparse.named_modules() if isinstance(m, SemiSparseLinear)]
    assert len(swapped) == 2 * len(dense.blocks) and all(
        n.split(".")[-1] in ("fc1", "fc2") for n in swapped
    )
    assert all(
        torch.equal(a, b) for a, b in zip(dense.state_dict().values(), sparse.state_dict().values())
    )
    x = torch.randn(2, 3, 224, 224)
    B.training_pass(sparse, x)
    assert (
        sparse.blocks[0].mlp.fc1.weight.grad is not None
        and dense.blocks[0].mlp.fc1.weight.grad is None
    )


def test_summary_ratio_by_hand():
    out = B.summary({"dense": [10.0, 12.0, 11.0], "2:4": [9.0, 10.0, 20.0]}, batch=8)
    assert (
        out["rows"]["dense"]["ms"] == 11.0
        and out["rows"]["2:4"]["ms"] == 10.0
        and out["speedup"] == 1.1
    )


def test_a_model_without_mlp_linears_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="matches no nn.Linear"):
        monkeypatch.setattr(B, "MLP_LINEARS", r"nothing\.here")
        B.build_models("vit_tiny_patch16_224", "dense", torch.device("cpu"), torch.float32)
