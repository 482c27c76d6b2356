"""How the table reads the recipe study's keys. A run whose teacher momentum restarts at its switch
gets a second Δ: against the dense run whose momentum restarts at the same fraction of the steps
(teacher.momentum_restart_fraction), whose teacher follows the same schedule step for step. A dense
warm-up (sparsity.dense_warmup_fraction) is dense time and is named in the steps column. Expected
numbers are worked out in the comments."""

import csv

import pytest
from reporting_runs import make_run

from reporting.plots import accuracy_figure
from reporting.run_logs import read_run
from reporting.table import build_rows, make_table, schedule_means

AT_SWITCH = ["teacher.momentum_restart_at_switch=true"]


def _csv(out):
    with open(out / "table.csv") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def study(tmp_path):
    """Dense seeds 0, 1 (dinov2's schedule); the dense control restarted at 0.4, seed 0 only; 40%
    restarted at its switch, seeds 0 and 1; 70% restarted at its switch (no control at 0.7); 40%
    without a restart."""
    runs = tmp_path / "runs"
    make_run(runs, "dense_s0", 0.0, top1=80.0, knn20=70.0)
    make_run(runs, "dense_s1", 0.0, seed=1, top1=81.0, knn20=71.0)
    make_run(
        runs,
        "dense_restart40_s0",
        0.0,
        top1=82.0,
        knn20=72.5,
        overrides=["teacher.momentum_restart_fraction=0.4"],
    )
    make_run(runs, "s40_restart_s0", 0.4, top1=81.0, knn20=71.0, overrides=AT_SWITCH)
    make_run(runs, "s40_restart_s1", 0.4, seed=1, top1=80.0, knn20=70.5, overrides=AT_SWITCH)
    make_run(runs, "s70_restart_s0", 0.7, top1=79.0, knn20=69.0, overrides=AT_SWITCH)
    make_run(runs, "s40_s0", 0.4, top1=79.5, knn20=69.5)
    return runs


def _rows(runs):
    return {r.run: r for r in build_rows([read_run(p) for p in sorted(runs.iterdir())])}


def test_each_run_is_compared_with_the_dense_run_of_its_teacher_schedule(study):
    rows = _rows(study)
    s0, s1 = rows["s40_restart_s0"], rows["s40_restart_s1"]
    # the usual Δ stays against dinov2's schedule of the same seed: 81 - 80, 80 - 81
    assert s0.delta_top1 == pytest.approx(1.0) and s1.delta_top1 == pytest.approx(-1.0)
    # against the control: seed 0's own (81 - 82, 71 - 72.5); seed 1 has none, so the lowest seed's
    # (80 - 82)
    assert s0.delta_top1_same_teacher == pytest.approx(-1.0)
    assert s0.delta_knn_top1_same_teacher == pytest.approx(-1.5)
    assert s1.delta_top1_same_teacher == pytest.approx(-2.0)
    assert s1.delta_knn_top1_same_teacher == pytest.approx(-2.0)
    # no control restarted at 0.7; no restart at the switch; dense runs are not compared this way
    for name in ("s70_restart_s0", "s40_s0", "dense_s0", "dense_restart40_s0"):
        assert rows[name].delta_top1_same_teacher is None, name
    # the control itself is a configuration of its own
    assert rows["dense_restart40_s0"].delta_top1 == pytest.approx(0.0)


def test_the_schedule_means_take_the_controls_mean(study):
    rows = build_rows([read_run(p) for p in sorted(study.iterdir())])
    means = {(m.sparse_fraction, m.schedule): m for m in schedule_means(rows)}
    restart40 = next(
        m for (f, label), m in means.items() if f == 0.4 and "restart_at_switch=true" in label
    )
    # mean(81, 80) - 82 and mean(71, 70.5) - 72.5
    assert restart40.delta_top1_same_teacher == pytest.approx(-1.5)
    assert restart40.delta_knn_top1_same_teacher == pytest.approx(-1.75)
    # against the dense seeds' mean: 80.5 - mean(80, 81)
    assert restart40.delta_top1 == pytest.approx(0.0)
    others = [m for m in means.values() if m is not restart40]
    assert all(m.delta_top1_same_teacher is None for m in others)


