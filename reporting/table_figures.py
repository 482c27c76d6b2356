"""The figures of a result table (`table.make_table`): which runs each figure draws and what it
calls them.

Names are a paper's (`names.py`: "ViT-S/4, 40 epochs · 2:4-sparse teacher"), computed once here for
every figure so that the accuracy plot, the gap plot, the loss curves and the mask plot call a
configuration alike.
"""

from pathlib import Path

from .configurations import (
    config_label,
    config_order,
    dense_reference,
    dense_references,
    differing_config,
    differing_keys,
    schedule_label,
)
from .gap_plot import plot_gaps
from .loss_groups import plot_loss_differences
from .loss_plots import plot_losses
from .mask_plots import plot_masks
from .names import paper_names, run_label, study_setting
from .plots import plot_accuracy, series
from .run_logs import DUPLICATE
from .table_files import ACCURACY_PNG, DIFFERENCES_PNG, GAPS_PNG, LOSSES_PNG, MASKS_PNG


def _schedule(fraction) -> str:
    """ "dense", "70% sparse": a run's schedule in a legend."""
    return "dense" if fraction == 0.0 else schedule_label(fraction).split(" (")[0]


def _written_or_removed(path: Path, written) -> list[Path]:
    """[path] where the figure was drawn; else an earlier table's figure there, which described
    other runs, goes."""
    if written:
        return [Path(path)]
    Path(path).unlink(missing_ok=True)
    return []


def draw_figures(runs, rows, baselines, out: Path) -> list[Path]:
    """Draw every figure of the runs into `out`; returns the PNGs written (the accuracy and loss
    figures always)."""
    keys = differing_keys(runs)
    differing = {id(run): differing_config(run, keys) for run in runs}
    whole = {}
    for run in runs:
        whole.setdefault(config_label(differing[id(run)]), (run.config, differing[id(run)]))
    names, note = paper_names(whole)
    note = note if keys else ""
    # the accuracy figure names its series among themselves: a configuration drawn only within
    # others (a 100% run ending the series that restart the teacher at the switch) has no series of
    # its own to name
    drawn = {label for label, _ in series([r for r in rows if r.sparse_fraction is not None])}
    series_names, series_note = (
        (names, note)
        if not drawn or drawn >= set(whole)
        else paper_names({label: config for label, config in whole.items() if label in drawn})
    )
    setting = study_setting(runs)
    accuracy, losses = out / ACCURACY_PNG, out / LOSSES_PNG
    plot_accuracy(
        rows,
        accuracy,
        baselines=baselines,
        setting=setting,
        names=series_names,
        note=series_note if keys else "",
    )
    paths = [accuracy, losses]
    paths += _written_or_removed(
        out / GAPS_PNG, plot_gaps(rows, out / GAPS_PNG, setting=setting, names=names, note=note)
    )
    by_fraction = sorted(
        runs,
        key=lambda r: (
            r.sparse_fraction is None,
            r.sparse_fraction or 0.0,
            config_order(differing[id(r)]),
            r.seed or 0,
            r.name,
        ),
    )

    def label(run) -> str:
        return run_label(
            _schedule(run.sparse_fraction), names[config_label(differing[id(run)])], bool(keys)
        )

    drawn = [
        r for r in by_fraction if r.loss_curve and r.train_status != DUPLICATE
    ]  # a copy is drawn once
    references = dense_references(
        runs, keys
    )  # a loss curve is compared with the dense run of its own seed only
    labels = [label(r) for r in drawn] if keys else None
    same_seed = [dense_reference(r, references, keys, same_seed=True) for r in drawn]
    # several dense references (models, lengths): the differences get a figure of their own, a row
    # per reference
    groups = [label(ref) if keys and ref is not None else "" for ref in same_seed]
    grouped = plot_loss_differences(
        drawn,
        same_seed,
        labels or [""] * len(drawn),
        groups,
        out / DIFFERENCES_PNG,
        note=note,
        setting=setting,
    )
    pointer = (
        f"Each run's loss minus its dense run's: {DIFFERENCES_PNG}, a row per dense run."
        if grouped
        else ""
    )
    plot_losses(
        drawn,
        losses,
        labels=labels,
        note="\n".join(n for n in (note, pointer) if n),
        references=None if grouped else same_seed,
        setting=setting,
    )
    paths += _written_or_removed(out / DIFFERENCES_PNG, grouped)
    mask_labels = [label(r) + ("" if r.seed is None else f", seed {r.seed}") for r in by_fraction]
    paths += _written_or_removed(
        out / MASKS_PNG,
        plot_masks(by_fraction, out / MASKS_PNG, labels=mask_labels, setting=setting, note=note),
    )
    return paths
