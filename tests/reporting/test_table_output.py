"""make_table's --out: checked before any work (a file, a path under a file, a folder it cannot
write: one line, exit 2, nothing written), and the output set replaced as a whole or not at all (a
full disk midway leaves the previous table's files as they were, and no staging folder)."""

import errno
import os
import subprocess
import sys

import pytest
from reporting_runs import REPO, make_run

import reporting.table as table_module
from reporting.table import make_table
from rundir.errors import RunDirProblem, UsageError


@pytest.fixture
def runs(tmp_path):
    folder = tmp_path / "runs"
    make_run(folder, "dense", 0.0, top1=80.0)
    make_run(folder, "sparse70", 0.7, top1=79.0)
    return folder


def _cli(runs, out):
    return subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "make_table.py"),
            str(runs),
            "--no-plots",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    "where, message",
    [
        ("a_file", "exists and is not a folder"),
        ("a_file/table", "is not a folder, so the table's folder cannot be made"),
    ],
)
def test_an_out_that_cannot_be_a_folder_is_one_line_before_any_work(runs, tmp_path, where, message):
    (tmp_path / "a_file").write_text("mine")
    result = _cli(runs, tmp_path / where)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert (tmp_path / "a_file").read_text() == "mine"


def test_an_out_it_cannot_write_is_refused(runs, tmp_path, monkeypatch):
    monkeypatch.setattr(
        table_module.os, "access", lambda path, mode: False
    )  # (root may write anywhere)
    with pytest.raises(UsageError, match="is not writable"):
        make_table([runs], tmp_path / "out", plots=False)
    assert not (tmp_path / "out").exists()


def test_a_full_disk_midway_leaves_the_previous_table_whole(runs, tmp_path, monkeypatch):
    out = tmp_path / "out"
    make_table([runs], out, plots=False)
    before = {name: (out / name).read_bytes() for name in ("table.md", "table.csv", "summary.json")}
    make_run(runs, "sparse40", 0.4, top1=79.5)  # a new run: the next table would differ
    real, calls = table_module.write_csv, []

    def full_disk(*args, **kwargs):  # the CSV is the second file written
        calls.append(1)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(table_module, "write_csv", full_disk)
    with pytest.raises(
        RunDirProblem, match="the table could not be written .*the files there are as they were"
    ):
        make_table([runs], out, plots=False)
    assert calls and {name: (out / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in out.iterdir()) == sorted(before)  # no staging folder left
    monkeypatch.setattr(table_module, "write_csv", real)
    make_table([runs], out, plots=False)
    assert (
        "sparse40" in (out / "table.md").read_text()
        and "sparse40" not in before["table.md"].decode()
    )


def test_a_bar_in_a_run_name_stays_in_its_cell(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "dense|x", 0.0, top1=80.0)
    make_run(runs, "sparse70", 0.7, top1=79.0)
    make_table([runs], tmp_path / "out", plots=False)
    lines = (tmp_path / "out" / "table.md").read_text().splitlines()
    runs_table = lines[lines.index("## Runs") + 2 :]
    header, row = runs_table[0], next(line for line in runs_table if line.startswith("| dense"))
    assert row.startswith("| dense\\|x |")
    # as many unescaped bars as the header's: the same number of columns
    assert row.replace("\\|", "").count("|") == header.count("|")


def test_runs_on_different_images_are_never_seeds_of_one_configuration(tmp_path):
    """Two runs of one recipe whose training images differ (run_info.json's data_fingerprint) are
    two rows, each compared with the dense run of its own images; a table that averaged them called
    75.00 +- 25.00 a result."""
    import csv

    runs = tmp_path / "runs"
    make_run(runs, "dense_a", 0.0, top1=80.0, data_fingerprint="aaaaaaaaaaaaaaaa")
    make_run(runs, "dense_b", 0.0, seed=1, top1=60.0, data_fingerprint="bbbbbbbbbbbbbbbb")
    make_run(runs, "sparse_a", 0.7, top1=100.0, data_fingerprint="aaaaaaaaaaaaaaaa")
    make_run(runs, "sparse_b", 0.7, seed=1, top1=50.0, data_fingerprint="bbbbbbbbbbbbbbbb")
    make_table([runs], tmp_path / "out", plots=False)
    with open(tmp_path / "out" / "table.csv") as f:
        lines = list(csv.DictReader(f))
    rows = {r["run"]: r for r in lines if r["kind"] == "run"}
    assert (
        float(rows["sparse_a"]["delta_top1"]) == 20.0
        and float(rows["sparse_b"]["delta_top1"]) == -10.0
    )
    assert not [
        r for r in lines if r["kind"] == "schedule mean"
    ]  # one seed per set: nothing averaged
    table = (tmp_path / "out" / "table.md").read_text()
    assert (
        "trained on 2 different sets of images" in table
        and "data.fingerprint=aaaaaaaaaaaaaaaa" in table
    )


def test_runs_without_a_fingerprint_share_the_one_recorded(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "dense_s0", 0.0, top1=80.0, data_fingerprint="aaaaaaaaaaaaaaaa")
    make_run(runs, "dense_s1", 0.0, seed=1, top1=81.0)  # an older run: nothing recorded
    make_table([runs], tmp_path / "out", plots=False)
    table = (tmp_path / "out" / "table.md").read_text()
    assert (
        "different sets of images" not in table
        and "| 0% sparse (dense baseline) | 0, 1 | 2 |" in table
    )


def test_probes_under_different_protocols_are_never_compared(tmp_path):
    """A run probed at knn.temperature=1.0 and one at the default are two rows, each with the dense
    run probed as it was; records written before they listed their protocol are read from their
    eval_config."""
    import csv
    import json

    from reporting_runs import eval_result

    runs = tmp_path / "runs"
    other = {**eval_result(70.0), "protocol_changes": ["knn.temperature=1.0"]}
    older = {
        **eval_result(50.0),
        "eval_config": "knn:\n  temperature: 1.0\n",
    }  # no protocol_changes field
    make_run(runs, "dense", 0.0, top1=80.0)
    make_run(runs, "dense_t1", 0.0, seed=1, result=older)
    make_run(runs, "sparse70", 0.7, top1=79.0)
    make_run(
        runs, "sparse70_t1", 0.7, seed=0, result=other
    )  # seed 0: only the protocol keeps it from "dense"
    make_table([runs], tmp_path / "out", plots=False)
    with open(tmp_path / "out" / "table.csv") as f:
        rows = {r["run"]: r for r in csv.DictReader(f) if r["kind"] == "run"}
    assert (
        float(rows["sparse70"]["delta_top1"]) == -1.0
        and float(rows["sparse70_t1"]["delta_top1"]) == 20.0
    )
    table = (tmp_path / "out" / "table.md").read_text()
    assert "probed under 2 protocols (default; knn.temperature=1.0)" in table
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert {r["run"]: r["differing_config"]["eval.protocol"] for r in summary["rows"]}[
        "dense_t1"
    ] == "knn.temperature=1.0"
