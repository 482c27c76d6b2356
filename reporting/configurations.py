"""Which runs are seeds of one configuration, and how a configuration is labelled (the grouping of
`reporting.table`).

Two runs are seeds of one configuration iff their config.yaml are equal apart from `train.seed` and
the keys that only say how a run executes (`configs.load.RESUMABLE_CHANGES`; the per-GPU batch
counts through the global batch). A run's dense reference is the dense run of the same configuration
apart from the keys that act only with a sparse phase (`sparsity.*`, the teacher's restart at the
switch), of its seed if there is one, else of the lowest seed. A run whose teacher momentum restarts
at its switch (fraction f) has a second one where the runs hold it: the dense run whose momentum
restarts at f (`teacher.momentum_restart_fraction`), whose teacher follows the same schedule step
for step, so that the difference between the two is what the sparse phase costs and not what the
faster teacher gives. A learning-rate restart at the switch (`optim.lr_restart_at_switch`) is
compared as the restart at the switch's fraction of the steps (`optim.lr_restart_fraction`): both
start the cosine again at round(fraction x steps), one schedule under two spellings.
"""

from collections import Counter
from collections.abc import Sequence

from configs.load import RESUMABLE_CHANGES, SEED_KEY
from configs.schema import has_switch
from configs.sweep import acts_only_with_a_sparse_phase

from .run_logs import COMPLETE, RunSummary
from .table_format import config_value

SCHEDULE_KEY = "sparsity.sparse_fraction"
RESTART_AT_SWITCH_KEY = "teacher.momentum_restart_at_switch"
RESTART_FRACTION_KEY = (
    "teacher.momentum_restart_fraction"  # the same restart at a fixed share of the steps, any run
)
GLOBAL_BATCH_KEY = (
    "train.global_batch"  # processes x per-GPU batch: compared instead of train.batch_size_per_gpu
)
LR_RESTART_AT_SWITCH_KEY = "optim.lr_restart_at_switch"
LR_RESTART_FRACTION_KEY = "optim.lr_restart_fraction"
NOT_COMPARED = (SEED_KEY, *RESUMABLE_CHANGES)  # seeds of one configuration may differ in these


def schedule_label(fraction: float | None) -> str:
    if fraction is None:
        return "unknown schedule"
    label = f"{fraction * 100:g}% sparse"
    if fraction == 0.0:
        return label + " (dense baseline)"
    return label + " (2:4-sparse model)" if fraction == 1.0 else label


def config_label(differing: dict) -> str:
    """ "student.arch=vit_tiny, optim.base_lr=0.001": the values of the keys that differ between the
    rows."""
    return ", ".join(f"{key}={config_value(value)}" for key, value in differing.items())


def _short_schedule(fraction: float | None) -> str:
    """ "dense", "70% sparse": the schedule where a configuration's keys follow it."""
    return (
        "unknown schedule"
        if fraction is None
        else "dense"
        if fraction == 0.0
        else f"{fraction * 100:g}% sparse"
    )


def row_label(fraction: float | None, differing: dict) -> str:
    """The schedule alone where only schedules differ ("70% sparse", "0% sparse (dense baseline)"),
    else the short schedule and the differing keys ("dense · student.arch=vit_small", "70% sparse ·
    sparsity.teacher=sparse")."""
    if not differing:
        return schedule_label(fraction)
    return f"{_short_schedule(fraction)} · {config_label(differing)}"


def _short_key(key: str, keys: list[str]) -> str:
    last = key.rsplit(".", 1)[-1]
    return last if sum(k.rsplit(".", 1)[-1] == last for k in keys) == 1 else key


def short_labels(configs: list[dict]) -> tuple[list[str], dict]:
    """Per configuration, "key=value" for the keys whose value is not that key's most common one
    (first seen wins a tie), the key's last dotted part where that is unambiguous; a key that
    differs from its common value in exactly the configurations where an earlier key does
    (warmup_epochs with epochs) is left out. Returns the labels ("" for the most common
    configuration) and the most common values {short key: value}."""
    keys = list(dict.fromkeys(k for c in configs for k in c))
    base = {k: Counter(config_value(c.get(k)) for c in configs).most_common(1)[0][0] for k in keys}
    shown, patterns = [], set()
    for k in keys:
        pattern = tuple(config_value(c.get(k)) != base[k] for c in configs)
        if any(pattern) and pattern not in patterns:
            shown.append(k)
            patterns.add(pattern)
    labels = [
        ", ".join(
            f"{_short_key(k, keys)}={config_value(c.get(k))}"
            for k in shown
            if config_value(c.get(k)) != base[k]
        )
        for c in configs
    ]
    return labels, {_short_key(k, keys): base[k] for k in keys}


def common_values_note(base: dict) -> str:
    """The caption line that says what an empty or short label leaves out (`short_labels`' second
    result)."""
    return (
        "Unlabelled values are the most common ones: "
        + ", ".join(f"{k}={v}" for k, v in base.items())
        + "."
    )


def short_row_label(fraction: float | None, short: str) -> str:
    """ "70% sparse · epochs=80": a figure's name of a run, with `short_labels`' label of its
    configuration."""
    return f"{_short_schedule(fraction)} · {short}" if short else _short_schedule(fraction)


def compared_config(run: RunSummary) -> dict | None:
    """The run's config as compared between runs: without the seed and the keys of how it executes,
    with its global batch; None where config.yaml was not read."""
    if run.config is None:
        return None
    compared = {key: value for key, value in run.config.items() if key not in NOT_COMPARED}
    compared[GLOBAL_BATCH_KEY] = run.global_batch
    return _lr_restart_as_fraction(compared)


