"""Confidence intervals of the accuracies the reports show, and the one rule that calls a difference
resolved."""

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.95


def wilson_interval(percent: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval (in %) of an accuracy of `percent` measured on `n` images: the
    evaluation's own sampling error, which is all one seed can show. Unlike p +- z * se it stays
    inside [0, 100]."""
    if n <= 0:
        raise ValueError(f"need a positive number of images, got {n}")
    p = percent / 100.0
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return 100.0 * max(0.0, centre - half), 100.0 * min(1.0, centre + half)


@dataclass(frozen=True)
class Interval:
    """A 95% interval and how it was taken: "t" (a mean over seeds), "paired t" (a difference of two
    configurations run with the same seeds, seed by seed) or "Welch t" (a difference of two
    configurations with different seeds)."""

    low: float
    high: float
    method: str

    def holds_zero(self) -> bool:
        """The rule every table and note uses: a difference whose interval holds 0 is within seed
        noise."""
        return self.low <= 0.0 <= self.high


def _t_quantile(df: float) -> float:
    from scipy.stats import (
        t,
    )  # scipy comes with scikit-learn; imported only where an interval is taken

    return float(t.ppf(0.5 + LEVEL / 2, df))


def _finite(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def difference(value: float | None, reference: float | None) -> float | None:
    """value - reference; None where either is missing."""
    return None if value is None or reference is None else value - reference


def mean_interval(values: Sequence[float | None]) -> Interval | None:
    """Student's t interval of the mean of the seeds' values; None with fewer than two."""
    values = _finite(values)
    if len(values) < 2:
        return None
    mean, half = (
        statistics.fmean(values),
        _t_quantile(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)),
    )
    return Interval(mean - half, mean + half, "t")


def difference_interval(values: dict, reference: dict) -> Interval | None:
    """The interval of mean(values) - mean(reference), each a {seed: value} of one configuration's
    runs. With the same seeds on both sides, paired: the t interval of the seed-by-seed differences.
    Otherwise Welch's, which needs two seeds a side. None where neither applies."""
    values = {s: v for s, v in values.items() if v is not None and math.isfinite(v)}
    reference = {s: v for s, v in reference.items() if v is not None and math.isfinite(v)}
    if len(values) >= 2 and values.keys() == reference.keys():
        paired = mean_interval([values[s] - reference[s] for s in sorted(values, key=str)])
        return Interval(paired.low, paired.high, "paired t")
    if len(values) < 2 or len(reference) < 2:
        return None
    a, b = list(values.values()), list(reference.values())
    var_a, var_b = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(a) - statistics.fmean(b)
    if var_a + var_b == 0.0:
        return Interval(diff, diff, "Welch t")
    df = (var_a + var_b) ** 2 / (var_a**2 / (len(a) - 1) + var_b**2 / (len(b) - 1))
    half = _t_quantile(df) * math.sqrt(var_a + var_b)
    return Interval(diff - half, diff + half, "Welch t")
