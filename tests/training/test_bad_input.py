"""Bad input: each gives its clear error or documented behaviour, and loses nothing."""

import math

import numpy as np
import pytest
import torch
from PIL import Image
from train_runs import TINY, run_train

from configs import load_config
from rundir.metrics import read_metrics
from training.distributed import DistContext
from training.trainer import Trainer, TrainingDiverged

CPU = DistContext(0, 1, 0, torch.device("cpu"))


def _image_folder(root, n_per_class=6, corrupt=()):
    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        (root / "train" / c).mkdir(parents=True)
        for i in range(n_per_class):
            Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(
                root / "train" / c / f"{i}.png"
            )
    for name in corrupt:
        (root / "train" / "cat" / name).write_bytes(b"not an image at all")
    return root


def test_missing_dataset_path_is_a_clear_error(tmp_path):
    result = run_train(
        tmp_path / "run",
        "data.dataset=imagenet_folder",
        f"data.root={tmp_path / 'nope'}",
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("data error: ") and str(tmp_path / "nope") in result.stderr
    assert "data.root" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()  # reported before the run directory is made


def test_unknown_key_on_the_command_line_is_a_clear_error(tmp_path):
    result = run_train(tmp_path, "train.batchsize=3", check=False)
    assert result.returncode == 2
    assert (
        "unknown config key 'train.batchsize'" in result.stderr
        and "batch_size_per_gpu" in result.stderr
    )


def test_corrupt_images_are_skipped_and_counted(tmp_path):
    root = _image_folder(tmp_path / "data", corrupt=("broken.png", "zero.png"))
    (root / "train" / "cat" / "zero.png").write_bytes(b"")
    run_train(
        tmp_path / "run",
        "data.dataset=imagenet_folder",
        f"data.root={root}",
        "train.max_steps=4",
        "train.batch_size_per_gpu=7",
    )
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert (
        records[-1]["corrupt_skipped"] >= 1
    )  # 14 files, 4 batches of 7 drawn: the corrupt ones are met
    assert "broken.png" in (tmp_path / "run" / "log.txt").read_text()


def test_corrupt_image_raises_naming_the_file_when_asked(tmp_path):
    root = _image_folder(tmp_path / "data", n_per_class=1, corrupt=("broken.png",))
    result = run_train(
        tmp_path / "run",
        "data.dataset=imagenet_folder",
        f"data.root={root}",
        "data.on_corrupt=raise",
        "train.max_steps=2",
        "train.batch_size_per_gpu=3",
        check=False,
    )
    assert result.returncode != 0
    assert "broken.png" in result.stderr


def test_nan_loss_stops_with_a_clear_error_and_keeps_the_last_good_checkpoint(
    tmp_path, monkeypatch
):
    cfg = load_config(None, TINY + ["train.checkpoint_period=2"])
    trainer = Trainer(cfg, tmp_path, CPU)
    forward = type(trainer.model).forward

    def nan_at_step_5(model, batch, teacher_temp):
        loss, terms = forward(model, batch, teacher_temp)
        if trainer.step == 5:
            terms = {**terms, "ibot_loss": torch.tensor(math.nan)}
            loss = loss + terms["ibot_loss"]
        return loss, terms

    monkeypatch.setattr(type(trainer.model), "forward", nan_at_step_5)
    with pytest.raises(
        TrainingDiverged, match=r"non-finite loss at step 5 \(.*ibot_loss=nan.*step_00000004.pt"
    ):
        trainer.train()
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt"))
    assert checkpoints == [
        "step_00000002.pt",
        "step_00000004.pt",
    ]  # nothing written from the diverged step
    state = torch.load(tmp_path / "checkpoints" / "step_00000004.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())


def test_several_processes_need_an_explicit_output_dir(monkeypatch, capsys):
    """Ranks starting in different seconds would otherwise write to different time-stamped run
    directories."""
    import train

    for key, value in {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29555",
    }.items():
        monkeypatch.setenv(key, value)
    assert train.main([]) == 2
    assert "--output-dir is required" in capsys.readouterr().err


def test_partial_launch_environment_is_a_clear_error(monkeypatch, capsys, tmp_path):
    import train

    monkeypatch.setenv("RANK", "0")
    for key in ("WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    assert train.main(["--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "launch error" in err and "WORLD_SIZE" in err
