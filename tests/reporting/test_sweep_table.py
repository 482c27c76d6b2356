"""The table of a seeded sweep with baselines (the CIFAR-10 layout): per-schedule means and spreads
over seeds, the baseline rows, per-phase images/s, the plots, and the one-way imports of the
reporting modules. Every expected number is worked out by hand in the comments."""

import ast
import csv
import importlib.util
import json
from pathlib import Path

import matplotlib.image
import pytest
from reporting_runs import LOG_TIME, REPO, eval_result, make_run

from reporting import published
from reporting.run_logs import read_run
from reporting.table import make_table

RANDOM, PIXELS = "eval_linear_random_init.json", "eval_linear_pixels.json"


def _csv(out):
    with open(out / "table.csv") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def seeded(tmp_path):
    """0% and 70% with seeds 0 and 1, 100% with seed 0; baselines in three places."""
    runs = tmp_path / "runs"
    make_run(
        runs, "sparse_0.00", 0.0, top1=80.0, knn20=70.0, baselines={RANDOM: eval_result(30.0, 25.0)}
    )
    make_run(
        runs,
        "sparse_0.00_seed1",
        0.0,
        seed=1,
        top1=81.0,
        knn20=70.6,
        baselines={RANDOM: eval_result(99.0)},
    )  # the seed-0 dense run's random init wins over this one
    make_run(runs, "sparse_0.70", 0.7, top1=79.0, knn20=69.0, baselines={RANDOM: eval_result(98.0)})
    make_run(
        runs,
        "sparse_0.70_seed1",
        0.7,
        seed=1,
        top1=79.4,
        knn20=70.0,
        baselines={PIXELS: eval_result(40.0, 33.0)},
    )  # the only raw-pixel result: taken from here
    make_run(runs, "sparse_1.00", 1.0, top1=78.0, knn20=68.0)
    return runs


def test_two_seeds_give_mean_spread_and_paired_deltas(seeded, tmp_path):
    out = tmp_path / "out"
    make_table([seeded], out, plots=False)
    lines = _csv(out)
    runs = {r["run"]: r for r in lines if r["kind"] == "run"}
    assert runs["sparse_0.70_seed1"]["seed"] == "1" and runs["sparse_0.70"]["seed"] == "0"
    # each run against the dense run of its own seed: 79.4 - 81.0 and 79.0 - 80.0; seed 0's dense
    # for 100%
    assert float(runs["sparse_0.70_seed1"]["delta_top1"]) == pytest.approx(-1.6)
    assert float(runs["sparse_0.70"]["delta_top1"]) == pytest.approx(-1.0)
    assert float(runs["sparse_1.00"]["delta_top1"]) == pytest.approx(-2.0)
    assert (
        float(runs["sparse_0.70_seed1"]["knn_top1"]) == pytest.approx(70.0)
        and runs["sparse_0.70"]["knn_k"] == "20"
    )

    means = {r["sparse_fraction"]: r for r in lines if r["kind"] == "schedule mean"}
    assert means["0.0"]["seed"] == "0 1" and means["0.0"]["run"] == "sparse_0.00, sparse_0.00_seed1"
    # 0%: (80 + 81) / 2 = 80.5, half range (81 - 80) / 2 = 0.5; k-NN (70 + 70.6) / 2 = 70.3 +- 0.3
    assert (
        float(means["0.0"]["top1"]) == pytest.approx(80.5)
        and float(means["0.0"]["top1_spread"]) == 0.5
    )
    assert float(means["0.0"]["knn_top1"]) == pytest.approx(70.3)
    assert float(means["0.0"]["knn_top1_spread"]) == pytest.approx(0.3)
    # 70%: (79 + 79.4) / 2 = 79.2 +- 0.2, Δ 79.2 - 80.5 = -1.3; k-NN (69 + 70) / 2 = 69.5 +- 0.5, Δ
    # 69.5 - 70.3 = -0.8
    assert (
        float(means["0.7"]["top1"]) == pytest.approx(79.2)
        and float(means["0.7"]["top1_spread"]) == 0.2
    )
    assert float(means["0.7"]["delta_top1"]) == pytest.approx(-1.3)
    assert float(means["0.7"]["knn_top1_spread"]) == pytest.approx(0.5)
    assert float(means["0.7"]["delta_knn_top1"]) == pytest.approx(-0.8)
    # 100%: one seed, no spread; Δ 78 - 80.5
    assert means["1.0"]["top1_spread"] == "" and float(means["1.0"]["delta_top1"]) == pytest.approx(
        -2.5
    )

    table = (out / "table.md").read_text()
    assert "## Per schedule, over seeds (mean ± half the range [95% interval])" in table
    # 95% intervals by hand, t(0.975, 1 df) = 12.7062: dense 80.5 +- 12.7062 * 0.5 (the sd 0.7071
    # over sqrt 2); k-NN 70.3 +- 12.7062 * 0.3; 70% 79.2 +- 12.7062 * 0.2, k-NN 69.5 +- 12.7062 *
    # 0.5; the Δ paired seed by seed (both ran seeds 0 and 1): differences -1.0, -1.6, mean -1.3 +-
    # 12.7062 * 0.3; k-NN -1.0, -0.6: -0.8 +- 12.7062 * 0.2
    assert (
        "| 0% sparse (dense baseline) | 0, 1 | 2 | 80.50 ± 0.50 [74.15, 86.85] | +0.00 | "
        "70.30 ± 0.30 [66.49, 74.11] | +0.00 |"
    ) in table
    assert (
        "| 70% sparse | 0, 1 | 2 | 79.20 ± 0.20 [76.66, 81.74] | -1.30 [-5.11, +2.51] | "
        "69.50 ± 0.50 [63.15, 75.85] | -0.80 [-3.34, +1.74] |"
    ) in table
    assert (
        "| 100% sparse (2:4-sparse model) | 0 | 1 | 78.00 | -2.50 | 68.00 | -2.30 |" in table
    )  # one seed: none
    assert float(means["0.7"]["delta_top1_low"]) == pytest.approx(-1.3 - 12.7062 * 0.3, abs=1e-3)
    assert (
        means["0.7"]["delta_top1_interval"] == "paired t" and means["1.0"]["delta_top1_low"] == ""
    )
    # one rule for noise: a Δ whose interval holds 0 is within seed noise, and none here leaves it
    assert (
        "Seed noise: ± is half the range over seeds" in table
        and "A Δ whose interval holds 0" in table
    )
    assert "No Δ here is outside seed noise." in table and "seeds differ by up to" not in table
    assert "one seed per schedule" not in table
    summary = json.loads((out / "summary.json").read_text())
    assert [m["seeds"] for m in summary["schedule_means"]] == [[0, 1], [0, 1], [0]]
    assert [m["n_seeds"] for m in summary["schedule_means"]] == [2, 2, 1]
    assert [m["n_seeds"] for m in lines if m["kind"] == "schedule mean"] == ["2", "2", "1"]


