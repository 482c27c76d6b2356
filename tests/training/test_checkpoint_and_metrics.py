"""Checkpoint files survive kills mid-save; metrics truncation on resume."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from rundir.checkpoints import CheckpointManager
from rundir.guard import remove_stray_temporaries
from rundir.metrics import MetricsLog, read_metrics, without_timing
from rundir.torch_files import save_verified


def test_history_is_bounded_and_latest_loads(tmp_path):
    manager = CheckpointManager(tmp_path, max_to_keep=2)
    for step in (10, 20, 30):
        manager.save({"step": step, "w": torch.full((3,), float(step))}, step)
    assert [p.name for p in manager.checkpoints()] == ["step_00000020.pt", "step_00000030.pt"]
    assert manager.load_latest()["step"] == 30


def test_unreadable_newest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
    manager = CheckpointManager(tmp_path, max_to_keep=3)
    manager.save({"step": 1}, 1)
    manager.path_for(2).write_bytes(b"\x00garbage, e.g. a disk that filled up")
    assert manager.load_latest()["step"] == 1
    assert "cannot use checkpoint" in caplog.text
    assert (
        manager.path_for(2).with_name("step_00000002.pt.corrupt").exists()
    )  # reported, set aside, never deleted
    assert [p.name for p in manager.checkpoints()] == ["step_00000001.pt"]


def test_kill_during_save_leaves_previous_checkpoint_intact(tmp_path):
    """SIGKILL a process while it writes a large checkpoint: the old one must still load, the stray
    .tmp goes."""
    manager = CheckpointManager(tmp_path, max_to_keep=3)
    manager.save({"step": 1, "w": torch.ones(4)}, 1)
    script = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {os.getcwd()!r})
        from rundir.torch_files import save_verified
        print("start", flush=True)
        save_verified({{"step": 2, "w": torch.randn(64, 1024, 1024)}},
                      __import__("pathlib").Path({str(manager.path_for(2))!r}))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"start"
    # wait until the write is under way (step_00000002.pt.<pid>.<random>.tmp), then kill it
    for _ in range(2000):
        tmp = next(iter(tmp_path.glob("step_00000002.pt.*.tmp")), None)
        if tmp is not None and tmp.stat().st_size > 0:
            break
        subprocess.run(["sleep", "0.005"])
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not manager.path_for(2).exists() and tmp is not None and tmp.exists()
    state = manager.load_latest()
    assert state["step"] == 1 and torch.equal(state["w"], torch.ones(4))
    # the stray goes when the next lock holder cleans the run directory (tmp_path moved to be a
    # run's checkpoints)
    run = tmp_path.parent / f"{tmp_path.name}-run"
    run.mkdir()
    tmp_path.rename(run / "checkpoints")
    assert [p.name for p in remove_stray_temporaries(run)] == [tmp.name]
    assert not list((run / "checkpoints").glob("*.tmp"))


def test_verified_save_loads_with_plain_torch_load_weights_only(tmp_path):
    save_verified(
        {"a": torch.arange(3), "b": {"c": 1.5}}, tmp_path / "x.pt"
    )  # users load exports this way
    loaded = torch.load(tmp_path / "x.pt", weights_only=True)
    assert torch.equal(loaded["a"], torch.arange(3)) and loaded["b"] == {"c": 1.5}


def test_metrics_truncation_drops_steps_the_resumed_run_repeats(tmp_path):
    log = MetricsLog(tmp_path / "m.jsonl")
    for step in range(6):
        log.write(
            {"step": step, "loss": torch.tensor(1.0 / (step + 1)), "images_per_s": 100.0 + step}
        )
    with open(tmp_path / "m.jsonl", "a") as f:
        f.write('{"step": 6, "lo')  # a line cut by a kill
    log.truncate_after(4)
    assert [r["step"] for r in read_metrics(tmp_path / "m.jsonl")] == [0, 1, 2, 3]
    assert without_timing(read_metrics(tmp_path / "m.jsonl"))[1] == {"step": 1, "loss": 0.5}


def test_non_finite_values_stay_valid_json(tmp_path):
    log = MetricsLog(tmp_path / "m.jsonl")
    log.write({"step": 0, "loss": float("nan")})
    assert json.loads((tmp_path / "m.jsonl").read_text())["loss"] == "nan"


def test_fresh_start_in_a_used_directory_replaces_the_old_metrics(tmp_path):
    """A run restarted with no checkpoint to resume from (killed before its first save) logs from
    step 0 again: the earlier attempt's lines must not stay in front of the new ones."""
    from train_runs import run_train

    stale = [{"step": s, "loss": 99.0, "stale": True} for s in range(3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stale))
    run_train(tmp_path, "train.max_steps=2")
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records and not any(r.get("stale") for r in records)
    assert [r["step"] for r in records] == sorted({r["step"] for r in records})


def test_rotation_never_deletes_the_checkpoint_it_just_wrote(tmp_path):
    """An unreadable newer checkpoint used to sort as the newest and make the rotation delete each
    new one."""
    manager = CheckpointManager(tmp_path, max_to_keep=2)
    manager.save({"step": 3}, 3)
    manager.path_for(9).write_bytes(
        b"damaged"
    )  # newer than anything the resumed run will write next
    assert manager.load_latest()["step"] == 3  # the damaged one is set aside
    for step in (4, 5, 6):
        manager.save({"step": step}, step)
        assert manager.path_for(step).exists()
    assert [p.name for p in manager.checkpoints()] == ["step_00000005.pt", "step_00000006.pt"]
    rotated = CheckpointManager(tmp_path / "b", max_to_keep=1)
    rotated.save({"step": 1}, 1)
    (tmp_path / "b" / "step_00000007.pt").write_bytes(b"a newer file the rotation must not prefer")
    rotated.save({"step": 2}, 2)
    assert rotated.path_for(2).exists() and not rotated.path_for(1).exists()
    assert (
        tmp_path / "b" / "step_00000007.pt"
    ).exists()  # not the rotation's to judge: resume sets it aside


def test_a_cpu_metrics_line_records_no_gpu_memory():
    from training.run_records import metrics_line

    line = metrics_line(
        10,
        "dense",
        1.5,
        {"lr": 1e-3},
        corrupt_skipped=0,
        images_per_s=12.5,
        device=torch.device("cpu"),
    )
    assert "gpu_mem_outside_mb" not in line and line["images_per_s"] == 12.5 and line["lr"] == 1e-3


def test_a_digest_with_a_flipped_byte_is_a_corrupt_checkpoint(tmp_path):
    """Bit rot in a `.sha256` file (a byte turned 0xff, no longer UTF-8) is what digests exist for:
    the checkpoint is set aside as corrupt and the previous one resumed, as for a damaged
    checkpoint, never a UnicodeDecodeError."""
    from rundir.digests import CorruptFile, digest_path, verify

    manager = CheckpointManager(tmp_path, max_to_keep=3)
    for step in (1, 2):
        manager.save({"step": step}, step)
    side = digest_path(manager.path_for(2))
    damaged = bytearray(side.read_bytes())
    damaged[5] = 0xFF
    side.write_bytes(bytes(damaged))
    with pytest.raises(CorruptFile, match="unreadable recorded SHA-256"):
        verify(manager.path_for(2))
    assert manager.load_latest()["step"] == 1
    assert manager.path_for(2).with_name("step_00000002.pt.corrupt").exists()
