"""train.cuda_graph (training/step_graph.py) on the CPU: the step it captures, run eagerly through
the same device tensors (schedule values in a buffer, decoupled weight decay applied by hand, tensor
EMA momentum and teacher temperature, masked patches padded to their bound), against the trainer's
plain step from the same state; the config rules; the errors. The capture and replay themselves run
in tests/gpu/test_step_graph_gpu.py (`pytest -m gpu`)."""

import copy

import pytest
import torch
from train_runs import TINY

from configs import ConfigError, load_config
from configs.load import RESUMABLE_CHANGES
from scripts.benchmarks.batch import synthetic_batch
from training.distributed import DistContext
from training.optim import set_hyperparameters
from training.step_graph import ScheduleTensors, StepGraph
from training.trainer import Trainer

CPU = DistContext(0, 1, 0, torch.device("cpu"))


def graph_on_cpu(trainer: Trainer) -> StepGraph:
    """What Trainer builds for train.cuda_graph=true, with capture off: every step eager through the
    graph's inputs."""
    return StepGraph(
        trainer.graphed_compute,
        ScheduleTensors(trainer.optimizer, CPU.device),
        CPU.device,
        capture=False,
    )


@pytest.mark.parametrize("centering", ["centering", "sinkhorn_knopp"])
def test_the_graphed_step_computes_what_the_plain_step_does(tmp_path, centering):
    """Steps at changing schedule values (lr, weight decay, teacher temperature, momentum all move)
    and batches with different numbers of masked patches, through both phases, each from the plain
    trainer's state (loaded into the graphed one: a resume, which the schedule buffer must survive):
    losses, student, teacher, AdamW state and loss centers agree to float32 rounding. (Free-running,
    the two drift apart within a few steps like any two float orders: Adam turns the rounding of
    near-zero gradients into full-size steps of tiny biases.)"""
    cfg = load_config(None, TINY + [f"train.centering={centering}"])
    plain, graphed = Trainer(cfg, tmp_path / "a", CPU), Trainer(cfg, tmp_path / "b", CPU)
    graphed.step_graph = graph_on_cpu(graphed)
    batches = [synthetic_batch(cfg, CPU.device, rank=r, seed=r) for r in range(3)]
    assert len({b.mask_indices.numel() for b in batches}) > 1  # the padding is exercised
    step = 0
    for phase in ("sparse", "dense"):
        for trainer in (plain, graphed):
            trainer.enter_phase(phase)
        for i in range(3):
            graphed.model.load_state_dict(plain.model.state_dict())
            # a copy: load_state_dict keeps the given tensors, which the plain step then updates in
            # place
            graphed.optimizer.load_state_dict(copy.deepcopy(plain.optimizer.state_dict()))
            values = {
                **plain.schedules.at(step + 5),
                "lr": 1e-3 * (1 + step),
                "last_layer_lr": 5e-4 * step,
                "wd": 0.1 + 0.05 * step,
                "teacher_temp": 0.04 + 0.005 * step,
                "momentum": 0.9 + 0.01 * step,
            }
            torch.manual_seed(step)
            a = plain.train_step(batches[i], values)
            torch.manual_seed(step)
            b = graphed.train_step(batches[i], values)
            step += 1
            for k in a[1]:
                torch.testing.assert_close(b[1][k], a[1][k], rtol=1e-6, atol=1e-7, msg=k)
            for (name, p), q in zip(plain.model.named_parameters(), graphed.model.parameters()):
                torch.testing.assert_close(q, p, rtol=2e-6, atol=1e-8, msg=f"step {step}: {name}")
            for name, buf in plain.model.named_buffers():
                torch.testing.assert_close(dict(graphed.model.named_buffers())[name], buf, msg=name)
            sa, sb = plain.optimizer.state_dict()["state"], graphed.optimizer.state_dict()["state"]
            for k in sa:
                torch.testing.assert_close(
                    sb[k]["exp_avg_sq"], sa[k]["exp_avg_sq"], rtol=1e-5, atol=1e-12
                )


