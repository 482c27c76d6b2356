"""The ablations in one figure: for every sparse configuration, its top-1 gap to the dense run of
the same configuration and seed (linear probe and k-NN), so that what a change does to the gap reads
off one axis.

Each bar is the mean over seeds of the per-seed differences (a seed's sparse run minus that seed's
dense run, the table's per-run Δ), each dot one seed; the published ViT-L/16 ImageNet-1k Δ of the
same schedule is drawn beside the linear bar. Configurations are grouped by the dense run they are
compared with, each group headed by its model ("ViT-S/4, 40 epochs"), each bar named by its schedule
and options as a paper would (names.py).

Rows are duck-typed (table.TableRow): this module imports nothing from table.py.
"""

import statistics
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from . import published
from .configurations import (
    common_values_note,
    config_key,
    config_label,
    short_labels,
    short_row_label,
)
from .figures import OKABE_ITO, STYLE, plt, save_with_legend_below
from .names import PUBLISHED_NAME
from .run_logs import COMPLETE

# the bars of a gap, its `linear` and its `knn` values: Okabe-Ito blue and orange
METRICS = (("linear probe", OKABE_ITO[0]), ("k-NN", OKABE_ITO[4]))
PUBLISHED_COLOR = "0.15"
AXIS_FLOOR = (
    -12.0
)  # pp: a gap beyond it (a broken variant) is cut at the axis and its mean written there


@dataclass
class Gap:
    """One sparse configuration against its dense runs, in pp."""

    fraction: float
    config: dict  # the differing keys' values (TableRow.differing_config)
    seeds: list = field(default_factory=list)
    linear: list = field(
        default_factory=list
    )  # per seed: sparse run's top-1 minus the same seed's dense run's
    knn: list = field(default_factory=list)

    @property
    def reference(self) -> tuple:
        """What the configuration shares with its dense runs: the differing keys that act without a
        sparse phase too."""
        return config_key(self.config, dense_reference=True)


def gaps(rows) -> list[Gap]:
    """The complete sparse runs with a dense reference, one Gap per configuration, grouped by dense
    reference, then by schedule, in the rows' order otherwise."""
    by_config: dict[tuple, Gap] = {}
    for r in rows:
        # as the table's means
        if not r.sparse_fraction or r.delta_top1 is None or r.status != COMPLETE:
            continue
        key = (r.sparse_fraction, config_key(r.differing_config))
        gap = by_config.setdefault(key, Gap(r.sparse_fraction, dict(r.differing_config)))
        gap.seeds.append(r.seed)
        gap.linear.append(r.delta_top1)
        if r.delta_knn_top1 is not None:
            gap.knn.append(r.delta_knn_top1)
    references = list(dict.fromkeys(g.reference for g in by_config.values()))
    return sorted(by_config.values(), key=lambda g: (references.index(g.reference), g.fraction))


def _published_delta(fraction: float) -> float | None:
    row = next((p for p in published.ROWS if abs(p.fraction - fraction) < 1e-9), None)
    return row.delta_top1 if row else None


def _cut_axis(ax, drawn: list[Gap], positions: list[float]) -> None:
    """Start the axis at AXIS_FLOOR when a gap goes beyond it, writing the cut bars' means at the
    edge, so one broken variant does not flatten the rest (the right end still shows every gain)."""
    every = [v for g in drawn for v in g.linear + g.knn]
    if min(every) >= AXIS_FLOOR:
        return
    ax.set_xlim(AXIS_FLOOR, max(0.5, max(every) + 0.5))
    for y, gap in zip(positions, drawn):
        for j, values in enumerate((gap.linear, gap.knn)):
            if values and statistics.fmean(values) < AXIS_FLOOR:
                ax.text(
                    AXIS_FLOOR + 0.15,
                    y + (j - 0.5) * 0.38,
                    f"{statistics.fmean(values):.1f} \u2190",
                    va="center",
                    ha="left",
                    fontsize=8,
                    color="white",
                    fontweight="bold",
                )


def _row_name(gap: Gap, names: dict) -> str:
    """ "70% sparse · 2:4-sparse teacher": the schedule and the configuration's options (its model
    heads its group)."""
    name = names.get(config_label(gap.config))
    options = getattr(name, "options", "") if name is not None else ""
    schedule = f"{gap.fraction * 100:g}% sparse"
    return f"{schedule} · {options}" if options else schedule


