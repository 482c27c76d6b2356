"""PNG figures of a sparse-then-dense study (matplotlib, Agg backend: no display needed).

- `plot_accuracy`: linear-probe and k-NN top-1 against the share of sparse steps, mean over seeds with the seed
  spread as error bars (one seed: the 95% Wilson interval over the validation images), the dense run and the
  baselines (untrained network, raw pixels) as horizontal lines. Where the runs differ in config keys other than the
  schedule (a row's `config_label`), one series per combination of those keys, coloured and named in the legend.
  The published ViT-L/16 ImageNet-1k numbers: on the same axes when the runs are that setting, else their Δ to dense
  in a panel of their own (a small model on another dataset has another scale; the shape is what compares).
- `plot_losses`: one panel per loss term, every schedule overlaid, coloured by its share of sparse steps (by its
  row's label where the runs differ in other config keys too), the sparse->dense switch marked on each curve.

Rows and runs are duck-typed (table.TableRow, run_logs.RunSummary): this module imports nothing from table.py.
"""

import math
import statistics
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from . import published  # noqa: E402
from .intervals import wilson_interval  # noqa: E402
from .run_logs import KNN_SHOWN_K, LOSS_TERMS  # noqa: E402

DPI = 150
STYLE = {"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9, "xtick.labelsize": 9,
         "ytick.labelsize": 9}
X_LABEL = "steps trained 2:4-sparse before switching to dense (%)"
PUBLISHED_COLOR = "0.35"
SERIES = (("top1", "linear probe", "C0", "o"), ("knn_top1", "k-NN", "C1", "s"))
BASELINE_STYLES = {"random_init": (0, (6, 2, 1, 2)), "pixels": (0, (2, 2))}
MULTI_STYLES = {"top1": "-", "knn_top1": "--"}  # several configurations: colour = configuration, line = metric
MULTI_BASELINE_COLORS = {"top1": "0.2", "knn_top1": "0.55"}
LEGEND_WIDTH = 80  # characters of a legend entry before it wraps
TERM_TITLES = {"loss": "Total loss", "dino_local_crops_loss": "DINO loss, local crops",
               "dino_global_crops_loss": "DINO loss, global crops", "koleo_loss": "KoLeo regulariser",
               "ibot_loss": "iBOT masked-patch loss"}


def _save_with_caption(fig, path, caption: str, y: float) -> None:
    """Lay out, put `caption` (if any) in grey under the axes, write the PNG and free the figure."""
    fig.tight_layout()
    if caption:
        fig.text(0.01, y, caption, fontsize=9, ha="left", va="top", color="0.25")
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def _save_with_legend_below(fig, path, handles, ncol: int, caption: str) -> None:
    """Lay out, put the legend under the whole figure and `caption` under the legend, write the PNG, free the
    figure (for long legends, which would squash the axes they belonged to)."""
    fig.tight_layout()
    legend = fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, frameon=False)
    fig.canvas.draw()
    bottom = legend.get_window_extent().transformed(fig.transFigure.inverted()).y0
    if caption:
        fig.text(0.01, bottom - 0.01, caption, fontsize=9, ha="left", va="top", color="0.25")
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def _share(row) -> float:
    """Share of sparse steps in percent (what the schedule did, e.g. 32 for a 40k-of-125k run)."""
    if row.total_steps:
        return 100.0 * row.sparse_steps / row.total_steps
    return 100.0 * row.sparse_fraction


def _by_share(rows, key: str) -> list[tuple[float, float, float, list]]:
    """[(share %, mean, half range or 0, values)] over the rows (seeds) of each schedule that have `key`."""
    return _points(_groups(rows, key))


def _groups(rows, key: str) -> list[tuple[float, list, list]]:
    """[(share %, values, validation sizes)] per schedule, in share order, of the rows (seeds) that have `key`."""
    groups: dict[float, tuple[list, list]] = {}
    for r in rows:
        value = getattr(r, key)
        if value is not None and math.isfinite(value):
            values, sizes = groups.setdefault(round(_share(r), 6), ([], []))
            values.append(value)
            sizes.append(getattr(r, "n_val", None))
    return [(x, values, sizes) for x, (values, sizes) in sorted(groups.items())]


def _points(groups) -> list[tuple[float, float, float, list]]:
    return [(x, statistics.fmean(v), (max(v) - min(v)) / 2, v) for x, v, _ in groups]


