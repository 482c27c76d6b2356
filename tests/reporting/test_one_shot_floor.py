"""The one-shot 2:4 floor (reporting/floor.py): the dense runs' final teachers probed with their MLPs
pruned 2:4 (eval_linear_pruned_mlp.json), per dense configuration, against the same runs unpruned,
paired by seed. Expected numbers are worked out in the comments."""

import json

import pytest
from reporting_runs import eval_result, make_run

from reporting.run_logs import read_run
from reporting.table import build_rows, make_table
from reporting.table_format import FLOOR_TITLE

PRUNED = "eval_linear_pruned_mlp.json"


def _dense(runs, name, seed, top1, knn20, pruned: tuple | None, **kw):
    files = {PRUNED: eval_result(*pruned)} if pruned else {}
    return make_run(runs, name, 0.0, seed=seed, top1=top1, knn20=knn20, baselines=files, **kw)


@pytest.fixture
def study(tmp_path):
    """Dense seeds 0-2 (seed 2 without the pruned probe), a 100% run, and a 70% run that has a
    pruned probe of its own (a sparse run's is not a floor)."""
    runs = tmp_path / "runs"
    _dense(runs, "dense_s0", 0, 80.0, 70.0, (78.5, 67.0))
    _dense(runs, "dense_s1", 1, 81.0, 71.0, (79.0, 68.5))
    _dense(runs, "dense_s2", 2, 82.0, 72.0, None)
    make_run(runs, "s100_s0", 1.0, top1=77.0, knn20=66.0)
    make_run(runs, "s70_s0", 0.7, top1=79.0, baselines={PRUNED: eval_result(10.0)})
    return runs


def test_each_dense_configuration_gets_its_floor_over_the_seeds_with_the_probe(study):
    from reporting.floor import floor_means

    rows = build_rows([read_run(p) for p in sorted(study.iterdir())])
    by_run = {r.run: r for r in rows}
    assert (by_run["dense_s0"].pruned_top1, by_run["dense_s0"].pruned_knn_top1) == (78.5, 67.0)
    assert by_run["dense_s2"].pruned_top1 is None
    assert by_run["s70_s0"].pruned_top1 is None and by_run["s100_s0"].pruned_top1 is None
    [floor] = floor_means(rows)
    assert floor.seeds == [0, 1] and floor.runs == ["dense_s0", "dense_s1"]
    # over seeds 0 and 1 only, pruned and unpruned alike: (80 + 81) / 2, (78.5 + 79) / 2
    assert floor.dense_top1 == pytest.approx(80.5) and floor.top1 == pytest.approx(78.75)
    # seed by seed -1.5 and -2.0; k-NN -3.0 and -2.5
    assert floor.delta_top1 == pytest.approx(-1.75)
    assert floor.delta_knn_top1 == pytest.approx(-2.75)
    # paired t, one degree of freedom: sd of (-1.5, -2.0) = 0.3536, se 0.25, t 12.706: ±3.18
    assert floor.delta_top1_interval.method == "paired t"
    assert (floor.delta_top1_interval.low, floor.delta_top1_interval.high) == pytest.approx(
        (-4.9266, 1.4266), abs=1e-3
    )


def test_the_table_shows_it_after_the_means_and_writes_it_to_csv_and_summary(study, tmp_path):
    out = tmp_path / "out"
    make_table([study], out, plots=False)
    text = (out / "table.md").read_text()
    section = text[text.index(FLOOR_TITLE) :]
    assert text.index("## Per schedule") < text.index(FLOOR_TITLE) < text.index("## Runs")
    line = section.splitlines()[4]  # title, blank line, header, rule, then the one configuration
    cells = [c.strip() for c in line.strip("|").split("|")]
    # pruned: (78.5 + 79) / 2, t interval ±3.18 as the Δ's (the same spread)
    assert cells == [
        "0% sparse (dense baseline)",
        "0, 1",
        "80.50",
        "78.75 [75.57, 81.93]",
        "-1.75 [-4.93, +1.43]",
        "67.75 [58.22, 77.28]",
        "-2.75 [-5.93, +0.43]",
    ]
    summary = json.loads((out / "summary.json").read_text())
    [floor] = summary["one_shot_floor"]
    assert floor["top1"] == pytest.approx(78.75) and floor["delta_knn_top1"] == pytest.approx(-2.75)
    csv_lines = (out / "table.csv").read_text().splitlines()
    assert sum(line.startswith("one-shot floor,") for line in csv_lines) == 1


def test_no_dense_run_with_the_probe_no_floor(tmp_path):
    runs = tmp_path / "runs"
    _dense(runs, "dense_s0", 0, 80.0, 70.0, None)
    make_run(runs, "s100_s0", 1.0, top1=77.0, baselines={PRUNED: eval_result(10.0)})
    out = tmp_path / "out"
    make_table([runs], out, plots=False)
    assert FLOOR_TITLE not in (out / "table.md").read_text()
    assert json.loads((out / "summary.json").read_text())["one_shot_floor"] == []


def test_an_unreadable_or_stale_probe_is_no_floor(tmp_path):
    """A pruned record that does not parse, or that evaluated an earlier teacher than the digest
    beside the run's teacher, is left out as the run's own evaluation would be."""
    runs = tmp_path / "runs"
    broken = _dense(runs, "dense_s0", 0, 80.0, 70.0, None)
    (broken / PRUNED).write_text("{ not json")
    stale = _dense(runs, "dense_s1", 1, 81.0, 71.0, None)
    (stale / PRUNED).write_text(json.dumps(eval_result(60.0) | {"checkpoint_sha256": "a" * 64}))
    (stale / "teacher_backbone.pth.sha256").write_text(f"{'b' * 64}  teacher_backbone.pth\n")
    rows = build_rows([read_run(p) for p in sorted(runs.iterdir())])
    assert [r.pruned_top1 for r in rows] == [None, None]


def test_a_knn_only_probe_gives_the_knn_columns(tmp_path):
    """Runs probed pruned with k-NN alone (eval_knn_pruned_mlp.json, as older studies did): the
    floor has k-NN, and no linear numbers rather than wrong ones; a linear record, where there is
    one, is preferred."""
    from reporting.floor import floor_means

    runs = tmp_path / "runs"
    knn_only = {"top1": None, "knn": {"20": {"top1": 66.0, "top5": 99.0}}, "n_val": 360}
    make_run(runs, "dense_s0", 0.0, top1=80.0, knn20=68.0)
    (runs / "dense_s0" / "eval_knn_pruned_mlp.json").write_text(json.dumps(knn_only))
    make_run(runs, "dense_s1", 0.0, seed=1, top1=81.0, knn20=69.0)
    (runs / "dense_s1" / "eval_knn_pruned_mlp.json").write_text(
        json.dumps(knn_only | {"knn": {"20": {"top1": 68.0, "top5": 99.0}}})
    )
    rows = build_rows([read_run(p) for p in sorted(runs.iterdir())])
    [floor] = floor_means(rows)
    assert floor.top1 is None and floor.delta_top1 is None and floor.dense_top1 is None
    # 66 - 68 and 68 - 69
    assert floor.knn_top1 == pytest.approx(67.0)
    assert floor.delta_knn_top1 == pytest.approx(-1.5)
    out = tmp_path / "out"
    make_table([runs], out, plots=False)
    row = (out / "table.md").read_text().split(FLOOR_TITLE)[1].splitlines()[4]
    assert [c.strip() for c in row.strip("|").split("|")][2:5] == ["–", "–", "–"]
