"""eval_linear.py end to end: the embedded default's digits run and an image-folder run; bad input
exits cleanly."""

import json
import re
import subprocess
import sys

import pytest
from eval_test_helpers import FAST_EVAL, REPO, fast, make_folder_run, make_run_dir

sys.path.insert(0, str(REPO))
import eval_linear  # noqa: E402

REQUIRED = {
    "top1",
    "top5",
    "best_C",
    "C_curve",
    "feature_dim",
    "solver",
    "seconds",
    "knn",
    "n_train",
    "n_val",
    "checkpoint",
    "checkpoint_step",
}


def test_digits_run_end_to_end(tmp_path, capsys):
    # the embedded default's dataset, as `python eval_linear.py --run DIR` runs it (in-process:
    # saves an interpreter)
    run = make_run_dir(tmp_path / "runs" / "tiny")
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, "solver=torch"]) == 0
    record = json.loads((run / fast("eval_linear.json")).read_text())
    assert REQUIRED <= set(record)
    assert (record["n_train"], record["n_val"], record["n_classes"], record["feature_dim"]) == (
        1437,
        360,
        10,
        192,
    )
    assert record["solver"] == "torch" and record["checkpoint_step"] == 16
    assert len(record["C_curve"]) == 4 and record["best_C"] in [p["C"] for p in record["C_curve"]]
    assert 0.0 <= record["top1"] <= record["top5"] <= 100.0
    assert set(record["knn"]) == {"5", "20"} and all(
        0 <= v["top1"] <= v["top5"] <= 100 for v in record["knn"].values()
    )
    assert (
        record["top1"] > 20.0
    )  # even a random-init ViT's features separate digits better than chance (10%)
    index = (tmp_path / "runs" / "eval_index.jsonl").read_text().splitlines()
    assert len(index) == 1 and json.loads(index[0])["top1"] == record["top1"]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["top1"] == record["top1"]


def test_folder_run_in_a_subprocess(tmp_path):
    run = make_folder_run(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "eval_linear.py"),
            "--run",
            str(run),
            *FAST_EVAL,
            "features.cache=false",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # as in a Slurm .err file: plain progress lines, no tqdm bar redrawn with carriage returns
    done = re.findall(
        r"INFO evaluation\.features: (train|val) features: (\d+)/\2 batches \(100%\)", result.stderr
    )
    assert "\r" not in result.stderr and sorted(split for split, _ in done) == ["train", "val"], (
        result.stderr[-3000:]
    )
    # a first line says what is evaluated, before any work
    said = (
        f"INFO evaluation.evaluate: evaluating checkpoint {run / 'teacher_backbone.pth'} of run "
        f"{run}: "
        "linear probe and k-NN on cpu"
    )
    assert said in result.stderr.splitlines()[0], result.stderr[:1000]
    record = json.loads((run / fast("eval_linear.json")).read_text())
    assert REQUIRED <= set(record) and record["n_train"] == 12 and record["n_val"] == 6
    assert record["solver"] == "sklearn"  # auto on a CPU
    assert record["top1"] > 50.0  # three colours; chance is 33%
    assert not (run / "eval" / "features_train.pt").exists()  # features.cache=false writes no cache


def test_folder_run_knn_then_linear_reuses_features(tmp_path, capsys):
    run = make_folder_run(tmp_path)
    out = tmp_path / "custom.json"
    index = tmp_path / "index.jsonl"
    assert (
        eval_linear.main(
            ["--run", str(run), *FAST_EVAL, "mode=knn", f"output={out}", f"index={index}"]
        )
        == 0
    )
    knn_only = json.loads(out.read_text())
    assert knn_only["top1"] is None and knn_only["knn"]["5"]["top1"] >= 0
    assert not knn_only["features_cached"]["train"]
    assert (
        eval_linear.main(
            [
                "--run",
                str(run),
                *FAST_EVAL,
                "mode=linear",
                "solver=sklearn",
                f"output={out}",
                f"index={index}",
            ]
        )
        == 0
    )
    linear = json.loads(out.read_text())
    assert (
        linear["features_cached"] == {"train": True, "val": True} and linear["solver"] == "sklearn"
    )
    assert linear["knn"] == {} and linear["n_train"] == 12 and linear["n_classes"] == 3
    assert len(index.read_text().splitlines()) == 2


