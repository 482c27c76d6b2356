"""The embedded default, shortened to 6 steps of 8 images (4 sparse, 2 dense), with the sparsity
options beside 2:4 weights: block-sparse MLP linears (sparsity.kind=block), the MVUE weight gradient
(sparsity.weight_grad=mvue24) and a dense warm-up before the sparse phase. Each run finishes, the
option is what the sparse phase ran (module types and calls counted per step), the dense phase is
plain nn.Linear, and a block size that does not divide the MLP's dims is refused naming the key."""

import json
import logging

import pytest
import torch
from torch import nn
from train_runs import run_train

import sparsity.block_sparse as block_sparse
from configs import load_config
from sparsity import SemiSparseLinear
from sparsity.block_sparse import BlockSparseLinear
from sparsity.mvue_grad import mvue_calls
from training.distributed import DistContext
from training.trainer import Trainer

SHORT = [
    "optim.epochs=2",
    "train.epoch_length=3",
    "teacher.warmup_teacher_temp_epochs=1",
    "train.num_workers=0",
    "train.batch_size_per_gpu=8",
    "train.log_period=1",
]


class MlpCalls:
    """Per student MLP linear call: (step being run, module class, MVUE weight gradients so far).
    In-place swaps keep the module objects, so hooks attached before training see both phases."""

    def __init__(self, trainer: Trainer):
        self.calls: list[tuple[int, type, int]] = []
        for name, module in trainer.model.student.backbone.named_modules():
            if name.endswith(("mlp.fc1", "mlp.fc2")):
                module.register_forward_pre_hook(
                    lambda m, args: self.calls.append((trainer.step, type(m), mvue_calls()))
                )

    def steps(self, cls) -> set:
        return {step for step, c, _ in self.calls if c is cls}


def run(tmp_path, *overrides):
    cfg = load_config(None, [*SHORT, *overrides])
    trainer = Trainer(cfg, tmp_path, DistContext(0, 1, 0, torch.device("cpu")))
    calls = MlpCalls(trainer)
    trainer.train()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(
        range(1, cfg.total_steps + 1)
    )  # finished, every step logged
    assert (tmp_path / "teacher_backbone.pth").exists()
    return cfg, trainer, calls, records


def test_block_sparse_kind_trains_the_sparse_phase_on_block_sparse_layers(tmp_path, monkeypatch):
    used = []
    original = block_sparse.block_sparse_linear

    def spy(x, weight, bias, layout, **kw):
        used.append(int(layout.mask.sum()) / layout.mask.numel())
        return original(x, weight, bias, layout, **kw)

    monkeypatch.setattr(block_sparse, "block_sparse_linear", spy)
    cfg, trainer, calls, records = run(
        tmp_path, "sparsity.kind=block", "sparsity.block_density=0.25", "sparsity.block_size=64"
    )
    switch = cfg.sparse_steps
    assert switch == 4 and cfg.total_steps == 6
    assert calls.steps(BlockSparseLinear) == set(
        range(switch)
    )  # every sparse step, only sparse steps
    assert calls.steps(nn.Linear) == set(range(switch, cfg.total_steps))
    n_block_calls = sum(c is BlockSparseLinear for _, c, _ in calls.calls)
    assert len(used) == n_block_calls and all(
        d == 0.25 for d in used
    )  # each went through the block-sparse GEMM
    assert [r["phase"] for r in records] == ["sparse"] * switch + ["dense"] * (
        cfg.total_steps - switch
    )
    assert not any(
        isinstance(m, (BlockSparseLinear, SemiSparseLinear))
        for m in trainer.model.student.modules()
    )
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)


def test_a_dense_warm_up_trains_its_steps_dense_and_switches_at_the_same_step(tmp_path, caplog):
    """dense_warmup_fraction 0.34 of 6 steps rounds to 2: steps 0-1 dense, 2-3 sparse, 4-5 dense
    again; the start-up summary names the sparse steps."""
    with caplog.at_level(logging.INFO, logger="train"):
        cfg, trainer, calls, records = run(tmp_path, "sparsity.dense_warmup_fraction=0.34")
    assert (cfg.dense_warmup_steps, cfg.sparse_steps, cfg.total_steps) == (2, 4, 6)
    assert calls.steps(SemiSparseLinear) == {2, 3}
    assert calls.steps(nn.Linear) == {0, 1, 4, 5}
    assert [r["phase"] for r in records] == ["dense"] * 2 + ["sparse"] * 2 + ["dense"] * 2
    assert "sparse (student; teacher dense) for steps 3-4 of 6" in caplog.text
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)


def test_mvue_weight_gradient_runs_in_every_sparse_step(tmp_path):
    cfg, trainer, calls, records = run(
        tmp_path, "sparsity.weight_grad=mvue24", "train.compile=false"
    )
    switch = cfg.sparse_steps
    assert calls.steps(SemiSparseLinear) == set(range(switch)) and not calls.steps(
        BlockSparseLinear
    )
    assert calls.steps(nn.Linear) == set(range(switch, cfg.total_steps))
    per_step = {}
    for step, _, count in calls.calls:
        per_step.setdefault(step, count)  # MVUE count when the step's first MLP call starts
    n_sparse_calls = sum(c is SemiSparseLinear for _, c, _ in calls.calls)
    # one MVUE weight gradient per sparse MLP call (the backward of each), none after the switch
    assert per_step[switch] - per_step[0] == n_sparse_calls
    assert mvue_calls() == per_step[switch]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)


def test_a_block_size_that_does_not_divide_the_mlp_is_refused_naming_the_key(tmp_path):
    # vit_tiny's MLP is 192 -> 768 -> 192: 128 does not divide 192
    cfg = load_config(None, [*SHORT, "sparsity.kind=block", "sparsity.block_size=128"])
    with pytest.raises(ValueError, match=r"sparsity\.block_size=128 must divide both dims"):
        Trainer(cfg, tmp_path, DistContext(0, 1, 0, torch.device("cpu"))).train()
    assert not (
        tmp_path / "metrics.jsonl"
    ).exists()  # refused when the trainer is built, before any step


def test_train_py_reports_it_as_a_config_error(tmp_path):
    result = run_train(
        tmp_path / "run", "sparsity.kind=block", "sparsity.block_size=128", check=False
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "config error: sparsity.block_size=128 must divide both dims" in result.stderr
    assert "Traceback" not in result.stderr
