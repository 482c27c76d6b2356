"""The one-shot 2:4 floor of a table's dense runs: each dense run's final teacher probed with its MLPs
pruned 2:4 once, with no 2:4 training and no fine-tuning (`eval_linear.py ... prune_mlp=true`, the
record `eval_linear_pruned_mlp.json`, which the study's driver writes for every run that ended
dense).

It is what 2:4 MLPs cost a network trained dense, read as the bound of a fully sparse row: that run
has no dense phase to recover in, so it is judged against the dense network pruned, as well as
against the dense network. Per dense configuration, over its seeds with the probe: the pruned top-1
and k-NN with their 95% intervals, and their differences to the same runs unpruned, paired by seed.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .intervals import Interval, difference_interval, mean_interval


@dataclass
class FloorMean:
    schedule: str  # the dense configuration's label
    seeds: list
    runs: list
    dense_top1: float  # the same runs unpruned
    top1: float
    top1_interval: Interval | None  # None with fewer than two seeds
    delta_top1: float  # pruned minus unpruned, mean over seeds
    delta_top1_interval: Interval | None
    knn_top1: float | None
    knn_top1_interval: Interval | None
    delta_knn_top1: float | None
    delta_knn_top1_interval: Interval | None


def floor_means(rows: list, means: list) -> list[FloorMean]:
    """A FloorMean per dense configuration among `means` (the table's `ScheduleMean`s) whose runs
    (`TableRow`s among `rows`) have the pruned probe; only the runs with it count, so its mean and
    the unpruned one are over the same seeds."""
    floors = []
    for mean in means:
        if mean.sparse_fraction != 0.0:
            continue
        group = [
            r
            for r in rows
            if r.run in mean.runs and r.pruned_top1 is not None and r.top1 is not None
        ]
        if group:
            floors.append(_floor_of(mean.schedule, group))
    return floors


def _floor_of(schedule: str, group: list) -> FloorMean:
    def by_seed(name: str) -> dict:
        return {r.seed: getattr(r, name) for r in group}

    with_knn = [r for r in group if r.pruned_knn_top1 is not None and r.knn_top1 is not None]
    knn_deltas = [r.pruned_knn_top1 - r.knn_top1 for r in with_knn]
    return FloorMean(
        schedule=schedule,
        seeds=[r.seed for r in group],
        runs=[r.run for r in group],
        dense_top1=statistics.fmean(r.top1 for r in group),
        top1=statistics.fmean(r.pruned_top1 for r in group),
        top1_interval=mean_interval([r.pruned_top1 for r in group]),
        delta_top1=statistics.fmean(r.pruned_top1 - r.top1 for r in group),
        delta_top1_interval=difference_interval(by_seed("pruned_top1"), by_seed("top1")),
        knn_top1=statistics.fmean(r.pruned_knn_top1 for r in with_knn) if with_knn else None,
        knn_top1_interval=mean_interval([r.pruned_knn_top1 for r in with_knn]),
        delta_knn_top1=statistics.fmean(knn_deltas) if knn_deltas else None,
        delta_knn_top1_interval=difference_interval(
            {r.seed: r.pruned_knn_top1 for r in with_knn}, {r.seed: r.knn_top1 for r in with_knn}
        ),
    )
