"""What a run writes about itself, apart from the loop (trainer.py), its checkpoints and its
exports: the files a (re)start writes before the first step (config.yaml, run_info.json,
status.json, metrics.jsonl cut back to the checkpoint), status.json's later states, and the
metrics.jsonl lines. Rank 0 alone writes; every rank calls.
"""

import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch

from configs import Config, as_written, to_yaml
from rundir.guard import set_aside_checkpoints, set_aside_results
from rundir.layout import write_config, write_run_info
from rundir.metrics import FORMAT_KEY, METRICS_FORMAT, MetricsLog
from rundir.run_dir import RunDir
from rundir.status import RUNNING, new_run_id, read_status, resumed_history, write_status
from sparsity.backends.timing import device_memory_outside_mb

from .progress import log_run_info, max_memory_mb

logger = logging.getLogger(__name__)


class RunRecords:
    def __init__(self, output_dir: Path, is_main: bool):
        self.output_dir, self.is_main = Path(output_dir), is_main
        self.metrics = MetricsLog(RunDir(self.output_dir).metrics_file, enabled=is_main)
        self.run_id = (
            ""  # this run's identity (status.json, every checkpoint): made at a fresh start
        )
        self.resumed_at: list[int] = []  # steps this run was resumed at, for status.json

    def start(
        self,
        cfg: Config,
        step: int,
        resumed: bool,
        checkpoint_directory: Path,
        run_info: Callable[[], dict],
    ) -> None:
        """What a (re)start at `step` writes before the first step: config.yaml, run_info.json (and
        the start-up summary; `run_info` is only called on rank 0), status.json (running), and
        metrics.jsonl cut back to the checkpoint. A fresh start first sets an earlier run's files
        aside, so that none is read as this run's."""
        if self.is_main:
            if not resumed and (aside := set_aside_results(self.output_dir)) is not None:
                logger.warning(
                    "starting at step 0 in a directory that held a previous run's teacher or "
                    "evaluations: "
                    "moved them to %s (never read as this run's)",
                    aside,
                )
            if not resumed and (aside := set_aside_checkpoints(checkpoint_directory)) is not None:
                logger.warning(
                    "starting at step 0 beside an earlier run's checkpoints: moved them to %s "
                    "(never "
                    "resumed as this run's)",
                    aside,
                )
            self.run_id = self.run_id or new_run_id()
            self.resumed_at = resumed_history(read_status(self.output_dir), step, resumed)
            write_config(self.output_dir, to_yaml(cfg))
            info = run_info()
            log_run_info(info, self.output_dir, as_written(cfg, "data.root", cfg.data.root))
            write_run_info(self.output_dir, info)
            self.status(RUNNING, step)
        # lines logged after the checkpoint are logged again; a fresh start in a used directory
        # replaces the old log
        self.metrics.truncate_after(step)

    def status(self, state: str, step: int, reason: str = "") -> None:
        """status.json (rank 0): a failure to write it is logged, never raised over what ended the
        run."""
        if not self.is_main:
            return
        try:
            write_status(self.output_dir, state, step, reason[:2000], self.resumed_at, self.run_id)
        except OSError as e:
            logger.warning(
                "could not record the run's status (%s) in %s: %s", state, self.output_dir, e
            )


def metrics_line(
    step: int,
    phase: str,
    loss,
    *fields: dict,
    corrupt_skipped: int,
    images_per_s: float,
    device: torch.device,
) -> dict:
    """A metrics.jsonl line: `step` counts the steps done (as checkpoints do; see run_dir); `fields`
    (the loss terms, schedule values, gradient norms, the sparse backends' summary) follow the loss
    in the order given."""
    # the tables show a run's speed only where this stayed small (reporting.speed_columns)
    memory, outside = max_memory_mb(device), device_memory_outside_mb(device)
    line = {"step": step, FORMAT_KEY: METRICS_FORMAT, "phase": phase, "loss": loss}
    for values in fields:
        line.update(values)
    return {
        **line,
        "corrupt_skipped": corrupt_skipped,
        "images_per_s": images_per_s,
        "time": round(time.time(), 3),  # wall clock at the line: runs sharing a GPU can be lined up
        **({"max_mem_mb": round(memory, 1)} if memory is not None else {}),
        **({"gpu_mem_outside_mb": round(outside, 1)} if outside is not None else {}),
    }