def test_unknown_key_exits_2_naming_it(tmp_path, capsys):
    assert eval_linear.main(["--run", str(tmp_path), "linear.c_grid=3"]) == 2
    err = capsys.readouterr().err
    assert "linear.c_grid" in err and "valid keys in linear" in err


def test_bad_solver_value_exits_2(tmp_path, capsys):
    assert eval_linear.main(["--run", str(tmp_path), "solver=cuml"]) == 2
    assert "solver='cuml' is not one of" in capsys.readouterr().err


def test_run_without_final_checkpoint_exits_1_naming_the_path(tmp_path, caplog):
    run = make_run_dir(tmp_path / "run", checkpoint="none")
    assert eval_linear.main(["--run", str(run), *FAST_EVAL]) == 1
    assert (
        str(run / "teacher_backbone.pth") in caplog.text
        and not (run / fast("eval_linear.json")).exists()
    )


def test_not_a_run_directory_exits_1(tmp_path, caplog):
    assert eval_linear.main(["--run", str(tmp_path / "nowhere")]) == 1
    assert "run directory not found" in caplog.text
    assert eval_linear.main(["--run", str(tmp_path)]) == 1
    assert "config.yaml" in caplog.text


def test_missing_data_root_exits_1_naming_it(tmp_path, caplog):
    run = make_folder_run(tmp_path, checkpoint="dummy")
    missing = tmp_path / "no_such_imagenet"
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, f"data.root={missing}"]) == 1
    assert str(missing) in caplog.text


@pytest.mark.parametrize("split", ["data.val_split=test"])
def test_missing_split_folder_exits_1(tmp_path, caplog, split):
    run = make_folder_run(tmp_path, checkpoint="dummy")
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, split]) == 1
    assert "no 'test' folder" in caplog.text


def test_random_init_baseline_has_its_own_output_and_cache(tmp_path):
    run = make_folder_run(tmp_path)
    index = tmp_path / "index.jsonl"
    assert (
        eval_linear.main(
            ["--run", str(run), *FAST_EVAL, "mode=knn", "checkpoint=random", f"index={index}"]
        )
        == 0
    )
    record = json.loads((run / fast("eval_knn_random_init.json")).read_text())
    assert record["checkpoint"] == "random" and record["checkpoint_step"] == 0
    assert (
        not (run / fast("eval_linear.json")).exists()
        and (run / "eval" / "features_train_random_init.pt").is_file()
    )


def test_unreadable_checkpoint_exits_1_naming_it(tmp_path, caplog):
    run = make_folder_run(tmp_path, checkpoint="dummy")
    assert eval_linear.main(["--run", str(run), *FAST_EVAL]) == 1
    assert f"cannot read {run / 'teacher_backbone.pth'}" in caplog.text


def test_ctrl_c_during_an_evaluation_is_one_line_and_exit_130(tmp_path, monkeypatch, caplog):
    """Ctrl-C while features are extracted or the probe fits: exit 130 with one line saying that
    every file written is whole, never a KeyboardInterrupt traceback."""
    run = make_run_dir(tmp_path / "runs" / "tiny")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("evaluation.evaluate_run", interrupted)
    assert eval_linear.main(["--run", str(run), *FAST_EVAL]) == 130
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert (
        len(errors) == 1
        and errors[0].startswith("interrupted (Ctrl-C)")
        and "rerun the same command" in errors[0]
    )
    assert not (run / fast("eval_linear.json")).exists()


def test_a_refusal_exits_with_its_own_code(tmp_path, monkeypatch, caplog):
    """Every refusal is a CommandError carrying its exit code: eval_linear.py prints its line and
    exits with it."""
    from rundir.errors import CommandError, UsageError

    run = make_run_dir(tmp_path / "runs" / "tiny")
    for error, code in (
        (CommandError("a run that cannot be used"), 1),
        (UsageError("a key that cannot be used"), 2),
    ):

        def refused(*args, error=error, **kwargs):
            raise error

        monkeypatch.setattr("evaluation.evaluate_run", refused)
        assert eval_linear.main(["--run", str(run), *FAST_EVAL]) == code
        assert str(error) in caplog.text
