"""Markdown and CSV of the result table (table.py builds the rows; this module only formats them).

The rows are duck-typed (table.TableRow, ScheduleMean, BaselineRow), so this module imports nothing
from table.py.
"""

import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rundir.atomic import atomic_write_text

from .run_logs import KNN_SHOWN_K


def _steps(n: int | None) -> str:
    if n is None:
        return "–"
    return f"{n / 1000:g}k" if n >= 10_000 and n % 100 == 0 else str(n)


def _phase_steps(row) -> str:
    """ "3104 → 4656" (sparse, then dense steps); with a dense warm-up "776 dense, then 2328 →
    4656"."""
    warmup = row.dense_warmup_steps
    if not warmup or row.sparse_steps is None:
        return f"{_steps(row.sparse_steps)} → {_steps(row.dense_steps)}"
    return (
        f"{_steps(warmup)} dense, then {_steps(row.sparse_steps - warmup)} → "
        f"{_steps(row.dense_steps)}"
    )


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "–"
    seconds = round(seconds)  # whole seconds first: 59.7 s must not print as "0 min 60 s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds / 3600:.1f} h"


def _number(value: float | None, fmt: str, suffix: str = "") -> str:
    return "–" if value is None else format(value, fmt) + suffix


def _with_spread(value: float | None, spread: float | None, fmt: str) -> str:
    return _number(value, fmt) + (
        f" ± {spread:.2f}" if spread is not None and value is not None else ""
    )


def _with_interval(text: str, interval, fmt: str) -> str:
    """ "-0.80 [-2.31, +0.71]": a value and its 95% interval, where it has one."""
    if interval is None or text == "–":
        return text
    return f"{text} [{format(interval.low, fmt)}, {format(interval.high, fmt)}]"


def _rate(value: float | None) -> str:
    return _number(value, ",.0f" if value is not None and value >= 100 else ".1f")


def _knn_header(items) -> tuple[str, bool]:
    """The k-NN column header, and whether cells must name their k (the rows were evaluated at
    different k)."""
    ks = {item.knn_k for item in items if item.knn_k is not None}
    if len(ks) > 1:
        return "k-NN top-1 (%)", True
    return f"k-NN top-1 (%, k={ks.pop() if ks else KNN_SHOWN_K})", False


def _knn_cell(item, value: str, name_k: bool) -> str:
    return f"{value} (k={item.knn_k})" if name_k and item.knn_k is not None else value


SAME_TEACHER_HEADER = "Δ top-1 vs dense with the same teacher momentum (pp)"
REFERENCE_HEADER = "Δ top-1 vs the reference (pp)"


def _has_same_teacher(items) -> bool:
    """Whether any row has a dense run with its teacher momentum schedule
    (configurations.same_teacher_key)."""
    return any(item.delta_top1_same_teacher is not None for item in items)


# the columns that measure speed: left out where the runs' speeds do not compare (speed_columns.py)
SPEED_HEADERS = (
    "Images/s, sparse phase",
    "Images/s, dense phase",
    "Training time (sparse + dense)",
    "Speed-up",
    "Images/s, all steps",
)


def _cell(text: str) -> str:
    """A markdown cell: a `|` in a run's name or a config value must not open a column, nor a
    newline a row."""
    return str(text).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


@dataclass(frozen=True)
class Column:
    """One column of a markdown table: its header, a run row's or mean's cell, and a baseline row's
    (baselines are not schedules: only their accuracies apply, "–" elsewhere)."""

    header: str
    cell: Callable[[Any], str]
    baseline: Callable[[Any], str] = lambda b: "–"


