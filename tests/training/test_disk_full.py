"""A full disk during training: one clear line (no traceback), status.json says `failed` and why
(rewritten in place when no temporary file fits), the last checkpoint whole and no temporary file
left, and the same command resumes from that checkpoint once there is space."""

import errno
import json
import logging
import os

import pytest
from train_runs import TINY, run_train

import rundir.atomic as atomic_io
import rundir.torch_files as safe_io
from rundir.digests import verify


def disk_full(path=None):
    return OSError(
        errno.ENOSPC, os.strerror(errno.ENOSPC), *([str(path)] if path is not None else [])
    )


@pytest.fixture
def one_process(monkeypatch):
    import train

    for key in [
        k for k in os.environ if k.startswith("SLURM_") or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    ]:
        monkeypatch.delenv(key)
    monkeypatch.setattr(
        train, "setup_logging", lambda output_dir, is_main: None
    )  # leave this process's logging
    return train


@pytest.mark.parametrize("where", ["torch.save", "temporary file"])
def test_a_full_disk_is_a_clear_error_and_the_run_resumes(
    tmp_path, monkeypatch, caplog, one_process, where
):
    """`torch.save`: the disk fills while the second checkpoint (step 6) is written, so torch's own
    write fails (which torch reports as "file write failed"); `temporary file`: not even the next
    checkpoint's temporary file can be created. From then on no new file fits, status.json's
    included."""
    run = tmp_path / "run"
    state = {"saves": 0, "full": False}
    real_write, real_create = safe_io._HashingWriter.write, atomic_io.create_exclusively

    def write(self, b):
        if state["full"]:
            raise disk_full()
        return real_write(self, b)

    def create(path):
        if (
            path.name.startswith("step_")
            and path.name.endswith(".tmp")
            and ".sha256" not in path.name
        ):
            state["saves"] += 1
            if state["saves"] == 2:
                state["full"] = True
                if where == "temporary file":
                    raise disk_full(path)
                return real_create(path)
        if state["full"]:
            raise disk_full(path)
        return real_create(path)

    monkeypatch.setattr(safe_io._HashingWriter, "write", write)
    monkeypatch.setattr(atomic_io, "create_exclusively", create)
    with caplog.at_level(logging.INFO):
        assert one_process.main(["--output-dir", str(run), *TINY]) == 1
    assert state["full"], "the disk never filled: the test did not test anything"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith(f"no space left on the device of {run}"), (
        errors
    )
    assert "rerun the same command" in errors[0] and "Traceback" not in caplog.text
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed" and "No space left on device" in status["reason"], status
    assert status["step"] == 6
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert checkpoints == ["step_00000003.pt", "step_00000003.pt.sha256"], (
        checkpoints
    )  # whole, nothing half-written
    assert verify(run / "checkpoints" / "step_00000003.pt")
    assert not list(run.rglob("*.tmp"))

    if where != "torch.save":
        return
    monkeypatch.undo()  # space again: the same command resumes from step 3 and finishes
    result = run_train(run)
    assert "resumed at step 3" in result.stderr
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
