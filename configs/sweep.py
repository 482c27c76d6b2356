"""One run per sparse fraction from one config and one set of overrides (the Slurm sweep,
scripts/reproduce.py).

Some keys act only with a sparse phase: every `sparsity.*` key, and the keys that act at the
sparse-to-dense switch. A sparse run is compared with the dense run that differs from it only in
these (reporting). The switch keys are refused by a run without a switch (0% or 100% sparse), so a
sweep applies them where they act: its runs without a switch keep them off, and the run's notes say
so. One command line then serves every fraction of a recipe.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from .fields import flagged_fields
from .load import DEFAULT_CONFIG, ConfigError, _merged, load_config
from .schema import Config

SPARSE_PHASE_PREFIX = "sparsity."
# key: its value where a run has no switch (the fields flagged `at_switch=True` in schema.py, off at
# their default)
SWITCH_KEYS = {key: f.default for key, f in flagged_fields(Config, "at_switch").items()}


def acts_only_with_a_sparse_phase(key: str) -> bool:
    return key.startswith(SPARSE_PHASE_PREFIX) or key in SWITCH_KEYS


def refuse_fraction_override(overrides: Sequence[str], option: str) -> None:
    """ConfigError where the overrides set sparsity.sparse_fraction, which the sweep sets per run
    from `option`."""
    if any(item.split("=", 1)[0].strip() == "sparsity.sparse_fraction" for item in overrides):
        raise ConfigError(f"sparsity.sparse_fraction is set per run by {option}; drop the override")


def _dotlist_value(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass
class ScheduleRun:
    overrides: list[
        str
    ]  # the sweep's, then this run's sparsity.sparse_fraction, then any switch key turned off
    cfg: Config
    notes: list[str] = field(default_factory=list)


def schedule_run(path: Path | str | None, overrides: Sequence[str], fraction: float) -> ScheduleRun:
    """The config of the sweep's run at `fraction` (ConfigError as `load_config`). Where that run
    has no switch and the config or the overrides set a switch key, the key is turned off for this
    run and a note names it."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    run = [*overrides, f"sparsity.sparse_fraction={fraction}"]
    turned_off = [f"{key}={_dotlist_value(off)}" for key, off in SWITCH_KEYS.items()]
    without_switch_keys = load_config(path, [*run, *turned_off])
    if without_switch_keys.switches:
        return ScheduleRun(run, load_config(path, run))
    requested = _merged(Config, path, run)
    set_keys = [key for key, off in SWITCH_KEYS.items() if OmegaConf.select(requested, key) != off]
    if not set_keys:
        return ScheduleRun(run, without_switch_keys)
    notes = [
        f"{key}={_dotlist_value(OmegaConf.select(requested, key))} left out: "
        f"{fraction * 100:g}% sparse has no switch"
        for key in set_keys
    ]
    return ScheduleRun(
        [*run, *(f"{key}={_dotlist_value(SWITCH_KEYS[key])}" for key in set_keys)],
        without_switch_keys,
        notes,
    )
