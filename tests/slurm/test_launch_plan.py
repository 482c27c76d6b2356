"""The launcher without a scheduler: the ViT-L dry run, resume/skip planning, refused inputs, the
status table, and the signal path of a job's child process."""

import json
import os
import pickle
import re
import signal
import time
from pathlib import Path

import pytest
import submitit
from launcher_helpers import TINY, launch

from configs import ConfigError, load_config, to_yaml
from configs.eval_schema import load_eval_config, protocol_label
from rundir.metrics import read_metrics
from slurm.jobs import ScriptJob
from slurm.status import format_table, run_row
from slurm.sweep import plan_sweep, record_job

FRACTIONS = ["0", "0.4", "0.6", "0.7", "0.8", "0.9", "1.0"]
VITL = "configs/vitl16_imagenet.yaml"


def _sbatch_blocks(output: str) -> list[tuple[str, dict]]:
    """(kind, {sbatch option: value}) for every previewed job, in order."""
    blocks = []
    for kind, body in re.findall(
        r"^# (train|eval) job.*?\n(.*?)(?=^# (?:train|eval) job|^=== |\Z)",
        output,
        flags=re.S | re.M,
    ):
        options = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(.*))?$", body, flags=re.M))
        blocks.append((kind, {k: v.strip("'") for k, v in options.items()}))
    return blocks


def test_dry_run_of_the_vitl_sweep_prints_seven_jobs_and_seven_chained_evals(tmp_path):
    runs = tmp_path / "sweep"
    result = launch(
        "--config",
        VITL,
        "--sparse-fractions",
        *FRACTIONS,
        "--nodes",
        "4",
        "--gpus-per-node",
        "8",
        "--partition",
        "gpu",
        "--timeout-min",
        "4320",
        "--runs-dir",
        str(runs),
        "--dry-run",
        "data.root=/datasets/imagenet",
    )
    out = result.stdout
    blocks = _sbatch_blocks(out)
    assert [k for k, _ in blocks] == ["train", "eval"] * 7, out[-3000:]
    for i, fraction in enumerate(FRACTIONS):
        (_, train), (_, ev) = blocks[2 * i], blocks[2 * i + 1]
        name = f"sparse_{float(fraction):.2f}"
        assert train["job-name"] == f"s24-train-{name}" and ev["job-name"] == f"s24-eval-{name}"
        assert (train["nodes"], train["ntasks-per-node"], train["gpus-per-node"]) == ("4", "8", "8")
        assert (train["partition"], train["time"], train["signal"]) == ("gpu", "4320", "USR2@120")
        assert "requeue" in train and train["open-mode"] == "append"
        assert (
            ev["dependency"] == f"afterok:<job id of s24-train-{name}>"
            and ev["kill-on-invalid-dep"] == "yes"
        )
        assert (ev["nodes"], ev["gpus-per-node"]) == ("1", "1")
        assert str(runs / name) in train["output"]
    # the resolved config once (with the sweep's override), then one summary line and one command
    # per run, each with its own fraction and run directory
    configs = re.findall(r"^--- resolved config.*?\n(.*?)^--- global batch", out, flags=re.S | re.M)
    assert len(configs) == 1 and out.count("arch: vit_large") == 1, out[:3000]
    assert "sparse_fraction: 0.0" in configs[0] and "root: /datasets/imagenet" in configs[0]
    for fraction in FRACTIONS:
        name = f"sparse_{float(fraction):.2f}"
        assert f"=== {runs / name}  sparse_fraction={float(fraction)}  training: new" in out
        assert (
            f"--output-dir {runs / name} data.root=/datasets/imagenet "
            f"sparsity.sparse_fraction={float(fraction)}" in out
        )
    # 4 nodes x 8 GPUs x 64 images; lr 0.004 * sqrt(2048 / 1024)
    assert (
        "global batch 2048 = 4 node(s) x 8 GPUs x 64 images" in out and "peak lr 0.00565685 " in out
    )
    assert "lr scaling follows the global batch" in out
    assert not runs.exists(), "a dry run must not create anything"


