"""The embedded default as shipped: it learns, its sparse phase really is 2:4 both ways, its dense phase is not."""

import json

import pytest
import torch
from torch import nn

from configs import load_config
from training.distributed import DistContext
from training.trainer import Trainer
from sparsity import SemiSparseLinear
from sparsity.backends.dense import DenseSparseWeight


def _is_transposable_24(w: torch.Tensor) -> bool:
    """<= 2 non-zeros in every group of 4 along rows and along columns."""
    nz = w != 0
    rows = nz.reshape(w.shape[0], -1, 4).sum(-1)
    cols = nz.t().reshape(w.shape[1], -1, 4).sum(-1)
    return bool((rows <= 2).all() and (cols <= 2).all())


class WeightsSeenInForward:
    """Records, per step, the weight matrices the student's MLP GEMMs actually multiply by."""

    def __init__(self, monkeypatch):
        self.sparse: list[torch.Tensor] = []
        self.dense: list[torch.Tensor] = []
        original = DenseSparseWeight.matmul

        def spy(sw, x, bias=None):
            self.sparse.append(sw.values.detach().clone())
            return original(sw, x, bias)

        monkeypatch.setattr(DenseSparseWeight, "matmul", spy)

    def hook_dense(self, backbone: nn.Module) -> None:
        def record(module, args):
            if type(module) is nn.Linear:  # a dense-phase MLP linear: F.linear uses module.weight as is
                self.dense.append(module.weight.detach().clone())

        for name, module in backbone.named_modules():
            if name.endswith(("mlp.fc1", "mlp.fc2")):
                module.register_forward_pre_hook(record)


@pytest.mark.slow
def test_embedded_default_learns_and_is_24_sparse_then_dense(tmp_path, monkeypatch):
    cfg = load_config()  # exactly the shipped default (backend auto -> dense GEMMs on CPU)
    trainer = Trainer(cfg, tmp_path, DistContext(0, 1, 0, torch.device("cpu")))
    seen = WeightsSeenInForward(monkeypatch)
    # Hooks are attached to the current modules: the sparse phase swaps fc1/fc2 for SemiSparseLinear (recorded by
    # the spy) and the dense phase swaps them back to nn.Linear, the very objects hooked here.
    seen.hook_dense(trainer.model.student.backbone)
    trainer.train()

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    phases = [r["phase"] for r in records]
    switch = cfg.sparse_steps
    assert all(p == "sparse" for r, p in zip(records, phases) if r["step"] <= switch)  # step: steps done
    assert all(p == "dense" for r, p in zip(records, phases) if r["step"] > switch)

    n_mlp = 2 * len(trainer.model.student.backbone.blocks)
    assert len(seen.sparse) == switch * n_mlp  # every sparse step, every MLP linear went through the 2:4 path
    assert len(seen.dense) == (cfg.total_steps - switch) * n_mlp
    assert all(_is_transposable_24(w) for w in seen.sparse)
    assert not any(_is_transposable_24(w) for w in seen.dense)
    assert not any(isinstance(m, SemiSparseLinear) for m in trainer.model.student.modules())

    losses = [r["loss"] for r in records]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.5, f"loss did not decrease: first {first:.3f}, last {last:.3f}"
    assert (tmp_path / "teacher_backbone.pth").exists()
    export = torch.load(tmp_path / "teacher_backbone.pth", weights_only=True)
    assert export["step"] == cfg.total_steps and "blocks.0.mlp.fc1.weight" in export["backbone"]
