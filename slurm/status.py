"""Where each run of a sweep stands: `python slurm/launch.py status --runs-dir DIR` (or `python
slurm/status.py`). DIR is the sweep folder, or one run directory (then that run alone).

One line per run directory: steps done of the run's total (with how the run ended, when it did:
finished, preempted, failed, as the trainer recorded it), the sparsity phase of the last logged
step, the newest checkpoint, the latest training and evaluation jobs with their Slurm state, and the
linear-probe result. Progress comes from the run directory (`rundir`: metrics.jsonl, checkpoints/,
status.json, eval_linear.json), job states from `sacct` (with `squeue` as a fallback where
accounting is off), so it works for runs launched by hand as well.
"""

import argparse
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from configs import ConfigError, load_config, load_eval_config  # noqa: E402
from configs.command_line import parse_command_line  # noqa: E402
from reporting.eval_records import COMPLETE, MISSING, find_probe, read_eval_record  # noqa: E402
from rundir.errors import RunDirProblem  # noqa: E402
from rundir.layout import CONFIG, EVAL_RESULT, METRICS  # noqa: E402
from rundir.run_dir import RunDir  # noqa: E402
from rundir.status import RUNNING, last_step  # noqa: E402
from slurm.sweep import JOBS_FILE, JobRecord, read_jobs  # noqa: E402

# Job states after which Slurm may still run the job (a requeued job is PENDING again).
ACTIVE_STATES = {
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "CONFIGURING",
    "COMPLETING",
    "SUSPENDED",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
}
FAILED_STATES = {
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}
JOB_KINDS = ("train", "eval")  # the job columns of the table, in order


def _parse_states(text: str) -> dict[str, str]:
    lines = [line.split("|") for line in text.splitlines() if line.strip()]
    if not lines:
        return {}
    header = lines[0]
    states = {}
    for fields in lines[1:]:
        row = dict(zip(header, fields))
        job_id, state = row.get("JobID", ""), row.get("State", "")
        if job_id and "." not in job_id and state:
            states[job_id] = state.split()[
                0
            ]  # "CANCELLED by 0" -> CANCELLED; the last row of a requeued job wins
    return states


