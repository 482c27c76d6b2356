"""Speeds appear in a table only where every timed run had one kind of GPU to itself: runs on a CPU,
runs sharing a GPU, runs that did not record it and runs on two kinds of GPU leave the images/s,
training time and speed-up columns out, with a note saying which runs and why; the accuracies are
untouched."""

import csv
import json

import pytest
from reporting_runs import make_run

from reporting.speed_columns import SHARED_GPU_MB
from reporting.table import make_table

SPEED_HEADERS = ("Images/s, sparse phase", "Speed-up", "Training time", "Images/s, all steps")


def _table(tmp_path, runs):
    out = tmp_path / "out"
    make_table([runs], out, plots=False)
    with open(out / "table.csv") as f:
        rows = {r["run"]: r for r in csv.DictReader(f)}
    return (out / "table.md").read_text(), rows, json.loads((out / "summary.json").read_text())


def test_runs_alone_on_one_gpu_show_their_speeds_and_name_it(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "dense", 0.0)
    make_run(runs, "sparse70", 0.7, gpu_mem_outside_mb=SHARED_GPU_MB)  # at the limit: still alone
    table, rows, summary = _table(tmp_path, runs)
    assert all(h in table for h in SPEED_HEADERS)
    assert "Speeds: every timed run had one NVIDIA H200 to itself." in table
    assert (
        float(rows["sparse70"]["sparse_images_per_s"]) == 64.0 and rows["sparse70"]["speedup"] != ""
    )
    assert summary["speeds"] == {"gpu": "NVIDIA H200", "left_out": ""}


@pytest.mark.parametrize(
    "second, why",
    [
        (
            dict(gpu_mem_outside_mb=SHARED_GPU_MB + 1),
            "1 shared their GPU with another process, more than 4 GB in use "
            "outside the run (sparse70)",
        ),
        (
            dict(gpu_mem_outside_mb=None),
            "1 did not record whether they had their GPU to themselves (sparse70)",
        ),
        (
            dict(device="cpu", gpu_mem_outside_mb=None),
            "1 trained on a CPU, whose cores runs share (sparse70)",
        ),
        (
            dict(gpu="NVIDIA H100 80GB HBM3"),
            "the runs trained on different GPUs (NVIDIA H100 80GB HBM3, NVIDIA H200)",
        ),
    ],
)
def test_speeds_that_do_not_compare_are_left_out_with_the_reason(tmp_path, second, why):
    runs = tmp_path / "runs"
    make_run(runs, "dense", 0.0, top1=80.0)
    make_run(runs, "sparse70", 0.7, top1=79.0, **second)
    table, rows, summary = _table(tmp_path, runs)
    assert not any(h in table for h in SPEED_HEADERS)
    assert f"Images/s, training time and speed-up are left out: of the timed runs, {why}." in table
    for name in ("sparse_images_per_s", "dense_images_per_s", "images_per_s", "speedup", "time_s"):
        assert rows["sparse70"][name] == rows["dense"][name] == "", name
    assert float(rows["sparse70"]["delta_top1"]) == pytest.approx(-1.0)  # accuracies as before
    assert summary["speeds"]["gpu"] is None and why in summary["speeds"]["left_out"]


def test_many_runs_are_counted_beyond_three_names(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "dense", 0.0)
    for seed in range(5):
        make_run(runs, f"shared_s{seed}", 0.7, seed=seed, gpu_mem_outside_mb=11000.0)
    table, _, _ = _table(tmp_path, runs)
    assert "5 shared their GPU" in table and "(shared_s0, shared_s1, shared_s2 and 2 more)" in table
