"""The result table of a sparse-then-dense study: one row per run, shaped like the published 2:4 DINOv2 table.

`make_table(run_dirs, out)` writes `table.md`, `table.csv`, `summary.json` and the plots. Every run given appears,
whatever its state (complete, no eval, partial, failed, missing). Deltas and speed-ups are taken against the dense
(sparse fraction 0) run of the same setting (architecture, patch, dataset, total steps); for the ViT-L/16 ImageNet
setting the published numbers sit next to ours.
"""

import csv
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

from .run_logs import COMPLETE, KNN_SHOWN_K, RunSummary, find_run_dirs, read_run

# torchao's sparse-training README (DINOv2 ViT-L/16, ImageNet-1k, 125k steps, 4x A100): ImageNet-1k top-1 of the
# linear probe. Note the "40%" row ran 40k of 125k steps 2:4-sparse (32%).
PUBLISHED_SOURCE = "DINOv2 ViT-L/16 on ImageNet-1k, 125k steps (torchao sparse-training README)"
PUBLISHED_TOTAL_STEPS = 125_000


@dataclass(frozen=True)
class PublishedRow:
    label: str
    fraction: float  # as the row is labelled
    sparse_steps: int
    top1: float

    @property
    def step_fraction(self) -> float:
        return self.sparse_steps / PUBLISHED_TOTAL_STEPS


PUBLISHED = (
    PublishedRow("0% sparse (dense baseline)", 0.0, 0, 82.8),
    PublishedRow("40% sparse", 0.4, 40_000, 82.9),
    PublishedRow("60% sparse", 0.6, 75_000, 82.8),
    PublishedRow("70% sparse", 0.7, 87_500, 82.7),
    PublishedRow("80% sparse", 0.8, 100_000, 82.7),
    PublishedRow("90% sparse", 0.9, 112_500, 82.0),
    PublishedRow("100% sparse (2:4-sparse model)", 1.0, 125_000, 82.3),
)
PUBLISHED_DENSE_TOP1 = PUBLISHED[0].top1


def is_published_setting(run: RunSummary) -> bool:
    """The configuration behind the published table: ViT-L/16 pre-trained on ImageNet."""
    return run.arch == "vit_large" and run.patch_size == 16 and run.dataset == "imagenet_folder"


def published_row_for(run: RunSummary) -> Optional[PublishedRow]:
    """The published row with the same schedule: the same share of sparse steps, or the same label (the "40%" row
    ran 32%; a run with sparse_fraction 0.32 or 0.4 is compared with it)."""
    if not is_published_setting(run) or run.sparse_fraction is None:
        return None
    fraction = run.sparse_steps / run.total_steps if run.total_steps else run.sparse_fraction
    for row in PUBLISHED:
        if math.isclose(fraction, row.step_fraction, abs_tol=1e-6) or math.isclose(
                run.sparse_fraction, row.fraction, abs_tol=1e-6):
            return row
    return None


@dataclass
class TableRow:
    """One run as the table shows it; `None` = not available (rendered as a dash)."""

    run: str
    schedule: str
    status: str
    sparse_fraction: Optional[float]
    sparse_steps: Optional[int]
    dense_steps: Optional[int]
    total_steps: Optional[int]
    steps_done: int
    top1: Optional[float]
    top5: Optional[float]
    knn_top1: Optional[float]
    delta_top1: Optional[float]  # pp vs the dense run of the same setting
    delta_knn_top1: Optional[float]
    time_s: Optional[float]
    sparse_time_s: Optional[float]
    dense_time_s: Optional[float]
    images_per_s: Optional[float]
    sparse_images_per_s: Optional[float]
    dense_images_per_s: Optional[float]
    speedup: Optional[float]  # dense seconds per step / this run's seconds per step
    final_loss: Optional[float]
    best_C: Optional[float]
    eval_seconds: Optional[float]
    knn: dict
    published_top1: Optional[float] = None
    published_delta_top1: Optional[float] = None
    published_schedule: str = ""
    path: str = ""


def schedule_label(fraction: Optional[float]) -> str:
    if fraction is None:
        return "unknown schedule"
    label = f"{fraction * 100:g}% sparse"
    if fraction == 0.0:
        return label + " (dense baseline)"
    return label + " (2:4-sparse model)" if fraction == 1.0 else label


def _setting(run: RunSummary) -> tuple:
    return run.arch, run.patch_size, run.dataset, run.total_steps


