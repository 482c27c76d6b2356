"""Rows of the table are configurations, not schedules: runs are seeds of one row iff their
config.yaml are equal apart from train.seed and the keys of how a run executes (configs/load.py
RESUMABLE_CHANGES); every other key that differs, known to the reporting code or not, makes rows of
its own, named in the row's label and a CSV column. Paths in the CSV and JSON are relative to the
folder holding the runs. Expected numbers are worked out in the comments."""

import csv
import dataclasses
import json
import os

import matplotlib.image
import pytest
from reporting_runs import eval_result, make_run
from scipy import stats

from configs.schema import SparsityConfig
from reporting.run_logs import read_run
from reporting.table import build_rows, make_table, schedule_means

TEACHER = "sparsity.teacher"  # dense | sparse: the EMA teacher in the sparse phase
HAS_TEACHER = "teacher" in {f.name for f in dataclasses.fields(SparsityConfig)}


def _csv(out):
    with open(out / "table.csv") as f:
        return list(csv.DictReader(f))


def _teacher(value: str) -> list[str]:
    return [f"{TEACHER}={value}"]


@pytest.fixture
def study(tmp_path):
    """Default arch (vit_tiny): dense seeds 0, 1; 70% with the dense teacher seeds 0, 1 and the
    sparse teacher seeds 0, 1, 2. ViT-S: dense and 70%, seed 0."""
    if not HAS_TEACHER:
        pytest.skip("this checkout's config schema has no sparsity.teacher")
    runs = tmp_path / "runs"
    make_run(runs, "tiny_dense_s0", 0.0, top1=80.0, knn20=70.0)
    make_run(runs, "tiny_dense_s1", 0.0, seed=1, top1=81.0, knn20=71.0)
    make_run(runs, "tiny_70_s0", 0.7, top1=79.0, knn20=69.0)
    make_run(runs, "tiny_70_s1", 0.7, seed=1, top1=79.4, knn20=69.4)
    make_run(runs, "tiny_70_sparse_s0", 0.7, top1=79.5, knn20=69.0, overrides=_teacher("sparse"))
    make_run(
        runs, "tiny_70_sparse_s1", 0.7, seed=1, top1=80.5, knn20=70.0, overrides=_teacher("sparse")
    )
    make_run(
        runs, "tiny_70_sparse_s2", 0.7, seed=2, top1=80.0, knn20=68.0, overrides=_teacher("sparse")
    )
    make_run(
        runs, "small_dense_s0", 0.0, top1=85.0, knn20=75.0, overrides=["student.arch=vit_small"]
    )
    make_run(runs, "small_70_s0", 0.7, top1=84.0, knn20=73.0, overrides=["student.arch=vit_small"])
    return runs


TINY_DENSE = f"dense · student.arch=vit_tiny, {TEACHER}=dense"
SMALL_DENSE = f"dense · student.arch=vit_small, {TEACHER}=dense"
TINY_70 = f"70% sparse · student.arch=vit_tiny, {TEACHER}=dense"
TINY_70_SPARSE = f"70% sparse · student.arch=vit_tiny, {TEACHER}=sparse"
SMALL_70 = f"70% sparse · student.arch=vit_small, {TEACHER}=dense"