def _run_columns(rows, knn_header: str, name_k: bool) -> list[Column]:
    """The run table's columns, left to right; the published and same-teacher columns only where a
    row has them."""
    published = [
        Column("Published top-1 (%)", lambda r: _number(r.published_top1, ".1f")),
        Column("Published Δ (pp)", lambda r: _number(r.published_delta_top1, "+.1f")),
    ]
    same_teacher = [
        Column(SAME_TEACHER_HEADER, lambda r: _number(r.delta_top1_same_teacher, "+.1f"))
    ]
    reference = [Column(REFERENCE_HEADER, lambda r: _number(r.delta_top1_reference, "+.1f"))]

    def knn(item) -> str:
        return _knn_cell(item, _number(item.knn_top1, ".1f"), name_k)

    return [
        Column("Schedule", lambda r: r.schedule, lambda b: f"*{b.label}*"),
        Column("Seed", _seed_cell),
        Column("Sparse → dense steps", _phase_steps),
        Column(
            "Linear top-1 (%)", lambda r: _number(r.top1, ".1f"), lambda b: _number(b.top1, ".1f")
        ),
        Column("Δ top-1 (pp)", lambda r: _number(r.delta_top1, "+.1f")),
        *(published if any(r.published_top1 is not None for r in rows) else []),
        *(same_teacher if _has_same_teacher(rows) else []),
        *(reference if any(r.reference for r in rows) else []),
        Column(knn_header, knn, knn),
        Column("Images/s, sparse phase", lambda r: _rate(r.sparse_images_per_s)),
        Column("Images/s, dense phase", lambda r: _rate(r.dense_images_per_s)),
        Column("Final loss", lambda r: _number(r.final_loss, ".3f")),
        Column("Training time (sparse + dense)", _time_cell),
        Column("Speed-up", lambda r: _number(r.speedup, ".2f", "×")),
        Column(
            "Status",
            lambda r: (
                ", ".join([r.status, *(["screening"] if r.screening else [])])
                + (", reference" if r.reference else "")
            ),
            lambda b: f"baseline, evaluated in {b.run}",
        ),
    ]


def _seed_cell(r) -> str:
    seed = "–" if r.seed is None else str(r.seed)
    return f"{seed} ({r.layout})" if r.layout else seed


def _time_cell(r) -> str:
    time = _duration(r.time_s)
    if r.sparse_time_s and r.dense_time_s:  # both phases ran: show the split
        time += f" ({_duration(r.sparse_time_s)} + {_duration(r.dense_time_s)})"
    return time


def _table_lines(columns: list[Column], body: list[list[str]], speeds: bool) -> list[str]:
    """A markdown table, its speed columns dropped unless `speeds`."""
    keep = [i for i, column in enumerate(columns) if speeds or column.header not in SPEED_HEADERS]
    lines = [
        "| " + " | ".join(columns[i].header for i in keep) + " |",
        "|" + "|".join("---" for _ in keep) + "|",
    ]
    return lines + ["| " + " | ".join(_cell(cells[i]) for i in keep) + " |" for cells in body]


def markdown(rows, means, baselines, notes: list[str], speeds: bool = True, floors=()) -> str:
    knn_header, name_k = _knn_header([*rows, *means, *baselines])
    columns = _run_columns(rows, knn_header, name_k)
    body = [[column.cell(r) for column in columns] for r in rows]
    body += [[column.baseline(b) for column in columns] for b in baselines]
    text = "\n".join(_table_lines(columns, body, speeds)) + "\n\n"
    if means:
        text += means_markdown(means, knn_header, name_k, speeds) + "\n\n"
    if floors:
        text += floor_markdown(floors) + "\n\n"
    text += "\n".join(f"- {n}" for n in notes) + "\n\n## Runs\n\n" + details_markdown(rows, speeds)
    return text + "\n"


def _mean_columns(means, knn_header: str, name_k: bool) -> list[Column]:
    """The per-schedule means' columns, left to right; the same-teacher one only where a mean has
    it."""

    def with_interval(value, spread, interval) -> str:
        return _with_interval(_with_spread(value, spread, ".2f"), interval, ".2f")

    def same_teacher_deltas(m) -> str:
        return (
            f"{_delta(m.delta_top1_same_teacher, m.delta_top1_same_teacher_interval)} / "
            f"{_delta(m.delta_knn_top1_same_teacher, m.delta_knn_top1_same_teacher_interval)}"
        )

    same_teacher = [
        Column("Δ top-1 / k-NN vs dense with the same teacher momentum (pp)", same_teacher_deltas)
    ]

    def reference_deltas(m) -> str:
        return (
            f"{_delta(m.delta_top1_reference, m.delta_top1_reference_interval)} / "
            f"{_delta(m.delta_knn_top1_reference, m.delta_knn_top1_reference_interval)}"
        )

    reference = [Column("Δ top-1 / k-NN vs the reference (pp)", reference_deltas)]
    return [
        Column("Schedule", lambda m: m.schedule),
        Column("Seeds", lambda m: ", ".join("–" if s is None else str(s) for s in m.seeds)),
        Column("n", lambda m: str(m.n_seeds)),
        Column("Linear top-1 (%)", lambda m: with_interval(m.top1, m.top1_spread, m.top1_interval)),
        Column("Δ top-1 (pp)", lambda m: _delta(m.delta_top1, m.delta_top1_interval)),
        Column(
            knn_header,
            lambda m: _knn_cell(
                m, with_interval(m.knn_top1, m.knn_top1_spread, m.knn_top1_interval), name_k
            ),
        ),
        Column("Δ k-NN (pp)", lambda m: _delta(m.delta_knn_top1, m.delta_knn_top1_interval)),
        *(same_teacher if _has_same_teacher(means) else []),
        *(reference if any(m.delta_top1_reference is not None for m in means) else []),
        Column("Images/s, sparse phase", lambda m: _rate(m.sparse_images_per_s)),
        Column("Images/s, dense phase", lambda m: _rate(m.dense_images_per_s)),
        Column("Final loss", lambda m: _number(m.final_loss, ".3f")),
    ]


