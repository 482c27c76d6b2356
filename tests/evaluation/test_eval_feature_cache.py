"""Feature cache: reused when nothing changed, re-extracted when the checkpoint or the transform
changes."""

import pytest
import torch
from eval_test_helpers import FAST_EVAL, make_folder_run, make_run_dir, write_teacher

from configs import load_config, load_eval_config
from evaluation.evaluate import extract_run_features
from evaluation.features import EvalInputError, cache_key, load_teacher


def _extract(run, *overrides):
    eval_cfg = load_eval_config(None, [*FAST_EVAL, *overrides])
    run_cfg = load_config(run / "config.yaml")
    return extract_run_features(
        run, run_cfg, eval_cfg, run / "teacher_backbone.pth", torch.device("cpu")
    )


def test_cache_reused_then_invalidated_by_a_new_checkpoint(tmp_path):
    run = make_folder_run(tmp_path, seed=0)
    first = _extract(run)
    assert not first["train"].from_cache and not first["val"].from_cache
    assert (run / "eval" / "features_train.pt").is_file() and (
        run / "eval" / "features_val.pt"
    ).is_file()
    assert first["train"].x.shape == (12, 192) and first["val"].x.shape == (6, 192)
    assert first["train"].y.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert first["n_classes"] == 3 and first["checkpoint_step"] == 16

    again = _extract(run)
    assert again["train"].from_cache and again["val"].from_cache
    assert torch.equal(again["train"].x, first["train"].x) and torch.equal(
        again["val"].y, first["val"].y
    )

    # the run is retrained / re-exported: same path, other weights
    write_teacher(run / "teacher_backbone.pth", load_config(run / "config.yaml"), seed=1)
    retrained = _extract(run)
    assert not retrained["train"].from_cache and not retrained["val"].from_cache
    assert not torch.allclose(retrained["train"].x, first["train"].x)
    assert retrained["checkpoint_sha256"] != first["checkpoint_sha256"]


@pytest.mark.parametrize(
    "damage", ["fewer rows", "other rows", "labels short", "a list", "a string step"]
)
def test_a_cache_with_the_right_key_and_the_wrong_content_is_extracted_again(
    tmp_path, damage, caplog
):
    """The key says which checkpoint, data and transform; the content must still be features of
    every image of the split: a cache whose rows, labels or types do not fit is ignored with a line,
    never used or a traceback."""
    from rundir.torch_files import load_verified, save_verified

    run = make_folder_run(tmp_path, seed=0)
    first = _extract(run)
    path = run / "eval" / "features_train.pt"
    stored = load_verified(path)
    x, y = stored["features"], stored["labels"]
    stored.update(
        {
            "fewer rows": {
                "features": x[:-2],
                "labels": y[:-2],
            },  # the right key, 10 of the 12 images
            "other rows": {"features": torch.cat([x, x[:1]]), "labels": torch.cat([y, y[:1]])},
            "labels short": {"labels": y[:-1]},
            "a list": {"features": x.tolist()},
            "a string step": {"step": "16"},
        }[damage]
    )
    save_verified(stored, path)
    again = _extract(run)
    assert (
        not again["train"].from_cache and again["val"].from_cache
    )  # the damaged one only: extracted again
    assert torch.equal(again["train"].x, first["train"].x) and torch.equal(
        again["train"].y, first["train"].y
    )
    assert "ignoring feature cache" in caplog.text and str(path) in caplog.text


def test_cache_key_covers_transform_data_model_and_precision():
    from configs.schema import StudentConfig

    base = dict(
        checkpoint_digest="abc",
        transform={"resize": 32, "crop": 32},
        student_cfg=StudentConfig(),
        dataset={"dataset": "imagenet_folder", "root": "/a", "split": "train", "n_images": 10},
        precision="cpu-fp32",
    )
    key = cache_key(**base)
    assert key == cache_key(**base)
    changes = [
        {"checkpoint_digest": "abd"},
        {"transform": {"resize": 37, "crop": 32}},
        {"dataset": {**base["dataset"], "root": "/b"}},
        {"dataset": {**base["dataset"], "n_images": 11}},
        {"dataset": {**base["dataset"], "split": "val"}},
        {"student_cfg": StudentConfig(arch="vit_small")},
        {"precision": "cuda-bf16"},
    ]
    for change in changes:
        assert cache_key(**{**base, **change}) != key, change


def test_missing_checkpoint_names_the_path(tmp_path):
    run = make_run_dir(tmp_path / "run", checkpoint="none")
    with pytest.raises(EvalInputError, match=str(run / "teacher_backbone.pth")):
        load_teacher(load_config(run / "config.yaml"), run / "teacher_backbone.pth")


def test_checkpoint_of_another_model_is_a_clear_error(tmp_path):
    run = make_run_dir(tmp_path / "run")
    other = make_run_dir(tmp_path / "other", "student.patch_size=4")  # another patch embedding
    with pytest.raises(EvalInputError, match="does not fit the run's model"):
        load_teacher(load_config(run / "config.yaml"), other / "teacher_backbone.pth")
