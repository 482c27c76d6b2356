"""The accuracy figure of a sparse-then-dense study (top1_vs_sparsity.png; matplotlib, Agg backend).

What a paper prints: the top-1 change against the dense run (pp) over the share of steps trained
2:4-sparse, ours and the published ViT-L/16 ImageNet-1k numbers on one axis (the same quantity, so
the shapes compare), one panel per metric (linear probe; k-NN beside it on the same scale, which the
published table does not have). Each configuration is one series against its own dense run (the
table's per-run Δ: a seed's run minus that seed's dense run), so every series' reference is the line
at 0, labelled once; each configuration's dense top-1 is in its legend entry. Error bars: half the
range over seeds (each seed a hollow marker), or for a single seed the 95% Wilson interval of its
accuracy over the validation images. The baselines (untrained network, raw pixels) are in the
caption: as a Δ they lie tens of pp away.

Rows are duck-typed (table.TableRow): this module imports nothing from table.py.
"""

import math
import statistics
import textwrap
from pathlib import Path

from matplotlib.lines import Line2D

from configs.schema import has_switch
from configs.sweep import SWITCH_KEYS

from . import published
from .figures import LEGEND_WIDTH, STYLE, palette, plt, save_with_legend_below
from .intervals import wilson_interval
from .names import PUBLISHED_NAME
from .run_logs import KNN_SHOWN_K

X_LABEL = "steps trained 2:4-sparse before switching to dense (% of all steps)"
Y_LABEL = "top-1 change against the dense run (pp)"
PUBLISHED_COLOR = "0.15"
# (Δ key, accuracy key, panel title, marker)
METRICS = (("delta_top1", "top1", "Linear probe", "o"), ("delta_knn_top1", "knn_top1", "k-NN", "s"))
DODGE = 3.0  # pp of share: the widest sideways spread of configurations drawn at the same schedule


def _share(row) -> float:
    """Share of sparse steps in percent (what the schedule did, e.g. 32 for a 40k-of-125k run)."""
    if row.total_steps:
        return 100.0 * row.sparse_steps / row.total_steps
    return 100.0 * row.sparse_fraction


def _groups(rows, key: str, accuracy_key: str = "") -> list[tuple[float, list, list, list]]:
    """[(share %, values, validation sizes, accuracies)] per schedule, in share order, of the rows
    (seeds) whose `key` is finite; `accuracy_key` names the accuracy behind a Δ (for its Wilson
    interval; default: `key` itself)."""
    groups: dict[float, tuple[list, list, list]] = {}
    for r in rows:
        value = getattr(r, key)
        if value is not None and math.isfinite(value):
            values, sizes, accuracies = groups.setdefault(round(_share(r), 6), ([], [], []))
            values.append(value)
            sizes.append(getattr(r, "n_val", None))
            accuracies.append(getattr(r, accuracy_key or key))
    return [(x, *lists) for x, lists in sorted(groups.items())]


def _error_bars(groups) -> tuple[list, list, set]:
    """Per schedule, (below, above) its mean: half the range over seeds where there are several,
    else the Wilson interval of the single run's accuracy over its validation images, moved onto its
    value (none where that size is unknown, and none at 0% sparse, the reference itself). Returns
    the two lists and the kinds drawn."""
    below, above, kinds = [], [], set()
    for x, values, sizes, *rest in groups:
        accuracy = rest[0][0] if rest else values[0]
        if len(values) > 1:
            low = high = (max(values) - min(values)) / 2
            kinds.add("seeds")
        elif sizes[0] and x != 0.0 and accuracy is not None:
            interval = wilson_interval(accuracy, sizes[0])
            low, high = accuracy - interval[0], interval[1] - accuracy
            kinds.add("wilson")
        else:
            low = high = 0.0
        below.append(low)
        above.append(high)
    return below, above, kinds


def _switches(row) -> bool:
    return has_switch(row.sparse_steps or 0, row.total_steps or 0)


