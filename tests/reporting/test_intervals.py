"""The 95% intervals of the tables: a mean over seeds, a paired Δ, a Welch Δ, checked by hand and
against scipy's own t tests (a separate implementation), with the cases that have no interval."""

import pytest
from scipy import stats

from reporting.intervals import Interval, difference_interval, mean_interval


def test_the_mean_of_three_seeds_by_hand():
    # mean 2, sd 1, t(0.975, 2 df) = 4.302653: 2 +- 4.302653 / sqrt(3) = 2 +- 2.484138
    interval = mean_interval([1.0, 2.0, 3.0])
    assert (interval.low, interval.high) == pytest.approx((2 - 2.484138, 2 + 2.484138), abs=1e-6)
    assert interval.method == "t" and interval.holds_zero()


def test_the_mean_agrees_with_scipy_and_needs_two_values():
    values = [71.55, 70.50, 70.22]
    expected = stats.ttest_1samp(values, 0.0).confidence_interval()
    interval = mean_interval(values)
    assert (interval.low, interval.high) == pytest.approx((expected.low, expected.high), abs=1e-9)
    assert mean_interval([70.0]) is None and mean_interval([]) is None
    assert mean_interval([70.0, None, float("nan")]) is None  # one finite value left


def test_the_same_seeds_pair_seed_by_seed():
    sparse, dense = (
        {0: 70.59, 1: 70.21},
        {1: 70.50, 0: 71.55},
    )  # the order of the seeds does not matter
    expected = stats.ttest_rel([70.59, 70.21], [71.55, 70.50]).confidence_interval()
    interval = difference_interval(sparse, dense)
    assert interval.method == "paired t"
    assert (interval.low, interval.high) == pytest.approx((expected.low, expected.high), abs=1e-9)
    # by hand: differences -0.96 and -0.29, mean -0.625, sd 0.473762, t(0.975, 1 df) 12.7062 / sqrt
    # 2: +- 4.2567
    assert (interval.low, interval.high) == pytest.approx(
        (-0.625 - 4.2567, -0.625 + 4.2567), abs=1e-3
    )


def test_other_seeds_take_welchs_interval():
    sparse, dense = {0: 10.0, 1: 12.0}, {2: 8.0, 3: 9.0, 4: 10.0}
    expected = stats.ttest_ind(
        [10.0, 12.0], [8.0, 9.0, 10.0], equal_var=False
    ).confidence_interval()
    interval = difference_interval(sparse, dense)
    assert interval.method == "Welch t" and interval.holds_zero() == (
        expected.low <= 0 <= expected.high
    )
    assert (interval.low, interval.high) == pytest.approx((expected.low, expected.high), abs=1e-9)
    # a shared seed is not enough to pair: the seed sets must be equal
    assert difference_interval({0: 10.0, 1: 12.0}, {0: 9.0, 1: 9.5, 2: 10.0}).method == "Welch t"


def test_no_interval_without_two_seeds_a_side():
    assert difference_interval({0: 70.0}, {0: 71.0}) is None  # one pair
    assert (
        difference_interval({0: 70.0, 1: 71.0}, {2: 71.0}) is None
    )  # one reference seed, other seeds
    assert (
        difference_interval({0: 70.0, 1: None}, {0: 71.0, 1: 72.0}) is None
    )  # a seed without its value
    # seeds that agree exactly: a zero-width interval, which leaves out 0 where the means differ
    assert difference_interval({0: 1.0, 1: 1.0}, {2: 0.0, 3: 0.0}) == Interval(1.0, 1.0, "Welch t")
    assert not Interval(1.0, 1.0, "Welch t").holds_zero() and Interval(-0.1, 0.0, "t").holds_zero()
