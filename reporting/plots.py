"""PNG figures of a sparse-then-dense study (matplotlib, Agg backend: no display needed).

- `plot_accuracy`: linear-probe and k-NN top-1 against the share of sparse steps, mean over seeds with the seed
  spread as error bars (one seed: the 95% Wilson interval over the validation images), the dense run and the
  baselines (untrained network, raw pixels) as horizontal lines. Where the runs differ in config keys other than the
  schedule (a row's `config_label`), one series per combination of those keys, coloured and named in the legend.
  The published ViT-L/16 ImageNet-1k numbers: on the same axes when the runs are that setting, else their Δ to dense
  in a panel of their own (a small model on another dataset has another scale; the shape is what compares).
The loss curves: `loss_plots.py`.

Rows and runs are duck-typed (table.TableRow, run_logs.RunSummary): this module imports nothing from table.py.
"""

import math
import statistics
import textwrap
from pathlib import Path

from matplotlib.lines import Line2D

from . import published
from .figures import LEGEND_WIDTH, STYLE, palette, plt, save_with_caption, save_with_legend_below
from .intervals import wilson_interval
from .run_logs import KNN_SHOWN_K

X_LABEL = "steps trained 2:4-sparse before switching to dense (%)"
PUBLISHED_COLOR = "0.35"
SERIES = (("top1", "linear probe", "C0", "o"), ("knn_top1", "k-NN", "C1", "s"))
BASELINE_STYLES = {"random_init": (0, (6, 2, 1, 2)), "pixels": (0, (2, 2))}
MULTI_STYLES = {"top1": "-", "knn_top1": "--"}  # several configurations: colour = configuration, line = metric
MULTI_BASELINE_COLORS = {"top1": "0.2", "knn_top1": "0.55"}


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


def _ours(ax, rows, names: dict) -> tuple[list[float], set, list, int]:
    """One series per configuration (`_configurations`): `_one_configuration` or `_configurations_apart`. Returns
    every value drawn, the kinds of error bar drawn, the legend handles of what was drawn and the number of
    configurations left out (nothing evaluated)."""
    configurations = _configurations(rows)
    if len(configurations) > 1:
        return _configurations_apart(ax, configurations, names)
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


def _configurations_apart(ax, configurations, names: dict) -> tuple[list[float], set, list, int]:
    """Per configuration with an evaluated run one colour, per metric one line style (linear probe solid, k-NN
    dashed); the configurations' points spread sideways by up to 3 pp of share so that equal schedules do not hide
    each other. A dotted line at the dense mean where the configuration has sparse schedules too. The legend names a
    configuration `names[label]` where given."""
    shown = [(label, rows) for label, rows in configurations if any(_groups(rows, key) for key, *_ in SERIES)]
    n = len(shown)
    step = min(1.0, 6.0 / max(n - 1, 1))
    drawn, kinds, handles, dense_lines = [], set(), [], False
    for i, ((label, rows), color) in enumerate(zip(shown, palette(n))):
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
        handles.append(Line2D([], [], color=color, lw=2.5, label=textwrap.fill(names.get(label, label), LEGEND_WIDTH)))
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


def plot_accuracy(rows, path: Path, baselines=(), setting: str = "", names=None, note: str = "") -> Path:
    """Same setting as the published table: one panel, ours and published top-1. Otherwise two panels: this sweep's
    top-1, then the published Δ to dense on its own axes. `setting`: what the runs are, for the title; `names`:
    {config_label: shorter legend name} where several configurations are drawn, `note` the caption line it needs."""
    ours = [r for r in rows if r.sparse_fraction is not None]
    same_setting = any(r.published_top1 is not None for r in rows)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, 1 if same_setting else 2, figsize=(7.5 if same_setting else 13, 5.2),
                                 squeeze=False, gridspec_kw=None if same_setting else {"width_ratios": (1.25, 1)})
        ax = axes[0][0]
        several = len(_configurations(ours)) > 1
        drawn, error_kinds, handles, undrawn = _ours(ax, ours, names or {})
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
            if note:
                caption.append(note)
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
            save_with_legend_below(fig, path, handles, ncol=2 if two_columns else 1, caption="\n".join(caption))
        else:
            save_with_caption(fig, path, "\n".join(caption), y=-0.02)
    return Path(path)