def test_a_delta_outside_seed_noise_is_named_in_the_notes(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "dense_s0", 0.0, top1=80.0, knn20=70.0)
    make_run(runs, "dense_s1", 0.0, seed=1, top1=81.0, knn20=71.0)
    make_run(runs, "sparse70_s0", 0.7, top1=78.0, knn20=69.0)
    make_run(runs, "sparse70_s1", 0.7, seed=1, top1=79.1, knn20=71.5)
    make_table([runs], tmp_path / "out", plots=False)
    table = (tmp_path / "out" / "table.md").read_text()
    # linear, paired: -2.0 and -1.9, mean -1.95 +- 12.7062 * 0.05 = +- 0.635: resolved; k-NN -1.0
    # and +0.5: not
    assert "Outside seed noise: 70% sparse linear -1.95 [-2.59, -1.31]." in table
    assert "k-NN -0.25" not in table.split("Outside seed noise:")[1]


def test_baseline_rows_come_from_the_dense_seed0_run_first(seeded, tmp_path):
    out = tmp_path / "out"
    make_table([seeded], out, plots=False)
    baselines = {r["schedule"]: r for r in _csv(out) if r["kind"] == "baseline"}
    assert set(baselines) == {"random-init network", "raw pixels (logistic regression)"}
    random_init = baselines["random-init network"]
    assert float(random_init["top1"]) == 30.0 and float(random_init["knn_top1"]) == 25.0
    assert (
        random_init["run"] == "random_init (sparse_0.00)" and random_init["knn_top1_k200"] == "23.0"
    )
    assert float(baselines["raw pixels (logistic regression)"]["top1"]) == 40.0
    assert baselines["raw pixels (logistic regression)"]["run"] == "pixels (sparse_0.70_seed1)"
    table = (out / "table.md").read_text()
    assert "| *random-init network* | – | – | 30.0 | – | 25.0 |" in table
    assert "| *raw pixels (logistic regression)* | – | – | 40.0 | – | 33.0 |" in table
    assert "baseline, evaluated in sparse_0.70_seed1" in table
    summary = json.loads((out / "summary.json").read_text())
    assert [b["key"] for b in summary["baselines"]] == ["random_init", "pixels"]


def test_no_baselines_no_seeds_no_extra_sections(tmp_path):
    make_run(tmp_path / "runs", "sparse_0.00", 0.0)
    out = tmp_path / "out"
    make_table([tmp_path / "runs"], out, plots=False)
    assert [r["kind"] for r in _csv(out)] == ["run"]
    table = (out / "table.md").read_text()
    assert (
        "Per schedule, over seeds" not in table
        and "random-init" not in table
        and "raw pixels" not in table
    )
    assert "one seed per schedule" in table


def _metrics(run_dir: Path, records: list[tuple], with_phase: bool = True) -> None:
    lines = []
    for step, phase, rate in records:
        record = {
            "step": step,
            "loss": 9.0,
            "images_per_s": rate,
            "gpu_mem_outside_mb": 900.0,
        }  # GPU to itself
        if with_phase:
            record["phase"] = phase
        lines.append(json.dumps(record))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("with_phase", [True, False])
