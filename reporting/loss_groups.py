"""The loss differences of a study whose runs have several dense references (ablations of model,
length, recipe): one row of panels per dense reference, one column per loss term, each sparse run's
loss minus its dense run's (same configuration apart from the keys acting only with a sparse phase,
same seed) at the same steps. The runs compared with one dense run share an axis and a palette of
their own; on one axis (loss_plots.py) a study of three models and fifteen configurations is a
tangle of similar colours.

Runs are duck-typed (run_logs.RunSummary); the caller names each run's group and label
(table.make_table).
"""

import textwrap
from pathlib import Path

from matplotlib.lines import Line2D

from .figures import LEGEND_WIDTH, STYLE, palette, plt, save_with_caption
from .loss_plots import (
    TERM_TITLES,
    difference_curve,
    draw_curves,
    drawn_terms,
    seed_and_switch_handles,
    smoothing_window,
)


def groups_of(runs, references, group_names) -> dict:
    """{group name: [(run, its dense reference)]} for the sparse runs with a dense run of their own
    seed, groups in the order first seen."""
    groups: dict[str, list] = {}
    for run, ref, name in zip(runs, references, group_names):
        if ref is not None and ref is not run and run.loss_terms and ref.loss_terms:
            groups.setdefault(name, []).append((run, ref))
    return groups


def differences_figure(groups: dict, label_of: dict):
    """(figure, axes grid [group][term], caption notes) for `groups_of`' groups; `label_of`: id(run)
    -> legend label."""
    compared = [r for members in groups.values() for r, _ in members]
    terms = drawn_terms(compared) or ["loss"]
    window = smoothing_window(compared)
    base_seed = min((r.seed for r in compared if r.seed is not None), default=None)
    clipped = False
    fig, axes = plt.subplots(
        len(groups),
        len(terms),
        squeeze=False,
        sharex=True,
        figsize=(3.7 * len(terms) + 3.4, 2.7 * len(groups)),
    )
    for row, (name, members) in enumerate(groups.items()):
        members_runs = [r for r, _ in members]
        keys = [label_of[id(r)] for r in members_runs]
        colors = dict(zip(dict.fromkeys(keys), palette(len(set(keys)))))
        for column, term in enumerate(terms):
            ax = axes[row][column]
            curves = [
                difference_curve(r.loss_terms.get(term, []), ref.loss_terms.get(term, []))
                for r, ref in members
            ]
            clipped |= draw_curves(
                ax, members_runs, curves, colors, keys, base_seed, window, zero="0.3"
            )
            if row == 0:
                ax.set_title(TERM_TITLES.get(term, term.replace("_", " ")))
            if row == len(groups) - 1:
                ax.set_xlabel("training step")
        axes[row][0].set_ylabel(f"Δ loss against\n{textwrap.fill(name, 30)}")
        axes[row][-1].legend(
            handles=_legend(members_runs, keys, colors, base_seed),
            loc="center left",
            bbox_to_anchor=(1.03, 0.5),
            frameon=False,
            fontsize=8,
        )
    notes = [
        "Each panel: a sparse run's loss minus its dense run's (the 0% sparse run of the same "
        "configuration "
        "and seed) at the same steps; one row per dense run, whose line is the one at 0."
    ]
    if window > 1:
        notes.append(f"Curves: moving average over {window} logged values.")
    if clipped:
        notes.append(
            "Y axes span the values after the first 10% of steps; the start, outside that range, "
            "is cut off."
        )
    return fig, axes, notes


def plot_loss_differences(
    runs, references, labels, group_names, path: Path, note: str = "", setting: str = ""
) -> Path | None:
    """Write the figure as a PNG where the compared runs fall into two or more groups; None (and
    nothing written) otherwise, since loss_plots' difference panels then say the same. `setting`:
    what the runs share, for the title."""
    groups = groups_of(runs, references, group_names)
    if len(groups) < 2:
        return None
    with plt.rc_context(STYLE):
        fig, _, notes = differences_figure(groups, {id(r): label for r, label in zip(runs, labels)})
        fig.suptitle(
            "Training loss of each sparse run minus its dense run's, one row per dense run"
            + (f" ({setting})" if setting else ""),
            fontsize=12,
        )
        width = round(fig.get_figwidth() * 15)
        caption = "\n".join(textwrap.fill(line, width) for line in [*notes, note] if line)
        save_with_caption(fig, path, caption, y=-0.005)
    return Path(path)


def _legend(runs, keys, colors, base_seed) -> list:
    return [
        Line2D([], [], color=colors[k], lw=2, label=textwrap.fill(k, LEGEND_WIDTH // 2))
        for k in dict.fromkeys(keys)
    ] + seed_and_switch_handles(runs, base_seed)