def test_rows_are_configurations_and_seeds_the_runs_differing_in_seed(study, tmp_path):
    out = tmp_path / "out"
    make_table([study], out)
    lines = _csv(out)
    runs = {r["run"]: r for r in lines if r["kind"] == "run"}
    assert runs["tiny_70_sparse_s1"]["schedule"] == TINY_70_SPARSE
    assert runs["small_dense_s0"]["schedule"] == SMALL_DENSE
    # one column per differing key, right after the label, in config order (student before sparsity)
    header = list(lines[0])
    assert header[2:5] == ["schedule", "student.arch", TEACHER]
    assert (runs["small_70_s0"]["student.arch"], runs["small_70_s0"][TEACHER]) == (
        "vit_small",
        "dense",
    )
    assert (runs["tiny_70_sparse_s2"]["student.arch"], runs["tiny_70_sparse_s2"][TEACHER]) == (
        "vit_tiny",
        "sparse",
    )

    means = {r["schedule"]: r for r in lines if r["kind"] == "schedule mean"}
    # sorted by schedule, then configuration (vit_small before vit_tiny, dense teacher before
    # sparse)
    assert list(means) == [SMALL_DENSE, TINY_DENSE, SMALL_70, TINY_70, TINY_70_SPARSE]
    assert [means[k]["n_seeds"] for k in means] == ["1", "2", "1", "2", "3"]
    assert means[TINY_70_SPARSE]["seed"] == "0 1 2"
    assert means[TINY_70_SPARSE]["run"] == "tiny_70_sparse_s0, tiny_70_sparse_s1, tiny_70_sparse_s2"
    # tiny dense: (80 + 81) / 2 = 80.5 +- 0.5; tiny 70% dense teacher: (79 + 79.4) / 2 = 79.2 +-
    # 0.2, Δ -1.3
    assert (
        float(means[TINY_DENSE]["top1"]) == pytest.approx(80.5)
        and float(means[TINY_DENSE]["top1_spread"]) == 0.5
    )
    assert float(means[TINY_70]["top1"]) == pytest.approx(79.2)
    assert float(means[TINY_70]["top1_spread"]) == pytest.approx(0.2)
    assert float(means[TINY_70]["delta_top1"]) == pytest.approx(-1.3)
    # sparse teacher: (79.5 + 80.5 + 80) / 3 = 80.0 +- (80.5 - 79.5) / 2 = 0.5; Δ against the tiny
    # dense mean (the teacher key is a sparsity.* key, meaningless without a sparse phase): 80.0 -
    # 80.5 = -0.5; k-NN (69 + 70 + 68) / 3 = 69.0 +- 1.0, Δ 69.0 - 70.5 = -1.5
    assert float(means[TINY_70_SPARSE]["top1"]) == pytest.approx(80.0)
    assert float(means[TINY_70_SPARSE]["top1_spread"]) == pytest.approx(0.5)
    assert float(means[TINY_70_SPARSE]["delta_top1"]) == pytest.approx(-0.5)
    assert float(means[TINY_70_SPARSE]["knn_top1"]) == pytest.approx(69.0)
    assert float(means[TINY_70_SPARSE]["knn_top1_spread"]) == pytest.approx(1.0)
    assert float(means[TINY_70_SPARSE]["delta_knn_top1"]) == pytest.approx(-1.5)
    # ViT-S: against the ViT-S dense run (85), not the ViT-Ti mean; one seed: no spread
    assert (
        float(means[SMALL_70]["delta_top1"]) == pytest.approx(-1.0)
        and means[SMALL_70]["top1_spread"] == ""
    )
    assert float(means[SMALL_DENSE]["top1"]) == 85.0
    # runs: against the dense run of the same configuration and seed; seed 2 has none: seed 0's (80)
    assert float(runs["tiny_70_sparse_s1"]["delta_top1"]) == pytest.approx(80.5 - 81.0)
    assert float(runs["tiny_70_sparse_s2"]["delta_top1"]) == pytest.approx(0.0)
    assert float(runs["small_70_s0"]["delta_top1"]) == pytest.approx(-1.0)

    table = (out / "table.md").read_text()
    # its seeds (0, 1, 2) are not the dense ones (0, 1): Welch's interval of the Δ, checked against
    # scipy's own two-sample test; the mean's by hand: 80.0 +- t(0.975, 2 df) 4.3027 * sd 0.5 / sqrt
    # 3
    welch = stats.ttest_ind([79.5, 80.5, 80.0], [80.0, 81.0], equal_var=False).confidence_interval()
    assert means[TINY_70_SPARSE]["delta_top1_interval"] == "Welch t"
    assert float(means[TINY_70_SPARSE]["delta_top1_low"]) == pytest.approx(welch.low, abs=1e-4)
    assert float(means[TINY_70_SPARSE]["delta_top1_high"]) == pytest.approx(welch.high, abs=1e-4)
    assert (
        f"| {TINY_70_SPARSE} | 0, 1, 2 | 3 | 80.00 ± 0.50 [78.76, 81.24] | -0.50 "
        f"[{welch.low:+.2f}, "
        f"{welch.high:+.2f}] |"
    ) in table
    assert f"| {SMALL_DENSE} | 0 | 1 | 85.00 | +0.00 |" in table
    assert f"These runs differ in student.arch, {TEACHER};" in table
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schedule_means"][-1]["differing_config"] == {
        "student.arch": "vit_tiny",
        TEACHER: "sparse",
    }
    assert summary["schedule_means"][-1]["n_seeds"] == 3
    assert {tuple(r["differing_config"].values()) for r in summary["rows"]} == {
        ("vit_tiny", "dense"),
        ("vit_tiny", "sparse"),
        ("vit_small", "dense"),
    }


