"""Only a probe of the run's own data is the run's record (`eval_linear.json`): its dataset, the
root it was trained with (for a root given as `${oc.env:...}`, the fingerprint of the value it
resolved to at training, so an environment that points elsewhere now is noticed), its training split
and the default val split. Any other probe is named apart (`eval_linear_data_<label>.json`), and a
table never reads a record of other data as the run's."""

import json

from eval_test_helpers import FAST_EVAL, fast, make_image_tree, make_run_dir

import eval_linear
from reporting.run_logs import read_eval_record


def _run(tmp_path, root_override: str):
    make_image_tree(tmp_path / "images")
    return make_run_dir(tmp_path / "run", "data.dataset=imagenet_folder", root_override)


def test_the_runs_own_data_writes_its_record_and_another_split_is_named_apart(tmp_path):
    run = _run(tmp_path, f"data.root={tmp_path / 'images'}")
    assert eval_linear.main(["--run", str(run), *FAST_EVAL]) == 0
    own = json.loads((run / fast("eval_linear.json")).read_text())
    assert own["dataset"]["own"] is True
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, "data.val_split=train"]) == 0
    assert json.loads((run / fast("eval_linear.json")).read_text()) == own  # untouched
    (other,) = run.glob("eval_linear_data_*.json")
    record = json.loads(other.read_text())
    assert (
        record["dataset"]["own"] is False
        and record["dataset"]["other_because"] == "data.val_split=train, not val"
    )
    assert record["top1"] is not None


def test_another_spelling_of_the_training_root_is_the_runs_own(tmp_path):
    run = _run(tmp_path, f"data.root={tmp_path / 'images'}")
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, f"data.root={tmp_path}/./images/"]) == 0
    assert json.loads((run / fast("eval_linear.json")).read_text())["dataset"]["own"] is True


def test_an_interpolated_root_that_now_points_elsewhere_is_other_data(tmp_path, monkeypatch):
    monkeypatch.setenv("EVAL_OWN_DATA", str(tmp_path / "images"))
    run = _run(tmp_path, "data.root=${oc.env:EVAL_OWN_DATA}")
    assert (
        "${oc.env:EVAL_OWN_DATA}" in (run / "config.yaml").read_text()
    )  # saved as written, with its fingerprint
    make_image_tree(tmp_path / "elsewhere", classes=2)
    monkeypatch.setenv("EVAL_OWN_DATA", str(tmp_path / "elsewhere"))
    assert eval_linear.main(["--run", str(run), *FAST_EVAL]) == 0
    assert not (run / fast("eval_linear.json")).exists()
    (other,) = run.glob("eval_linear_data_*.json")
    assert (
        "is not the root the run was trained with"
        in json.loads(other.read_text())["dataset"]["other_because"]
    )
    monkeypatch.setenv(
        "EVAL_OWN_DATA", str(tmp_path / "images")
    )  # the training data again: the run's record
    assert eval_linear.main(["--run", str(run), *FAST_EVAL]) == 0
    assert json.loads((run / fast("eval_linear.json")).read_text())["dataset"]["own"] is True


def test_a_record_of_other_data_written_under_the_runs_name_is_not_tabulated(tmp_path):
    run = _run(tmp_path, f"data.root={tmp_path / 'images'}")
    assert (
        eval_linear.main(
            [
                "--run",
                str(run),
                *FAST_EVAL,
                "data.val_split=train",
                f"output={run / 'eval_linear.json'}",
            ]
        )
        == 0
    )
    record = read_eval_record(run / "eval_linear.json")
    assert record.status == "unreadable" and "other data" in record.reason and record.top1 is None
