"""Whether two runs' loss curves differ by more than two seeds' do: the check that a change of
numerics (e.g. `train.residual_dtype`) trains the same. Each curve is smoothed by a moving average
over `window` logged points (single steps are noisy); the candidate's distance to the baseline is
the mean absolute difference over the steps all runs logged, compared with the same distance between
the baseline and another seed of it. `setting_changes` reads the runs' config.yaml: the candidate
must start from the baseline's state (same `train.seed`) and the spread run must differ from the
baseline in `train.seed` alone, or the verdict would compare different things."""

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from configs.load import RESUMABLE_CHANGES, SEED_KEY, config_difference, read_config_text
from rundir.run_dir import RunDir

TOTAL = "loss"


@dataclass
class TermComparison:
    term: str
    steps: int  # logged steps all runs share
    difference: float  # mean |candidate - baseline| of the smoothed curves
    max_difference: float
    spread: float | None  # mean |baseline - other seed|; None without a spread run
    within_spread: bool | None


def loss_curves(run_dir: Path) -> dict[str, dict[int, float]]:
    """{term: {step: value}} of a run's metrics.jsonl (the total `loss` and every `*_loss` term;
    NaN/inf left out)."""
    curves: dict[str, dict[int, float]] = {}
    for record in RunDir(run_dir).read_metrics():
        for key, value in record.items():
            if (
                (key == TOTAL or key.endswith("_loss"))
                and isinstance(value, (int, float))
                and math.isfinite(value)
            ):
                curves.setdefault(key, {})[record["step"]] = float(value)
    return curves


def smoothed(values: list[float], window: int) -> list[float]:
    """Trailing moving average (the first points average what there is so far)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def _mean_abs(a: list[float], b: list[float]) -> tuple[float, float]:
    diffs = [abs(x - y) for x, y in zip(a, b)]
    return sum(diffs) / len(diffs), max(diffs)


def compare_runs(
    candidate: Path, baseline: Path, spread_run: Path | None = None, window: int = 10
) -> list[TermComparison]:
    """One comparison per loss term the runs share (the total first). ValueError when they share no
    logged step."""
    if window < 1:
        raise ValueError(f"window must be >= 1, not {window}")
    runs = [loss_curves(candidate), loss_curves(baseline)] + (
        [loss_curves(spread_run)] if spread_run else []
    )
    terms = sorted(set.intersection(*(set(r) for r in runs)), key=lambda t: (t != TOTAL, t))
    out = []
    for term in terms:
        steps = sorted(set.intersection(*(set(r[term]) for r in runs)))
        if not steps:
            continue
        curves = [smoothed([r[term][s] for s in steps], window) for r in runs]
        difference, max_difference = _mean_abs(curves[0], curves[1])
        spread = _mean_abs(curves[1], curves[2])[0] if spread_run else None
        out.append(
            TermComparison(
                term,
                len(steps),
                difference,
                max_difference,
                spread,
                None if spread is None else difference <= spread,
            )
        )
    if not out:
        raise ValueError(f"{candidate} and {baseline} share no logged step of any loss term")
    return out


def as_json(comparisons: list[TermComparison]) -> list[dict]:
    return [asdict(c) for c in comparisons]


def _changes(old_run: Path, new_run: Path) -> list[str]:
    """'key: old -> new' for the config keys that change what a run computes (not how it executes,
    as for a resume)."""
    old, new = (read_config_text(RunDir(run).config_file) for run in (old_run, new_run))
    return config_difference(old, new, allowed=RESUMABLE_CHANGES)


def setting_changes(
    candidate: Path, baseline: Path, spread_run: Path | None = None
) -> tuple[list[str], list[str]]:
    """(what the candidate changes against the baseline, as 'key: baseline -> candidate'; the
    problems that make the comparison meaningless). ConfigError for a run whose config.yaml is
    missing or unreadable."""
    changed = _changes(baseline, candidate)
    problems = [
        f"the candidate does not start from the baseline's state: {c}"
        for c in changed
        if c.startswith(SEED_KEY + ":")
    ]
    if spread_run is not None:
        spread = _changes(baseline, spread_run)
        other = [c for c in spread if not c.startswith(SEED_KEY + ":")]
        if other:
            problems.append(
                f"the spread run differs from the baseline in more than {SEED_KEY}: "
                f"{'; '.join(other)}"
            )
        if len(other) == len(spread):
            problems.append(
                f"the spread run has the baseline's {SEED_KEY}: it measures no seed-to-seed spread"
            )
    return changed, problems
