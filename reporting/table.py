"""The result table of a sparse-then-dense study: one row per run, shaped like the published 2:4
DINOv2 table.

`make_table(run_dirs, out)` writes `table.md`, `table.csv`, `summary.json` and the plots. Every run
given appears, whatever its state (complete, no eval, partial, failed, missing). Runs are grouped by
their config.yaml: two runs are seeds of one configuration iff their configs are equal apart from
`train.seed` and the keys that only say how a run executes (`configs.load.RESUMABLE_CHANGES`:
workers, logging, checkpoints, compilation, data path, ...; the per-GPU batch counts through the
global batch). Each run is labelled by its schedule plus its values of the config keys that differ
between the table's runs ("70% sparse · sparsity.teacher=sparse"). Deltas and speed-ups are taken
against the dense (sparse fraction 0) run of the same configuration apart from the keys that do
nothing without a sparse phase (`sparsity.*`, `teacher.momentum_restart_at_switch`) and the same
seed where there is one. Where a configuration ran with several seeds, a second table gives its mean
and spread over seeds; the baselines (untrained network, raw pixels) follow the runs. For the
ViT-L/16 ImageNet setting the published numbers sit next to ours, otherwise in a section of their
own. Paths in the CSV and JSON are relative to the folder holding the runs.
"""

import json
import math
import os
import shutil
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rundir.atomic import atomic_write_text
from rundir.errors import RunDirProblem, UsageError

from . import published
from .configurations import (
    config_key,
    config_label,
    config_order,
    dense_reference,
    dense_reference_key,
    dense_references,
    differing_config,
    differing_keys,
    row_label,
    same_teacher_key,
    same_teacher_reference,
)
from .floor import floor_means
from .intervals import Interval, difference, difference_interval, mean_interval, wilson_interval
from .reference import mark_reference, reference_deltas, reference_mean_deltas
from .run_logs import (
    COMPLETE,
    STUDY_FILE,
    RunSummary,
    find_run_dirs,
    mark_duplicates,
    probe_arguments,
    read_run,
)
from .speed_columns import SpeedVerdict, speed_verdict
from .table_files import FIGURE_FILES, TEXT_FILES
from .table_format import markdown, write_csv

BASELINE_LABELS = {
    "random_init": "random-init network",
    "pixels": "raw pixels (logistic regression)",
}


def is_published_setting(run: RunSummary) -> bool:
    """The configuration behind the published table: ViT-L/16 pre-trained on ImageNet."""
    return run.arch == "vit_large" and run.patch_size == 16 and run.dataset == "imagenet_folder"


def published_row_for(run: RunSummary) -> published.PublishedRow | None:
    """The published row with the same schedule: the same share of sparse steps, or the same label
    (the "40%" row ran 32%; a run with sparse_fraction 0.32 or 0.4 is compared with it)."""
    if not is_published_setting(run) or run.sparse_fraction is None:
        return None
    fraction = run.sparse_steps / run.total_steps if run.total_steps else run.sparse_fraction
    for row in published.ROWS:
        if math.isclose(fraction, row.step_fraction, abs_tol=1e-6) or math.isclose(
            run.sparse_fraction, row.fraction, abs_tol=1e-6
        ):
            return row
    return None