def query_states(job_ids: Iterable[str]) -> dict[str, str]:
    """{job id: Slurm state} for the ids Slurm still knows; {} where no Slurm client is
    installed."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    command = ["sacct", "-o", "JobID,State", "--parsable2", *[a for i in ids for a in ("-j", i)]]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if done.returncode == 0:
            return _parse_states(done.stdout)
        states = {}  # accounting disabled: squeue knows jobs for MinJobAge after they end
        for job_id in ids:
            done = subprocess.run(
                ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%i|%T"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            states.update(
                _parse_states("JobID|State\n" + done.stdout) if done.returncode == 0 else {}
            )
        return states
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return {}


def _total_steps(run_dir: Path) -> int | None:
    try:
        return last_step(load_config(RunDir(run_dir).config_file))
    except (ConfigError, OSError, ValueError):
        return None


def _eval_summary(run_dir: Path, eval_args: list[str]) -> str:
    """The linear-probe top-1 of the probe the run's eval job ran (`eval_args`, its settings as
    recorded in jobs.json: `reporting.eval_records.find_probe`, as the launcher's "done"), else of
    the run's own eval_linear.json, read as the table reads it (only a finite percentage; a FIFO is
    never opened)."""
    try:
        found = find_probe(run_dir, load_eval_config(None, eval_args))
    except ConfigError:  # settings this version refuses: the usual record is all there is to show
        found = None
    if found is not None and found.top1 is not None:
        return f"top1 {found.top1:.2f}"
    record = read_eval_record(RunDir(run_dir).eval_result())
    if record.status == MISSING:
        return "-"
    if record.status != COMPLETE:
        return f"unreadable ({record.reason})"
    if record.top1 is None:
        return f"unreadable ({EVAL_RESULT}: no top1)"
    return f"top1 {record.top1:.2f}"


def _latest_jobs(run_dir: Path) -> dict[str, JobRecord | None] | None:
    """The latest recorded job of each kind, from one read of jobs.json; None when it cannot be
    read."""
    try:
        jobs = read_jobs(run_dir)
    except RunDirProblem:
        return None
    return {kind: next((j for j in reversed(jobs) if j.kind == kind), None) for kind in JOB_KINDS}


def run_row(run_dir: Path, states: dict[str, str]) -> dict[str, str]:
    run = RunDir(run_dir)
    records = run.read_metrics()  # step = steps done, whatever the line's format
    record = records[-1] if records else None
    total = _total_steps(run_dir)
    newest = run.newest_checkpoint()
    status = run.read_status()
    state = status.state  # running: the Slurm state says more (a killed run cannot record its end)
    # the step the run reached: metrics lines come every log_period steps, the checkpoint and
    # status.json say more
    step = max([record["step"] if record else 0, status.step or 0, newest[0] if newest else 0])
    row = {
        "run": run_dir.name,
        "step": f"{step}/{total if total is not None else '?'}"
        + (f" {state}" if state and state != RUNNING else ""),
        "phase": record.get("phase", "?") if record else "-",
        "checkpoint": str(newest[0]) if newest else "-",
    }
    jobs = _latest_jobs(run_dir)
    for kind in JOB_KINDS:
        if jobs is None:  # the row says so; the other runs' rows still print
            row[f"{kind} job"] = f"unreadable {JOBS_FILE}"
            continue
        job = jobs[kind]
        if job is None:
            row[f"{kind} job"] = "-"
        elif job.cluster == "local":
            row[f"{kind} job"] = f"{job.job_id} (local)"
        else:
            row[f"{kind} job"] = f"{job.job_id} {states.get(job.job_id, 'UNKNOWN')}"
    eval_job = jobs.get("eval") if jobs else None
    row["eval"] = _eval_summary(run_dir, eval_job.args if eval_job else [])
    return row


def _is_run(path: Path) -> bool:
    return any((path / name).exists() for name in (CONFIG, JOBS_FILE, METRICS))


def find_runs(runs_dir: Path) -> list[Path]:
    """The run directories of a sweep folder, or [runs_dir] if it is a run directory itself;
    FileNotFoundError if there is none (an empty table would read as "nothing launched")."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise FileNotFoundError(f"{runs_dir}: no such sweep folder")
    if _is_run(runs_dir):
        return [runs_dir]
    runs = sorted(p for p in runs_dir.iterdir() if p.is_dir() and _is_run(p))
    if not runs:
        raise FileNotFoundError(
            f"{runs_dir}: neither a run directory (no {CONFIG}, {JOBS_FILE} or {METRICS}) "
            f"nor a sweep folder holding runs (one sub-folder per fraction, e.g. sparse_0.70): "
            f"pass the --runs-dir given to the launcher, or one run's directory"
        )
    return runs


def sweep_rows(runs_dir: Path) -> list[dict[str, str]]:
    runs = find_runs(runs_dir)
    ids = [
        j.job_id
        for r in runs
        for j in (_latest_jobs(r) or {}).values()
        if j and j.cluster == "slurm"
    ]
    states = query_states(ids)
    return [run_row(r, states) for r in runs]


def format_table(rows: list[dict[str, str]]) -> str:
    if not rows:
        return "(no runs)"
    headers = list(rows[0])
    widths = [max(len(h), *(len(str(r[h])) for r in rows)) for h in headers]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines += ["  ".join(str(r[h]).ljust(w) for h, w in zip(headers, widths)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="slurm/launch.py status",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--runs-dir",
        type=Path,
        required=True,
        help="the sweep folder given to the launcher, or one run directory",
    )
    args = parse_command_line(parser, argv)
    try:
        rows = sweep_rows(args.runs_dir)
    except (FileNotFoundError, ValueError) as e:
        print(f"status: {e}", file=sys.stderr)
        return 2
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
