"""The run-directory format (`rundir`): checkpoint listing among junk files, metrics of both step
formats, the explicit run status (finished, preempted, failed, running) as the trainer writes it and
as the tables and the Slurm status read it, old run directories (no status.json) still read from
their log, and no torch import."""

import json
import math
import os
import signal
import subprocess
import sys

import pytest
import torch
from train_runs import REPO, TINY

from configs import load_config, to_yaml
from reporting.run_logs import COMPLETE, FAILED as TABLE_FAILED, PARTIAL, read_run
from rundir.layout import (
    CORRUPT_SUFFIX,
    RUN_INFO,
    checkpoint_dir,
    checkpoint_name,
    checkpoint_step,
    list_checkpoints,
    newest_checkpoint,
    teacher_export_path,
)
from rundir.metrics import FORMAT_KEY, MetricsLog, metrics_by_steps_done, read_metrics, steps_done
from rundir.status import FAILED, FINISHED, PREEMPTED, RUNNING, RunStatus, read_status, write_status
from slurm.status import run_row
from training.distributed import DistContext
from training.trainer import Preempted, Trainer, TrainingDiverged

CPU = DistContext(0, 1, 0, torch.device("cpu"))
LOG_TIME = "2026-11-22 12:00:00,000"


def test_checkpoint_listing_ignores_everything_but_checkpoint_names(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name in (
        "step_00000010.pt",
        "step_00000002.pt",
        "step_00000010.pt.sha256",
        "step_00000003.pt.tmp",
        "step_00000004.pt.corrupt",
        "step_00000004.pt.sha256.corrupt",
        "step_5.pt",
        "step_000000007.pt",
        "notes.txt",
        "step_00000011.pth",
        ".step_00000012.pt",
    ):
        (folder / name).write_bytes(b"x")
    assert [step for step, _ in list_checkpoints(folder)] == [2, 10]
    assert [p.name for _, p in list_checkpoints(folder)] == ["step_00000002.pt", "step_00000010.pt"]
    assert [p.name for _, p in list_checkpoints(folder, suffix=CORRUPT_SUFFIX)] == [
        "step_00000004.pt.corrupt"
    ]
    assert newest_checkpoint(tmp_path) == (10, folder / "step_00000010.pt")
    assert list_checkpoints(tmp_path / "absent") == [] and newest_checkpoint(tmp_path / "x") is None
    assert (
        checkpoint_name(7) == "step_00000007.pt" and checkpoint_step(folder / "step_5.pt") is None
    )
    assert (
        teacher_export_path(tmp_path, 8)
        == tmp_path / "eval" / "step_00000008" / "teacher_backbone.pth"
    )


def _lines(path, records, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def test_metrics_of_old_and_new_format_read_as_steps_done(tmp_path):
    path = tmp_path / "metrics.jsonl"
    # an old run (format 1, from 0) resumed across the change (format 2, steps done), a line cut by
    # a kill at the end
    old = [{"step": s, "loss": 1.0} for s in range(3)]  # steps done: 1, 2, 3
    new = [{"step": s, "format": 2, "loss": 0.5} for s in (4, 5)]
    _lines(path, old + new, tail='{"step": 6, "form')
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 2, 4, 5]  # as written
    assert [r["step"] for r in metrics_by_steps_done(path)] == [1, 2, 3, 4, 5]
    assert [steps_done(r) for r in old + new] == [1, 2, 3, 4, 5]
    # a restart that repeated steps (old versions did not truncate): the later lines win from there
    # on
    _lines(
        path,
        [{"step": s, "format": 2, "loss": 1.0} for s in (1, 2, 3)]
        + [{"step": s, "format": 2, "loss": 2.0} for s in (2, 3, 4)],
    )
    assert [(r["step"], r["loss"]) for r in metrics_by_steps_done(path)] == [
        (1, 1.0),
        (2, 2.0),
        (3, 2.0),
        (4, 2.0),
    ]
    assert metrics_by_steps_done(tmp_path / "absent.jsonl") == []
    with pytest.raises(FileNotFoundError):
        read_metrics(tmp_path / "absent.jsonl")


def test_truncation_counts_old_lines_as_steps_done(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _lines(
        path,
        [{"step": s, "loss": 1.0} for s in range(4)] + [{"step": 5, "format": 2, "loss": math.nan}],
    )
    MetricsLog(path).truncate_after(3)  # resumed at step 3: old lines 0, 1, 2 (1-3 steps done) stay
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 2]
    MetricsLog(path).write({"step": torch.tensor(4), FORMAT_KEY: 2, "loss": torch.tensor(math.inf)})
    assert read_metrics(path)[-1] == {"step": 4, "format": 2, "loss": "inf"}


@pytest.mark.parametrize("state", [RUNNING, FINISHED, PREEMPTED, FAILED])
def test_status_round_trip(tmp_path, state):
    reason = "TrainingDiverged: non-finite loss" if state == FAILED else ""
    written = write_status(tmp_path, state, 7, reason, [3, 5])
    status = read_status(tmp_path)
    assert (
        status == written and status.state == state and status.step == 7 and status.reason == reason
    )
    assert status.resumed_at == [3, 5] and status.recorded and status.time
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(ValueError, match="unknown run state"):
        write_status(tmp_path, "crashed", 7)


def test_status_of_old_run_directories_comes_from_their_log(tmp_path):
    def log(*lines):
        (tmp_path / "log.txt").write_text("".join(f"{LOG_TIME} {line}\n" for line in lines))
        return read_status(tmp_path)

    assert read_status(tmp_path) == RunStatus(recorded=False)  # no log either: unknown
    status = log(
        "INFO training.trainer: resumed at step 6 (sparse phase)",
        "WARNING training.trainer: SIGTERM: checkpoint saved at step 9; rerun the same command to "
        "resume",
    )
    assert (status.state, status.step, status.resumed_at, status.recorded) == (
        PREEMPTED,
        9,
        [6],
        False,
    )
    status = log(
        "INFO models.training.trainer: resumed at step 3 (sparse phase)",
        "ERROR train: TrainingDiverged: non-finite loss at step 41",
    )
    assert (status.state, status.reason, status.resumed_at) == (
        FAILED,
        "TrainingDiverged: non-finite loss at step 41",
        [3],
    )
    assert log("INFO rundir.checkpoints: saved checkpoint x", "a traceback line").state == ""
    # once a status.json exists it is what counts, and a damaged one falls back to the log
    write_status(tmp_path, FINISHED, 16)
    assert read_status(tmp_path).state == FINISHED
    (tmp_path / "status.json").write_text('{"state": "fini')
    assert read_status(tmp_path).state == ""


def test_committed_old_run_directories_still_read(tmp_path):
    """results/ holds runs written before status.json: one preempted, one finished (its teacher not
    committed)."""
    tuning = REPO / "results" / "cifar10" / "tuning"
    preempted = tuning / "09_recipe_dense_e40_stopped_at_step_3587"
    if not preempted.is_dir():
        pytest.skip(f"{preempted} not present")
    status = read_status(preempted)
    assert (status.state, status.step, status.recorded) == (PREEMPTED, 3587, False)
    assert metrics_by_steps_done(preempted / "metrics.jsonl")[-1]["step"] <= 3587
    assert read_status(tuning / "01_vits_ls1e-5_lr4e-3_e10").state == ""


def test_tables_and_slurm_status_read_the_recorded_status(tmp_path):
    cfg = load_config(None, ["optim.epochs=2", "train.epoch_length=5"])  # 10 steps
    run = tmp_path / "sparse_0.50"
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(cfg))
    _lines(
        run / "metrics.jsonl",
        [{"step": s, "format": 2, "phase": "sparse", "loss": 1.0} for s in (1, 2, 3, 4)],
    )
    # the log says nothing (a run of today logs its failure too, but status.json is what is read)
    (run / "log.txt").write_text(f"{LOG_TIME} INFO train: started\n")
    write_status(run, PREEMPTED, 4)
    assert read_run(run).status == "partial (step 4 of 10, preempted)"
    assert run_row(run, {})["step"] == "4/10 preempted"
    write_status(run, FAILED, 4, "TrainingDiverged: non-finite loss at step 4")
    summary = read_run(run)
    assert summary.train_status == TABLE_FAILED and summary.reason.startswith(
        "TrainingDiverged: non-finite"
    )
    assert run_row(run, {})["step"] == "4/10 failed"
    write_status(run, RUNNING, 4)
    assert read_run(run).train_status == PARTIAL and run_row(run, {})["step"] == "4/10"


