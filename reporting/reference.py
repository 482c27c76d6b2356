"""A table's reference configuration (`make_table.py --reference`): the sparse recipe that the other
sparse runs modify, as in an ablation or a screening table, so that each of them is also read
against it, seed by seed at the same schedule, beside its Δ against dense.

The runs named are the reference at each schedule where they ran: at most one a schedule and seed,
and one configuration a schedule. A sparse run's Δ vs the reference is its top-1 (and k-NN) minus
that of the reference run of its schedule and seed (None where there is none); a configuration's is
its mean minus the reference's mean at its schedule over the same seeds where the reference ran them
all (then paired: the mean of the seed-by-seed differences, with the paired t interval), else over
all the reference's seeds (Welch's interval; intervals.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rundir.errors import UsageError

from .configurations import differing_config, differing_keys
from .intervals import difference, difference_interval
from .run_logs import COMPLETE, RunSummary, find_run_dirs


def mark_reference(runs: list[RunSummary], paths: Sequence[Path]) -> None:
    """Mark the runs under `paths` (runs or folders holding them) as the reference; UsageError,
    before anything is written, for a path not among `runs`, a dense run, two runs of one schedule
    and seed, or two configurations at one schedule."""
    if not paths:
        return
    table = {Path(run.path).resolve(): run for run in runs}
    named = []
    for path in find_run_dirs(list(paths)):
        run = table.get(Path(path).resolve())
        if run is None:
            raise UsageError(f"--reference {path}: not among the table's runs")
        if run.sparse_fraction == 0.0:
            raise UsageError(
                f"--reference {path}: a dense run; every row is read against the dense runs "
                "already (--reference names the sparse recipe the others modify)"
            )
        named.append(run)
    keys = differing_keys(runs)
    seen: dict = {}
    for run in named:
        for key, what in (
            ((run.sparse_fraction, run.seed), "seed"),
            ((run.sparse_fraction,), "config"),
        ):
            first = seen.setdefault(key, run)
            if first is run:
                continue
            if what == "seed":
                raise UsageError(
                    f"--reference: {first.name} and {run.name} are both at "
                    f"{run.sparse_fraction:g} sparse with seed {run.seed}: name one run a "
                    "schedule and seed"
                )
            if differing_config(first, keys) != differing_config(run, keys):
                raise UsageError(
                    f"--reference: {first.name} and {run.name} are two configurations at "
                    f"{run.sparse_fraction:g} sparse: name one"
                )
    for run in named:
        run.reference = True


def reference_deltas(rows: list) -> None:
    """Set each sparse, non-reference TableRow's delta_top1_reference / delta_knn_top1_reference
    against the complete reference row of its schedule and seed."""
    references = {
        (r.sparse_fraction, r.seed): r for r in rows if r.reference and r.status == COMPLETE
    }
    for row in rows:
        reference = references.get((row.sparse_fraction, row.seed))
        if row.reference or not row.sparse_fraction or reference is None:
            continue
        row.delta_top1_reference = difference(row.top1, reference.top1)
        row.delta_knn_top1_reference = difference(row.knn_top1, reference.knn_top1)


def reference_mean_deltas(groups: list, rows: list) -> None:
    """Set each sparse, non-reference ScheduleMean's Δs vs the reference at its schedule, with their
    intervals; `groups`: (mean, its TableRows) as `schedule_means` grouped them; the reference's
    values are its complete rows of that schedule among `rows`."""
    for mean, group in groups:
        if not mean.sparse_fraction or any(r.reference for r in group):
            continue
        reference = [
            r
            for r in rows
            if r.reference and r.status == COMPLETE and r.sparse_fraction == mean.sparse_fraction
        ]
        if not reference:
            continue
        for name in ("top1", "knn_top1"):
            ours = {r.seed: getattr(r, name) for r in group}
            theirs = {r.seed: getattr(r, name) for r in reference}
            if ours.keys() <= theirs.keys():  # paired: the reference's runs of the same seeds
                theirs = {seed: theirs[seed] for seed in ours}
            values = [v for v in theirs.values() if v is not None]
            delta = difference(getattr(mean, name), sum(values) / len(values) if values else None)
            setattr(mean, f"delta_{name}_reference", delta)
            setattr(mean, f"delta_{name}_reference_interval", difference_interval(ours, theirs))
