"""Confidence intervals of the accuracies the reports show."""

import math


def wilson_interval(percent: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval (in %) of an accuracy of `percent` measured on `n` images: the evaluation's
    own sampling error, which is all one seed can show. Unlike p +- z * se it stays inside [0, 100]."""
    if n <= 0:
        raise ValueError(f"need a positive number of images, got {n}")
    p = percent / 100.0
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return 100.0 * max(0.0, centre - half), 100.0 * min(1.0, centre + half)
