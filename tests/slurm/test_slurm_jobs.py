"""The launcher against a real Slurm (CI starts one on localhost with .ci/slurm_setup.sh): a two-run
sweep that trains and evaluates through the scheduler, a job preempted with USR2 that checkpoints,
requeues and ends with the same metrics as an uninterrupted run, one requeued from outside (SIGTERM
to every process, data workers running) that does the same, and a job cancelled from outside that is
reported failed instead of hanging.

Everything is submitted at once by a module fixture (the machine runs two one-CPU jobs at a time),
cancelled run first so that its slot frees early; the tests then each wait for their own outcome.
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import submitit
import torch
from launcher_helpers import (
    CPU_JOB,
    REPO,
    SLURM_TIMEOUT_S,
    TINY,
    TOTAL_STEPS,
    job_ids,
    job_state,
    launch,
    slurm_logs,
    wait_for,
)

from configs.eval_schema import load_eval_config, protocol_suffix
from rundir.metrics import read_metrics, steps_done, without_timing

pytestmark = pytest.mark.slow  # about 2-4 minutes for the whole module on 2 cores

EVAL_FAST = ["--eval-arg", "linear.n_c=3", "--eval-arg", "features.num_workers=0"]
# the record a probe under that protocol writes (named for it: evaluation/evaluate.py)
EVAL_FAST_RECORD = f"eval_linear{protocol_suffix(load_eval_config(None, EVAL_FAST[1::2]))}.json"
PREEMPT_AFTER_STEP = (
    5  # metrics line of step 5 written (5 steps done): the run is inside step 6 of 16
)
CANCEL_AFTER_STEP = 1  # the first metrics line (one step done): the run is training


def _sweep(
    runs_dir: Path, *fractions: str, evaluate: bool = True, ranks: int = 1, extra: tuple = ()
) -> subprocess.CompletedProcess:
    # Two ranks: the same global batch of 8 as one rank, as 2 gloo processes x 4 images.
    layout = ["--cpu-tasks-per-node", "2", "train.batch_size_per_gpu=4"] if ranks == 2 else []
    return launch(
        "--config",
        "configs/default.yaml",
        "--sparse-fractions",
        *fractions,
        "--runs-dir",
        str(runs_dir),
        "--partition",
        "debug",
        *CPU_JOB,
        *(EVAL_FAST if evaluate else ["--skip-eval"]),
        *TINY,
        *layout,
        *extra,
    )


def _metrics_reached(run: Path, step: int) -> bool:
    """A metrics line of `step` steps done is written (format 2: the first line says 1, never 0)."""
    path = run / "metrics.jsonl"
    return path.exists() and any(
        steps_done(json.loads(line)) >= step
        for line in path.read_text().splitlines()
        if line.strip().endswith("}")
    )


def _submit_sbatch_template(root: Path) -> str:
    """slurm/train.sbatch as a user submits it (command-line options override its #SBATCH lines)."""
    root.mkdir()
    # torchrun from this environment; one thread as the launcher's one-CPU jobs (so the numbers are
    # comparable)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--gpus-per-node=0",
            "--cpus-per-task=1",
            "--time=30",
            f"--output={root}/%x-%j.out",
            "slurm/train.sbatch",
            "configs/default.yaml",
            str(root / "run"),
            *TINY,
            "sparsity.sparse_fraction=0.5",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().split(";")[0]


INTERRUPTIONS = ("cancel", "preempt", "sbatch", "two_ranks", "requeue")


def _interrupt(actions: dict, done: dict) -> None:
    """Cancel one run once it trains and send USR2 (what Slurm sends before a time limit or a
    preemption) to the others mid-run, at those moments whatever test is running meanwhile. Runs
    from before the first submission: `actions` fills as jobs are submitted, so a job cannot finish
    before its interruption is watched for."""
    deadline = time.monotonic() + 2 * SLURM_TIMEOUT_S
    while len(done) < len(INTERRUPTIONS) and time.monotonic() < deadline:
        for name, (run, step, command) in list(actions.items()):
            if name not in done and _metrics_reached(run, step):
                # a failed command is recorded, not raised: an exception here would end the thread
                # and leave every other test waiting for its own interruption
                sent = subprocess.run(command, capture_output=True, text=True)
                done[name] = sent.returncode == 0 or f"{command} failed: {sent.stderr.strip()}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def sweeps(slurm_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm")
    dirs = {
        "cancel": root / "cancel",
        "preempt": root / "preempt",
        "sweep": root / "sweep",
        "two_ranks": root / "two_ranks",
        "two_ranks_preempt": root / "two_ranks_preempt",
        "requeue": root / "requeue",
    }
    sbatch_ids = []
    done: dict = {}
    actions: dict = {}
    threading.Thread(target=_interrupt, args=(actions, done), daemon=True).start()

    def train_job(name: str) -> str:
        return job_ids(dirs[name] / "sparse_0.50", "train")[0]

    try:
        # Slurm starts them in this order, two one-CPU jobs at a time: the reference runs early, and
        # the two-task jobs (the whole node each) last. The cancelled run is long (1,600 steps) so
        # that only the cancel ends it.
        _sweep(dirs["cancel"], "0.5", extra=("optim.epochs=400",))
        actions["cancel"] = (
            dirs["cancel"] / "sparse_0.50",
            CANCEL_AFTER_STEP,
            ["scancel", train_job("cancel")],
        )
        first = _sweep(dirs["sweep"], "0.5", "0.25")
        _sweep(dirs["preempt"], "0.5", evaluate=False)
        actions["preempt"] = (
            dirs["preempt"] / "sparse_0.50",
            PREEMPT_AFTER_STEP,
            ["scancel", "--signal=USR2", train_job("preempt")],
        )
        _sweep(
            dirs["requeue"], "0.5", evaluate=False, extra=("train.num_workers=2",)
        )  # data workers running
        # from outside the job: SIGTERM to every process of it (train.py and its data workers), then
        # a restart
        actions["requeue"] = (
            dirs["requeue"] / "sparse_0.50",
            PREEMPT_AFTER_STEP,
            ["scontrol", "requeue", train_job("requeue")],
        )
        sbatch_ids.append(_submit_sbatch_template(root / "sbatch"))
        # the template asks for USR2 on its batch shell (--signal=B:USR2@180), which traps it
        actions["sbatch"] = (
            root / "sbatch" / "run",
            PREEMPT_AFTER_STEP,
            ["scancel", "--batch", "--signal=USR2", sbatch_ids[0]],
        )
        _sweep(dirs["two_ranks"], "0.5", evaluate=False, ranks=2)
        _sweep(dirs["two_ranks_preempt"], "0.5", evaluate=False, ranks=2)
        actions["two_ranks"] = (
            dirs["two_ranks_preempt"] / "sparse_0.50",
            PREEMPT_AFTER_STEP,
            ["scancel", "--signal=USR2", train_job("two_ranks_preempt")],
        )
        yield {
            **dirs,
            "launch_output": first.stdout,
            "interrupted": done,
            "sbatch": (root / "sbatch", sbatch_ids[0]),
        }
    finally:  # nothing may outlive the tests, passed or failed
        ids = [
            i
            for d in dirs.values()
            for r in d.glob("sparse_*")
            for k in ("train", "eval")
            for i in job_ids(r, k)
        ]
        subprocess.run(["scancel", *sbatch_ids, *ids], capture_output=True)


