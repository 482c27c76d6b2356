"""Evaluating on a dataset other than the run's (data.dataset / data.root, recorded in the JSON),
the raw-pixel baseline (checkpoint=pixels), and a two-class folder end to end through the binary
probe."""

import json
import sys

import numpy as np
import pytest
import torch
from eval_test_helpers import FAST_EVAL, REPO, fast, make_folder_run, make_image_tree, make_run_dir
from sklearn.linear_model import LogisticRegression

from rundir.torch_files import load_verified

sys.path.insert(0, str(REPO))
import eval_linear  # noqa: E402


def test_digits_run_on_a_two_class_folder_end_to_end(tmp_path):
    # a digits-trained run evaluated on an ImageNet-style tree of two classes: the tree's images,
    # not digits, and the probe's final objective is sklearn's binary one at the chosen C (plain
    # LogisticRegression, numpy float64)
    run = make_run_dir(tmp_path / "runs" / "tiny")
    tree = make_image_tree(tmp_path / "two", classes=2, n_train=6, n_val=3, size=18)
    protocol = [*FAST_EVAL, "linear.tol=1e-9", "linear.max_iter=500"]
    assert (
        eval_linear.main(
            [
                "--run",
                str(run),
                *protocol,
                "solver=torch",
                "data.dataset=imagenet_folder",
                f"data.root={tree}",
            ]
        )
        == 0
    )
    assert not (
        run / fast("eval_linear.json", protocol)
    ).exists()  # other data than the run's: named apart
    (result,) = run.glob("eval_linear_data_*.json")
    assert result.name == fast(
        "eval_linear_data_two.json", protocol
    )  # named after the data set's folder
    record = json.loads(result.read_text())
    assert (record["n_train"], record["n_val"], record["n_classes"]) == (12, 6, 2)
    assert record["dataset"] == {
        "name": "imagenet_folder",
        "root": str(tree.resolve()),
        "from": "eval",
        "own": False,
        "other_because": "data.dataset=imagenet_folder, the run trained on digits",
        "label": "two",
    }
    for role, split in (("train", "train"), ("val", "val")):
        assert record[f"{role}_dataset"]["dataset"] == "imagenet_folder"
        assert record[f"{role}_dataset"]["root"] == str(tree.resolve())
        assert record[f"{role}_dataset"]["split"] == split
    assert record["linear_precision"] == "float64" and record["top1"] == 100.0  # two colours
    feats = load_verified(run / "eval" / "features_train.pt")
    x, y, C = feats["features"].double().numpy(), feats["labels"].numpy(), record["best_C"]
    ref = LogisticRegression(C=C, solver="newton-cholesky", tol=1e-12, max_iter=1000).fit(x, y)
    z = x @ ref.coef_[0] + ref.intercept_[0]
    objective = np.mean(np.logaddexp(0.0, z) - y * z) + ref.coef_[0] @ ref.coef_[0] / (
        2 * C * len(y)
    )
    assert record["final_loss"] == pytest.approx(objective, rel=1e-6)


def test_a_data_root_for_a_digits_run_is_not_silently_ignored(tmp_path, caplog):
    run = make_run_dir(tmp_path / "run", checkpoint="dummy")
    tree = make_image_tree(tmp_path / "tree", classes=2, n_train=1, n_val=1)
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, f"data.root={tree}"]) == 1
    assert "data.dataset=imagenet_folder" in caplog.text and str(tree) in caplog.text
    caplog.clear()
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, "data.dataset=imagenet_folder"]) == 1
    assert "data.dataset=imagenet_folder needs data.root" in caplog.text
    assert not (run / fast("eval_linear.json")).exists()