def _same_but_switch_keys(a: dict, b: dict) -> bool:
    keys = set(a) | set(b)
    return all(a.get(k) == b.get(k) for k in keys if k not in SWITCH_KEYS)


def series(rows) -> list[tuple[str, list]]:
    """[(config label, rows)]: the rows per combination of the non-schedule config keys that differ,
    in the rows' order (one entry, label "", where only the schedule differs). A run without a
    switch (100% sparse) also ends every series whose runs switch and differ from it only in keys
    that act at the switch, which it cannot have (the teacher's restart): a series of such runs
    alone is then drawn only within those series."""
    groups: dict[str, list] = {}
    for r in rows:
        groups.setdefault(getattr(r, "config_label", ""), []).append(r)
    joined = set()
    for label, members in groups.items():
        switching = [r for r in members if _switches(r)]
        if not switching:
            continue
        differing = getattr(switching[0], "differing_config", {})
        schedules = {r.sparse_fraction for r in members}
        for other, others in groups.items():
            for r in others:
                if (
                    other != label
                    and not _switches(r)
                    and r.sparse_fraction not in (0.0, None)
                    and r.sparse_fraction not in schedules
                    and _same_but_switch_keys(differing, getattr(r, "differing_config", {}))
                ):
                    members.append(r)
                    joined.add(id(r))
    return [(label, rs) for label, rs in groups.items() if not all(id(r) in joined for r in rs)]


def _name(names: dict, label: str) -> str:
    name = names.get(label, label)
    return getattr(name, "full", name) or "this study"


def _dense_mean(rows, key: str):
    values = [
        getattr(r, key) for r in rows if r.sparse_fraction == 0.0 and getattr(r, key) is not None
    ]
    return statistics.fmean(values) if values else None


def _legend_name(name: str, rows) -> str:
    """The configuration's name with its dense top-1, the absolute scale the Δ axes leave out."""
    dense = [
        (what, v)
        for what, key in (("linear", "top1"), ("k-NN", "knn_top1"))
        if (v := _dense_mean(rows, key)) is not None
    ]
    text = name + (
        " (dense: " + ", ".join(f"{v:.1f}% {what}" for what, v in dense) + ")" if dense else ""
    )
    return textwrap.fill(text, LEGEND_WIDTH)


def _draw_series(ax, groups, color, marker: str, offset: float) -> set:
    """One configuration's means with error bars at share + `offset`, each seed a small hollow
    marker. Returns the kinds of error bar drawn."""
    xs = [x + offset for x, *_ in groups]
    means = [statistics.fmean(values) for _, values, *_ in groups]
    below, above, kinds = _error_bars(groups)
    ax.errorbar(
        xs,
        means,
        yerr=[below, above] if any(below + above) else None,
        fmt=marker + "-",
        color=color,
        lw=1.6,
        ms=6,
        capsize=3,
        zorder=3,
    )
    for x, (_, values, *_) in zip(xs, groups):
        if len(values) > 1:
            ax.plot(
                [x] * len(values), values, marker, ms=4, mfc="none", mec=color, alpha=0.8, zorder=2
            )
    return kinds


SAME_TEACHER_NAME = (
    "against the dense run whose teacher momentum restarts at the same step (dotted, hollow): "
    "what the sparse phase costs, without what the faster late teacher also gives a dense run"
)


def _draw_same_teacher(ax, groups, color, marker: str, offset: float) -> None:
    """A configuration's means against the dense run with its teacher momentum schedule (the table's
    delta_*_same_teacher), dotted and hollow beside its usual series; the seeds' spread is the usual
    series'."""
    xs = [x + offset for x, *_ in groups]
    means = [statistics.fmean(values) for _, values, *_ in groups]
    ax.plot(
        xs,
        means,
        marker + ":",
        color=color,
        mfc="white",
        mec=color,
        mew=1.4,
        lw=1.4,
        ms=7,
        zorder=3,
    )


