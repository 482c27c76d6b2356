"""The last lines `train.py` prints: where the run ended, its final loss, how long this command
took, and the next command to type. Torch-free: read from the run directory (metrics.jsonl, the
exported teacher) and the config."""

import shlex
from pathlib import Path

from rundir.run_dir import RunDir
from rundir.status import last_step


def duration(seconds: float) -> str:
    """41.2s, 2m 05s, 1h 02m 03s."""
    if round(seconds, 1) < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def shown_path(path: Path) -> str:
    """`path` as a user types it: relative to the working directory when it lies inside it, quoted
    for a shell."""
    path = Path(path)
    try:
        path = path.resolve().relative_to(Path.cwd().resolve())
    except (OSError, ValueError):
        pass
    return shlex.quote(str(path))


def next_probe(eval_script: str, run: str, dataset: str) -> str:
    """The probe command to type next; a run on unlabelled images (image_folder) has no labels to
    probe with, so the command names the labelled set it needs."""
    if dataset == "image_folder":
        return (
            f"next: python {eval_script} --run {run} data.dataset=imagenet_folder data.root=<a "
            f"labelled set: "
            "train/<class>/<image> and val/<class>/<image>>   (linear probe and k-NN of the "
            "teacher; the "
            "training images have no labels)"
        )
    return f"next: python {eval_script} --run {run}   (linear probe and k-NN of the teacher)"


def closing_lines(
    output_dir: Path, cfg, elapsed_s: float, eval_script: Path = Path("eval_linear.py")
) -> list[str]:
    """What a finished `train.py` says last: the step reached and this command's time, the final
    logged loss, the files, then the next command (the linear probe once the teacher is exported;
    else how to continue)."""
    output_dir = Path(output_dir)
    run_dir = RunDir(output_dir)
    metrics = run_dir.metrics_file
    records = [r for r in run_dir.read_metrics() if isinstance(r.get("loss"), (int, float))]
    last, total = last_step(cfg), cfg.total_steps
    reached = records[-1]["step"] if records else last
    loss = f"final loss {records[-1]['loss']:.4f} (step {reached})" if records else "no loss logged"
    teacher = run_dir.teacher
    lines = [f"done: step {reached} of {total} in {duration(elapsed_s)}; {loss}"]
    run = shown_path(output_dir)
    if teacher.is_file():
        lines.append(f"teacher: {shown_path(teacher)}; metrics: {shown_path(metrics)}")
        lines.append(next_probe(shown_path(eval_script), run, cfg.data.dataset))
    else:  # stopped at train.max_steps: no final teacher yet
        lines.append(
            f"stopped at train.max_steps={last} of {total} steps: no final teacher yet; metrics: "
            f"{shown_path(metrics)}"
        )
        lines.append(
            f"next: rerun the same command with a larger train.max_steps (0: the whole schedule) "
            f"to continue "
            f"{run} from its last checkpoint"
        )
    return lines
