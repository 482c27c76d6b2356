"""The loss differences of a study with several dense references: one row per dense run, each sparse
run's curve is its loss minus its own dense run's (same configuration, same seed) at the steps both
logged; a study with one dense reference gets no such figure (its loss-curve figure has the
difference panels)."""

import math

import numpy as np
import pytest
from reporting_runs import make_run

from reporting.loss_groups import differences_figure, groups_of, plot_loss_differences
from reporting.run_logs import COMPLETE, RunSummary
from reporting.table import make_table
from reporting.table_files import DIFFERENCES_PNG

STEPS = list(range(5, 301, 5))


def run(name, fraction, level, slope=0.0, seed=0, skip=()):
    """Loss terms `level + slope * step` (plus a small wave, equal in every run)."""
    terms = {
        t: [(s, level + slope * s + 0.01 * math.sin(s / 9)) for s in STEPS if s not in skip]
        for t in ("loss", "ibot_loss")
    }
    return RunSummary(
        name=name,
        path=name,
        train_status=COMPLETE,
        eval_status=COMPLETE,
        sparse_fraction=fraction,
        total_steps=300,
        sparse_steps=round(300 * fraction),
        seed=seed,
        loss_terms=terms,
    )


@pytest.fixture
def two_models():
    tiny_dense, small_dense = run("ti_dense", 0.0, 5.0, skip=(150,)), run("s_dense", 0.0, 4.0)
    tiny70, tiny70_s1 = run("ti_70", 0.7, 5.0, 0.001), run("ti_70_s1", 0.7, 5.0, 0.002, seed=1)
    small70 = run("s_70", 0.7, 4.0, -0.001)
    runs = [tiny_dense, small_dense, tiny70, tiny70_s1, small70]
    # tiny70_s1 has no dense run of its seed: it is not drawn
    references = [tiny_dense, small_dense, tiny_dense, None, small_dense]
    names = ["dense", "dense · arch=vit_small", "dense", "dense", "dense · arch=vit_small"]
    return runs, references, names


def _curves(ax):
    return [
        (np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float))
        for line in ax.get_lines()
        if len(line.get_xdata()) > 2
    ]


def test_each_row_holds_its_runs_minus_their_own_dense_run(two_models):
    runs, references, names = two_models
    groups = groups_of(runs, references, names)
    assert {k: [r.name for r, _ in v] for k, v in groups.items()} == {
        "dense": ["ti_70"],
        "dense · arch=vit_small": ["s_70"],
    }
    fig, axes, notes = differences_figure(groups, {id(r): r.name for r in runs})
    assert axes.shape == (2, 2)  # two dense references x the two logged terms
    for row, slope, skipped in ((0, 0.001, {150}), (1, -0.001, set())):
        for ax in axes[row]:
            ((xs, ys),) = _curves(ax)  # one sparse run per row; the dense run is the line at 0
            assert list(xs) == [s for s in STEPS if s not in skipped]  # only steps both runs logged
            assert ys == pytest.approx([slope * s for s in xs], abs=1e-12)
    assert "one row per dense run" in notes[0]
    assert [ax.get_ylabel().split("\n", 1)[1] for ax in axes[:, 0]] == [
        "dense",
        "dense · arch=vit_small",
    ]


def test_one_dense_reference_gets_no_figure(two_models, tmp_path):
    runs, references, names = two_models
    path = tmp_path / "d.png"
    assert (
        plot_loss_differences(
            runs[:1] + runs[2:4],
            references[:1] + references[2:4],
            ["a"] * 3,
            names[:1] + names[2:4],
            path,
        )
        is None
    )
    assert not path.exists()
    assert (
        plot_loss_differences(runs, references, [r.name for r in runs], names, path) == path
        and path.exists()
    )


def test_make_table_draws_the_differences_per_dense_run_only_for_several(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    make_run(runs, "dense_s0", 0.0)
    make_run(runs, "s70_s0", 0.7, top1=88.0)
    written = make_table([runs], out)
    assert out / DIFFERENCES_PNG not in written and not (out / DIFFERENCES_PNG).exists()
    make_run(runs, "small_dense_s0", 0.0, overrides=["student.arch=vit_small"])
    make_run(runs, "small_s70_s0", 0.7, top1=89.0, overrides=["student.arch=vit_small"])
    written = make_table([runs], out)
    assert out / DIFFERENCES_PNG in written and (out / DIFFERENCES_PNG).stat().st_size > 10_000
    # back to one configuration in the same folder: the earlier figure described other runs
    for name in ("small_dense_s0", "small_s70_s0"):
        for f in sorted((runs / name).rglob("*"), reverse=True):
            f.unlink() if f.is_file() else f.rmdir()
        (runs / name).rmdir()
    written = make_table([runs], out)
    assert out / DIFFERENCES_PNG not in written and not (out / DIFFERENCES_PNG).exists()
