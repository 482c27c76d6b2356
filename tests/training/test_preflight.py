"""A config the model cannot take is refused before the run directory exists, in one line (exit 2):
sparsity patterns that are not regular expressions or select no linear, and pretrained weights that
are missing, a directory, a FIFO (whose load would block), not a checkpoint, or a checkpoint without
backbone weights. In-process: each case stops before any training."""

import os

import torch
from tiny_run import TINY_MODEL_AND_DATA

import train


def _cases(tmp_path):
    (tmp_path / "a_dir").mkdir()
    os.mkfifo(tmp_path / "a_fifo.pth")
    (tmp_path / "not_torch.pth").write_text("{}")
    torch.save({"optimizer": {"lr": torch.tensor(1.0)}}, tmp_path / "no_backbone.pth")
    return [
        (
            "sparsity.modules=blocks[",
            "sparsity.modules='blocks[' is not a valid regular expression",
        ),
        ("sparsity.modules=nothing_matches", "selects no nn.Linear of the model"),
        (
            "sparsity.weight_grad=mvue24 sparsity.weight_grad_modules=.*fc3 train.compile=false",
            "sparsity.weight_grad_modules='.*fc3' matches none of the linears sparsity.modules "
            "selects (blocks.0.mlp.fc1",
        ),
        ("sparsity.weight_grad_modules=.*fc2", "with the dense weight gradient it means nothing"),
        # batch 3, drop path 0.2: the MLPs get int(6 * 0.8) = 4 of the 6 global crops, 1 + (16 // 8)
        # ** 2 = 5 tokens each, and int(12 * 0.8) = 9 of the 12 local crops (1 + 1 tokens): 4 * 5 +
        # 9 * 2 = 38 rows, no 4x4 tiles
        (
            "sparsity.kind=activation train.batch_size_per_gpu=3 crops.local_crops_number=4",
            "the student's blocks get 38 (train.batch_size_per_gpu=3",
        ),
        (f"student.pretrained_weights={tmp_path}/missing.pth", "missing.pth: no such file"),
        (f"student.pretrained_weights={tmp_path}/a_dir", "a_dir: not a regular file"),
        (f"student.pretrained_weights={tmp_path}/a_fifo.pth", "a_fifo.pth: not a regular file"),
        (f"student.pretrained_weights={tmp_path}/not_torch.pth", "not_torch.pth: "),
        (f"student.pretrained_weights={tmp_path}/no_backbone.pth", "no_backbone.pth: "),
    ]


def test_model_config_problems_are_one_line_before_the_run_directory(tmp_path, capsys):
    for override, message in _cases(tmp_path):
        run = tmp_path / "run"
        code = train.main(
            [
                "--output-dir",
                str(run),
                *TINY_MODEL_AND_DATA,
                "sparsity.sparse_fraction=0.5",
                *override.split(),
            ]
        )
        err = capsys.readouterr().err
        assert code == 2, (override, err[-2000:])
        assert err.startswith("config error: ") and message in err and err.count("\n") == 1, (
            override,
            err,
        )
        assert not run.exists(), override


def test_activation_rows_follow_the_forward_and_rowwise_takes_any_count():
    """The row counts the check computes are the ones the MLP gets (a hooked forward of the same
    crops), and rowwise pruning, which takes any number of rows, passes the same config."""
    from configs import load_config
    from models.vision_transformer import build_backbone
    from training.preflight import check_activation_rows

    overrides = [
        *TINY_MODEL_AND_DATA,
        "sparsity.kind=activation",
        "train.batch_size_per_gpu=3",
        "crops.local_crops_number=4",
        "sparsity.sparse_fraction=0.5",
    ]
    cfg = load_config(None, [*overrides, "sparsity.pruning=rowwise"])
    check_activation_rows(cfg, build_backbone(cfg.student, img_size=cfg.crops.global_crops_size))
    backbone = build_backbone(cfg.student, img_size=cfg.crops.global_crops_size).train()
    seen = []
    backbone.blocks[0].mlp.fc1.register_forward_hook(
        lambda m, args, out: seen.append(args[0].shape[0])
    )
    backbone.forward_features([torch.zeros(6, 3, 16, 16), torch.zeros(12, 3, 8, 8)])
    assert seen == [backbone.mlp_rows([(6, 16), (12, 8)], training=True)[0]] == [38]
