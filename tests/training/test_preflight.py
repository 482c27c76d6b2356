"""A config the model cannot take is refused before the run directory exists, in one line (exit 2): sparsity
patterns that are not regular expressions or select no linear, and pretrained weights that are missing, a directory,
a FIFO (whose load would block), not a checkpoint, or a checkpoint without backbone weights. In-process: each case
stops before any training."""

import os

import torch

import train
from tiny_run import TINY_MODEL_AND_DATA


def _cases(tmp_path):
    (tmp_path / "a_dir").mkdir()
    os.mkfifo(tmp_path / "a_fifo.pth")
    (tmp_path / "not_torch.pth").write_text("{}")
    torch.save({"optimizer": {"lr": torch.tensor(1.0)}}, tmp_path / "no_backbone.pth")
    return [
        ("sparsity.modules=blocks[", "sparsity.modules='blocks[' is not a valid regular expression"),
        ("sparsity.modules=nothing_matches", "selects no nn.Linear of the model"),
        (f"student.pretrained_weights={tmp_path}/missing.pth", "missing.pth: no such file"),
        (f"student.pretrained_weights={tmp_path}/a_dir", "a_dir: not a regular file"),
        (f"student.pretrained_weights={tmp_path}/a_fifo.pth", "a_fifo.pth: not a regular file"),
        (f"student.pretrained_weights={tmp_path}/not_torch.pth", "not_torch.pth: "),
        (f"student.pretrained_weights={tmp_path}/no_backbone.pth", "no_backbone.pth: "),
    ]


def test_model_config_problems_are_one_line_before_the_run_directory(tmp_path, capsys):
    for override, message in _cases(tmp_path):
        run = tmp_path / "run"
        code = train.main(["--output-dir", str(run), *TINY_MODEL_AND_DATA, "sparsity.sparse_fraction=0.5", override])
        err = capsys.readouterr().err
        assert code == 2, (override, err[-2000:])
        assert err.startswith("config error: ") and message in err and err.count("\n") == 1, (override, err)
        assert not run.exists(), override
