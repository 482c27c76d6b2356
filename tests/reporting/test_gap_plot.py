"""The ablation figure (reporting/gap_plot.py): each sparse configuration's gap to the dense run of
its own configuration and seed, named by what differs from the most common configuration. Expected
numbers are worked out in the comments."""

import matplotlib.image
import pytest
from reporting_runs import make_run

from reporting import gap_plot
from reporting.configurations import short_labels, short_row_label
from reporting.gap_plot import gaps
from reporting.run_logs import read_run
from reporting.table import build_rows, make_table
from reporting.table_files import GAPS_PNG


def test_short_labels_name_only_what_differs_from_the_most_common_values():
    configs = [
        {
            "student.arch": "vit_tiny",
            "optim.epochs": 40,
            "optim.warmup_epochs": 4,
            "sparsity.teacher": "dense",
        },
        {
            "student.arch": "vit_small",
            "optim.epochs": 40,
            "optim.warmup_epochs": 4,
            "sparsity.teacher": "dense",
        },
        {
            "student.arch": "vit_tiny",
            "optim.epochs": 80,
            "optim.warmup_epochs": 8,
            "sparsity.teacher": "dense",
        },
        {
            "student.arch": "vit_tiny",
            "optim.epochs": 80,
            "optim.warmup_epochs": 8,
            "sparsity.teacher": "sparse",
        },
        {
            "student.arch": "vit_tiny",
            "optim.epochs": 40,
            "optim.warmup_epochs": 4,
            "sparsity.teacher": "sparse",
        },
    ]
    labels, base = short_labels(configs)
    # most common: vit_tiny (4 of 5), 40 epochs (3 of 5), warm-up 4 (3), dense teacher (3);
    # warmup_epochs differs exactly where epochs does, so it is not repeated
    assert labels == [
        "",
        "arch=vit_small",
        "epochs=80",
        "epochs=80, teacher=sparse",
        "teacher=sparse",
    ]
    assert base == {"arch": "vit_tiny", "epochs": "40", "warmup_epochs": "4", "teacher": "dense"}


def test_short_labels_keep_the_whole_key_where_the_last_part_is_ambiguous():
    configs = [
        {"student.arch": "vit_tiny", "teacher.arch": "vit_tiny"},
        {"student.arch": "vit_tiny", "teacher.arch": "vit_small"},
        {"student.arch": "vit_tiny", "teacher.arch": "vit_tiny"},
    ]
    labels, _ = short_labels(configs)
    assert labels == ["", "teacher.arch=vit_small", ""]


def test_short_labels_first_seen_value_wins_a_tie():
    labels, base = short_labels([{"a.x": 1.5}, {"a.x": 2.5}])
    assert base == {"x": "1.5"} and labels == ["", "x=2.5"]


@pytest.fixture
def study(tmp_path):
    """Dense seeds 0, 1; 70% seeds 0, 1; 70% with the sparse teacher, seed 0; a ViT-S 70% run
    without a dense run."""
    runs = tmp_path / "runs"
    make_run(runs, "dense_s0", 0.0, top1=80.0, knn20=70.0)
    make_run(runs, "dense_s1", 0.0, seed=1, top1=81.0, knn20=71.0)
    make_run(runs, "s70_s0", 0.7, top1=79.0, knn20=69.0)
    make_run(runs, "s70_s1", 0.7, seed=1, top1=79.4, knn20=66.4)
    make_run(
        runs, "s70_tsparse_s0", 0.7, top1=79.5, knn20=69.5, overrides=["sparsity.teacher=sparse"]
    )
    make_run(runs, "small_s70_s0", 0.7, top1=70.0, knn20=60.0, overrides=["student.arch=vit_small"])
    return runs


def test_gaps_leave_out_runs_that_did_not_finish(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "dense_s0", 0.0, top1=80.0, knn20=70.0)
    make_run(runs, "s70_s0", 0.7, top1=79.0, knn20=69.0)
    make_run(
        runs, "s40_s0", 0.4, top1=70.0, knn20=60.0, steps_done=100, finished=False
    )  # evaluated mid-run
    rows = build_rows([read_run(p) for p in sorted(runs.iterdir())])
    assert [g.fraction for g in gaps(rows)] == [0.7]


def test_gaps_are_per_seed_differences_to_the_same_seeds_dense_run(study):
    rows = build_rows([read_run(p) for p in sorted(study.iterdir())])
    drawn = gaps(rows)
    by_teacher = {g.config["sparsity.teacher"]: g for g in drawn}
    # the ViT-S run has no dense run of its configuration: no gap to draw
    assert set(by_teacher) == {"dense", "sparse"} and len(drawn) == 2
    dense_teacher = by_teacher["dense"]
    # seed 0: 79.0 - 80.0 = -1.0, seed 1: 79.4 - 81.0 = -1.6; k-NN 69.0 - 70.0 = -1.0, 66.4 - 71.0 =
    # -4.6
    assert dense_teacher.seeds == [0, 1]
    assert dense_teacher.linear == pytest.approx([-1.0, -1.6])
    assert dense_teacher.knn == pytest.approx([-1.0, -4.6])
    assert by_teacher["sparse"].linear == pytest.approx([-0.5])  # 79.5 - 80.0, seed 0's dense run


