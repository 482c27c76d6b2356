"""scripts/reproduce.py without training anything: what it plans, what it skips, the commands it would run."""

import importlib.util
import os

import pytest

from reporting_runs import REPO, make_run


@pytest.fixture(scope="module")
def reproduce():
    spec = importlib.util.spec_from_file_location("reproduce_script", REPO / "scripts" / "reproduce.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def runs_dir(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "sparse000", 0.0)  # trained and evaluated: nothing to do
    stale = make_run(runs, "sparse070", 0.7)  # evaluated before its teacher was re-exported: evaluate again
    os.utime(stale / "eval_linear.json", (1_000_000, 1_000_000))
    make_run(runs, "sparse040", 0.4, result=None)  # trained, never evaluated
    make_run(runs, "sparse090", 0.9, steps_done=100, finished=False, result=None)  # interrupted: resume
    make_run(runs, "sparse100", 1.0, steps_done=20, finished=False, result=None,
             log_tail="ERROR train: TrainingDiverged: non-finite loss at step 21")  # failed: retried
    return runs


def test_plan_skips_finished_work(reproduce, runs_dir):
    plan = {p.run_dir.name: p for p in reproduce.plan(runs_dir, [0.0, 0.4, 0.6, 0.7, 0.9, 1.0])}
    assert (plan["sparse000"].train, plan["sparse000"].evaluate) == (False, False)
    assert (plan["sparse040"].train, plan["sparse040"].evaluate) == (False, True)
    assert (plan["sparse060"].train, plan["sparse060"].evaluate) == (True, True)  # no directory yet
    assert (plan["sparse070"].train, plan["sparse070"].evaluate) == (False, True)
    assert (plan["sparse090"].train, plan["sparse090"].evaluate) == (True, True)
    assert plan["sparse100"].train and plan["sparse100"].state.startswith("failed")
    assert plan["sparse060"].fraction == 0.6


def test_run_names_and_fraction_parsing(reproduce):
    assert [reproduce.run_name(f) for f in reproduce.PUBLISHED_FRACTIONS] == [
        "sparse000", "sparse040", "sparse060", "sparse070", "sparse080", "sparse090", "sparse100"]
    assert reproduce.run_name(0.32) == "sparse032" and reproduce.run_name(0.325) == "sparse0.325"
    assert reproduce.parse_fractions("0, 0.5,1") == [0.0, 0.5, 1.0]
    for bad in ("1.5", "a,b", ""):
        with pytest.raises(Exception, match="--fractions"):
            reproduce.parse_fractions(bad)


def test_execute_runs_what_is_planned_and_continues_after_a_failure(reproduce, runs_dir, monkeypatch, tmp_path):
    calls = []
    (tmp_path / "eval_linear.py").write_text("")
    monkeypatch.setattr(reproduce, "EVAL_SCRIPT", tmp_path / "eval_linear.py")

    def fake_run(command, log_path):
        calls.append((command, log_path.name))
        script = os.path.basename(command[1])
        return 1 if script == "train.py" and "sparse090" in command[3] else 0

    monkeypatch.setattr(reproduce, "_run_logged", fake_run)
    plan = reproduce.plan(runs_dir, [0.0, 0.7, 0.9, 1.0])
    failures = reproduce.execute(plan, ["train.num_workers=0"], ["solver=sklearn"])
    names = [(os.path.basename(c[1]), c[3]) for c, _ in calls]
    assert names == [
        ("eval_linear.py", str(runs_dir / "sparse070")),
        ("train.py", str(runs_dir / "sparse090")),  # fails: its evaluation is skipped, the next run still goes
        ("train.py", str(runs_dir / "sparse100")),
        ("eval_linear.py", str(runs_dir / "sparse100")),
    ]
    train = calls[1][0]
    assert "sparsity.sparse_fraction=0.9" in train and train[-1] == "train.num_workers=0"
    assert calls[0][0][-1] == "solver=sklearn" and calls[0][1] == "sparse070.eval.log"
    assert [f for f in failures if "sparse090" in f] and not [f for f in failures if "sparse100" in f]


def test_without_eval_script_runs_are_trained_and_the_gap_reported(reproduce, runs_dir, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(reproduce, "EVAL_SCRIPT", tmp_path / "absent_eval_linear.py")
    monkeypatch.setattr(reproduce, "_run_logged", lambda command, log_path: calls.append(command) or 0)
    failures = reproduce.execute(reproduce.plan(runs_dir, [0.4, 0.9]), [], [])
    assert [os.path.basename(c[1]) for c in calls] == ["train.py"]
    assert any("absent_eval_linear.py not found" in f for f in failures)


def test_dry_run_runs_nothing(reproduce, runs_dir, monkeypatch, capsys):
    monkeypatch.setattr(reproduce, "_run_logged", lambda *a: pytest.fail("dry run started a process"))
    assert reproduce.main(["--runs-dir", str(runs_dir), "--fractions", "0,0.6", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "sparse000: complete -> nothing to do" in printed
    assert "sparse060: missing (no run directory) -> train, evaluate" in printed
