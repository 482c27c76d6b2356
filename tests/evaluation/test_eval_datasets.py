"""Evaluating on a dataset other than the run's (data.dataset / data.root, recorded in the JSON), the raw-pixel
baseline (checkpoint=pixels), and a two-class folder end to end through the binary probe."""

import json
import sys

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from rundir.torch_files import load_verified

from eval_test_helpers import FAST_EVAL, REPO, make_folder_run, make_image_tree, make_run_dir

sys.path.insert(0, str(REPO))
import eval_linear  # noqa: E402


def test_digits_run_on_a_two_class_folder_end_to_end(tmp_path):
    # a digits-trained run evaluated on an ImageNet-style tree of two classes: the tree's images, not digits, and
    # the probe's final objective is sklearn's binary one at the chosen C (plain LogisticRegression, numpy float64)
    run = make_run_dir(tmp_path / "runs" / "tiny")
    tree = make_image_tree(tmp_path / "two", classes=2, n_train=6, n_val=3, size=18)
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, "solver=torch", "linear.tol=1e-9", "linear.max_iter=500",
                             "data.dataset=imagenet_folder", f"data.root={tree}"]) == 0
    assert not (run / "eval_linear.json").exists()  # other data than the run's: named apart, never its record
    (result,) = run.glob("eval_linear_data_*.json")
    record = json.loads(result.read_text())
    assert (record["n_train"], record["n_val"], record["n_classes"]) == (12, 6, 2)
    assert record["dataset"] == {"name": "imagenet_folder", "root": str(tree.resolve()), "from": "eval", "own": False,
                                 "other_because": "data.dataset=imagenet_folder, the run trained on digits"}
    for role, split in (("train", "train"), ("val", "val")):
        assert record[f"{role}_dataset"]["dataset"] == "imagenet_folder"
        assert record[f"{role}_dataset"]["root"] == str(tree.resolve())
        assert record[f"{role}_dataset"]["split"] == split
    assert record["linear_precision"] == "float64" and record["top1"] == 100.0  # two colours
    feats = load_verified(run / "eval" / "features_train.pt")
    x, y, C = feats["features"].double().numpy(), feats["labels"].numpy(), record["best_C"]
    ref = LogisticRegression(C=C, solver="newton-cholesky", tol=1e-12, max_iter=1000).fit(x, y)
    z = x @ ref.coef_[0] + ref.intercept_[0]
    objective = np.mean(np.logaddexp(0.0, z) - y * z) + ref.coef_[0] @ ref.coef_[0] / (2 * C * len(y))
    assert record["final_loss"] == pytest.approx(objective, rel=1e-6)


def test_a_data_root_for_a_digits_run_is_not_silently_ignored(tmp_path, caplog):
    run = make_run_dir(tmp_path / "run", checkpoint="dummy")
    tree = make_image_tree(tmp_path / "tree", classes=2, n_train=1, n_val=1)
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, f"data.root={tree}"]) == 1
    assert "data.dataset=imagenet_folder" in caplog.text and str(tree) in caplog.text
    caplog.clear()
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, "data.dataset=imagenet_folder"]) == 1
    assert "data.dataset=imagenet_folder needs data.root" in caplog.text
    assert not (run / "eval_linear.json").exists()


def test_bad_dataset_name_exits_2(tmp_path, capsys):
    assert eval_linear.main(["--run", str(tmp_path), "data.dataset=cifar10"]) == 2
    assert "data.dataset='cifar10' is not one of" in capsys.readouterr().err


def test_pixel_baseline(tmp_path):
    from configs import load_config
    from data import build_dataset, make_eval_transform

    run = make_folder_run(tmp_path, checkpoint="none")  # no model is needed, nor loaded
    index = tmp_path / "index.jsonl"
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, "checkpoint=pixels", f"index={index}"]) == 0
    record = json.loads((run / "eval_linear_pixels.json").read_text())
    assert record["checkpoint"] == "pixels" and record["feature_dim"] == 3 * 16 * 16
    assert record["top1"] is not None and set(record["knn"]) == {"5", "12"}
    assert not (run / "eval_linear.json").exists()
    # the features are the eval transform's normalised pixels, flattened
    cfg = load_config(run / "config.yaml")
    dataset = build_dataset(cfg.data, split="val", transform=make_eval_transform(16, 16))
    cached = load_verified(run / "eval" / "features_val_pixels.pt")["features"]
    assert torch.equal(cached[0], dataset[0][0].flatten())
    # mode=knn: its own file, features from the cache
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, "checkpoint=pixels", "mode=knn", f"index={index}"]) == 0
    knn = json.loads((run / "eval_knn_pixels.json").read_text())
    assert knn["checkpoint"] == "pixels" and knn["features_cached"] == {"train": True, "val": True}
    assert knn["knn"] == record["knn"]
