"""sparsity.teacher=sparse: the EMA teacher's MLP linears run 2:4-pruned in the sparse phase (a swap
over the whole meta-architecture), dense after the switch; with the default (dense) the teacher is
never converted. The embedded default shortened to 6 steps of 8 images (4 sparse, 2 dense)."""

import logging

import pytest
import torch
from torch import nn

from configs import ConfigError, load_config
from sparsity import SemiSparseLinear
from sparsity.pruning import prune
from training.distributed import DistContext
from training.trainer import Trainer

SHORT = [
    "optim.epochs=2",
    "train.epoch_length=3",
    "teacher.warmup_teacher_temp_epochs=1",
    "train.num_workers=0",
    "train.batch_size_per_gpu=8",
    "train.log_period=1",
    "sparsity.sparse_fraction=0.67",
]


def mlp_classes(backbone: nn.Module) -> set:
    return {
        type(m) for name, m in backbone.named_modules() if name.endswith(("mlp.fc1", "mlp.fc2"))
    }


class TeacherMlpCalls:
    """Per teacher MLP linear call: (step, class, input, output), to check what the teacher
    computed."""

    def __init__(self, trainer: Trainer):
        self.calls = []
        for name, module in trainer.model.teacher.backbone.named_modules():
            if name.endswith("blocks.0.mlp.fc1"):
                module.register_forward_hook(
                    lambda m, args, out: self.calls.append(
                        (
                            trainer.step,
                            type(m),
                            args[0].detach().clone(),
                            out.detach().clone(),
                            m.weight.detach().clone(),
                            m.bias.detach().clone(),
                        )
                    )
                )


def trained(tmp_path, *overrides):
    cfg = load_config(None, [*SHORT, *overrides])
    trainer = Trainer(cfg, tmp_path, DistContext(0, 1, 0, torch.device("cpu")))
    calls = TeacherMlpCalls(trainer)
    trainer.train()
    return cfg, trainer, calls


def test_a_sparse_teacher_runs_pruned_weights_in_the_sparse_phase_only(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="train"):
        cfg, trainer, calls = trained(tmp_path, "sparsity.teacher=sparse")
    assert cfg.sparse_steps == 4
    assert [c[1] for c in calls.calls] == [SemiSparseLinear] * 4 + [
        nn.Linear
    ] * 2  # one teacher forward per step
    for step, cls, x, y, w, b in calls.calls:
        # what the teacher's fc1 computed: the EMA weight pruned 2:4 (tile_greedy) in the sparse
        # phase, whole after
        used = prune(w, "tile_greedy")[0] if cls is SemiSparseLinear else w
        torch.testing.assert_close(y, x @ used.t() + b, rtol=1e-5, atol=1e-5)
        # and the pruning made a difference (the test could tell the two apart)
        if cls is SemiSparseLinear:
            assert (y - (x @ w.t() + b)).abs().max() > 1e-3
    assert mlp_classes(trainer.model.teacher.backbone) == {
        nn.Linear
    }  # dense at the end; the export is dense
    assert "(student and teacher)" in caplog.text


def test_the_default_teacher_stays_dense(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="train"):
        cfg, trainer, calls = trained(tmp_path)
    assert cfg.sparsity.teacher == "dense"
    assert {c[1] for c in calls.calls} == {nn.Linear} and len(calls.calls) == 6
    assert "(student; teacher dense)" in caplog.text


def test_resuming_in_the_sparse_phase_converts_the_teacher_again(tmp_path):
    """A run stopped in the sparse phase resumes with its teacher sparse again (the phase is the
    checkpoint's), and ends as the uninterrupted run does."""
    _, whole, _ = trained(tmp_path / "whole", "sparsity.teacher=sparse")
    trained(tmp_path / "cut", "sparsity.teacher=sparse", "train.max_steps=2")
    cfg = load_config(None, [*SHORT, "sparsity.teacher=sparse"])
    resumed = Trainer(cfg, tmp_path / "cut", DistContext(0, 1, 0, torch.device("cpu")))
    assert resumed.resume_if_possible() and resumed.step == 2
    assert mlp_classes(resumed.model.teacher.backbone) == {SemiSparseLinear}
    resumed.train()
    for (name, a), (_, b) in zip(
        whole.model.state_dict().items(), resumed.model.state_dict().items()
    ):
        assert torch.equal(a, b), name


def test_a_wrong_teacher_value_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match="sparsity.teacher"):
        load_config(None, ["sparsity.teacher=half"])
