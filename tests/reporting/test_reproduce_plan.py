"""scripts/reproduce.py without training anything: what it plans, what it skips, the commands it
would run."""

import hashlib
import importlib.util
import json
import logging
import os
from pathlib import Path

import pytest
from reporting_runs import REPO, eval_result, make_run

from configs import to_yaml
from configs.eval_schema import load_eval_config

BASELINE_FILES = {
    "eval_linear_random_init.json": eval_result(30.0),
    "eval_linear_pixels.json": eval_result(40.0),
}


@pytest.fixture(scope="module")
def reproduce():
    spec = importlib.util.spec_from_file_location(
        "reproduce_script", REPO / "scripts" / "reproduce.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def runs_dir(tmp_path):
    runs = tmp_path / "runs"
    make_run(
        runs, "sparse_0.00", 0.0, baselines=BASELINE_FILES
    )  # trained, evaluated, baselines: nothing to do
    stale = make_run(
        runs, "sparse_0.70", 0.7
    )  # evaluated before its teacher was re-exported: evaluate again
    os.utime(stale / "eval_linear.json", (1_000_000, 1_000_000))
    make_run(runs, "sparse_0.40", 0.4, result=None)  # trained, never evaluated
    make_run(
        runs, "sparse_0.90", 0.9, steps_done=100, finished=False, result=None
    )  # interrupted: resume
    make_run(
        runs,
        "sparse_1.00",
        1.0,
        steps_done=20,
        finished=False,
        result=None,
        log_tail="ERROR train: TrainingDiverged: non-finite loss at step 21",
    )  # failed: retried
    return runs


def test_plan_skips_finished_work(reproduce, runs_dir):
    plan = {p.run_dir.name: p for p in reproduce.plan(runs_dir, [0.0, 0.4, 0.6, 0.7, 0.9, 1.0])}
    assert (plan["sparse_0.00"].train, plan["sparse_0.00"].evaluate) == (False, False)
    assert (plan["sparse_0.40"].train, plan["sparse_0.40"].evaluate) == (False, True)
    assert (plan["sparse_0.60"].train, plan["sparse_0.60"].evaluate) == (
        True,
        True,
    )  # no directory yet
    assert (plan["sparse_0.70"].train, plan["sparse_0.70"].evaluate) == (False, True)
    assert (plan["sparse_0.90"].train, plan["sparse_0.90"].evaluate) == (True, True)
    assert plan["sparse_1.00"].train and plan["sparse_1.00"].state.startswith("failed")
    assert plan["sparse_0.60"].fraction == 0.6


def test_run_names_and_fraction_parsing(reproduce):
    assert [reproduce.run_name(f) for f in reproduce.PUBLISHED_FRACTIONS] == [
        "sparse_0.00",
        "sparse_0.40",
        "sparse_0.60",
        "sparse_0.70",
        "sparse_0.80",
        "sparse_0.90",
        "sparse_1.00",
    ]
    assert reproduce.parse_fractions("0, 0.5,1") == [0.0, 0.5, 1.0]
    for bad in ("1.5", "a,b", ""):
        with pytest.raises(Exception, match="--fractions"):
            reproduce.parse_fractions(bad)


def test_execute_runs_what_is_planned_and_continues_after_a_failure(
    reproduce, runs_dir, monkeypatch, tmp_path
):
    calls = []
    (tmp_path / "eval_linear.py").write_text("")
    monkeypatch.setattr(reproduce, "EVAL_SCRIPT", tmp_path / "eval_linear.py")

    def fake_run(command, log_path):
        calls.append((command, log_path.name))
        script = os.path.basename(command[1])
        return 1 if script == "train.py" and "sparse_0.90" in command[3] else 0

    monkeypatch.setattr(reproduce, "_run_logged", fake_run)
    plan = reproduce.plan(runs_dir, [0.0, 0.7, 0.9, 1.0])
    failures = reproduce.execute(plan, ["train.num_workers=0"], ["solver=sklearn"])
    names = [(os.path.basename(c[1]), c[3]) for c, _ in calls]
    assert names == [
        ("eval_linear.py", str(runs_dir / "sparse_0.70")),
        (
            "train.py",
            str(runs_dir / "sparse_0.90"),
        ),  # fails: its evaluation is skipped, the next run still goes
        ("train.py", str(runs_dir / "sparse_1.00")),
        ("eval_linear.py", str(runs_dir / "sparse_1.00")),
    ]
    train = calls[1][0]
    assert train[-2:] == [
        "train.num_workers=0",
        "sparsity.sparse_fraction=0.9",
    ]  # the sweep's overrides, its fraction
    assert calls[0][0][-1] == "solver=sklearn" and calls[0][1] == "sparse_0.70.eval.log"
    assert [f for f in failures if "sparse_0.90" in f] and not [
        f for f in failures if "sparse_1.00" in f
    ]


def test_parallel_jobs_run_every_planned_step(
    reproduce, runs_dir, monkeypatch, tmp_path, caplog, capsys
):
    caplog.set_level(logging.INFO, logger="reproduce")
    (tmp_path / "eval_linear.py").write_text("")
    monkeypatch.setattr(reproduce, "EVAL_SCRIPT", tmp_path / "eval_linear.py")
    calls = []
    monkeypatch.setattr(
        reproduce, "_run_logged", lambda command, log_path: calls.append(log_path.name) or 0
    )
    assert reproduce.execute(reproduce.plan(runs_dir, [0.0, 0.4, 0.6, 0.9]), [], [], jobs=3) == []
    # off a terminal, a plain line per finished run instead of a bar
    assert [m for m in caplog.messages if m.startswith("runs: ")][-1].startswith(
        "runs: 4/4 runs done (100%)"
    )
    assert "\r" not in capsys.readouterr().err
    assert sorted(calls) == [
        "sparse_0.40.eval.log",
        "sparse_0.60.eval.log",
        "sparse_0.60.train.log",
        "sparse_0.90.eval.log",
        "sparse_0.90.train.log",
    ]
    with pytest.raises(SystemExit):
        reproduce.parse_args(["--jobs", "0"])
    with pytest.raises(SystemExit):
        reproduce.parse_args(["--parallel", "0"])
    assert reproduce.parse_args(["--parallel", "4"]).jobs == 4


def test_without_eval_script_runs_are_trained_and_the_gap_reported(
    reproduce, runs_dir, monkeypatch, tmp_path
):
    calls = []
    monkeypatch.setattr(reproduce, "EVAL_SCRIPT", tmp_path / "absent_eval_linear.py")
    monkeypatch.setattr(
        reproduce, "_run_logged", lambda command, log_path: calls.append(command) or 0
    )
    failures = reproduce.execute(reproduce.plan(runs_dir, [0.4, 0.9]), [], [])
    assert [os.path.basename(c[1]) for c in calls] == ["train.py"]
    assert any("absent_eval_linear.py not found" in f for f in failures)


def test_dry_run_runs_nothing(reproduce, runs_dir, monkeypatch, capsys):
    monkeypatch.setattr(
        reproduce, "_run_logged", lambda *a: pytest.fail("dry run started a process")
    )
    assert reproduce.main(["--runs-dir", str(runs_dir), "--fractions", "0,0.6", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "sparse_0.00: complete -> nothing to do" in printed
    assert "sparse_0.60: missing (no run directory) -> train, evaluate" in printed


def test_extra_seeds_and_baselines_are_planned(reproduce, tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "sparse_0.70_seed1", 0.7, seed=1)  # the extra seed of 70%: done
    plan = reproduce.plan(
        runs, [0.0, 0.7, 1.0], extra_seeds=[1], extra_seed_fractions=[0.0, 0.7], baselines=True
    )
    assert [(p.run_dir.name, p.seed) for p in plan] == [
        ("sparse_0.00", None),
        ("sparse_0.70", None),
        ("sparse_1.00", None),
        ("sparse_0.00_seed1", 1),
        ("sparse_0.70_seed1", 1),
    ]
    assert plan[0].baselines == ["random", "pixels"]  # on the dense run of the config's seed only
    assert [p.baselines for p in plan[1:]] == [[]] * 4
    assert (plan[4].train, plan[4].evaluate) == (False, False)
    # a baseline already evaluated is not planned again
    make_run(runs, "sparse_0.00", 0.0, baselines={"eval_linear_pixels.json": eval_result(40.0)})
    assert reproduce.plan(runs, [0.0], baselines=True)[0].baselines == ["random"]


def test_execute_passes_config_seed_and_baselines(reproduce, tmp_path, monkeypatch):
    (tmp_path / "eval_linear.py").write_text("")
    monkeypatch.setattr(reproduce, "EVAL_SCRIPT", tmp_path / "eval_linear.py")
    calls = []
    monkeypatch.setattr(
        reproduce,
        "_run_logged",
        lambda command, log_path: calls.append((command, log_path.name)) or 0,
    )
    plan = reproduce.plan(
        tmp_path / "runs", [0.0], extra_seeds=[1], extra_seed_fractions=[0.0], baselines=True
    )
    config = tmp_path / "cifar10.yaml"
    config.write_text(
        "student:\n  arch: vit_small\n"
    )  # read for each run's switch keys (configs/sweep.py)
    assert (
        reproduce.execute(plan, ["data.root=/data/cifar10"], ["solver=torch"], config=config) == []
    )
    logs = [name for _, name in calls]
    assert logs == [
        "sparse_0.00.train.log",
        "sparse_0.00.eval.log",
        "sparse_0.00.eval_random.log",
        "sparse_0.00.eval_pixels.log",
        "sparse_0.00_seed1.train.log",
        "sparse_0.00_seed1.eval.log",
    ]
    train = calls[0][0]
    assert train[2:6] == [
        "--output-dir",
        str(tmp_path / "runs" / "sparse_0.00"),
        "--config",
        str(config),
    ]
    assert (
        "train.seed=1" not in train and calls[4][0][-1] == "train.seed=1"
    )  # the extra seed's override wins
    assert (
        calls[2][0][-2:] == ["solver=torch", "checkpoint=random"]
        and calls[3][0][-1] == "checkpoint=pixels"
    )


def test_dry_run_of_the_cifar_sweep(reproduce, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        reproduce, "_run_logged", lambda *a: pytest.fail("dry run started a process")
    )
    config = tmp_path / "cifar10.yaml"
    config.write_text("student:\n  arch: vit_small\n")
    runs = tmp_path / "runs"
    argv = [
        "--dry-run",
        "--config",
        str(config),
        "--runs-dir",
        str(runs),
        "--parallel",
        "4",
        "--extra-seeds",
        "1",
        "--extra-seed-fractions",
        "0,0.7",
        "data.root=/data/cifar10",
    ]  # the overrides last, as documented
    assert reproduce.main(argv) == 0
    printed = capsys.readouterr().out
    names = [line.split(":")[0] for line in printed.splitlines() if line.startswith(str(runs))]
    assert [os.path.basename(n) for n in names] == [
        "sparse_0.00",
        "sparse_0.40",
        "sparse_0.60",
        "sparse_0.70",
        "sparse_0.80",
        "sparse_0.90",
        "sparse_1.00",
        "sparse_0.00_seed1",
        "sparse_0.70_seed1",
    ]
    assert (
        "sparse_0.00: missing (no run directory) -> train, evaluate, baseline random, baseline "
        "pixels" in printed
    )
    assert (
        f"--config {config} data.root=/data/cifar10 sparsity.sparse_fraction=0.7 train.seed=1"
        in printed
    )
    assert "checkpoint=pixels" in printed and "9 runs, 4 at a time" in printed
    assert not runs.exists()  # nothing written


def test_defaults_follow_the_config_and_a_bad_override_stops_early(reproduce, capsys):
    args = reproduce.parse_args(["--config", "configs/cifar10.yaml"])
    assert (args.runs_dir, args.out) == (Path("runs/cifar10"), Path("runs/cifar10/table"))
    args = reproduce.parse_args([])
    assert (args.runs_dir, args.out) == (
        Path("runs/default"),
        Path("runs/default/table"),
    )  # never results/ by default
    assert reproduce.parse_args(["--runs-dir", "elsewhere"]).out == Path("elsewhere/table")
    assert reproduce.parse_args(["--out", "results/default"]).out == Path("results/default")
    assert reproduce.main(["--dry-run", "train.batchsize=3"]) == 2
    assert "unknown config key 'train.batchsize'" in capsys.readouterr().err
    assert reproduce.main(["--dry-run", "--extra-seeds", "0"]) == 2
    assert "--extra-seeds 0 is the config's own train.seed" in capsys.readouterr().err
    assert reproduce.parse_args(
        ["--extra-seeds", "1,2", "--extra-seed-fractions", "0.7"]
    ).extra_seeds == [1, 2]
    for bad in (["--extra-seeds", "-1"], ["--extra-seeds", "a"], ["--extra-seed-fractions", "2"]):
        with pytest.raises(SystemExit):
            reproduce.parse_args(bad)


def test_a_switch_key_goes_only_to_the_runs_that_switch(reproduce, tmp_path, monkeypatch, capsys):
    """teacher.momentum_restart_at_switch=true over the seven schedules: the dense and 100% runs
    have no switch and would refuse it, so their commands turn it off again (last, so it wins) and
    the plan says so."""
    monkeypatch.setattr(
        reproduce, "_run_logged", lambda *a: pytest.fail("dry run started a process")
    )
    runs = tmp_path / "runs"
    argv = [
        "--dry-run",
        "--runs-dir",
        str(runs),
        "--fractions",
        "0,0.7,1",
        "teacher.momentum_restart_at_switch=true",
    ]
    assert reproduce.main(argv) == 0
    printed = capsys.readouterr().out
    commands = {
        line.split("--output-dir ")[1].split()[0]: line
        for line in printed.splitlines()
        if "train.py" in line
    }
    restart = "teacher.momentum_restart_at_switch"
    assert commands[str(runs / "sparse_0.70")].endswith(
        f"{restart}=true sparsity.sparse_fraction=0.7"
    )
    for name, fraction in (("sparse_0.00", "0.0"), ("sparse_1.00", "1.0")):
        expected_end = f"{restart}=true sparsity.sparse_fraction={fraction} {restart}=false"
        assert commands[str(runs / name)].endswith(expected_end)
    assert f"note: {restart}=true left out: 0% sparse has no switch" in printed
    assert f"note: {restart}=true left out: 100% sparse has no switch" in printed
    assert printed.count("note:") == 2
    # the sweep's fractions are its own: an override of the fraction is refused before anything runs
    assert (
        reproduce.main(["--dry-run", "--runs-dir", str(runs), "sparsity.sparse_fraction=0.5"]) == 2
    )
    assert "sparsity.sparse_fraction is set per run by --fractions" in capsys.readouterr().err


def test_a_quick_probe_is_planned_by_its_own_records_and_its_baselines_named_for_its_protocol(
    reproduce, runs_dir
):
    """--eval settings of another protocol write records named for it: the plan looks for those, not
    for the default probe's eval_linear.json (which would have the quick probe skipped, or rerun
    every time)."""
    quick = load_eval_config(None, ["linear.n_c=3", "device=cpu"])
    label = "protocol_" + hashlib.sha256(b"linear.n_c=3").hexdigest()[:8]
    assert reproduce.baseline_files(quick) == {
        "random": f"eval_linear_random_init_{label}.json",
        "pixels": f"eval_linear_pixels_{label}.json",
    }
    (dense,) = reproduce.plan(runs_dir, [0.0], baselines=True, probe=quick)
    assert dense.evaluate and dense.baselines == [
        "random",
        "pixels",
    ]  # only the default probe's records exist
    record = json.loads((dense.run_dir / "eval_linear.json").read_text())
    record["eval_config"] = to_yaml(quick)
    (dense.run_dir / f"eval_linear_{label}.json").write_text(json.dumps(record))
    (dense,) = reproduce.plan(runs_dir, [0.0], probe=quick)
    assert not dense.evaluate
