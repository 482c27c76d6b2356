"""Helpers for end-to-end runs of train.py in subprocesses (imported by the tests of this
folder)."""

import os
import subprocess
import sys
import time
from pathlib import Path

from tiny_run import TINY_MODEL_AND_DATA
from train_zygote import zygote

REPO = Path(__file__).resolve().parents[2]

# A run small enough to repeat several times per test on 2 CPU cores, with every feature on:
# multi-crop, masks, drop-path, both phases (switch after 8 of 16 steps), checkpoints every 3 steps,
# a metrics line per step.
TINY = [
    *TINY_MODEL_AND_DATA,
    "sparsity.sparse_fraction=0.5",
    "train.log_period=1",
    "train.checkpoint_period=3",
    "train.max_to_keep=3",
    "train.teacher_export_period=8",
]


def train_command(output_dir: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "train.py"),
        "--output-dir",
        str(output_dir),
        *TINY,
        *overrides,
    ]


def run_train(
    output_dir: Path, *overrides: str, check: bool = True, fresh: bool = False
) -> subprocess.CompletedProcess:
    """train.py to its end; forked from the zygote (`train_zygote.py`: the same run without the
    imports' seconds) unless `fresh`, a new interpreter."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = train_command(output_dir, *overrides)
    if fresh:
        result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    else:
        run = zygote(REPO).start(command[1:], REPO, env, new_session=False, capture_stdout=True)
        stdout, stderr = run.output()
        result = subprocess.CompletedProcess(command, run.returncode, stdout, stderr)
    if check and result.returncode != 0:
        raise AssertionError(f"train.py failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def start_train(output_dir: Path, *overrides: str, new_session: bool = False, fresh: bool = False):
    """train.py in the background (a `subprocess.Popen`, or the zygote's `ForkedRun` unless
    `fresh`); `new_session`: in a process group of its own (its data workers join it), so that the
    test can signal the whole group as Slurm does."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = train_command(output_dir, *overrides)
    if fresh:
        return subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            start_new_session=new_session,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
    return zygote(REPO).start(command[1:], REPO, env, new_session=new_session, capture_stdout=False)


def wait_for_step(metrics: Path, step: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Block until metrics.jsonl holds the line logged after `step` steps (the run is then inside
    step + 1)."""
    deadline = time.monotonic() + timeout
    needle = f'"step": {step},'
    while time.monotonic() < deadline:
        if metrics.exists() and needle in metrics.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended before step {step}: {proc.stderr.read()[-3000:]}")
        time.sleep(0.02)
    raise AssertionError(f"step {step} not reached in {timeout} s")