def test_a_series_per_configuration_in_the_plots(study, tmp_path):
    out = tmp_path / "out"
    make_table([study], out)
    for name in ("top1_vs_sparsity.png", "loss_curves.png"):
        image = matplotlib.image.imread(out / name)
        assert image.shape[1] >= 1200 and image[..., :3].std() > 0.05
    rows = build_rows([read_run(p) for p in sorted(study.iterdir())])
    from reporting.plots import series

    # the plot's series: the combinations of the non-schedule keys that differ (the teacher split at
    # 70% only)
    assert [label for label, _ in series(rows)] == [
        f"student.arch=vit_small, {TEACHER}=dense",
        f"student.arch=vit_tiny, {TEACHER}=dense",
        f"student.arch=vit_tiny, {TEACHER}=sparse",
    ]


def test_runs_differing_only_in_how_they_execute_are_seeds_of_one_row(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "a", 0.7, top1=79.0, world_size=1)
    make_run(
        runs,
        "b",
        0.7,
        seed=1,
        top1=80.0,
        world_size=1,
        overrides=[
            "train.teacher_export_period=50",
            "train.num_workers=0",
            "train.log_period=7",
            "train.checkpoint_period=11",
            "train.max_to_keep=1",
            "train.compile=false",
            "data.on_corrupt=raise",
            "sparsity.backend=dense",
        ],
    )
    # resumed on 2 processes with half the per-GPU batch: the same global batch of 32
    make_run(
        runs, "c", 0.7, seed=2, top1=81.0, world_size=2, overrides=["train.batch_size_per_gpu=16"]
    )
    out = tmp_path / "out"
    make_table([runs], out, plots=False)
    lines = _csv(out)
    assert [r["schedule"] for r in lines] == [
        "70% sparse"
    ] * 4  # three runs, one mean; labels as before
    mean = lines[-1]
    assert mean["kind"] == "schedule mean" and mean["n_seeds"] == "3" and mean["run"] == "a, b, c"
    assert float(mean["top1"]) == pytest.approx(80.0) and float(
        mean["top1_spread"]
    ) == pytest.approx(1.0)
    assert (
        "student.arch" not in lines[0]
        and "Rows are configurations" not in (out / "table.md").read_text()
    )


def test_another_global_batch_is_another_row(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "a", 0.7, world_size=1)
    make_run(
        runs, "b", 0.7, seed=1, world_size=1, overrides=["train.batch_size_per_gpu=16"]
    )  # 16 images a step
    rows = build_rows([read_run(runs / "a"), read_run(runs / "b")])
    assert [r.schedule for r in rows] == [
        "70% sparse · train.global_batch=16",
        "70% sparse · train.global_batch=32",
    ]