def _error_bars(groups) -> tuple[list, list, set]:
    """Per schedule, (below, above) its mean: half the range over seeds where there are several, else the Wilson
    interval of the single run's accuracy over its validation images (none where that size is unknown).
    Returns the two lists and which kinds were drawn ({"seeds", "wilson"})."""
    below, above, kinds = [], [], set()
    for _, values, sizes in groups:
        if len(values) > 1:
            low = high = (max(values) - min(values)) / 2
            kinds.add("seeds")
        elif sizes[0]:
            interval = wilson_interval(values[0], sizes[0])
            low, high = values[0] - interval[0], interval[1] - values[0]
            kinds.add("wilson")
        else:
            low = high = 0.0
        below.append(low)
        above.append(high)
    return below, above, kinds


def _knn_label(rows) -> str:
    ks = {r.knn_k for r in rows if getattr(r, "knn_k", None) is not None}
    return f"k-NN (k={ks.pop() if len(ks) == 1 else KNN_SHOWN_K})" if len(ks) <= 1 else "k-NN (k nearest to 20)"


def _configurations(rows) -> list[tuple[str, list]]:
    """[(config label, rows)]: the rows per combination of the non-schedule config keys that differ, in the rows'
    order (one entry, label "", where only the schedule differs)."""
    groups: dict[str, list] = {}
    for r in rows:
        groups.setdefault(getattr(r, "config_label", ""), []).append(r)
    return list(groups.items())


def _palette(n: int) -> list:
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def _ours(ax, rows) -> tuple[list[float], set, list, int]:
    """One series per configuration (`_configurations`): `_one_configuration` or `_configurations_apart`. Returns
    every value drawn, the kinds of error bar drawn, the legend handles of what was drawn and the number of
    configurations left out (nothing evaluated)."""
    configurations = _configurations(rows)
    if len(configurations) > 1:
        return _configurations_apart(ax, configurations)
    drawn, kinds = _one_configuration(ax, rows)
    handles = ax.get_legend_handles_labels()[0]
    if any(x == 0.0 for x, *_ in _by_share(rows, "top1") + _by_share(rows, "knn_top1")):
        handles.append(Line2D([], [], color="0.3", ls=":", label="dense run (0% sparse)"))
    return drawn, kinds, handles, 0


def _series(ax, groups, color, marker: str, offset: float, **style) -> tuple:
    """One metric of one configuration: the means with their error bars (`_error_bars`) at share + `offset`, and each
    seed as a small hollow marker where there are several. Returns (shares, means, per-share values, bar kinds)."""
    xs, means, _, values = zip(*_points(groups))
    below, above, kinds = _error_bars(groups)
    shifted = [x + offset for x in xs]
    ax.errorbar(shifted, means, yerr=[below, above] if any(below + above) else None, color=color, capsize=3,
                zorder=3, **style)
    for x, v in zip(shifted, values):
        if len(v) > 1:
            ax.plot([x] * len(v), v, marker, ms=4, mfc="none", mec=color, alpha=0.7, zorder=2)
    return xs, means, values, kinds


def _configurations_apart(ax, configurations) -> tuple[list[float], set, list, int]:
    """Per configuration with an evaluated run one colour, per metric one line style (linear probe solid, k-NN
    dashed); the configurations' points spread sideways by up to 3 pp of share so that equal schedules do not hide
    each other. A dotted line at the dense mean where the configuration has sparse schedules too."""
    shown = [(label, rows) for label, rows in configurations if any(_groups(rows, key) for key, *_ in SERIES)]
    n = len(shown)
    step = min(1.0, 6.0 / max(n - 1, 1))
    drawn, kinds, handles, dense_lines = [], set(), [], False
    for i, ((label, rows), color) in enumerate(zip(shown, _palette(n))):
        offset = (i - (n - 1) / 2) * step
        for key, _, _, marker in SERIES:
            groups = _groups(rows, key)
            if not groups:
                continue
            xs, means, values, drawn_kinds = _series(ax, groups, color, marker, offset, fmt=marker + MULTI_STYLES[key],
                                                     lw=1.4, ms=5)
            kinds |= drawn_kinds
            if xs[0] == 0.0 and len(xs) > 1:
                ax.axhline(means[0], color=color, ls=":", lw=0.9, zorder=1)
                dense_lines = True
            drawn += list(means) + [y for v in values for y in v]
        for r in rows:
            if r.status != "complete" and r.top1 is not None:
                ax.annotate(r.status.split(" (")[0], (_share(r) + offset, r.top1), fontsize=7, xytext=(4, -10),
                            textcoords="offset points", color=color)
        handles.append(Line2D([], [], color=color, lw=2.5, label=textwrap.fill(label, LEGEND_WIDTH)))
    handles += [Line2D([], [], color="0.3", marker=marker, ls=MULTI_STYLES[key],
                       label=_knn_label([r for _, rows in configurations for r in rows]) if key == "knn_top1"
                       else label) for key, label, _, marker in SERIES]
    if dense_lines:
        handles.append(Line2D([], [], color="0.3", ls=":", label="dense run (0% sparse)"))
    if not drawn:
        ax.text(0.5, 0.5, "no evaluated runs yet", ha="center", va="center", transform=ax.transAxes, color="0.4")
    return drawn, kinds, handles, len(configurations) - n


