"""The loss-curve figure of a sparse-then-dense study: one panel per loss term with every run
overlaid (colour: the share of sparse steps, or the row label where runs differ in more than the
schedule; dashed: other seeds; the sparse->dense switch marked), and under each a panel of each
run's difference to its dense run, because the curves of one study lie on top of each other. Every
panel's y range is that of the values after the first 10% of steps.

Runs are duck-typed (run_logs.RunSummary); the dense references come from the caller
(table.dense_references).
"""

import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from matplotlib.lines import Line2D

from .figures import LEGEND_WIDTH, STYLE, palette, plt, save_with_caption, save_with_legend_below
from .run_logs import LOSS_TERMS

EARLY = 0.1  # the first 10% of steps: the initial transient, kept out of every panel's y range
TERM_TITLES = {
    "loss": "Total loss",
    "dino_local_crops_loss": "DINO loss, local crops",
    "dino_global_crops_loss": "DINO loss, global crops",
    "koleo_loss": "KoLeo regulariser",
    "ibot_loss": "iBOT masked-patch loss",
}
LEGEND_TITLE = "schedule (% steps sparse)"


@dataclass
class LossFigure:
    """The drawn figure before it is saved: the panels per term, the difference panels per term
    (empty without references), the caption's notes and the legend's handles."""

    fig: object
    panels: dict = field(default_factory=dict)
    differences: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    handles: list = field(default_factory=list)


def drawn_terms(runs) -> list[str]:
    """The loss terms to draw: total first, then the logged terms that are not constant (a weight of
    0)."""
    present = []
    for term in list(LOSS_TERMS) + sorted(
        {t for r in runs for t in r.loss_terms} - set(LOSS_TERMS)
    ):
        values = [v for r in runs for _, v in r.loss_terms.get(term, []) if math.isfinite(v)]
        if values and (term == "loss" or max(values) > min(values)):
            present.append(term)
    return present


def _smooth(steps, values, window: int):
    """Centred moving average over `window` logged values (odd); the ends keep the raw values'
    extent."""
    steps, values = np.asarray(steps, float), np.asarray(values, float)
    if window <= 1 or len(values) < 2 * window:
        return steps, values
    kernel = np.ones(window) / window
    half = window // 2
    return steps[half : len(steps) - half], np.convolve(values, kernel, mode="valid")


def _colors(runs) -> dict:
    """Sparse fraction -> colour: viridis by rank, so that 0.7 and 0.8 differ as much as 0 and 0.4
    (the order, dark = dense to light = all sparse, is what carries the meaning)."""
    fractions = sorted({r.sparse_fraction for r in runs}, key=lambda f: (f is None, f or 0.0))
    cmap = plt.get_cmap("viridis")
    return {f: cmap(0.9 * i / max(len(fractions) - 1, 1)) for i, f in enumerate(fractions)}


