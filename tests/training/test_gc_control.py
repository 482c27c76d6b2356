"""train.gc_period (training/gc_control.py): Python's automatic garbage collection off in the
training loop, the young generations collected every N steps, the collector's state restored
afterwards; and the property that makes this safe, that a training step leaves no tensors in
reference cycles."""

import gc

import pytest
import torch
from train_runs import TINY

from configs import ConfigError, load_config
from configs.load import RESUMABLE_CHANGES
from training.distributed import DistContext
from training.gc_control import StepGc
from training.trainer import Trainer

CPU = DistContext(0, 1, 0, torch.device("cpu"))


@pytest.fixture
def collects(monkeypatch):
    """The generations gc.collect was asked for, in order (nothing is actually collected)."""
    seen = []
    monkeypatch.setattr(gc, "collect", lambda generation=2: seen.append(generation) or 0)
    return seen


@pytest.fixture(autouse=True)
def gc_restored():
    was = gc.isenabled()
    yield
    gc.enable() if was else gc.disable()


def test_automatic_collection_is_off_inside_and_restored_after(collects):
    gc.enable()
    with StepGc(5) as step_gc:
        assert not gc.isenabled()
        for step in range(1, 13):
            step_gc.step(step)
    assert gc.isenabled()
    assert collects == [2, 1, 1]  # everything at the start, the young generations at steps 5 and 10


def test_a_collector_already_off_stays_off(collects):
    gc.disable()
    with StepGc(3):
        pass
    assert not gc.isenabled()


def test_period_zero_leaves_python_in_charge(collects):
    gc.enable()
    with StepGc(0) as step_gc:
        assert gc.isenabled()
        for step in range(1, 10):
            step_gc.step(step)
    assert gc.isenabled() and collects == []


def test_an_error_in_the_loop_still_restores_the_collector(collects):
    gc.enable()
    with pytest.raises(RuntimeError, match="boom"):
        with StepGc(2):
            raise RuntimeError("boom")
    assert gc.isenabled()


@pytest.mark.parametrize("period", [-1, 2.5, True, "50"])
def test_a_meaningless_period_is_refused(period):
    with pytest.raises(ValueError, match="period"):
        StepGc(period)


def test_the_config_key_is_checked_and_may_change_on_resume():
    assert load_config(None, []).train.gc_period == 50
    assert load_config(None, ["train.gc_period=0"]).train.gc_period == 0
    with pytest.raises(ConfigError, match="train.gc_period"):
        load_config(None, ["train.gc_period=-3"])
    assert "train.gc_period" in RESUMABLE_CHANGES  # how the run executes, not what it computes


def test_the_training_loop_runs_with_the_collector_off_and_collects_on_schedule(tmp_path, collects):
    gc.enable()
    trainer = Trainer(
        load_config(None, TINY + ["train.max_steps=7", "train.gc_period=3"]), tmp_path, CPU
    )
    enabled_during_steps = []
    step = trainer.train_step

    def watched(*a, **k):
        enabled_during_steps.append(gc.isenabled())
        return step(*a, **k)

    trainer.train_step = watched
    trainer.train()
    assert enabled_during_steps == [False] * 7
    assert gc.isenabled()
    assert collects.count(2) == 1 and collects.count(1) == 2  # the start; steps 3 and 6


def test_training_steps_leave_no_tensor_in_a_reference_cycle(tmp_path):
    """With automatic collection off, whatever a step left in a cycle would stay until the next
    periodic collection; a tensor there would hold memory (on a GPU, activations) for up to
    gc_period steps."""
    trainer = Trainer(load_config(None, TINY + ["sparsity.sparse_fraction=0.5"]), tmp_path, CPU)
    from scripts.benchmarks.batch import synthetic_batch

    batch = synthetic_batch(trainer.cfg, torch.device("cpu"))
    for phase in ("sparse", "dense"):
        trainer.enter_phase(phase)
        values = trainer.schedules.at(3)
        # the first step of the phase: one-time setup is not what is measured
        trainer.train_step(batch, values)
        # until nothing more is found: freeing one cycle (say an earlier test's compiled module in
        # this process) runs weakref callbacks that can leave another cycle unreachable only then
        while gc.collect():
            pass
        gc.disable()
        # what the next collection finds unreachable is kept in gc.garbage
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(3):
                trainer.train_step(batch, values)
            trainer.settle_checks()
            gc.collect()
            cycles = [o for o in gc.garbage if isinstance(o, torch.Tensor)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert cycles == [], (
            f"{phase} phase: {len(cycles)} tensors in reference cycles, e.g. {cycles[0].shape}"
        )