@dataclass
class TableRow:
    """One run as the table shows it; `None` = not available (rendered as a dash)."""

    run: str
    schedule: str
    status: str
    sparse_fraction: float | None
    seed: int | None
    sparse_steps: int | None
    dense_steps: int | None
    total_steps: int | None
    steps_done: int
    top1: float | None
    top5: float | None
    knn_top1: float | None
    knn_k: int | None
    delta_top1: (
        float | None
    )  # pp vs the dense run of the same setting (and seed, where there is one)
    delta_knn_top1: float | None
    time_s: float | None
    sparse_time_s: float | None
    dense_time_s: float | None
    images_per_s: float | None  # all timed steps
    sparse_images_per_s: float | None  # median of the phase's windows, its first window left out
    dense_images_per_s: float | None
    speedup: float | None  # dense / this run's seconds per step, at the phases' steady speeds
    final_loss: float | None
    best_C: float | None
    eval_seconds: float | None
    knn: dict
    published_top1: float | None = None
    published_delta_top1: float | None = None
    published_schedule: str = ""
    path: str = ""  # relative to the folder holding the runs
    n_val: int | None = None  # validation images behind top-1 and k-NN top-1
    # this run's values of the config keys that differ between the table's runs (schedule and seed
    # aside)
    differing_config: dict = field(default_factory=dict)
    # "2 processes × 256" where its configuration also has runs on another number of processes, else
    # ""
    layout: str = ""
    # pp vs the dense run whose teacher momentum restarts where this run's restarts at its switch
    # (configurations.same_teacher_key); None where the run does not restart there or the table has
    # no such run
    delta_top1_same_teacher: float | None = None
    delta_knn_top1_same_teacher: float | None = None
    dense_warmup_steps: int = (
        0  # dense steps before the sparse ones (sparse_steps counts both: it is the switch)
    )
    # a dense run's final teacher with its MLPs pruned 2:4 once, no fine-tuning (reporting/floor.py);
    # None for other runs and where the probe is missing
    pruned_top1: float | None = None
    pruned_knn_top1: float | None = None
    screening: bool = False  # a screening run: shown, never in a mean (RunSummary.screening)
    # the reference runs (make_table.py --reference) and each other sparse run's Δ against the
    # reference run of its schedule and seed (reporting/reference.py); None where there is none
    reference: bool = False
    delta_top1_reference: float | None = None
    delta_knn_top1_reference: float | None = None

    @property
    def config_label(self) -> str:
        return config_label(self.differing_config)


@dataclass
class ScheduleMean:
    """One configuration (schedule and differing config keys) over its complete runs (seeds): mean
    and spread = half the range, (max - min) / 2."""

    schedule: str
    sparse_fraction: float
    seeds: list
    runs: list
    top1: float | None
    top1_spread: float | None  # None with fewer than two values
    knn_top1: float | None
    knn_top1_spread: float | None
    delta_top1: float | None  # mean minus the dense schedule's mean
    delta_knn_top1: float | None
    sparse_images_per_s: float | None
    dense_images_per_s: float | None
    final_loss: float | None
    knn_k: int | None = None
    n_seeds: int = 0  # complete runs averaged (one per seed)
    differing_config: dict = field(default_factory=dict)  # as TableRow's
    # mean minus the mean of the dense configuration with the same teacher momentum schedule (as
    # TableRow's)
    delta_top1_same_teacher: float | None = None
    delta_knn_top1_same_teacher: float | None = None
    # 95% intervals (intervals.py): of the means over seeds, and of each Δ (paired by seed where
    # both sides ran the same seeds, else Welch's); None where a side has fewer than two seeds
    top1_interval: Interval | None = None
    knn_top1_interval: Interval | None = None
    delta_top1_interval: Interval | None = None
    delta_knn_top1_interval: Interval | None = None
    delta_top1_same_teacher_interval: Interval | None = None
    delta_knn_top1_same_teacher_interval: Interval | None = None
    # mean minus the reference configuration's at this schedule (reporting/reference.py)
    delta_top1_reference: float | None = None
    delta_top1_reference_interval: Interval | None = None
    delta_knn_top1_reference: float | None = None
    delta_knn_top1_reference_interval: Interval | None = None

    @property
    def config_label(self) -> str:
        return config_label(self.differing_config)


@dataclass
class BaselineRow:
    """An evaluation that is not a schedule: the untrained network or raw pixels, on the runs'
    data."""

    key: str  # random_init | pixels
    label: str
    run: str  # the run it was found in
    top1: float | None
    top5: float | None
    knn_top1: float | None
    knn_k: int | None
    best_C: float | None
    knn: dict = field(default_factory=dict)
    path: str = ""  # relative to the folder holding the runs


def runs_folder(runs: list[RunSummary]) -> Path:
    """The deepest folder holding every run: what the table's paths are relative to."""
    parents = [os.path.dirname(os.path.abspath(run.path)) for run in runs]
    return Path(os.path.commonpath(parents)) if parents else Path.cwd()


def relative_path(path: str, folder: Path) -> str:
    return os.path.relpath(os.path.abspath(path), folder) if path else path


