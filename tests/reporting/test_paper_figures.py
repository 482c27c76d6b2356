"""The figures as a paper prints them (reporting/plots.py, gap_plot.py, names.py): what is drawn is
read back from the returned matplotlib Figure, never only a file's existence. Expected numbers are
worked out in the comments."""

import re
from types import SimpleNamespace

import pytest
from reporting_runs import make_run

from reporting import gap_plot, plots, published
from reporting.names import PUBLISHED_NAME, PaperName, model_name, option_phrase, paper_names
from reporting.run_logs import read_run
from reporting.table import build_rows

PUBLISHED_XS = [
    0.0,
    32.0,
    60.0,
    70.0,
    80.0,
    90.0,
    100.0,
]  # the "40%" row ran 40k of 125k steps sparse
PUBLISHED_DELTAS = [
    0.0,
    0.1,
    0.0,
    -0.1,
    -0.1,
    -0.8,
    -0.5,
]  # 82.8 82.9 82.8 82.7 82.7 82.0 82.3, minus 82.8


def _row(fraction, seed, top1, knn, dense_top1, dense_knn, label=""):
    return SimpleNamespace(
        run=f"r{fraction}_{seed}",
        sparse_fraction=fraction,
        total_steps=100,
        sparse_steps=round(100 * fraction),
        top1=top1,
        knn_top1=knn,
        seed=seed,
        n_val=None,
        status="complete",
        knn_k=20,
        published_top1=None,
        delta_top1=top1 - dense_top1,
        delta_knn_top1=knn - dense_knn,
        config_label=label,
        delta_top1_same_teacher=None,
        delta_knn_top1_same_teacher=None,
    )  # as a TableRow without one


@pytest.fixture
def two_seeds():
    """Dense 70 / 72 (k-NN 60 / 62) for seeds 0 / 1; 70% sparse 67 / 68 (k-NN 55 / 58)."""
    return [
        _row(0.0, 0, 70.0, 60.0, 70.0, 60.0),
        _row(0.0, 1, 72.0, 62.0, 72.0, 62.0),
        _row(0.7, 0, 67.0, 55.0, 70.0, 60.0),
        _row(0.7, 1, 68.0, 58.0, 72.0, 62.0),
    ]


def _series(ax):
    """[(xs, ys)] of the connected data lines on the axes, rounded to 6 decimals (horizontal
    reference lines, drawn in axes coordinates, left out)."""
    return [
        (
            [round(float(x), 6) for x in line.get_xdata()],
            [round(float(y), 6) for y in line.get_ydata()],
        )
        for line in ax.get_lines()
        if line.get_linestyle() not in ("None", "")
        and len(line.get_xdata()) > 1
        and line.get_transform() == ax.transData
    ]


def test_ours_and_the_published_delta_share_one_axis(two_seeds):
    fig, handles, _ = plots.accuracy_figure(
        two_seeds, names={"": PaperName("ViT-S/4, 80 epochs", "")}
    )
    linear, knn = fig.axes
    assert linear.get_title() == "Linear probe" and knn.get_title() == "k-NN (k=20)"
    assert linear.get_ylabel() == plots.Y_LABEL and "(pp)" in plots.Y_LABEL
    drawn = _series(linear)
    # ours: the per-seed Δ averaged, 0 at dense; at 70%: (67 - 70 + 68 - 72) / 2 = -3.5
    assert ([0.0, 70.0], [0.0, -3.5]) in drawn
    # the published Δ to its own dense run on the same axes
    assert (PUBLISHED_XS, PUBLISHED_DELTAS) in drawn
    # k-NN: (55 - 60 + 58 - 62) / 2 = -4.5; no published k-NN
    assert [ys for _, ys in _series(knn) if len(ys) == 2][0] == pytest.approx([0.0, -4.5])
    assert not any(xs == pytest.approx(PUBLISHED_XS) for xs, _ in _series(knn))
    labels = [h.get_label() for h in handles]
    # the dense top-1 in the legend: (70 + 72) / 2 = 71.0 linear, (60 + 62) / 2 = 61.0 k-NN
    assert labels == [
        "ViT-S/4, 80 epochs (dense: 71.0% linear, 61.0% k-NN)",
        PUBLISHED_NAME,
        "one seed",
    ]
    plots.plt.close(fig)


