"""scripts/switch_report.py / reporting/switch.py: per run, the switch, the share of the switch-time
teacher left in the final one (checked against an EMA simulated here from dinov2's cosine formula,
not the trainer's schedule code), and the probes of the switch-time and final teachers in both MLP
modes, found by the names eval_linear.py writes."""

import json
import math
import subprocess
import sys

from reporting_runs import REPO, eval_result, make_run

from reporting.switch import switch_rows

SCRIPT = REPO / "scripts" / "switch_report.py"


def _knn_only(knn20: float) -> dict:
    result = eval_result(50.0, knn20)
    result["top1"] = result["top5"] = None  # a mode=knn probe
    return result


def _simulated_teacher_left(total: int, first_dense: int, base: float = 0.992) -> float:
    teacher = 1.0  # the switch-time teacher's weight; the student contributes the rest
    for step in range(first_dense, total):
        momentum = 1.0 - (1.0 - base) * (1 + math.cos(math.pi * step / total)) / 2
        teacher *= momentum
    return teacher


def test_rows_read_both_modes_at_the_switch_and_at_the_end(tmp_path):
    half = make_run(
        tmp_path, "half", 0.5, top1=70.0, knn20=72.0
    )  # 300 steps: the switch at 150, ends dense
    (half / "eval_knn_step_00000150.json").write_text(json.dumps(_knn_only(61.0)))
    (half / "eval_knn_step_00000150_pruned_mlp.json").write_text(json.dumps(_knn_only(66.5)))
    (half / "eval_knn_pruned_mlp.json").write_text(json.dumps(_knn_only(70.5)))
    full = make_run(
        tmp_path, "full", 1.0, top1=68.0, knn20=71.0, seed=1
    )  # ends sparse: as trained = pruned
    (full / "eval_knn_dense_mlp.json").write_text(json.dumps(_knn_only(60.0)))
    pruned = make_run(
        tmp_path, "half_pruned", 0.5, overrides=["sparsity.switch_weights=pruned"], result=None
    )
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.yaml").write_text("sparsity: {sparse_fraction: 2}\n")
    (tmp_path / "broken" / "metrics.jsonl").write_text("")

    rows, problems = switch_rows([half, full, pruned, tmp_path / "broken"])
    assert len(problems) == 1 and "broken" in problems[0] and "sparse_fraction" in problems[0]
    by = {r.run: r for r in rows}
    h = by["half"]
    assert (h.switch_step, h.ended_sparse, h.switch_weights) == (150, False, "dense")
    assert (
        h.knn_switch_dense,
        h.knn_switch_pruned,
        h.linear_final,
        h.knn_final,
        h.knn_final_other,
    ) == (61.0, 66.5, 70.0, 72.0, 70.5)
    assert math.isclose(h.teacher_left, _simulated_teacher_left(300, 150), rel_tol=1e-12)
    f = by["full"]
    assert (f.switch_step, f.teacher_left, f.knn_switch_dense, f.ended_sparse) == (
        None,
        None,
        None,
        True,
    )
    assert (f.linear_final, f.knn_final, f.knn_final_other) == (68.0, 71.0, 60.0)
    p = by["half_pruned"]
    assert p.switch_weights == "pruned" and p.linear_final is None and p.knn_switch_pruned is None
    assert [r.run for r in rows] == ["half", "full", "half_pruned"]  # setting, fraction, seed


def test_script_prints_and_writes_the_table(tmp_path):
    run = make_run(tmp_path / "runs", "half", 0.5, top1=70.0, knn20=72.0)
    (run / "eval_knn_step_00000150.json").write_text(json.dumps(_knn_only(61.0)))
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "runs"), "--out", str(tmp_path / "sw")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "| half | 50% | 150 | dense |" in out.stdout and "61.00 / –" in out.stdout
    assert (tmp_path / "sw.md").read_text() == out.stdout
    assert json.loads((tmp_path / "sw.json").read_text())[0]["knn_switch_dense"] == 61.0
    missing = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 2 and "not found" in missing.stderr
