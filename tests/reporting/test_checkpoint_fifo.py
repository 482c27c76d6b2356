"""A FIFO named like a checkpoint is no checkpoint: the readers that list checkpoints (the tables,
the launcher's status, the trainer's resume) never open it, so nothing blocks. Run in a thread with
a deadline: a regression fails instead of hanging the suite."""

import os
import threading
from pathlib import Path

from reporting.run_logs import read_run
from rundir import compressed
from rundir.layout import list_checkpoints, newest_checkpoint

RUN = Path(__file__).resolve().parents[2] / "results" / "cifar10" / "recipe" / "screen" / "dense_s2"


def test_a_fifo_named_like_a_checkpoint_is_skipped_without_blocking(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.yaml", "metrics.jsonl", "eval_linear.json", "status.json"):
        (run / name).write_bytes(
            compressed.read_bytes(RUN / name)
        )  # committed runs keep their logs as .xz
    (run / "checkpoints").mkdir()
    os.mkfifo(run / "checkpoints" / "step_00007760.pt")
    assert list_checkpoints(run / "checkpoints") == [] and newest_checkpoint(run) is None
    result = []
    reader = threading.Thread(target=lambda: result.append(read_run(run)), daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert not reader.is_alive(), "read_run blocked on a FIFO named like a checkpoint"
    assert result[0].top1 == 71.37 and result[0].steps_done == 7760
