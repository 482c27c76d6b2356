"""eval_linear.py as a writer of the run directory: it holds the run's lock while it writes there (a
trainer still running, or a second evaluation, is refused before anything is read or written);
`output=` / `index=` that cannot be written as files are refused before the probe runs; a split with
one class is a clear error, not 100%."""

import json
import subprocess
import sys

import pytest
import torch
from eval_test_helpers import FAST_EVAL, REPO, fast, make_image_tree, make_run_dir
from run_lock_holder import hold_lock

sys.path.insert(0, str(REPO))
import eval_linear  # noqa: E402


def test_an_evaluation_of_a_run_in_use_is_refused_and_writes_nothing(tmp_path, caplog):
    run = make_run_dir(tmp_path / "runs" / "tiny")
    holder = hold_lock(run)
    before = sorted(p.name for p in run.iterdir())
    try:
        assert eval_linear.main(["--run", str(run), *FAST_EVAL]) == 1
    finally:
        holder.kill()
        holder.wait()
    assert "is in use by another process" in caplog.text
    assert sorted(p.name for p in run.iterdir()) == before
    assert not (tmp_path / "runs" / "eval_index.jsonl").exists()
    # the holder gone (a dead process holds no lock), the same command works
    assert eval_linear.main(["--run", str(run), *FAST_EVAL]) == 0
    assert (run / fast("eval_linear.json")).is_file()


def test_two_evaluations_never_write_one_run_at_once(tmp_path):
    """The second evaluation, started while the first holds the run, exits 1 naming the directory;
    the first finishes and its record is whole."""
    run = make_run_dir(tmp_path / "runs" / "tiny")
    command = [sys.executable, str(REPO / "eval_linear.py"), "--run", str(run), *FAST_EVAL]
    holder = hold_lock(run)  # stands in for the first evaluation, for a deterministic overlap
    try:
        second = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr[-2000:]
    assert f"{run} is in use by another process" in second.stderr
    first = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-2000:]
    assert json.loads((run / fast("eval_linear.json")).read_text())["top1"] is not None


def test_an_evaluation_writing_elsewhere_needs_no_lock(tmp_path):
    """output= outside the run and no feature cache: nothing is written in the run directory, so a
    read-only look at a run in use is allowed."""
    run = make_run_dir(tmp_path / "runs" / "tiny")
    holder = hold_lock(run)
    try:
        out = tmp_path / "mine.json"
        assert (
            eval_linear.main(
                [
                    "--run",
                    str(run),
                    *FAST_EVAL,
                    f"output={out}",
                    "features.cache=false",
                    "index=none",
                ]
            )
            == 0
        )
    finally:
        holder.kill()
        holder.wait()
    assert json.loads(out.read_text())["top1"] is not None
    assert not (run / fast("eval_linear.json")).exists() and not (run / "eval").exists()


@pytest.mark.parametrize("target", ["directory", "fifo", "parent_is_file"])
@pytest.mark.parametrize("key", ["output", "index"])
def test_output_and_index_that_cannot_be_files_are_refused_before_the_probe(
    tmp_path, caplog, monkeypatch, key, target
):
    import evaluation.evaluate as evaluate

    run = make_run_dir(tmp_path / "runs" / "tiny")
    path = tmp_path / "target"
    if target == "directory":
        path.mkdir()
    elif target == "fifo":
        import os

        os.mkfifo(path)
    else:
        path.write_text("a file\n")
        path = path / "result.json"

    def no_probe(*args, **kwargs):
        raise AssertionError("the features were extracted before the bad target was noticed")

    monkeypatch.setattr(evaluate, "extract_run_features", no_probe)
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, f"{key}={path}"]) == 1
    assert f"{key}={path}" in caplog.text
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_split_of_one_class_is_a_clear_error(tmp_path, caplog):
    tree = make_image_tree(tmp_path / "images", classes=1)
    run = make_run_dir(tmp_path / "run", "data.dataset=imagenet_folder", f"data.root={tree}")
    assert eval_linear.main(["--run", str(run), *FAST_EVAL]) == 1
    assert "1 class folder(s)" in caplog.text and "at least 2" in caplog.text
    assert not (run / fast("eval_linear.json")).exists()


