"""The result table of a sparse-then-dense study: one row per run, shaped like the published 2:4 DINOv2 table.

`make_table(run_dirs, out)` writes `table.md`, `table.csv`, `summary.json` and the plots. Every run given appears,
whatever its state (complete, no eval, partial, failed, missing). Deltas and speed-ups are taken against the dense
(sparse fraction 0) run of the same setting (architecture, patch, dataset, total steps) and the same seed where
there is one. Where a schedule ran with several seeds, a second table gives its mean and spread over seeds; the
baselines (untrained network, raw pixels) follow the runs. For the ViT-L/16 ImageNet setting the published numbers
sit next to ours, otherwise in a section of their own.
"""

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from . import published
from .intervals import wilson_interval
from .run_logs import COMPLETE, RunSummary, find_run_dirs, read_run
from .table_format import markdown, write_csv

BASELINE_LABELS = {"random_init": "random-init network", "pixels": "raw pixels (logistic regression)"}
ARCH_NAMES = {"vit_tiny": "ViT-Ti", "vit_small": "ViT-S", "vit_base": "ViT-B", "vit_large": "ViT-L"}


def is_published_setting(run: RunSummary) -> bool:
    """The configuration behind the published table: ViT-L/16 pre-trained on ImageNet."""
    return run.arch == "vit_large" and run.patch_size == 16 and run.dataset == "imagenet_folder"


def published_row_for(run: RunSummary) -> Optional[published.PublishedRow]:
    """The published row with the same schedule: the same share of sparse steps, or the same label (the "40%" row
    ran 32%; a run with sparse_fraction 0.32 or 0.4 is compared with it)."""
    if not is_published_setting(run) or run.sparse_fraction is None:
        return None
    fraction = run.sparse_steps / run.total_steps if run.total_steps else run.sparse_fraction
    for row in published.ROWS:
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
    seed: Optional[int]
    sparse_steps: Optional[int]
    dense_steps: Optional[int]
    total_steps: Optional[int]
    steps_done: int
    top1: Optional[float]
    top5: Optional[float]
    knn_top1: Optional[float]
    knn_k: Optional[int]
    delta_top1: Optional[float]  # pp vs the dense run of the same setting (and seed, where there is one)
    delta_knn_top1: Optional[float]
    time_s: Optional[float]
    sparse_time_s: Optional[float]
    dense_time_s: Optional[float]
    images_per_s: Optional[float]  # all timed steps
    sparse_images_per_s: Optional[float]  # median of the phase's windows, its first window left out
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
    n_val: Optional[int] = None  # validation images behind top-1 and k-NN top-1


@dataclass
class ScheduleMean:
    """One schedule over its complete runs (seeds): mean and spread = half the range, (max - min) / 2."""

    schedule: str
    sparse_fraction: float
    seeds: list
    runs: list
    top1: Optional[float]
    top1_spread: Optional[float]  # None with fewer than two values
    knn_top1: Optional[float]
    knn_top1_spread: Optional[float]
    delta_top1: Optional[float]  # mean minus the dense schedule's mean
    delta_knn_top1: Optional[float]
    sparse_images_per_s: Optional[float]
    dense_images_per_s: Optional[float]
    final_loss: Optional[float]
    knn_k: Optional[int] = None


@dataclass
class BaselineRow:
    """An evaluation that is not a schedule: the untrained network or raw pixels, on the runs' data."""

    key: str  # random_init | pixels
    label: str
    run: str  # the run it was found in
    top1: Optional[float]
    top5: Optional[float]
    knn_top1: Optional[float]
    knn_k: Optional[int]
    best_C: Optional[float]
    knn: dict = field(default_factory=dict)
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
    """Per (setting, seed) and per (setting, None) = lowest seed: the dense run the others are compared with, fully
    trained, evaluated if any is."""
    references: dict[tuple, RunSummary] = {}
    ordered = sorted(runs, key=lambda r: (r.seed is None, r.seed or 0, r.name))
    for run in ordered:
        if run.sparse_fraction != 0.0 or run.train_status != COMPLETE:
            continue
        for key in ((_setting(run), run.seed), (_setting(run), None)):
            current = references.get(key)
            if current is None or (current.top1 is None and run.top1 is not None):
                references[key] = run
    return references


def setting_label(runs: list[RunSummary]) -> str:
    """"ViT-S/4, cifar10, 9,700 steps" when every run read has the same setting, else ""."""
    settings = {(r.arch, r.patch_size, r.dataset, r.data_root, r.total_steps) for r in runs if r.arch}
    if len(settings) != 1:
        return ""
    arch, patch, dataset, root, steps = settings.pop()
    data = "digits" if dataset == "digits" else Path(root.rstrip("/")).name or dataset
    return f"{ARCH_NAMES.get(arch, arch)}/{patch}, {data}, {steps:,} steps"


