"""Results belong to the teacher they were computed from: a run started again from step 0 in a
directory that was trained and evaluated (`train.resume=false`) moves the old teacher and
evaluations into `superseded-<time>/` first, and a table marks an `eval_linear.json` of another
teacher as stale instead of showing its numbers as the run's. A resume keeps them."""

import json
import sys

import pytest
from train_runs import REPO, run_train

sys.path.insert(0, str(REPO))
import eval_linear  # noqa: E402
from configs.eval_schema import load_eval_config, protocol_label  # noqa: E402
from reporting.run_logs import STALE, read_run  # noqa: E402
from rundir.digests import recorded_digest  # noqa: E402

pytestmark = (
    pytest.mark.slow
)  # trains for tens of seconds per test on 2 cores: outside the fast lane

FAST_EVAL = [
    "linear.n_c=3",
    "linear.max_iter=30",
    "features.num_workers=0",
    "knn.ks=[5]",
    "mode=both",
]
# a quick protocol's name
FAST_RECORD = f"eval_linear_{protocol_label(load_eval_config(None, FAST_EVAL))}.json"


def test_resume_false_over_an_evaluated_run_sets_the_old_results_aside(tmp_path):
    run = tmp_path / "runs" / "run"
    run_train(run)
    assert eval_linear.main(["--run", str(run), *FAST_EVAL]) == 0
    old_teacher, old_eval = (
        recorded_digest(run / "teacher_backbone.pth"),
        (run / FAST_RECORD).read_text(),
    )
    assert json.loads(old_eval)["checkpoint_sha256"] == old_teacher
    exports = sorted(p.relative_to(run) for p in (run / "eval").rglob("*") if p.is_file())

    run_train(run)  # a resume with nothing left to do keeps the teacher and its evaluation
    assert (run / FAST_RECORD).read_text() == old_eval
    assert not [p for p in run.iterdir() if p.name.startswith("superseded-")]
    assert read_run(run, probe=load_eval_config(None, FAST_EVAL)).status == "complete"

    result = run_train(run, "train.resume=false", "train.seed=1")
    aside = [p for p in run.iterdir() if p.name.startswith("superseded-")]
    assert len(aside) == 1, sorted(p.name for p in run.iterdir())
    assert "moved them to" in result.stderr and str(aside[0]) in result.stderr
    assert (aside[0] / FAST_RECORD).read_text() == old_eval  # kept whole, never deleted
    old_metrics = [
        json.loads(line) for line in (aside[0] / "metrics.jsonl").read_text().splitlines()
    ]
    assert (
        old_metrics
        and (aside[0] / "config.yaml").is_file()
        and (aside[0] / "status.json").is_file()
    )
    assert (
        "seed: 0" in (aside[0] / "config.yaml").read_text()
        and "seed: 1" in (run / "config.yaml").read_text()
    )
    assert recorded_digest(aside[0] / "teacher_backbone.pth") == old_teacher
    assert (
        sorted(p.relative_to(aside[0]) for p in (aside[0] / "eval").rglob("*") if p.is_file())
        == exports
    )
    assert not (run / FAST_RECORD).exists()  # the new teacher has no evaluation yet
    assert recorded_digest(run / "teacher_backbone.pth") not in (None, old_teacher)
    summary = read_run(run)
    assert summary.status == "no eval" and summary.top1 is None

    # an old evaluation left beside the new teacher (copied back, or by a version that did not move
    # it): stale
    (run / "eval_linear.json").write_text(old_eval)
    summary = read_run(run)
    assert summary.eval_status == STALE and summary.top1 is None and summary.knn == {}
    assert summary.status.startswith("eval stale (of an earlier teacher")


def test_set_aside_moves_only_a_previous_runs_results_and_never_reuses_a_folder(tmp_path):
    from rundir.guard import set_aside_results

    run = tmp_path / "run"
    (run / "eval" / "step_00000008").mkdir(parents=True)
    kept = ["log.txt", "notes_eval.json", "eval_index.jsonl"]
    moved = [
        "teacher_backbone.pth",
        "teacher_backbone.pth.sha256",
        "eval_linear.json",
        "eval_knn_step_00000008.json",
        "eval_linear_pixels.json",
        "config.yaml",
        "metrics.jsonl",
        "status.json",
        "run_info.json",
        "sparsity_decisions.json",
        "sparsity_masks.jsonl",
    ]  # the old run's records go with its results
    for name in kept + moved:
        (run / name).write_text(name)
    assert set_aside_results(tmp_path / "absent") is None
    first = set_aside_results(run)
    assert sorted(p.name for p in first.iterdir()) == sorted(moved + ["eval"])
    assert all((run / name).read_text() == name for name in kept)
    assert set_aside_results(run) is None  # nothing left to move
    (run / "eval_linear.json").write_text("again")
    second = set_aside_results(run)
    assert second != first and (second / "eval_linear.json").read_text() == "again"
    assert (first / "eval_linear.json").read_text() == "eval_linear.json"


def test_a_run_killed_before_anything_worth_keeping_is_simply_rewritten(tmp_path):
    """No teacher, no evaluation, no checkpoint (killed before the first one): nothing to set aside,
    so a fresh start rewrites the records as an uninterrupted run would have written them."""
    from rundir.guard import previous_results

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("config.yaml", "metrics.jsonl", "status.json", "run_info.json", "log.txt"):
        (run / name).write_text(name)
    assert previous_results(run) == []
    (run / "checkpoints" / "step_00000004.pt").write_bytes(
        b"x"
    )  # a checkpoint: the records go with it
    assert sorted(p.name for p in previous_results(run)) == [
        "config.yaml",
        "metrics.jsonl",
        "run_info.json",
        "status.json",
    ]
