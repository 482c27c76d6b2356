"""train.py against a hostile run directory, end to end: a second command on a directory in use (a
finished run with nothing to do, `train.resume=false`) refuses and changes nothing; `checkpoints`
entries that are not a usable directory and a checkpoint without its digest are refusals that keep
metrics.jsonl; symlinks planted in the run are never written through; a run directory given through
a symlink is resolved once."""

import os
import signal

import pytest
from run_lock_holder import hold_lock
from train_runs import run_train, start_train, wait_for_step

from rundir.metrics import read_metrics

pytestmark = (
    pytest.mark.slow
)  # trains for tens of seconds per test on 2 cores: outside the fast lane

PRECIOUS = "a file outside the run, which no run may change\n"


def assert_refused(result, code, *words):
    assert result.returncode == code, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    for word in words:
        assert word in result.stderr, result.stderr[-3000:]


def test_a_finished_run_and_resume_false_still_refuse_a_directory_in_use(tmp_path):
    """The issue's case: while another process holds the directory (a run saving step 8, its
    temporary file on disk), `train.py ... train.max_steps=2` on it exited 0 after removing that
    file. Now it refuses and leaves it; so does `train.resume=false`; two `train.resume=false` runs
    never write at once."""
    run = tmp_path / "run"
    run_train(run, "train.max_steps=3")
    metrics = (run / "metrics.jsonl").read_text()
    ckpts = run / "checkpoints"
    live = [ckpts / "step_00000008.pt.4242.0123456789ab.tmp", ckpts / "step_00000008.pt.tmp"]
    for p in live:
        p.write_bytes(b"the other process is writing this")
    holder = hold_lock(run)
    try:
        for overrides in (["train.max_steps=2"], ["train.max_steps=3"], ["train.resume=false"]):
            result = run_train(run, *overrides, check=False)
            assert_refused(result, 1, "is in use by another process")
            assert all(p.read_bytes() == b"the other process is writing this" for p in live), (
                overrides
            )
            assert (run / "metrics.jsonl").read_text() == metrics
    finally:
        holder.kill()
        holder.wait()
    # no holder now: the next lock holder removes the dead writer's strays (and only the trainer's
    # files)
    foreign = run / "eval_linear.json.999.0123456789ab.tmp"
    foreign.write_text("an evaluation's")
    first = start_train(run, "train.resume=false", "train.max_steps=5")
    try:
        wait_for_step(run / "metrics.jsonl", 4, first)  # (steps 1-3 are the old run's lines)
        first.send_signal(signal.SIGSTOP)
        try:
            second = run_train(run, "train.resume=false", "train.max_steps=2", check=False)
        finally:
            first.send_signal(signal.SIGCONT)
        assert_refused(second, 1, "is in use by another process")
        assert first.wait(timeout=600) == 0, first.stderr.read()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [
        1,
        2,
        3,
        4,
        5,
    ]  # one writer's lines
    assert not any(p.exists() for p in live) and foreign.read_text() == "an evaluation's"


def test_checkpoints_that_are_not_a_usable_directory_or_lack_a_digest_keep_the_metrics(tmp_path):
    run = tmp_path / "run"
    run_train(run, "train.max_steps=3")
    metrics = (run / "metrics.jsonl").read_text()
    ckpts = run / "checkpoints"
    # the digest of the newest checkpoint is missing: refused, nothing set aside, nothing rewritten
    digest = ckpts / "step_00000003.pt.sha256"
    saved = digest.read_bytes()
    digest.unlink()
    result = run_train(run, "train.max_steps=4", check=False)
    assert_refused(result, 1, "MissingDigest", str(digest))
    assert (run / "metrics.jsonl").read_text() == metrics and not list(ckpts.glob("*.corrupt"))
    digest.write_bytes(saved)
    # the checkpoints moved to another disk: a dangling link, a file in the way, an empty mount
    # point: refused
    moved = tmp_path / "disk2" / "checkpoints"
    moved.parent.mkdir()
    ckpts.rename(moved)
    ckpts.symlink_to(tmp_path / "unmounted" / "checkpoints")
    assert_refused(run_train(run, "train.max_steps=4", check=False), 1, str(ckpts), "leads nowhere")
    ckpts.unlink()
    ckpts.write_text("not a directory")
    assert_refused(
        run_train(run, "train.resume=false", check=False), 1, str(ckpts), "is not a directory"
    )
    ckpts.unlink()
    ckpts.mkdir()
    assert_refused(
        run_train(run, "train.max_steps=4", check=False), 1, "records step 3", "holds no checkpoint"
    )
    assert (run / "metrics.jsonl").read_text() == metrics
    # a link to the directory that holds them is followed: the run goes on from step 3
    ckpts.rmdir()
    ckpts.symlink_to(moved)
    result = run_train(run, "train.max_steps=4")
    assert "resumed at step 3" in result.stderr
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3, 4]
    assert (moved / "step_00000004.pt").exists() and ckpts.is_symlink()


