"""Hostile run-directory entries, tried on the writers and readers directly (train.py end to end:
test_hostile_runs): symlinks planted where temporary files, the destination, the lock or an appended
file go; stray temporary files of dead and live writers; `checkpoints` entries that are not a usable
directory; checkpoints whose digest file is missing. Every case checks that the file outside the run
is unchanged and that the refusal names the path."""

import logging
import os
import threading

import pytest
import torch

import rundir.guard as run_guard
import rundir.lock as run_lock
from rundir import atomic as atomic_io
from rundir.atomic import (
    atomic_write_text,
    create_exclusively,
    temporary_base,
    tmp_path as temp_name,
)
from rundir.checkpoints import CheckpointManager
from rundir.digests import MissingDigest, digest_path
from rundir.errors import RunDirProblem
from rundir.guard import (
    eval_dir_problem,
    lost_checkpoints_problem,
    remove_stray_temporaries,
    resolve_run_dir,
    usable_checkpoint_dir,
)
from rundir.metrics import MetricsLog, open_append
from rundir.status import RUNNING, read_status, write_status
from rundir.torch_files import DIGEST_MARKER, load_verified, save_verified

PRECIOUS = "a file outside the run, which no run may change\n"


@pytest.fixture
def outside(tmp_path):
    path = tmp_path / "outside" / "precious.txt"
    path.parent.mkdir()
    path.write_text(PRECIOUS)
    return path


@pytest.fixture
def run(tmp_path):
    path = tmp_path / "run"
    path.mkdir()
    return path


# ----------------------------------------------------------------- temporary files and renames
@pytest.mark.parametrize("name", ["status.json", "config.yaml", "teacher_backbone.pth"])
def test_a_symlink_planted_at_the_old_temporary_name_is_never_written_through(run, outside, name):
    (run / f"{name}.tmp").symlink_to(outside)
    if name.endswith(".pth"):
        save_verified({"w": torch.ones(2)}, run / name)
        assert torch.equal(load_verified(run / name)["w"], torch.ones(2))
    else:
        atomic_write_text(run / name, "new\n")
        assert (run / name).read_text() == "new\n"
    assert outside.read_text() == PRECIOUS
    assert (
        not (run / name).is_symlink() and (run / f"{name}.tmp").is_symlink()
    )  # the plant left for the cleaner


def test_a_destination_that_is_a_symlink_is_replaced_not_written_through(run, outside):
    (run / "status.json").symlink_to(outside)
    write_status(run, RUNNING, 3)
    assert outside.read_text() == PRECIOUS
    assert not (run / "status.json").is_symlink() and read_status(run).step == 3


def test_temporary_files_are_created_exclusively_with_unique_names(run, outside):
    first, second = temp_name(run / "status.json"), temp_name(run / "status.json")
    assert (
        first != second
        and first.name.startswith(f"status.json.{os.getpid()}.")
        and first.suffix == ".tmp"
    )
    assert (
        temporary_base(first.name) == "status.json"
        and temporary_base("status.json.tmp") == "status.json"
    )
    assert temporary_base("status.json") is None
    link = run / "planted.tmp"
    link.symlink_to(outside)
    (run / "dangling.tmp").symlink_to(run / "nowhere")
    for taken in (link, run / "dangling.tmp"):
        with pytest.raises(FileExistsError):
            create_exclusively(taken)
    assert outside.read_text() == PRECIOUS and not (run / "nowhere").exists()


def test_a_failed_write_removes_only_its_own_temporary_file(run, monkeypatch):
    atomic_write_text(run / "config.yaml", "old\n")
    other = run / "config.yaml.999.0123456789ab.tmp"  # another writer's, alive
    other.write_text("theirs")

    def full_disk(f):
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        atomic_io.write_atomically(run / "config.yaml", full_disk)
    assert (run / "config.yaml").read_text() == "old\n" and other.read_text() == "theirs"
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", other.name]


