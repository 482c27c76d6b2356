"""The mask figure of a 2:4 study (masks.png): for every run that logged them
(training/sparsity_monitor.py), over the training steps, the student's MLP mask flip rate, the
pruned entries' share of sum |W|, and the RMS of their gradient over the RMS of their weight. Dense
runs (and dense phases) show the mask a 2:4 pruning of their weights would take: what the sparse
runs' masks are compared with. A run's switch to dense is marked on its line.
"""

import math
import textwrap
from pathlib import Path

import numpy as np

from rundir.metrics import read_metrics
from rundir.run_dir import RunDir

from .figures import STYLE, palette, plt, save_with_legend_below

FIELDS = (
    ("mask_flip_rate", "mask flip rate (share of entries changed in 20 steps)", True),
    ("pruned_share", "pruned entries' share of sum |W|", False),
    ("pruned_grad_to_weight", "RMS gradient / RMS weight of the pruned entries", True),
)
Y_LABELS = {
    "mask_flip_rate": "flips per entry\nper 20 steps",
    "pruned_share": "share of Σ|W|",
    "pruned_grad_to_weight": "RMS grad / RMS weight",
}
SMOOTH = 5  # logged values per centred moving average of the noisy flip rate and gradient ratio


def mask_series(run_path) -> dict:
    """{field: (steps, values)} of one run's metrics.jsonl (fields it never logged are absent)."""
    records = read_metrics(RunDir(run_path).metrics_file)
    series = {}
    for key, _, _ in FIELDS:
        points = [
            (r["step"], r[key])
            for r in records
            if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
        ]
        if points:
            series[key] = tuple(np.asarray(v, float) for v in zip(*points))
    return series


def _smooth(values: np.ndarray) -> np.ndarray:
    if len(values) < 2 * SMOOTH:
        return values
    padded = np.pad(values, SMOOTH // 2, mode="edge")
    return np.convolve(padded, np.ones(SMOOTH) / SMOOTH, mode="valid")


def switch_marker(steps: np.ndarray, values: np.ndarray, switch_step: int):
    """(x, y) of a run's switch on its line: at the switch step itself (its metrics may be logged
    only every few steps), on the line drawn between the logged values around it; None where the
    switch is outside them."""
    if not len(steps) or not steps[0] <= switch_step <= steps[-1]:
        return None
    return float(switch_step), float(np.interp(switch_step, steps, values))


def plot_masks(runs, path: Path, labels=None, setting: str = "", note: str = "") -> bool:
    """Draw the runs (duck-typed: `path`, `name`, `sparse_fraction`, `sparse_steps`) that logged
    mask statistics into `path`, named by `labels` (one per run; default: the run folders' names);
    False (and nothing written) when none did. `setting`: what the runs share, for the title;
    `note`: a caption line (what unnamed options stand for)."""
    drawn = [(run, mask_series(run.path)) for run in runs]
    drawn = [(i, run, s) for i, (run, s) in enumerate(drawn) if s]
    if not drawn:
        return False
    sparse = [
        i for i, run, _ in drawn if run.sparse_fraction
    ]  # dense runs are drawn grey: no colour of their own
    colors = dict(zip(sparse, palette(len(sparse))))
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(len(FIELDS), 1, figsize=(10, 3.2 * len(FIELDS)), sharex=True)
        handles = []
        for i, run, series in drawn:
            dense, color = not run.sparse_fraction, colors.get(i, "0.35")
            label = labels[i] if labels else run.name
            for ax, (key, _, smoothed) in zip(axes, FIELDS):
                if key not in series:
                    continue
                steps, values = series[key]
                (line,) = ax.plot(
                    steps,
                    _smooth(values) if smoothed else values,
                    color="0.35" if dense else color,
                    linestyle="--" if dense else "-",
                    linewidth=1.2,
                    label=label,
                )
                marker = (
                    switch_marker(steps, _smooth(values) if smoothed else values, run.sparse_steps)
                    if run.sparse_steps and 0 < run.sparse_fraction < 1
                    else None
                )
                if marker is not None:
                    ax.plot(*marker, marker="|", markersize=14, color=line.get_color())
            handles.append(line)
        for ax, (key, title, log) in zip(axes, FIELDS):
            ax.set_title(title)
            ax.set_ylabel(Y_LABELS[key])
            if log:
                ax.set_yscale("log")
            ax.grid(True, alpha=0.3)
        axes[-1].set_xlabel("training step")
        fig.suptitle(
            "The student's 2:4 MLP masks over training" + (f", {setting}" if setting else ""),
            fontsize=12,
        )
        caption = (
            "Student MLP masks at every logged step (training/sparsity_monitor.py); flip rate and "
            "gradient "
            f"ratio smoothed over {SMOOTH} logged values. Dashed grey: dense runs, the mask a 2:4 "
            f"pruning of "
            "their weights would take. | : a run's switch to dense."
        )
        caption = "\n".join(textwrap.fill(line, 130) for line in (caption, note) if line)
        save_with_legend_below(fig, path, handles, ncol=2, caption=caption)
    return True
