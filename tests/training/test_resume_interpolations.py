"""The same-config rule compares resolved values. `optim.base_lr=${oc.env:LR}` with LR changed
between two starts of a run is refused naming the key and both values, before anything is written;
the same LR resumes. config.yaml holds the resolved value, so nothing later depends on the
environment."""

import pytest
from train_runs import run_train

pytestmark = (
    pytest.mark.slow
)  # trains for tens of seconds per test on 2 cores: outside the fast lane


def test_an_interpolated_lr_that_changed_between_starts_is_refused(tmp_path, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setenv("LR", "0.004")
    run_train(run, "optim.base_lr=${oc.env:LR}", "train.max_steps=3")
    config_before = (run / "config.yaml").read_text()
    assert "base_lr: 0.004" in config_before and "oc.env:LR" not in config_before
    files_before = {
        p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name != ".lock"
    }

    monkeypatch.setenv("LR", "0.4")
    result = run_train(run, "optim.base_lr=${oc.env:LR}", "train.max_steps=4", check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "trained with another config (optim.base_lr: 0.004 -> 0.4)" in result.stderr
    assert (run / "config.yaml").read_text() == config_before
    # log.txt records the refusal; nothing else of the run was rewritten
    after = {
        p: p.stat().st_mtime_ns
        for p in run.rglob("*")
        if p.is_file() and p.name not in (".lock", "log.txt")
    }
    assert after == {p: t for p, t in files_before.items() if p.name != "log.txt"}

    monkeypatch.setenv("LR", "0.004")
    run_train(run, "optim.base_lr=${oc.env:LR}", "train.max_steps=4")
    assert '"step": 4' in (run / "metrics.jsonl").read_text()