def test_probes_on_other_data_get_readable_names_and_two_folders_of_one_name_keep_apart(
    tmp_path, caplog
):
    run = make_run_dir(tmp_path / "run")
    first = make_image_tree(
        tmp_path / "a" / "my set", classes=2, n_train=10, n_val=1
    )  # 20 images: k=20 is shown
    second = make_image_tree(tmp_path / "b" / "my set", classes=3, n_train=2, n_val=1)
    probe = ["--run", str(run), *FAST_EVAL, "data.dataset=imagenet_folder"]
    with caplog.at_level("INFO"):
        assert eval_linear.main([*probe, f"data.root={first}"]) == 0
    assert "make_table.py --eval my-set" in caplog.text
    summary = next(
        r.getMessage() for r in caplog.records if r.getMessage().startswith("linear top-1")
    )
    record = json.loads((run / fast("eval_linear_data_my-set.json")).read_text())
    assert summary == (
        f"linear top-1 {record['top1']:.2f} / top-5 {record['top5']:.2f} "
        f"(C={record['best_C']:.3g}); "
        f"k-NN k=20 top-1 {record['knn']['20']['top1']:.2f} / top-5 "
        f"{record['knn']['20']['top5']:.2f}; " + fast("eval_linear_data_my-set.json")
    )
    assert (
        eval_linear.main([*probe, f"data.root={first}"]) == 0
    )  # the same data again: the same file
    assert eval_linear.main([*probe, f"data.root={second}", "data.val_split=train"]) == 0
    assert (run / fast("eval_linear_data_my-set_train-train.json")).is_file()
    caplog.clear()
    assert eval_linear.main([*probe, f"data.root={second}"]) == 0
    assert "under the same folder name" in caplog.text
    (hashed,) = run.glob("eval_linear_data_my-set-*.json")
    assert json.loads(hashed.read_text())["n_classes"] == 3
    assert (
        json.loads((run / fast("eval_linear_data_my-set.json")).read_text())["n_classes"] == 2
    )  # untouched


def test_a_run_on_unlabelled_images_is_probed_only_on_a_labelled_set_it_is_given(tmp_path, caplog):
    images = make_image_tree(tmp_path / "mine", classes=2, n_train=2, n_val=1) / "train"
    run = make_run_dir(
        tmp_path / "run", "data.dataset=image_folder", f"data.root={images}", checkpoint="dummy"
    )
    assert eval_linear.main(["--run", str(run), *FAST_EVAL]) == 1
    assert (
        "trained on unlabelled images" in caplog.text
        and "data.dataset=imagenet_folder data.root=" in caplog.text
    )
    assert not list(run.glob("eval_linear*.json"))


def test_bad_dataset_name_exits_2(tmp_path, capsys):
    assert eval_linear.main(["--run", str(tmp_path), "data.dataset=cifar10"]) == 2
    assert "data.dataset='cifar10' is not one of" in capsys.readouterr().err


def test_pixel_baseline(tmp_path):
    from configs import load_config
    from data import build_dataset, make_eval_transform

    run = make_folder_run(tmp_path, checkpoint="none")  # no model is needed, nor loaded
    index = tmp_path / "index.jsonl"
    assert (
        eval_linear.main(["--run", str(run), *FAST_EVAL, "checkpoint=pixels", f"index={index}"])
        == 0
    )
    record = json.loads((run / fast("eval_linear_pixels.json")).read_text())
    assert record["checkpoint"] == "pixels" and record["feature_dim"] == 3 * 16 * 16
    assert record["top1"] is not None and set(record["knn"]) == {"5", "12"}
    assert not (run / fast("eval_linear.json")).exists()
    # the features are the eval transform's normalised pixels, flattened
    cfg = load_config(run / "config.yaml")
    dataset = build_dataset(cfg.data, split="val", transform=make_eval_transform(16, 16))
    cached = load_verified(run / "eval" / "features_val_pixels.pt")["features"]
    assert torch.equal(cached[0], dataset[0][0].flatten())
    # mode=knn: its own file, features from the cache
    assert (
        eval_linear.main(
            ["--run", str(run), *FAST_EVAL, "checkpoint=pixels", "mode=knn", f"index={index}"]
        )
        == 0
    )
    knn = json.loads((run / fast("eval_knn_pixels.json")).read_text())
    assert knn["checkpoint"] == "pixels" and knn["features_cached"] == {"train": True, "val": True}
    assert knn["knn"] == record["knn"]