def build_rows(runs: list[RunSummary], folder: Path | None = None) -> list[TableRow]:
    """One row per run, sorted by schedule, then configuration, then seed; paths relative to
    `folder` (default: `runs_folder`)."""
    folder = runs_folder(runs) if folder is None else folder
    keys = differing_keys(runs)
    references = dense_references(runs, keys)
    rows = []
    for run in runs:
        dense = dense_reference(run, references, keys)
        same_teacher = same_teacher_reference(run, references, keys)
        differing = differing_config(run, keys)
        dense_rate = dense.steady_seconds_per_step if dense else None
        own_rate = run.steady_seconds_per_step
        speedup = dense_rate / own_rate if dense_rate and own_rate else None
        pub = published_row_for(run)
        rows.append(
            TableRow(
                run=run.name,
                schedule=row_label(run.sparse_fraction, differing),
                status=run.status,
                sparse_fraction=run.sparse_fraction,
                seed=run.seed,
                sparse_steps=run.sparse_steps,
                dense_steps=run.dense_steps,
                total_steps=run.total_steps,
                steps_done=run.steps_done,
                top1=run.top1,
                top5=run.top5,
                knn_top1=run.knn_top1,
                knn_k=run.knn_k,
                delta_top1=difference(run.top1, dense.top1 if dense else None),
                delta_knn_top1=difference(run.knn_top1, dense.knn_top1 if dense else None),
                time_s=run.time_s,
                sparse_time_s=run.sparse_time_s,
                dense_time_s=run.dense_time_s,
                images_per_s=run.images_per_s,
                sparse_images_per_s=run.sparse_images_per_s,
                dense_images_per_s=run.dense_images_per_s,
                speedup=speedup,
                final_loss=run.final_loss,
                best_C=run.best_C,
                eval_seconds=run.eval_seconds,
                knn=dict(sorted(run.knn.items())),
                published_top1=pub.top1 if pub else None,
                published_delta_top1=pub.delta_top1 if pub else None,
                published_schedule=f"{pub.label}: {pub.sparse_steps:,} of "
                f"{published.TOTAL_STEPS:,} steps sparse"
                if pub
                else "",
                path=relative_path(run.path, folder),
                n_val=run.n_val,
                differing_config=differing,
                delta_top1_same_teacher=difference(
                    run.top1, same_teacher.top1 if same_teacher else None
                ),
                delta_knn_top1_same_teacher=difference(
                    run.knn_top1, same_teacher.knn_top1 if same_teacher else None
                ),
                dense_warmup_steps=run.dense_warmup_steps,
                screening=run.screening,
                reference=run.reference,
                **_one_shot_floor(run),
            )
        )
    _name_layouts(list(zip(rows, runs)))  # rows are still in the runs' order
    reference_deltas(rows)
    return sorted(
        rows,
        key=lambda r: (
            r.sparse_fraction is None,
            r.sparse_fraction or 0.0,
            config_order(r.differing_config),
            r.seed or 0,
            r.layout,
            r.run,
        ),
    )


def _name_layouts(rows_and_runs: list[tuple[TableRow, RunSummary]]) -> None:
    """Give each row the number of processes and per-GPU batch it trained with, where its
    configuration holds runs on more than one number of processes (its global batch is one by
    construction): otherwise a seed could appear twice with nothing to tell the two runs apart."""
    process_counts: dict[tuple, set] = {}
    for row, run in rows_and_runs:
        process_counts.setdefault(_group_key(row), set()).add(run.processes)
    for row, run in rows_and_runs:
        if len(process_counts[_group_key(row)]) > 1 and run.processes and run.global_batch:
            noun = "process" if run.processes == 1 else "processes"
            row.layout = f"{run.processes} {noun} × {run.global_batch // run.processes}"