def _fake_progress(run_dir, cfg, steps, eval_done=False):
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    from rundir.torch_files import save_verified

    for step in (
        steps
    ):  # with digests, as train.py writes them (a last checkpoint without one is not finished)
        save_verified({"step": step}, run_dir / "checkpoints" / f"step_{step:08d}.pt")
    # trained to the end: train.py exports the final teacher last
    if steps and steps[-1] >= cfg.total_steps:
        (run_dir / "teacher_backbone.pth").touch()
    if steps:
        last = {"step": steps[-1] - 1, "phase": "dense", "loss": 1.0}
        (run_dir / "metrics.jsonl").write_text(json.dumps(last) + "\n")
    if eval_done:
        (run_dir / "eval_linear.json").write_text(json.dumps({"top1": 12.5}))


def test_rerunning_a_sweep_resumes_unfinished_runs_and_skips_finished_ones(tmp_path):
    overrides = ["optim.epochs=2", "train.epoch_length=5"]  # 10 steps per run
    cfg = {
        f: load_config(None, [*overrides, f"sparsity.sparse_fraction={f}"]) for f in (0.0, 0.5, 1.0)
    }
    _fake_progress(tmp_path / "sparse_0.00", cfg[0.0], [10], eval_done=True)  # all done
    _fake_progress(tmp_path / "sparse_0.50", cfg[0.5], [10])  # trained, not evaluated
    _fake_progress(tmp_path / "sparse_1.00", cfg[1.0], [3, 6])  # interrupted at step 6
    plans = plan_sweep("configs/default.yaml", [0.0, 0.5, 1.0, 0.7], tmp_path, overrides)
    assert [(p.train_action, p.eval_done) for p in plans] == [
        ("done", True),
        ("done", False),
        ("resume@6", False),
        ("new", False),
    ]

    result = launch(
        "--config",
        "configs/default.yaml",
        "--sparse-fractions",
        "0",
        "0.5",
        "1",
        "0.7",
        "--runs-dir",
        str(tmp_path),
        "--gpus-per-node",
        "0",
        "--dry-run",
        *overrides,
    )
    blocks = [k for k, _ in _sbatch_blocks(result.stdout)]
    assert blocks == [
        "eval",
        "train",
        "eval",
        "train",
        "eval",
    ]  # nothing for 0.0, only the probe for 0.5
    assert "(nothing to submit)" in result.stdout
    eval_of_trained = _sbatch_blocks(result.stdout)[0][1]
    assert "dependency" not in eval_of_trained  # its training is already done


def test_an_existing_run_with_other_settings_is_refused_naming_the_keys(tmp_path):
    cfg = load_config(None, ["optim.epochs=2", "sparsity.sparse_fraction=0.5"])
    _fake_progress(tmp_path / "sparse_0.50", cfg, [3])
    with pytest.raises(ConfigError, match=r"optim.epochs: 2 -> 3.*new --runs-dir"):
        plan_sweep("configs/default.yaml", [0.5], tmp_path, ["optim.epochs=3"])