def test_schedule_buffer_holds_each_groups_values_and_the_groups_read_it(tmp_path):
    trainer = Trainer(load_config(None, TINY), tmp_path, CPU)
    hyper = ScheduleTensors(trainer.optimizer, CPU.device)
    values = {"lr": 0.5, "last_layer_lr": 0.25, "wd": 0.04, "teacher_temp": 0.07, "momentum": 0.994}
    hyper.write(values)
    groups = trainer.optimizer.param_groups
    for i, g in enumerate(groups):  # by hand: the group's multipliers times the schedule's value
        lr = (0.25 if g["is_last_layer"] else 0.5) * g["lr_multiplier"]
        assert g["lr"].data_ptr() == hyper.buffer[2 * i].data_ptr() and g["weight_decay"] == 0.0
        assert hyper.lr[i].item() == pytest.approx(lr)
        assert hyper.wd[i].item() == pytest.approx(0.04 * g["wd_multiplier"])
    assert hyper.teacher_temp.item() == pytest.approx(
        0.07
    ) and hyper.momentum.item() == pytest.approx(0.994)
    assert any(g["is_last_layer"] for g in groups) and len({g["lr_multiplier"] for g in groups}) > 1
    # the same numbers as the plain path's per-group floats
    plain = Trainer(load_config(None, TINY), tmp_path / "p", CPU)
    set_hyperparameters(plain.optimizer, values)
    for g, h in zip(plain.optimizer.param_groups, groups):
        assert h["lr"].item() == pytest.approx(g["lr"])


def test_a_resumed_optimizer_is_pointed_at_the_buffer_again(tmp_path):
    trainer = Trainer(load_config(None, TINY), tmp_path, CPU)
    hyper = ScheduleTensors(trainer.optimizer, CPU.device)
    state = trainer.optimizer.state_dict()
    for g in state["param_groups"]:
        g["lr"], g["weight_decay"] = 0.123, 0.5  # what a checkpoint of a plain run holds
    trainer.optimizer.load_state_dict(state)
    hyper.write(
        {"lr": 1.0, "last_layer_lr": 1.0, "wd": 0.1, "teacher_temp": 0.04, "momentum": 0.99}
    )
    for i, g in enumerate(trainer.optimizer.param_groups):
        assert g["lr"].data_ptr() == hyper.buffer[2 * i].data_ptr() and g["weight_decay"] == 0.0


def test_a_batch_of_another_shape_within_a_phase_is_refused(tmp_path):
    cfg = load_config(None, TINY)
    graph = StepGraph(lambda batch, hyper: None, None, CPU.device, capture=False)
    graph._static_batch = synthetic_batch(cfg, CPU.device).padded_to_bound()
    other = load_config(None, TINY + ["crops.local_crops_number=1"])
    with pytest.raises(RuntimeError, match="local_crops changed from .* within a phase"):
        graph._load(synthetic_batch(other, CPU.device).padded_to_bound())
    with pytest.raises(ValueError, match="at least one eager step"):
        StepGraph(lambda b, h: None, None, CPU.device, warmup=0)


def test_config_rules(tmp_path):
    assert load_config(None, []).train.cuda_graph is False
    assert load_config(None, ["train.cuda_graph=true"]).train.cuda_graph is True
    assert "train.cuda_graph" in RESUMABLE_CHANGES  # how the step is launched, not what it computes
    with pytest.raises(ConfigError, match="train.cuda_graph=true needs train.amp_dtype=bf16"):
        load_config(None, ["train.cuda_graph=true", "train.amp_dtype=fp16"])
    with pytest.raises(ConfigError, match="not reduce-overhead"):
        load_config(None, ["train.cuda_graph=true", "train.compile_mode=reduce-overhead"])
    with pytest.raises(ConfigError, match="train.cuda_graph"):
        load_config(None, ["train.cuda_graph=maybe"])
    with pytest.raises(ValueError, match="needs one process on a CUDA device, not 1 on cpu"):
        Trainer(load_config(None, TINY + ["train.cuda_graph=true"]), tmp_path, CPU)
