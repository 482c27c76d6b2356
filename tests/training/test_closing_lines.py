"""The last lines of train.py: the final loss, this command's time and the next command to type
(training/closing_lines.py), on hand-made run directories and on the shared reference run."""

import json
import re

from configs import load_config
from rundir.layout import METRICS, TEACHER
from rundir.metrics import metrics_by_steps_done
from training.closing_lines import closing_lines, duration

TINY_STEPS = ["optim.epochs=4", "train.epoch_length=4"]  # 16 steps


def _run(tmp_path, losses: dict, teacher: bool):
    run = tmp_path / "runs" / "my run"
    run.mkdir(parents=True)
    (run / METRICS).write_text(
        "".join(json.dumps({"step": s, "format": 2, "loss": v}) + "\n" for s, v in losses.items())
    )
    if teacher:
        (run / TEACHER).write_bytes(b"weights")
    return run


def test_duration_reads_as_people_write_it():
    assert [duration(s) for s in (0.04, 41.25, 59.96, 125, 3723)] == [
        "0.0s",
        "41.2s",
        "1m 00s",
        "2m 05s",
        "1h 02m 03s",
    ]


def test_a_finished_run_ends_on_its_final_loss_and_the_probe_command(tmp_path, monkeypatch):
    run = _run(tmp_path, {15: 2.5, 16: 1.23456}, teacher=True)
    monkeypatch.chdir(tmp_path)  # inside the working directory: shown relative, quoted for a shell
    lines = closing_lines(run, load_config(None, TINY_STEPS), 125.2, tmp_path / "eval_linear.py")
    assert lines == [
        "done: step 16 of 16 in 2m 05s; final loss 1.2346 (step 16)",
        "teacher: 'runs/my run/teacher_backbone.pth'; metrics: 'runs/my run/metrics.jsonl'",
        "next: python eval_linear.py --run 'runs/my run'   (linear probe and k-NN of the teacher)",
    ]


def test_a_run_on_unlabelled_images_says_which_labelled_set_its_probe_needs(tmp_path, monkeypatch):
    run = _run(tmp_path, {16: 1.5}, teacher=True)
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, [*TINY_STEPS, "data.dataset=image_folder", "data.root=/my/images"])
    assert closing_lines(run, cfg, 3.0, tmp_path / "eval_linear.py")[-1] == (
        "next: python eval_linear.py --run 'runs/my run' data.dataset=imagenet_folder data.root=<a "
        "labelled set: "
        "train/<class>/<image> and val/<class>/<image>>   (linear probe and k-NN of the teacher; "
        "the training "
        "images have no labels)"
    )


def test_a_run_stopped_at_max_steps_says_how_to_continue(tmp_path, monkeypatch):
    run = _run(tmp_path, {4: 3.0, 8: 2.0}, teacher=False)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # outside the working directory: the full path
    lines = closing_lines(run, load_config(None, [*TINY_STEPS, "train.max_steps=8"]), 7.0)
    assert lines[0] == "done: step 8 of 16 in 7.0s; final loss 2.0000 (step 8)"
    assert lines[1].startswith("stopped at train.max_steps=8 of 16 steps: no final teacher yet")
    assert (
        lines[2].startswith("next: rerun the same command with a larger train.max_steps")
        and f"'{run}'" in lines[2]
    )


def test_the_reference_run_ends_on_these_lines(reference_run, reference_stderr):
    """train.py's real output (a subprocess shared by the tests of this folder): the last three
    lines."""
    last = [
        re.sub(r"^\S+ \S+ INFO train: ", "", line)
        for line in reference_stderr.strip().splitlines()[-3:]
    ]
    loss = metrics_by_steps_done(reference_run / METRICS)[-1]["loss"]
    assert re.fullmatch(
        rf"done: step 16 of 16 in \d+(\.\ds|m \d\ds); final loss {loss:.4f} \(step 16\)", last[0]
    ), last
    assert last[1] == f"teacher: {reference_run / TEACHER}; metrics: {reference_run / METRICS}"
    assert (
        last[2]
        == f"next: python eval_linear.py --run {reference_run}   (linear probe and k-NN of the "
        f"teacher)"
    )
    assert last == [
        re.sub(r"^\S+ \S+ INFO train: ", "", line)
        for line in (reference_run / "log.txt").read_text().strip().splitlines()[-3:]
    ]
