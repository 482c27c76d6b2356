"""Evaluations other than the final probe write records of their own (never eval_linear.json, which
tables read), and a missing split names the eval key that asked for it."""

import json
import sys

from eval_test_helpers import FAST_EVAL, REPO, fast, make_folder_run, make_run_dir

sys.path.insert(0, str(REPO))
import eval_linear  # noqa: E402


def test_evaluations_other_than_the_final_probe_write_records_of_their_own(tmp_path):
    run = make_run_dir(tmp_path / "runs" / "tiny")
    assert eval_linear.main(["--run", str(run), *FAST_EVAL]) == 0
    final = (run / fast("eval_linear.json")).read_text()
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, "mode=knn"]) == 0
    assert json.loads((run / fast("eval_knn.json")).read_text())["top1"] is None
    other = run / "other.pth"
    other.write_bytes((run / "teacher_backbone.pth").read_bytes())
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, f"checkpoint={other}"]) == 0
    assert (run / fast("eval_linear_other_step_00000016.json")).exists()
    assert (run / fast("eval_linear.json")).read_text() == final


def test_a_student_and_a_teacher_export_of_one_step_get_records_of_their_own(tmp_path):
    """The final student (train.export_student) and a teacher export at the same step are two
    networks: each probe keeps its own record, neither replaces the other's."""
    run = make_run_dir(tmp_path / "runs" / "tiny")
    export = run / "eval" / "step_00000016" / "teacher_backbone.pth"
    export.parent.mkdir(parents=True)
    export.write_bytes((run / "teacher_backbone.pth").read_bytes())
    student = run / "student_backbone.pth"
    student.write_bytes((run / "teacher_backbone.pth").read_bytes())
    for checkpoint in (export, student):
        assert (
            eval_linear.main(
                ["--run", str(run), *FAST_EVAL, f"checkpoint={checkpoint}", "mode=knn"]
            )
            == 0
        )
    assert json.loads((run / fast("eval_knn_step_00000016.json")).read_text())["checkpoint"] == str(
        export
    )
    student_record = run / fast("eval_knn_student_backbone_step_00000016.json")
    assert json.loads(student_record.read_text())["checkpoint"] == str(student)


def test_a_missing_eval_split_names_its_key(tmp_path, caplog):
    run = make_folder_run(tmp_path)
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, "data.val_split=test"]) == 1
    assert "data.val_split='test'" in caplog.text and "data.split" not in caplog.text.replace(
        "data.val_split", ""
    )
