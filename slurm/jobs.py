"""Submitit jobs that run the repo's scripts (`train.py`, `eval_linear.py`) as child processes of
each task.

Why a child process rather than the trainer in-process: submitit handles the preemption/timeout
signal (USR2) in the task's Python process and, from inside that signal handler, calls
`checkpoint()`, requeues the job and exits. A trainer in the same process would be interrupted
mid-step. With a child, `checkpoint()` sends the child SIGTERM and waits: train.py finishes its
step, saves a checkpoint at that step boundary and exits 143 (its documented stop), then submitit
requeues and the requeued job reruns the very same command, which resumes from the newest checkpoint
in the run directory. The command is the one users run by hand, so the resume path is the one the
training tests check bit for bit.

Multi-GPU: one Slurm task per GPU (`tasks_per_node = gpus_per_node`, plain srun tasks, as the
reference launcher). Each task starts its own child with torchrun's variables (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT, LOCAL_WORLD_SIZE) taken from submitit's view of the Slurm
task, so train.py sees one uniform launch whether it runs under torchrun or here. Slurm delivers
USR2 to every task; submitit acts on rank 0 only. The trainer reduces its stop flag across ranks, so
SIGTERM to rank 0's child stops all ranks at the same step, rank 0 saves, and the other tasks see
their child exit 143 and wait for the requeue to end them.

Slurm signals every process of a job step (the whole tree), so the child would receive USR2 as well,
and USR2's default action kills a process: children start with USR2 ignored and are stopped only
through `checkpoint()`.
"""

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import submitit

from configs import load_eval_config
from reporting.eval_records import find_probe
from rundir.json_files import parse_json
from rundir.run_dir import RunDir

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
PREEMPTED_EXIT = (
    143  # train.py's exit status after a SIGTERM stop (checkpoint saved at a step boundary)
)