def mean_and_half_range(values: list) -> tuple[float | None, float | None]:
    """(mean, (max - min) / 2) of the values that are not None; the half range needs two values."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None, None
    return statistics.fmean(values), (max(values) - min(values)) / 2 if len(values) > 1 else None


def _group_key(row) -> tuple:
    """Rows with the same schedule and the same values of the differing keys have the same compared
    config."""
    return row.sparse_fraction, config_key(row.differing_config)


def _mean_reference_key(mean: ScheduleMean) -> tuple:
    return config_key(mean.differing_config, dense_reference=True)


def schedule_means(rows: list[TableRow]) -> list[ScheduleMean]:
    """Per configuration (schedule and differing config keys), over its complete runs (one per seed)
    that are not screening runs; Δ against the mean of the dense configuration that differs from it
    only in keys acting only with a sparse phase, each with its 95% interval."""
    groups: dict[tuple, list[TableRow]] = {}
    for row in rows:
        if row.status == COMPLETE and row.sparse_fraction is not None and not row.screening:
            groups.setdefault(_group_key(row), []).append(row)
    ordered = sorted(
        groups.values(), key=lambda g: (g[0].sparse_fraction, config_order(g[0].differing_config))
    )
    means = [_mean_of(group) for group in ordered]
    dense = {
        _mean_reference_key(m): (m, g)
        for m, g in reversed(list(zip(means, ordered)))
        if m.sparse_fraction == 0.0
    }  # first wins
    for m, group in zip(means, ordered):
        reference = dense.get(_mean_reference_key(m))
        m.delta_top1, m.delta_top1_interval = _delta(m.top1, group, reference, "top1")
        m.delta_knn_top1, m.delta_knn_top1_interval = _delta(
            m.knn_top1, group, reference, "knn_top1"
        )
        same = dense.get(
            same_teacher_key(m.differing_config, m.sparse_fraction, 0.0 < m.sparse_fraction < 1.0)
        )
        m.delta_top1_same_teacher, m.delta_top1_same_teacher_interval = _delta(
            m.top1, group, same, "top1"
        )
        m.delta_knn_top1_same_teacher, m.delta_knn_top1_same_teacher_interval = _delta(
            m.knn_top1, group, same, "knn_top1"
        )
    reference_mean_deltas(list(zip(means, ordered)), rows)
    return means


def _mean_of(group: list[TableRow]) -> ScheduleMean:
    top1, top1_spread = mean_and_half_range([r.top1 for r in group])
    knn, knn_spread = mean_and_half_range([r.knn_top1 for r in group])
    ks = {r.knn_k for r in group if r.knn_k is not None}
    return ScheduleMean(
        schedule=group[0].schedule,
        sparse_fraction=group[0].sparse_fraction,
        seeds=[r.seed for r in group],
        runs=[r.run for r in group],
        top1=top1,
        top1_spread=top1_spread,
        knn_top1=knn,
        knn_top1_spread=knn_spread,
        delta_top1=None,
        delta_knn_top1=None,
        sparse_images_per_s=mean_and_half_range([r.sparse_images_per_s for r in group])[0],
        dense_images_per_s=mean_and_half_range([r.dense_images_per_s for r in group])[0],
        final_loss=mean_and_half_range([r.final_loss for r in group])[0],
        knn_k=ks.pop() if len(ks) == 1 else None,
        n_seeds=len(group),
        differing_config=dict(group[0].differing_config),
        top1_interval=mean_interval([r.top1 for r in group]),
        knn_top1_interval=mean_interval([r.knn_top1 for r in group]),
    )


def _delta(value: float | None, group: list[TableRow], reference, field_name: str):
    """(this mean minus the reference configuration's mean, its 95% interval); (None, None) without
    a reference."""
    if reference is None:
        return None, None
    mean, reference_rows = reference
    if group is reference_rows:  # a dense configuration against itself
        return 0.0, None
    by_seed = lambda rows: {r.seed: getattr(r, field_name) for r in rows}  # noqa: E731
    return (
        difference(value, getattr(mean, field_name)),
        difference_interval(by_seed(group), by_seed(reference_rows)),
    )


def _one_shot_floor(run: RunSummary) -> dict:
    """A dense run's pruned probe as TableRow's pruned_top1 / pruned_knn_top1 (empty otherwise)."""
    if run.sparse_fraction != 0.0 or run.pruned_once is None:
        return {}
    return {"pruned_top1": run.pruned_once.top1, "pruned_knn_top1": run.pruned_once.knn_top1}


def baseline_rows(runs: list[RunSummary], folder: Path | None = None) -> list[BaselineRow]:
    """Each baseline once, from the dense lowest-seed run if it has it, else from the first run that
    does; paths relative to `folder` (default: `runs_folder`)."""
    folder = runs_folder(runs) if folder is None else folder
    preferred = sorted(
        runs, key=lambda r: (r.sparse_fraction != 0.0, r.seed is None, r.seed or 0, r.name)
    )
    rows = []
    for key, label in BASELINE_LABELS.items():
        found = next(((run, run.baselines[key]) for run in preferred if key in run.baselines), None)
        if found:
            run, record = found
            rows.append(
                BaselineRow(
                    key=key,
                    label=label,
                    run=run.name,
                    top1=record.top1,
                    top5=record.top5,
                    knn_top1=record.knn_top1,
                    knn_k=record.knn_k,
                    best_C=record.best_C,
                    knn=dict(sorted(record.knn.items())),
                    path=relative_path(record.path, folder),
                )
            )
    return rows


def table_notes(
    runs: list[RunSummary],
    rows: list[TableRow],
    means: list[ScheduleMean],
    speed: SpeedVerdict = SpeedVerdict(None),
) -> list[str]:
    notes = [
        "Top-1: linear probe on frozen teacher features (eval_linear.py); k-NN: cosine, T=0.07. Δ "
        "and speed-up: "
        "against the dense (0% sparse) run of the same setting and seed (the lowest seed's where "
        "that seed has "
        "no dense run)."
    ]
    if speed.gpu:
        notes.append(
            f"Speeds: every timed run had one {speed.gpu} to itself. Images/s per phase: median "
            f"over the "
            "phase's logged windows, leaving out its first window (and the first after a resume), "
            "which hold "
            "compilation and warm-up. Training time: summed step time from metrics.jsonl, all "
            "windows, "
            "without start-up and evaluation. Speed-up: the dense run's seconds per step over "
            "this run's, each at its phases' steady speeds (the medians above, weighted by the "
            "steps in each phase), so compilation, which takes as long as the compiler's cache "
            "makes it, does not count."
        )
    elif speed.why_not:
        notes.append(
            f"Images/s, training time and speed-up are left out: of the timed runs, "
            f"{speed.why_not}. Speeds "
            "compare only between runs that each had one kind of GPU to themselves; the training "
            "step's "
            "speed is measured alone on one GPU by scripts/bench_train_step.py."
        )
    keys = differing_keys(runs)
    if keys:
        notes.append(
            "Rows are configurations: runs whose config.yaml differ only in train.seed are seeds "
            "of one "
            "configuration, and so are runs differing in how they execute (configs/load.py "
            "RESUMABLE_CHANGES: workers, logging, checkpoints, compilation, the per-GPU batch at "
            "the same "
            f"global batch, the data path, the sparsity backend). These runs differ in "
            f"{', '.join(keys)}; "
            "each run's dense reference has the same values of these keys apart from sparsity.* "
            "and the "
            "teacher's restart at the switch."
        )
    if not any(r.sparse_fraction == 0.0 and r.train_status == COMPLETE for r in runs):
        notes.append(
            "No complete dense (0% sparse) run among these runs: Δ and speed-up are left blank."
        )
    elif keys:
        references = dense_references(runs, keys)
        unmatched = dict.fromkeys(
            row_label(run.sparse_fraction, differing_config(run, keys))
            for run in runs
            if run.sparse_fraction is not None
            and run.sparse_fraction > 0.0
            and (dense_reference_key(run, keys), None) not in references
        )
        if unmatched:
            notes.append(
                "No complete dense run of the same configuration for "
                + "; ".join(unmatched)
                + ": Δ and speed-up are left blank there."
            )
    if any(r.delta_top1_same_teacher is not None for r in rows):
        notes.append(
            "Δ vs dense with the same teacher momentum: against the dense run whose teacher "
            "momentum restarts "
            "where this run's restarts at its switch (teacher.momentum_restart_fraction equal to "
            "its sparse "
            "fraction), of its seed, else of the lowest seed; the two teachers follow one schedule "
            "step for "
            "step, so this Δ leaves out what the faster late teacher also gives a dense run."
        )
    reference = [r for r in rows if r.reference]
    if reference:
        labels = ", ".join(dict.fromkeys(r.schedule for r in reference))
        notes.append(
            f"Δ vs the reference: against the run of the reference configuration ({labels}; "
            "make_table.py --reference) at the same schedule and seed; a configuration's, its mean "
            "minus the reference's over the same seeds where the reference ran them all (paired), "
            "else over all its seeds (Welch's). The gain (or loss) of an option over the recipe it "
            "modifies."
        )
    if any(r.published_top1 is not None for r in rows):
        notes.append(
            f'Published: {published.SOURCE}. Its "40% sparse" row ran 40k of 125k steps sparse '
            f"(32%); "
            "runs with sparse_fraction 0.4 (50k steps) or 0.32 are both compared with it."
        )
    seeded = [m for m in means if len(m.runs) > 1]
    sizes = sorted({r.n_val for r in runs if r.n_val})
    if len(sizes) == 1:  # how much one image moves top-1: the scale for reading small deltas
        dense_top1 = next(
            (r.top1 for r in rows if r.sparse_fraction == 0.0 and r.top1 is not None), None
        )
        interval = ""
        if dense_top1 is not None:
            low, high = wilson_interval(dense_top1, sizes[0])
            interval = (
                f"; at the dense run's {dense_top1:.1f}% the 95% interval of one run's top-1 is "
                f"{low:.1f}-{high:.1f}% (Wilson), the evaluation's sampling error alone"
            )
        notes.append(
            f"Validation split: {sizes[0]} images, so one image is {100.0 / sizes[0]:.2f} pp of "
            f"top-1" + interval + ("." if seeded else "; one seed per schedule.")
        )
    if seeded:
        notes.append(noise_note(seeded, means))
    screening = [r.run for r in rows if r.screening]
    if screening:
        notes.append(
            "Screening runs (they chose the settings under test, so their seeds are not a fresh "
            "sample of "
            "them): shown, with their own Δ, and kept out of every mean, interval and verdict "
            "above: " + ", ".join(screening) + "."
        )
    incomplete = [r.run for r in rows if r.status != COMPLETE]
    if incomplete:
        notes.append("Not complete (see Status): " + ", ".join(incomplete) + ".")
    refit = {True: ", the final refit too", False: ""}
    capped = [
        f"{r.name} ({len(r.unconverged_C)} C values{refit[r.final_converged is False]})"
        for r in runs
        if r.unconverged_C or r.final_converged is False
    ]
    if capped:
        notes.append(
            "Linear probes with fits stopped at linear.max_iter before converging (their C choice "
            "may differ "
            "from a converged sweep's; eval_linear.json's unconverged_C names them): "
            + ", ".join(capped)
            + "."
        )
    return notes


def noise_note(seeded: list[ScheduleMean], means: list[ScheduleMean]) -> str:
    """The one rule for seed noise, and which Δs it resolves: a Δ is resolved when its 95% interval
    leaves out 0."""
    parts = [
        f"{m.schedule.split(' (')[0]} (seeds {', '.join(map(str, m.seeds))}): linear "
        f"{_pp(m.top1_spread)}, k-NN {_pp(m.knn_top1_spread)}"
        for m in seeded
    ]
    resolved, unresolved = [], 0
    for m in means:
        for what, delta, interval in (
            ("linear", m.delta_top1, m.delta_top1_interval),
            ("k-NN", m.delta_knn_top1, m.delta_knn_top1_interval),
        ):
            if interval is None or m.sparse_fraction == 0.0:
                continue
            if interval.holds_zero():
                unresolved += 1
            else:
                resolved.append(
                    f"{m.schedule.split(' (')[0]} {what} {delta:+.2f} [{interval.low:+.2f}, "
                    f"{interval.high:+.2f}]"
                )
    verdict = (
        "Outside seed noise: " + "; ".join(resolved) + "."
        if resolved
        else "No Δ here is outside seed noise."
        if unresolved
        else "No Δ here has two seeds a side yet."
    )
    return (
        "Seed noise: ± is half the range over seeds, (max − min) / 2: "
        + "; ".join(parts)
        + ". In brackets the "
        "95% interval: Student's t over the seeds for a mean; for a Δ, paired seed by seed where "
        "both "
        "configurations ran the same seeds, else Welch's. A Δ whose interval holds 0 is within "
        "seed noise, "
        "whatever its size; a Δ with one seed on a side has no interval and resolves nothing. "
        + verdict
    )


def _pp(value: float | None) -> str:
    return "–" if value is None else f"±{value:.2f} pp"


SPEED_FIELDS = (
    "time_s",
    "sparse_time_s",
    "dense_time_s",
    "images_per_s",
    "sparse_images_per_s",
    "dense_images_per_s",
    "speedup",
)


def leave_out_speeds(rows: list[TableRow], means: list[ScheduleMean]) -> None:
    """Blank every speed of the table (speed_columns.speed_verdict found them not comparable)."""
    for item in [*rows, *means]:
        for name in SPEED_FIELDS:
            if hasattr(item, name):
                setattr(item, name, None)


# a compared key of its own where the table's runs trained on different images
DATA_KEY = "data.fingerprint"


def mark_data_sets(runs: list[RunSummary]) -> str:
    """Where the runs recorded more than one training set (run_info.json's `data_fingerprint`: the
    same tree at two paths agrees, two trees do not), make the set a compared key, so that runs on
    different images are never seeds of one configuration nor each other's dense reference; returns
    the table's note on it ("" where all agree)."""
    known = sorted({run.data_fingerprint for run in runs if run.data_fingerprint})
    if len(known) < 2:
        return (
            ""  # one set (runs that did not record theirs are taken to share it), or none recorded
        )
    unrecorded = [run.name for run in runs if run.config is not None and not run.data_fingerprint]
    _compare_by(runs, DATA_KEY, lambda run: run.data_fingerprint or "unrecorded")
    return (
        f"These runs trained on {len(known)} different sets of images ({DATA_KEY}, run_info.json's "
        f"data_fingerprint: {', '.join(known)}): each run is compared only with runs of its own set"
        + (
            f"; {len(unrecorded)} did not record theirs and are compared only among themselves"
            if unrecorded
            else ""
        )
        + "."
    )


# a compared key of its own where the runs were probed under different protocols
PROTOCOL_KEY = "eval.protocol"


def mark_protocols(runs: list[RunSummary]) -> str:
    """Where the runs' probes differ in protocol (eval_linear.json's protocol_changes: C grid,
    iterations, k, temperature, crops), make it a compared key, so that only probes under one
    protocol are compared; returns the table's note on it ("" where every probe is the default
    protocol's)."""
    protocols = sorted({_protocol_label(run) for run in runs if run.eval_status == COMPLETE})
    if len(protocols) < 2:
        return (
            ""
            if protocols in ([], ["default"])
            else f"Every probe ran under another protocol than the default: {protocols[0]}."
        )
    _compare_by(runs, PROTOCOL_KEY, _protocol_label)
    return (
        f"These runs were probed under {len(protocols)} protocols ({'; '.join(protocols)}): each "
        f"run is compared "
        "only with runs probed under its own."
    )


def _protocol_label(run: RunSummary) -> str:
    return ", ".join(run.protocol_changes) or "default"


def _compare_by(runs: list[RunSummary], key: str, value_of) -> None:
    """Add `key` (valued `value_of(run)`) to every readable run's compared config: runs that differ
    in it become configurations of their own (configurations.py), never seeds of one nor each
    other's dense reference."""
    for run in runs:
        if run.config is not None:
            run.config[key] = value_of(run)


def mark_screening(runs: list[RunSummary], screening_paths: Sequence[Path]) -> None:
    """Mark the runs under `screening_paths` (runs or folders holding them), each of which must be
    among `runs`."""
    table = {Path(run.path).resolve(): run for run in runs}
    for path in find_run_dirs(list(screening_paths)):
        run = table.get(Path(path).resolve())
        if run is None:
            raise UsageError(f"--screening {path}: not among the table's runs")
        if run.study_role == "confirmatory":
            raise UsageError(
                f"--screening {path}: its study recorded it as confirmatory ({STUDY_FILE})"
            )
        run.screening = True


def check_output_folder(out: Path) -> None:
    """Refuse, before any work, an --out that is not a folder this process can write, or cannot
    become one."""
    existing = out
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if existing != out and not existing.is_dir():
        raise UsageError(
            f"--out {out}: {existing} is not a folder, so the table's folder cannot be made under "
            f"it"
        )
    if existing == out and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out}: {existing} is not writable")


