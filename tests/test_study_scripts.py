"""The GPU study's shell drivers, run here with stand-in train.py / eval_linear.py (they are thin:
what they add is the scheduling, the stopping and the summary, which is what these tests check)."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DRIVER_DIR = REPO / "scripts" / "experiments"

FAKE_TRAIN = r"""
import os, signal, sys, time
from pathlib import Path
args = sys.argv[1:]
out = Path(args[args.index("--output-dir") + 1])
out.mkdir(parents=True, exist_ok=True)
(out / "args.txt").write_text(" ".join(args))
(out / "gpu.txt").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
sparse_steps = 7760 if "sparsity.sparse_fraction=1.0" in args else 0
(out / "run_info.json").write_text('{"sparse_steps": %d, "total_steps": 7760}' % sparse_steps)
if any(a == "fail=1" for a in args):
    sys.exit(1)
if any(a == "silent=1" for a in args):  # dies during its start-up, before any step line
    time.sleep(1)
    sys.exit(3)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
seed = int(next(a.split("=")[1] for a in args if a.startswith("train.seed=")))
steps = next((int(a.split("=")[1]) for a in args if a.startswith("steps=")), 10**6)
time.sleep(1)  # start-up
for step in range(20, 20 * steps + 1, 20):
    stamp = time.strftime("%Y-%m-%d %H:%M:%S") + ",000"
    print(f"{stamp} INFO train: step {step:4d}/7760  phase sparse  loss 1.0  images/s {3000 + 100 * seed}", flush=True)
    time.sleep(0.25)
export = out / "eval" / "step_00000002" / "teacher_backbone.pth"
export.parent.mkdir(parents=True)
export.write_text("weights")
"""

FAKE_EVAL = r"""
import sys
from pathlib import Path
args = sys.argv[1:]
run = Path(args[args.index("--run") + 1])
with open(run / "evals.txt", "a") as f:
    f.write(" ".join(args[2:]) + "\n")
