"""A run resumes only its own checkpoints: a fresh start sets an earlier run's checkpoints aside (so
a later resume cannot pick them up and export that run's teacher as the new one's), every checkpoint
carries the run id that status.json records, a checkpoint of another run is refused, and a
`checkpoints` folder linked from two run directories is locked by the run using it. In-process
trainers on the tiny run."""

import pytest
import torch
from train_runs import TINY

import train
from configs import load_config
from rundir.layout import list_checkpoints, newest_checkpoint
from rundir.lock import lock
from rundir.status import read_status
from training.distributed import DistContext
from training.resume import ResumeMismatch
from training.trainer import Trainer

CPU = DistContext(0, 1, 0, torch.device("cpu"))


def _train(path, *extra):
    trainer = Trainer(load_config(None, [*TINY, *extra]), path, CPU)
    trainer.train()
    return trainer


def test_a_fresh_start_sets_the_earlier_runs_checkpoints_aside_and_resumes_only_its_own(tmp_path):
    first = _train(tmp_path)
    old = read_status(tmp_path).run_id
    assert (
        len(old) == 16
        and torch.load(newest_checkpoint(tmp_path)[1], weights_only=True)["run_id"] == old
    )
    _train(tmp_path, "train.resume=false", "train.max_steps=1")  # a new run, stopped after one step
    new = read_status(tmp_path).run_id
    assert new != old
    assert [s for s, _ in list_checkpoints(tmp_path / "checkpoints")] == [1]
    (aside,) = (tmp_path / "checkpoints").glob("superseded-*")
    assert f"step_{first.step:08d}.pt" in {p.name for p in aside.iterdir()}
    resumed = _train(
        tmp_path
    )  # the same command without the two keys: it continues the new run, not the old
    status = read_status(tmp_path)
    assert (status.state, status.resumed_at, status.run_id) == (
        "finished",
        [1],
        new,
    ) and resumed.step == 16


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _train(a, "train.max_steps=3")
    b.mkdir()
    (b / "checkpoints").symlink_to(
        a / "checkpoints"
    )  # one folder of checkpoints for two run directories
    before = sorted(p.name for p in (a / "checkpoints").iterdir())
    with pytest.raises(ResumeMismatch, match=f"belongs to run {read_status(a).run_id}, not to"):
        Trainer(load_config(None, TINY), b, CPU).train()
    assert sorted(p.name for p in (a / "checkpoints").iterdir()) == before


def test_a_linked_checkpoints_folder_in_use_refuses_a_second_run(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "checkpoints").mkdir(parents=True)
    b.mkdir()
    (b / "checkpoints").symlink_to(a / "checkpoints")
    held = lock(a / "checkpoints")  # what the run using that folder holds while it trains
    try:
        assert train.main(["--output-dir", str(b), *TINY]) == 1
    finally:
        held.release()
    assert "in use by another process" in capsys.readouterr().err