def dense_references(runs: list[RunSummary]) -> dict[tuple, RunSummary]:
    """Per setting, the dense run the others are compared with: fully trained, evaluated if any is."""
    references: dict[tuple, RunSummary] = {}
    for run in runs:
        if run.sparse_fraction != 0.0 or run.train_status != COMPLETE:
            continue
        current = references.get(_setting(run))
        if current is None or (current.top1 is None and run.top1 is not None):
            references[_setting(run)] = run
    return references


def _difference(value: Optional[float], reference: Optional[float]) -> Optional[float]:
    return None if value is None or reference is None else value - reference


def build_rows(runs: list[RunSummary]) -> list[TableRow]:
    references = dense_references(runs)
    rows = []
    for run in runs:
        dense = references.get(_setting(run))
        dense_rate = dense.seconds_per_step if dense else None
        speedup = dense_rate / run.seconds_per_step if dense_rate and run.seconds_per_step else None
        published = published_row_for(run)
        rows.append(TableRow(
            run=run.name, schedule=schedule_label(run.sparse_fraction), status=run.status,
            sparse_fraction=run.sparse_fraction, sparse_steps=run.sparse_steps, dense_steps=run.dense_steps,
            total_steps=run.total_steps, steps_done=run.steps_done, top1=run.top1, top5=run.top5,
            knn_top1=run.knn_top1, delta_top1=_difference(run.top1, dense.top1 if dense else None),
            delta_knn_top1=_difference(run.knn_top1, dense.knn_top1 if dense else None),
            time_s=run.time_s, sparse_time_s=run.sparse_time_s, dense_time_s=run.dense_time_s,
            images_per_s=run.images_per_s, sparse_images_per_s=run.sparse_images_per_s,
            dense_images_per_s=run.dense_images_per_s, speedup=speedup, final_loss=run.final_loss, best_C=run.best_C,
            eval_seconds=run.eval_seconds, knn=dict(sorted(run.knn.items())),
            published_top1=published.top1 if published else None,
            published_delta_top1=published.top1 - PUBLISHED_DENSE_TOP1 if published else None,
            published_schedule=f"{published.label}: {published.sparse_steps:,} of {PUBLISHED_TOTAL_STEPS:,} steps "
                               "sparse" if published else "",
            path=run.path,
        ))
    return sorted(rows, key=lambda r: (r.sparse_fraction is None, r.sparse_fraction or 0.0, r.run))


# ------------------------------------------------------------------------------------------------ formatting
def _steps(n: Optional[int]) -> str:
    if n is None:
        return "–"
    return f"{n / 1000:g}k" if n >= 10_000 and n % 100 == 0 else str(n)


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "–"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds / 3600:.1f} h"


def _number(value: Optional[float], fmt: str, suffix: str = "") -> str:
    return "–" if value is None else format(value, fmt) + suffix