def test_each_configuration_is_measured_from_its_own_dense_run_and_named_in_words():
    rows = [
        _row(0.0, 0, 70.0, 60.0, 70.0, 60.0, "a"),
        _row(0.7, 0, 66.0, 50.0, 70.0, 60.0, "a"),
        _row(0.0, 0, 80.0, 75.0, 80.0, 75.0, "b"),
        _row(0.7, 0, 79.0, 74.0, 80.0, 75.0, "b"),
    ]
    names = {"a": PaperName("ViT-Ti/4, 40 epochs", ""), "b": PaperName("ViT-S/4, 40 epochs", "")}
    fig, handles, caption = plots.accuracy_figure(rows, names=names)
    ours = [ys for _, ys in _series(fig.axes[0]) if len(ys) == 2]
    assert sorted(map(tuple, ours)) == [
        (0.0, -4.0),
        (0.0, -1.0),
    ]  # 66 - 70 and 79 - 80, not against one dense run
    assert [h.get_label().split(" (dense")[0] for h in handles[:2]] == [
        "ViT-Ti/4, 40 epochs",
        "ViT-S/4, 40 epochs",
    ]
    texts = [t.get_text() for ax in fig.axes for t in ax.texts] + [h.get_label() for h in handles]
    assert not any(re.search(r"\w=\w", t) or "vit_" in t for t in texts)  # never a config key=value
    assert "side by side" in caption
    plots.plt.close(fig)


def test_option_phrases_and_model_names():
    assert option_phrase("sparsity.teacher", "sparse") == "2:4-sparse teacher"
    assert option_phrase("sparsity.pruned_decay", 0.02) == "masked decay 0.02"
    assert option_phrase("sparsity.pruned_decay", 0.0) == "no masked decay"
    assert (
        option_phrase("teacher.momentum_restart_at_switch", True)
        == "teacher momentum restarted at the switch"
    )
    assert (
        option_phrase("teacher.momentum_restart_fraction", 0.4)
        == "teacher momentum restarted at 0.4 of the steps"
    )
    assert option_phrase("teacher.momentum_restart_fraction", 0.0) == "no teacher momentum restart"
    assert (
        option_phrase("teacher.momentum_reference_steps", 125000)
        == "teacher horizon matched to a 125000-step run"
    )
    assert option_phrase("optim.base_lr", 0.001) == "base_lr=0.001"  # unknown: still named
    assert (
        model_name({"student.arch": "vit_small", "student.patch_size": 4, "optim.epochs": 80})
        == "ViT-S/4, 80 epochs"
    )


def test_paper_names_show_the_model_only_where_models_differ():
    tiny = {"student.arch": "vit_tiny", "student.patch_size": 4, "optim.epochs": 40}
    configs = {
        "t": (tiny, {"student.arch": "vit_tiny", "sparsity.teacher": "dense"}),
        "ts": (tiny, {"student.arch": "vit_tiny", "sparsity.teacher": "sparse"}),
        "s": (
            {**tiny, "student.arch": "vit_small"},
            {"student.arch": "vit_small", "sparsity.teacher": "dense"},
        ),
    }
    names, note = paper_names(configs)
    assert {k: n.full for k, n in names.items()} == {
        "t": "ViT-Ti/4, 40 epochs",
        "ts": "ViT-Ti/4, 40 epochs · 2:4-sparse teacher",
        "s": "ViT-S/4, 40 epochs",
    }
    assert note == "Options not named are the most common ones: dense teacher."
    same_model = {k: v for k, v in configs.items() if k != "s"}
    names, _ = paper_names(same_model)
    assert {k: n.full for k, n in names.items()} == {
        "t": "most common options",
        "ts": "2:4-sparse teacher",
    }