def _wait_interrupted(sweeps, action: str, what: str) -> None:
    """Wait until the interrupting thread has sent `action`; fail with scancel's/scontrol's words if
    it failed."""
    outcome = wait_for(lambda: sweeps["interrupted"].get(action), what)
    assert outcome is True, outcome


def _finished(job_id: str) -> bool:
    return job_state(job_id) not in (
        "PENDING",
        "RUNNING",
        "REQUEUED",
        "COMPLETING",
        "CONFIGURING",
        "UNKNOWN",
    )


def test_a_job_cancelled_from_outside_is_reported_failed_not_left_hanging(sweeps):
    run = sweeps["cancel"] / "sparse_0.50"
    (train_id,), (eval_id,) = job_ids(run, "train"), job_ids(run, "eval")
    _wait_interrupted(sweeps, "cancel", "the cancellation")

    # submitit (what the launcher and users' scripts poll) must see the job end: done(), then an
    # error, no hang
    job = submitit.SlurmJob(folder=run / "slurm" / "%j", job_id=train_id)
    wait_for(lambda: job.done(force_check=True), "submitit to notice the cancelled job", timeout=60)
    with pytest.raises(submitit.core.utils.UncompletedJobError):
        job.result()
    # the chained probe is cancelled with it (kill-on-invalid-dep), and status names both states
    wait_for(
        lambda: _finished(eval_id), "the probe of the cancelled run to leave the queue", timeout=60
    )
    status = launch("status", "--runs-dir", str(sweeps["cancel"])).stdout
    assert f"{train_id} CANCELLED" in status and f"{eval_id} CANCELLED" in status, status


