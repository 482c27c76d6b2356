"""scripts/experiments/study_import.py: a study's runs copied into results/ as records only, with
the machine's paths replaced, and nothing written where a path would be left."""

import json
import lzma

import pytest

from rundir.metrics import read_metrics
from scripts.experiments.study_import import main


def _run(root, name, data_root="/scratch/job7/cifar10"):
    run = root / name
    (run / "eval" / "step_00000008").mkdir(parents=True)
    (run / "config.yaml").write_text(f"data:\n  root: {data_root}\ntrain:\n  seed: 0\n")
    (run / "log.txt").write_text(
        f"writing to {root}/{name}\nimport from /usr/lib/python3.12/site-packages/torch\n"
    )
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    (run / "status.json").write_text('{"state": "finished"}')
    (run / "study.json").write_text('{"role": "screening", "plan": "screen_1.txt"}')
    (run / "eval_linear.json").write_text(
        json.dumps({"checkpoint": f"{root}/{name}/teacher_backbone.pth", "top1": 70.0})
    )
    (run / "sparsity_masks.jsonl").write_text(
        '{"step": 1, "flip_rate": {"a": 0.0012342664930555555, "b": 1e-7}, '
        '"share": [2.71828, 5], "phase": "sparse"}\n{"step": 2, "fl\n'
    )
    for weights in (
        "teacher_backbone.pth",
        "student_backbone.pth",
        "eval/step_00000008/teacher_backbone.pth",
    ):
        (run / weights).write_bytes(b"weights")
    (run / "events.out.tfevents.1.host").write_bytes(b"tb")
    return run


def test_records_are_copied_with_paths_replaced_and_logs_compressed(tmp_path):
    runs = tmp_path / "scratch" / "runs"
    runs.mkdir(parents=True)
    _run(runs, "sparse70_s0")
    (runs / "driver.log").write_text("not a run")
    (runs / "half_made").mkdir()  # no config.yaml: not a run
    dest = tmp_path / "results"
    assert (
        main(
            [
                str(runs),
                "--to",
                str(dest),
                "--replace",
                f"{runs}/=",
                "--replace",
                "/scratch/job7/cifar10=cifar10",
                "--check-prefix",
                str(tmp_path),
                "--check-prefix",
                "/scratch/",
                "--check-prefix",
                "/usr/",
            ]
        )
        == 0
    )
    out = dest / "sparse70_s0"
    assert sorted(p.name for p in out.iterdir()) == [
        "config.yaml",
        "eval_linear.json",
        "log.txt.xz",
        "metrics.jsonl.xz",
        "sparsity_masks.jsonl.xz",
        "status.json",
        "study.json",
    ]
    assert "root: cifar10\n" in (out / "config.yaml").read_text()
    log = lzma.decompress((out / "log.txt.xz").read_bytes())
    assert log == b"writing to sparse70_s0\nimport from site-packages/torch\n"
    assert (
        json.loads((out / "eval_linear.json").read_text())["checkpoint"]
        == "sparse70_s0/teacher_backbone.pth"
    )
    # the per-layer statistics at 4 significant digits, a line cut by a kill kept as it was
    assert lzma.decompress((out / "sparsity_masks.jsonl.xz").read_bytes()) == (
        b'{"step": 1, "flip_rate": {"a": 0.001234, "b": 1e-07}, "share": [2.718, 5], "phase": '
        b'"sparse"}\n'
        b'{"step": 2, "fl\n'
    )
    assert read_metrics(out / "metrics.jsonl") == [
        {"step": 1, "loss": 2.0}
    ]  # the readers take the .xz
    assert [p.name for p in dest.iterdir()] == ["sparse70_s0"]  # no staging folder left behind


def test_a_path_left_over_writes_nothing_and_names_the_file(tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    _run(runs, "a_s0")
    _run(runs, "b_s0", data_root="/scratch/other/cifar10")  # a second data root nobody replaced
    dest = tmp_path / "results"
    assert (
        main(
            [
                str(runs),
                "--to",
                str(dest),
                "--replace",
                f"{runs}/=",
                "--replace",
                "/scratch/job7/cifar10=cifar10",
                "--check-prefix",
                "/scratch/",
            ]
        )
        == 1
    )
    assert "b_s0/config.yaml: still holds /scratch/" in capsys.readouterr().err
    assert list(dest.iterdir()) == []


def test_runs_already_imported_are_refused_unless_overwritten(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    _run(runs, "a_s0")
    dest = tmp_path / "results"
    (dest / "a_s0").mkdir(parents=True)
    (dest / "a_s0" / "eval_linear.json").write_text("kept")
    common = [str(runs), "--to", str(dest), "--replace", f"{runs}/=", "--check-prefix", "/nowhere/"]
    with pytest.raises(SystemExit, match="already under .*a_s0 .*--overwrite"):
        main(common)
    assert (dest / "a_s0" / "eval_linear.json").read_text() == "kept"
    assert main([*common, "--overwrite"]) == 0
    assert json.loads((dest / "a_s0" / "eval_linear.json").read_text())["top1"] == 70.0


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--replace", "=x"], "expected OLD=NEW with a non-empty OLD"),
        (["--replace", "noequals"], "expected OLD=NEW"),
    ],
)
def test_bad_replacements_are_usage_errors(tmp_path, capsys, argv, says):
    with pytest.raises(SystemExit) as stop:
        main([str(tmp_path), "--to", str(tmp_path / "out"), *argv])
    assert stop.value.code == 2 and says in capsys.readouterr().err


def test_two_runs_of_one_name_and_empty_folders_are_refused(tmp_path):
    for part in ("p1", "p2"):
        (tmp_path / part).mkdir()
        _run(tmp_path / part, "same_s0")
    with pytest.raises(SystemExit, match="same name in several RUNS_DIRs: same_s0"):
        main([str(tmp_path / "p1"), str(tmp_path / "p2"), "--to", str(tmp_path / "out")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no run"):
        main([str(tmp_path / "empty"), "--to", str(tmp_path / "out")])
