"""Kill a run (SIGTERM or SIGKILL, at chosen steps around the sparse->dense switch), resume it, and
compare its metrics with an uninterrupted run: they must be identical (timing fields aside)."""

import signal

import pytest
import torch
from train_runs import run_train, start_train, wait_for_step

from rundir.metrics import read_metrics, without_timing

pytestmark = (
    pytest.mark.slow
)  # trains for tens of seconds per test on 2 cores: outside the fast lane

SWITCH_STEP = 8  # TINY: 16 steps, sparse_fraction 0.5


def _assert_same_metrics(run, reference, note):
    got = without_timing(read_metrics(run / "metrics.jsonl"))
    want = without_timing(read_metrics(reference / "metrics.jsonl"))
    assert [r["step"] for r in got] == [r["step"] for r in want], note
    for g, w in zip(got, want):
        assert g == w, f"{note}: first difference at step {w['step']}"


def test_reference_run_switches_phase_at_the_configured_step(reference_run):
    records = read_metrics(reference_run / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 17))  # steps done, as checkpoints count
    assert [r["phase"] for r in records] == ["sparse"] * SWITCH_STEP + ["dense"] * (
        16 - SWITCH_STEP
    )
    assert "step 8: sparse -> dense switch" in (reference_run / "log.txt").read_text()


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig,kill_after,period",
    [
        # The signal lands inside step kill_after + 1, so kill_after must be <= 14 of the 16 steps
        # (1..16): at 15 it lands in the last step and the run legitimately finishes. Fixed steps
        # keep CI deterministic.
        (
            signal.SIGTERM,
            4,
            3,
        ),  # graceful, between periodic checkpoints: checkpoint at the step boundary, exit 143
        (
            signal.SIGKILL,
            11,
            3,
        ),  # hard, dense phase: resume from the last periodic checkpoint (step 9)
        (signal.SIGKILL, 10, 7),  # checkpoint just before the switch, resumed run crosses it
        (signal.SIGKILL, 12, 8),  # checkpoint exactly at the switch
        (signal.SIGTERM, 7, 100),  # graceful stop right before the switch step
    ],
    ids=[
        "sigterm-sparse",
        "sigkill-dense",
        "sigkill-ckpt-before-switch",
        "sigkill-ckpt-at-switch",
        "sigterm-at-switch",
    ],
)
def test_interrupted_run_resumes_bit_exactly(reference_run, tmp_path, sig, kill_after, period):
    note = f"{sig.name} after step {kill_after}, checkpoint period {period}"
    proc = start_train(tmp_path, f"train.checkpoint_period={period}")
    wait_for_step(tmp_path / "metrics.jsonl", kill_after, proc)
    proc.send_signal(sig)
    proc.wait(timeout=120)
    if sig == signal.SIGTERM:
        assert proc.returncode == 143, f"{note}: {proc.stderr.read()[-2000:]}"
        saved = torch.load(
            sorted((tmp_path / "checkpoints").glob("step_*.pt"))[-1], weights_only=True
        )
        assert saved["step"] >= kill_after + 1, (
            note
        )  # saved at the boundary it stopped at, not an older one
    else:
        assert proc.returncode == -signal.SIGKILL
    assert len(read_metrics(tmp_path / "metrics.jsonl")) < 16, (
        f"{note}: the run had already finished"
    )

    run_train(tmp_path, f"train.checkpoint_period={period}")  # same command: resumes
    _assert_same_metrics(tmp_path, reference_run, note)
    a = torch.load(tmp_path / "teacher_backbone.pth", weights_only=True)["backbone"]
    b = torch.load(reference_run / "teacher_backbone.pth", weights_only=True)["backbone"]
    assert all(torch.equal(a[k], b[k]) for k in b), note