def _difference(value: Optional[float], reference: Optional[float]) -> Optional[float]:
    return None if value is None or reference is None else value - reference


def build_rows(runs: list[RunSummary]) -> list[TableRow]:
    references = dense_references(runs)
    rows = []
    for run in runs:
        dense = references.get((_setting(run), run.seed)) or references.get((_setting(run), None))
        dense_rate = dense.seconds_per_step if dense else None
        speedup = dense_rate / run.seconds_per_step if dense_rate and run.seconds_per_step else None
        pub = published_row_for(run)
        rows.append(TableRow(
            run=run.name, schedule=schedule_label(run.sparse_fraction), status=run.status,
            sparse_fraction=run.sparse_fraction, seed=run.seed, sparse_steps=run.sparse_steps,
            dense_steps=run.dense_steps, total_steps=run.total_steps, steps_done=run.steps_done, top1=run.top1,
            top5=run.top5, knn_top1=run.knn_top1, knn_k=run.knn_k,
            delta_top1=_difference(run.top1, dense.top1 if dense else None),
            delta_knn_top1=_difference(run.knn_top1, dense.knn_top1 if dense else None),
            time_s=run.time_s, sparse_time_s=run.sparse_time_s, dense_time_s=run.dense_time_s,
            images_per_s=run.images_per_s, sparse_images_per_s=run.sparse_images_per_s,
            dense_images_per_s=run.dense_images_per_s, speedup=speedup, final_loss=run.final_loss, best_C=run.best_C,
            eval_seconds=run.eval_seconds, knn=dict(sorted(run.knn.items())),
            published_top1=pub.top1 if pub else None, published_delta_top1=pub.delta_top1 if pub else None,
            published_schedule=f"{pub.label}: {pub.sparse_steps:,} of {published.TOTAL_STEPS:,} steps sparse"
                               if pub else "",
            path=run.path, n_val=run.n_val,
        ))
    return sorted(rows, key=lambda r: (r.sparse_fraction is None, r.sparse_fraction or 0.0, r.seed or 0, r.run))


