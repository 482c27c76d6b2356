"""The one-shot 2:4 floor of a table's dense runs: each dense run's final teacher probed with its MLPs
pruned 2:4 once, with no 2:4 training and no fine-tuning (`eval_linear.py ... prune_mlp=true`, the
record `eval_linear_pruned_mlp.json`, which the study's driver writes for every run that ended
dense; where only a k-NN probe was run, `eval_knn_pruned_mlp.json`, which gives the k-NN columns).

It is what 2:4 MLPs cost a network trained dense, read as the bound of a fully sparse row: that run
has no dense phase to recover in, so it is judged against the dense network pruned, as well as
against the dense network. Per dense configuration, over its seeds with the probe: the pruned top-1
and k-NN with their 95% intervals, and their differences to the same runs unpruned, paired by seed.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .configurations import config_key, config_order
from .intervals import Interval, difference_interval, mean_interval
from .run_logs import COMPLETE


@dataclass
class FloorMean:
    schedule: str  # the dense configuration's label
    seeds: list
    runs: list
    # linear top-1 over the runs with a pruned linear probe (None where only k-NN was probed), the
    # same runs unpruned; k-NN over the runs with a pruned k-NN
    dense_top1: float | None
    top1: float | None
    top1_interval: Interval | None  # None with fewer than two seeds
    delta_top1: float | None  # pruned minus unpruned, mean over seeds
    delta_top1_interval: Interval | None
    knn_top1: float | None
    knn_top1_interval: Interval | None
    delta_knn_top1: float | None
    delta_knn_top1_interval: Interval | None


def floor_means(rows: list) -> list[FloorMean]:
    """A FloorMean per dense configuration among the table's complete, non-screening `TableRow`s
    (grouped as its schedule means are), over its runs with the pruned probe: each pruned mean and
    its unpruned one are over the same seeds."""
    groups: dict[tuple, list] = {}
    for row in rows:
        if (
            row.sparse_fraction == 0.0
            and row.status == COMPLETE
            and not row.screening
            and (_probed(row, "top1") or _probed(row, "knn_top1"))
        ):
            groups.setdefault(config_key(row.differing_config), []).append(row)
    ordered = sorted(groups.values(), key=lambda g: config_order(g[0].differing_config))
    return [_floor_of(group[0].schedule, group) for group in ordered]


def _probed(row, name: str) -> bool:
    return getattr(row, f"pruned_{name}") is not None and getattr(row, name) is not None


def _floor_of(schedule: str, group: list) -> FloorMean:
    linear = [r for r in group if _probed(r, "top1")]
    knn = [r for r in group if _probed(r, "knn_top1")]
    top1, delta_top1 = _means(linear, "top1")
    knn_top1, delta_knn_top1 = _means(knn, "knn_top1")
    return FloorMean(
        schedule=schedule,
        seeds=[r.seed for r in group],
        runs=[r.run for r in group],
        dense_top1=statistics.fmean(r.top1 for r in linear) if linear else None,
        top1=top1,
        top1_interval=mean_interval([r.pruned_top1 for r in linear]),
        delta_top1=delta_top1,
        delta_top1_interval=_paired(linear, "top1"),
        knn_top1=knn_top1,
        knn_top1_interval=mean_interval([r.pruned_knn_top1 for r in knn]),
        delta_knn_top1=delta_knn_top1,
        delta_knn_top1_interval=_paired(knn, "knn_top1"),
    )


def _means(rows: list, name: str) -> tuple[float | None, float | None]:
    """(mean of the pruned values, mean of pruned minus unpruned) over `rows`; None, None for none."""
    if not rows:
        return None, None
    pruned = [getattr(r, f"pruned_{name}") for r in rows]
    deltas = [p - getattr(r, name) for p, r in zip(pruned, rows)]
    return statistics.fmean(pruned), statistics.fmean(deltas)


def _paired(rows: list, name: str) -> Interval | None:
    return difference_interval(
        {r.seed: getattr(r, f"pruned_{name}") for r in rows},
        {r.seed: getattr(r, name) for r in rows},
    )
