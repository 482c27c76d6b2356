"""The 2:4 recipe's options in the trainer, each against what it must give by hand:
`sparsity.pruned_grad=masked` and `sparsity.pruned_decay` reach the optimizer (checked with the
independent reference's tile mask, no repository code), in eager and in compiled training; the mask
statistics and the switch's loss jump in metrics.jsonl and sparsity_masks.jsonl;
`teacher.momentum_reference_steps`' schedule and its refusals.
"""

from __future__ import annotations

import contextlib
import json
import math

import numpy as np
import pytest
import torch
from independent_reference import tile_mask  # pure torch, shares no code with sparsity/
from tiny_run import TINY_MODEL_AND_DATA

from configs import load_config
from configs.load import ConfigError
from rundir.metrics import read_metrics
from training.distributed import DistContext
from training.schedules import build_schedules
from training.trainer import Trainer

CPU = DistContext(0, 1, 0, torch.device("cpu"))
EAGER = [
    "train.compile=false",
    "sparsity.backend=dense",
    "sparsity.pruning=tile_greedy",
    "sparsity.mask_stats=true",
]


def _config(*extra: str):
    return load_config(None, [*TINY_MODEL_AND_DATA, *EAGER, *extra])


def _mlp_weights(trainer: Trainer) -> dict:
    return {
        n: p
        for n, p in trainer.model.student.backbone.named_parameters()
        if ".mlp.fc" in n and n.endswith("weight")
    }


def _first_step(tmp_path, *extra: str):
    """One sparse step without clipping (it would see different gradients): the MLP weights before
    the step and every student gradient the optimizer was given."""
    trainer = Trainer(
        _config("sparsity.sparse_fraction=1.0", "optim.clip_grad=1e9", *extra), tmp_path, CPU
    )
    trainer.model.train()
    before = {n: p.detach().clone() for n, p in _mlp_weights(trainer).items()}
    with contextlib.closing(trainer.batches()) as batches:
        trainer.enter_phase(trainer.sparsity.phase_at(0))
        trainer.train_step(next(batches), trainer.schedules.at(0))
    trainer.settle_checks()
    grads = {
        n: p.grad.detach().clone()
        for n, p in trainer.model.student.named_parameters()
        if p.grad is not None
    }
    return before, grads


def test_masked_gradient_and_decay_reach_the_optimizer(tmp_path):
    strength = 0.5
    w0, ste = _first_step(tmp_path / "ste")
    w0_again, remedied = _first_step(
        tmp_path / "masked", "sparsity.pruned_grad=masked", f"sparsity.pruned_decay={strength}"
    )
    assert ste.keys() == remedied.keys() and len(w0) == 24
    for name, grad in ste.items():
        short = name.removeprefix("backbone.")
        if short not in w0:  # every other parameter: the same gradient
            assert torch.equal(remedied[name], grad), name
            continue
        assert torch.equal(w0[short], w0_again[short])
        kept = tile_mask(w0[short], "largest_abs_values_greedy")
        # kept entries: the straight-through gradient; pruned ones: no gradient, only strength x
        # their weight
        want = torch.where(kept, grad, strength * w0[short])
        torch.testing.assert_close(remedied[name], want, rtol=0, atol=0)
        assert (grad[~kept] != 0).any()  # STE did give them a gradient


def test_decay_alone_adds_to_the_straight_through_gradient(tmp_path):
    w0, ste = _first_step(tmp_path / "ste")
    _, decayed = _first_step(tmp_path / "decay", "sparsity.pruned_decay=0.01")
    for short, w in w0.items():
        name = f"backbone.{short}"
        pruned = ~tile_mask(w, "largest_abs_values_greedy")
        torch.testing.assert_close(
            decayed[name], ste[name] + 0.01 * w * pruned, rtol=1e-6, atol=1e-9
        )


@pytest.mark.usefixtures("fresh_dynamo")
def test_compiled_training_with_the_remedies_equals_eager(tmp_path):
    remedies = [
        "sparsity.sparse_fraction=1.0",
        "sparsity.pruned_grad=masked",
        "sparsity.pruned_decay=0.05",
        "train.max_steps=4",
        "train.log_period=1",
    ]
    compiled = ["train.compile=true", "train.compile_backend=aot_eager"]
    Trainer(
        load_config(None, [*TINY_MODEL_AND_DATA, *EAGER, *remedies, *compiled]), tmp_path / "c", CPU
    ).train()
    Trainer(_config(*remedies), tmp_path / "e", CPU).train()
    a, b = (read_metrics(tmp_path / d / "metrics.jsonl") for d in ("c", "e"))
    assert len(a) == len(b) == 4
    for key in ("loss", "pruned_share"):
        torch.testing.assert_close(
            torch.tensor([r[key] for r in a]),
            torch.tensor([r[key] for r in b]),
            rtol=1e-4,
            atol=1e-5,
        )