def markdown(rows: list[TableRow], notes: list[str]) -> str:
    with_published = any(r.published_top1 is not None for r in rows)
    header = ["Schedule", "Sparse → dense steps", "Top-1 (%)", "Δ top-1 (pp)", f"k-NN top-1 (%, k={KNN_SHOWN_K})",
              "Training time (sparse + dense)", "Speed-up", "Status"]
    if with_published:
        header[4:4] = ["Published top-1 (%)", "Published Δ (pp)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        time = _duration(r.time_s)
        if r.sparse_time_s and r.dense_time_s:  # both phases ran: show the split
            time += f" ({_duration(r.sparse_time_s)} + {_duration(r.dense_time_s)})"
        cells = [r.schedule, f"{_steps(r.sparse_steps)} → {_steps(r.dense_steps)}", _number(r.top1, ".1f"),
                 _number(r.delta_top1, "+.1f"), _number(r.knn_top1, ".1f"), time, _number(r.speedup, ".2f", "×"),
                 r.status]
        if with_published:
            cells[4:4] = [_number(r.published_top1, ".1f"), _number(r.published_delta_top1, "+.1f")]
        lines.append("| " + " | ".join(cells) + " |")
    details = ["| Run | Steps done | Final loss | Images/s (sparse / dense phase) | Top-5 (%) | k-NN top-1 by k | "
               "Probe C | Eval time |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        knn = ", ".join(f"{k}: {v:.1f}" for k, v in r.knn.items()) or "–"
        details.append(f"| {r.run} | {r.steps_done} of {_steps(r.total_steps)} | {_number(r.final_loss, '.3f')} | "
                       f"{_number(r.images_per_s, '.1f')} ({_number(r.sparse_images_per_s, '.1f')} / "
                       f"{_number(r.dense_images_per_s, '.1f')}) | {_number(r.top5, '.1f')} | {knn} | "
                       f"{_number(r.best_C, '.3g')} | {_duration(r.eval_seconds)} |")
    text = "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n\n## Runs\n\n" + "\n".join(details)
    if not with_published:
        text += "\n\n" + published_markdown()
    return text + "\n"


def published_markdown() -> str:
    lines = [f"## Published reference, a different setting: {PUBLISHED_SOURCE}", "",
             "| Schedule | Sparse → dense steps | Top-1 (%) | Δ top-1 (pp) |", "|---|---|---|---|"]
    for row in PUBLISHED:
        dense_steps = PUBLISHED_TOTAL_STEPS - row.sparse_steps
        lines.append(f"| {row.label} | {_steps(row.sparse_steps)} → {_steps(dense_steps)} | {row.top1:.1f} | "
                     f"{row.top1 - PUBLISHED_DENSE_TOP1:+.1f} |")
    return "\n".join(lines)


CSV_FIELDS = ["run", "schedule", "status", "sparse_fraction", "sparse_steps", "dense_steps", "total_steps",
              "steps_done", "top1", "top5", "delta_top1", "knn_top1", "delta_knn_top1", "time_s", "sparse_time_s",
              "dense_time_s", "images_per_s", "sparse_images_per_s", "dense_images_per_s", "speedup", "final_loss",
              "best_C", "eval_seconds", "published_top1", "published_delta_top1", "published_schedule", "path"]


def write_csv(rows: list[TableRow], path: Path, knn_ks: list[int]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_FIELDS + [f"knn_top1_k{k}" for k in knn_ks])
        for r in rows:
            values = [getattr(r, name) for name in CSV_FIELDS] + [r.knn.get(k) for k in knn_ks]
            writer.writerow("" if v is None else round(v, 4) if isinstance(v, float) else v for v in values)


def table_notes(runs: list[RunSummary], rows: list[TableRow]) -> list[str]:
    notes = [f"Top-1: linear probe on frozen teacher features (eval_linear.py); k-NN: cosine, T=0.07, k={KNN_SHOWN_K}."
             " Δ and speed-up: against the dense (0% sparse) run of the same setting.",
             "Training time: summed step time from metrics.jsonl (images/s per logged window), without start-up "
             "and evaluation; speed-up = dense seconds per step / this run's seconds per step."]
    if not dense_references(runs):
        notes.append("No complete dense (0% sparse) run among these runs: Δ and speed-up are left blank.")
    if any(r.published_top1 is not None for r in rows):
        notes.append(f"Published: {PUBLISHED_SOURCE}. Its \"40% sparse\" row ran 40k of 125k steps sparse (32%); "
                     "runs with sparse_fraction 0.4 (50k steps) or 0.32 are both compared with it.")
    sizes = sorted({r.n_val for r in runs if r.n_val})
    if len(sizes) == 1:  # how much one image moves top-1: the scale for reading small deltas
        notes.append(f"Validation split: {sizes[0]} images, so one image is {100.0 / sizes[0]:.2f} pp of top-1; "
                     "one seed per schedule.")
    incomplete = [r.run for r in rows if r.status != COMPLETE]
    if incomplete:
        notes.append("Not complete (see Status): " + ", ".join(incomplete) + ".")
    return notes


def make_table(run_paths: list[Path], out: Path, plots: bool = True, extra_notes: Sequence[str] = ()) -> list[Path]:
    """Read the runs under `run_paths` and write the table, CSV, JSON summary and (unless `plots` is False) the
    plots into `out`; returns the paths written. `extra_notes` are added to the table's notes."""
    runs = [read_run(path) for path in find_run_dirs(run_paths)]
    rows = build_rows(runs)
    notes = table_notes(runs, rows) + list(extra_notes)
    knn_ks = sorted({k for r in rows for k in r.knn})
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "table.md", out / "table.csv", out / "summary.json", out / "top1_vs_sparsity.png",
             out / "loss_curves.png"]
    paths[0].write_text("# Sparse-then-dense schedules\n\n" + markdown(rows, notes))
    write_csv(rows, paths[1], knn_ks)
    summary = {"rows": [asdict(r) for r in rows], "notes": notes,
               "published": {"source": PUBLISHED_SOURCE, "total_steps": PUBLISHED_TOTAL_STEPS,
                             "rows": [asdict(p) for p in PUBLISHED]}}
    paths[2].write_text(json.dumps(summary, indent=2) + "\n")
    if not plots:
        return paths[:3]
    from .plots import plot_accuracy, plot_losses  # matplotlib only when plotting

    plot_accuracy(rows, paths[3])
    by_fraction = sorted(runs, key=lambda r: (r.sparse_fraction is None, r.sparse_fraction or 0.0, r.name))
    plot_losses([r for r in by_fraction if r.loss_curve], paths[4])
    return paths
