"""The step benchmark's record of Python garbage collections (`GcLog`), and its ablation that hands
collection back to Python (`automatic-gc`), on the CPU."""

import gc
import sys
import time
from types import SimpleNamespace

import pytest

from scripts import bench_train_step as B
from scripts.benchmarks.timing import GcLog


@pytest.fixture(autouse=True)
def gc_restored():
    was = gc.isenabled()
    yield
    gc.enable() if was else gc.disable()


def test_each_collection_in_the_block_is_counted_by_generation():
    gc.disable()  # no automatic collection may slip into the counts
    gc.collect(0)  # outside: not counted
    with GcLog() as log:
        gc.collect(0)
        gc.collect(2)
        gc.collect(1)
        gc.collect(2)
    gc.collect(2)  # outside again
    s = log.summary()
    assert s["collections"] == {"gen0": 1, "gen1": 1, "gen2": 2}
    assert s["max_ms"] > 0 and s["ms"] >= s["max_ms"]
    assert gc.callbacks.count(log._callback) == 0  # removed on leaving


def test_no_collection_is_an_empty_record():
    gc.disable()
    with GcLog() as log:
        pass
    assert log.summary() == {
        "collections": {"gen0": 0, "gen1": 0, "gen2": 0},
        "ms": 0.0,
        "max_ms": 0.0,
    }


@pytest.mark.parametrize("before", [True, False])
def test_the_automatic_gc_ablation_turns_collection_on_and_back(before):
    gc.enable() if before else gc.disable()
    trainer = SimpleNamespace(model=None)
    with B._Ablation(trainer, "automatic-gc"):
        assert gc.isenabled()
    assert gc.isenabled() == before


def test_a_row_steps_the_collector_as_training_does_and_records_what_ran(monkeypatch):
    """run_row's wiring on the CPU: the timed steps (faked) call the collector's step hook once per
    step, and the row carries the collections that ran inside them."""
    from training.gc_control import StepGc

    seen = []

    class Checks:
        def resolve_previous(self):
            time.sleep(0.02)  # the wait for the GPU's previous step
            return []

    trainer = SimpleNamespace(checks=Checks())

    def fake_time_steps(trainer, batch, warmup, iters, after_step=None):
        for i in range(warmup + iters):
            if i == warmup + 1:  # the second timed step waits, the others do not
                trainer.checks.resolve_previous()
            after_step()
        gc.collect(2)  # a full collection inside the row's steps
        return [10.0, 12.0, 11.0]

    monkeypatch.setattr(B, "time_steps", fake_time_steps)
    monkeypatch.setattr(B.torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setattr(B.torch.cuda, "max_memory_allocated", lambda: 0)
    step_gc = StepGc(2)
    monkeypatch.setattr(step_gc, "step", lambda step: seen.append(step))
    args = SimpleNamespace(warmup=2, iters=3, profile=0, ledger=0, host_profile=0, stall_profile=0)
    gc.disable()
    out = B.run_row(trainer, None, "compiled-dense", args, step_gc)
    assert seen == [1, 2, 3, 4, 5]
    assert out["ms"] == 11.0 and out["max_ms"] == 12.0
    assert out["gc"]["collections"]["gen2"] == 1
    assert (
        len(out["per_step"]["host_ms"]) == 3
    )  # the timed steps' host record, aligned with their times
    wait = out["per_step"]["wait_ms"]
    assert wait[0] == 0.0 and wait[2] == 0.0 and 20.0 <= wait[1] <= out["per_step"]["host_ms"][1]
    assert "resolve_previous" not in vars(trainer.checks)  # the wrapper is gone after the row


def test_step_log_puts_each_collection_in_the_step_it_ran_in():
    from scripts.benchmarks.timing import StepLog

    gc.disable()
    with GcLog() as log:
        steps = StepLog(log)
        steps.mark()  # step 1: nothing
        gc.collect(2)
        steps.mark()  # step 2: one full collection
        gc.collect(0)
        gc.collect(1)
        steps.mark()  # step 3: two
    rec = steps.last(2)
    assert len(rec["host_ms"]) == 2 and all(ms >= 0 for ms in rec["host_ms"])
    assert rec["gc_ms"][0] == round(log.events[0][1], 2)
    assert rec["gc_ms"][1] == round(log.events[1][1] + log.events[2][1], 2)
    assert steps.last(3)["gc_ms"][0] == 0.0
    assert rec["cuda_mallocs"] == [0, 0] and rec["alloc_retries"] == [
        0,
        0,
    ]  # no CUDA here: nothing allocated


def test_step_log_tells_a_step_off_the_cpu_from_a_busy_one():
    """A step that sleeps (off the CPU, as a host waiting in the driver is) has wall time far past
    its CPU time and a voluntary switch; a step that computes for 30 ms of CPU time records those 30
    ms (its wall time at least that)."""
    from scripts.benchmarks.timing import StepLog

    with GcLog() as log:
        steps = StepLog(log)
        time.sleep(0.05)
        steps.mark()
        end = time.thread_time() + 0.03
        while time.thread_time() < end:
            pass
        steps.mark()
    rec = steps.last(2)
    (slept_wall, busy_wall), (slept_cpu, busy_cpu) = rec["host_ms"], rec["cpu_ms"]
    assert slept_wall >= 49 and slept_cpu < 10
    assert 29 <= busy_cpu <= busy_wall + 1
    if sys.platform.startswith("linux"):  # per-thread switch counts exist there
        assert rec["voluntary_switches"][0] >= 1
    assert set(rec) >= {"involuntary_switches", "wait_ms", "gc_ms"}