def test_concurrent_writers_of_one_file_never_share_a_temporary_file(run):
    """Two threads rewriting status.json 200 times each: every read sees one writer's whole file,
    none is left."""
    texts = [("a" * 5000) + "\n", ("b" * 3000) + "\n"]
    errors = []

    def writer(text):
        try:
            for _ in range(200):
                atomic_write_text(run / "status.json", text)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    seen = set()
    while any(t.is_alive() for t in threads):
        seen.add((run / "status.json").read_text() if (run / "status.json").exists() else texts[0])
    for t in threads:
        t.join()
    assert not errors and seen <= set(texts)
    assert [p.name for p in run.iterdir()] == ["status.json"]


# ---------------------------------------------------- stray temporary files: the lock holder's only
def test_only_the_trainers_own_strays_are_removed_and_links_only_as_links(run, outside):
    (run / "checkpoints").mkdir()
    export = run / "eval" / "step_00000008"
    export.mkdir(parents=True)
    trainer_strays = [
        run / "status.json.tmp",
        run / "metrics.jsonl.77.0123456789ab.tmp",
        run / "checkpoints" / "step_00000008.pt.tmp",
        run / "checkpoints" / "step_00000008.pt.sha256.5.abcdef012345.tmp",
        export / "teacher_backbone.pth.12.00112233aabb.tmp",
    ]
    for p in trainer_strays:
        p.write_text("half")
    (run / "teacher_backbone.pth.tmp").symlink_to(outside)  # a planted link: removed as a link
    trainer_strays.append(run / "teacher_backbone.pth.tmp")
    foreign = [
        run
        / "eval_linear.json.4242.0123456789ab.tmp",  # eval_linear.py writing now: not the trainer's
        run / "notes.tmp",
        run / "checkpoints" / "mine.tmp",
        export / "features.pt.tmp",
    ]
    for p in foreign:
        p.write_text("someone else's")
    (run / "checkpoints" / "step_00000009.pt.tmp").mkdir()  # a directory is never removed
    removed = remove_stray_temporaries(run)
    assert sorted(removed) == sorted(trainer_strays)
    assert not any(os.path.lexists(p) for p in trainer_strays)
    assert all(p.read_text() == "someone else's" for p in foreign)
    assert (
        run / "checkpoints" / "step_00000009.pt.tmp"
    ).is_dir() and outside.read_text() == PRECIOUS


def test_stray_removal_does_not_follow_a_symlinked_eval_folder(run, tmp_path):
    elsewhere = tmp_path / "elsewhere" / "step_00000008"
    elsewhere.mkdir(parents=True)
    (elsewhere / "teacher_backbone.pth.tmp").write_text("not in this run")
    (run / "eval").symlink_to(elsewhere.parent)
    assert remove_stray_temporaries(run) == []
    assert (elsewhere / "teacher_backbone.pth.tmp").read_text() == "not in this run"


@pytest.mark.parametrize(
    "kind", ["link_to_dir", "dangling", "file", "step_link", "step_link_dangling"]
)
def test_an_eval_folder_or_export_folder_that_is_not_the_runs_own_directory_is_refused(
    run, outside, kind
):
    evals = run / "eval"
    if kind == "link_to_dir":
        evals.symlink_to(outside.parent)
    elif kind == "dangling":
        evals.symlink_to(outside.parent / "nowhere")
    elif kind == "file":
        evals.write_text("x")
    else:
        evals.mkdir()
        (evals / "step_00000002").symlink_to(
            outside.parent if kind == "step_link" else outside.parent / "nowhere"
        )
    problem = eval_dir_problem(run)
    where = evals / "step_00000002" if kind.startswith("step_link") else evals
    assert str(where) in problem and "remove it" in problem
    assert ("symlink" in problem) == (kind != "file")
    assert outside.read_text() == PRECIOUS and sorted(p.name for p in outside.parent.iterdir()) == [
        "precious.txt"
    ]