def _completed_after_interruption(sweeps, runs: str, action: str, what: str) -> tuple[Path, str]:
    """Wait for `action` of the interrupting thread, then for the job of `runs`' run to restart and
    complete; (run dir, its Slurm logs)."""
    run = sweeps[runs] / "sparse_0.50"
    (train_id,) = job_ids(run, "train")
    _wait_interrupted(sweeps, action, what)
    wait_for(lambda: _finished(train_id), f"the job interrupted by {what} to restart and finish")
    logs = slurm_logs(run)
    assert job_state(train_id) == "COMPLETED", logs[-4000:]
    return run, logs


def test_usr2_checkpoints_requeues_and_resumes_to_the_uninterrupted_metrics(sweeps):
    run, logs = _completed_after_interruption(sweeps, "preempt", "preempt", "USR2")
    assert "Requeued job" in logs and "resumed at step" in logs, logs[-4000:]

    # The only mid-run checkpoint (periodic ones are off) is the one the signal asked for, at a step
    # boundary.
    steps = sorted(int(p.stem.split("_")[1]) for p in (run / "checkpoints").glob("step_*.pt"))
    assert (
        len(steps) == 2 and PREEMPT_AFTER_STEP < steps[0] < TOTAL_STEPS and steps[1] == TOTAL_STEPS
    ), steps
    assert f"resumed at step {steps[0]}" in logs

    _assert_same_as_uninterrupted(run, sweeps["sweep"] / "sparse_0.50")


def test_an_outside_requeue_with_data_workers_saves_and_resumes_to_the_uninterrupted_metrics(
    sweeps,
):
    """`scontrol requeue` (as an admin or a preemption policy does): Slurm sends SIGTERM to every
    process of the job, the data workers included; they ignore it, train.py saves at its step
    boundary, the job restarts and resumes with nothing lost."""
    run, logs = _completed_after_interruption(sweeps, "requeue", "requeue", "the outside requeue")
    assert "SIGTERM: checkpoint saved at step" in logs and "resumed at step" in logs, logs[-4000:]
    assert "DataLoader worker" not in logs, logs[-4000:]
    _assert_same_as_uninterrupted(run, sweeps["sweep"] / "sparse_0.50")