"""


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "scripts" / "experiments").mkdir(parents=True)
    for name in (
        "arguments.sh",
        "study_runs.sh",
        "study_gpus.sh",
        "study_throughput.sh",
        "study_throughput_rows.sh",
    ):
        shutil.copy(DRIVER_DIR / name, tmp_path / "scripts" / "experiments" / name)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "cifar10.yaml").write_text(
        ""
    )  # study_runs.sh's default config must exist
    (tmp_path / "train.py").write_text(FAKE_TRAIN)
    (tmp_path / "eval_linear.py").write_text(FAKE_EVAL)
    return tmp_path


def script_env() -> dict:
    """This Python first on PATH, and the throughput scripts' SETTLE_S (10 s by default) at 2 s: the
    stand-in starts in 1 s."""
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "SETTLE_S": "2",
    }


def run_script(workdir, *args, timeout=120):
    return subprocess.run(
        ["bash", *args],
        cwd=workdir,
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_throughput_measures_the_window_after_every_run_started_and_stops_them(workdir):
    start = time.monotonic()
    result = run_script(
        workdir, "scripts/experiments/study_throughput.sh", "2", "3", "0", "data", "out"
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["runs"] == 2 and summary["mps"] is False
    assert summary["images_per_s"] == [3000, 3100] and summary["total_images_per_s"] == 6100
    assert all(n >= 4 for n in summary["windows_per_run"])  # 3 s of 4 lines a second
    assert (
        2 <= summary["window_s"] <= 4
    )  # SECONDS long, from SETTLE_S after the last first step (1 s stamps)
    assert time.monotonic() - start < 60  # stopped after the window, not left to train on
    # each run got its seed and the overrides
    assert "train.seed=1" in (workdir / "out" / "run1" / "args.txt").read_text()


def test_throughput_rows_compare_several_runs_with_every_single_run_of_the_same_machine(workdir):
    result = run_script(
        workdir,
        "scripts/experiments/study_throughput_rows.sh",
        "data",
        "out",
        "warm:1x1 a:1x2 b:1x2 c:2x2 g:1x2:train.compile_mode=reduce-overhead",
        "common=1",
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (workdir / "out" / "rows.jsonl").read_text().splitlines()]
    assert [r["row"] for r in rows] == ["warm", "a", "b", "c", "g"]
    assert [r["runs"] for r in rows] == [1, 1, 1, 2, 1]
    assert [r["overrides"] for r in rows] == [
        [],
        [],
        [],
        [],
        ["train.compile_mode=reduce-overhead"],
    ]
    assert rows[1]["min_max_per_run"] == [
        [3000, 3000]
    ]  # the stand-in prints 3000 + 100 x seed images/s
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    # the warm-up row is left out, and so is the single run set up differently (g) from the
    # baseline; c = 3000 + 3100 against single runs of 3000 each
    assert [s["row"] for s in summary["single"]] == ["a", "b"] and summary["single_mean"] == 3000
    assert summary["compared"] == [
        {
            "row": "c",
            "runs": 2,
            "mps": False,
            "overrides": [],
            "total": 6100,
            "vs_single_mean": 2.033,
            "vs_each_single": {"a": 2.033, "b": 2.033},
        },
        {
            "row": "g",
            "runs": 1,
            "mps": False,
            "overrides": ["train.compile_mode=reduce-overhead"],
            "total": 3000,
            "vs_single_mean": 1.0,
            "vs_each_single": {"a": 1.0, "b": 1.0},
        },
    ]
    assert summary["failed"] == []
    assert (workdir / "out" / "c" / "run1" / "args.txt").exists()
    # the common overrides reach every run, a row's own only its runs, after the common ones
    g_args = (workdir / "out" / "g" / "run0" / "args.txt").read_text().split()
    assert g_args[-2:] == ["common=1", "train.compile_mode=reduce-overhead"]
    assert (
        "train.compile_mode=reduce-overhead"
        not in (workdir / "out" / "a" / "run0" / "args.txt").read_text()
    )


@pytest.mark.parametrize("rows", ["a:1", "a:x2", "a:1x2:mpss", "a:0x2"])
def test_throughput_rows_refuse_a_malformed_row_before_running_any(workdir, rows):
    result = run_script(
        workdir, "scripts/experiments/study_throughput_rows.sh", "data", "out", f"ok:1x1 {rows}"
    )
    assert result.returncode == 2 and "row '" in result.stderr
    assert not (workdir / "out").exists()


def test_throughput_rows_keep_the_summary_of_the_rows_done_when_stopped_mid_row(workdir):
    """The machine can go away during a long row: summary.json is rewritten after every row."""
    proc = subprocess.Popen(
        ["bash", "scripts/experiments/study_throughput_rows.sh", "data", "out", "a:1x1 b:2x60"],
        cwd=workdir,
        env=script_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (workdir / "out" / "b" / "run1.log").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (workdir / "out" / "b" / "run1.log").exists(), "row b never started"
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    assert [s["row"] for s in summary["single"]] == ["a"] and summary["compared"] == []


def test_throughput_with_a_run_that_dies_in_start_up_says_so_instead_of_waiting(workdir):
    result = run_script(
        workdir, "scripts/experiments/study_throughput.sh", "1", "2", "0", "data", "out", "silent=1"
    )
    assert result.returncode == 1
    assert (
        json.loads(result.stdout.strip().splitlines()[-1])["error"] == "a run printed no step line"
    )


def test_study_runs_trains_and_probes_each_run_and_reports_a_failure(workdir):
    plan = workdir / "plan.txt"
    plan.write_text(
        "# three runs, one that fails\n\nok_run 0 steps=3 train.seed=0\nbad_run 1 fail=1 "
        "train.seed=1\n"
        "sparse_run 0 steps=2 train.seed=2 sparsity.sparse_fraction=1.0\n"
    )
    result = run_script(workdir, "scripts/experiments/study_runs.sh", "plan.txt", "runs", "data")
    assert result.returncode == 0, result.stderr
    log = (workdir / "runs" / "driver.log").read_text()
    assert (
        "start ok_run (steps=3 train.seed=0)" in log
        and "trained ok_run" in log
        and "done ok_run" in log
    )
    assert "FAILED training bad_run" in log and "trained bad_run" not in log
    assert log.rstrip().endswith("all done")
    args = (workdir / "runs" / "ok_run" / "args.txt").read_text().split()
    assert args[:4] == ["--config", "configs/cifar10.yaml", "--output-dir", "runs/ok_run"]
    assert "data.root=data" in args
    evals = (workdir / "runs" / "ok_run" / "evals.txt").read_text().splitlines()
    export = "checkpoint=runs/ok_run/eval/step_00000002/teacher_backbone.pth mode=knn"
    # the final teacher probed as the run ended, then the other way: pruned after a dense end, dense
    # after a sparse one
    assert evals == ["", "prune_mlp=true", export, f"{export} prune_mlp=true"]
    assert (workdir / "runs" / "sparse_run" / "evals.txt").read_text().splitlines()[:2] == [
        "",
        "prune_mlp=false",
    ]
    assert not (workdir / "runs" / "bad_run" / "evals.txt").exists()


def test_study_runs_starts_an_after_line_when_the_line_above_has_trained(workdir):
    (workdir / "plan.txt").write_text(
        "first 0 steps=2 train.seed=0\nsecond after steps=1 train.seed=1\n"
        "third after fail=1 train.seed=2\nfourth after steps=1 train.seed=3\n"
    )
    (workdir / "runs").mkdir()
    (workdir / "runs" / "first.trained").write_text(
        ""
    )  # an earlier driver's marker must not start `second`
    result = run_script(workdir, "scripts/experiments/study_runs.sh", "plan.txt", "runs", "data")
    assert result.returncode == 0, result.stderr
    events = [
        line.split(" ", 1)[1].split(" (")[0]
        for line in (workdir / "runs" / "driver.log").read_text().splitlines()
    ]
    assert (
        events.index("trained first")
        < events.index("start second")
        < events.index("trained second")
    )
    # a failed run lets the next one start all the same
    assert events.index("FAILED training third") < events.index("start fourth")
    assert "done fourth" in events and events[-1] == "all done"


def test_study_runs_records_the_plans_role_in_each_trained_run(workdir):
    """A plan's "# role:" line becomes study.json in each run it trained (what make_table reads to
    keep screening runs out of means); a run that failed to train gets none; a plan without the
    line writes none."""
    (workdir / "plan.txt").write_text(
        "# fresh seeds\n#  role: confirmatory (seeds 5-7)\nok_run 0 steps=2 train.seed=0\n"
        "bad_run 0 fail=1 train.seed=1\n"
    )
    result = run_script(workdir, "scripts/experiments/study_runs.sh", "plan.txt", "runs", "data")
    assert result.returncode == 0, result.stderr
    record = json.loads((workdir / "runs" / "ok_run" / "study.json").read_text())
    assert record == {"role": "confirmatory", "plan": "plan.txt"}
    assert not (workdir / "runs" / "bad_run" / "study.json").exists()
    (workdir / "plain.txt").write_text("other_run 0 steps=1 train.seed=3\n")
    result = run_script(workdir, "scripts/experiments/study_runs.sh", "plain.txt", "runs", "data")
    assert result.returncode == 0, result.stderr
    assert not (workdir / "runs" / "other_run" / "study.json").exists()


def test_study_gpus_runs_each_plan_on_its_gpu_into_its_own_folder(workdir):
    (workdir / "a.txt").write_text("a1 0 steps=1 train.seed=0\na2 after steps=1 train.seed=1\n")
    (workdir / "b.txt").write_text("b1 0 steps=1 train.seed=2\n")
    result = run_script(
        workdir, "scripts/experiments/study_gpus.sh", "runs", "data", "0:a.txt", "1:b.txt"
    )
    assert result.returncode == 0, result.stderr
    runs = workdir / "runs"
    gpu_of = {r: (runs / plan / r / "gpu.txt").read_text() for plan, r in
              (("a", "a1"), ("a", "a2"), ("b", "b1"))}  # fmt: skip
    assert gpu_of == {"a1": "0", "a2": "0", "b1": "1"}
    for plan in ("a", "b"):
        assert (runs / plan / "driver.log").read_text().rstrip().endswith("all done")
    events = [line.split(" ", 1)[1] for line in (runs / "gpus.log").read_text().splitlines()]
    assert events[:2] == ["start a on GPU 0 (a.txt)", "start b on GPU 1 (b.txt)"]
    assert sorted(events[2:4]) == ["ended a (exit 0)", "ended b (exit 0)"]
    assert events[-1] == "all done"


@pytest.mark.parametrize(
    "pairs, says",
    [
        (["0:a.txt", "1:bad.txt"], "'1:bad.txt': study_runs.sh: PLAN bad.txt: x: the start delay"),
        (["0:a.txt", "1:sub/a.txt"], "'1:sub/a.txt': a second plan named a"),
    ],
)
def test_study_gpus_checks_every_plan_before_starting_any(workdir, pairs, says):
    (workdir / "a.txt").write_text("a1 0 steps=1 train.seed=0\n")
    (workdir / "bad.txt").write_text("x soon steps=1\n")
    (workdir / "sub").mkdir()
    (workdir / "sub" / "a.txt").write_text("a1 0 steps=1 train.seed=0\n")
    result = run_script(workdir, "scripts/experiments/study_gpus.sh", "runs", "data", *pairs)
    assert result.returncode == 2
    assert result.stderr.splitlines()[0].startswith(f"study_gpus.sh: {says}")
    assert not (workdir / "runs").exists()


def test_study_runs_check_only_checks_and_runs_nothing(workdir):
    (workdir / "plan.txt").write_text("a 0 steps=1 train.seed=0\n")
    result = run_script(
        workdir, "scripts/experiments/study_runs.sh", "--check", "plan.txt", "runs", "data"
    )
    assert result.returncode == 0 and result.stderr == ""
    assert not (workdir / "runs").exists()


def _driver(path: Path, done: bool) -> Path:
    path.mkdir()
    events = [
        "2026-11-26T09:44:05Z start a (x=1)",
        "2026-11-26T10:05:00Z trained a",
        "2026-11-26T10:06:00Z done a",
    ]
    (path / "driver.log").write_text(
        "\n".join(events + (["2026-11-26T10:06:00Z all done"] if done else [])) + "\n"
    )
    (path / "a.train.log").write_text(
        "2026-11-26 09:50:00,000 INFO train: step 7740/7760  phase dense  loss 4.8\n"
        "2026-11-26 09:50:01,000 INFO train: done\n"
    )
    return path


def test_study_wait_returns_when_every_driver_is_done_and_reports(tmp_path):
    done1, done2 = _driver(tmp_path / "t1", True), _driver(tmp_path / "t2", True)
    start = time.monotonic()
    out = subprocess.run(
        ["bash", str(DRIVER_DIR / "study_wait.sh"), "60", str(done1), str(done2)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and time.monotonic() - start < 10
    assert out.stdout.count("a: 2026-11-26 09:50:00,000 INFO train: step 7740/7760") == 2
    assert "t1: 2026-11-26T10:05:00Z trained a" in out.stdout and " start " not in out.stdout
    assert out.stdout.rstrip().endswith("all done")


def test_study_wait_gives_up_after_its_limit(tmp_path):
    done, running = _driver(tmp_path / "t1", True), _driver(tmp_path / "t2", False)
    start = time.monotonic()
    out = subprocess.run(
        ["bash", str(DRIVER_DIR / "study_wait.sh"), "3", str(done), str(running)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and 3 <= time.monotonic() - start < 15
    assert out.stdout.rstrip().endswith("still running after 3 s")


DRIVERS = (
    "study_runs.sh",
    "study_gpus.sh",
    "study_collect.sh",
    "study_throughput.sh",
    "study_throughput_rows.sh",
    "study_wait.sh",
)


@pytest.mark.parametrize("name", DRIVERS)
def test_every_driver_answers_help_with_its_usage(name):
    out = subprocess.run(
        ["bash", str(DRIVER_DIR / name), "--help"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0 and out.stderr == ""
    assert (
        f"scripts/experiments/{name} " in out.stdout
    )  # the usage line, from the comment at the top
    assert not out.stdout.startswith("#!") and "set -" not in out.stdout


@pytest.mark.parametrize(
    "name, args, says",
    [
        ("study_runs.sh", [], "expected 3 or 4 arguments, got 0"),
        ("study_runs.sh", ["no_plan.txt", "runs", "data"], "PLAN no_plan.txt: no such file"),
        ("study_collect.sh", ["runs"], "expected 2 arguments, got 1"),
        (
            "study_gpus.sh",
            ["runs", "data"],
            "expected RUNS_DIR, DATA_ROOT and at least one GPU:PLAN, got 2 argument(s)",
        ),
        (
            "study_gpus.sh",
            ["runs", "data", "plan.txt"],
            "'plan.txt': expected GPU:PLAN, a GPU index and a plan file (0:plan.txt)",
        ),
        (
            "study_gpus.sh",
            ["runs", "data", "0:no_plan.txt"],
            "'0:no_plan.txt': study_runs.sh: PLAN no_plan.txt: no such file",
        ),
        ("study_throughput.sh", ["2", "3", "0", "data"], "expected at least 5 arguments, got 4"),
        (
            "study_throughput.sh",
            ["two", "3", "0", "data", "out"],
            "N two: expected a number of runs > 0",
        ),
        ("study_throughput.sh", ["2", "3", "yes", "data", "out"], "MPS yes: expected 0 or 1"),
        ("study_throughput.sh", ["2", "3", "0", "data", "out", "seed"], "seed: expected key=value"),
        ("study_throughput_rows.sh", ["data", "out"], "expected at least 3 arguments, got 2"),
        (
            "study_wait.sh",
            ["600"],
            "expected MAX_SECONDS and at least one RUNS_DIR, got 1 argument(s)",
        ),
        (
            "study_wait.sh",
            ["10m", "runs"],
            "MAX_SECONDS 10m: expected a whole number of seconds > 0",
        ),
    ],
)
def test_every_driver_refuses_wrong_arguments_with_its_usage_before_any_work(
    tmp_path, name, args, says
):
    out = subprocess.run(
        ["bash", str(DRIVER_DIR / name), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and out.stdout == ""
    first, *usage = out.stderr.splitlines()
    assert first == f"{name}: {says}"
    assert any(f"scripts/experiments/{name} " in line for line in usage)
    assert list(tmp_path.iterdir()) == []  # nothing made: no output folder, no driver log


@pytest.mark.parametrize(
    "plan, says",
    [
        ("a after x=1\n", "a starts 'after' the line above it, and has none"),
        (
            "# c\na 0 x=1\nb soon x=1\n",
            "b: the start delay must be whole seconds or 'after', not 'soon'",
        ),
        ("# role: pilot\na 0 x=1\n", "role 'pilot' is not screening or confirmatory"),
    ],
)
def test_study_runs_refuses_a_plan_line_it_cannot_schedule_before_any_run(tmp_path, plan, says):
    (tmp_path / "plan.txt").write_text(plan)
    out = subprocess.run(
        [
            "bash",
            str(DRIVER_DIR / "study_runs.sh"),
            "plan.txt",
            "runs",
            "data",
            str(REPO / "configs" / "cifar10.yaml"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (
        out.returncode == 2
        and out.stderr.splitlines()[0] == f"study_runs.sh: PLAN plan.txt: {says}"
    )
    assert not (tmp_path / "runs").exists()


def _plan_lines():
    """(plan, line number, name, delay, overrides) of every run line of the committed study
    plans."""
    for plan in sorted((REPO / "results").rglob("plans/*.txt")):
        for number, line in enumerate(plan.read_text().splitlines(), 1):
            if line.strip() and not line.lstrip().startswith("#"):
                name, delay, *overrides = line.split()
                yield plan.relative_to(REPO), number, name, delay, overrides


def test_every_committed_plan_line_is_a_valid_run():
    # a typo in a plan costs a GPU slot: every line's overrides must load against
    # configs/cifar10.yaml (the driver's default config), its name end in its seed, and a name
    # planned twice in one folder (a re-run) mean the same run (settings of how it executes, like
    # the step's CUDA graph, may differ, as on a resume)
    from cifar_config import cifar_config

    from configs.load import RESUMABLE_CHANGES

    lines = list(_plan_lines())
    assert len(lines) > 40
    seen, previous_plan = {}, None
    for plan, number, name, delay, overrides in lines:
        where = f"{plan}:{number}"
        assert delay.isdigit() or (delay == "after" and previous_plan == plan), where
        previous_plan = plan
        assert all("=" in o for o in overrides), where
        cfg = cifar_config(*overrides)
        assert name.rsplit("_s", 1)[-1] == str(cfg.train.seed), (
            f"{where}: {name} is not train.seed={cfg.train.seed}"
        )
        computed = [o for o in overrides if o.split("=", 1)[0] not in RESUMABLE_CHANGES]
        first = seen.setdefault((plan.parent, name), (where, computed))
        assert first[1] == computed, f"{where}: {name} differs from its line at {first[0]}"


def test_committed_plans_name_valid_roles_and_the_unrun_ones_name_one():
    """The role line the driver reads (its first word); the plans not yet run when roles came in
    carry one, so their runs arrive marked."""
    import re

    roles = {}
    for plan in sorted((REPO / "results").rglob("plans/*.txt")):
        found = re.findall(r"^# *role: *(\S*)", plan.read_text(), re.MULTILINE)
        if found:
            roles[plan.name] = found[0]
    assert set(roles.values()) <= {"screening", "confirmatory"}, roles
    assert roles["confirm_lr_11.txt"] == "confirmatory" and roles["warmup_2.txt"] == "screening"