def test_mask_statistics_and_the_switch_jump_in_the_run_files(tmp_path):
    out = tmp_path / "run"
    Trainer(_config("sparsity.sparse_fraction=0.5", "train.log_period=1"), out, CPU).train()
    lines = read_metrics(out / "metrics.jsonl")
    assert [r["phase"] for r in lines] == ["sparse"] * 8 + ["dense"] * 8
    assert "mask_flip_rate" not in lines[0]  # nothing to compare the first mask with
    assert all(0 <= r["mask_flip_rate"] <= 1 and 0 < r["pruned_share"] < 1 for r in lines[1:])
    assert all(r["pruned_grad_to_weight"] > 0 for r in lines)
    # a window of log_period = 1 step on each side: the last sparse step's loss and the first dense
    # one's
    jumps = [r for r in lines if "switch_loss_jump" in r]
    assert [r["step"] for r in jumps] == [9]
    assert jumps[0]["switch_loss_before"] == pytest.approx(lines[7]["loss"], rel=1e-6)
    assert jumps[0]["switch_loss_after"] == pytest.approx(lines[8]["loss"], rel=1e-6)
    layers = [json.loads(line) for line in (out / "sparsity_masks.jsonl").read_text().splitlines()]
    assert [r["step"] for r in layers] == list(range(1, 17))
    assert len(layers[3]["flip_rate"]) == 24 and set(layers[3]["pruned_share"]) == set(
        layers[3]["flip_rate"]
    )
    totals = lines[3]
    assert (
        min(layers[3]["pruned_share"].values())
        <= totals["pruned_share"]
        <= max(layers[3]["pruned_share"].values())
    )


def test_horizon_matched_momentum_by_hand():
    cfg = _config("teacher.momentum_reference_steps=160")  # 16 steps here: 1 - m ten times larger
    m = build_schedules(cfg, 1).momentum
    assert m[0] == pytest.approx(1 - 0.008 * 10)
    # the EMA's horizon is the same fraction of the run as at step 10 x step of 160
    for step in range(16):
        published = 1.0 + 0.5 * (0.992 - 1.0) * (
            1 + math.cos(math.pi * 10 * step / 160)
        )  # dinov2 over 160
        assert (1 / (1 - m[step])) / 16 == pytest.approx((1 / (1 - published)) / 160, rel=1e-9)
    assert np.array_equal(
        build_schedules(_config(), 1).momentum,
        build_schedules(_config("teacher.momentum_reference_steps=16"), 1).momentum,
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["teacher.momentum_reference_steps=3000"],
            r"teacher.momentum_reference_steps=3000 .* < 0: at most 2000 steps",
        ),
        (
            ["sparsity.pruned_decay=0.1", "sparsity.pruning=soft_threshold"],
            "needs a masking sparsity.pruning",
        ),
        (
            ["sparsity.pruned_grad=masked", "sparsity.kind=activation"],
            "apply to sparsity.kind=weight only",
        ),
        (["sparsity.pruned_decay=-1"], "sparsity.pruned_decay"),
        (["sparsity.pruned_decay=inf"], "sparsity.pruned_decay"),
        (["sparsity.pruned_grad=frozen"], "sparsity.pruned_grad"),
    ],
)
def test_refusals_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _config(*overrides)


def test_the_final_student_is_exported_for_the_probe(tmp_path):
    from evaluation.features import load_teacher
    from rundir.guard import previous_results

    out = tmp_path / "run"
    trainer = Trainer(
        _config("sparsity.sparse_fraction=0.5", "train.export_student=true"), out, CPU
    )
    trainer.train()
    backbone, step = load_teacher(
        trainer.cfg, out / "student_backbone.pth"
    )  # what eval_linear.py loads
    assert step == 16
    student = trainer.model.student.backbone.state_dict()
    loaded = backbone.state_dict()
    assert loaded.keys() == student.keys()
    assert all(torch.equal(loaded[k], student[k].cpu()) for k in loaded)
    teacher, _ = load_teacher(trainer.cfg, out / "teacher_backbone.pth")
    assert not torch.equal(
        teacher.state_dict()["blocks.0.mlp.fc1.weight"], loaded["blocks.0.mlp.fc1.weight"]
    )
    assert {p.name for p in previous_results(out)} >= {
        "student_backbone.pth",
        "teacher_backbone.pth",
    }


def test_s_ste_scale_drift_is_logged(tmp_path):
    """The frozen S-STE scale against the one the trained weights would give: 1 at the first step's
    weights, then what the weights' drift makes of it (by hand from the converted layers at the
    end)."""
    from sparsity.modules import SCALE_BUFFER
    from sparsity.pruning import soft_threshold_scale

    out = tmp_path / "run"
    trainer = Trainer(
        _config(
            "sparsity.sparse_fraction=1.0",
            "sparsity.pruning=soft_threshold",
            "train.log_period=1",
            "train.max_steps=3",
        ),
        out,
        CPU,
    )
    trainer.train()
    lines = read_metrics(out / "metrics.jsonl")
    assert all("soft_threshold_scale_ratio" in r for r in lines)
    layers = [m for m in trainer.model.student.backbone.modules() if SCALE_BUFFER in m._buffers]
    assert len(layers) == 24
    want = (
        sum(float(getattr(m, SCALE_BUFFER) / soft_threshold_scale(m.weight)) for m in layers) / 24
    )
    assert lines[-1]["soft_threshold_scale_ratio"] == pytest.approx(want, rel=1e-6)
