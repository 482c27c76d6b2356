"""The scaling benchmark's phase comparison (`scripts/bench_scaling.py --compare`): which phase a
result measured, the rows side by side with hand-computed ratios, refusals before any file is
written, and the figures."""

import json

import pytest

from scripts import bench_scaling
from scripts.benchmarks.scaling_plots import (
    compare_phases,
    configured_phase,
    result_labels,
    timed_phase,
)


def a_result(gpu, overrides, step_ms_by_gpus, model="vitl16", b=64, phase="from overrides"):
    if phase == "from overrides":
        phase = "sparse" if "sparsity.sparse_fraction=1" in overrides else "dense"
    rows = []
    for n, ms in step_ms_by_gpus.items():
        rows.append(
            {
                "model": model,
                "per_gpu_batch": b,
                "gpus": n,
                "step_ms": ms,
                "images_per_s": n * b / (ms / 1e3),
                **({"phase": phase} if phase else {}),
            }
        )
    one = next(r["images_per_s"] for r in rows if r["gpus"] == 1)
    for r in rows:
        r["efficiency"] = r["images_per_s"] / (r["gpus"] * one)
    return {
        "gpu": gpu,
        "overrides": ["data.dataset=digits", "sparsity.sparse_fraction=0", *overrides],
        "method": "median step",
        "rows": rows,
        "loss_curves": {"runs": [], "comparisons": []},
    }


@pytest.mark.parametrize(
    ("overrides", "phase"),
    [
        ([], "dense phase"),
        (["sparsity.sparse_fraction=0"], "dense phase"),
        (
            ["sparsity.sparse_fraction=0", "sparsity.sparse_fraction=1"],
            "2:4-sparse phase",
        ),  # the last one wins
        (["sparsity.sparse_fraction=1.0"], "2:4-sparse phase"),
        (["train.seed=3", "sparsity.sparse_fraction=0.7"], "sparse_fraction=0.7"),
    ],
)
def test_configured_phase_reads_the_last_sparse_fraction(overrides, phase):
    assert configured_phase(overrides) == phase


def test_timed_phase_is_what_the_rows_recorded():
    assert (
        timed_phase(a_result("NVIDIA H200", ["sparsity.sparse_fraction=1"], {1: 200.0}))
        == "2:4-sparse phase"
    )
    # rows written before they recorded their phase ran dense whatever was configured
    old = a_result("NVIDIA H200", ["sparsity.sparse_fraction=1"], {1: 200.0, 2: 210.0}, phase=None)
    assert timed_phase(old) == "dense phase"
    mixed = a_result("NVIDIA H200", [], {1: 200.0, 2: 210.0})
    mixed["rows"][1]["phase"] = "sparse"
    assert timed_phase(mixed) == "mixed phases"


def test_rows_side_by_side_with_the_first_result_as_baseline():
    dense = a_result("NVIDIA H200", [], {1: 200.0, 2: 220.0, 4: 225.0})
    sparse = a_result(
        "NVIDIA H200", ["sparsity.sparse_fraction=1"], {1: 190.0, 2: 200.0}
    )  # no 4-GPU row
    summary = compare_phases([dense, sparse])
    assert (
        summary["phases"] == ["dense phase", "2:4-sparse phase"]
        and summary["baseline"] == "dense phase"
    )
    rows = {(r["phase"], r["gpus"]): r for r in summary["rows"]}
    assert sorted(rows) == [
        ("2:4-sparse phase", 1),
        ("2:4-sparse phase", 2),
        ("dense phase", 1),
        ("dense phase", 2),
    ]
    assert rows[("dense phase", 2)]["speedup_vs_first"] == 1.0
    assert rows[("2:4-sparse phase", 1)]["speedup_vs_first"] == pytest.approx(200 / 190)
    assert rows[("2:4-sparse phase", 2)]["speedup_vs_first"] == pytest.approx(220 / 200)
    # 2 x 64 images in 0.2 s against 2 x (64 images in 0.19 s)
    assert rows[("2:4-sparse phase", 2)]["efficiency"] == pytest.approx(
        (128 / 0.2) / (2 * 64 / 0.19)
    )