def test_table_and_figure_show_it_only_where_a_control_is_there(study, tmp_path):
    out = tmp_path / "out"
    make_table([study], out, plots=False)
    text = (out / "table.md").read_text()
    assert "Δ top-1 vs dense with the same teacher momentum (pp)" in text
    assert "Δ vs dense with the same teacher momentum: against the dense run" in text
    lines = {r["run"]: r for r in _csv(out) if r["kind"] == "run"}
    assert float(lines["s40_restart_s1"]["delta_top1_same_teacher"]) == pytest.approx(-2.0)
    assert lines["s70_restart_s0"]["delta_top1_same_teacher"] == ""
    rows = build_rows([read_run(p) for p in sorted(study.iterdir())])
    _, handles, caption = accuracy_figure(rows)
    assert "Dotted, hollow" in caption
    assert any("teacher momentum restarts at the same step" in h.get_label() for h in handles)

    # without the control: no column, no note, nothing dotted
    without = tmp_path / "without"
    without.mkdir()
    for run in study.iterdir():
        if run.name != "dense_restart40_s0":
            run.rename(without / run.name)
    out2 = tmp_path / "out2"
    make_table([without], out2, plots=False)
    assert "same teacher momentum" not in (out2 / "table.md").read_text()
    assert all(r["delta_top1_same_teacher"] == "" for r in _csv(out2))
    rows = build_rows([read_run(p) for p in sorted(without.iterdir())])
    assert "Dotted, hollow" not in accuracy_figure(rows)[2]


def test_a_dense_warm_up_is_dense_time_and_named_in_the_steps_column(tmp_path):
    """300 steps, switch at 150, warm-up 0.1 = 30 dense steps first; sparse windows at 64 images/s,
    dense at 32, batch 32, a metrics line every 30 steps. Windows of steps 0-29 dense: 30 s; 30-149
    sparse: 4 x 15 s = 60 s; 150-299 dense: 5 x 30 s = 150 s. Counting the warm-up as sparse (its
    steps come before the switch) would give 90 s."""
    runs = tmp_path / "runs"
    make_run(runs, "warm", 0.5, log_period=30, overrides=["sparsity.dense_warmup_fraction=0.1"])
    run = read_run(runs / "warm")
    assert (run.dense_warmup_steps, run.sparse_steps, run.total_steps) == (30, 150, 300)
    assert run.sparse_time_s == pytest.approx(60.0)
    assert run.dense_time_s == pytest.approx(180.0)
    out = tmp_path / "out"
    make_table([runs], out, plots=False)
    assert "| 30 dense, then 120 → 150 |" in (out / "table.md").read_text()


def test_a_learning_rate_restart_at_the_switch_is_the_restart_at_the_switchs_fraction(tmp_path):
    """optim.lr_restart_at_switch=true in a 70% run restarts the cosine at round(0.7 x steps), as
    optim.lr_restart_fraction=0.7 does in any run: the two spellings are seeds of one configuration,
    and their dense reference is the dense run restarted at 0.7, not the one without a restart."""
    runs = tmp_path / "runs"
    at_70 = ["optim.lr_restart_fraction=0.7"]
    at_switch = ["optim.lr_restart_at_switch=true"]
    make_run(runs, "dense_s0", 0.0, top1=78.0)
    make_run(runs, "dense_lr70_s0", 0.0, top1=80.0, overrides=at_70)
    make_run(runs, "dense_lr70_s1", 0.0, seed=1, top1=81.0, overrides=at_70)
    make_run(runs, "s70_at_switch_s0", 0.7, top1=79.0, overrides=at_switch)
    make_run(runs, "s70_fraction_s1", 0.7, seed=1, top1=77.0, overrides=at_70)
    # restarted at its own switch, 0.4: no dense run restarts there
    make_run(runs, "s40_at_switch_s0", 0.4, top1=76.0, overrides=at_switch)
    rows = _rows(runs)
    # 79 - 80 (against the unrestarted dense it would be 79 - 78 = +1); 77 - 81
    assert rows["s70_at_switch_s0"].delta_top1 == pytest.approx(-1.0)
    assert rows["s70_fraction_s1"].delta_top1 == pytest.approx(-4.0)
    assert rows["s40_at_switch_s0"].delta_top1 is None
    means = schedule_means(build_rows([read_run(p) for p in sorted(runs.iterdir())]))
    seventy = [m for m in means if m.sparse_fraction == 0.7]
    assert len(seventy) == 1 and seventy[0].seeds == [0, 1]
    # 78 - 80.5, the same as the mean of the pairs by seed, (-1 - 4) / 2
    assert seventy[0].delta_top1 == pytest.approx(-2.5)
