"""How a `metrics.jsonl` line counts steps (torch-free: the tables and `slurm/launch.py status` read it too).

Since format 2 a line's `step` is the number of optimizer steps done when it was logged, as a checkpoint's
`step_XXXXXXXX.pt`, the teacher export's `step`, "resumed at step N" and the progress line count: the line of a
run's last step says `"step": total_steps`. Lines written before carry no `format` key and counted from 0 (the
index of the step just done, one less); `steps_done` reads both, so older run directories stay readable and a run
resumed across the change (old lines first, new ones after) reads as one sequence.
"""

FORMAT_KEY = "format"
METRICS_FORMAT = 2


def steps_done(record: dict) -> int:
    """Optimizer steps done when `record` (a metrics.jsonl line) was logged, whatever its format."""
    step = int(record["step"])
    return step if record.get(FORMAT_KEY, 1) >= 2 else step + 1