def test_reading_a_run_directory_does_not_import_torch():
    """Every module of `rundir` but the torch files and the checkpoints' rotation reads without
    torch."""
    code = (
        "import sys; from pathlib import Path; "
        "from rundir import atomic, claim, digests, errors, guard, json_files, layout, lock, "
        "metrics, status; "
        "status.read_status(Path('.')); metrics.metrics_by_steps_done(Path('m.jsonl')); "
        "layout.list_checkpoints(Path('.')); status.resumable_step(Path('.'), 4); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_trainer_records_finished_run(reference_run):
    status = read_status(reference_run)
    assert (status.state, status.step, status.resumed_at, status.recorded) == (
        FINISHED,
        16,
        [],
        True,
    )
    assert read_run(reference_run).train_status == COMPLETE
    info = json.loads((reference_run / RUN_INFO).read_text())
    assert info["start_step"] == 0 and info["last_step"] == 16


def test_status_step_follows_the_checkpoints(tmp_path, monkeypatch):
    """status.json is rewritten at every periodic checkpoint, so its step advances with the run (not
    0 until the end), and says finished at the end."""
    written = []
    original = write_status

    def spy(directory, state, step, *args, **kwargs):
        written.append(
            (state, step, checkpoint_dir(directory).joinpath(f"step_{step:08d}.pt").exists())
        )
        return original(directory, state, step, *args, **kwargs)

    monkeypatch.setattr(
        "training.run_records.write_status", spy
    )  # the name the trainer's records call
    Trainer(load_config(None, TINY + ["train.max_steps=8"]), tmp_path, CPU).train()
    assert [(state, step) for state, step, _ in written] == [
        (RUNNING, 0),
        (RUNNING, 3),
        (RUNNING, 6),
        (FINISHED, 8),
    ]
    assert all(
        saved for state, step, saved in written if state == RUNNING and step
    )  # after its checkpoint exists


def test_trainer_records_failure_with_its_reason(tmp_path, monkeypatch):
    trainer = Trainer(load_config(None, TINY + ["train.checkpoint_period=2"]), tmp_path, CPU)
    forward = type(trainer.model).forward

    def nan_at_step_3(model, batch, teacher_temp):
        loss, terms = forward(model, batch, teacher_temp)
        return (loss * math.nan, terms) if trainer.step == 3 else (loss, terms)

    monkeypatch.setattr(type(trainer.model), "forward", nan_at_step_3)
    with pytest.raises(TrainingDiverged):
        trainer.train()
    status = read_status(tmp_path)
    assert status.state == FAILED and status.reason.startswith(
        "TrainingDiverged: non-finite loss at step 3"
    )
    assert read_run(tmp_path).status.startswith(
        "failed (TrainingDiverged: non-finite loss at step 3"
    )


def test_trainer_records_preemption_then_the_resumption(tmp_path, monkeypatch):
    overrides = TINY + ["train.max_steps=5"]
    trainer = Trainer(load_config(None, overrides), tmp_path, CPU)
    forward = type(trainer.model).forward

    def sigterm_in_step_3(model, batch, teacher_temp):
        if trainer.step == 2:
            os.kill(
                os.getpid(), signal.SIGTERM
            )  # what Slurm sends: the trainer stops at the step boundary
        return forward(model, batch, teacher_temp)

    monkeypatch.setattr(type(trainer.model), "forward", sigterm_in_step_3)
    with pytest.raises(Preempted):
        trainer.train()
    status = read_status(tmp_path)
    assert (status.state, status.step, status.resumed_at) == (PREEMPTED, trainer.step, [])
    assert trainer.step >= 3
    monkeypatch.undo()
    resumed = Trainer(load_config(None, overrides), tmp_path, CPU)
    resumed.train()
    status = read_status(tmp_path)
    assert (status.state, status.step, status.resumed_at) == (FINISHED, 5, [trainer.step])
    assert (
        read_run(tmp_path).status == "partial (step 5 of 16)"
    )  # train.max_steps stopped it short of the schedule


def _signal_in_step_3(trainer, monkeypatch, *signals):
    forward = type(trainer.model).forward

    def send(model, batch, teacher_temp):
        if trainer.step == 2:
            for sig in signals:
                os.kill(os.getpid(), sig)
        return forward(model, batch, teacher_temp)

    monkeypatch.setattr(type(trainer.model), "forward", send)


def test_ctrl_c_checkpoints_at_the_step_boundary_and_exits_130(tmp_path, monkeypatch):
    """A first SIGINT is handled as SIGTERM (finish the step, checkpoint, stop; exit code 130), so
    Ctrl-C in a terminal loses no steps; the rerun resumes there."""
    overrides = TINY + ["train.max_steps=5"]
    trainer = Trainer(load_config(None, overrides), tmp_path, CPU)
    _signal_in_step_3(trainer, monkeypatch, signal.SIGINT)
    handler_before = signal.getsignal(signal.SIGINT)
    with pytest.raises(Preempted) as stop:
        trainer.train()
    assert stop.value.code == 130 and trainer.step >= 3
    assert read_status(tmp_path).state == PREEMPTED
    assert newest_checkpoint(tmp_path)[0] == trainer.step
    assert signal.getsignal(signal.SIGINT) is handler_before  # the loop's handlers are gone with it
    monkeypatch.undo()
    Trainer(load_config(None, overrides), tmp_path, CPU).train()
    assert read_status(tmp_path).resumed_at == [trainer.step]


def test_a_second_ctrl_c_stops_at_once(tmp_path, monkeypatch):
    trainer = Trainer(load_config(None, TINY + ["train.max_steps=5"]), tmp_path, CPU)
    _signal_in_step_3(trainer, monkeypatch, signal.SIGINT, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert trainer.step == 2  # inside step 3: no boundary reached, no checkpoint written for it
    assert read_status(tmp_path).state == "failed"