@pytest.mark.parametrize(
    "entry,kind,code,message",
    [
        (
            "config.yaml",
            "fifo",
            2,
            "is not a regular file",
        ),  # never opened: its read would block the launcher
        ("config.yaml", "directory", 2, "is a directory"),
        ("config.yaml", "latin1", 2, "not a text (UTF-8) file"),
        ("config.yaml", "dangling", 2, "config file not found"),
        ("config.yaml", "bare_word", 2, "holds none of the config's keys"),
        ("checkpoints", "dangling", 1, "leads nowhere"),
        ("checkpoints", "file", 1, "is not a directory"),
        ("jobs.json", "fifo", 1, "not a regular file"),
        ("jobs.json", "latin1", 1, "unreadable job record"),
        ("jobs.json", "wrong_shape", 1, "unreadable job record"),
    ],
)
def test_a_saved_run_with_unusable_entries_is_refused_naming_them(
    tmp_path, entry, kind, code, message
):
    """A sweep folder from an earlier launch, tampered with or half copied: one line naming the
    entry, the exit code of its kind (2: the saved config; 1: the run directory), nothing submitted,
    no traceback, no hang."""
    cfg = load_config(None, ["optim.epochs=2", "sparsity.sparse_fraction=0.5"])
    run = tmp_path / "sparse_0.50"
    _fake_progress(run, cfg, [3])
    path = run / entry
    if path.is_dir():
        path.rename(run / "moved")
    elif path.exists():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "latin1":
        path.write_bytes("optim:\n  epochs: 2 # \xe9t\xe9\n".encode("latin-1"))
    elif kind == "dangling":
        path.symlink_to(tmp_path / "unmounted" / entry)
    elif kind == "bare_word":
        path.write_text("sparse\n")
    elif kind == "file":
        path.write_text("x")
    else:
        path.write_text(json.dumps({"kind": "train"}))
    result = launch(
        "--config",
        "configs/default.yaml",
        "--sparse-fractions",
        "0.5",
        "--runs-dir",
        str(tmp_path),
        "--gpus-per-node",
        "0",
        "--dry-run",
        "optim.epochs=2",
        check=False,
    )
    assert result.returncode == code and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert message in result.stderr and str(path) in result.stderr, result.stderr[-2000:]
    assert "sbatch" not in result.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["sparsity.sparse_fraction=0.3"], "set per run by --sparse-fractions"),
        (["train.batchsize=3"], "unknown config key 'train.batchsize'"),
        (["--sparse-fractions", "0.5", "0.5"], "duplicates"),
        (
            ["--sparse-fractions", "1.5"],
            "sparsity.sparse_fraction=1.5 is out of range: must be >= 0 and <= 1",
        ),
        (["data.dataset=image_folder", "data.root=/my/images"], "their probes need a labelled set"),
        (
            [
                "data.dataset=image_folder",
                "data.root=/my/images",
                "--eval-arg",
                "data.root=/labelled",
            ],
            "--eval-arg data.dataset=imagenet_folder",
        ),
        (["data.root=/my/images"], "data.dataset=digits (the bundled set) has no root"),
    ],
)
def test_bad_sweeps_are_refused_before_anything_is_submitted(tmp_path, args, message):
    result = launch(
        "--config", "configs/default.yaml", "--runs-dir", str(tmp_path / "s"), *args, check=False
    )
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / "s").exists()


def test_status_row_shows_progress_phase_checkpoint_jobs_and_eval(tmp_path):
    cfg = load_config(None, ["optim.epochs=2", "train.epoch_length=5"])
    run = tmp_path / "sparse_0.70"
    _fake_progress(run, cfg, [3, 6], eval_done=True)
    record_job(run, "train", "41", "slurm")
    record_job(run, "train", "42", "slurm")  # a resubmission: the latest counts
    record_job(run, "eval", "43", "slurm")
    row = run_row(run, {"42": "RUNNING", "43": "PENDING"})
    assert row == {
        "run": "sparse_0.70",
        "step": "6/10",
        "phase": "dense",
        "checkpoint": "6",
        "train job": "42 RUNNING",
        "eval job": "43 PENDING",
        "eval": "top1 12.50",
    }
    table = format_table([row])
    assert table.splitlines()[0].split() == [
        "run",
        "step",
        "phase",
        "checkpoint",
        "train",
        "job",
        "eval",
        "job",
        "eval",
    ]
    result = launch("status", "--runs-dir", str(tmp_path))
    assert "sparse_0.70" in result.stdout and "6/10" in result.stdout


