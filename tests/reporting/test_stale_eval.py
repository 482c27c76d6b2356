"""A table never shows an evaluation of another teacher as the run's: eval_linear.json's
`checkpoint_sha256` is compared with the digest recorded beside the run's teacher (kept in published
results, which have no weights)."""

import json

from reporting_runs import eval_result, make_run

from reporting.run_logs import COMPLETE, STALE, read_run
from reporting.table import build_rows, schedule_means

A, B = "a" * 64, "b" * 64


def with_digests(run, teacher: str | None, evaluated: str | None):
    record = json.loads((run / "eval_linear.json").read_text())
    if evaluated is not None:
        record["checkpoint_sha256"] = evaluated
    (run / "eval_linear.json").write_text(json.dumps(record))
    if teacher is not None:
        (run / "teacher_backbone.pth.sha256").write_text(f"{teacher}  teacher_backbone.pth\n")
    return run


def test_an_eval_of_another_teacher_is_stale_and_not_tabulated(tmp_path):
    dense = with_digests(make_run(tmp_path, "dense", 0.0, top1=90.0), A, A)
    stale = with_digests(make_run(tmp_path, "dense_s1", 0.0, top1=99.0, seed=1), B, A)
    runs = [read_run(dense), read_run(stale)]
    assert runs[0].eval_status == COMPLETE and runs[0].top1 == 90.0
    assert runs[1].eval_status == STALE and runs[1].top1 is None and runs[1].knn == {}
    assert "of an earlier teacher (sha256 aaaaaaaaaaaa, now bbbbbbbbbbbb)" in runs[1].status
    rows = build_rows(runs)
    assert [r.top1 for r in rows] == [90.0, None]
    mean = schedule_means(rows)[0]
    assert mean.top1 == 90.0  # the stale 99.0 is in no mean


def test_nothing_to_compare_is_not_stale(tmp_path):
    """No digest beside the teacher (an older version's run), no checkpoint_sha256 in the record, an
    unreadable or empty digest file: the evaluation is shown as before (nothing says it is
    stale)."""
    cases = {"no_digest": (None, A), "no_record_digest": (A, None), "empty_digest": ("", A)}
    for name, (teacher, evaluated) in cases.items():
        run = with_digests(make_run(tmp_path, name, 0.0, top1=80.0), teacher, evaluated)
        if name == "empty_digest":
            (run / "teacher_backbone.pth.sha256").write_bytes(b"")
        summary = read_run(run)
        assert summary.eval_status == COMPLETE and summary.top1 == 80.0, name
    garbage = make_run(
        tmp_path, "garbage", 0.0, top1=70.0, result=eval_result(70.0) | {"checkpoint_sha256": A}
    )
    (garbage / "teacher_backbone.pth.sha256").write_bytes(b"\xff\xfe\x00 not text")
    summary = read_run(garbage)
    assert summary.eval_status == COMPLETE and summary.top1 == 70.0


def test_a_table_asked_for_a_probe_shows_an_earlier_teachers_record_of_it_as_stale(tmp_path):
    """`make_table.py --eval-arg` reads the record of the probe asked by its settings
    (`find_probe`): where the only one is of an earlier teacher, the run is "eval stale", as without
    --eval-arg, not "no eval"."""
    from configs.eval_schema import EvalConfig

    run = with_digests(make_run(tmp_path, "dense", 0.0, top1=90.0), B, A)
    asked = read_run(run, probe=EvalConfig())
    assert asked.eval_status == STALE and asked.top1 is None
    assert "of an earlier teacher (sha256 aaaaaaaaaaaa, now bbbbbbbbbbbb)" in asked.status
    current = with_digests(make_run(tmp_path, "dense_s1", 0.0, top1=91.0, seed=1), A, A)
    assert read_run(current, probe=EvalConfig()).top1 == 91.0
