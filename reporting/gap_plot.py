"""The ablations in one figure: for every sparse configuration, its top-1 gap to the dense run of the same
configuration and seed (linear probe and k-NN), so that what a change does to the gap reads off one axis.

Each bar is the mean over seeds of the per-seed differences (a seed's sparse run minus that seed's dense run, the
table's per-run Δ), each dot one seed; the published ViT-L/16 ImageNet-1k Δ of the same schedule is drawn beside
the linear bar. Configurations are named by the keys in which they differ from the most common value of each key
(`short_labels`), grouped by the dense run they are compared with.

Rows are duck-typed (table.TableRow): this module imports nothing from table.py.
"""

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from . import published
from .configurations import common_values_note, config_key, short_labels, short_row_label
from .figures import STYLE, plt, save_with_caption
from .run_logs import COMPLETE

METRICS = (("linear probe", "C0"), ("k-NN", "C1"))  # the bars of a gap: its `linear` and its `knn` values
AXIS_FLOOR = -12.0  # pp: a gap beyond it (a broken variant) is cut at the axis and its mean written there


@dataclass
class Gap:
    """One sparse configuration against its dense runs, in pp."""

    fraction: float
    config: dict  # the differing keys' values (TableRow.differing_config)
    seeds: list = field(default_factory=list)
    linear: list = field(default_factory=list)  # per seed: sparse run's top-1 minus the same seed's dense run's
    knn: list = field(default_factory=list)

    @property
    def reference(self) -> tuple:
        """What the configuration shares with its dense runs: the differing keys other than sparsity.*."""
        return config_key(self.config, dense_reference=True)


def gaps(rows) -> list[Gap]:
    """The complete sparse runs with a dense reference, one Gap per configuration, grouped by dense reference, then
    by schedule, in the rows' order otherwise."""
    by_config: dict[tuple, Gap] = {}
    for r in rows:
        if not r.sparse_fraction or r.delta_top1 is None or r.status != COMPLETE:  # as the table's means
            continue
        key = (r.sparse_fraction, config_key(r.differing_config))
        gap = by_config.setdefault(key, Gap(r.sparse_fraction, dict(r.differing_config)))
        gap.seeds.append(r.seed)
        gap.linear.append(r.delta_top1)
        if r.delta_knn_top1 is not None:
            gap.knn.append(r.delta_knn_top1)
    references = list(dict.fromkeys(g.reference for g in by_config.values()))
    return sorted(by_config.values(), key=lambda g: (references.index(g.reference), g.fraction))


def _published_delta(fraction: float) -> Optional[float]:
    row = next((p for p in published.ROWS if abs(p.fraction - fraction) < 1e-9), None)
    return row.delta_top1 if row else None


def _cut_axis(ax, drawn: list[Gap]) -> None:
    """Start the axis at AXIS_FLOOR when a gap goes beyond it, writing the cut bars' means at the edge, so one
    broken variant does not flatten the rest (the right end still shows every gain)."""
    every = [v for g in drawn for v in g.linear + g.knn]
    if min(every) >= AXIS_FLOOR:
        return
    ax.set_xlim(AXIS_FLOOR, max(0.5, max(every) + 0.5))
    for i, gap in enumerate(drawn):
        for j, values in enumerate((gap.linear, gap.knn)):
            if values and statistics.fmean(values) < AXIS_FLOOR:
                ax.text(AXIS_FLOOR + 0.15, i + (j - 0.5) * 0.38, f"{statistics.fmean(values):.1f} \u2190",
                        va="center", ha="left", fontsize=8, color="white", fontweight="bold")


def plot_gaps(rows, path: Path, setting: str = "") -> Optional[Path]:
    """Write the figure to `path`; None (nothing written) where the runs differ in their schedule alone (the accuracy
    plot says it all) or fewer than two sparse configurations have a gap."""
    drawn = gaps(rows)
    if len(drawn) < 2 or not any(g.config for g in drawn):
        return None
    labels, base = short_labels([g.config for g in drawn])
    names = [short_row_label(g.fraction, label) for g, label in zip(drawn, labels)]
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(9.5, 1.2 + 0.55 * len(drawn)))
        for i, gap in enumerate(drawn):
            for j, (values, (name, color)) in enumerate(zip((gap.linear, gap.knn), METRICS)):
                if not values:
                    continue
                y = i + (j - 0.5) * 0.38
                ax.barh(y, statistics.fmean(values), height=0.36, color=color, alpha=0.75,
                        label=name if i == 0 else None)
                ax.plot(values, [y] * len(values), "o", mfc="white", mec="0.15", ms=4.5,
                        label="one seed" if i == 0 and j == 0 else None)
            delta = _published_delta(gap.fraction)
            if delta is not None:
                ax.plot([delta], [i - 0.19], "D", color="0.3", ms=6,
                        label=f"published ({published.SHORT_SOURCE})" if i == 0 else None)
            if i and gap.reference != drawn[i - 1].reference:
                ax.axhline(i - 0.5, color="0.6", lw=0.8)
        ax.axvline(0.0, color="0.2", lw=0.9)
        _cut_axis(ax, drawn)
        ax.set_yticks(range(len(drawn)), names)
        ax.invert_yaxis()
        ax.set_xlabel("top-1 change against the dense run of the same configuration and seed (pp)")
        ax.set_title("Gap to dense per configuration" + (f" ({setting})" if setting else ""))
        ax.grid(axis="x", alpha=0.3)
        handles, texts = ax.get_legend_handles_labels()
        ax.legend(handles, texts, loc="lower left", frameon=True, framealpha=0.9)
        caption = ("Bars: mean over seeds of the per-seed difference; dots: the seeds; grey lines separate "
                   "configurations with different dense runs.\n" + common_values_note(base))
        save_with_caption(fig, path, caption, y=-0.02)
    return path
