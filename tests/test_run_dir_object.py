"""`rundir.RunDir`: a run directory's paths and readers in one object, and the rule that keeps them
there: outside `rundir/`, no module joins a run file's name to a folder by hand."""

import ast
import json
import lzma
from pathlib import Path

import pytest

from rundir.run_dir import RunDir

REPO = Path(__file__).resolve().parents[1]

# The names as `rundir/layout.py`'s docstring documents them, written out here rather than read from
# the module.
DOCUMENTED = {
    "config_file": "config.yaml",
    "run_info_file": "run_info.json",
    "status_file": "status.json",
    "metrics_file": "metrics.jsonl",
    "masks_file": "sparsity_masks.jsonl",
    "log_file": "log.txt",
    "decisions_file": "sparsity_decisions.json",
    "checkpoint_dir": "checkpoints",
    "eval_dir": "eval",
    "teacher": "teacher_backbone.pth",
    "student": "student_backbone.pth",
}
LAYOUT_CONSTANTS = {
    "CONFIG",
    "RUN_INFO",
    "STATUS",
    "METRICS",
    "SPARSITY_MASKS",
    "LOG",
    "CHECKPOINTS",
    "TEACHER",
    "STUDENT",
    "SPARSITY_DECISIONS",
    "EVAL_DIR",
    "LOCK",
    "EVAL_RESULT",
}


def test_paths_are_the_documented_names(tmp_path):
    run = RunDir(str(tmp_path / "r"))
    assert (
        isinstance(run.path, Path)
        and str(run) == str(tmp_path / "r")
        and Path(run) == tmp_path / "r"
    )
    for attribute, name in DOCUMENTED.items():
        assert getattr(run, attribute) == tmp_path / "r" / name, attribute
    assert run.checkpoint(1200) == tmp_path / "r" / "checkpoints" / "step_00001200.pt"
    assert (
        run.teacher_export(7) == tmp_path / "r" / "eval" / "step_00000007" / "teacher_backbone.pth"
    )
    assert run.eval_result() == tmp_path / "r" / "eval_linear.json"
    assert (
        run.eval_result(knn_only=True, suffix="_pixels") == tmp_path / "r" / "eval_knn_pixels.json"
    )


def test_readers_of_a_hand_made_run(tmp_path):
    run = RunDir(tmp_path)
    assert (
        not run.is_run()
        and not run.has_metrics()
        and run.checkpoints() == []
        and run.newest_checkpoint() is None
    )
    assert run.read_metrics() == [] and run.read_run_info() == {} and run.read_status().state == ""
    (tmp_path / "config.yaml").write_text("train:\n  seed: 0\n")
    lines = [{"step": 5, "format": 2, "loss": 3.0}, {"step": 10, "format": 2, "loss": 2.5}]
    (tmp_path / "metrics.jsonl.xz").write_bytes(
        lzma.compress(("\n".join(json.dumps(line) for line in lines) + "\n").encode())
    )
    (tmp_path / "status.json").write_text(
        json.dumps({"state": "preempted", "step": 10, "resumed_at": [4]})
    )
    (tmp_path / "run_info.json").write_text(
        json.dumps({"world_size": 2, "batch_size_per_gpu": "8"})
    )  # wrong type
    (tmp_path / "checkpoints").mkdir()
    for name in (
        "step_00000010.pt",
        "step_00000005.pt",
        "step_00000003.pt.tmp",
        "step_00000020.pt.sha256",
    ):
        (tmp_path / "checkpoints" / name).write_bytes(b"x")
    (tmp_path / "checkpoints" / "step_00000008.pt.corrupt").write_bytes(b"x")
    assert run.is_run() and run.has_metrics()  # the committed runs' compressed metrics count
    assert [r["loss"] for r in run.read_metrics()] == [3.0, 2.5]
    status = run.read_status()
    assert (status.state, status.step, status.resumed_at) == ("preempted", 10, [4])
    assert run.read_run_info() == {}  # a field of the wrong type: read as absent, never coerced
    assert [step for step, _ in run.checkpoints()] == [5, 10]
    assert run.newest_checkpoint() == (10, tmp_path / "checkpoints" / "step_00000010.pt")
    assert [step for step, _ in run.checkpoints(".corrupt")] == [8]


def hand_built_run_paths(path: Path) -> list[str]:
    """`folder / NAME` where NAME is a run file's layout constant (bare or as `layout.NAME`) or its
    literal name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)):
            continue
        right = node.right
        if (
            isinstance(right, ast.Name)
            and right.id in LAYOUT_CONSTANTS
            or isinstance(right, ast.Attribute)
            and right.attr in LAYOUT_CONSTANTS
            or isinstance(right, ast.Constant)
            and right.value in DOCUMENTED.values()
        ):
            found.append(
                f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path.name}:{node.lineno}"
            )
    return found


def test_no_module_outside_rundir_builds_a_run_path_by_hand():
    files = [p for p in REPO.glob("*.py")]
    for package in (
        "configs",
        "data",
        "models",
        "training",
        "evaluation",
        "reporting",
        "slurm",
        "scripts",
    ):
        files += sorted((REPO / package).rglob("*.py"))
    found = [hit for path in files for hit in hand_built_run_paths(path)]
    assert found == [], f"build these paths with rundir.run_dir.RunDir: {found}"


@pytest.mark.parametrize(
    "line", ['p = run / "metrics.jsonl"', "p = run / TEACHER", "p = run / layout.CONFIG"]
)
def test_the_check_finds_a_hand_built_path(tmp_path, line):
    planted = tmp_path / "planted.py"
    planted.write_text(f"{line}\nq = run / 'other.txt'\n")
    assert hand_built_run_paths(planted) == ["planted.py:1"]