def test_symlinks_planted_in_the_run_directory_are_never_written_through(tmp_path):
    run = tmp_path / "run"
    (run / "eval" / "step_00000002").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = {
        "status.json.tmp": "a",
        "config.yaml.tmp": "b",
        "status.json": "c",
        "run_info.json": "d",
        "eval/step_00000002/teacher_backbone.pth.tmp": "e",
        "eval/step_00000002/teacher_backbone.pth": "f",
    }
    for name, target in planted.items():
        (outside / target).write_text(PRECIOUS)
        (run / name).symlink_to(outside / target)
    run_train(run, "train.max_steps=3", "train.teacher_export_period=2")
    assert all((outside / t).read_text() == PRECIOUS for t in planted.values())
    assert sorted(p.name for p in outside.iterdir()) == sorted(
        planted.values()
    )  # nothing created there either
    for name in ("status.json", "run_info.json", "eval/step_00000002/teacher_backbone.pth"):
        assert (run / name).is_file() and not (run / name).is_symlink()
    assert (
        not (run / "status.json.tmp").exists() and not (run / "config.yaml.tmp").is_symlink()
    )  # cleaned
    # links where the run appends, and the lock file: refused with the path, the target untouched
    for name in ("metrics.jsonl", "log.txt", ".lock"):
        target = outside / f"for_{name}"
        target.write_text(PRECIOUS)
        moved = run / f"{name}.saved"
        if (run / name).exists():
            (run / name).rename(moved)
        (run / name).symlink_to(target)
        assert_refused(run_train(run, "train.max_steps=4", check=False), 1, str(run / name))
        assert (
            target.read_text() == PRECIOUS
            and '"state": "finished"' in (run / "status.json").read_text()
        )
        (run / name).unlink()
        if moved.exists():
            moved.rename(run / name)


def test_a_run_directory_through_a_symlink_is_resolved_once(tmp_path):
    real, other = tmp_path / "real", tmp_path / "other"
    real.mkdir()
    other.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    proc = start_train(link, "train.max_steps=5")
    try:
        wait_for_step(real / "metrics.jsonl", 1, proc)
        proc.send_signal(signal.SIGSTOP)
        try:
            link.unlink()
            link.symlink_to(other)  # re-pointed mid-run: the run keeps writing where it started
            # the same directory under its real name is in use
            assert_refused(run_train(real, check=False), 1, "is in use by another process")
        finally:
            proc.send_signal(signal.SIGCONT)
        assert proc.wait(timeout=600) == 0, proc.stderr.read()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [r["step"] for r in read_metrics(real / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    assert list(other.iterdir()) == []
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    assert_refused(run_train(dangling, check=False), 2, "leads to no directory")
    assert not (tmp_path / "nowhere").exists()


def test_a_directory_or_fifo_where_the_run_writes_a_file_is_refused_before_anything_is_written(
    tmp_path,
):
    run = tmp_path / "run"
    run_train(run, "train.max_steps=2")
    metrics = (run / "metrics.jsonl").read_text()
    status = (run / "status.json").read_text()
    # config.yaml replaced by a directory: the rewrite at start-up would fail after the run had
    # begun
    (run / "config.yaml").rename(tmp_path / "config.yaml")
    (run / "config.yaml").mkdir()
    result = run_train(run, "train.max_steps=3", check=False)
    assert_refused(result, 1, str(run / "config.yaml"), "not a regular file")
    assert (run / "metrics.jsonl").read_text() == metrics and (
        run / "status.json"
    ).read_text() == status
    (run / "config.yaml").rmdir()
    (tmp_path / "config.yaml").rename(run / "config.yaml")
    # run_info.json a FIFO: refused at once, never opened (opening it would block)
    (run / "run_info.json").unlink()
    os.mkfifo(run / "run_info.json")
    result = run_train(run, "train.max_steps=3", check=False)
    assert_refused(result, 1, str(run / "run_info.json"), "not a regular file")
    assert (run / "metrics.jsonl").read_text() == metrics


def test_an_eval_folder_planted_as_a_link_is_refused_before_any_export(tmp_path):
    """Teacher exports go under eval/step_*: a link there (or at a step folder) would put them
    outside the run."""
    run, outside = tmp_path / "run", tmp_path / "outside"
    run.mkdir()
    outside.mkdir()
    (run / "eval").symlink_to(outside)
    result = run_train(run, "train.max_steps=3", "train.teacher_export_period=2", check=False)
    assert_refused(result, 1, f"{run / 'eval'}: a symlink")
    assert list(outside.iterdir()) == [] and not (run / "metrics.jsonl").exists()
    (run / "eval").unlink()
    (run / "eval").mkdir()
    (run / "eval" / "step_00000002").symlink_to(outside)
    assert_refused(
        run_train(run, "train.max_steps=3", "train.teacher_export_period=2", check=False),
        1,
        str(run / "eval" / "step_00000002"),
    )
    assert list(outside.iterdir()) == []