def test_two_ranks_stop_together_on_usr2_to_rank_0_requeue_and_resume_exactly(sweeps):
    """Slurm signals every task; submitit acts on rank 0 only. Rank 0's train.py stops on SIGTERM,
    the stop is agreed across ranks at the same step, rank 1 waits for the requeue, and the job
    resumes with both ranks."""
    run, logs = _completed_after_interruption(
        sweeps, "two_ranks_preempt", "two_ranks", "USR2 to the 2-task job"
    )
    assert (
        "Requeued job" in logs
        and "Not checkpointing nor requeuing since I am a slave (procid=1)" in logs
    )
    steps = sorted(int(p.stem.split("_")[1]) for p in (run / "checkpoints").glob("step_*.pt"))
    assert len(steps) == 2 and PREEMPT_AFTER_STEP < steps[0] < TOTAL_STEPS, steps
    assert f"resumed at step {steps[0]}" in logs
    _assert_same_as_uninterrupted(run, sweeps["two_ranks"] / "sparse_0.50")


def _assert_same_as_uninterrupted(run: Path, reference: Path) -> None:
    wait_for(
        lambda: (reference / "teacher_backbone.pth").exists(), "the uninterrupted reference run"
    )
    got, want = (without_timing(read_metrics(r / "metrics.jsonl")) for r in (run, reference))
    assert [r["step"] for r in got] == list(range(1, TOTAL_STEPS + 1))
    assert got == want
    a, b = (
        torch.load(r / "teacher_backbone.pth", weights_only=True)["backbone"]
        for r in (run, reference)
    )
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_the_sbatch_template_traps_usr2_checkpoints_requeues_and_resumes(sweeps):
    folder, job_id = sweeps["sbatch"]
    _wait_interrupted(sweeps, "sbatch", "USR2 to be sent to the sbatch job")
    wait_for(lambda: _finished(job_id), "the sbatch job to requeue and finish")
    log = "\n".join(p.read_text(errors="replace") for p in folder.glob("*.out"))
    assert job_state(job_id) == "COMPLETED", log[-4000:]
    assert "USR2: asking train.py to checkpoint" in log and "(restart 1)" in log, log[-4000:]
    steps = sorted(
        int(p.stem.split("_")[1]) for p in (folder / "run" / "checkpoints").glob("step_*.pt")
    )
    assert len(steps) == 2 and PREEMPT_AFTER_STEP < steps[0] < TOTAL_STEPS, steps
    assert f"resumed at step {steps[0]}" in log
    _assert_same_as_uninterrupted(folder / "run", sweeps["sweep"] / "sparse_0.50")


def test_a_sweep_trains_and_evaluates_through_slurm_and_a_rerun_submits_nothing(sweeps):
    runs = [sweeps["sweep"] / "sparse_0.50", sweeps["sweep"] / "sparse_0.25"]
    table = sweeps["launch_output"]
    for run in runs:
        (train_id,), (eval_id,) = job_ids(run, "train"), job_ids(run, "eval")
        assert f"{eval_id} (after {train_id})" in table and str(run) in table, table
        wait_for(lambda job=eval_id: _finished(job), f"the probe of {run.name}")
        assert (job_state(train_id), job_state(eval_id)) == ("COMPLETED", "COMPLETED"), slurm_logs(
            run
        )[-4000:]
        result = json.loads((run / EVAL_FAST_RECORD).read_text())
        assert 0.0 <= result["top1"] <= 100.0
    assert (
        read_metrics(runs[1] / "metrics.jsonl")[3]["phase"] == "sparse"
    )  # 0.25 of 16 steps: dense from step 4
    assert read_metrics(runs[1] / "metrics.jsonl")[4]["phase"] == "dense"

    status = launch("status", "--runs-dir", str(sweeps["sweep"])).stdout
    assert status.count(f"{TOTAL_STEPS}/{TOTAL_STEPS}") == 2 and status.count("COMPLETED") == 4, (
        status
    )
    assert status.count("top1") == 2, status

    again = _sweep(sweeps["sweep"], "0.5", "0.25")
    assert all(len(job_ids(r, "train")) == 1 and len(job_ids(r, "eval")) == 1 for r in runs), (
        again.stdout
    )
    assert again.stdout.count("done") == 4, again.stdout
