"""A probe under another protocol than the default one (any `features.*`, `linear.*` or `knn.*`
setting its numbers depend on) is written under a name of its own,
`eval_linear_protocol_<hash>.json`, so that it never replaces the default probe's
`eval_linear.json`, which the tables read; a table asked for that protocol (`probe=`, what
`make_table.py --eval-arg` passes) finds it and the baselines probed under it."""

import hashlib
import json
import sys

from eval_test_helpers import FAST_EVAL, REPO, fast, make_folder_run, make_image_tree

sys.path.insert(0, str(REPO))
import eval_linear  # noqa: E402
from configs.eval_schema import load_eval_config, protocol_label  # noqa: E402
from reporting.run_logs import COMPLETE, MISSING, read_run  # noqa: E402


def test_the_label_is_a_hash_of_the_sorted_changes_and_ignores_how_a_probe_runs():
    assert protocol_label(load_eval_config(None, [])) == ""
    assert (
        protocol_label(
            load_eval_config(
                None,
                [
                    "features.num_workers=0",
                    "features.batch_size=7",
                    "knn.batch_size=3",
                    "features.cache=false",
                    "device=cpu",
                ],
            )
        )
        == ""
    )
    by_hand = "protocol_" + hashlib.sha256(b"knn.temperature=1.0").hexdigest()[:8]
    assert protocol_label(load_eval_config(None, ["knn.temperature=1.0"])) == by_hand
    two = "protocol_" + hashlib.sha256(b"knn.ks=[5]\nlinear.n_c=3").hexdigest()[:8]
    assert protocol_label(load_eval_config(None, ["linear.n_c=3", "knn.ks=[5]"])) == two
    assert protocol_label(load_eval_config(None, ["knn.ks=[5]", "linear.n_c=3"])) == two


def test_a_probe_under_another_protocol_keeps_the_default_record_and_is_named_apart(
    tmp_path, caplog
):
    run = make_folder_run(tmp_path)
    assert (
        eval_linear.main(["--run", str(run), "features.num_workers=0", "index=none"]) == 0
    )  # the default protocol
    default = (run / "eval_linear.json").read_text()
    assert json.loads(default)["protocol_changes"] == []
    with caplog.at_level("INFO"):
        assert (
            eval_linear.main(
                [
                    "--run",
                    str(run),
                    "features.num_workers=0",
                    "index=none",
                    "knn.temperature=1.0",
                    "mode=knn",
                ]
            )
            == 0
        )
    hot = "eval_knn_protocol_" + hashlib.sha256(b"knn.temperature=1.0").hexdigest()[:8] + ".json"
    assert json.loads((run / hot).read_text())["protocol_changes"] == ["knn.temperature=1.0"]
    assert f"written as {hot}" in caplog.text and "make_table.py --eval-arg" in caplog.text
    assert (
        eval_linear.main(
            ["--run", str(run), "features.num_workers=0", "index=none", "knn.temperature=1.0"]
        )
        == 0
    )
    assert (run / "eval_linear.json").read_text() == default  # the tables' record, untouched
    assert (run / hot.replace("eval_knn", "eval_linear")).is_file()


def test_a_table_reads_the_default_protocol_unless_asked_for_another_with_its_baselines(tmp_path):
    run = make_folder_run(tmp_path)
    for extra in ([], ["checkpoint=random"]):
        assert eval_linear.main(["--run", str(run), *FAST_EVAL, "index=none", *extra]) == 0
    assert sorted(p.name for p in run.glob("eval_*.json")) == sorted(
        [fast("eval_linear.json"), fast("eval_linear_random_init.json")]
    )
    plain = read_run(run)
    assert plain.top1 is None and plain.baselines == {}
    assert (
        plain.eval_status == MISSING
    )  # the run dir holds no training logs: its eval is what is read here
    assert plain.eval_reason == (
        f"no probe under the default protocol; under others: {fast('eval_linear.json')} "
        "(make_table.py --eval-arg with a probe's settings tabulates it)"
    )
    asked = read_run(run, probe=load_eval_config(None, FAST_EVAL))
    record = json.loads((run / fast("eval_linear.json")).read_text())
    assert asked.eval_status == COMPLETE and asked.top1 == record["top1"]
    baseline = json.loads((run / fast("eval_linear_random_init.json")).read_text())
    assert asked.baselines["random_init"].top1 == baseline["top1"]


def test_a_probe_of_other_data_under_another_protocol_is_named_for_both_and_a_label_table_points_to_it(
    tmp_path,
):
    run = make_folder_run(tmp_path)
    other = make_image_tree(tmp_path / "other set", classes=2)
    assert (
        eval_linear.main(
            [
                "--run",
                str(run),
                *FAST_EVAL,
                "index=none",
                "data.dataset=imagenet_folder",
                f"data.root={other}",
            ]
        )
        == 0
    )
    name = fast("eval_linear_data_other-set.json")
    assert [p.name for p in run.glob("eval_*.json")] == [name]
    labelled = read_run(run, eval_label="other-set")
    assert labelled.eval_status == MISSING and name in labelled.eval_reason
    assert read_run(run).eval_reason == ""  # the run's own data has no probe at all