def test_the_same_run_on_two_gpus_is_a_seed_of_its_configuration_named_by_its_layout(tmp_path):
    # dense seed 0 on one process x 32 (top-1 80.0) and again on 2 x 16 (81.0), seed 1 on one
    # process (79.0), and a 70% run on one process: one configuration, whose seed 0 appears twice,
    # so those rows name their layout
    runs = tmp_path / "runs"
    make_run(runs, "dense_s0", 0.0, top1=80.0, world_size=1)
    make_run(
        runs,
        "dense_2x16_s0",
        0.0,
        top1=81.0,
        world_size=2,
        overrides=["train.batch_size_per_gpu=16"],
    )
    make_run(runs, "dense_s1", 0.0, top1=79.0, seed=1, world_size=1)
    make_run(runs, "s70", 0.7, top1=78.0, world_size=1)
    rows = build_rows(
        [read_run(runs / n) for n in ("dense_2x16_s0", "dense_s0", "dense_s1", "s70")]
    )
    by_run = {r.run: r for r in rows}
    assert [r.run for r in rows] == ["dense_s0", "dense_2x16_s0", "dense_s1", "s70"]
    assert {r.schedule for r in rows[:3]} == {
        "0% sparse (dense baseline)"
    }  # no global-batch label: both 32
    assert [r.layout for r in rows] == ["1 process × 32", "2 processes × 16", "1 process × 32", ""]
    # each dense run is its own reference (Δ 0, speed-up 1), not the other run of its seed
    assert by_run["dense_2x16_s0"].delta_top1 == 0.0 and by_run["dense_s0"].delta_top1 == 0.0
    assert by_run["dense_2x16_s0"].speedup == pytest.approx(1.0) and by_run[
        "dense_s0"
    ].speedup == pytest.approx(1.0)
    # the sparse run on one process is compared with its seed's dense run on one process, not the 2
    # x 16 one
    assert by_run["s70"].delta_top1 == pytest.approx(78.0 - 80.0)
    out = tmp_path / "out"
    make_table([runs], out, plots=False)
    md = (out / "table.md").read_text()
    assert (
        "| 0 (2 processes × 16) |" in md and "| 0 (1 process × 32) |" in md and "| 0 |" in md
    )  # s70 unlabelled
    assert {r["run"]: r["layout"] for r in _csv(out) if r["kind"] == "run"}[
        "dense_2x16_s0"
    ] == "2 processes × 16"


def test_a_key_the_reporting_code_does_not_know_makes_its_own_row(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "dense", 0.0, top1=80.0)
    make_run(runs, "s70", 0.7, top1=79.0)
    make_run(runs, "s70_seed1", 0.7, seed=1, top1=79.5)
    make_run(
        runs,
        "s70_koleo0",
        0.7,
        top1=75.0,
        overrides=["dino.koleo_loss_weight=0.0", "optim.min_lr=1e-05"],
    )
    out = tmp_path / "out"
    make_table([runs], out, plots=False)
    lines = _csv(out)
    means = {r["schedule"]: r for r in lines if r["kind"] == "schedule mean"}
    default = "70% sparse · dino.koleo_loss_weight=0.1, optim.min_lr=1e-06"
    # 1e-05 as written, not rounded to 0.0
    other = "70% sparse · dino.koleo_loss_weight=0.0, optim.min_lr=1e-05"
    assert list(means) == [
        "dense · dino.koleo_loss_weight=0.1, optim.min_lr=1e-06",
        other,
        default,
    ]  # by value
    assert means[default]["n_seeds"] == "2" and float(means[default]["top1"]) == pytest.approx(
        79.25
    )
    assert means[other]["n_seeds"] == "1" and float(means[other]["top1"]) == 75.0
    assert means[other]["optim.min_lr"] == "1e-05"
    # no dense run with koleo 0: no Δ, and the notes say so
    assert means[other]["delta_top1"] == ""
    assert (
        f"No complete dense run of the same configuration for {other}"
        in (out / "table.md").read_text()
    )

    # a key that no schema of today has (a config.yaml of a later version, read by that version's
    # reporting)
    read = [read_run(runs / name) for name in ("dense", "s70", "s70_seed1")]
    read[2].config = {**read[2].config, "newsection.new_key": 3}
    rows = build_rows(read)
    assert sorted(r.schedule for r in rows) == [
        "70% sparse · newsection.new_key=3",
        "70% sparse · newsection.new_key=None",
        "dense · newsection.new_key=None",
    ]
    assert [m.n_seeds for m in schedule_means(rows)] == [1, 1, 1]


