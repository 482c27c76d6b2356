"""`sparsity.pruned_decay_ramp` and `pruned_decay_fade`: the masked decay's strength ramps linearly
over the first share of the sparse phase and fades over its last (the schedule by hand, with and
without a dense warm-up before the phase), the step reads it in both of its forms (launched: a
Python float; as one CUDA graph: the schedule buffer's slot, run here eagerly through the same
tensors), and the config refuses a ramp or a fade of a decay that is off, and the two overlapping."""

import copy

import numpy as np
import pytest
import torch
from train_runs import TINY

from configs import ConfigError, load_config
from scripts.benchmarks.batch import synthetic_batch
from training.distributed import DistContext
from training.schedules import build_schedules
from training.step_graph import ScheduleTensors, StepGraph
from training.trainer import Trainer

CPU = DistContext(0, 1, 0, torch.device("cpu"))
DECAY = [
    "sparsity.pruned_decay=0.05",
    "sparsity.pruned_grad=masked",
]  # masked: the decay alone moves pruned entries


def _scales(*overrides: str) -> list[float]:
    cfg = load_config(None, TINY + DECAY + list(overrides))
    return build_schedules(cfg, 1).pruned_decay_scale.tolist()


def test_the_ramp_by_hand():
    # TINY: 16 steps, sparse_fraction 0.5 -> steps 0-7 sparse
    assert _scales() == [1.0] * 16  # no ramp: the full strength throughout
    assert _scales("sparsity.pruned_decay_ramp=0.5") == [0.25, 0.5, 0.75, 1.0] + [1.0] * 12
    assert (
        _scales("sparsity.pruned_decay_ramp=1") == [0.125 * (k + 1) for k in range(8)] + [1.0] * 8
    )
    # a dense warm-up of 4 steps: the sparse phase is steps 4-7, half of it is 2 steps
    assert (
        _scales("sparsity.pruned_decay_ramp=0.5", "sparsity.dense_warmup_fraction=0.25")
        == [1.0] * 4 + [0.5, 1.0] + [1.0] * 10
    )
    assert np.all(np.diff(_scales("sparsity.pruned_decay_ramp=1")[:8]) > 0)


def test_the_fade_by_hand():
    """The fade's share of the sparse phase's last steps falls linearly to none at its last step;
    with a ramp at the phase's start; with a dense warm-up before the phase (steps 4-7 sparse)."""
    assert (
        _scales("sparsity.pruned_decay_fade=0.5") == [1.0] * 4 + [0.75, 0.5, 0.25, 0.0] + [1.0] * 8
    )
    assert _scales("sparsity.pruned_decay_fade=0.5", "sparsity.pruned_decay_ramp=0.5") == [
        0.25, 0.5, 0.75, 1.0, 0.75, 0.5, 0.25, 0.0
    ] + [1.0] * 8  # fmt: skip
    assert (
        _scales("sparsity.pruned_decay_fade=0.5", "sparsity.dense_warmup_fraction=0.25")
        == [1.0] * 6 + [0.5, 0.0] + [1.0] * 8
    )


def test_a_fade_of_a_decay_that_is_off_or_that_overlaps_the_ramp_is_refused():
    with pytest.raises(
        ConfigError,
        match="sparsity.pruned_decay_fade=0.5 fades the masked decay, which "
        "sparsity.pruned_decay=0 turns off",
    ):
        load_config(None, TINY + ["sparsity.pruned_decay_fade=0.5"])
    with pytest.raises(
        ConfigError, match="pruned_decay_ramp=0.6 and sparsity.pruned_decay_fade=0.5 overlap"
    ):
        load_config(
            None,
            TINY + DECAY + ["sparsity.pruned_decay_ramp=0.6", "sparsity.pruned_decay_fade=0.5"],
        )


def test_a_ramp_of_a_decay_that_is_off_is_refused():
    with pytest.raises(
        ConfigError,
        match="sparsity.pruned_decay_ramp=0.5 ramps the masked decay, which "
        "sparsity.pruned_decay=0 turns off",
    ):
        load_config(None, TINY + ["sparsity.pruned_decay_ramp=0.5"])
    with pytest.raises(ConfigError, match="sparsity.pruned_decay_ramp"):
        load_config(None, TINY + DECAY + ["sparsity.pruned_decay_ramp=1.5"])


FC1 = "backbone.blocks.0.mlp.fc1.weight"


def _step(trainer: Trainer, state: dict, batch, values: dict) -> tuple[dict, torch.Tensor]:
    """One step from `state`: the student's parameters after it, and Adam's first moment of block
    0's fc1."""
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(copy.deepcopy(state["optim"]))
    torch.manual_seed(0)
    trainer.train_step(batch, values)
    params = dict(trainer.model.student.named_parameters())
    return (
        {k: v.detach().clone() for k, v in params.items()},
        trainer.optimizer.state[params[FC1]]["exp_avg"].clone(),
    )


@pytest.mark.parametrize(
    "shape", ["sparsity.pruned_decay_ramp=1", "sparsity.pruned_decay_fade=0.5"]
)
def test_both_forms_of_the_step_apply_the_schedules_share(tmp_path, shape):
    """One sparse step from one state at scales 0.3 and 1: the launched step and the graph's step
    (its buffer slot) give the same weights, and Adam's first moment of the pruned entries is, by
    hand, (1 - beta1) x 0.05 x scale x w (with pruned_grad=masked their gradient is the decay
    alone)."""
    from sparsity.pruned_entries import weight_mask

    cfg = load_config(None, TINY + DECAY + [shape])
    plain, graphed = Trainer(cfg, tmp_path / "a", CPU), Trainer(cfg, tmp_path / "b", CPU)
    graphed.step_graph = StepGraph(
        graphed.graphed_compute,
        ScheduleTensors(graphed.optimizer, CPU.device),
        CPU.device,
        capture=False,
    )
    for trainer in (plain, graphed):
        trainer.enter_phase("sparse")
    state = {
        "model": copy.deepcopy(plain.model.state_dict()),
        "optim": copy.deepcopy(plain.optimizer.state_dict()),
    }
    batch = synthetic_batch(cfg, CPU.device)
    w = state["model"][f"student.{FC1}"]
    pruned = ~weight_mask(w, cfg.sparsity.pruning)
    beta1 = plain.optimizer.param_groups[0]["betas"][0]
    for scale in (0.3, 1.0):
        values = {**plain.schedules.at(0), "lr": 1e-3, "pruned_decay_scale": scale}
        (a, moment_a), (b, moment_b) = (
            _step(plain, state, batch, values),
            _step(graphed, state, batch, values),
        )
        for name in a:
            torch.testing.assert_close(
                b[name], a[name], rtol=2e-6, atol=1e-8, msg=f"scale {scale}: {name}"
            )
        for moment in (moment_a, moment_b):
            torch.testing.assert_close(
                moment[pruned], (1 - beta1) * 0.05 * scale * w[pruned], rtol=1e-5, atol=0
            )
