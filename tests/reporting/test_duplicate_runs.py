"""A copy of a run directory (the same run id in status.json) is one run, not a second seed: the
table averages the real seeds only and names the copy a duplicate of its original."""

import json
import shutil

import pytest
from reporting_runs import make_run

from reporting.table import make_table


def _status(run, run_id):
    (run / "status.json").write_text(
        json.dumps({"state": "finished", "step": 300, "run_id": run_id})
    )


def test_a_copied_run_is_named_a_duplicate_and_averaged_once(tmp_path):
    runs = tmp_path / "runs"
    _status(make_run(runs, "dense_s0", 0.0, seed=0, top1=80.0), "a" * 16)
    _status(make_run(runs, "dense_s1", 0.0, seed=1, top1=84.0), "b" * 16)
    shutil.copytree(
        runs / "dense_s1", runs / "dense_s1_copy"
    )  # same seed, same run id, same numbers
    make_table([runs], tmp_path / "table", plots=False)
    summary = json.loads((tmp_path / "table" / "summary.json").read_text())
    (mean,) = summary["schedule_means"]
    assert mean["runs"] == ["dense_s0", "dense_s1"] and mean["top1"] == pytest.approx(82.0)
    (copy,) = [r for r in summary["rows"] if r["run"] == "dense_s1_copy"]
    assert copy["status"].startswith("duplicate (a copy of dense_s1 (run id bbbbbbbbbbbbbbbb)")
    assert "duplicate (a copy of dense_s1" in (tmp_path / "table" / "table.md").read_text()


def test_runs_without_run_ids_are_not_compared(tmp_path):
    """Runs from before run ids: two seeds with equal numbers stay two seeds."""
    runs = tmp_path / "runs"
    make_run(runs, "dense_s0", 0.0, seed=0, top1=80.0)
    make_run(runs, "dense_s1", 0.0, seed=1, top1=80.0)
    make_table([runs], tmp_path / "table", plots=False)
    (mean,) = json.loads((tmp_path / "table" / "summary.json").read_text())["schedule_means"]
    assert mean["runs"] == ["dense_s0", "dense_s1"]