def test_a_tuning_folder_gives_one_row_per_configuration_not_a_mean(tmp_path):
    """results/cifar10/tuning's shape: dense runs of different architectures and learning rates,
    seed 0 each. They used to be averaged as "seeds" of one dense row; now each is its own row and
    no mean is taken."""
    runs = tmp_path / "tuning"
    make_run(runs, "01_vits_lr4e-3", 0.0, top1=40.9, overrides=["student.arch=vit_small"])
    make_run(
        runs,
        "02_vits_lr1e-3",
        0.0,
        top1=34.2,
        overrides=["student.arch=vit_small", "optim.base_lr=0.001"],
    )
    make_run(runs, "03_vitt_lr1e-3", 0.0, top1=45.0, overrides=["optim.base_lr=0.001"])
    make_run(
        runs,
        "04_vitt_lr1e-3_e20",
        0.0,
        top1=45.6,
        overrides=["optim.base_lr=0.001", "optim.epochs=20"],
    )
    out = tmp_path / "out"
    make_table([runs], out)
    lines = _csv(out)
    assert [r["kind"] for r in lines] == ["run"] * 4  # one seed per configuration: no means section
    assert [r["schedule"] for r in lines] == [
        "dense · student.arch=vit_small, optim.epochs=10, optim.base_lr=0.001",
        "dense · student.arch=vit_small, optim.epochs=10, optim.base_lr=0.004",
        "dense · student.arch=vit_tiny, optim.epochs=10, optim.base_lr=0.001",
        "dense · student.arch=vit_tiny, optim.epochs=20, optim.base_lr=0.001",
    ]
    assert [r["delta_top1"] for r in lines] == ["0.0"] * 4  # each its own dense reference
    means = schedule_means(build_rows([read_run(p) for p in sorted(runs.iterdir())]))
    assert [(m.n_seeds, m.top1) for m in means] == [(1, 34.2), (1, 40.9), (1, 45.0), (1, 45.6)]
    table = (out / "table.md").read_text()
    assert (
        "Per schedule, over seeds" not in table
        and "0% sparse (dense baseline)" not in table.split("## Runs")[0]
    )
    image = matplotlib.image.imread(out / "top1_vs_sparsity.png")
    assert image[..., :3].std() > 0.05


def _no_machine_path(text: str, tmp_path) -> None:
    assert str(tmp_path) not in text and os.path.realpath(tmp_path) not in text