def _one_configuration(ax, rows) -> tuple[list[float], set]:
    """Mean over seeds, each seed as a small hollow marker, error bars as `_error_bars` says; the dense mean as a
    dotted line. Returns every value drawn (for the baselines' scale check) and the kinds of error bar drawn."""
    drawn, kinds = [], set()
    for key, label, color, marker in SERIES:
        groups = _groups(rows, key)
        if not groups:
            continue
        label = _knn_label(rows) if key == "knn_top1" else label
        xs, means, values, drawn_kinds = _series(ax, groups, color, marker, 0.0, fmt=marker + "-", lw=1.6, ms=6,
                                                 label=label)
        kinds |= drawn_kinds
        if xs[0] == 0.0:
            ax.axhline(means[0], color=color, ls=":", lw=1.0, zorder=1)
        drawn += list(means) + [y for v in values for y in v]
    for r in rows:
        if r.status != "complete" and r.top1 is not None:
            ax.annotate(r.status, (_share(r), r.top1), fontsize=7, xytext=(4, -12), textcoords="offset points")
    if not drawn:
        ax.text(0.5, 0.5, "no evaluated runs yet", ha="center", va="center", transform=ax.transAxes, color="0.4")
    return drawn, kinds


def _baselines(ax, baselines, drawn: list[float], several: bool = False) -> list[str]:
    """Each baseline's linear and k-NN top-1 as horizontal lines (grey where `several` configurations take the
    colours), if they fit without squashing the runs' scale; returns caption lines for those left out."""
    low, high = (min(drawn), max(drawn)) if drawn else (0.0, 100.0)
    span = max(high - low, 5.0)
    off_scale = []
    for b in baselines:
        pairs = [(v, MULTI_BASELINE_COLORS[key] if several else c)
                 for (key, _, c, _), v in zip(SERIES, (b.top1, b.knn_top1)) if v is not None]
        fits = all(max(high, v) - min(low, v) <= 3.0 * span for v, _ in pairs)
        if not fits:
            off_scale.append(f"{b.label}: " + ", ".join(
                f"{name} {v:.1f}%" for (v, _), name in zip(pairs, ("linear", "k-NN") if b.top1 is not None
                                                           else ("k-NN",))))
            continue
        for v, color in pairs:
            ax.axhline(v, color=color, ls=BASELINE_STYLES.get(b.key, "--"), lw=1.2, alpha=0.8, zorder=1)
    return off_scale


def _legend_below(ax, handles=None, ncol: int = 3) -> None:
    handles = handles if handles is not None else ax.get_legend_handles_labels()[0]
    if handles:
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=ncol, frameon=False)


