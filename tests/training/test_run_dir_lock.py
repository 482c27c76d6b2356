"""One trainer per run directory: a second train.py on a directory in use exits 1 saying so and
writes nothing there (two trainers would remove each other's checkpoint temporaries and interleave
metrics), the first finishes as if alone; a killed holder leaves no stale lock; a file system
without flock gives a warning, not a failure."""

import errno
import json
import signal

import pytest
from run_lock_holder import hold_lock
from train_runs import run_train, start_train, wait_for_step

import rundir.lock as run_lock
from rundir.errors import RunDirInUse
from rundir.lock import lock
from rundir.metrics import read_metrics
from rundir.status import RUNNING, write_status


def test_a_second_lock_is_refused_until_the_first_is_released(tmp_path):
    first = lock(tmp_path)
    assert first.held and (tmp_path / ".lock").exists()
    write_status(tmp_path, RUNNING, 12)
    with pytest.raises(
        RunDirInUse,
        match=r"in use by another process \(a trainer or an evaluation\) "
        r"\(its status.json: running at step 12",
    ):
        lock(tmp_path)
    first.release()
    again = lock(tmp_path)
    assert again.held
    again.release()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    holder = hold_lock(tmp_path)  # returns once the other process holds the lock
    try:
        with pytest.raises(RunDirInUse, match="choose another --output-dir"):
            lock(tmp_path)
    finally:
        holder.send_signal(
            signal.SIGKILL
        )  # nothing runs at exit: only the kernel can drop the lock
        holder.wait()
    after = lock(tmp_path)
    assert after.held
    after.release()


def test_a_file_system_without_flock_is_not_a_failure(tmp_path, monkeypatch):
    def no_flock(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(run_lock.fcntl, "flock", no_flock)
    unlocked = lock(tmp_path)
    assert not unlocked.held and "Function not implemented" in unlocked.unsupported


def test_a_second_trainer_on_a_run_in_progress_exits_1_and_the_first_finishes(tmp_path):
    run = tmp_path / "run"
    first = start_train(run)
    try:
        wait_for_step(run / "metrics.jsonl", 4, first)
        first.send_signal(
            signal.SIGSTOP
        )  # held mid-run (the lock with it) while the second one tries
        before = {p: p.stat().st_mtime_ns for p in (run / "checkpoints").iterdir()}
        try:
            second = run_train(run, check=False)
        finally:
            first.send_signal(signal.SIGCONT)
        assert second.returncode == 1, second.stderr[-3000:]
        assert "is in use by another process" in second.stderr
        assert "Traceback" not in second.stderr
        # nothing written by the second: the first's checkpoint untouched, one start in the log
        # (below)
        assert before and {p: p.stat().st_mtime_ns for p in before} == before
        assert first.wait(timeout=600) == 0, first.stderr.read()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    log = (run / "log.txt").read_text()
    assert log.count("starting at step 0") == 1 and "resuming" not in log and "in use" not in log
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == list(range(1, 17))
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
