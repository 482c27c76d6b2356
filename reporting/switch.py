"""What the sparse -> dense switch does to the probed teacher, per run: the question behind the
CIFAR-10 table's kink (results/cifar10/NOTES.md). For each run directory:

- the switch step and `sparsity.switch_weights`;
- how much of the switch-time EMA teacher is still in the final teacher: the product of the teacher
  momenta over the dense steps (the trainer's own schedule, `training.schedules.build_schedules`);
- the k-NN top-1 of the teacher exported at the switch, as the dense network it is and with its MLPs
  2:4-pruned;
- the final teacher's linear and k-NN top-1 as the run trained it (`eval_linear.json`), and its k-NN
  in the other mode (pruned after a dense end, dense after a sparse one).

The evaluations are eval_linear.py's result files, found by the names
`evaluation.evaluate.default_output_name` gives them (`eval_knn_step_S.json`, `*_pruned_mlp.json` /
`*_dense_mlp.json` for the mode other than the run's last step); a missing one is None.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from configs import ConfigError, load_config
from evaluation.evaluate import default_output_name
from evaluation.mlp_pruning import probe_suffix, run_ended_sparse
from rundir.layout import teacher_export_path
from rundir.run_dir import RunDir
from training.schedules import build_schedules

from .run_logs import COMPLETE, read_eval_record


@dataclass
class SwitchRow:
    run: str
    sparse_fraction: float
    switch_weights: str
    seed: int
    switch_step: int | None  # None: the run never switched (dense, or sparse to the end)
    teacher_left: float | None  # share of the switch-time teacher in the final one
    knn_switch_dense: float | None
    knn_switch_pruned: float | None
    linear_final: (
        float | None
    )  # as trained: dense MLPs after a dense end, pruned after a sparse one
    knn_final: float | None
    knn_final_other: float | None  # the other mode
    ended_sparse: bool


def _knn(run_dir: Path, step: int | None, prune: bool, ended_sparse: bool) -> float | None:
    """k-NN top-1 of the teacher exported at `step` (None: the final teacher) probed with pruned
    MLPs or not, from the file eval_linear.py names for that probe; None when it is missing or
    unreadable."""
    checkpoint = teacher_export_path(run_dir, step) if step is not None else None
    name = default_output_name(
        "knn", None, checkpoint, run_dir, step, probe_suffix(prune, prune == ended_sparse)
    )
    record = read_eval_record(run_dir / name)
    return record.knn_top1 if record.status == COMPLETE else None


def teacher_left(momentum: np.ndarray, first_dense_step: int) -> float:
    """The weight of the teacher before step `first_dense_step` in the teacher after the last step:
    each EMA update keeps `momentum[t]` of it."""
    return float(np.prod(momentum[first_dense_step:], dtype=np.float64))


def switch_row(run_dir: Path) -> SwitchRow:
    """One run's row; ConfigError if its config.yaml cannot be read."""
    cfg = load_config(RunDir(run_dir).config_file)
    ended_sparse = run_ended_sparse(cfg)
    switches = cfg.switches
    step = cfg.sparse_steps if switches else None
    final = read_eval_record(RunDir(run_dir).eval_result())
    return SwitchRow(
        run=run_dir.name,
        sparse_fraction=cfg.sparsity.sparse_fraction,
        switch_weights=cfg.sparsity.switch_weights,
        seed=cfg.train.seed,
        switch_step=step,
        teacher_left=teacher_left(build_schedules(cfg, 1).momentum, step) if switches else None,
        knn_switch_dense=_knn(run_dir, step, False, ended_sparse) if switches else None,
        knn_switch_pruned=_knn(run_dir, step, True, ended_sparse) if switches else None,
        linear_final=final.top1 if final.status == COMPLETE else None,
        knn_final=final.knn_top1 if final.status == COMPLETE else None,
        knn_final_other=_knn(run_dir, None, not ended_sparse, ended_sparse),
        ended_sparse=ended_sparse,
    )


def switch_rows(run_dirs: list[Path]) -> tuple[list[SwitchRow], list[str]]:
    """Rows of the readable runs, sorted by setting, fraction and seed; and one problem line per
    unreadable run."""
    rows, problems = [], []
    for run_dir in run_dirs:
        try:
            rows.append(switch_row(run_dir))
        except (ConfigError, OSError) as e:
            problems.append(f"{run_dir}: {e}")
    rows.sort(key=lambda r: (r.switch_weights, r.sparse_fraction, r.seed, r.run))
    return rows, problems


def _cell(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def markdown(rows: list[SwitchRow]) -> str:
    lines = [
        "| run | sparse | switch at | switch weights | switch-time teacher left at the end | k-NN "
        "at the switch, "
        "dense / pruned | final linear | final k-NN, as trained / other mode |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        final_mode = "pruned" if r.ended_sparse else "dense"
        lines.append(
            f"| {r.run} | {r.sparse_fraction:.0%} | "
            f"{r.switch_step if r.switch_step is not None else '–'} | "
            f"{r.switch_weights} | {_cell(r.teacher_left, 3)} | {_cell(r.knn_switch_dense)} / "
            f"{_cell(r.knn_switch_pruned)} | {_cell(r.linear_final)} | {_cell(r.knn_final)} "
            f"({final_mode}) / "
            f"{_cell(r.knn_final_other)} |"
        )
    return "\n".join(lines) + "\n"


def as_json(rows: list[SwitchRow]) -> list[dict]:
    return [asdict(r) for r in rows]