def test_make_table_draws_the_gaps_only_where_several_configurations_compare(study, tmp_path):
    out = tmp_path / "out"
    written = make_table([study], out)
    assert out / GAPS_PNG in written
    image = matplotlib.image.imread(out / GAPS_PNG)
    assert image.shape[0] > 300 and image.shape[1] > 600

    one = (
        tmp_path / "one"
    )  # dense and two schedules of one configuration: the accuracy plot says it all
    make_run(one, "s40_s0", 0.4, top1=79.5, knn20=69.5)
    for name in ("dense_s0", "s70_s0"):
        (one / name).parent.mkdir(exist_ok=True)
        (study / name).rename(one / name)
    written = make_table([one], out)  # the same folder: the earlier figure described other runs
    assert out / GAPS_PNG not in written and not (out / GAPS_PNG).exists()


def test_a_gap_far_beyond_the_others_is_cut_at_the_axis_not_flattening_them(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    make_run(runs, "dense_s0", 0.0, top1=80.0, knn20=70.0)
    make_run(runs, "s70_s0", 0.7, top1=79.0, knn20=69.0)
    make_run(
        runs,
        "s70_broken_s0",
        0.7,
        top1=50.0,
        knn20=40.0,
        overrides=["sparsity.pruning=tile_greedy_signed"],
    )
    make_run(
        runs, "s70_better_s0", 0.7, top1=82.0, knn20=70.0, overrides=["sparsity.teacher=sparse"]
    )  # +2 pp
    rows = build_rows([read_run(p) for p in sorted(runs.iterdir())])
    seen = {}
    real = gap_plot._cut_axis

    def spy(ax, drawn, positions):
        real(ax, drawn, positions)
        seen["xlim"] = ax.get_xlim()
        seen["texts"] = [t.get_text() for t in ax.texts]

    monkeypatch.setattr(gap_plot, "_cut_axis", spy)
    assert gap_plot.plot_gaps(rows, tmp_path / "g.png") == tmp_path / "g.png"
    assert seen["xlim"] == pytest.approx((gap_plot.AXIS_FLOOR, 2.5))  # the +2 pp gain stays in view
    assert seen["texts"] == [
        "-30.0 \u2190",
        "-30.0 \u2190",
    ]  # 50 - 80 linear, 40 - 70 k-NN; -1.0 is not cut


def test_short_row_labels():
    assert short_row_label(0.0, "") == "dense"
    assert short_row_label(0.7, "epochs=80") == "70% sparse · epochs=80"
    assert short_row_label(None, "arch=vit_small") == "unknown schedule · arch=vit_small"


def test_the_figures_name_configurations_by_what_differs(study, tmp_path, monkeypatch):
    """make_table hands every figure a paper's names of the configurations (model, then the options
    that differ from the most common ones) and the caption line with the common options, never
    config keys."""
    from reporting import table_figures

    seen = {}
    real_accuracy, real_losses = table_figures.plot_accuracy, table_figures.plot_losses

    def accuracy(*args, **kwargs):
        seen["names"], seen["accuracy_note"] = kwargs["names"], kwargs["note"]
        return real_accuracy(*args, **kwargs)

    def losses(*args, **kwargs):
        seen["labels"], seen["loss_note"] = kwargs["labels"], kwargs["note"]
        return real_losses(*args, **kwargs)

    monkeypatch.setattr(table_figures, "plot_accuracy", accuracy)
    monkeypatch.setattr(table_figures, "plot_losses", losses)
    make_table([study], tmp_path / "out")
    # three configurations: arch x teacher (vit_tiny/dense: 4 runs, vit_tiny/sparse: 1,
    # vit_small/dense: 1); the embedded default trains a patch-8 ViT for 10 epochs
    assert sorted(name.full for name in seen["names"].values()) == [
        "ViT-S/8, 10 epochs",
        "ViT-Ti/8, 10 epochs",
        "ViT-Ti/8, 10 epochs · 2:4-sparse teacher",
    ]
    assert (
        seen["accuracy_note"]
        == seen["loss_note"]
        == "Options not named are the most common ones: dense teacher."
    )
    tiny = "ViT-Ti/8, 10 epochs"
    assert sorted(seen["labels"]) == [
        "70% sparse · ViT-S/8, 10 epochs",
        f"70% sparse · {tiny}",
        f"70% sparse · {tiny}",
        f"70% sparse · {tiny} · 2:4-sparse teacher",
        f"dense · {tiny}",
        f"dense · {tiny}",
    ]