def make_table(
    run_paths: list[Path],
    out: Path,
    plots: bool = True,
    extra_notes: Sequence[str] = (),
    screening: Sequence[Path] = (),
    eval_label: str = "",
    probe=None,
    reference: Sequence[Path] = (),
) -> list[Path]:
    """Read the runs under `run_paths` and write the table, CSV, JSON summary and (unless `plots` is
    False) the plots into `out`; returns the paths written. `extra_notes` are added to the table's
    notes; the runs under `screening` are marked as screening runs and kept out of every mean; those
    under `reference` are the recipe the other sparse runs are also read against (reference.py);
    `eval_label` tabulates the probes on other data of that label (`eval_linear_data_<label>.json`)
    instead of the runs' own; `probe` (an `EvalConfig`) the record of the probe run with those
    settings (`eval_records.find_probe`: what the launcher's probe jobs with the same --eval-arg
    wrote and counted done). The files are written into a staging folder inside `out` and renamed
    into place once all are written (renames need no space): a full disk or a failure leaves the
    previous table whole."""
    out = Path(out)
    check_output_folder(out)
    runs = mark_duplicates(
        [read_run(path, eval_label=eval_label, probe=probe) for path in find_run_dirs(run_paths)]
    )
    if probe is not None:
        asked = " ".join(probe_arguments(probe)) or "its defaults"
        extra_notes = [
            f"Linear probe and k-NN as eval_linear.py ran them with {asked} (each run's record of "
            f"those "
            "settings).",
            *extra_notes,
        ]
    if eval_label:
        extra_notes = [
            f"Linear probe and k-NN on {eval_label} (each run's "
            f"eval_linear_data_{eval_label}.json), not "
            "on the runs' own data.",
            *extra_notes,
        ]
    mark_screening(runs, screening)
    mark_reference(runs, reference)
    marked = [note for note in (mark_data_sets(runs), mark_protocols(runs)) if note]
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".make_table-", dir=out))
    try:
        _write_table(runs, staging, plots, [*marked, *extra_notes])
    except OSError as e:
        raise RunDirProblem(
            f"--out {out}: the table could not be written ({e.strerror or e}); the files there are "
            "as they were"
        ) from e
    finally:
        names = TEXT_FILES + (FIGURE_FILES if plots else ())
        staged = {name for name in names if (staging / name).exists()}
        # everything written: in place, and figures this table does not draw go
        if staged >= set(TEXT_FILES):
            for name in names:
                if name in staged:
                    os.replace(staging / name, out / name)
                else:
                    (out / name).unlink(missing_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
    return [out / name for name in names if name in staged]


def _write_table(
    runs: list[RunSummary], out: Path, plots: bool, extra_notes: Sequence[str]
) -> None:
    folder = runs_folder(
        runs
    )  # the CSV's and JSON's paths are relative to it: no path of this machine in them
    rows = build_rows(runs, folder)
    means = schedule_means(rows)
    speed = speed_verdict(runs)
    if speed.gpu is None:
        leave_out_speeds(rows, means)
    shown_means = (
        means if any(len(m.runs) > 1 for m in means) else []
    )  # one seed each: the rows say it all
    baselines = baseline_rows(runs, folder)
    floors = floor_means(rows)
    notes = table_notes(runs, rows, means, speed) + list(extra_notes)
    atomic_write_text(
        out / "table.md",
        "# Sparse-then-dense schedules\n\n"
        + markdown(
            rows, shown_means, baselines, notes, speeds=speed.gpu is not None, floors=floors
        ),
    )
    write_csv(rows, shown_means, baselines, out / "table.csv", floors=floors)
    if plots:
        from .table_figures import draw_figures  # matplotlib only when plotting

        # the figures show what the means show: screening runs are left out of them
        draw_figures(
            [r for r in runs if not r.screening],
            [r for r in rows if not r.screening],
            baselines,
            out,
        )
    summary = {
        "rows": [asdict(r) for r in rows],
        "schedule_means": [asdict(m) for m in shown_means],
        "baselines": [asdict(b) for b in baselines],
        "one_shot_floor": [asdict(f) for f in floors],
        "notes": notes,
        "speeds": {"gpu": speed.gpu, "left_out": speed.why_not},
    }
    # the published numbers only beside runs of their setting
    if any(is_published_setting(run) for run in runs):
        summary["published"] = {
            "source": published.SOURCE,
            "total_steps": published.TOTAL_STEPS,
            "rows": [asdict(p) for p in published.ROWS],
        }
    atomic_write_text(
        out / "summary.json", json.dumps(summary, indent=2) + "\n"
    )  # last: the set is complete