def test_paper_names_name_every_option_off_its_common_value_also_two_that_change_together():
    """The published recipe against a recipe that changes two options at once: both are named (the
    caption says the unnamed options are the common ones, so naming one of the two would claim the
    other is common)."""
    tiny = {"student.arch": "vit_tiny", "student.patch_size": 4, "optim.epochs": 80}
    published = {"teacher.momentum_restart_at_switch": False, "sparsity.pruned_decay": 0.0}
    recipe = {"teacher.momentum_restart_at_switch": True, "sparsity.pruned_decay": 0.005}
    names, note = paper_names({"p": (tiny, published), "r": (tiny, recipe)})
    assert names["p"].full == "most common options"  # a tie: the first seen is the common one
    assert names["r"].full == "teacher momentum restarted at the switch, masked decay 0.005"
    assert (
        note
        == "Options not named are the most common ones: teacher momentum over the whole run, no "
        "masked decay."
    )


def test_the_gap_figure_groups_by_model_and_names_bars_in_words(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "dense_s0", 0.0, top1=80.0, knn20=70.0)
    make_run(runs, "s70_s0", 0.7, top1=79.0, knn20=69.0)
    make_run(
        runs, "s70_tsparse_s0", 0.7, top1=77.5, knn20=68.0, overrides=["sparsity.teacher=sparse"]
    )
    rows = build_rows([read_run(p) for p in sorted(runs.iterdir())])
    names = {
        "sparsity.teacher=dense": PaperName("ViT-Ti/8, 10 epochs", "", True),
        "sparsity.teacher=sparse": PaperName("ViT-Ti/8, 10 epochs", "2:4-sparse teacher", True),
    }
    fig, caption, handles = gap_plot.gap_figure(rows, names=names)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "70% sparse",
        "70% sparse · 2:4-sparse teacher",
    ]
    assert [t.get_text() for t in ax.texts] == [
        "ViT-Ti/8, 10 epochs: against its own dense run"
    ]  # one header
    # bars: linear 79 - 80 = -1.0, k-NN -1.0; sparse teacher 77.5 - 80 = -2.5, k-NN 68 - 70 = -2.0
    assert [round(p.get_width(), 6) for p in ax.patches] == [-1.0, -1.0, -2.5, -2.0]
    published_70 = next(p.delta_top1 for p in published.ROWS if p.fraction == 0.7)
    diamonds = [line.get_xdata()[0] for line in ax.get_lines() if line.get_marker() == "D"]
    assert diamonds == pytest.approx([published_70, published_70])
    assert {h.get_label() for h in handles} >= {"linear probe", "k-NN", "one seed"}
    gap_plot.plt.close(fig)


def test_the_masks_figure_says_what_unnamed_options_stand_for(tmp_path, monkeypatch):
    """Its legend names runs as the other figures do ("100% sparse · most common options"), so its
    caption carries the same line saying which values those are."""
    from pathlib import Path

    from reporting import mask_plots

    screen = Path(__file__).resolve().parents[2] / "results" / "cifar10" / "recipe" / "screen"
    runs = [
        SimpleNamespace(
            path=screen / "sparse100_ste_s0", name="s100", sparse_fraction=1.0, sparse_steps=7760
        )
    ]
    captions = []
    monkeypatch.setattr(
        mask_plots,
        "save_with_legend_below",
        lambda fig, path, handles, ncol, caption: captions.append(caption),
    )
    note = "Options not named are the most common ones: masked decay 0.005."
    assert mask_plots.plot_masks(
        runs, tmp_path / "masks.png", labels=["100% sparse · most common options"], note=note
    )
    assert captions[0].endswith("\n" + note) and "| : a run's switch to dense." in captions[0]


def test_the_switch_is_marked_at_its_own_step_between_the_logged_ones():
    """Logged every 5 steps (5, 10, 15, 20) with the switch after step 11: the mark is at 11, a
    fifth of the way from the value at 10 to the value at 15 (it used to sit on the first logged
    step after the switch, 15)."""
    import numpy as np

    from reporting.mask_plots import switch_marker

    steps, values = np.array([5.0, 10.0, 15.0, 20.0]), np.array([0.4, 0.2, 0.7, 0.1])
    assert switch_marker(steps, values, 11) == (11.0, 0.2 + (0.7 - 0.2) / 5)
    assert switch_marker(steps, values, 15) == (15.0, 0.7)
    assert switch_marker(steps, values, 3) is None and switch_marker(steps, values, 21) is None