def means_markdown(means, knn_header: str, name_k: bool, speeds: bool = True) -> str:
    columns = _mean_columns(means, knn_header, name_k)
    body = [[column.cell(m) for column in columns] for m in means]
    return "\n".join(
        [
            "## Per schedule, over seeds (mean ± half the range [95% interval])",
            "",
            *_table_lines(columns, body, speeds),
        ]
    )


def _delta(value: float | None, interval) -> str:
    return _with_interval(_number(value, "+.2f"), interval, "+.2f")


FLOOR_TITLE = "## The one-shot 2:4 floor: dense runs pruned once after training, no fine-tuning"


def floor_markdown(floors) -> str:
    """The dense configurations' one-shot floors (reporting/floor.py): mean [95% interval], Δ
    against the same runs unpruned, paired by seed."""

    def mean_cell(value, interval) -> str:
        return _with_interval(_number(value, ".2f"), interval, ".2f")

    columns = [
        Column("Dense configuration", lambda f: f.schedule),
        Column("Seeds", lambda f: ", ".join("–" if s is None else str(s) for s in f.seeds)),
        Column("Linear top-1, dense (%)", lambda f: _number(f.dense_top1, ".2f")),
        Column("Linear top-1, MLPs pruned 2:4 (%)", lambda f: mean_cell(f.top1, f.top1_interval)),
        Column("Δ top-1 (pp)", lambda f: _delta(f.delta_top1, f.delta_top1_interval)),
        Column(
            "k-NN top-1, MLPs pruned 2:4 (%)", lambda f: mean_cell(f.knn_top1, f.knn_top1_interval)
        ),
        Column("Δ k-NN (pp)", lambda f: _delta(f.delta_knn_top1, f.delta_knn_top1_interval)),
    ]
    body = [[column.cell(f) for column in columns] for f in floors]
    return "\n".join(
        [
            FLOOR_TITLE,
            "",
            *_table_lines(columns, body, speeds=False),
            "",
            "What 2:4 MLPs cost a network trained dense, with no 2:4 training at all: the bound a fully "
            "sparse row is read against, since no dense phase follows its sparse one. Each dense run's "
            "final teacher probed with its MLPs pruned 2:4 (eval_linear.py prune_mlp=true, "
            "eval_linear_pruned_mlp.json); Δ: against the same runs unpruned, paired by seed.",
        ]
    )


def details_markdown(rows, speeds: bool = True) -> str:
    columns = [
        Column("Run", lambda r: r.run),
        Column("Steps done", lambda r: f"{r.steps_done} of {_steps(r.total_steps)}"),
        Column("Images/s, all steps", lambda r: _rate(r.images_per_s)),
        Column("Top-5 (%)", lambda r: _number(r.top5, ".1f")),
        Column(
            "k-NN top-1 by k", lambda r: ", ".join(f"{k}: {v:.1f}" for k, v in r.knn.items()) or "–"
        ),
        Column("Probe C", lambda r: _number(r.best_C, ".3g")),
        Column("Eval time", lambda r: _duration(r.eval_seconds)),
    ]
    return "\n".join(
        _table_lines(columns, [[column.cell(r) for column in columns] for r in rows], speeds)
    )


