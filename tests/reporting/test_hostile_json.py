"""A run's JSON files, however damaged or hostile (a 5,001-digit number, a 401-digit step, 100k
nested brackets), are read by one parser (`rundir.json_files.parse_json`): every reader turns them
into "unreadable" and goes on, and a table still tabulates the good runs beside the bad one.
In-process, no training."""

import json
from pathlib import Path

import pytest

from reporting.run_logs import read_eval_record, read_run
from reporting.table import make_table
from rundir import compressed
from rundir.errors import RunDirProblem
from rundir.json_files import parse_json
from rundir.metrics import read_metrics
from rundir.status import read_status
from slurm.sweep import read_jobs

GOOD = (
    Path(__file__).resolve().parents[2] / "results" / "cifar10" / "recipe" / "screen" / "dense_s2"
)
HOSTILE = {
    "long number": '{"step": 20, "loss": ' + "9" * 5001 + "}",
    "long step": '{"step": ' + "9" * 401 + ', "loss": 1.0}',
    "deep nesting": '{"step": 20, "loss": ' + "[" * 100_000 + "]" * 100_000 + "}",
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_the_parser_says_why_in_one_line(text):
    with pytest.raises(ValueError) as e:
        parse_json(text)
    assert "\n" not in str(e.value) and len(str(e.value)) <= 200


def _copy_good(path: Path) -> Path:
    path.mkdir(parents=True)
    for name in ("config.yaml", "metrics.jsonl", "eval_linear.json", "status.json", "log.txt"):
        (path / name).write_bytes(
            compressed.read_bytes(GOOD / name)
        )  # committed runs keep their logs as .xz
    return path


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_every_reader_skips_or_names_the_damage_and_the_table_keeps_the_good_runs(tmp_path, text):
    bad = _copy_good(tmp_path / "runs" / "bad")
    good = _copy_good(tmp_path / "runs" / "good")
    with open(bad / "metrics.jsonl", "a") as f:
        f.write(text + "\n")
    (bad / "status.json").write_text(text)
    (bad / "eval_linear.json").write_text(text)
    (bad / "jobs.json").write_text(text)

    lines = read_metrics(bad / "metrics.jsonl")
    assert len(lines) == len(
        read_metrics(good / "metrics.jsonl")
    )  # the hostile line alone is skipped
    assert read_status(bad).state != "finished" or read_status(bad).recorded is False
    record = read_eval_record(bad / "eval_linear.json")
    assert record.status == "unreadable" and record.reason.startswith("eval_linear.json: ")
    with pytest.raises(RunDirProblem, match="unreadable job record"):
        read_jobs(bad)
    assert read_run(bad).eval_status == "unreadable"
    make_table([tmp_path / "runs"], tmp_path / "table", plots=False)
    summary = json.loads((tmp_path / "table" / "summary.json").read_text())
    by_run = {row["run"]: row for row in summary["rows"]}
    assert by_run["good"]["top1"] == 71.37 and by_run["bad"]["top1"] is None


WRONG_TYPES = {
    "status resumed_at a number": ("status.json", {"resumed_at": 5}),
    "status step a text": ("status.json", {"step": "20"}),
    "status a list": ("status.json", ["finished"]),
    "metrics format null": ("metrics.jsonl", {"format": None}),
    "metrics phase a list": ("metrics.jsonl", {"phase": ["x"]}),
    "metrics global_batch a text": ("metrics.jsonl", {"global_batch": "64"}),
}


@pytest.mark.parametrize("file, damage", WRONG_TYPES.values(), ids=WRONG_TYPES.keys())
def test_json_that_parses_with_fields_of_the_wrong_type_costs_only_its_own_record(
    tmp_path, file, damage
):
    """Each run file is read through its typed fields (rundir/typed_records.py): a field of the
    wrong type makes that record unreadable (status unknown, naming the field; a metrics line
    skipped), and the table, the launcher's status and a resume go on."""
    from slurm.status import run_row

    bad = _copy_good(tmp_path / "runs" / "bad")
    _copy_good(tmp_path / "runs" / "good")
    if file == "status.json":
        status = json.loads((bad / "status.json").read_text())
        (bad / "status.json").write_text(
            json.dumps(damage if isinstance(damage, list) else {**status, **damage})
        )
        read = read_status(bad)
        assert read.state == ""  # unknown: neither finished nor running
        if isinstance(damage, dict):  # (not an object at all: read as no status.json, from the log)
            assert read.reason.startswith(f"unreadable status.json: {next(iter(damage))}: ")
    else:
        lines = (bad / "metrics.jsonl").read_text().splitlines()
        last = {**json.loads(lines[-1]), **damage}
        (bad / "metrics.jsonl").write_text("\n".join(lines[:-1] + [json.dumps(last)]) + "\n")
        expected = len(lines) - (
            0 if damage == {"format": None} else 1
        )  # null is absent: the line stays
        assert len(read_metrics(bad / "metrics.jsonl")) == expected
    read_run(bad)
    run_row(bad, {})
    make_table([tmp_path / "runs"], tmp_path / "table", plots=False)
    summary = json.loads((tmp_path / "table" / "summary.json").read_text())
    assert {r["run"] for r in summary["rows"]} == {"bad", "good"}


GOOD_INFO = {
    "device": "cuda",
    "device_name": "NVIDIA H200",
    "data_fingerprint": "3f2a",
    "world_size": 2,
    "batch_size_per_gpu": 256,
}


@pytest.mark.parametrize(
    "damage",
    [{"world_size": "2"}, {"device_name": 5}, {"batch_size_per_gpu": True}, ["x"]],
    ids=["world_size a text", "device_name a number", "batch a boolean", "a list"],
)
def test_run_info_with_a_field_of_the_wrong_type_reads_as_absent(tmp_path, damage):
    """run_info.json through its typed fields: a wrong type is not coerced (a text "2" once became 2
    processes), the run is read as one that recorded nothing, by its config alone."""
    run = _copy_good(tmp_path / "run")
    (run / "run_info.json").write_text(json.dumps(GOOD_INFO))
    read = read_run(run)
    assert (read.device_name, read.data_fingerprint, read.processes) == ("NVIDIA H200", "3f2a", 2)
    (run / "run_info.json").write_text(
        json.dumps(damage if isinstance(damage, list) else {**GOOD_INFO, **damage})
    )
    read = read_run(run)
    assert (read.device_name, read.data_fingerprint, read.processes) == ("", "", 1)


def test_a_job_record_with_a_field_of_the_wrong_type_is_named_and_costs_only_its_row(tmp_path):
    from slurm.status import run_row
    from slurm.sweep import read_jobs

    run = _copy_good(tmp_path / "run")
    record = {
        "kind": "train",
        "job_id": "12",
        "cluster": "slurm",
        "submitted": "2026-11-29T10:00:00",
    }
    (run / "jobs.json").write_text(json.dumps([record]))
    assert read_jobs(run)[0].job_id == "12"
    (run / "jobs.json").write_text(json.dumps([{**record, "job_id": 12}]))
    with pytest.raises(
        RunDirProblem, match="unreadable jobs.json: job_id: int 12 where str belongs"
    ):
        read_jobs(run)
    assert run_row(run, {})["train job"] == "unreadable jobs.json"