def test_images_per_s_per_phase_is_the_median_without_warm_up_windows(tmp_path, with_phase):
    # 50% of the default's 300 steps: steps 0-149 sparse, 150-299 dense; one line every 10 steps
    run_dir = make_run(tmp_path, "r", 0.5, steps_done=0, finished=False, result=None)
    _metrics(
        run_dir,
        [
            (9, "sparse", 5.0),  # first sparse window: compilation, left out
            (19, "sparse", 100.0),
            (29, "sparse", 110.0),
            (39, "sparse", 90.0),
            (49, "sparse", 300.0),
            (159, "dense", 7.0),  # first dense window (the switch recompiles): left out
            (169, "dense", 200.0),
            (179, "dense", 220.0),
            (189, "dense", 180.0),
            (199, "dense", 3.0),  # the first window after the resume at step 190: left out
            (209, "dense", 210.0),
            (219, "dense", "nan"),  # a rate that is not a number: skipped
        ],
        with_phase,
    )
    with open(run_dir / "log.txt", "a") as log:
        log.write(f"{LOG_TIME} INFO training.trainer: resumed at step 190 (dense phase)\n")
    run = read_run(run_dir)
    assert run.sparse_images_per_s == pytest.approx(
        105.0
    )  # median of 100, 110, 90, 300: (100 + 110) / 2
    assert run.dense_images_per_s == pytest.approx(
        205.0
    )  # median of 200, 220, 180, 210: (200 + 210) / 2
    out = tmp_path / "out"
    make_table([run_dir], out, plots=False)
    row = _csv(out)[0]
    assert float(row["sparse_images_per_s"]) == 105.0 and float(row["dense_images_per_s"]) == 205.0
    assert "| 105 | 205 |" in (out / "table.md").read_text()  # images/s from 100 on: whole numbers


def test_a_phase_with_one_window_has_no_steady_speed(tmp_path):
    run_dir = make_run(tmp_path, "r", 1.0, steps_done=0, finished=False, result=None)
    _metrics(run_dir, [(9, "sparse", 5.0)])
    run = read_run(run_dir)
    assert run.sparse_images_per_s is None and run.dense_images_per_s is None


def test_loss_terms_are_read(tmp_path):
    run = read_run(make_run(tmp_path, "r", 0.4, result=None))
    assert list(run.loss_terms) == [
        "loss",
        "dino_local_crops_loss",
        "dino_global_crops_loss",
        "koleo_loss",
        "ibot_loss",
    ]
    # curves are indexed by steps done (the fake log is in the older from-0 format: its last line,
    # "step": 299, is the 300th step)
    assert run.loss_terms["ibot_loss"][-1] == (300, pytest.approx(0.2 * 8.0))
    assert run.loss_curve == run.loss_terms["loss"] and run.final_loss == pytest.approx(8.0)


def _drawn(path, min_width):
    assert path.is_file() and path.stat().st_size > 10_000
    image = matplotlib.image.imread(path)
    assert image.shape[1] >= min_width and image[..., :3].std() > 0.05


def test_sweep_plots_are_written(seeded, tmp_path):
    for fraction in (0.4, 0.6, 0.8, 0.9):
        make_run(seeded, f"sparse_{fraction:.2f}", fraction, top1=80.0 - 2 * fraction)
    out = tmp_path / "out"
    written = make_table([seeded], out)
    assert [p.name for p in written[3:]] == ["top1_vs_sparsity.png", "loss_curves.png"]
    _drawn(out / "top1_vs_sparsity.png", 1200)  # this study, then the published panel
    _drawn(out / "loss_curves.png", 1200)  # five loss terms: a 2 x 3 grid


def test_make_table_cli_on_a_missing_directory(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location(
        "make_table_script", REPO / "scripts" / "make_table.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    missing = tmp_path / "runs" / "cifar10_typo"
    assert script.main([str(missing), "--no-plots", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"error: {missing}: no such run directory" in err and "--allow-missing" in err
    assert not (tmp_path / "out").exists()
    assert (
        script.main([str(missing), "--allow-missing", "--no-plots", "--out", str(tmp_path / "out")])
        == 0
    )
    assert "missing (no run directory)" in (tmp_path / "out" / "table.md").read_text()


def test_reporting_imports_point_one_way():
    """table -> table_format, plots -> published, run_logs; nothing imports table back (no
    cycle)."""
    folder = REPO / "reporting"
    for name in ("plots", "loss_plots", "figures", "table_format", "published", "run_logs"):
        tree = ast.parse((folder / f"{name}.py").read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert "table" not in imported and "reporting.table" not in imported, name


def test_published_numbers_match_the_reference_copy():
    reference = REPO.parent / "shared" / "reference" / "torchao_dinov2_vitl_accuracy.csv"
    if not reference.is_file():
        pytest.skip(f"{reference} not present")
    with open(reference) as f:
        rows = list(csv.DictReader(f))
    assert [
        (float(r["sparse_fraction"]), int(r["sparse_steps"]), float(r["imagenet1k_top1"]))
        for r in rows
    ] == [(p.fraction, p.sparse_steps, p.top1) for p in published.ROWS]
    assert {int(r["total_steps"]) for r in rows} == {published.TOTAL_STEPS}
