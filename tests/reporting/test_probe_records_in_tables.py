"""What a table says of the runs' probe records beyond their numbers: which linear probes had fits
stopped at linear.max_iter (eval_linear.json's unconverged_C and final_converged; older records and
converged probes add no note), and probes on other data, tabulated by their label only when asked
(`make_table.py --eval LABEL`)."""

from reporting_runs import eval_result, make_run

from reporting.table import make_table


def test_runs_whose_probe_fits_hit_the_cap_are_named_in_the_notes(tmp_path):
    runs = tmp_path / "runs"
    make_run(
        runs,
        "dense_s0",
        0.0,
        result={**eval_result(80.0), "unconverged_C": [1e3, 1e4, 1e5], "final_converged": True},
    )
    make_run(
        runs,
        "sparse70_s0",
        0.7,
        result={**eval_result(79.0), "unconverged_C": [], "final_converged": False},
    )
    make_run(
        runs,
        "sparse40_s0",
        0.4,
        result={**eval_result(79.5), "unconverged_C": [], "final_converged": True},
    )
    make_run(runs, "sparse60_s0", 0.6)  # an older record: neither field
    make_table([runs], tmp_path / "out", plots=False)
    table = (tmp_path / "out" / "table.md").read_text()
    note = next(line for line in table.splitlines() if "stopped at linear.max_iter" in line)
    assert (
        "dense_s0 (3 C values)" in note and "sparse70_s0 (0 C values, the final refit too)" in note
    )
    assert "sparse40_s0" not in note and "sparse60_s0" not in note


def test_probes_on_other_data_are_tabulated_by_their_label_and_only_when_asked(tmp_path):
    import json
    import subprocess
    import sys

    from reporting_runs import REPO

    runs = tmp_path / "runs"
    for name, fraction, own, other in (
        ("dense_s0", 0.0, 80.0, 60.0),
        ("sparse70_s0", 0.7, 79.0, 58.5),
    ):
        run = make_run(runs, name, fraction, top1=own)
        record = {
            **eval_result(other),
            "dataset": {"name": "imagenet_folder", "own": False, "label": "flowers"},
        }
        (run / "eval_linear_data_flowers.json").write_text(json.dumps(record))
    make_table([runs], tmp_path / "own", plots=False)
    make_table([runs], tmp_path / "flowers", plots=False, eval_label="flowers")
    own = json.loads((tmp_path / "own" / "summary.json").read_text())
    flowers = json.loads((tmp_path / "flowers" / "summary.json").read_text())
    top1 = (
        {r["run"]: r["top1"] for r in own["rows"]},
        {r["run"]: r["top1"] for r in flowers["rows"]},
    )
    assert top1 == (
        {"dense_s0": 80.0, "sparse70_s0": 79.0},
        {"dense_s0": 60.0, "sparse70_s0": 58.5},
    )
    assert "Linear probe and k-NN on flowers" in (tmp_path / "flowers" / "table.md").read_text()
    bad = subprocess.run(
        [
            sys.executable,
            "scripts/make_table.py",
            str(runs),
            "--eval",
            "../x",
            "--out",
            str(tmp_path / "bad"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--eval '../x'" in bad.stderr and not (tmp_path / "bad").exists()


def test_a_table_of_the_probe_the_launcher_ran_finds_its_records_by_their_settings(tmp_path):
    """`make_table.py --eval-arg KEY=VALUE` (the launcher's --eval-arg, given again) tabulates each
    run's record of the probe run with those settings, whatever its name: here runs on unlabelled
    images probed on a labelled set (eval_linear_data_pets.json, and one run under a hashed label).
    A run without such a record is missing, naming settings' record (its eval_linear.json is another
    probe's); a bad setting or both ways of choosing the probe stop before any work."""
    import json
    import subprocess
    import sys

    from reporting_runs import REPO

    from configs import load_eval_config, to_yaml

    labelled = ["data.dataset=imagenet_folder", "data.root=/labelled/pets"]
    record = {
        "eval_config": to_yaml(load_eval_config(None, labelled)),
        "dataset": {"name": "imagenet_folder", "own": False, "label": "pets"},
    }
    runs = tmp_path / "runs"
    for name, fraction, top1, file in (
        ("dense_s0", 0.0, 60.0, "eval_linear_data_pets.json"),
        ("sparse70_s0", 0.7, 58.5, "eval_linear_data_pets-1a2b3c4d.json"),
        ("sparse40_s0", 0.4, 59.0, None),
    ):
        run = make_run(
            runs, name, fraction, top1=90.0
        )  # eval_linear.json: a probe of other settings
        if file:
            (run / file).write_text(json.dumps({**eval_result(top1), **record}))
    make_table([runs], tmp_path / "out", plots=False, probe=load_eval_config(None, labelled))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert {r["run"]: r["top1"] for r in summary["rows"]} == {
        "dense_s0": 60.0,
        "sparse70_s0": 58.5,
        "sparse40_s0": None,
    }
    table = (tmp_path / "out" / "table.md").read_text()
    assert (
        "as eval_linear.py ran them with data.dataset=imagenet_folder data.root=/labelled/pets"
        in table
    )
    assert (
        "| 40% sparse | 0 | 120 → 180 | – |" in table
        and "Not complete (see Status): sparse40_s0." in table
    )
    for extra, says in (
        (["--eval-arg", "linear.n_cc=3"], "unknown config key 'linear.n_cc'"),
        (["--eval-arg", "mode=knn", "--eval", "pets"], "give one"),
    ):
        bad = subprocess.run(
            [
                sys.executable,
                "scripts/make_table.py",
                str(runs),
                *extra,
                "--out",
                str(tmp_path / "bad"),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert bad.returncode == 2 and says in bad.stderr and not (tmp_path / "bad").exists(), (
            bad.stderr
        )