@pytest.mark.timeout(120)  # a FIFO opened for reading would block here for good
def test_status_rows_of_runs_with_hostile_files_say_so_and_the_others_still_print(tmp_path):
    cfg = load_config(None, ["optim.epochs=2", "train.epoch_length=5"])
    good, bad = tmp_path / "sparse_0.00", tmp_path / "sparse_0.70"
    _fake_progress(good, cfg, [3], eval_done=True)
    _fake_progress(bad, cfg, [3, 6])
    os.mkfifo(bad / "eval_linear.json")
    os.mkfifo(bad / "status.json")
    (bad / "jobs.json").write_bytes(b"\xff\xfe not json")
    with open(bad / "metrics.jsonl", "ab") as f:  # a damaged line, then a good one
        f.write(
            b'{"step": 6, "loss": \xe9}\n'
            + json.dumps({"step": 6, "phase": "dense", "loss": 1.0}).encode()
            + b"\n"
        )
    row = run_row(bad, {})
    assert row == {
        "run": "sparse_0.70",
        "step": "7/10",
        "phase": "dense",
        "checkpoint": "6",
        "train job": "unreadable jobs.json",
        "eval job": "unreadable jobs.json",
        "eval": "unreadable (eval_linear.json: not a regular file)",
    }
    result = launch("status", "--runs-dir", str(tmp_path))
    assert (
        "Traceback" not in result.stderr
        and "top1 12.50" in result.stdout
        and "unreadable" in result.stdout
    )


@pytest.mark.parametrize(
    "text, shown",
    [
        ('{"top1": NaN}', "unreadable (eval_linear.json: top1 is nan, not a percentage)"),
        ('{"top1": 1e999}', "unreadable (eval_linear.json: top1 is inf, not a percentage)"),
        ('{"top1": -3}', "unreadable (eval_linear.json: top1 is -3, not a percentage)"),
        ('{"top1": true}', "unreadable (eval_linear.json: top1 is True, not a percentage)"),
        ("[71.6]", "unreadable (eval_linear.json: not a JSON object)"),
        ('{"top5": 90.0}', "unreadable (eval_linear.json: no top1)"),
        ('{"top1": "71.6"}', "top1 71.60"),  # as the table reads it (NaN/inf are logged as strings)
        ('{"top1": 71.625}', "top1 71.62"),
    ],
)
def test_status_eval_column_shows_only_a_finite_percentage(tmp_path, text, shown):
    cfg = load_config(None, ["optim.epochs=2", "train.epoch_length=5"])
    run = tmp_path / "sparse_0.00"
    _fake_progress(run, cfg, [3], eval_done=True)
    (run / "eval_linear.json").write_text(text)
    assert run_row(run, {})["eval"] == shown


CHILD = """
import signal, sys, time
from pathlib import Path
marker = Path(sys.argv[1])
def stop(signum, frame):
    marker.write_text("stopped cleanly")
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
marker.write_text("started")
while True:
    time.sleep(0.05)
"""


class _ChildJob(ScriptJob):
    script = "child.py"


def test_checkpoint_stops_the_child_through_sigterm_and_requeues_a_fresh_copy(tmp_path):
    """Slurm signals the whole process tree, so USR2 reaches the child too: it must survive it and
    stop only on the SIGTERM that checkpoint() sends (train.py then saves at a step boundary)."""
    (tmp_path / "child.py").write_text(CHILD)
    marker = tmp_path / "marker"
    job = _ChildJob([str(marker)], stop_timeout_s=30, repo=tmp_path)
    child = job.start()
    deadline = time.monotonic() + 30
    while not marker.exists():
        assert time.monotonic() < deadline and child.poll() is None, "the child did not start"
        time.sleep(0.05)
    child.send_signal(signal.SIGUSR2)
    time.sleep(0.3)
    assert child.poll() is None, "USR2 killed the child"
    delayed = job.checkpoint()
    assert marker.read_text() == "stopped cleanly" and child.returncode == 143
    assert isinstance(delayed, submitit.helpers.DelayedSubmission)
    requeued = pickle.loads(
        pickle.dumps(delayed.function)
    )  # what submitit writes for the requeued job
    assert (
        isinstance(requeued, _ChildJob)
        and requeued._child is None
        and requeued.args == [str(marker)]
    )


