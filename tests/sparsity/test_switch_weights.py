"""`sparsity.switch_weights=pruned`: at the sparse -> dense switch the MLP weights of the student
and of the EMA teacher lose the entries the sparse phase pruned, so the dense phase starts from the
network the sparse phase computed.

Checked against the independent reference's tile mask (tests/sparsity/independent_reference.py, no
repository code), and by what must hold around the switch: the student computes the same function
just before and just after it (the published `dense` switch does not), the Parameters, the optimizer
state and the schedules are untouched, and the default leaves the weights as they were.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from independent_reference import tile_mask  # pure torch, shares no code with sparsity/
from tiny_run import TINY_MODEL_AND_DATA
from torch import nn

from configs import load_config
from configs.load import ConfigError
from sparsity import SparseThenDense
from sparsity.converter import ConversionError
from training.distributed import DistContext
from training.trainer import Trainer

pytestmark = (
    pytest.mark.slow
)  # trains for tens of seconds per test on 2 cores: outside the fast lane

SWITCH_STEP = 8  # of 16: sparse_fraction 0.5


def _config(switch_weights: str, *extra: str):
    return load_config(
        None,
        [
            *TINY_MODEL_AND_DATA,
            "train.compile=false",
            "sparsity.backend=dense",
            "sparsity.pruning=tile_greedy",
            "sparsity.sparse_fraction=0.5",
            f"sparsity.switch_weights={switch_weights}",
            *extra,
        ],
    )


def _mlp_weights(backbone: nn.Module) -> dict:
    return {n: p for n, p in backbone.named_parameters() if ".mlp.fc" in n and n.endswith("weight")}


def _train_to_switch(tmp_path, switch_weights: str):
    """A tiny run trained for its sparse steps, then: the student backbone's output on fixed images
    just before the switch (sparse) and just after it (dense), with the weights and optimizer state
    on both sides."""
    trainer = Trainer(_config(switch_weights), tmp_path, DistContext(0, 1, 0, torch.device("cpu")))
    assert trainer.cfg.sparse_steps == SWITCH_STEP
    trainer.model.train()
    with contextlib.closing(trainer.batches()) as batches:
        while trainer.step < SWITCH_STEP:
            trainer.enter_phase(trainer.sparsity.phase_at(trainer.step))
            trainer.train_step(next(batches), trainer.schedules.at(trainer.step))
            trainer.step += 1
    trainer.settle_checks()
    images = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    student, teacher = trainer.model.student.backbone, trainer.model.teacher.backbone

    def features():
        student.eval()
        with torch.no_grad():
            out = student(images)
        student.train()
        return out

    before = {
        "features": features(),
        "student": {k: v.detach().clone() for k, v in _mlp_weights(student).items()},
        "teacher": {k: v.detach().clone() for k, v in _mlp_weights(teacher).items()},
        "params": {k: id(v) for k, v in _mlp_weights(student).items()},
        "adam": {
            k: v.clone()
            for p, s in trainer.optimizer.state.items()
            for k, v in [(id(p), s["exp_avg"])]
        },
    }
    assert trainer.enter_phase(trainer.sparsity.phase_at(trainer.step))  # the switch
    after = {
        "features": features(),
        "student": _mlp_weights(student),
        "teacher": _mlp_weights(teacher),
    }
    return trainer, before, after


def test_pruned_switch_keeps_the_function_and_zeroes_what_the_sparse_phase_dropped(tmp_path):
    trainer, before, after = _train_to_switch(tmp_path, "pruned")
    assert (
        len(after["student"])
        == len(after["teacher"])
        == 2 * len(trainer.model.student.backbone.blocks)
    )
    for role in (
        "student",
        "teacher",
    ):  # each by its own mask: the independent reference's |w| tile walk
        for name, w in before[role].items():
            want = w * tile_mask(w, "largest_abs_values_greedy")
            assert torch.equal(after[role][name].detach(), want), (role, name)
            assert (after[role][name].reshape(-1, 4) != 0).sum(1).max() <= 2
    torch.testing.assert_close(after["features"], before["features"], rtol=1e-5, atol=1e-6)
    # the same Parameters (optimizer and EMA hold them), the optimizer state untouched
    assert {k: id(v) for k, v in after["student"].items()} == before["params"]
    state = {id(p): s["exp_avg"] for p, s in trainer.optimizer.state.items()}
    assert all(torch.equal(state[k], v) for k, v in before["adam"].items())


def test_dense_switch_is_the_published_one(tmp_path):
    """The default keeps the weights as trained: the function jumps at the switch (the pruned
    entries come back)."""
    _, before, after = _train_to_switch(tmp_path, "dense")
    for role in ("student", "teacher"):
        assert all(torch.equal(after[role][k].detach(), v) for k, v in before[role].items())
    assert (after["features"] - before["features"]).abs().max() > 1e-3


def test_prune_weights_of_the_library_on_any_module():
    """The converter's `prune_weights` on a plain model: only the selected linears change, to w *
    mask, the mask computed in `mask_dtype` (bf16 here) and applied to the fp32 weight; other layers
    untouched."""
    torch.manual_seed(1)
    model = nn.Sequential()
    model.add_module("fc1", nn.Linear(8, 12))
    model.add_module("head", nn.Linear(12, 4))
    fc1, head = model.fc1.weight.detach().clone(), model.head.weight.detach().clone()
    names = SparseThenDense(modules="fc1").prune_weights(model, mask_dtype=torch.bfloat16)
    assert names == ["fc1"]
    assert torch.equal(
        model.fc1.weight.detach(), fc1 * tile_mask(fc1.bfloat16(), "largest_abs_values_greedy")
    )
    assert torch.equal(model.head.weight.detach(), head)


@pytest.mark.parametrize("kind,pruning", [("activation", "rowwise"), ("weight", "soft_threshold")])
def test_pruned_switch_refuses_what_it_cannot_mask(kind, pruning):
    with pytest.raises(ConfigError, match="sparsity.switch_weights=pruned"):
        _config("pruned", f"sparsity.kind={kind}", f"sparsity.pruning={pruning}")
    with pytest.raises(ConversionError, match="kind=weight"):
        SparseThenDense(kind=kind, pruning=pruning).prune_weights(nn.Linear(8, 8))


def test_switch_weights_is_validated():
    with pytest.raises(ConfigError, match="switch_weights"):
        _config("zeroed")


@pytest.mark.gpu
def test_prune_weights_on_the_gpu_equals_the_reference_mask():
    """On CUDA the mask comes from the Triton kernel (in bf16, as the sparse forward computed it):
    the same zeros as the independent reference's on the bf16 weight, the kept fp32 values
    untouched."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(2)
    model = nn.Sequential()
    model.add_module("fc1", nn.Linear(1024, 4096))
    model = model.cuda()
    w = model.fc1.weight.detach().clone()
    SparseThenDense(modules="fc1").prune_weights(model, mask_dtype=torch.bfloat16)
    want = w * tile_mask(w.bfloat16(), "largest_abs_values_greedy")
    assert torch.equal(model.fc1.weight.detach(), want)


@pytest.mark.parametrize("cut", [SWITCH_STEP, SWITCH_STEP + 1])
def test_a_run_resumed_at_or_after_the_switch_ends_as_the_uninterrupted_one(tmp_path, cut):
    """Stopped with its checkpoint at the switch (saved before it, in the sparse phase) or after it
    (weights already pruned), the resumed run prunes exactly once and ends bit for bit as the run
    that was never stopped."""
    cpu = DistContext(0, 1, 0, torch.device("cpu"))
    whole = Trainer(_config("pruned"), tmp_path / "whole", cpu)
    whole.train()
    Trainer(_config("pruned", f"train.max_steps={cut}"), tmp_path / "cut", cpu).train()
    resumed = Trainer(_config("pruned"), tmp_path / "cut", cpu)
    assert resumed.resume_if_possible() and resumed.step == cut
    resumed.train()
    for (name, a), (_, b) in zip(
        whole.model.state_dict().items(), resumed.model.state_dict().items()
    ):
        assert torch.equal(a, b), name