def _group_name(gap: Gap, names: dict) -> str:
    name = names.get(config_label(gap.config))
    return (
        getattr(name, "model", "")
        if name is not None and getattr(name, "show_model", False)
        else ""
    )


def gap_figure(rows, setting: str = "", names=None, note: str = ""):
    """(figure, caption, legend handles) of `plot_gaps`, or None where there is nothing to compare.
    `names`: {config label: names.PaperName}; without them, configurations are named by
    `short_labels` ("70% sparse · teacher=sparse")."""
    drawn = gaps(rows)
    if len(drawn) < 2 or not any(g.config for g in drawn):
        return None
    if names:
        labels, groups = (
            [_row_name(g, names) for g in drawn],
            [_group_name(g, names) for g in drawn],
        )
    else:
        shorts, base = short_labels([g.config for g in drawn])
        labels, groups = (
            [short_row_label(g.fraction, s) for g, s in zip(drawn, shorts)],
            [""] * len(drawn),
        )
        note = note or common_values_note(base)
    headed = [i for i, g in enumerate(groups) if g and (i == 0 or g != groups[i - 1])]
    height = 1.6 + 0.5 * len(drawn) + 0.35 * len(headed)
    fig, ax = plt.subplots(figsize=(9.0, height))
    positions, y = [], 0.0
    for i in range(len(drawn)):
        y += 0.55 if i in headed else 0.0
        positions.append(y)
        y += 1.0
    for gap, y in zip(drawn, positions):
        for j, (values, (name, color)) in enumerate(zip((gap.linear, gap.knn), METRICS)):
            if not values:
                continue
            at = y + (j - 0.5) * 0.38
            ax.barh(
                at,
                statistics.fmean(values),
                height=0.36,
                color=color,
                label=name if y == positions[0] else None,
            )
            ax.plot(
                values,
                [at] * len(values),
                "o",
                mfc="white",
                mec="0.1",
                ms=4.5,
                label="one seed" if y == positions[0] and j == 0 else None,
            )
        delta = _published_delta(gap.fraction)
        if delta is not None:
            ax.plot(
                [delta],
                [y - 0.19],
                "D",
                color=PUBLISHED_COLOR,
                ms=6,
                label=PUBLISHED_NAME + ", linear probe" if y == positions[0] else None,
            )
    for i in headed:  # each dense reference's group under a header naming its model
        top = positions[i] - 0.55
        if i:
            ax.axhline(top - 0.2, color="0.6", lw=0.8)
        ax.text(
            0.01,
            top + 0.05,
            f"{groups[i]}: against its own dense run",
            transform=ax.get_yaxis_transform(),
            ha="left",
            va="center",
            fontsize=9,
            fontweight="bold",
            color="0.2",
        )
    ax.axvline(0.0, color="0.2", lw=0.9)
    _cut_axis(ax, drawn, positions)
    ax.set_yticks(positions, labels)
    ax.set_ylim(positions[-1] + 0.7, -0.7 if not headed else -0.85)
    ax.set_xlabel("top-1 change against the dense run of the same configuration and seed (pp)")
    ax.set_title(
        "Top-1 lost to 2:4-sparse training, per configuration" + (f"\n{setting}" if setting else "")
    )
    ax.grid(axis="x", alpha=0.3)
    caption = [
        "Bars: mean over seeds of each seed's difference to its dense run; dots: the seeds; "
        "diamonds: the "
        "published difference at the same schedule.",
        note,
    ]
    return (
        fig,
        "\n".join(textwrap.fill(line, 130) for line in caption if line),
        ax.get_legend_handles_labels()[0],
    )


def plot_gaps(rows, path: Path, setting: str = "", names=None, note: str = "") -> Path | None:
    """Write `gap_figure` to `path`; None (nothing written) where the runs differ in their schedule
    alone (the accuracy plot says it all) or fewer than two sparse configurations have a gap."""
    with plt.rc_context(STYLE):
        drawn = gap_figure(rows, setting, names, note)
        if drawn is None:
            return None
        fig, caption, handles = drawn
        save_with_legend_below(fig, path, handles, ncol=2, caption=caption)
    return path