def _lr_restart_as_fraction(compared: dict) -> dict:
    """A learning-rate restart at the switch written as the restart at the switch's fraction, so
    that a run spelled either way is a seed of one configuration and meets the dense runs restarted
    at that fraction (the config checks refuse both keys set at once)."""
    if not compared.get(LR_RESTART_AT_SWITCH_KEY):
        return compared
    return {
        **compared,
        LR_RESTART_AT_SWITCH_KEY: False,
        LR_RESTART_FRACTION_KEY: compared[SCHEDULE_KEY],
    }


def hashable_value(value):
    return tuple(hashable_value(v) for v in value) if isinstance(value, (list, tuple)) else value


def differing_keys(runs: list[RunSummary]) -> list[str]:
    """The compared config keys (schedule aside) whose values are not the same in every run read, in
    config order."""
    configs = [c for run in runs if (c := compared_config(run)) is not None]
    keys = dict.fromkeys(key for c in configs for key in c)
    return [
        key
        for key in keys
        if key != SCHEDULE_KEY and len({hashable_value(c.get(key)) for c in configs}) > 1
    ]


def differing_config(run: RunSummary, keys: Sequence[str]) -> dict:
    compared = compared_config(run)
    return {} if compared is None else {key: compared.get(key) for key in keys}


def config_order(differing: dict) -> tuple:
    """Sort key of a configuration: numbers by value, other values by their text."""
    return tuple(
        (0, v, "")
        if isinstance(v, (int, float)) and not isinstance(v, bool)
        else (1, 0, config_value(v))
        for v in differing.values()
    )


def config_key(differing: dict, dense_reference: bool = False) -> tuple:
    """A configuration's differing keys and values as a dict key; with `dense_reference`, without
    the keys that act only with a sparse phase: what a configuration shares with the dense runs it
    is compared with (all other keys are equal in every run)."""
    return tuple(
        (key, hashable_value(value))
        for key, value in differing.items()
        if not (dense_reference and acts_only_with_a_sparse_phase(key))
    )


def dense_reference_key(run: RunSummary, keys: Sequence[str]) -> tuple | None:
    """`config_key` of the run's dense reference; None where the config is unknown."""
    if run.config is None:
        return None
    return config_key(differing_config(run, keys), dense_reference=True)


def same_teacher_key(
    differing: dict, sparse_fraction: float | None, switches: bool
) -> tuple | None:
    """`config_key` of the dense configuration whose teacher momentum follows, step for step, that
    of a configuration (its `differing` values) that restarts the momentum at its switch: the dense
    one restarted at the same fraction. None where the configuration does not restart at a switch,
    or where no run of the table sets a restart fraction (the key is not among the differing ones,
    so no such dense run is there)."""
    if (
        not switches
        or not differing.get(RESTART_AT_SWITCH_KEY)
        or RESTART_FRACTION_KEY not in differing
    ):
        return None
    return config_key({**differing, RESTART_FRACTION_KEY: sparse_fraction}, dense_reference=True)


def same_teacher_reference_key(run: RunSummary, keys: Sequence[str]) -> tuple | None:
    """`same_teacher_key` of a run; None where its config is unknown."""
    if run.config is None:
        return None
    switches = has_switch(run.sparse_steps or 0, run.total_steps or 0)
    return same_teacher_key(differing_config(run, keys), run.sparse_fraction, switches)


def dense_references(runs: list[RunSummary], keys: Sequence[str] = ()) -> dict[tuple, RunSummary]:
    """Per (configuration, seed, processes), (configuration, seed) and (configuration, None) =
    lowest seed: the dense run the others are compared with, fully trained, evaluated if any is. The
    configuration: `dense_reference_key` of the `keys` that differ."""
    references: dict[tuple, RunSummary] = {}
    ordered = sorted(runs, key=lambda r: (r.seed is None, r.seed or 0, r.name))
    for run in ordered:
        reference_key = dense_reference_key(run, keys)
        if run.sparse_fraction != 0.0 or run.train_status != COMPLETE or reference_key is None:
            continue
        for key in (
            (reference_key, run.seed, run.processes),
            (reference_key, run.seed),
            (reference_key, None),
        ):
            current = references.get(key)
            if current is None or (current.top1 is None and run.top1 is not None):
                references[key] = run
    return references


def dense_reference(
    run: RunSummary, references: dict, keys: Sequence[str], same_seed: bool = False
):
    """The run's dense reference among `dense_references`: its seed's on as many processes, else its
    seed's, else (unless `same_seed`) the lowest seed's. A complete dense run is its own, also where
    another run has its configuration and seed (the same run on another number of GPUs)."""
    reference_key = dense_reference_key(run, keys)
    if reference_key is None:
        return None
    if run.sparse_fraction == 0.0 and run.train_status == COMPLETE:
        return run
    return reference_for(run, references, reference_key, same_seed)


def same_teacher_reference(
    run: RunSummary, references: dict, keys: Sequence[str]
) -> RunSummary | None:
    """The dense run among `dense_references` whose teacher momentum follows the run's step for step
    (`same_teacher_key`), by seed as `dense_reference`; None where the run has none."""
    reference_key = same_teacher_reference_key(run, keys)
    return None if reference_key is None else reference_for(run, references, reference_key)


def reference_for(run: RunSummary, references: dict, reference_key: tuple, same_seed: bool = False):
    """The dense run of `reference_key` for `run`: its seed's on as many processes, else its seed's,
    else (unless `same_seed`) the lowest seed's."""
    return (
        references.get((reference_key, run.seed, run.processes))
        or references.get((reference_key, run.seed))
        or (None if same_seed else references.get((reference_key, None)))
    )
