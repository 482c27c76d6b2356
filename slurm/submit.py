"""Submit a planned sweep: one checkpointable training job per fraction and an `afterok`-chained
linear probe.

Slurm parameters are built once, as keyword arguments of `submitit.SlurmExecutor.update_parameters`;
the same dictionary feeds the real submission and the `--dry-run` preview of the sbatch file, so
what is printed is what would be submitted. `--local` runs the same job objects with submitit's
LocalExecutor, one run after the other (a workstation has one set of GPUs: parallel runs would only
compete for them).
"""

import contextlib
import logging
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import submitit
from submitit.slurm.slurm import _make_sbatch_string  # noqa: PLC2701 - the formatter submit() itself uses

from . import processes
from .jobs import REPO, EvalJob, TrainJob
from .status import ACTIVE_STATES, query_states
from .sweep import JOB_LOGS, RunPlan, latest_job, record_job

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resources:
    partition: str | None
    nodes: int = 1
    gpus_per_node: int = 8
    cpus_per_task: int = 10
    timeout_min: int = 4320
    signal_delay_s: int = (
        120  # USR2 this long before the time limit: a ViT-L checkpoint must fit in it
    )
    max_num_timeout: int = 30  # requeues after time limits (preemptions do not count)
    mem_gb: int | None = None  # None: the cluster's default
    eval_gpus: int = 1
    eval_timeout_min: int = 720
    slurm_extra: dict = field(
        default_factory=dict
    )  # further sbatch options, e.g. {"account": "abc"}

    cpu_tasks_per_node: int = 1  # processes per node when there are no GPUs (gloo)

    @property
    def tasks_per_node(self) -> int:
        return self.gpus_per_node or self.cpu_tasks_per_node  # one task per GPU


def _common(res: Resources, name: str, gpus: int, timeout_min: int) -> dict:
    params = {
        "job_name": name,
        "time": timeout_min,
        "cpus_per_task": res.cpus_per_task,
        "signal_delay_s": res.signal_delay_s,
        # The repo must be importable where the job unpickles its callable (slurm.jobs.*), wherever
        # it was launched.
        "setup": [f"export PYTHONPATH={shlex.quote(str(REPO))}${{PYTHONPATH:+:$PYTHONPATH}}"],
    }
    if res.partition:
        params["partition"] = res.partition
    if gpus:
        params["gpus_per_node"] = gpus
    if res.mem_gb is not None:
        params["mem"] = f"{res.mem_gb}GB"
    return params


def train_parameters(res: Resources, name: str) -> dict:
    params = _common(res, name, res.gpus_per_node, res.timeout_min)
    params.update(nodes=res.nodes, ntasks_per_node=res.tasks_per_node)
    params["additional_parameters"] = {"requeue": True, **res.slurm_extra}
    return params


def eval_parameters(res: Resources, name: str, after: str | None) -> dict:
    params = _common(res, name, res.eval_gpus, res.eval_timeout_min)
    params.update(nodes=1, ntasks_per_node=1)
    extra = {"requeue": True, **res.slurm_extra}
    if after:
        params["dependency"] = f"afterok:{after}"
        extra["kill-on-invalid-dep"] = (
            "yes"  # training failed: cancel the probe instead of leaving it pending
        )
    params["additional_parameters"] = extra
    return params


# a newline (or any control character) in a text that reaches an sbatch file ends its line: the rest
# of an `#SBATCH` option becomes a command line, and sbatch stops reading `#SBATCH` options there
CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")


def control_character_problem(what: str, text: str) -> str:
    """'' if `text` is one printable line, else a one-line refusal naming `what` (an option, a
    key)."""
    found = CONTROL_CHARACTER.search(text)
    if found is None:
        return ""
    return (
        f"{what}: {text!r} holds the control character {found.group()!r} (position "
        f"{found.start()}): a text that "
        "reaches an sbatch file must be one printable line"
    )