def test_one_cpu_task_gets_as_many_torch_threads_as_cpus(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    env = _ChildJob([]).child_env()
    assert (
        env["OMP_NUM_THREADS"] == "3" and "RANK" not in env
    )  # outside a multi-task job: no torchrun variables


@pytest.mark.slow
def test_local_mode_trains_the_same_job_here_and_a_rerun_skips_it(tmp_path):
    args = [
        "--config",
        "configs/default.yaml",
        "--sparse-fractions",
        "0.5",
        "--runs-dir",
        str(tmp_path),
        "--gpus-per-node",
        "0",
        "--local",
        "--skip-eval",
        *TINY,
        "optim.epochs=2",
    ]  # 8 steps
    first = launch(*args)
    run = tmp_path / "sparse_0.50"
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 9)) and (
        run / "teacher_backbone.pth"
    ).exists()
    assert "(new)" in first.stdout and "skipped" in first.stdout, first.stdout
    status = launch("status", "--runs-dir", str(tmp_path)).stdout
    assert "8/8" in status and "(local)" in status, status
    again = launch(*args)
    assert "done" in again.stdout and len(json.loads((run / "jobs.json").read_text())) == 1, (
        again.stdout
    )


def test_overrides_after_the_fraction_list_stay_overrides_and_fractions_are_validated(tmp_path):
    from slurm.launch import parse_args

    args = parse_args(
        [
            "--config",
            "configs/default.yaml",
            "--sparse-fractions",
            "0",
            "0.5",
            "data.root=/d",
            "--slurm-arg",
            "account=abc",
            "--nodes",
            "2",
            "--eval-arg=linear.n_c=3",
            "train.seed=3",
        ]
    )
    assert args.sparse_fractions == [0.0, 0.5] and args.nodes == 2
    assert args.overrides == ["data.root=/d", "train.seed=3"]
    assert args.slurm_arg == [("account", "abc")] and args.eval_arg == ["linear.n_c=3"]
    result = launch(
        "--config",
        "configs/default.yaml",
        "--sparse-fractions",
        "0",
        "1.5",
        "data.root=/d",
        "--runs-dir",
        str(tmp_path / "s"),
        "--dry-run",
        check=False,
    )
    assert (
        result.returncode == 2 and "sparsity.sparse_fraction=1.5 is out of range" in result.stderr
    ), result.stderr
    assert not (tmp_path / "s").exists()


def test_status_of_one_run_directory_reports_that_run_and_a_folder_without_runs_is_an_error(
    tmp_path,
):
    cfg = load_config(None, ["optim.epochs=2", "train.epoch_length=5"])
    run = tmp_path / "sweep" / "sparse_0.70"
    _fake_progress(run, cfg, [3, 6])
    # a line in the current format: "step" counts the steps done, as the checkpoint names do
    (run / "metrics.jsonl").write_text(
        json.dumps({"step": 6, "format": 2, "phase": "dense", "loss": 1.0}) + "\n"
    )
    for runs_dir in (run, run.parent):  # the run itself, or its sweep folder
        result = launch("status", "--runs-dir", str(runs_dir))
        assert "sparse_0.70" in result.stdout and "6/10" in result.stdout, result.stdout
    for not_runs in (run / "checkpoints", tmp_path / "absent"):
        result = launch("status", "--runs-dir", str(not_runs), check=False)
        assert result.returncode == 2 and result.stdout == "" and str(not_runs) in result.stderr, (
            result.stderr
        )