def test_a_phase_against_itself_under_another_setting_is_labelled_by_that_setting():
    whole = "train.ddp_split_compiled_graphs=false"
    cut = a_result("NVIDIA H200", ["train.seed=0"], {1: 204.0, 2: 220.0})
    uncut = a_result("NVIDIA H200", ["train.seed=0", whole], {1: 204.0, 2: 210.0})
    sparse = a_result(
        "NVIDIA H200", ["train.seed=0", whole, "sparsity.sparse_fraction=1"], {1: 202.0, 2: 208.0}
    )
    assert result_labels([cut, uncut, sparse]) == [
        "dense phase",
        f"dense phase, {whole}",
        f"2:4-sparse phase, {whole}",
    ]
    assert result_labels([cut, sparse]) == ["dense phase", f"2:4-sparse phase, {whole}"]
    summary = compare_phases([cut, uncut])
    assert summary["phases"] == ["dense phase", f"dense phase, {whole}"]
    two = {r["phase"]: r for r in summary["rows"] if r["gpus"] == 2}
    assert two[f"dense phase, {whole}"]["speedup_vs_first"] == pytest.approx(220 / 210)


@pytest.mark.parametrize(
    ("results", "message"),
    [
        (lambda: [a_result("NVIDIA H200", [], {1: 200.0})], "at least two"),
        (
            lambda: [
                a_result("NVIDIA H200", [], {1: 200.0}),
                a_result("NVIDIA H100 80GB HBM3", [], {1: 230.0}),
            ],
            "different GPUs",
        ),
        (
            lambda: [
                a_result("NVIDIA H200", [], {1: 200.0}),
                a_result("NVIDIA H200", [], {1: 90.0}, model="small"),
            ],
            "share no",
        ),
        (
            lambda: [
                a_result("NVIDIA H200", [], {1: 200.0}),
                a_result("NVIDIA H200", [], {1: 201.0}),
            ],
            "same phase with the same settings",
        ),
        (
            lambda: [
                a_result("NVIDIA H200", ["train.seed=1"], {1: 200.0}),
                a_result("NVIDIA H200", ["train.seed=2", "train.seed=1"], {1: 201.0}),
            ],  # the last value wins
            "same phase with the same settings",
        ),
    ],
)
def test_results_that_cannot_be_compared_are_refused(results, message):
    with pytest.raises(ValueError, match=message):
        compare_phases(results())


def test_compare_command_writes_json_and_figure(tmp_path, capsys):
    paths = []
    for name, overrides, times in (
        ("dense", [], {1: 204.5, 2: 220.6, 4: 222.6}),
        ("sparse", ["sparsity.sparse_fraction=1"], {1: 205.4, 2: 223.7, 4: 223.9}),
    ):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(a_result("NVIDIA H200", overrides, times)))
        paths.append(str(path))
    bench_scaling.main(["--compare", *paths, "--out", str(tmp_path / "out")])
    summary = json.loads((tmp_path / "out" / "scaling_phases_h200.json").read_text())
    assert summary["sources"] == paths and len(summary["rows"]) == 6
    assert (tmp_path / "out" / "scaling_phases_h200.png").stat().st_size > 0
    assert "0.986x" in capsys.readouterr().out  # 220.6 / 223.7, the sparse phase on two GPUs


def test_compare_command_refuses_a_missing_or_foreign_file_before_writing(tmp_path):
    good = tmp_path / "dense.json"
    good.write_text(json.dumps(a_result("NVIDIA H200", [], {1: 200.0})))
    foreign = tmp_path / "metrics.json"
    foreign.write_text(json.dumps({"step": 10, "loss": 1.0}))
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match="no such result file"):
        bench_scaling.main(
            ["--compare", str(good), str(tmp_path / "missing.json"), "--out", str(out)]
        )
    with pytest.raises(SystemExit, match="expected JSON files written by this script"):
        bench_scaling.main(["--compare", str(good), str(foreign), "--out", str(out)])
    assert not out.exists()