def _axes(ax, title: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(ylabel)
    ax.set_xlim(-4, 104)
    ax.set_xticks(range(0, 101, 10))
    ax.grid(True, alpha=0.3)
    ax.margins(y=0.12)


def _published(ax, delta: bool):
    """The published curve (top-1, or its Δ to the published dense run); returns its line for a legend."""
    xs = [100.0 * p.step_fraction for p in published.ROWS]
    ys = [p.delta_top1 if delta else p.top1 for p in published.ROWS]
    line, = ax.plot(xs, ys, "D-", color=PUBLISHED_COLOR, ms=6, label=f"published ({published.SHORT_SOURCE})",
                    zorder=2)
    ax.annotate('published "40%" row:\n40k of 125k steps', (xs[1], ys[1]), fontsize=8, xytext=(6, 8),
                textcoords="offset points", color=PUBLISHED_COLOR)
    return line


def plot_accuracy(rows, path: Path, baselines=(), setting: str = "") -> Path:
    """Same setting as the published table: one panel, ours and published top-1. Otherwise two panels: this sweep's
    top-1, then the published Δ to dense on its own axes. `setting`: what the runs are, for the title."""
    ours = [r for r in rows if r.sparse_fraction is not None]
    same_setting = any(r.published_top1 is not None for r in rows)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, 1 if same_setting else 2, figsize=(7.5 if same_setting else 13, 5.2),
                                 squeeze=False, gridspec_kw=None if same_setting else {"width_ratios": (1.25, 1)})
        ax = axes[0][0]
        several = len(_configurations(ours)) > 1
        drawn, error_kinds, handles, undrawn = _ours(ax, ours)
        off_scale = _baselines(ax, baselines, drawn, several)
        handles += [Line2D([], [], color="0.3", ls=BASELINE_STYLES.get(b.key, "--"), label=b.label)
                    for b in baselines if not any(line.startswith(b.label) for line in off_scale)]
        if same_setting:
            handles.append(_published(ax, delta=False))
            _axes(ax, "Top-1 vs share of sparse steps: this study and published", "top-1 accuracy (%)")
        else:
            _axes(ax, f"This study: {setting}" if setting else "This study", "top-1 accuracy (%)")
            ref = axes[0][1]
            ref.axhline(0.0, color="0.6", lw=0.8)
            _published(ref, delta=True)
            _axes(ref, f"Published: {published.SHORT_SOURCE}", "top-1 change vs the dense run (pp)")
        if not several:
            _legend_below(ax, handles, ncol=3)
        caption = []
        if several:
            caption.append("One colour per configuration (the values of the config keys in which the runs differ); "
                           "solid: linear probe, dashed: k-NN. Configurations at the same share are drawn side by "
                           "side, up to 3 pp apart." + (f" Not drawn: {undrawn} configuration(s) without an "
                                                        "evaluated run." if undrawn else ""))
        if "seeds" in error_kinds:
            caption.append("Error bars: half the range over seeds (hollow markers: the single seeds).")
        if "wilson" in error_kinds:
            sizes = sorted({r.n_val for r in ours if getattr(r, "n_val", None)})
            images = " or ".join(f"{n:,}" for n in sizes)
            caption.append(("Error bars of single-seed schedules" if "seeds" in error_kinds else "Error bars (one "
                            "seed per schedule)") + f": 95% Wilson interval of the accuracy over the {images} "
                           "validation images, the evaluation's sampling error; run-to-run variation is not shown.")
        if off_scale:
            caption.append("Baselines off the scale, not drawn: " + "; ".join(off_scale) + ".")
        if several:
            two_columns = not same_setting and sum(len(h.get_label()) > 30 for h in handles) > 2
            _save_with_legend_below(fig, path, handles, ncol=2 if two_columns else 1, caption="\n".join(caption))
        else:
            _save_with_caption(fig, path, "\n".join(caption), y=-0.02)
    return Path(path)


def _terms(runs) -> list[str]:
    """The loss terms to draw: total first, then the logged terms that are not constant (a weight of 0)."""
    present = []
    for term in list(LOSS_TERMS) + sorted({t for r in runs for t in r.loss_terms} - set(LOSS_TERMS)):
        values = [v for r in runs for _, v in r.loss_terms.get(term, []) if math.isfinite(v)]
        if values and (term == "loss" or max(values) > min(values)):
            present.append(term)
    return present


def _smooth(steps, values, window: int):
    """Centred moving average over `window` logged values (odd); the ends keep the raw values' extent."""
    steps, values = np.asarray(steps, float), np.asarray(values, float)
    if window <= 1 or len(values) < 2 * window:
        return steps, values
    kernel = np.ones(window) / window
    half = window // 2
    return steps[half:len(steps) - half], np.convolve(values, kernel, mode="valid")


def _colors(runs) -> dict:
    """Sparse fraction -> colour: viridis by rank, so that 0.7 and 0.8 differ as much as 0 and 0.4 (the order,
    dark = dense to light = all sparse, is what carries the meaning)."""
    fractions = sorted({r.sparse_fraction for r in runs}, key=lambda f: (f is None, f or 0.0))
    cmap = plt.get_cmap("viridis")
    return {f: cmap(0.9 * i / max(len(fractions) - 1, 1)) for i, f in enumerate(fractions)}