def test_a_recipe_with_the_teacher_restart_sweeps_every_fraction(tmp_path):
    """teacher.momentum_restart_at_switch=true is refused by a run without a switch; the sweep
    applies it to the runs that switch and turns it off, with a note, for the dense and the 100%
    run, so one command serves the recipe."""
    restart = "teacher.momentum_restart_at_switch"
    overrides = ["optim.epochs=2", "sparsity.pruned_decay=0.005", f"{restart}=true"]
    plans = plan_sweep("configs/default.yaml", [0.0, 0.7, 1.0], tmp_path / "s", overrides)
    by_fraction = {p.fraction: p for p in plans}
    assert (
        by_fraction[0.7].cfg.teacher.momentum_restart_at_switch is True
        and by_fraction[0.7].notes == []
    )
    assert by_fraction[0.7].overrides == [*overrides, "sparsity.sparse_fraction=0.7"]
    for fraction in (0.0, 1.0):
        plan = by_fraction[fraction]
        assert (
            plan.cfg.teacher.momentum_restart_at_switch is False
            and plan.cfg.sparsity.pruned_decay == 0.005
        )
        assert (
            plan.overrides[-1] == f"{restart}=false"
        )  # after the sweep's =true: the job's train.py resolves false
        assert plan.notes == [f"{restart}=true left out: {fraction * 100:g}% sparse has no switch"]
    result = launch(
        "--config",
        "configs/default.yaml",
        "--sparse-fractions",
        "0",
        "0.7",
        "--runs-dir",
        str(tmp_path / "s"),
        "--gpus-per-node",
        "0",
        "--dry-run",
        *overrides,
    )
    assert f"note: {restart}=true left out: 0% sparse has no switch" in result.stdout
    assert result.stdout.count("note: ") == 2  # the lr note of the header, and the dense run's


@pytest.mark.parametrize(
    "record, done",
    [
        ({"top1": 12.5}, True),
        ({"top1": "nan"}, False),  # unreadable for the table: the probe is run again
        (
            {"top1": 12.5, "dataset": {"own": False, "other_because": "data.root=/elsewhere"}},
            False,
        ),  # other data
        (
            {"top1": 12.5, "checkpoint_sha256": "0" * 64},
            False,
        ),  # of an earlier teacher than the run's current one
    ],
)
def test_a_probe_is_done_when_the_table_would_show_it(tmp_path, record, done):
    from slurm.sweep import probe_done

    cfg = load_config(None, ["optim.epochs=2", "train.epoch_length=5"])
    _fake_progress(tmp_path / "run", cfg, [10], eval_done=True)
    (tmp_path / "run" / "teacher_backbone.pth.sha256").write_text(
        "1" * 64 + "  teacher_backbone.pth\n"
    )
    (tmp_path / "run" / "eval_linear.json").write_text(json.dumps(record))
    assert probe_done(tmp_path / "run") is done


LABELLED = [
    "data.dataset=imagenet_folder",
    "data.root=/labelled/pets",
]  # the probe set of a run on unlabelled images


def _probe_record(run_dir, name, eval_args, own=True):
    """A record as eval_linear.py writes it for `eval_args`: its settings as eval_config, its data
    own or not."""
    from configs import load_eval_config

    record = {
        "top1": 40.0,
        "eval_config": to_yaml(load_eval_config(None, eval_args)),
        "dataset": {
            "own": own,
            **({} if own else {"other_because": "data.dataset=imagenet_folder"}),
        },
    }
    (run_dir / name).write_text(json.dumps(record))