# kind: run (one training run) | schedule mean (over its seeds) | baseline (random-init network, raw
# pixels). After "schedule" (the row's label) come the config keys that differ between the rows, one
# column each; at the end the k-NN top-1 per k.
CSV_FIELDS = [
    "kind",
    "run",
    "schedule",
    "status",
    "screening",
    "sparse_fraction",
    "seed",
    "layout",
    "n_seeds",
    "sparse_steps",
    "dense_steps",
    "total_steps",
    "steps_done",
    "top1",
    "top1_spread",
    "top1_low",
    "top1_high",
    "top5",
    "delta_top1",
    "delta_top1_low",
    "delta_top1_high",
    "delta_top1_interval",
    "knn_top1",
    "knn_k",
    "knn_top1_spread",
    "knn_top1_low",
    "knn_top1_high",
    "delta_knn_top1",
    "delta_knn_top1_low",
    "delta_knn_top1_high",
    "delta_top1_same_teacher",
    "delta_top1_same_teacher_low",
    "delta_top1_same_teacher_high",
    "delta_knn_top1_same_teacher",
    "reference",
    "delta_top1_reference",
    "delta_top1_reference_low",
    "delta_top1_reference_high",
    "delta_knn_top1_reference",
    "delta_knn_top1_reference_low",
    "delta_knn_top1_reference_high",
    "time_s",
    "sparse_time_s",
    "dense_time_s",
    "images_per_s",
    "sparse_images_per_s",
    "dense_images_per_s",
    "speedup",
    "final_loss",
    "best_C",
    "eval_seconds",
    "published_top1",
    "published_delta_top1",
    "published_schedule",
    "path",
]


def write_csv(rows, means, baselines, path: Path, floors=()) -> None:
    """One line per run, then per schedule mean (spread: half the range over seeds; _low/_high: the
    95% interval), then per baseline, then per one-shot floor (top1, knn_top1: the pruned probe;
    delta_*: against the same runs unpruned)."""
    knn_ks = sorted({k for item in [*rows, *baselines] for k in item.knn})
    config_keys = list(
        dict.fromkeys(key for item in [*rows, *means] for key in item.differing_config)
    )
    lines = []
    for r in rows:
        lines.append({**vars(r), "kind": "run", **{f"knn_top1_k{k}": r.knn.get(k) for k in knn_ks}})
    for m in means:
        lines.append(
            {
                **vars(m),
                **_interval_columns(m),
                "kind": "schedule mean",
                "run": ", ".join(m.runs),
                "status": "",
                "seed": " ".join("–" if s is None else str(s) for s in m.seeds),
            }
        )
    for b in baselines:
        lines.append(
            {
                **vars(b),
                "kind": "baseline",
                "schedule": b.label,
                "status": f"baseline from {b.run}",
                "run": f"{b.key} ({b.run})",
                **{f"knn_top1_k{k}": b.knn.get(k) for k in knn_ks},
            }
        )
    for f in floors:
        lines.append(
            {
                **vars(f),
                **_interval_columns(f, FLOOR_INTERVALS),
                "kind": "one-shot floor",
                "run": ", ".join(f.runs),
                "seed": " ".join("–" if s is None else str(s) for s in f.seeds),
                "n_seeds": len(f.seeds),
            }
        )
    at = CSV_FIELDS.index("schedule") + 1
    fields = CSV_FIELDS[:at] + config_keys + CSV_FIELDS[at:] + [f"knn_top1_k{k}" for k in knn_ks]
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for line in lines:
        config = line.get("differing_config") or {}
        writer.writerow(
            {
                name: _config_cell(config[name]) if name in config else _csv_value(line.get(name))
                for name in fields
            }
        )
    atomic_write_text(path, text.getvalue())


# the 95% intervals a schedule mean carries, and those of a one-shot floor
MEAN_INTERVALS = (
    "top1",
    "knn_top1",
    "delta_top1",
    "delta_knn_top1",
    "delta_top1_same_teacher",
    "delta_top1_reference",
    "delta_knn_top1_reference",
)
FLOOR_INTERVALS = ("top1", "knn_top1", "delta_top1", "delta_knn_top1")


def _interval_columns(item, names=MEAN_INTERVALS) -> dict:
    """<name>_low / <name>_high of each 95% interval `names` of a schedule mean or floor (blank where
    it has none), and how the Δ's interval was taken (paired t, Welch t)."""
    columns = {}
    for name in names:
        interval = getattr(item, f"{name}_interval")
        columns[f"{name}_low"] = interval.low if interval else None
        columns[f"{name}_high"] = interval.high if interval else None
    columns["delta_top1_interval"] = (
        item.delta_top1_interval.method if item.delta_top1_interval else None
    )
    return columns


def _config_cell(value) -> str:
    return "" if value is None else config_value(value)


def config_value(value) -> str:
    """A config value as the row labels and the CSV show it: floats in their shortest exact form
    (1e-05, 0.004, not rounded: two different values never print alike), booleans as YAML writes
    them."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(config_value(v) for v in value) + "]"
    return repr(value) if isinstance(value, float) else str(value)


def _csv_value(value):
    if value is None:
        return ""
    return round(value, 4) if isinstance(value, float) else value
