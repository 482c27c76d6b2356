"""The loss-curve figure: every panel's y range is that of the values after the first 10% of steps
(starts above and below the rest alike), and under each panel the runs' differences to their dense
run of the same seed, at the steps both logged."""

import math

import numpy as np
import pytest
from reporting_runs import make_run

from reporting import loss_plots
from reporting.loss_plots import difference_curve, loss_figure
from reporting.run_logs import COMPLETE, RunSummary
from reporting.table import make_table

STEPS = list(range(5, 301, 5))  # logged every 5 of 300 steps: the first 10% are the steps before 30
CUT = 30


def wave(s: int) -> float:
    return math.sin(s / 17.0)


def dense_terms(skip=()) -> dict:
    """Total loss starting far above the rest of the run, DINO local starting far below (as in the
    digits runs)."""
    return {
        "loss": [(s, 14.0 if s < CUT else 10.0 + 0.1 * wave(s)) for s in STEPS if s not in skip],
        "dino_local_crops_loss": [
            (s, 4.0 if s < CUT else 5.5 + 0.01 * wave(s)) for s in STEPS if s not in skip
        ],
    }


def offset(s: int) -> float:
    return 0.5 if s < CUT else 0.002 * s / 300  # large at the start, small after


def run(name: str, fraction: float, terms: dict, seed: int = 0) -> RunSummary:
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
def study():
    dense = run("sparse_0.00", 0.0, dense_terms(skip=(100,)))  # a step the dense run did not log
    sparse = run(
        "sparse_0.70",
        0.7,
        {
            term: [(s, v + offset(s)) for s, v in dense_terms()[term]]
            for term in ("loss", "dino_local_crops_loss")
        },
    )
    return dense, sparse


def _curves(ax) -> list:
    """The drawn curves (not the zero line, not the switch markers)."""
    return [
        (np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float))
        for line in ax.get_lines()
        if len(line.get_xdata()) > 2
    ]


def test_every_panel_spans_the_values_after_the_first_tenth_of_the_steps(study):
    figure = loss_figure(list(study), references=[None, study[0]])
    assert len(figure.panels) == len(figure.differences) == 2
    for ax in list(figure.panels.values()) + list(figure.differences.values()):
        low, high = ax.get_ylim()
        xs, ys = map(np.concatenate, zip(*_curves(ax)))
        late, early = ys[xs >= CUT], ys[xs < CUT]
        if ax in figure.differences.values():
            late = np.append(late, 0.0)  # the dense run's line at 0 stays in view
        assert low <= late.min() and late.max() <= high, ax.get_title()
        assert high - low <= 1.2 * (late.max() - late.min()) + 1e-9, (
            ax.get_title()
        )  # nothing but the late range
        assert ((early < low) | (early > high)).all(), (
            ax.get_title()
        )  # the start, above or below, is cut off
    assert any(
        note.startswith("Y axes span the values after the first 10% of steps")
        for note in figure.notes
    )


def test_the_difference_panels_hold_each_run_minus_its_dense_run(study):
    dense, sparse = study
    figure = loss_figure([dense, sparse], references=[dense, dense])
    for term, ax in figure.differences.items():
        ((xs, ys),) = _curves(ax)  # the dense run itself is the line at 0, not a curve
        expected = dict(sparse.loss_terms[term])
        reference = dict(dense.loss_terms[term])
        assert list(xs) == [s for s in STEPS if s != 100]  # only the steps both runs logged
        assert ys == pytest.approx([expected[s] - reference[s] for s in xs], abs=1e-12)
        assert ys == pytest.approx([offset(s) for s in xs], abs=1e-9)
        zero = [
            line
            for line in ax.get_lines()
            if len(line.get_xdata()) == 2 and set(line.get_ydata()) == {0.0}
        ]
        assert zero, "the dense run's line at 0"
    assert difference_curve([(5, 1.0), (10, float("nan")), (15, 3.0)], [(5, 0.5), (10, 1.0)]) == [
        (5, 0.5)
    ]


def test_without_references_there_are_no_difference_panels(study):
    figure = loss_figure(list(study))
    assert figure.differences == {} and not any("dense run" in note for note in figure.notes)


def test_make_table_compares_each_run_with_the_dense_run_of_its_seed(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    make_run(runs, "sparse_0.00", 0.0)
    make_run(runs, "sparse_0.70", 0.7)
    make_run(runs, "sparse_0.70_seed1", 0.7, seed=1)  # no dense run of seed 1: no difference drawn
    drawn = []
    monkeypatch.setattr(
        loss_plots, "save_with_caption", lambda fig, path, caption, y: drawn.append((fig, caption))
    )
    make_table([runs], tmp_path / "out")
    ((fig, caption),) = drawn
    caption = " ".join(caption.split())  # wrapped to the figure's width
    differences = [ax for ax in fig.axes if ax.get_title() == "difference to the dense run"]
    assert len(differences) == 5  # one per loss term
    assert all(len(_curves(ax)) == 1 for ax in differences)  # sparse_0.70 only
    assert (
        "minus its dense run's" in caption
        and "No dense run of the same seed: sparse_0.70_seed1." in caption
    )