def test_an_eval_folder_that_is_absent_or_a_real_directory_is_fine(run):
    assert eval_dir_problem(run) == ""
    (run / "eval" / "step_00000002").mkdir(parents=True)
    (run / "eval" / "features_train.pt").symlink_to(
        run / "elsewhere.pt"
    )  # replaced by a rename, never written through
    assert eval_dir_problem(run) == ""


# ------------------------------------------------------------- the lock file and the appended files
@pytest.mark.parametrize("kind", ["symlink", "dangling", "directory", "fifo"])
def test_a_lock_file_that_is_not_a_regular_file_is_refused(run, outside, kind):
    lock = run / ".lock"
    target = outside.parent / "created_by_the_lock"
    if kind == "symlink":
        lock.symlink_to(outside)
    elif kind == "dangling":
        lock.symlink_to(target)
    elif kind == "directory":
        lock.mkdir()
    else:
        os.mkfifo(lock)
    with pytest.raises(RunDirProblem, match=r"\.lock"):
        run_lock.lock(run)  # (a FIFO: refused at once, never a hang)
    assert outside.read_text() == PRECIOUS and not target.exists()


@pytest.mark.parametrize("name", ["metrics.jsonl", "log.txt"])
def test_appended_files_refuse_a_symlink(run, outside, name):
    (run / name).symlink_to(outside)
    with pytest.raises(RunDirProblem, match=name):
        if name == "metrics.jsonl":
            MetricsLog(run / name).write({"step": 1, "loss": 1.0})
        else:
            open_append(run / name)
    if name == "metrics.jsonl":
        with pytest.raises(RunDirProblem, match="is a symlink"):
            MetricsLog(run / name).truncate_after(0)
    assert outside.read_text() == PRECIOUS and (run / name).is_symlink()


# -------------------------------------------------------- "no checkpoints" only when there are none
def test_the_checkpoints_entry_is_absent_a_directory_or_a_link_to_one(run, tmp_path):
    entry = run / "checkpoints"
    assert usable_checkpoint_dir(entry) is False
    elsewhere = tmp_path / "disk2" / "ckpts"
    elsewhere.mkdir(parents=True)
    entry.symlink_to(elsewhere)  # checkpoints kept on another disk: followed
    assert usable_checkpoint_dir(entry) is True
    entry.unlink()
    entry.mkdir()
    assert usable_checkpoint_dir(entry) is True


@pytest.mark.parametrize(
    "kind,why",
    [
        ("dangling", "leads nowhere"),
        ("loop", "leads nowhere"),
        ("file", "is not a directory"),
        ("link_to_file", "which is not a directory"),
        ("unreadable", "cannot be read"),
    ],
)
def test_a_checkpoints_entry_that_is_not_a_usable_directory_is_refused(
    run, tmp_path, monkeypatch, kind, why
):
    entry = run / "checkpoints"
    if kind == "dangling":
        entry.symlink_to(tmp_path / "unmounted" / "ckpts")
    elif kind == "loop":
        entry.symlink_to(run / "loop2")
        (run / "loop2").symlink_to(entry)
    elif kind == "file":
        entry.write_text("x")
    elif kind == "link_to_file":
        (tmp_path / "f").write_text("x")
        entry.symlink_to(tmp_path / "f")
    else:
        entry.mkdir()
        real_listdir = os.listdir

        def denied(path):  # (the tests run as root, which chmod does not stop)
            if str(path) == str(entry):
                raise PermissionError(13, "Permission denied")
            return real_listdir(path)

        monkeypatch.setattr(run_guard.os, "listdir", denied)
    with pytest.raises(RunDirProblem, match=why) as refused:
        usable_checkpoint_dir(entry)
    assert str(entry) in str(refused.value) and "refusing to start over" in str(refused.value)
    # the trainer's reader refuses too, rather than returning "none"
    with pytest.raises(RunDirProblem):
        CheckpointManager(entry, max_to_keep=3).load_latest()


