"""The zygote that most train.py tests start their runs from (`train_zygote.py`) against fresh
interpreters: the same losses step for step, the same exit codes and messages, its own process group
on request, -N for a signal."""

import json
import os
import signal

from train_runs import run_train, start_train, wait_for_step


def losses(run):
    return [
        (r["step"], r["loss"])
        for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if "loss" in r
    ]


def test_a_forked_run_trains_as_a_fresh_interpreter_does(tmp_path):
    forked = run_train(tmp_path / "forked", "train.max_steps=3")
    fresh = run_train(tmp_path / "fresh", "train.max_steps=3", fresh=True)
    assert forked.returncode == fresh.returncode == 0
    assert (
        losses(tmp_path / "forked") == losses(tmp_path / "fresh")
        and len(losses(tmp_path / "fresh")) == 3
    )
    closing = [
        r.stderr.strip().splitlines()[-1].split(" INFO ", 1)[1].replace(f"/{name}", "/RUN")
        for r, name in ((forked, "forked"), (fresh, "fresh"))
    ]
    assert closing[0] == closing[1] and "next: rerun the same command" in closing[1]


def test_a_refused_run_exits_with_the_same_code_and_message(tmp_path):
    forked = run_train(tmp_path / "a", "train.max_stepz=3", check=False)
    fresh = run_train(tmp_path / "b", "train.max_stepz=3", check=False, fresh=True)
    assert forked.returncode == fresh.returncode == 2
    assert forked.stderr.strip().splitlines()[-1] == fresh.stderr.strip().splitlines()[-1]
    assert "train.max_stepz" in fresh.stderr


def test_a_forked_run_has_its_own_session_and_reports_a_kill_as_a_signal(tmp_path):
    run = start_train(tmp_path / "r", "train.max_steps=400", new_session=True)
    wait_for_step(tmp_path / "r" / "metrics.jsonl", 1, run)
    assert os.getpgid(run.pid) == run.pid != os.getpgid(0)
    os.killpg(run.pid, signal.SIGKILL)
    assert run.wait(timeout=60) == -signal.SIGKILL