def test_features_of_one_label_are_refused_whatever_the_dataset():
    """The check on the labels themselves (datasets without class folders, e.g. the digits)."""
    from evaluation.evaluate import EvalInputError, check_two_classes

    check_two_classes(torch.tensor([0, 1, 1]), "train")  # two classes: fine
    for labels in (torch.tensor([3, 3, 3]), torch.tensor([], dtype=torch.long)):
        with pytest.raises(EvalInputError, match="at least 2"):
            check_two_classes(labels, "train")


def test_two_classes_is_enough(tmp_path):
    """The smallest case that means something: two classes probe and k-NN normally."""
    tree = make_image_tree(tmp_path / "two", classes=2)
    run = make_run_dir(tmp_path / "run2", "data.dataset=imagenet_folder", f"data.root={tree}")
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, "knn.ks=[3]"]) == 0
    record = json.loads((run / fast("eval_linear.json", [*FAST_EVAL, "knn.ks=[3]"])).read_text())
    assert record["n_classes"] == 2 and 0.0 <= record["top1"] <= 100.0


def test_a_feature_cache_folder_planted_as_a_link_is_refused_and_nothing_written_outside(
    tmp_path, caplog
):
    """`eval/` is where the feature cache goes: a link there would put it outside the run. Refused
    before any feature is computed; without the cache the same evaluation writes nothing there and
    runs."""
    run = make_run_dir(tmp_path / "runs" / "tiny")
    outside = tmp_path / "outside"
    outside.mkdir()
    (run / "eval").symlink_to(outside)
    assert eval_linear.main(["--run", str(run), *FAST_EVAL]) == 1
    assert f"{run / 'eval'}: a symlink where the run keeps" in caplog.text
    assert list(outside.iterdir()) == [] and not (run / fast("eval_linear.json")).exists()
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, "features.cache=false"]) == 0
    assert list(outside.iterdir()) == [] and (run / fast("eval_linear.json")).is_file()


@pytest.mark.parametrize("damage", ["digest_removed", "byte_flipped"])
def test_a_teacher_export_whose_digest_is_lost_or_wrong_is_refused(tmp_path, caplog, damage):
    """The run's exports carry a SHA-256 digest file (this version writes one for each): without it,
    or with a byte of the export changed, the evaluation refuses in one line instead of probing
    another teacher."""
    from rundir.digests import digest_path
    from rundir.torch_files import load_verified, save_verified

    run = make_run_dir(tmp_path / "runs" / "tiny")
    export = run / "eval" / "step_00000008" / "teacher_backbone.pth"
    export.parent.mkdir(parents=True)
    save_verified(torch.load(run / "teacher_backbone.pth", weights_only=True), export)
    load_verified(export, expect_digest=True)  # whole as written
    if damage == "digest_removed":
        digest_path(export).unlink()
    else:
        data = bytearray(export.read_bytes())
        data[len(data) // 2] ^= 0x01
        export.write_bytes(bytes(data))
    assert (
        eval_linear.main(["--run", str(run), *FAST_EVAL, f"checkpoint={export}", "mode=knn"]) == 1
    )
    assert f"cannot read {export}" in caplog.text
    assert ("digest file" in caplog.text) == (damage == "digest_removed")
    assert not (run / fast("eval_knn.json")).exists() and not list(run.glob("eval_*.json"))


def test_a_damaged_digest_is_refused_even_where_cached_features_would_stand_in(tmp_path, caplog):
    """The features of a probe are cached under the weights' own SHA-256, so a second probe never
    loads the teacher (where its digest file is checked); a damaged digest file must still refuse
    it, in one line, as a loader would, and write nothing."""
    from rundir.digests import digest_path
    from rundir.torch_files import save_verified

    run = make_run_dir(tmp_path / "runs" / "tiny")
    teacher = run / "teacher_backbone.pth"
    save_verified(
        torch.load(teacher, weights_only=True), teacher
    )  # as train.py writes it, with its digest
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, "mode=knn", "index=none"]) == 0
    assert list((run / "eval").glob("features_*.pt"))  # the cache a second probe would use
    (run / fast("eval_knn.json")).unlink()
    side = digest_path(teacher)
    side.write_bytes(b"\xff" + side.read_bytes()[1:])  # bit rot in the digest, the weights intact
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, "mode=knn", "index=none"]) == 1
    assert f"cannot read {teacher}: it has an unreadable recorded SHA-256" in caplog.text
    assert not list(run.glob("eval_*.json"))
