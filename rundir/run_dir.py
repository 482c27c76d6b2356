"""`RunDir(path)`: one run directory's paths and typed readers, so that no command spells a run's
file names itself.

The names and the layout are `rundir.layout`'s; the readers are those of `rundir.status`,
`rundir.metrics` and `layout.read_run_info`, each of which turns a damaged or absent file into its
"nothing readable" value instead of raising. Torch-free, like the readers it gathers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import compressed, layout
from .metrics import metrics_by_steps_done
from .status import RunStatus, read_status


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    # ---------------------------------------------------------------------------------------- paths
    @property
    def config_file(self) -> Path:
        return self.path / layout.CONFIG

    @property
    def run_info_file(self) -> Path:
        return self.path / layout.RUN_INFO

    @property
    def status_file(self) -> Path:
        return self.path / layout.STATUS

    @property
    def metrics_file(self) -> Path:
        """metrics.jsonl (the committed runs keep it as `.xz`: read it through `read_metrics`)."""
        return self.path / layout.METRICS

    @property
    def masks_file(self) -> Path:
        return self.path / layout.SPARSITY_MASKS

    @property
    def log_file(self) -> Path:
        return self.path / layout.LOG

    @property
    def decisions_file(self) -> Path:
        return self.path / layout.SPARSITY_DECISIONS

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / layout.CHECKPOINTS

    @property
    def eval_dir(self) -> Path:
        return self.path / layout.EVAL_DIR

    @property
    def teacher(self) -> Path:
        """The final teacher's export, the backbone the probe reads."""
        return self.path / layout.TEACHER

    @property
    def student(self) -> Path:
        """The final student's export (train.export_student=true)."""
        return self.path / layout.STUDENT

    def teacher_export(self, step: int) -> Path:
        """A periodic teacher export: eval/step_XXXXXXXX/teacher_backbone.pth."""
        return layout.teacher_export_path(self.path, step)

    def checkpoint(self, step: int) -> Path:
        return self.checkpoint_dir / layout.checkpoint_name(step)

    def eval_result(self, knn_only: bool = False, suffix: str = "") -> Path:
        """A probe record (`layout.eval_result_name`); with no arguments the final teacher's linear
        probe, which the tables and the launcher read."""
        return self.path / layout.eval_result_name(knn_only, suffix)

    # ---------------------------------------------------------------------------------------- state
    def is_run(self) -> bool:
        """Whether the folder holds a run (its config, or, for older runs, its metrics)."""
        return layout.is_run_dir(self.path)

    def has_metrics(self) -> bool:
        """Whether metrics.jsonl is there, plain or compressed."""
        return compressed.exists(self.metrics_file)

    def checkpoints(self, suffix: str = "") -> list[tuple[int, Path]]:
        """(step, path) of its checkpoints, oldest first (`layout.list_checkpoints`)."""
        return layout.list_checkpoints(self.checkpoint_dir, suffix)

    def newest_checkpoint(self) -> tuple[int, Path] | None:
        return layout.newest_checkpoint(self.path)

    # -------------------------------------------------------------------------------------- readers
    def read_status(self) -> RunStatus:
        return read_status(self.path)

    def read_run_info(self) -> dict:
        return layout.read_run_info(self.path)

    def read_metrics(self) -> list[dict]:
        """The metrics lines with `step` counted as steps done; a line cut by a kill mid-write is
        skipped."""
        return metrics_by_steps_done(self.metrics_file)