def _published(ax) -> Line2D:
    xs = [100.0 * p.step_fraction for p in published.ROWS]
    ys = [p.delta_top1 for p in published.ROWS]
    (line,) = ax.plot(
        xs, ys, "D--", color=PUBLISHED_COLOR, ms=5, lw=1.2, zorder=4, label=PUBLISHED_NAME
    )
    return line


def _baselines(baselines) -> str:
    """The baselines' absolute top-1, for the caption: as a Δ they sit tens of pp away and would
    flatten the runs."""
    parts = [
        f"{b.label} "
        + ", ".join(
            f"{what} {v:.1f}%"
            for what, v in (("linear", b.top1), ("k-NN", b.knn_top1))
            if v is not None
        )
        for b in baselines
    ]
    return ("Baselines (absolute top-1): " + "; ".join(parts) + ".") if parts else ""


def _label_zero(ax) -> None:
    """The line every series is measured from, named at its right end (above it: sparse schedules
    lose, so the space above 0 is the emptiest)."""
    ax.axhline(0.0, color="0.3", lw=0.9, zorder=1)
    ax.annotate(
        "Δ = 0: the dense run",
        (1.0, 0.0),
        xycoords=("axes fraction", "data"),
        xytext=(-3, 3),
        textcoords="offset points",
        ha="right",
        va="bottom",
        fontsize=8,
        color="0.3",
    )


def accuracy_figure(rows, baselines=(), setting: str = "", names=None, note: str = ""):
    """(figure, legend handles, caption) of `plot_accuracy`. `names`: {config label: name (str or
    names.PaperName)}; `setting`: what the runs are (title); `note`: a caption line."""
    names = names or {}
    ours = [r for r in rows if r.sparse_fraction is not None]
    configurations = [
        (label, rs) for label, rs in series(ours) if any(_groups(rs, key) for key, *_ in METRICS)
    ]
    shown = {label for label, _ in configurations}
    undrawn = [_name(names, label) for label, _ in series(ours) if label not in shown]
    metrics = [m for m in METRICS if any(_groups(rs, m[0]) for _, rs in configurations)] or METRICS[
        :1
    ]
    ks = {r.knn_k for r in ours if getattr(r, "knn_k", None) is not None}
    fig, panel_list = plt.subplots(
        1, len(metrics), figsize=(5.2 * len(metrics) + 0.6, 4.6), sharey=True, squeeze=False
    )
    axes = {m[0]: ax for m, ax in zip(metrics, panel_list[0])}
    n = len(configurations)
    step = min(1.0, 2 * DODGE / max(n - 1, 1))
    kinds, handles = set(), []
    for i, ((label, rs), color) in enumerate(zip(configurations, palette(n))):
        offset = (i - (n - 1) / 2) * step
        for key, accuracy_key, _, marker in metrics:
            groups = _groups(rs, key, accuracy_key)
            if groups:
                kinds |= _draw_series(axes[key], groups, color, marker, offset)
            same_teacher = _groups(rs, key + "_same_teacher", accuracy_key)
            if same_teacher:
                _draw_same_teacher(axes[key], same_teacher, color, marker, offset)
                kinds.add("same teacher")
        for r in rs:
            if r.status != "complete" and r.delta_top1 is not None and "delta_top1" in axes:
                axes["delta_top1"].annotate(
                    r.status.split(" (")[0],
                    (_share(r) + offset, r.delta_top1),
                    fontsize=7,
                    xytext=(4, -10),
                    textcoords="offset points",
                    color=color,
                )
        handles.append(
            Line2D(
                [], [], color=color, marker="o", lw=1.6, label=_legend_name(_name(names, label), rs)
            )
        )
    if "same teacher" in kinds:
        handles.append(
            Line2D(
                [],
                [],
                color="0.3",
                marker="o",
                mfc="white",
                ls=":",
                lw=1.4,
                label=textwrap.fill(SAME_TEACHER_NAME, LEGEND_WIDTH),
            )
        )
    if "delta_top1" in axes:
        handles.append(_published(axes["delta_top1"]))
    for key, _, title, _ in metrics:
        ax = axes[key]
        if key == "delta_knn_top1":
            title += f" (k={ks.pop()})" if len(ks) == 1 else f" (k nearest to {KNN_SHOWN_K})"
        ax.set_title(title)
        ax.set_xlabel(X_LABEL if len(metrics) == 1 else textwrap.fill(X_LABEL, 40))
        ax.set_xlim(-5, 105)
        ax.set_xticks(range(0, 101, 20))
        ax.grid(True, alpha=0.3)
        _label_zero(ax)
    panel_list[0][0].set_ylabel(Y_LABEL)
    if not configurations:
        panel_list[0][0].text(
            0.5,
            0.5,
            "no evaluated runs yet",
            ha="center",
            va="center",
            color="0.4",
            transform=panel_list[0][0].transAxes,
        )
    fig.suptitle(
        "Top-1 change from training 2:4-sparse first, against the dense run\n"
        + (f"ours: {setting}; " if setting else "")
        + f"published: {published.SHORT_SOURCE}",
        fontsize=11,
    )
    if any(
        len(values) > 1 for _, rs in configurations for _, values, *_ in _groups(rs, "delta_top1")
    ):
        handles.append(
            Line2D([], [], ls="", marker="o", ms=4, mfc="none", mec="0.3", label="one seed")
        )
    if any(getattr(r, "config_label", "") != label for label, rs in configurations for r in rs):
        note = "\n".join(
            filter(
                None,
                [
                    "A 100% run has no switch: it also ends the series that differ from it only in "
                    "what happens at the switch (the teacher's restart).",
                    note,
                ],
            )
        )
    return fig, handles, _caption(ours, kinds, _baselines(baselines), undrawn, note, n > 1)