def mean_and_half_range(values: list) -> tuple[Optional[float], Optional[float]]:
    """(mean, (max - min) / 2) of the values that are not None; the half range needs two values."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None, None
    return statistics.fmean(values), (max(values) - min(values)) / 2 if len(values) > 1 else None


def schedule_means(rows: list[TableRow]) -> list[ScheduleMean]:
    """Per sparse fraction, over its complete runs (one per seed)."""
    groups: dict[float, list[TableRow]] = {}
    for row in rows:
        if row.status == COMPLETE and row.sparse_fraction is not None:
            groups.setdefault(row.sparse_fraction, []).append(row)
    means = []
    for fraction, group in sorted(groups.items()):
        top1, top1_spread = mean_and_half_range([r.top1 for r in group])
        knn, knn_spread = mean_and_half_range([r.knn_top1 for r in group])
        ks = {r.knn_k for r in group if r.knn_k is not None}
        means.append(ScheduleMean(
            schedule=schedule_label(fraction), sparse_fraction=fraction, seeds=[r.seed for r in group],
            runs=[r.run for r in group], top1=top1, top1_spread=top1_spread, knn_top1=knn, knn_top1_spread=knn_spread,
            delta_top1=None, delta_knn_top1=None,
            sparse_images_per_s=mean_and_half_range([r.sparse_images_per_s for r in group])[0],
            dense_images_per_s=mean_and_half_range([r.dense_images_per_s for r in group])[0],
            final_loss=mean_and_half_range([r.final_loss for r in group])[0],
            knn_k=ks.pop() if len(ks) == 1 else None))
    dense = next((m for m in means if m.sparse_fraction == 0.0), None)
    for m in means:
        m.delta_top1 = _difference(m.top1, dense.top1 if dense else None)
        m.delta_knn_top1 = _difference(m.knn_top1, dense.knn_top1 if dense else None)
    return means


def baseline_rows(runs: list[RunSummary]) -> list[BaselineRow]:
    """Each baseline once, from the dense lowest-seed run if it has it, else from the first run that does."""
    preferred = sorted(runs, key=lambda r: (r.sparse_fraction != 0.0, r.seed is None, r.seed or 0, r.name))
    rows = []
    for key, label in BASELINE_LABELS.items():
        found = next(((run, run.baselines[key]) for run in preferred if key in run.baselines), None)
        if found:
            run, record = found
            rows.append(BaselineRow(key=key, label=label, run=run.name, top1=record.top1, top5=record.top5,
                                    knn_top1=record.knn_top1, knn_k=record.knn_k, best_C=record.best_C,
                                    knn=dict(sorted(record.knn.items())), path=record.path))
    return rows


def table_notes(runs: list[RunSummary], rows: list[TableRow], means: list[ScheduleMean]) -> list[str]:
    notes = ["Top-1: linear probe on frozen teacher features (eval_linear.py); k-NN: cosine, T=0.07. Δ and speed-up: "
             "against the dense (0% sparse) run of the same setting and seed (the lowest seed's where that seed has "
             "no dense run).",
             "Images/s per phase: median over the phase's logged windows, leaving out its first window (and the "
             "first after a resume), which hold compilation and warm-up. Training time: summed step time from "
             "metrics.jsonl, all windows, without start-up and evaluation; speed-up = dense seconds per step / this "
             "run's seconds per step."]
    if not any(r.sparse_fraction == 0.0 and r.train_status == COMPLETE for r in runs):
        notes.append("No complete dense (0% sparse) run among these runs: Δ and speed-up are left blank.")
    if any(r.published_top1 is not None for r in rows):
        notes.append(f"Published: {published.SOURCE}. Its \"40% sparse\" row ran 40k of 125k steps sparse (32%); "
                     "runs with sparse_fraction 0.4 (50k steps) or 0.32 are both compared with it.")
    seeded = [m for m in means if len(m.runs) > 1]
    sizes = sorted({r.n_val for r in runs if r.n_val})
    if len(sizes) == 1:  # how much one image moves top-1: the scale for reading small deltas
        dense_top1 = next((r.top1 for r in rows if r.sparse_fraction == 0.0 and r.top1 is not None), None)
        interval = ""
        if dense_top1 is not None:
            low, high = wilson_interval(dense_top1, sizes[0])
            interval = (f"; at the dense run's {dense_top1:.1f}% the 95% interval of one run's top-1 is "
                        f"{low:.1f}-{high:.1f}% (Wilson), the evaluation's sampling error alone")
        notes.append(f"Validation split: {sizes[0]} images, so one image is {100.0 / sizes[0]:.2f} pp of top-1"
                     + interval + ("." if seeded else "; one seed per schedule."))
    if seeded:
        parts = [f"{m.schedule.split(' (')[0]} (seeds {', '.join(map(str, m.seeds))}): linear "
                 f"{_pp(m.top1_spread)}, k-NN {_pp(m.knn_top1_spread)}" for m in seeded]
        worst = [2 * s for m in seeded for s in (m.top1_spread, m.knn_top1_spread) if s is not None]
        noise = f"seeds differ by up to {max(worst):.2f} pp, so differences between schedules below that are " \
                "within seed noise" if worst else "no evaluated pair of seeds yet"
        notes.append("Seed noise, ± = half the range over seeds, (max − min) / 2: " + "; ".join(parts)
                     + f". The {noise}. Schedules with one seed have no spread of their own.")
    incomplete = [r.run for r in rows if r.status != COMPLETE]
    if incomplete:
        notes.append("Not complete (see Status): " + ", ".join(incomplete) + ".")
    return notes


def _pp(value: Optional[float]) -> str:
    return "–" if value is None else f"±{value:.2f} pp"


def make_table(run_paths: list[Path], out: Path, plots: bool = True, extra_notes: Sequence[str] = ()) -> list[Path]:
    """Read the runs under `run_paths` and write the table, CSV, JSON summary and (unless `plots` is False) the
    plots into `out`; returns the paths written. `extra_notes` are added to the table's notes."""
    runs = [read_run(path) for path in find_run_dirs(run_paths)]
    rows = build_rows(runs)
    means = schedule_means(rows)
    shown_means = means if any(len(m.runs) > 1 for m in means) else []  # one seed each: the rows say it all
    baselines = baseline_rows(runs)
    notes = table_notes(runs, rows, means) + list(extra_notes)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "table.md", out / "table.csv", out / "summary.json", out / "top1_vs_sparsity.png",
             out / "loss_curves.png"]
    paths[0].write_text("# Sparse-then-dense schedules\n\n" + markdown(rows, shown_means, baselines, notes))
    write_csv(rows, shown_means, baselines, paths[1])
    summary = {"rows": [asdict(r) for r in rows], "schedule_means": [asdict(m) for m in shown_means],
               "baselines": [asdict(b) for b in baselines], "notes": notes,
               "published": {"source": published.SOURCE, "total_steps": published.TOTAL_STEPS,
                             "rows": [asdict(p) for p in published.ROWS]}}
    paths[2].write_text(json.dumps(summary, indent=2) + "\n")
    if not plots:
        return paths[:3]
    from .plots import plot_accuracy, plot_losses  # matplotlib only when plotting

    plot_accuracy(rows, paths[3], baselines=baselines, setting=setting_label(runs))
    by_fraction = sorted(runs, key=lambda r: (r.sparse_fraction is None, r.sparse_fraction or 0.0, r.seed or 0,
                                              r.name))
    plot_losses([r for r in by_fraction if r.loss_curve], paths[4])
    return paths