def _texts(params: dict):
    """(parameter, text) for every text of submitit's Slurm parameters (dicts as key=value, lists
    item by item)."""
    for key, value in params.items():
        if isinstance(value, dict):
            yield from ((key, f"{k}={v}") for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            yield from ((key, str(v)) for v in value)
        else:
            yield key, str(value)


def check_one_line(params: dict, folder: Path) -> None:
    """ValueError unless every text of the sbatch parameters (and the job folder) is one printable
    line."""
    for what, text in [("folder", str(folder)), *_texts(params)]:
        problem = control_character_problem(what, text)
        if problem:
            raise ValueError(problem)


def sbatch_preview(params: dict, folder: Path) -> str:
    """The sbatch file submitit would write for these parameters (its own formatter and command,
    nothing submitted)."""
    check_one_line(params, folder)
    command = " ".join(
        [shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(str(folder))]
    )
    return _make_sbatch_string(command=command, folder=folder, **params)


@dataclass
class Submitted:
    plan: RunPlan
    train: str = "-"  # job id, "done", or "<id> (RUNNING)" for a job already in the queue
    eval: str = "-"


class SweepSubmitter:
    def __init__(
        self,
        config: Path,
        res: Resources,
        eval_overrides: list[str],
        local: bool = False,
        evaluate: bool = True,
        stop_timeout_s: float | None = None,
    ):
        self.config = Path(config).resolve()
        self.res = res
        self.eval_overrides = list(eval_overrides)
        self.local = local
        self.evaluate = evaluate
        # checkpoint() must finish before Slurm's kill at the time limit: leave a margin inside the
        # signal delay.
        self.stop_timeout_s = stop_timeout_s or max(self.res.signal_delay_s - 20, 10)

    # ------------------------------------------------------------------ executors
    def _executor(self, run_dir: Path, params: dict):
        folder = run_dir / JOB_LOGS / "%j"
        check_one_line(params, folder)
        if self.local:
            executor = submitit.LocalExecutor(
                folder=folder, max_num_timeout=self.res.max_num_timeout
            )
            executor.update_parameters(
                timeout_min=params["time"],
                gpus_per_node=params.get("gpus_per_node", 0),
                tasks_per_node=params.get("ntasks_per_node", 1),
            )
        else:
            executor = submitit.SlurmExecutor(
                folder=folder, max_num_timeout=self.res.max_num_timeout
            )
            executor.update_parameters(**params)
        return executor

    def _train_job(self, plan: RunPlan) -> TrainJob:
        return TrainJob(
            self.config, plan.run_dir.resolve(), plan.overrides, stop_timeout_s=self.stop_timeout_s
        )

    def _eval_job(self, plan: RunPlan) -> EvalJob:
        return EvalJob(
            plan.run_dir.resolve(), self.eval_overrides, stop_timeout_s=self.stop_timeout_s
        )

    @staticmethod
    def _names(plan: RunPlan) -> tuple[str, str]:
        return f"s24-train-{plan.run_dir.name}", f"s24-eval-{plan.run_dir.name}"

    # ------------------------------------------------------------------ dry run
    def preview(self, plan: RunPlan) -> str:
        train_name, eval_name = self._names(plan)
        folder = plan.run_dir.resolve() / JOB_LOGS / "%j"
        parts = []
        if not plan.train_done:
            parts.append(
                f"# train job ({plan.train_action}): "
                f"{shlex.join(self._train_job(plan).command())}\n"
                + sbatch_preview(train_parameters(self.res, train_name), folder)
            )
        if self.evaluate and not plan.eval_done:
            after = None if plan.train_done else f"<job id of {train_name}>"
            parts.append(
                f"# eval job: {shlex.join(self._eval_job(plan).command())}\n"
                + sbatch_preview(eval_parameters(self.res, eval_name, after), folder)
            )
        return "\n".join(parts)

    # ------------------------------------------------------------------ submission
    def _active(self, plans: list[RunPlan]) -> dict[str, str]:
        """States of the recorded Slurm jobs of these runs that are still queued or running."""
        if self.local:
            return {}
        ids = [
            r.job_id
            for p in plans
            for kind in ("train", "eval")
            if (r := latest_job(p.run_dir, kind)) is not None and r.cluster == "slurm"
        ]
        return {i: s for i, s in query_states(ids).items() if s in ACTIVE_STATES}

    def submit(self, plans: list[RunPlan]) -> list[Submitted]:
        """Submit what each run still needs; a table row per run says what was submitted or why
        not."""
        active = self._active(plans)
        rows = []
        for plan in plans:
            row = Submitted(plan)
            rows.append(row)
            train_id = self._submit_training(plan, row, active)
            if not row.train.endswith("FAILED"):
                self._submit_probe(plan, row, active, train_id)
        return rows

    def _submit_training(self, plan: RunPlan, row: Submitted, active: dict[str, str]) -> str | None:
        """The id of the training job the probe must wait for (None: nothing to wait for)."""
        if plan.train_done:
            row.train = "done"
            return None
        recorded = latest_job(plan.run_dir, "train")
        # still queued or running: do not submit twice
        if recorded is not None and recorded.job_id in active:
            row.train = f"{recorded.job_id} ({active[recorded.job_id]})"
            return recorded.job_id
        name = self._names(plan)[0]
        job = self._run(plan, "train", self._train_job(plan), train_parameters(self.res, name))
        row.train = f"{job.job_id} ({plan.train_action})"
        if self.local:
            row.train += "" if self._wait_local(job, plan, "train") else " FAILED"
            return None
        return job.job_id

    def _submit_probe(
        self, plan: RunPlan, row: Submitted, active: dict[str, str], after: str | None
    ) -> None:
        if plan.eval_done or not self.evaluate:
            row.eval = "done" if plan.eval_done else "skipped"
            return
        recorded = latest_job(plan.run_dir, "eval")
        if recorded is not None and recorded.job_id in active:
            row.eval = f"{recorded.job_id} ({active[recorded.job_id]})"
            return
        name = self._names(plan)[1]
        job = self._run(plan, "eval", self._eval_job(plan), eval_parameters(self.res, name, after))
        row.eval = job.job_id + (f" (after {after})" if after else "")
        if self.local and not self._wait_local(job, plan, "eval"):
            row.eval += " FAILED"

    def _run(self, plan: RunPlan, kind: str, job_fn, params: dict):
        plan.run_dir.mkdir(parents=True, exist_ok=True)
        job = self._executor(plan.run_dir.resolve(), params).submit(job_fn)
        record_job(
            plan.run_dir,
            kind,
            job.job_id,
            "local" if self.local else "slurm",
            self.eval_overrides if kind == "eval" else (),
        )
        logger.info("submitted %s job %s for %s", kind, job.job_id, plan.run_dir)
        return job

    @staticmethod
    def _wait_local(job, plan: RunPlan, kind: str) -> bool:
        """Whether every task of the local job ended well. A stop of the launcher (Ctrl-C, SIGTERM)
        stops the job first: its controller forwards the interrupt to every task, and the run keeps
        its last checkpoint."""
        try:
            with stop_signals_interrupt():
                job.results()  # every task's: result() refuses a job of several tasks
            return True
        except KeyboardInterrupt:
            logger.error(
                "stopping the local %s job %s of %s (its tasks checkpoint at a step boundary); "
                "rerun the "
                "same command to resume",
                kind,
                job.job_id,
                plan.run_dir,
            )
            stop_local_job(job)
            raise
        except Exception as e:  # noqa: BLE001 - report and carry on with the other runs
            logger.error("%s of %s failed: %s (log: %s)", kind, plan.run_dir, e, job.paths.stderr)
            return False


@contextlib.contextmanager
def stop_signals_interrupt():
    """SIGTERM (and SIGHUP) raise KeyboardInterrupt while a local job is waited for, as Ctrl-C does,
    so that the launcher can stop its job instead of dying and leaving the job's processes
    behind."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_local_job(job, grace_s: float = 60.0) -> None:
    """Interrupt a local job's controller (it forwards SIGINT, then SIGKILL, to its tasks) and wait
    for it; then end whatever it started that still runs (a controller killed after `grace_s` leaves
    its tasks behind)."""
    process = getattr(job, "_process", None)
    members = processes.family(process.pid) if process is not None else {}
    job.cancel(check=False)
    if process is None:
        return
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if killed := processes.kill_left(members):
        logger.warning(
            "stop: %d process(es) of the local job outlived its controller: killed", len(killed)
        )