@pytest.mark.parametrize(
    "state,step,refused",
    [
        ("running", 6, True),
        ("preempted", 4, True),
        ("finished", 16, True),
        ("running", 0, False),
        ("failed", 2, False),
    ],
)
def test_status_recording_a_checkpointed_step_with_no_checkpoint_refuses_a_fresh_start(
    run, state, step, refused
):
    (run / "checkpoints").mkdir()  # empty: e.g. a mount point with nothing mounted
    write_status(run, state, step)
    problem = lost_checkpoints_problem(run)
    assert bool(problem) == refused
    if refused:
        assert f"records step {step}" in problem and str(run / "checkpoints") in problem
    (run / "checkpoints" / "step_00000003.pt.corrupt").write_bytes(
        b"x"
    )  # set aside: the manager's refusal says it
    assert lost_checkpoints_problem(run) == ""


def test_a_run_directory_given_through_a_symlink_is_resolved_once(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert resolve_run_dir(tmp_path / "link") == real.resolve()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for bad in ("dangling", "loop"):
        with pytest.raises(RunDirProblem, match="leads to no directory"):
            resolve_run_dir(tmp_path / bad)
    assert not (tmp_path / "nowhere").exists()
    assert resolve_run_dir(tmp_path / "new" / "run") == (tmp_path / "new" / "run").resolve()


# ----------------------------------------------------------------- missing digests
def test_a_file_written_with_a_digest_is_refused_without_it_even_with_a_flipped_byte(tmp_path):
    path = tmp_path / "step_00000003.pt"
    save_verified({"w": torch.zeros(4096)}, path)
    assert DIGEST_MARKER not in load_verified(path) and DIGEST_MARKER in torch.load(
        path, weights_only=True
    )
    data = bytearray(path.read_bytes())
    at = data.rfind(bytes(4 * 64))  # inside the tensor's zeros
    data[at : at + 4] = b"\x00\x00\x80\x3f"  # one value becomes 1.0
    path.write_bytes(bytes(data))
    with pytest.raises(Exception, match="does not match"):
        load_verified(path)
    digest_path(path).unlink()  # ... and the digest removed: still refused, whoever loads it
    for kwargs in ({}, {"expect_digest": True, "allow_missing_digest": True}):
        with pytest.raises(MissingDigest, match=f"its digest file {digest_path(path)} is missing"):
            load_verified(path, **kwargs)


def test_a_checkpoint_without_a_digest_stops_the_resume_and_nothing_is_set_aside(tmp_path, caplog):
    manager = CheckpointManager(tmp_path, max_to_keep=3)
    manager.save({"step": 3, "w": torch.ones(2)}, 3)
    manager.save({"step": 6, "w": torch.ones(2)}, 6)
    digest_path(manager.path_for(6)).unlink()
    with pytest.raises(MissingDigest, match="step_00000006.pt.sha256"):
        # not silently step 3 either: the newest is unverifiable, the user decides
        manager.load_latest()
    assert manager.path_for(6).exists() and not list(tmp_path.glob("*.corrupt"))


def test_a_checkpoint_of_an_older_version_needs_the_explicit_opt_in(tmp_path, caplog):
    older = tmp_path / "step_00000005.pt"
    torch.save(
        {"step": 5, "w": torch.ones(2)}, older
    )  # no marker, no digest: as versions before digests wrote
    with pytest.raises(MissingDigest, match="has no digest file"):
        CheckpointManager(tmp_path, max_to_keep=3).load_latest()
    with caplog.at_level(logging.WARNING):
        state = CheckpointManager(tmp_path, max_to_keep=3, allow_missing_digest=True).load_latest()
    assert state["step"] == 5 and "without a digest (allowed explicitly)" in caplog.text
    assert (
        load_verified(older)["step"] == 5
    )  # a foreign file (pretrained weights) is not a run's: loads as before