@pytest.mark.parametrize(
    "written, asked, done",
    [
        (
            (LABELLED, "eval_linear_data_pets.json"),
            LABELLED,
            True,
        ),  # the probe of other data, named after it
        ((LABELLED, "eval_linear_data_pets.json"), [], False),  # not the run's own probe
        (
            ([], "eval_linear.json"),
            LABELLED,
            False,
        ),  # the own probe does not answer one of other data
        (
            (["linear.n_c=3"], "eval_linear.json"),
            [],
            False,
        ),  # another protocol: not the probe the job runs
        ((["linear.n_c=3"], "eval_linear.json"), ["linear.n_c=3"], True),
        (
            (["mode=knn"], "eval_knn.json"),
            [],
            False,
        ),  # k-NN alone does not answer a probe that asks for both
        (
            ([], "eval_linear.json"),
            ["mode=knn", "device=cpu"],
            True,
        ),  # mode=both answers k-NN; the device is no setting
        (
            (["data.root=/the/training/root"], "eval_linear.json"),
            [],
            True,
        ),  # the own data spelled out: still the own
    ],
)
def test_the_launchers_done_is_the_record_of_the_probe_its_job_runs(tmp_path, written, asked, done):
    """The probe job's settings (--eval-arg) pick its record by what each record says it probed, not
    by a file name: a run on unlabelled images, probed on a labelled set, writes
    eval_linear_data_<label>.json, which the launcher must count as done (and the job's result must
    find), or every launch would probe it again."""
    from configs import load_eval_config
    from slurm.jobs import ChildFailed, EvalJob
    from slurm.sweep import probe_done

    cfg = load_config(None, ["optim.epochs=2", "train.epoch_length=5"])
    _fake_progress(tmp_path / "run", cfg, [10])
    args, name = written
    _probe_record(tmp_path / "run", name, args, own=args != LABELLED)
    assert probe_done(tmp_path / "run", load_eval_config(None, asked)) is done
    job = EvalJob(tmp_path / "run", asked)
    if done:
        assert job.result()["top1"] == 40.0
    else:
        with pytest.raises(ChildFailed, match="holds no readable record of its probe"):
            job.result()


def test_status_shows_the_probe_the_eval_job_ran(tmp_path):
    """jobs.json keeps an eval job's settings; `launch.py status` shows the record of those settings
    (a probe of a labelled set for a run on unlabelled images), where it showed '-' looking for
    eval_linear.json alone. A jobs.json written before jobs kept their settings still reads (the
    default probe's)."""
    cfg = load_config(None, ["optim.epochs=2", "train.epoch_length=5"])
    run = tmp_path / "run"
    _fake_progress(run, cfg, [10])
    _probe_record(run, "eval_linear_data_pets.json", LABELLED, own=False)
    (run / "jobs.json").write_text(
        json.dumps(
            [
                {
                    "kind": "train",
                    "job_id": "41",
                    "cluster": "slurm",
                    "submitted": "2026-11-29T10:00:00",
                }
            ]
        )
    )
    assert run_row(run, {})["eval"] == "-"
    record_job(run, "eval", "42", "slurm", LABELLED)
    assert json.loads((run / "jobs.json").read_text())[-1]["args"] == LABELLED
    assert run_row(run, {})["eval"] == "top1 40.00"


def test_a_probe_setting_eval_linear_would_refuse_stops_the_launch_before_any_work(tmp_path):
    result = launch(
        "--config",
        "configs/default.yaml",
        "--sparse-fractions",
        "0.5",
        "--runs-dir",
        str(tmp_path / "s"),
        "--gpus-per-node",
        "0",
        "--dry-run",
        "--eval-arg",
        "linear.n_cc=3",
        *TINY,
        check=False,
    )
    assert result.returncode == 2 and "unknown config key 'linear.n_cc'" in result.stderr, (
        result.stderr
    )
    assert not (tmp_path / "s").exists()


def test_a_junk_file_named_like_the_last_checkpoint_is_not_a_finished_training(tmp_path):
    """train.py refuses a checkpoint without a digest; so does the launcher's plan: the run is
    resumed from the one before, not reported `training: done`."""
    from rundir.status import resumable_step
    from rundir.torch_files import save_verified

    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    save_verified({"step": 6}, folder / "step_00000006.pt")
    (folder / "step_00000010.pt").write_bytes(b"junk, no digest")
    assert resumable_step(tmp_path / "run", 10) == 6
    save_verified({"step": 10}, folder / "step_00000010.pt")  # the real one, with its digest
    assert resumable_step(tmp_path / "run", 10) == 10


