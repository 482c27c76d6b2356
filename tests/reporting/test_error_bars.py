"""Error bars of the accuracy plot: half the range over seeds where a schedule has several, else the
95% Wilson interval of the single run's accuracy over its validation images (checked against
hand-computed values), and a caption that says which is drawn."""

from types import SimpleNamespace

import pytest

from reporting import plots
from reporting.intervals import wilson_interval
from reporting.plots import _error_bars, _groups


@pytest.mark.parametrize(
    "percent, n, expected",
    [
        (50.0, 100, (40.383, 59.617)),  # 50/100: the textbook Wilson interval 0.4038-0.5962
        (0.0, 10, (0.0, 27.753)),  # 0/10: the interval stays inside [0, 1], unlike p +- z * se
        (100.0, 10, (72.247, 100.0)),
        (88.3333, 360, (84.61, 91.25)),  # 318/360, the embedded default's validation size
    ],
)
def test_wilson_interval_hand_computed(percent, n, expected):
    low, high = wilson_interval(percent, n)
    assert low == pytest.approx(expected[0], abs=0.02) and high == pytest.approx(
        expected[1], abs=0.02
    )


def _row(fraction, top1, knn, seed=0, n_val=360, dense=(None, None)):
    """A table row; `dense`: the (linear, k-NN) top-1 of its dense run, for its Δ."""
    delta, delta_knn = (None if d is None else v - d for v, d in zip((top1, knn), dense))
    return SimpleNamespace(
        run=f"sparse_{fraction}_{seed}",
        sparse_fraction=fraction,
        total_steps=100,
        sparse_steps=int(100 * fraction),
        top1=top1,
        knn_top1=knn,
        seed=seed,
        n_val=n_val,
        status="complete",
        knn_k=20,
        published_top1=None,
        delta_top1=delta,
        delta_knn_top1=delta_knn,
        config_label="",
        delta_top1_same_teacher=None,
        delta_knn_top1_same_teacher=None,
    )  # as a TableRow without one


def test_seeds_give_half_ranges_single_runs_wilson_and_unknown_sizes_none():
    rows = [
        _row(0.0, 80.0, 50.0, seed=0),
        _row(0.0, 84.0, 52.0, seed=1),
        _row(0.5, 50.0, 40.0),
        _row(1.0, 70.0, 45.0, n_val=None),
    ]
    below, above, kinds = _error_bars(_groups(rows, "top1"))
    assert below[0] == above[0] == 2.0  # seeds 80 and 84: half the range
    low, high = wilson_interval(50.0, 360)
    assert (below[1], above[1]) == pytest.approx((50.0 - low, high - 50.0))
    assert below[2] == above[2] == 0.0  # no validation size: no bar
    assert kinds == {"seeds", "wilson"}


def test_a_single_seeds_delta_carries_the_wilson_interval_of_its_accuracy():
    # 85.0 against a dense 88.0: Δ -3.0, and the bar is the Wilson interval of 85% over 360 images,
    # moved onto -3.0
    rows = [_row(0.0, 88.0, 53.0, dense=(88.0, 53.0)), _row(0.5, 85.0, 57.0, dense=(88.0, 53.0))]
    below, above, kinds = _error_bars(_groups(rows, "delta_top1", "top1"))
    low, high = wilson_interval(85.0, 360)
    assert (below[0], above[0]) == (0.0, 0.0)  # the dense run is the reference itself
    assert (below[1], above[1]) == pytest.approx((85.0 - low, high - 85.0)) and kinds == {"wilson"}


def test_the_caption_says_which_error_bars_are_drawn():
    _, _, caption = plots.accuracy_figure(
        [_row(0.0, 88.0, 53.0, dense=(88.0, 53.0)), _row(0.5, 85.0, 57.0, dense=(88.0, 53.0))]
    )
    assert "95% Wilson interval of the accuracy over the 360 validation images" in caption.replace(
        "\n", " "
    )
    assert "one seed per schedule" in caption and "half the range" not in caption
    _, _, caption = plots.accuracy_figure(
        [
            _row(0.0, 88.0, 53.0, dense=(88.0, 53.0)),
            _row(0.0, 86.0, 52.0, seed=1, dense=(86.0, 52.0)),
            _row(0.5, 85.0, 57.0, dense=(88.0, 53.0)),
            _row(0.5, 84.0, 50.0, seed=1, dense=(86.0, 52.0)),
        ]
    )
    assert "half the range over seeds" in caption and "Wilson" not in caption
    plots.plt.close("all")
