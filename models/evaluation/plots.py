"""PNG plots of a sparse-then-dense study (matplotlib, Agg backend: no display needed).

- `plot_accuracy`: top-1 (linear probe) and k-NN top-1 against the share of sparse steps, with the published
  ViT-L/16 curve: on the same axes when the runs are that setting, else in its own panel, labelled as a different
  setting (its absolute numbers are not comparable with a small model on another dataset).
- `plot_losses`: the training loss of each run, its sparse phase shaded and the sparse->dense switch marked.
"""

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .run_logs import KNN_SHOWN_K, RunSummary  # noqa: E402
from .table import PUBLISHED, PUBLISHED_TOTAL_STEPS, TableRow  # noqa: E402

DPI = 150
SPARSE_SHADE = "#f4a261"


def _share(row: TableRow) -> float:
    """Share of sparse steps in percent (what the schedule did, e.g. 32 for a 40k-of-125k run)."""
    if row.total_steps:
        return 100.0 * row.sparse_steps / row.total_steps
    return 100.0 * row.sparse_fraction


def _published(ax, label: str, delta: bool = False) -> None:
    """The published curve (top-1, or its Δ to the published dense run)."""
    xs = [100.0 * p.step_fraction for p in PUBLISHED]
    ys = [p.top1 - (PUBLISHED[0].top1 if delta else 0.0) for p in PUBLISHED]
    ax.plot(xs, ys, "D-", color="0.35", label=label, zorder=2)
    ax.annotate("published \"40%\" row:\n40k of 125k steps", (xs[1], ys[1]), fontsize=7, xytext=(6, 8),
                textcoords="offset points", color="0.35")


def _ours(ax, rows: list[TableRow], keys: tuple[str, str]) -> bool:
    """Our linear-probe and k-NN series (`keys`: the two TableRow fields); an incomplete run's point is flagged."""
    drawn = False
    for key, marker, label in zip(keys, ("o-", "s--"), ("linear probe", f"k-NN (k={KNN_SHOWN_K})")):
        points = sorted((_share(r), getattr(r, key)) for r in rows if getattr(r, key) is not None)
        if points:
            ax.plot(*zip(*points), marker, label=f"ours: {label}", zorder=3)
            drawn = True
    for r in rows:
        if r.status != "complete" and getattr(r, keys[0]) is not None:
            ax.annotate(r.status, (_share(r), getattr(r, keys[0])), fontsize=7, xytext=(4, -12),
                        textcoords="offset points")
    if not drawn:
        ax.text(0.5, 0.5, "no evaluated runs yet", ha="center", va="center", transform=ax.transAxes, color="0.4")
    return drawn


def _style(ax, title: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("steps trained 2:4-sparse before switching to dense (%)")
    ax.set_ylabel(ylabel)
    ax.set_xlim(-5, 105)
    ax.set_xticks(range(0, 101, 10))
    ax.grid(True, alpha=0.3)
    ax.margins(y=0.15)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best")


def plot_accuracy(rows: list[TableRow], path: Path) -> Path:
    """Same setting as the published table: one panel, ours and published top-1. Otherwise two panels: our top-1,
    then the Δ to each setting's own dense run, ours next to the published Δ (the shape is what transfers)."""
    ours = [r for r in rows if r.sparse_fraction is not None]
    same_setting = any(r.published_top1 is not None for r in rows)
    fig, axes = plt.subplots(1, 1 if same_setting else 2, figsize=(7 if same_setting else 13, 4.8), squeeze=False)
    ax = axes[0][0]
    _ours(ax, ours, ("top1", "knn_top1"))
    if same_setting:
        _published(ax, "published (torchao; ViT-L/16, ImageNet-1k)")
        _style(ax, "Top-1 vs share of sparse steps: ours and published (same setting)", "top-1 accuracy (%)")
    else:
        _style(ax, "Our runs: top-1 vs share of sparse steps", "top-1 accuracy (%)")
        ref = axes[0][1]
        ref.axhline(0.0, color="0.6", lw=0.8)
        _ours(ref, ours, ("delta_top1", "delta_knn_top1"))
        _published(ref, f"published (ViT-L/16, ImageNet-1k, {PUBLISHED_TOTAL_STEPS // 1000}k steps)", delta=True)
        _style(ref, "Δ top-1 vs each setting's dense run\n(published: a different setting, shown for its shape)",
               "Δ top-1 (pp)")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return Path(path)


def plot_losses(runs: list[RunSummary], path: Path) -> Path:
    """One panel per run (shared axes), so seven overlapping curves stay readable."""
    columns = min(4, max(len(runs), 1))
    lines = max(math.ceil(len(runs) / columns), 1)
    size = (max(3.6 * columns, 6.0), 2.9 * lines + 0.4)
    fig, axes = plt.subplots(lines, columns, figsize=size, sharex=True, sharey=True, squeeze=False)
    flat = [ax for line in axes for ax in line]
    for ax, run in zip(flat, runs):
        steps, losses = zip(*run.loss_curve)
        if run.sparse_steps:
            ax.axvspan(0, run.sparse_steps, color=SPARSE_SHADE, alpha=0.2, lw=0, label="2:4-sparse phase")
        if run.sparse_steps and run.total_steps and run.sparse_steps < run.total_steps:
            ax.axvline(run.sparse_steps, color=SPARSE_SHADE, ls="--", lw=1.2, label=f"switch @ {run.sparse_steps}")
        ax.plot(steps, losses, lw=1.0, color="C0", label="loss")
        fraction = "?" if run.sparse_fraction is None else f"{run.sparse_fraction * 100:g}% sparse"
        state = "" if run.status == "complete" else f"\n{run.status}"
        ax.set_title(f"{run.name} ({fraction}){state}", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
        if run.total_steps:
            ax.set_xlim(0, run.total_steps)
    for ax in flat[len(runs):]:
        ax.axis("off")
    if not runs:
        flat[0].text(0.5, 0.5, "no metrics logged yet", ha="center", va="center", color="0.4")
    for ax in axes[-1]:
        ax.set_xlabel("step")
    for line in axes:
        line[0].set_ylabel("total loss")
    fig.suptitle("Training loss per run (shaded: 2:4-sparse phase)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return Path(path)
