"""The embedded default, shortened: it learns, its sparse phase really is 2:4 both ways, its dense
phase is not.

The shipped config with only its length shortened (40 steps instead of 300: `SHORT`, the schedules
scale with it), so that the test takes well under a minute on an idle 2-core machine; the whole
300-step default is what the README's first set-up line trains (and CI with it)."""

import dataclasses
import json

import pytest
import torch
from torch import nn

from configs import load_config
from reporting.run_logs import flatten_config
from sparsity import SemiSparseLinear
from sparsity.backends.dense import DenseSparseWeight
from training.distributed import DistContext
from training.trainer import Trainer

pytestmark = (
    pytest.mark.slow
)  # trains for tens of seconds per test on 2 cores: outside the fast lane


def _is_transposable_24(w: torch.Tensor) -> bool:
    """<= 2 non-zeros in every group of 4 along rows and along columns."""
    nz = w != 0
    rows = nz.reshape(w.shape[0], -1, 4).sum(-1)
    cols = nz.t().reshape(w.shape[1], -1, 4).sum(-1)
    return bool((rows <= 2).all() and (cols <= 2).all())


class WeightsSeenInForward:
    """Records, per step, whether the weight matrices the student's MLP GEMMs actually multiply by
    are 2:4."""

    def __init__(self, monkeypatch):
        self.sparse: list[bool] = []
        self.dense: list[bool] = []
        original = DenseSparseWeight.matmul

        def spy(sw, x, bias=None):
            self.sparse.append(_is_transposable_24(sw.values.detach()))
            return original(sw, x, bias)

        monkeypatch.setattr(DenseSparseWeight, "matmul", spy)

    def hook_dense(self, backbone: nn.Module) -> None:
        def record(module, args):
            # a dense-phase MLP linear: F.linear uses module.weight as is
            if type(module) is nn.Linear:
                self.dense.append(_is_transposable_24(module.weight.detach()))

        for name, module in backbone.named_modules():
            if name.endswith(("mlp.fc1", "mlp.fc2")):
                module.register_forward_pre_hook(record)


# The default's length, shortened: 4 "epochs" of 10 steps (warm-up, teacher-temperature warm-up and
# last-layer freeze keep their 1, 3 and 1 epochs), a metrics line per step. Nothing else differs
# from the shipped default.
SHORT = ["optim.epochs=4", "train.epoch_length=10", "train.log_period=1"]
# The terms the default learns through in a short run: the DINO CLS terms rise to their
# uniform-prediction value while the teacher temperature warms up (docs/embedded-default.md), iBOT
# and KoLeo fall.
LEARNING_TERMS = ("ibot_loss", "koleo_loss")


def test_embedded_default_learns_and_is_24_sparse_then_dense(tmp_path, monkeypatch):
    cfg = load_config(
        overrides=SHORT
    )  # the shipped default, shortened (backend auto -> dense GEMMs on CPU)
    shipped, short = (flatten_config(dataclasses.asdict(c)) for c in (load_config(), cfg))
    assert {key for key in shipped if shipped[key] != short[key]} == {
        k.split("=")[0] for k in SHORT
    }
    assert 0 < cfg.sparse_steps < cfg.total_steps == 40
    trainer = Trainer(cfg, tmp_path, DistContext(0, 1, 0, torch.device("cpu")))
    seen = WeightsSeenInForward(monkeypatch)
    # Hooks are attached to the current modules: the sparse phase swaps fc1/fc2 for SemiSparseLinear
    # (recorded by the spy) and the dense phase swaps them back to nn.Linear, the very objects
    # hooked here.
    seen.hook_dense(trainer.model.student.backbone)
    trainer.train()

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    phases = [r["phase"] for r in records]
    switch = cfg.sparse_steps
    assert all(
        p == "sparse" for r, p in zip(records, phases) if r["step"] <= switch
    )  # step: steps done
    assert all(p == "dense" for r, p in zip(records, phases) if r["step"] > switch)

    n_mlp = 2 * len(trainer.model.student.backbone.blocks)
    assert (
        len(seen.sparse) == switch * n_mlp
    )  # every sparse step, every MLP linear went through the 2:4 path
    assert len(seen.dense) == (cfg.total_steps - switch) * n_mlp
    assert all(seen.sparse)
    assert not any(seen.dense)
    assert not any(isinstance(m, SemiSparseLinear) for m in trainer.model.student.modules())

    assert [r["step"] for r in records] == list(range(1, cfg.total_steps + 1))
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)
    learning = [sum(r[t] for t in LEARNING_TERMS) for r in records]
    first, last = sum(learning[:5]) / 5, sum(learning[-5:]) / 5
    assert last < first - 0.5, (
        f"iBOT + KoLeo loss did not decrease: first 5 steps {first:.3f}, last 5 {last:.3f}"
    )
    assert (tmp_path / "teacher_backbone.pth").exists()
    export = torch.load(tmp_path / "teacher_backbone.pth", weights_only=True)
    assert export["step"] == cfg.total_steps and "blocks.0.mlp.fc1.weight" in export["backbone"]
