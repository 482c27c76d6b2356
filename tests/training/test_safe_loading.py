"""A crafted pickle (its __reduce__ runs code) handed over as pretrained weights, as the checkpoint
to evaluate and as a training checkpoint: refused with a clear message, and the code never runs."""

import sys

import pytest
import torch
from PIL import Image
from train_runs import REPO, run_train

from rundir.digests import UnsafeFile
from rundir.torch_files import load_verified


class Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('the code ran')",)


def crafted(path, marker):
    torch.save({"model": {"w": torch.ones(2)}, "payload": Payload(marker)}, path)
    return path


def test_the_loader_refuses_it_naming_what_it_would_run(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(UnsafeFile, match="builtins.exec"):
        load_verified(crafted(tmp_path / "evil.pth", marker))
    assert not marker.exists()


@pytest.mark.slow
def test_as_pretrained_weights(tmp_path):
    marker = tmp_path / "ran"
    evil = crafted(tmp_path / "evil.pth", marker)
    result = run_train(tmp_path / "run", f"student.pretrained_weights={evil}", check=False)
    # refused while the config is checked, before the run directory exists (training/preflight.py)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "only arbitrary code could rebuild" in result.stderr and not marker.exists()
    assert not (tmp_path / "run").exists()


def test_as_the_checkpoint_to_evaluate(tmp_path, reference_run):
    sys.path.insert(0, str(REPO))
    import eval_linear

    marker = tmp_path / "ran"
    evil = crafted(tmp_path / "evil.pth", marker)
    code = eval_linear.main(
        ["--run", str(reference_run), f"checkpoint={evil}", f"output={tmp_path / 'out.json'}"]
    )
    assert code != 0 and not marker.exists() and not (tmp_path / "out.json").exists()


@pytest.mark.slow
def test_as_a_training_checkpoint(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "checkpoints").mkdir()
    crafted(tmp_path / "checkpoints" / "step_00000005.pt", marker)
    result = run_train(tmp_path, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "only arbitrary code could rebuild" in result.stderr and not marker.exists()


@pytest.mark.slow
def test_environment_values_given_as_interpolations_stay_out_of_every_file(tmp_path, monkeypatch):
    secret = "s3cr3t-token-8d1f"
    images = (
        tmp_path / secret
    )  # a path that is itself the secret: the data is read, the path never written
    images.mkdir()
    for i in range(8):
        Image.new("RGB", (24, 24), (30 * i, 0, 255 - 30 * i)).save(images / f"{i}.png")
    monkeypatch.setenv("RUN_SECRET", str(images))
    run = tmp_path / "run"
    result = run_train(
        run, "data.dataset=image_folder", "data.root=${oc.env:RUN_SECRET}", "train.max_steps=3"
    )
    assert "data: image_folder at ${oc.env:RUN_SECRET}: 8 images" in (run / "log.txt").read_text()
    assert secret not in result.stdout + result.stderr
    for path in [p for p in run.rglob("*") if p.is_file()]:
        assert secret.encode() not in path.read_bytes(), path
    assert "${oc.env:RUN_SECRET}" in (run / "config.yaml").read_text()
    assert (
        "${oc.env:RUN_SECRET}" in load_verified(run / "checkpoints" / "step_00000003.pt")["config"]
    )
    monkeypatch.delenv("RUN_SECRET")
    result = run_train(
        run, "data.dataset=image_folder", "data.root=${oc.env:RUN_SECRET}", check=False
    )  # unset: a config error, not a traceback
    assert (
        result.returncode == 2
        and "RUN_SECRET" in result.stderr
        and "Traceback" not in result.stderr
    )
