"""The plan of a sparse-fraction sweep: one run directory per fraction, its resolved config, and
what is left to do.

A sweep lives in one folder (`--runs-dir`), one sub-folder per fraction (`sparse_0.70`). What a run
still needs is read from that folder alone, so re-running the launcher for an existing sweep resumes
or skips instead of starting over:

- training is finished exactly when train.py would have nothing left to do (`rundir.status`: a
  checkpoint of the run's last step that matches its SHA-256 and, for a full run, the final
  teacher); otherwise training is (re)submitted, and train.py resumes from the newest checkpoint;
- evaluation is finished when the run holds a record of the probe the launcher's job would run (its
  data and protocol, from `--eval-arg`): readable and of the run's current teacher
  (`reporting.eval_records.find_probe`), not merely a file of the usual name;
- a job recorded in `jobs.json` that Slurm still lists as pending or running is not submitted twice.
"""

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from configs import Config, ConfigError, load_eval_config, to_yaml
from configs.eval_schema import EvalConfig
from configs.load import RESUMABLE_CHANGES, config_difference, read_config_text
from configs.sweep import refuse_fraction_override, schedule_run
from reporting.eval_records import find_probe
from rundir.atomic import atomic_write_text
from rundir.errors import RunDirProblem
from rundir.guard import usable_checkpoint_dir
from rundir.json_files import parse_json
from rundir.run_dir import RunDir
from rundir.status import last_step, nothing_left_at, resumable_step
from rundir.typed_records import JOB_FIELDS, checked

JOB_LOGS = "slurm"  # <run>/slurm/<job id>/: submitit's logs and pickles of the run's jobs

JOBS_FILE = (
    "jobs.json"  # the launcher's record of the jobs it submitted for a run (in the run directory)
)


def probe_done(run_dir: Path, asked: EvalConfig | None = None) -> bool:
    """Whether the probe the launcher's job would run (`eval_linear.py --run RUN` with the settings
    `asked`, the --eval-arg's; None: the default probe) is done as the tables see it: a record of
    those settings (data, protocol), readable and of the run's current teacher
    (`reporting.eval_records.find_probe`); a file that is there but unreadable, stale or of other
    settings is a probe to run."""
    return find_probe(run_dir, asked or EvalConfig()) is not None


def run_name(fraction: float) -> str:
    """sparse_0.70 (two decimals where they are exact, so names sort; every digit of the number
    where needed, so that two fractions never share a directory); -0 is 0."""
    fraction = fraction + 0.0
    return f"sparse_{fraction:.2f}" if round(fraction, 2) == fraction else f"sparse_{fraction!r}"


@dataclass
class JobRecord:
    kind: str  # train | eval
    job_id: str
    cluster: str  # slurm | local
    submitted: str
    args: list[str] = field(
        default_factory=list
    )  # an eval job's eval_linear.py settings (--eval-arg): its record's


def read_jobs(run_dir: Path) -> list[JobRecord]:
    path = Path(run_dir) / JOBS_FILE
    if not os.path.lexists(path):
        return []
    if not path.is_file():  # a directory, a FIFO (whose read would block), a dangling link
        raise RunDirProblem(f"{path}: not a regular file; move it away to start the record afresh")
    try:
        records = parse_json(path.read_bytes())
        if not isinstance(records, list):
            raise ValueError("not a JSON list")
        return [
            JobRecord(**{**checked(r, JOB_FIELDS, JOBS_FILE), "args": r.get("args") or []})
            for r in records
        ]
    except (
        OSError,
        ValueError,
        TypeError,
    ) as e:  # (json's, UTF-8's and a wrong field type's errors: ValueErrors)
        raise RunDirProblem(
            f"{path}: unreadable job record ({e}); move it away to start the record afresh"
        ) from None


def record_job(
    run_dir: Path, kind: str, job_id: str, cluster: str, args: Sequence[str] = ()
) -> None:
    records = read_jobs(run_dir) + [
        JobRecord(kind, str(job_id), cluster, time.strftime("%Y-%m-%dT%H:%M:%S"), list(args))
    ]
    atomic_write_text(
        Path(run_dir) / JOBS_FILE, json.dumps([r.__dict__ for r in records], indent=1)
    )


