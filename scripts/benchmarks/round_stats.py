"""Round-by-round statistics of `bench_train_step`'s rows, with 95% intervals over the rounds.

With `--rounds N` the rows take turns N times, so each round holds one median per row, measured under the
same clock and heat as its neighbours. Two figures come from them:

- a row's **speed ratio**: its mode's dense row over the row, in each round (`stepgraph-dense` over
  `stepgraph-auto`; an ablation row over the dense row under the same ablation, so that
  `stepgraph-auto, attention-per-crop` is against `stepgraph-dense, attention-per-crop`);
- an ablation's **saving**: the mean of the rows run just before and just after it (the row itself and
  `<row> (again after <ablation>)`; `<row> (again)` in files of one ablation) minus the ablation row,
  in ms a step.

Each is summarised as the mean over rounds with Student's t interval, and rounds of several benchmark
files pool where the same row names recur (one GPU's rounds beside another's)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from reporting.intervals import mean_interval

AGAIN = " (again"  # "(again after <ablation>)", or "(again)" in files of one ablation


def again_label(row: str, ablation: str) -> str:
    """The label of `row` run again right after `ablation`: one per ablation, so that each round
    holds one of each."""
    return f"{row} (again after {ablation})"


def round_ms(row: dict) -> list[float]:
    """The row's median ms of each round (a one-round row: its median)."""
    return [r["ms"] for r in row.get("rounds", [])] or [row["ms"]]


def _ablation_of(name: str) -> tuple[str, str] | None:
    """("stepgraph-auto", "attention-per-crop") for "stepgraph-auto, attention-per-crop"."""
    base, sep, ablation = name.partition(", ")
    return (base, ablation) if sep else None


def dense_row_name(name: str) -> str:
    """The dense row of `name`'s compile mode: "stepgraph-dense" for "stepgraph-auto+teacher" and
    for "stepgraph-auto, attention-per-crop"."""
    return name.split("-")[0] + "-dense"


def is_dense_row(name: str) -> bool:
    return name.endswith("-dense")


def ratio_rounds(rows: list[dict]) -> dict[str, list[float]]:
    """Each non-dense row's dense-over-row ratio, round by round, against the dense row of its mode
    (under the same ablation for an ablation row); rows without that dense row are left out."""
    by_name = {r["row"]: round_ms(r) for r in rows}
    out = {}
    for name, ms in by_name.items():
        if AGAIN in name:
            continue
        ablated = _ablation_of(name)
        base = ablated[0] if ablated else name
        if is_dense_row(base):
            continue
        dense = dense_row_name(base) + (f", {ablated[1]}" if ablated else "")
        if dense in by_name and len(by_name[dense]) == len(ms):
            out[name] = [d / s for d, s in zip(by_name[dense], ms)]
    return out


def saving_rounds(rows: list[dict]) -> dict[str, list[float]]:
    """Each ablation row's ms a step saved, round by round: the mean of its row and that row's run
    right after it minus the ablation row (positive: the ablation is faster)."""
    by_name = {r["row"]: round_ms(r) for r in rows}
    out = {}
    for name, ms in by_name.items():
        ablated = _ablation_of(name)
        if not ablated or AGAIN in name:
            continue
        base, ablation = ablated
        before = by_name.get(base)
        after = by_name.get(again_label(base, ablation), by_name.get(f"{base} (again)"))
        if before and after and len(before) == len(after) == len(ms):
            out[name] = [(b + a) / 2 - x for b, a, x in zip(before, after, ms)]
    return out


def summary(values: list[float]) -> dict:
    """Mean over the rounds with its 95% t interval (None with one round)."""
    interval = mean_interval(values)
    return {
        "rounds": len(values),
        "mean": statistics.fmean(values),
        "low": interval.low if interval else None,
        "high": interval.high if interval else None,
        "each": values,
    }


def round_stats(results: Iterable[dict]) -> dict[str, dict[str, dict]]:
    """{"ratio": {row: summary}, "saving_ms": {row: summary}} over the rounds of every benchmark
    result given (a `bench_train_step` JSON each), pooled by row name."""
    ratios: dict[str, list[float]] = {}
    savings: dict[str, list[float]] = {}
    for result in results:
        for name, values in ratio_rounds(result["rows"]).items():
            ratios.setdefault(name, []).extend(values)
        for name, values in saving_rounds(result["rows"]).items():
            savings.setdefault(name, []).extend(values)
    return {
        "ratio": {k: summary(v) for k, v in ratios.items()},
        "saving_ms": {k: summary(v) for k, v in savings.items()},
    }


def format_round_stats(stats: dict[str, dict[str, dict]]) -> list[str]:
    """Lines for a terminal: one a ratio, one a saving."""

    def interval(s: dict, fmt: str) -> str:
        if s["low"] is None:
            return "one round: no interval"
        return f"95% interval {s['low']:{fmt}} to {s['high']:{fmt}}"

    lines = []
    for name, s in stats["ratio"].items():
        each = ", ".join(f"{v:.3f}" for v in s["each"])
        lines.append(
            f"  {name}: {s['mean']:.4f}x over {s['rounds']} rounds ({interval(s, '.4f')}); "
            f"rounds {each}"
        )
    for name, s in stats["saving_ms"].items():
        each = ", ".join(f"{v:+.2f}" for v in s["each"])
        lines.append(
            f"  {name}: saves {s['mean']:+.2f} ms a step over {s['rounds']} rounds "
            f"({interval(s, '+.2f')}); rounds {each}"
        )
    return lines
