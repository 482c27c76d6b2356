"""make_table.py --reference (reporting/reference.py): the sparse recipe an ablation modifies, against
which every other sparse run is read seed by seed at its schedule, and every configuration by its
mean. Expected numbers are worked out in the comments."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from reporting_runs import make_run

from reporting.run_logs import read_run
from reporting.table import build_rows, make_table, schedule_means
from reporting.table_format import REFERENCE_HEADER
from rundir.errors import UsageError

RECIPE = ["sparsity.pruned_decay=0.005"]
ARM_A = ["sparsity.pruned_decay=0.01"]
ARM_B = ["sparsity.pruned_decay=0.02"]


@pytest.fixture
def study(tmp_path):
    """Dense seeds 0, 1; the recipe at 70% (seeds 0, 1) and 100% (seed 0); arm A at 70% on seeds 0
    and 1; arm B at 70% on seeds 0 and 2 (the recipe has no seed 2); arm A at 100%, seed 0."""
    runs = tmp_path / "runs"
    make_run(runs, "dense_s0", 0.0, top1=80.0)
    make_run(runs, "dense_s1", 0.0, seed=1, top1=81.0)
    make_run(runs, "rec70_s0", 0.7, top1=79.0, knn20=70.0, overrides=RECIPE)
    make_run(runs, "rec70_s1", 0.7, seed=1, top1=78.0, knn20=69.0, overrides=RECIPE)
    make_run(runs, "rec100_s0", 1.0, top1=75.0, overrides=RECIPE)
    make_run(runs, "a70_s0", 0.7, top1=80.0, knn20=70.5, overrides=ARM_A)
    make_run(runs, "a70_s1", 0.7, seed=1, top1=77.5, knn20=69.0, overrides=ARM_A)
    make_run(runs, "b70_s0", 0.7, top1=78.0, overrides=ARM_B)
    make_run(runs, "b70_s2", 0.7, seed=2, top1=76.0, overrides=ARM_B)
    make_run(runs, "a100_s0", 1.0, top1=74.0, overrides=ARM_A)
    return runs


def _read(runs, reference=("rec70_s0", "rec70_s1", "rec100_s0")):
    from reporting.reference import mark_reference

    summaries = [read_run(p) for p in sorted(runs.iterdir())]
    mark_reference(summaries, [runs / name for name in reference])
    rows = build_rows(summaries)
    return {r.run: r for r in rows}, schedule_means(rows)


def test_each_sparse_run_against_the_reference_of_its_schedule_and_seed(study):
    rows, _ = _read(study)
    # 80 - 79, 77.5 - 78, 78 - 79; 74 - 75 at 100%; k-NN 70.5 - 70
    assert rows["a70_s0"].delta_top1_reference == pytest.approx(1.0)
    assert rows["a70_s1"].delta_top1_reference == pytest.approx(-0.5)
    assert rows["b70_s0"].delta_top1_reference == pytest.approx(-1.0)
    assert rows["a100_s0"].delta_top1_reference == pytest.approx(-1.0)
    assert rows["a70_s0"].delta_knn_top1_reference == pytest.approx(0.5)
    # the recipe has no seed 2; dense runs and the reference itself are not read against it
    for name in ("b70_s2", "dense_s0", "rec70_s0", "rec100_s0"):
        assert rows[name].delta_top1_reference is None, name
    assert {n for n, r in rows.items() if r.reference} == {"rec100_s0", "rec70_s0", "rec70_s1"}


def test_a_configuration_against_the_reference_over_the_same_seeds_else_all(study):
    _, means = _read(study)
    by_runs = {tuple(m.runs): m for m in means}
    a70 = by_runs[("a70_s0", "a70_s1")]
    # the recipe ran seeds 0 and 1 too: paired, mean of (+1, -0.5) = 78.75 - 78.5; sd 1.0607, se
    # 0.75, t(1) 12.706: ±9.53
    assert a70.delta_top1_reference == pytest.approx(0.25)
    assert a70.delta_top1_reference_interval.method == "paired t"
    assert (a70.delta_top1_reference_interval.low, a70.delta_top1_reference_interval.high) == (
        pytest.approx(-9.2797, abs=1e-3),
        pytest.approx(9.7797, abs=1e-3),
    )
    # seeds 0 and 2, the recipe 0 and 1: every seed of the recipe, Welch's; 77 - 78.5
    b70 = by_runs[("b70_s0", "b70_s2")]
    assert b70.delta_top1_reference == pytest.approx(-1.5)
    assert b70.delta_top1_reference_interval.method == "Welch t"
    # one seed at 100%: its difference, no interval
    a100 = by_runs[("a100_s0",)]
    assert a100.delta_top1_reference == pytest.approx(-1.0)
    assert a100.delta_top1_reference_interval is None
    for m in means:
        if m.sparse_fraction == 0.0 or "rec" in m.runs[0]:
            assert m.delta_top1_reference is None, m.runs


def test_the_table_shows_it_only_with_a_reference(study, tmp_path):
    out = tmp_path / "out"
    make_table([study], out, plots=False, reference=[study / "rec70_s0", study / "rec70_s1"])
    text = (out / "table.md").read_text()
    assert REFERENCE_HEADER in text and "Δ top-1 / k-NN vs the reference (pp)" in text
    assert "complete, reference" in text and "Δ vs the reference: against the run" in text
    with open(out / "table.csv") as f:
        lines = {r["run"]: r for r in csv.DictReader(f) if r["kind"] == "run"}
    assert float(lines["a70_s1"]["delta_top1_reference"]) == pytest.approx(-0.5)
    assert lines["rec70_s0"]["reference"] == "True"
    # named at 70% only: the 100% runs have no reference
    assert lines["a100_s0"]["delta_top1_reference"] == ""
    summary = json.loads((out / "summary.json").read_text())
    assert {r["run"] for r in summary["rows"] if r["reference"]} == {"rec70_s0", "rec70_s1"}

    plain = tmp_path / "plain"
    make_table([study], plain, plots=False)
    text = (plain / "table.md").read_text()
    assert "vs the reference" not in text and ", reference" not in text


@pytest.mark.parametrize(
    "names, says",
    [
        (["dense_s0"], "a dense run"),
        (["rec70_s0", "a70_s0"], "both at 0.7 sparse with seed 0"),
        (["rec70_s0", "a70_s1"], "two configurations at 0.7 sparse"),
    ],
)
def test_a_reference_that_cannot_be_one_is_refused_before_anything_is_written(
    study, tmp_path, names, says
):
    out = tmp_path / "out"
    with pytest.raises(UsageError, match=says):
        make_table([study], out, plots=False, reference=[study / name for name in names])
    assert not out.exists()


def test_the_command_line_refuses_a_reference_outside_the_table(study, tmp_path):
    out = tmp_path / "out"
    elsewhere = make_run(tmp_path / "other", "rec70_s9", 0.7, seed=9, overrides=RECIPE)
    repo = Path(__file__).resolve().parents[2]
    command = [sys.executable, str(repo / "scripts" / "make_table.py"), str(study)]
    command += ["--out", str(out), "--no-plots", "--reference", str(elsewhere)]
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=repo, timeout=120, check=False
    )
    assert result.returncode == 2, result.stderr
    assert "--reference" in result.stderr and "not among the table's runs" in result.stderr
    assert not out.exists()