def plot_losses(runs, path: Path, labels=None) -> Path:
    """One panel per loss term, every schedule overlaid (colour: share of sparse steps; dashed: other seeds).
    `labels`: each run's row label where the runs differ in more than the schedule; the colour is then the label's
    (one per configuration and schedule) and the legend, under the panels, names them."""
    terms = _terms(runs) or ["loss"]
    columns = min(3, len(terms))
    spare = len(terms) % columns != 0 and len(terms) > columns and labels is None  # an empty cell takes the legend
    lines = math.ceil(len(terms) / columns)
    longest = max((len(r.loss_terms.get("loss", [])) for r in runs), default=0)
    window = (longest // 40) | 1 if longest > 80 else 1  # noisy per-step losses: ~40 averages per run
    base_seed = min((r.seed for r in runs if r.seed is not None), default=None)
    if labels is None:
        colors = _colors(runs)
        keys = [run.sparse_fraction for run in runs]
    else:
        keys = list(labels)
        distinct = list(dict.fromkeys(keys))
        colors = dict(zip(distinct, _palette(len(distinct))))
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(lines, columns, figsize=(4.6 * columns + (0 if spare or labels else 2.2),
                                                          3.4 * lines),
                                 squeeze=False, sharex=True)
        flat = [ax for line in axes for ax in line]
        clipped = False
        for ax, term in zip(flat, terms):
            late = []
            for run, key in zip(runs, keys):
                curve = run.loss_terms.get(term)
                if not curve:
                    continue
                xs, ys = _smooth(*zip(*curve), window)
                dashed = run.seed is not None and base_seed is not None and run.seed != base_seed
                ax.plot(xs, ys, color=colors[key], lw=1.3, ls="--" if dashed else "-")
                switch = run.sparse_steps
                if switch and run.total_steps and switch < run.total_steps and xs[0] <= switch <= xs[-1]:
                    ax.plot(switch, np.interp(switch, xs, ys), "o", ms=6, mfc=colors[key],
                            mec="black", mew=0.8, zorder=4)
                cut = 0.1 * (run.total_steps or xs[-1])  # the first 10% of steps: the initial transient
                late += [y for x, y in zip(xs, ys) if x >= cut and math.isfinite(y)]
            values = [y for line in ax.get_lines() for y in line.get_ydata() if math.isfinite(y)]
            # cut the top only where the start would squash the rest of the run (a steep initial drop)
            if late and values and max(values) - min(values) > 1.5 * (max(late) - min(late)):
                margin = 0.08 * (max(late) - min(late) or abs(max(late)) or 1.0)
                ax.set_ylim(min(min(values), min(late)) - margin, max(late) + margin)
                clipped = True
            ax.set_title(TERM_TITLES.get(term, term.replace("_", " ")))
            ax.set_ylabel("loss")
            ax.grid(True, alpha=0.3)
        for ax in flat[len(terms):]:
            ax.axis("off")
        for ax in flat[max(len(terms) - columns, 0):len(terms)]:
            ax.set_xlabel("training step")
            ax.xaxis.set_tick_params(labelbottom=True)
        if not runs:
            flat[0].text(0.5, 0.5, "no metrics logged yet", ha="center", va="center", color="0.4",
                         transform=flat[0].transAxes)
        handles = _loss_legend(runs, base_seed, colors, keys)
        if spare:
            flat[-1].legend(handles=handles, loc="center", frameon=False, title="schedule (% steps sparse)")
        elif labels is None:
            fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
                       title="schedule (% steps sparse)")
        notes = []
        if window > 1:
            notes.append(f"Curves: moving average over {window} logged values.")
        if clipped:
            notes.append("Y axes cut to the values after the first 10% of steps (the start is off the top).")
        if labels is None:
            _save_with_caption(fig, path, "  ".join(notes), y=-0.01)
        else:
            _save_with_legend_below(fig, path, handles, ncol=min(columns, 2), caption="  ".join(notes))
    return Path(path)


def _loss_legend(runs, base_seed, colors: dict, keys: list) -> list:
    """One entry per colour key (sparse fraction, or row label), its first run's state where not complete."""
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
        handles.append(Line2D([], [], color=colors[key], lw=2, label=textwrap.fill(label, LEGEND_WIDTH)))
    seeds = sorted({r.seed for r in runs if r.seed is not None})
    if len(seeds) > 1:
        handles.append(Line2D([], [], color="0.2", lw=1.3, label=f"seed {base_seed}"))
        others = ", ".join(str(s) for s in seeds if s != base_seed)
        handles.append(Line2D([], [], color="0.2", lw=1.3, ls="--", label=f"seed {others}"))
    if any(r.sparse_steps and r.total_steps and r.sparse_steps < r.total_steps for r in runs):
        handles.append(Line2D([], [], ls="", marker="o", ms=6, mfc="white", mec="black", label="switch to dense"))
    return handles