def _caption(ours, kinds: set, baselines: str, undrawn: list, note: str, several: bool) -> str:
    lines = [
        "Δ: a run's top-1 minus the dense (0% sparse) run's of the same configuration and seed. "
        "The published "
        '"40%" row ran 40k of 125k steps sparse and is drawn at 32%.'
    ]
    if several:
        lines.append(
            f"Configurations at the same schedule are drawn side by side, up to {DODGE:g} pp apart."
        )
    if "seeds" in kinds:
        lines.append("Error bars: half the range over seeds (hollow markers: the single seeds).")
    if "wilson" in kinds:
        sizes = " or ".join(
            f"{n:,}" for n in sorted({r.n_val for r in ours if getattr(r, "n_val", None)})
        )
        lines.append(
            (
                "Error bars of single-seed schedules"
                if "seeds" in kinds
                else "Error bars (one seed per schedule)"
            )
            + f": 95% Wilson interval of the accuracy over the {sizes} validation images, "
            "the evaluation's sampling error; run-to-run variation is not shown."
        )
    if "same teacher" in kinds:
        lines.append(
            "Dotted, hollow: the same runs against the dense run whose teacher momentum schedule "
            "restarts at "
            "the step where they switch (of their seed, else of its lowest seed), so both teachers "
            "follow "
            "one schedule step for step; drawn where the study has that dense run."
        )
    if baselines:
        lines.append(baselines)
    if undrawn:
        lines.append(
            "Not drawn, no evaluated run with a dense run to compare with: "
            + "; ".join(undrawn)
            + "."
        )
    lines += note.splitlines()
    return "\n".join(textwrap.fill(line, 150) for line in lines)


def plot_accuracy(
    rows, path: Path, baselines=(), setting: str = "", names=None, note: str = ""
) -> Path:
    """Write `accuracy_figure` as a PNG, legend and caption under the panels."""
    with plt.rc_context(STYLE):
        fig, handles, caption = accuracy_figure(rows, baselines, setting, names, note)
        ncol = 1 if any(len(h.get_label()) > 45 for h in handles) else 2
        save_with_legend_below(fig, path, handles, ncol=ncol, caption=caption)
    return Path(path)