def _processes_naming(text: str) -> list[str]:
    """Command lines of the live processes that mention `text` (from /proc: no extra package)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if (
            proc.name.isdigit()
            and text in cmdline
            and (proc / "stat").read_text().split()[2] != "Z"
        ):
            found.append(cmdline)
    return found


@pytest.mark.slow
@pytest.mark.skipif(
    not Path("/proc/self/cmdline").exists(), reason="reads live processes from /proc"
)
def test_local_mode_fits_the_machine_and_a_stop_ends_every_process_it_started(tmp_path):
    """Without GPUs --local trains one CPU process (it used to start 8 gloo processes: another batch
    and lr); a SIGTERM to the launcher stops the job's controller, task and train.py (none left
    behind), and status then reports the step the run reached (metrics lines are rare here: every 50
    steps)."""
    import subprocess
    import sys

    import torch
    from launcher_helpers import REPO

    args = [
        sys.executable,
        "slurm/launch.py",
        "--config",
        "configs/default.yaml",
        "--sparse-fractions",
        "0.5",
        "--runs-dir",
        str(tmp_path),
        "--local",
        "--skip-eval",
        *TINY,
        "optim.epochs=500",
        "train.log_period=50",
        "train.checkpoint_period=2",
    ]
    proc = subprocess.Popen(
        args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    checkpoints = tmp_path / "sparse_0.50" / "checkpoints"
    deadline = time.monotonic() + 300
    while not (checkpoints.is_dir() and any(checkpoints.glob("step_00000004.pt"))):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    assert (
        proc.returncode == 130 and "stopped: the local job and its processes were stopped" in err
    ), err[-3000:]
    if not torch.cuda.is_available():
        assert "--local: 0 GPU(s) here, so each run trains as 1 CPU process(es)" in err
        info = json.loads((tmp_path / "sparse_0.50" / "run_info.json").read_text())
        assert info["world_size"] == 1
    deadline = time.monotonic() + 60
    while (left := _processes_naming(str(tmp_path))) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], left
    step = max(int(p.name[5:13]) for p in checkpoints.glob("step_*.pt"))
    status = launch("status", "--runs-dir", str(tmp_path)).stdout
    assert f"{step}/{500 * 4}" in status, (
        status
    )  # the checkpoint's step, not the last metrics line's 0


@pytest.mark.slow
def test_a_finished_local_job_of_two_processes_reads_as_done_and_its_probe_runs(tmp_path):
    """A local job of several tasks used to be reported failed when it finished ("You should use
    results() if your job has subtasks"), so its probe never ran."""
    result = launch(
        "--config",
        "configs/default.yaml",
        "--sparse-fractions",
        "0.5",
        "--runs-dir",
        str(tmp_path),
        "--local",
        "--gpus-per-node",
        "0",
        "--cpu-tasks-per-node",
        "2",
        *TINY,
        "optim.epochs=2",
        "train.batch_size_per_gpu=4",
        "--eval-arg",
        "linear.n_c=3",
        "--eval-arg",
        "linear.max_iter=50",
        "--eval-arg",
        "features.num_workers=0",
    )
    run = tmp_path / "sparse_0.50"
    assert "FAILED" not in result.stdout, result.stdout + result.stderr[-3000:]
    assert json.loads((run / "run_info.json").read_text())["world_size"] == 2
    quick = load_eval_config(None, ["linear.n_c=3", "linear.max_iter=50", "features.num_workers=0"])
    assert (
        json.loads((run / f"eval_linear_{protocol_label(quick)}.json").read_text())["top1"]
        is not None
    )
