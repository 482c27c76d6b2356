"""Helpers for the launcher tests: a tiny run's overrides, `python slurm/launch.py` in a subprocess,
Slurm queries."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tiny_run import TINY_MODEL_AND_DATA

REPO = Path(__file__).resolve().parents[2]

# A run that takes ~15-25 s on one CPU core with every feature on (multi-crop, masks, drop-path,
# both phases: 16 steps, dense from step 8). Periodic checkpoints are off (period 100) so that a
# mid-run checkpoint can only come from a preemption signal.
TINY = [
    *TINY_MODEL_AND_DATA,
    "train.log_period=1",
    "train.checkpoint_period=100",
    "train.teacher_export_period=100",
]
TOTAL_STEPS = 16
# One CPU per job (two jobs share the 2-core CI machine), no GPU; a 30 min limit, so a USR2 is a
# preemption rather than a time-out (submitit counts every USR2 as a time-out when timeout_min <=
# 10).
CPU_JOB = [
    "--gpus-per-node",
    "0",
    "--cpus-per-task",
    "1",
    "--timeout-min",
    "30",
    "--signal-delay-s",
    "60",
]
SLURM_TIMEOUT_S = 240  # per wait; the whole Slurm module takes about 2 minutes on 2 cores


def controller_problem() -> str:
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "no Slurm client (sinfo/sbatch) on PATH"
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    if "is UP" not in ping.stdout:
        return f"no Slurm controller answers (scontrol ping: {(ping.stdout + ping.stderr).strip()})"
    nodes = subprocess.run(
        ["sinfo", "-h", "-o", "%t"], capture_output=True, text=True
    ).stdout.split()
    if not any(state.rstrip("*") in ("idle", "mix", "alloc") for state in nodes):
        return f"no usable Slurm node (sinfo states: {nodes})"
    return ""


def launch(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`python slurm/launch.py ...` from the repo root, exactly as a user types it."""
    result = subprocess.run(
        [sys.executable, "slurm/launch.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"launch.py {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}"
        )
    return result


def job_ids(run_dir: Path, kind: str) -> list[str]:
    path = run_dir / "jobs.json"
    return (
        [r["job_id"] for r in json.loads(path.read_text()) if r["kind"] == kind]
        if path.exists()
        else []
    )


def job_state(job_id: str) -> str:
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True, text=True
    )
    return out.stdout.strip() or "UNKNOWN"


def wait_for(condition, what: str, timeout: float = SLURM_TIMEOUT_S, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def slurm_logs(run_dir: Path) -> str:
    """Every submitit log of a run (for assertion messages and log checks)."""
    return "\n".join(
        f"--- {p}\n{p.read_text(errors='replace')}" for p in sorted(run_dir.glob("slurm/*/*_log.*"))
    )