def test_csv_and_json_paths_are_relative_to_the_folder_of_the_runs(tmp_path):
    runs = tmp_path / "runs"
    make_run(
        runs, "sparse_0.00", 0.0, baselines={"eval_linear_random_init.json": eval_result(20.0)}
    )
    make_run(runs, "sparse_0.70", 0.7, seed=1)
    make_run(runs, "sparse_0.80", 0.8, seed=1)
    make_run(
        runs, "sparse_0.80_seed2", 0.8, seed=2
    )  # seeds: a means section, with runs but no paths
    broken = runs / "broken"
    broken.mkdir()
    (broken / "config.yaml").write_text("nosuchsection:\n  key: 1\n")
    (broken / "metrics.jsonl").write_text("")
    out = tmp_path / "out"
    make_table([runs, runs / "sparse_0.90_never_ran"], out, plots=False)
    for name in ("table.csv", "summary.json", "table.md"):
        _no_machine_path((out / name).read_text(), tmp_path)
    paths = {r["run"]: r["path"] for r in _csv(out) if r["kind"] != "schedule mean"}
    assert (
        paths["sparse_0.00"] == "sparse_0.00"
        and paths["sparse_0.90_never_ran"] == "sparse_0.90_never_ran"
    )
    assert paths["random_init (sparse_0.00)"] == os.path.join(
        "sparse_0.00", "eval_linear_random_init.json"
    )
    summary = json.loads((out / "summary.json").read_text())
    assert {r["path"] for r in summary["rows"]} == {
        "sparse_0.00",
        "sparse_0.70",
        "sparse_0.80",
        "sparse_0.80_seed2",
        "broken",
        "sparse_0.90_never_ran",
    }
    assert [r for r in summary["rows"] if r["run"] == "broken"][0]["status"].startswith(
        "unreadable (config.yaml: unknown config key 'nosuchsection'"
    )

    # run directories named one by one (as reproduce.py does), and runs in sub-folders
    make_table(
        sorted(p for p in runs.iterdir() if p.name.startswith("sparse")),
        tmp_path / "one_by_one",
        plots=False,
    )
    assert {r["path"] for r in _csv(tmp_path / "one_by_one")} >= {"sparse_0.00", "sparse_0.70"}
    nested = tmp_path / "nested"
    make_run(nested / "a", "dense", 0.0)
    make_run(nested / "b", "dense", 0.0, seed=1)
    make_table([nested], tmp_path / "out_nested", plots=False)
    assert [r["path"] for r in _csv(tmp_path / "out_nested")] == [
        os.path.join("a", "dense"),
        os.path.join("b", "dense"),
        "",
    ]


def test_a_published_run_without_weights_is_complete_when_its_status_says_finished(tmp_path):
    """Committed results carry no weights: a run trained to the end whose status.json says finished
    (written after the final export) is complete without teacher_backbone.pth; one still 'running'
    at the last step is not."""
    from rundir.status import FINISHED, RUNNING, write_status

    published = make_run(tmp_path, "published", 0.0)
    (published / "teacher_backbone.pth").unlink()
    write_status(published, FINISHED, 300)
    killed = make_run(tmp_path, "killed_in_export", 0.0, seed=1)
    (killed / "teacher_backbone.pth").unlink()
    write_status(killed, RUNNING, 300)
    assert read_run(published).train_status == "complete"
    assert (
        read_run(killed).train_status == "partial"
        and read_run(killed).reason == "no teacher_backbone.pth"
    )


def test_the_teacher_restart_at_the_switch_is_compared_with_the_dense_run_that_cannot_have_it(
    tmp_path,
):
    """teacher.momentum_restart_at_switch is refused without a switch, so no dense run has it true:
    a run with it is compared with the dense run that differs only in it (and sparsity.*), like a
    sparsity.* key."""
    runs = tmp_path / "runs"
    make_run(runs, "dense", 0.0, top1=80.0, knn20=70.0)
    make_run(runs, "s70", 0.7, top1=78.0, knn20=68.5)
    make_run(
        runs,
        "s70_restart",
        0.7,
        top1=79.5,
        knn20=69.0,
        overrides=["teacher.momentum_restart_at_switch=true"],
    )
    out = tmp_path / "out"
    make_table([runs], out, plots=False)
    lines = {r["run"]: r for r in _csv(out) if r["kind"] == "run"}
    assert (
        lines["s70_restart"]["schedule"] == "70% sparse · teacher.momentum_restart_at_switch=true"
    )
    assert lines["dense"]["schedule"] == "dense · teacher.momentum_restart_at_switch=false"
    # 79.5 - 80.0 and 69.0 - 70.0 against the one dense run; 78.0 - 80.0 for the run without the
    # restart
    assert float(lines["s70_restart"]["delta_top1"]) == pytest.approx(-0.5)
    assert float(lines["s70_restart"]["delta_knn_top1"]) == pytest.approx(-1.0)
    assert float(lines["s70"]["delta_top1"]) == pytest.approx(-2.0)
    assert "No complete dense run of the same configuration" not in (out / "table.md").read_text()