class ChildFailed(RuntimeError):
    """The script exited with an error; its own log says why."""


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _child_setup() -> None:
    """Runs in the child between fork and exec (both survive exec): USR2 ignored; on Linux, SIGTERM
    when this task dies, however it dies (a local job's controller SIGKILLs its tasks a second after
    SIGINT): the script then checkpoints at a step boundary and exits instead of training on as an
    orphan."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def distributed_env() -> dict[str, str]:
    """torchrun's variables for this submitit task, or nothing for a single-task job (or outside
    submitit)."""
    try:
        job = submitit.JobEnvironment()
        num_tasks = job.num_tasks
    except RuntimeError:  # not inside a submitit job
        return {}
    if num_tasks <= 1:
        return {}
    dist = submitit.helpers.TorchDistributedEnvironment()
    return {
        "MASTER_ADDR": dist.master_addr,
        "MASTER_PORT": str(dist.master_port),
        "RANK": str(dist.rank),
        "WORLD_SIZE": str(dist.world_size),
        "LOCAL_RANK": str(dist.local_rank),
        "LOCAL_WORLD_SIZE": str(dist.local_world_size),
    }


class ScriptJob(submitit.helpers.Checkpointable):
    """Run `python <script> <args>` from the repo root; on USR2 stop it through SIGTERM and requeue
    the same command.

    stop_timeout_s: how long `checkpoint()` waits for the child to save and exit before killing it
    (keep it below the job's signal delay; a kill only loses the steps since the last periodic
    checkpoint). peer_stop_grace_s: how long a task whose child stopped on a SIGTERM it did not send
    waits for Slurm to requeue or end the job before it reports the stop as an error.
    """

    script = ""

    def __init__(
        self,
        args: list[str],
        stop_timeout_s: float = 90.0,
        peer_stop_grace_s: float = 180.0,
        repo: Path = REPO,
    ):
        self.args = [str(a) for a in args]
        self.stop_timeout_s = stop_timeout_s
        self.peer_stop_grace_s = peer_stop_grace_s
        self.repo = Path(repo)
        self._child: subprocess.Popen | None = None

    def command(self) -> list[str]:
        return [sys.executable, str(self.repo / self.script), *self.args]

    def child_env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **distributed_env()}
        if "OMP_NUM_THREADS" not in env and "SLURM_CPUS_PER_TASK" in env:
            env["OMP_NUM_THREADS"] = env[
                "SLURM_CPUS_PER_TASK"
            ]  # torch would otherwise use every core of the node
        return env

    def __getstate__(
        self,
    ) -> dict:  # the child process handle does not travel in the requeue pickle
        return {**self.__dict__, "_child": None}

    def start(self) -> subprocess.Popen:
        logger.info("running %s", " ".join(self.command()))
        self._child = subprocess.Popen(
            self.command(), cwd=self.repo, env=self.child_env(), preexec_fn=_child_setup
        )
        return self._child

    def __call__(self):
        self.start()
        # Poll rather than wait(): checkpoint() runs inside a signal handler that interrupts this
        # loop and must be able to reap the child itself (a blocking Popen.wait() would hold the
        # lock it needs).
        try:
            while self._child.poll() is None:
                time.sleep(0.5)
        # a local job stopped (its controller's SIGINT): the script stops too
        except KeyboardInterrupt:
            if self._child.poll() is None:
                self._child.send_signal(signal.SIGTERM)
            raise
        code = self._child.returncode
        if code == 0:
            return self.result()
        if code in (PREEMPTED_EXIT, -signal.SIGTERM):
            # Stopped by a SIGTERM this task did not send: rank 0 was told to checkpoint (the stop
            # is reduced across ranks) or Slurm is preempting/cancelling the job. The checkpoint is
            # on disk; Slurm requeues or ends this task shortly, and a USR2 arriving meanwhile still
            # reaches checkpoint().
            time.sleep(self.peer_stop_grace_s)
            raise ChildFailed(
                f"{self.script} stopped on SIGTERM (exit {code}) and the job was neither requeued "
                f"nor "
                f"ended within {self.peer_stop_grace_s:.0f} s; rerun the launcher to resume"
            )
        raise ChildFailed(f"{self.script} {' '.join(self.args)} exited with status {code}")

    def result(self):
        return None

    def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
        child = self._child
        if child is not None and child.poll() is None:
            logger.warning(
                "preemption/timeout signal: asking %s (pid %d) to checkpoint",
                self.script,
                child.pid,
            )
            child.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout_s
            while child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if child.poll() is None:
                logger.error(
                    "%s did not stop within %.0f s: killing it (resume from its last periodic "
                    "checkpoint)",
                    self.script,
                    self.stop_timeout_s,
                )
                child.kill()
                child.wait()
            logger.info("%s exited with status %s; requeueing", self.script, child.returncode)
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


class TrainJob(ScriptJob):
    """`train.py --config C --output-dir RUN key=value...`; a requeued job resumes from RUN's newest
    checkpoint."""

    script = "train.py"

    def __init__(self, config: Path, run_dir: Path, overrides: list[str], **kwargs):
        super().__init__(
            ["--config", str(config), "--output-dir", str(run_dir), *overrides], **kwargs
        )
        self.run_dir = Path(run_dir)

    def result(self) -> dict:
        return {"run_dir": str(self.run_dir), "teacher": str(RunDir(self.run_dir).teacher)}


class EvalJob(ScriptJob):
    """`eval_linear.py --run RUN key=value...`, which writes the run's probe record
    (RUN/eval_linear.json for the run's own data; named after the data otherwise). A preempted probe
    starts over."""

    script = "eval_linear.py"

    def __init__(self, run_dir: Path, overrides: list[str] = (), **kwargs):
        super().__init__(["--run", str(run_dir), *overrides], **kwargs)
        self.run_dir = Path(run_dir)
        self.overrides = list(overrides)

    def result(self) -> dict:
        record = find_probe(self.run_dir, load_eval_config(None, self.overrides))
        if record is None:
            raise ChildFailed(
                f"eval_linear.py exited cleanly but {self.run_dir} holds no readable record of its "
                f"probe ({' '.join(self.overrides) or 'default settings'})"
            )
        return parse_json(Path(record.path).read_bytes())
