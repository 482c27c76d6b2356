"""Fault injection: a run signalled as Slurm signals it (the whole process group, data workers
included), killed inside each kind of write, with a bit-flipped or unreadable checkpoint, or resumed
under another config, ends with the metrics and teacher of an uninterrupted run, or stops with a
clear refusal and changes nothing."""

import os
import shutil
import signal

import pytest
import torch
from train_runs import run_train, start_train, wait_for_step

import rundir.atomic as atomic_io
import rundir.torch_files as safe_io
from rundir.metrics import MetricsLog, read_metrics, without_timing

FLIP = 4096


def assert_same_run(run, reference):
    assert without_timing(read_metrics(run / "metrics.jsonl")) == without_timing(
        read_metrics(reference / "metrics.jsonl")
    )
    a = torch.load(run / "teacher_backbone.pth", weights_only=True)["backbone"]
    b = torch.load(reference / "teacher_backbone.pth", weights_only=True)["backbone"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in b)


def flip_block(path, offset=None):
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if offset is None else offset
    data[at : at + FLIP] = bytes(255 - b for b in data[at : at + FLIP])
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_sigterm_to_the_process_group_with_data_workers_saves_and_resumes(reference_run, tmp_path):
    """What `scontrol requeue`, preemption and time limits do: SIGTERM to every process of the
    job."""
    proc = start_train(tmp_path, "train.num_workers=2", new_session=True)
    wait_for_step(tmp_path / "metrics.jsonl", 4, proc)
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=120)
    err = proc.stderr.read()
    assert proc.returncode == 143, err[-3000:]
    assert "DataLoader worker" not in err and "SIGTERM: checkpoint saved at step" in err
    run_train(tmp_path, "train.num_workers=2")
    assert_same_run(tmp_path, reference_run)


def test_a_kill_inside_an_atomic_write_keeps_the_previous_file(tmp_path, monkeypatch):
    """metrics.jsonl rewritten on resume, config.yaml, checkpoints and exports are all written
    atomically (`rundir.atomic`): a kill between writing the temporary file and renaming it leaves
    the previous content (and never an empty file)."""
    metrics = MetricsLog(tmp_path / "metrics.jsonl")
    for step in range(5):
        metrics.write({"step": step, "loss": 1.0})
    before = (tmp_path / "metrics.jsonl").read_text()
    safe_io.save_verified({"w": torch.ones(3)}, tmp_path / "ckpt.pt")

    def killed(*args):
        raise KeyboardInterrupt("killed between write and rename")

    monkeypatch.setattr(atomic_io.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        metrics.truncate_after(2)
    assert (tmp_path / "metrics.jsonl").read_text() == before
    with pytest.raises(KeyboardInterrupt):
        atomic_io.atomic_write_text(tmp_path / "metrics.jsonl", "")
    assert (tmp_path / "metrics.jsonl").read_text() == before
    with pytest.raises(KeyboardInterrupt):
        safe_io.save_verified({"w": torch.zeros(3)}, tmp_path / "ckpt.pt")
    monkeypatch.undo()
    assert torch.equal(
        safe_io.load_verified(tmp_path / "ckpt.pt")["w"], torch.ones(3)
    )  # old file, old digest


@pytest.mark.slow
def test_a_kill_during_a_teacher_export_is_redone_on_resume(reference_run, tmp_path):
    """The checkpoint of step 8 is written before its export; a run killed during the export (a
    stray .tmp, no export) redoes it when resumed from that checkpoint."""
    run_train(tmp_path, "train.max_steps=8", "train.checkpoint_period=4")
    export = tmp_path / "eval" / "step_00000008" / "teacher_backbone.pth"
    assert export.exists()
    export.unlink()
    safe_io.digest_path(export).unlink()
    export.with_name(export.name + ".tmp").write_bytes(b"half an export")
    run_train(tmp_path, "train.checkpoint_period=4")
    assert export.exists() and not export.with_name(export.name + ".tmp").exists()
    ref = torch.load(
        reference_run / "eval" / "step_00000008" / "teacher_backbone.pth", weights_only=True
    )["backbone"]
    got = safe_io.load_verified(export)["backbone"]
    assert all(torch.equal(got[k], ref[k]) for k in ref)
    assert_same_run(tmp_path, reference_run)


@pytest.mark.slow
def test_a_bit_flipped_checkpoint_is_refused_and_the_previous_one_used(reference_run, tmp_path):
    run_train(tmp_path, "train.max_steps=9")  # checkpoints at steps 3, 6, 9 (period 3)
    newest = tmp_path / "checkpoints" / "step_00000009.pt"
    flip_block(newest)
    result = run_train(tmp_path)
    assert (
        "does not match its recorded SHA-256" in result.stderr
        and "resumed at step 6" in result.stderr
    )
    assert (
        tmp_path / "checkpoints" / "step_00000009.pt.corrupt"
    ).exists()  # kept, out of the rotation
    assert_same_run(tmp_path, reference_run)


@pytest.mark.slow
def test_when_no_checkpoint_is_readable_the_run_refuses_to_start_over(tmp_path):
    run_train(tmp_path, "train.max_steps=6")
    metrics_before = (tmp_path / "metrics.jsonl").read_text()
    for ckpt in (tmp_path / "checkpoints").glob("step_*.pt"):
        flip_block(ckpt, offset=0)
    result = run_train(tmp_path, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "none readable" in result.stderr and "Refusing to start over" in result.stderr
    assert (tmp_path / "metrics.jsonl").read_text() == metrics_before
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.suffix == ".pt") == []
    again = run_train(
        tmp_path, check=False
    )  # the files set aside still stop it: no silent fresh start
    assert again.returncode == 1 and "set aside earlier as unreadable" in again.stderr
    assert (tmp_path / "metrics.jsonl").read_text() == metrics_before


@pytest.mark.slow
def test_resume_under_another_config_is_refused_before_anything_is_written(tmp_path):
    """Three changes refused in turn against one interrupted run (each leaves it as it was), then
    the allowed ones."""
    run_train(tmp_path, "train.max_steps=3")
    files_before = {
        name: (tmp_path / name).read_text()
        for name in ("config.yaml", "metrics.jsonl", "status.json")
    }
    for override, key in [
        ("optim.base_lr=0.01", "optim.base_lr"),
        ("train.seed=1", "train.seed"),
        ("student.arch=vit_small", "student.arch"),
    ]:
        result = run_train(tmp_path, override, check=False)
        assert result.returncode == 1 and "Traceback" not in result.stderr, (
            override,
            result.stderr[-3000:],
        )
        assert f"trained with another config ({key}:" in result.stderr, override
        assert {name: (tmp_path / name).read_text() for name in files_before} == files_before, (
            override
        )
    run_train(
        tmp_path, "train.max_steps=4", "train.num_workers=1", "train.log_period=2"
    )  # allowed changes


def test_resume_refuses_a_different_global_batch_written_by_a_forged_checkpoint(
    reference_run, tmp_path
):
    """A checkpoint edited outside the trainer but re-digested (so it is trusted) still has to fit
    the run."""
    shutil.copytree(reference_run / "checkpoints", tmp_path / "checkpoints")
    newest = sorted((tmp_path / "checkpoints").glob("*.pt"))[-1]
    state = safe_io.load_verified(newest)
    state["world_size"], state["samples_consumed"] = 4, state["samples_consumed"] * 4
    safe_io.save_verified(state, newest)
    result = run_train(tmp_path, check=False)
    assert (
        result.returncode == 1 and "global batch of 32 (4 processes x 8 per GPU)" in result.stderr
    )