def latest_job(run_dir: Path, kind: str) -> JobRecord | None:
    matching = [r for r in read_jobs(run_dir) if r.kind == kind]
    return matching[-1] if matching else None


@dataclass
class RunPlan:
    fraction: float
    run_dir: Path
    overrides: list[
        str
    ]  # the sweep's overrides plus this run's sparsity.sparse_fraction (configs.sweep)
    cfg: Config
    last_step: int
    done_steps: int = 0  # step of the newest checkpoint
    eval_done: bool = False
    notes: list[str] = field(
        default_factory=list
    )  # what this run does differently from the sweep's overrides

    @property
    def train_done(self) -> bool:
        """train.py's own definition (`rundir.status.nothing_left_at`): a checkpoint at the last
        step and, for a full run, the final teacher exported; a run killed during that export is not
        done."""
        return nothing_left_at(self.run_dir, self.done_steps, self.last_step, self.cfg.total_steps)

    @property
    def train_action(self) -> str:
        if self.train_done:
            return "done"
        return f"resume@{self.done_steps}" if self.done_steps else "new"


def plan_sweep(
    config: Path,
    fractions: Sequence[float],
    runs_dir: Path,
    overrides: Sequence[str],
    eval_args: Sequence[str] = (),
) -> list[RunPlan]:
    """Resolve every run's config and the probe jobs' settings `eval_args` (raising ConfigError
    before anything is submitted) and read its progress (`RunDirProblem`, naming the entry, for a
    saved run whose `checkpoints` or `jobs.json` is unusable).

    An existing run whose config.yaml differs from the newly resolved config is an error naming the
    keys: resuming it with other settings would silently mix two experiments."""
    refuse_fraction_override(overrides, "--sparse-fractions")
    asked = load_eval_config(
        None, list(eval_args)
    )  # eval_linear.py's own check, before any run is read
    if len(set(fractions)) != len(fractions):
        raise ConfigError(f"--sparse-fractions has duplicates: {list(fractions)}")
    plans, by_schedule = [], {}
    for fraction in fractions:
        fraction = fraction + 0.0  # -0 is 0
        run = schedule_run(
            config, overrides, fraction
        )  # switch-only keys left off where there is no switch
        cfg = run.cfg
        # a run is its schedule: two fractions that round to the same number of sparse steps are one
        # run
        twin = by_schedule.setdefault(cfg.sparse_steps, fraction)
        if twin != fraction:
            raise ConfigError(
                f"--sparse-fractions {twin!r} and {fraction!r} give the same schedule "
                f"({cfg.sparse_steps} sparse steps of {cfg.total_steps}): one run; drop one of them"
            )
        run_dir = Path(runs_dir) / run_name(fraction)
        plan = RunPlan(fraction, run_dir, run.overrides, cfg, last_step(cfg), notes=run.notes)
        existing = RunDir(run_dir).config_file
        # a run started there: its saved config must be readable and the same
        if os.path.lexists(existing):
            try:
                changed = config_difference(
                    read_config_text(existing), to_yaml(cfg), RESUMABLE_CHANGES
                )
            except ConfigError as e:
                message = str(e) if str(existing) in str(e) else f"{existing}: {e}"
                raise ConfigError(
                    f"{message}; move the run away or pick a new --runs-dir"
                ) from None
            if changed:
                raise ConfigError(
                    f"{run_dir} was started with another config ({'; '.join(changed)}). Launch "
                    f"with the same config "
                    "and overrides to resume it, or pick a new --runs-dir for the new settings"
                )
        # what the trainer and the submitter would refuse later, refused before anything is
        # submitted
        usable_checkpoint_dir(RunDir(run_dir).checkpoint_dir)  # RunDirProblem naming the entry
        if (
            run_dir / JOB_LOGS
        ).is_symlink():  # submitit would write its logs and pickles through it
            raise RunDirProblem(
                f"{run_dir / JOB_LOGS} is a symlink: the jobs' logs are the run's own directory; "
                "remove the link"
            )
        read_jobs(run_dir)  # RunDirProblem naming jobs.json
        plan.done_steps = resumable_step(run_dir, plan.last_step)
        plan.eval_done = probe_done(run_dir, asked)
        plans.append(plan)
    return plans