def test_the_100_percent_run_ends_the_series_that_restart_the_teacher_at_the_switch(tmp_path):
    """A recipe swept over every fraction: its runs with a switch restart the teacher, its 100% runs
    cannot (no switch), so their configs differ in that key alone. The figure draws the 100% runs at
    the end of the restart series instead of as a series of their own; beside a series of the same
    runs without the restart, they end both."""
    from reporting.plots import series

    runs = tmp_path / "runs"
    decay, restart = "sparsity.pruned_decay=0.005", "teacher.momentum_restart_at_switch=true"
    make_run(runs, "dense", 0.0, top1=80.0)
    make_run(runs, "r70", 0.7, top1=79.5, overrides=[decay, restart])
    make_run(runs, "r80", 0.8, top1=79.0, overrides=[decay, restart])
    make_run(runs, "s100_s0", 1.0, top1=78.0, overrides=[decay])
    make_run(runs, "s100_s1", 1.0, seed=1, top1=78.4, overrides=[decay])
    rows = build_rows([read_run(p) for p in sorted(runs.iterdir())])
    drawn = {label: sorted(r.run for r in rs) for label, rs in series(rows)}
    # keys in config order
    recipe = "teacher.momentum_restart_at_switch=true, sparsity.pruned_decay=0.005"
    assert drawn == {
        "teacher.momentum_restart_at_switch=false, sparsity.pruned_decay=0.0": ["dense"],
        recipe: ["r70", "r80", "s100_s0", "s100_s1"],
    }

    make_run(
        runs, "d70", 0.7, top1=79.0, overrides=[decay]
    )  # the decay alone at 70%: its own series, with 100%
    rows = build_rows([read_run(p) for p in sorted(runs.iterdir())])
    drawn = {label: sorted(r.run for r in rs) for label, rs in series(rows)}
    assert drawn[recipe] == ["r70", "r80", "s100_s0", "s100_s1"]
    assert drawn["teacher.momentum_restart_at_switch=false, sparsity.pruned_decay=0.005"] == [
        "d70",
        "s100_s0",
        "s100_s1",
    ]
    # the table's rows are unchanged: the 100% runs are their own configuration there, with their
    # own Δ
    assert {r.schedule for r in rows if r.run.startswith("s100")} == {
        "100% sparse · teacher.momentum_restart_at_switch=false, sparsity.pruned_decay=0.005"
    }
    from reporting.plots import accuracy_figure

    _, _, caption = accuracy_figure(rows)
    assert "A 100% run has no switch: it also ends the series" in caption


def test_the_dense_control_of_the_restart_is_a_configuration_of_its_own_not_the_sparse_runs_reference(
    tmp_path,
):
    """teacher.momentum_restart_fraction acts in a dense run too, so a dense run with it is the
    control of the restart, its own reference (Δ 0), and never the reference of the sparse runs that
    lack it."""
    runs = tmp_path / "runs"
    make_run(runs, "dense", 0.0, top1=80.0, knn20=70.0)
    make_run(
        runs,
        "dense_restart40",
        0.0,
        top1=80.6,
        knn20=70.2,
        overrides=["teacher.momentum_restart_fraction=0.4"],
    )
    make_run(
        runs,
        "s40_restart",
        0.4,
        top1=80.3,
        knn20=70.1,
        overrides=["teacher.momentum_restart_at_switch=true"],
    )
    out = tmp_path / "out"
    make_table([runs], out, plots=False)
    lines = {r["run"]: r for r in _csv(out) if r["kind"] == "run"}
    assert "teacher.momentum_restart_fraction=0.4" in lines["dense_restart40"]["schedule"]
    assert float(lines["dense_restart40"]["delta_top1"]) == pytest.approx(0.0)
    assert float(lines["s40_restart"]["delta_top1"]) == pytest.approx(
        0.3
    )  # against "dense", not the control
