"""make_table.py on a folder where some runs' files are malformed (hand-edited, half copied,
damaged, or hostile): the table still comes out, every run has its row, a broken run's row says what
is wrong with it, and nothing hangs or prints a traceback (the issue's case: one bad file failed the
whole table)."""

import csv
import json
import os
import subprocess
import sys

import pytest
from reporting_runs import REPO, make_run

BROKEN = {
    "eval_top1_text": ("eval_linear.json", b'{"top1": "abc", "knn": {}}'),
    "eval_top1_nan": ("eval_linear.json", b'{"top1": NaN}'),
    "eval_top1_huge": ("eval_linear.json", b'{"top1": 1e999}'),
    "eval_a_list": ("eval_linear.json", b"[1, 2, 3]"),
    "eval_fifo": ("eval_linear.json", None),
    "eval_latin1": ("eval_linear.json", '{"top1": 80, "note": "\xe9"}'.encode("latin-1")),
    "metrics_garbage": ("metrics.jsonl", b'{"step": \n\x00\x01\xff\n[1]\n{"step": "x"}\n'),
    "config_bad_yaml": ("config.yaml", b"student: [unclosed\n"),
    "config_fifo": ("config.yaml", None),
    "config_not_utf8": ("config.yaml", b"\xff\xfe\x00"),
    "log_not_utf8": ("log.txt", b"\xff\xfe ERROR \x1b[31m\n"),
    "status_garbage": ("status.json", b'{"state": 3'),
}


def _rows(out, kind="run"):
    with open(out / "table.csv") as f:
        return {row["run"]: row for row in csv.DictReader(f) if row["kind"] == kind}


@pytest.mark.timeout(300)  # a FIFO opened for reading would block for good
def test_one_malformed_run_costs_its_row_only(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "dense", 0.0, top1=90.0)
    make_run(runs, "s70", 0.7, top1=88.5)
    for name, (entry, content) in BROKEN.items():
        run = make_run(runs, name, 0.4, top1=85.0)
        path = run / entry
        path.unlink(missing_ok=True)
        if content is None:
            os.mkfifo(path)
        else:
            path.write_bytes(content)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_table.py"), str(runs), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=240,
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    rows = _rows(out)
    assert set(rows) == {"dense", "s70", *BROKEN}
    assert rows["dense"]["status"] == rows["s70"]["status"] == "complete"
    assert float(rows["s70"]["delta_top1"]) == pytest.approx(-1.5)
    for name in (
        "eval_top1_text",
        "eval_top1_nan",
        "eval_top1_huge",
        "eval_a_list",
        "eval_fifo",
        "eval_latin1",
    ):
        assert rows[name]["status"].startswith("eval unreadable"), (name, rows[name]["status"])
        assert rows[name]["top1"] == ""  # never a number that was not measured
    for name in ("config_bad_yaml", "config_fifo", "config_not_utf8"):
        assert "config" in rows[name]["status"] and rows[name]["top1"] == "", (
            name,
            rows[name]["status"],
        )
    assert (
        rows["eval_top1_nan"]["status"]
        == "eval unreadable (eval_linear.json: top1 is nan, not a percentage)"
    )
    assert rows["config_fifo"]["status"] == "unreadable (config.yaml is not a regular file)"
    # a damaged log or status file costs nothing measured; metrics without one readable line: no
    # progress claimed
    for name in ("log_not_utf8", "status_garbage"):
        assert rows[name]["status"] == "complete" and float(rows[name]["top1"]) == 85.0, (
            name,
            rows[name],
        )
    assert (
        rows["metrics_garbage"]["status"]
        == "partial (step 0 of 300, no readable step line in metrics.jsonl)"
    )
    # the 40% mean holds the complete runs only: no NaN, inf or unreadable value in it
    assert _rows(out, "schedule mean")["log_not_utf8, status_garbage"]["top1"] == "85.0"
    summary = json.loads((out / "summary.json").read_text())
    assert {r["run"] for r in summary["rows"]} == set(rows)
    assert (out / "top1_vs_sparsity.png").stat().st_size > 0 and (
        out / "loss_curves.png"
    ).stat().st_size > 0
