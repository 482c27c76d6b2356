"""Screening runs (those that chose the settings under test) are named by the table's maker, shown
and marked, and kept out of every mean, interval and verdict: a confirmatory mean is taken over
fresh seeds alone."""

import csv
import json
import subprocess
import sys

import pytest
from reporting_runs import REPO, make_run

from reporting.table import make_table


@pytest.fixture
def study(tmp_path):
    runs = tmp_path / "runs"
    for seed, top1 in ((0, 80.0), (1, 81.0), (2, 80.5)):
        make_run(runs, f"dense_s{seed}", 0.0, seed=seed, top1=top1)
    # seed 0 screened the recipe and came out best; seeds 1 and 2 are the confirmatory ones
    for seed, top1 in ((0, 80.9), (1, 79.0), (2, 79.5)):
        make_run(runs, f"sparse70_s{seed}", 0.7, seed=seed, top1=top1)
    return runs


def test_screening_runs_are_shown_and_kept_out_of_the_means(study, tmp_path):
    out = tmp_path / "out"
    make_table([study], out, plots=False, screening=[study / "sparse70_s0"])
    with open(out / "table.csv") as f:
        lines = list(csv.DictReader(f))
    runs = {r["run"]: r for r in lines if r["kind"] == "run"}
    assert (
        runs["sparse70_s0"]["screening"] == "True" and runs["sparse70_s1"]["screening"] == "False"
    )
    assert float(runs["sparse70_s0"]["delta_top1"]) == pytest.approx(
        0.9
    )  # its own Δ against its seed's dense run
    means = {r["sparse_fraction"]: r for r in lines if r["kind"] == "schedule mean"}
    # 70%: seeds 1 and 2 only, (79.0 + 79.5) / 2 = 79.25 (with seed 0: 79.8); dense 80.5 over seeds
    # 0-2: Δ -1.25
    assert means["0.7"]["seed"] == "1 2" and float(means["0.7"]["top1"]) == pytest.approx(79.25)
    assert float(means["0.7"]["delta_top1"]) == pytest.approx(-1.25)
    assert (
        means["0.7"]["delta_top1_interval"] == "Welch t"
    )  # seeds 1, 2 against 0, 1, 2: not paired
    table = (out / "table.md").read_text()
    assert "| complete, screening |" in table
    assert "kept out of every mean, interval and verdict above: sparse70_s0." in table
    summary = json.loads((out / "summary.json").read_text())
    assert [r["run"] for r in summary["rows"] if r["screening"]] == ["sparse70_s0"]


def test_a_screening_run_outside_the_table_is_refused_before_anything_is_written(study, tmp_path):
    out = tmp_path / "out"
    elsewhere = make_run(tmp_path / "other", "sparse70_s9", 0.7, seed=9)
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "make_table.py"),
            str(study),
            "--out",
            str(out),
            "--no-plots",
            "--screening",
            str(elsewhere),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert (
        result.returncode == 2
        and "--screening" in result.stderr
        and "not among the table's runs" in result.stderr
    )
    assert not out.exists()


def _record_role(run, text: str) -> None:
    (run / "study.json").write_text(text)


def test_a_role_recorded_by_the_study_keeps_a_screening_run_out_without_the_flag(study, tmp_path):
    """study.json (written by study_runs.sh from the plan's "# role:") marks the run as the flag
    would: the same means, with no --screening on the command line."""
    _record_role(study / "sparse70_s0", '{"role": "screening", "plan": "screen_1.txt"}')
    for seed in (1, 2):
        _record_role(study / f"sparse70_s{seed}", '{"role": "confirmatory", "plan": "c.txt"}')
    out = tmp_path / "out"
    make_table([study], out, plots=False)
    with open(out / "table.csv") as f:
        lines = list(csv.DictReader(f))
    runs = {r["run"]: r for r in lines if r["kind"] == "run"}
    assert runs["sparse70_s0"]["screening"] == "True"
    assert runs["sparse70_s1"]["screening"] == "False"
    means = {r["sparse_fraction"]: r for r in lines if r["kind"] == "schedule mean"}
    assert means["0.7"]["seed"] == "1 2" and float(means["0.7"]["top1"]) == pytest.approx(79.25)


def test_a_confirmatory_run_named_as_screening_is_refused(study, tmp_path):
    _record_role(study / "sparse70_s1", '{"role": "confirmatory", "plan": "c.txt"}')
    with pytest.raises(Exception, match="recorded it as confirmatory"):
        make_table([study], tmp_path / "out", plots=False, screening=[study / "sparse70_s1"])


@pytest.mark.parametrize("text", ['{"role": "pilot"}', "{not json", '["screening"]'])
def test_an_unreadable_role_makes_the_run_unreadable_not_confirmatory(study, tmp_path, text):
    """A study.json the table cannot read as a role leaves the run out of everything, with the
    reason, rather than letting a possibly screening run into a mean."""
    _record_role(study / "sparse70_s0", text)
    out = tmp_path / "out"
    make_table([study], out, plots=False)
    summary = json.loads((out / "summary.json").read_text())
    row = next(r for r in summary["rows"] if r["run"] == "sparse70_s0")
    assert row["status"] != "complete"
    means = {m["sparse_fraction"]: m for m in summary["schedule_means"]}
    assert means[0.7]["seeds"] == [1, 2]