def smoothing_window(runs) -> int:
    """Logged values per moving average (odd): ~40 averages along the longest run, none for short
    runs."""
    longest = max((len(r.loss_terms.get("loss", [])) for r in runs), default=0)
    return (longest // 40) | 1 if longest > 80 else 1


def difference_curve(curve, reference) -> list[tuple]:
    """[(step, value - reference's value)] at the steps both logged with finite values."""
    ref = {step: v for step, v in reference if math.isfinite(v)}
    return [(step, v - ref[step]) for step, v in curve if step in ref and math.isfinite(v)]


def _set_late_limits(ax, late: list, early: list) -> bool:
    """The y range of the values after the first 10% of steps; True where an earlier value now lies
    outside."""
    if not late:
        return False
    low, high = min(late), max(late)
    margin = 0.08 * ((high - low) or abs(high) or 1.0)
    ax.set_ylim(low - margin, high + margin)
    return any(not low - margin <= y <= high + margin for y in early)


def draw_curves(ax, runs, curves, colors, keys, base_seed, window: int, zero=None) -> bool:
    """Each run's curve (None: not drawn) smoothed, its switch marked; the y range after the first
    10% of steps (with `zero`, a reference line at 0 in that colour, kept in range). Returns whether
    the start was cut."""
    late, early = ([0.0], []) if zero is not None else ([], [])
    if zero is not None:
        ax.axhline(0.0, color=zero, lw=1.0)
    for run, key, curve in zip(runs, keys, curves):
        if not curve:
            continue
        xs, ys = _smooth(*zip(*curve), window)
        dashed = run.seed is not None and base_seed is not None and run.seed != base_seed
        ax.plot(xs, ys, color=colors[key], lw=1.3, ls="--" if dashed else "-")
        switch = run.sparse_steps
        if switch and run.total_steps and switch < run.total_steps and xs[0] <= switch <= xs[-1]:
            ax.plot(
                switch,
                np.interp(switch, xs, ys),
                "o",
                ms=6,
                mfc=colors[key],
                mec="black",
                mew=0.8,
                zorder=4,
            )
        cut = EARLY * (run.total_steps or xs[-1])
        for x, y in zip(xs, ys):
            if math.isfinite(y):
                (late if x >= cut else early).append(y)
    ax.grid(True, alpha=0.3)
    return _set_late_limits(ax, late, early)


def loss_figure(runs, labels=None, references=None) -> LossFigure:
    """The figure `plot_losses` saves. `references`: each run's dense run (the 0% sparse run of the
    same configuration and seed) or None; with any, a row of difference panels under each row of
    loss panels."""
    terms = drawn_terms(runs) or ["loss"]
    references = list(references) if references is not None else [None] * len(runs)
    compared = [
        ref is not None and ref is not run and bool(run.loss_terms)
        for run, ref in zip(runs, references)
    ]
    columns = min(3, len(terms))
    spare = (
        len(terms) % columns != 0 and len(terms) > columns and labels is None
    )  # an empty cell takes the legend
    lines = math.ceil(len(terms) / columns)
    per_line = 2 if any(compared) else 1
    window = smoothing_window(runs)
    base_seed = min((r.seed for r in runs if r.seed is not None), default=None)
    if labels is None:
        colors = _colors(runs)
        keys = [run.sparse_fraction for run in runs]
    else:
        keys = list(labels)
        colors = dict(zip(dict.fromkeys(keys), palette(len(set(keys)))))
    dense_color = next(
        (colors[k] for r, k in zip(runs, keys) if r.sparse_fraction == 0.0 and labels is None),
        "0.3",
    )
    fig, axes = plt.subplots(
        lines * per_line,
        columns,
        squeeze=False,
        sharex=True,
        figsize=(
            4.6 * columns + (0 if spare or labels else 2.2),
            (3.4 + 2.8 * (per_line - 1)) * lines,
        ),
        gridspec_kw={"height_ratios": [1.0, 0.8][:per_line] * lines},
    )
    figure, clipped = LossFigure(fig), False
    for i, term in enumerate(terms):
        ax = figure.panels[term] = axes[per_line * (i // columns)][i % columns]
        clipped |= draw_curves(
            ax, runs, [r.loss_terms.get(term) for r in runs], colors, keys, base_seed, window
        )
        ax.set_title(TERM_TITLES.get(term, term.replace("_", " ")))
        ax.set_ylabel("loss")
        if per_line == 2:
            diff = figure.differences[term] = axes[per_line * (i // columns) + 1][i % columns]
            curves = [
                difference_curve(r.loss_terms.get(term, []), ref.loss_terms.get(term, []))
                if c
                else None
                for r, ref, c in zip(runs, references, compared)
            ]
            clipped |= draw_curves(
                diff, runs, curves, colors, keys, base_seed, window, zero=dense_color
            )
            diff.set_title("difference to the dense run", fontsize=9)
            diff.set_ylabel("Δ loss")
    used = {id(ax) for ax in [*figure.panels.values(), *figure.differences.values()]}
    for ax in [ax for line in axes for ax in line if id(ax) not in used]:
        ax.axis("off")
    for column in range(columns):  # step labels under each column's lowest panel
        lowest = [ax for line in axes for ax in [line[column]] if id(ax) in used][-1]
        lowest.set_xlabel("training step")
        lowest.xaxis.set_tick_params(labelbottom=True)
    if not runs:
        axes[0][0].text(
            0.5,
            0.5,
            "no metrics logged yet",
            ha="center",
            va="center",
            color="0.4",
            transform=axes[0][0].transAxes,
        )
    figure.handles = _loss_legend(runs, base_seed, colors, keys)
    if spare:
        axes[per_line * (lines - 1)][columns - 1].legend(
            handles=figure.handles, loc="center", frameon=False, title=LEGEND_TITLE
        )
    elif labels is None:
        fig.legend(
            handles=figure.handles,
            loc="center left",
            bbox_to_anchor=(1.0, 0.5),
            frameon=False,
            title=LEGEND_TITLE,
        )
    if window > 1:
        figure.notes.append(f"Curves: moving average over {window} logged values.")
    if per_line == 2:
        missing = [r.name for r, c in zip(runs, compared) if not c and r.sparse_fraction != 0.0]
        figure.notes.append(
            "Under each panel: each run's loss minus its dense run's (the 0% sparse run of the "
            "same "
            "configuration and seed) at the same steps; the line at 0 is the dense run."
            + (f" No dense run of the same seed: {', '.join(missing)}." if missing else "")
        )
    if clipped:
        figure.notes.append(
            "Y axes span the values after the first 10% of steps; the start, outside that range, "
            "is cut off."
        )
    return figure


def plot_losses(
    runs, path: Path, labels=None, references=None, note: str = "", setting: str = ""
) -> Path:
    """Write `loss_figure` as a PNG with its notes (and `note`) as the caption: the legend beside
    the panels (or in a spare cell), or under them where `labels` name the runs. `setting`: what the
    runs share, for the title."""
    with plt.rc_context(STYLE):
        figure = loss_figure(runs, labels, references)
        what = "each schedule" if labels is None else "each configuration and schedule"
        figure.fig.suptitle(
            f"Training loss of {what}"
            + (f", {setting}" if setting else "")
            + (", and its difference to the dense run" if figure.differences else ""),
            fontsize=12,
        )
        width = round(
            figure.fig.get_figwidth() * 15
        )  # characters of 9-point text across the figure
        caption = "\n".join(textwrap.fill(line, width) for line in [*figure.notes, note] if line)
        if labels is None:
            save_with_caption(figure.fig, path, caption, y=-0.01)
        else:
            save_with_legend_below(
                figure.fig, path, figure.handles, ncol=min(len(figure.panels), 2), caption=caption
            )
    return Path(path)


def _loss_legend(runs, base_seed, colors: dict, keys: list) -> list:
    """One entry per colour key (sparse fraction, or row label), its first run's state where not
    complete."""
    handles, seen = [], set()
    for run, key in zip(runs, keys):
        if key in seen:
            continue
        seen.add(key)
        if isinstance(key, str):
            label = key
        else:
            label = "?" if run.sparse_fraction is None else f"{run.sparse_fraction * 100:g}% sparse"
        if run.status != "complete":
            label += f" ({run.status.split(' (')[0]})"  # the state, without its details
        handles.append(
            Line2D([], [], color=colors[key], lw=2, label=textwrap.fill(label, LEGEND_WIDTH))
        )
    return handles + seed_and_switch_handles(runs, base_seed)


def seed_and_switch_handles(runs, base_seed) -> list:
    """The legend entries shared by the loss figures: solid and dashed seeds, the switch marker."""
    handles = []
    seeds = sorted({r.seed for r in runs if r.seed is not None})
    if len(seeds) > 1:
        handles.append(Line2D([], [], color="0.2", lw=1.3, label=f"seed {base_seed}"))
        others = ", ".join(str(s) for s in seeds if s != base_seed)
        handles.append(Line2D([], [], color="0.2", lw=1.3, ls="--", label=f"seed {others}"))
    if any(r.sparse_steps and r.total_steps and r.sparse_steps < r.total_steps for r in runs):
        handles.append(
            Line2D(
                [], [], ls="", marker="o", ms=6, mfc="white", mec="black", label="switch to dense"
            )
        )
    return handles
