"""make_table on fake run directories: every state shows, the arithmetic holds, the published
columns appear only for the ViT-L/16 ImageNet setting, and the plots are written."""

import csv
import json
import subprocess
import sys

import matplotlib.image
import pytest
import torch
from reporting_runs import REPO, make_run

from reporting.plots import plot_accuracy
from reporting.run_logs import read_run
from reporting.table import build_rows, make_table


def _csv_rows(out):
    with open(out / "table.csv") as f:
        return {row["run"]: row for row in csv.DictReader(f)}


@pytest.fixture
def study(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "dense", 0.0, top1=90.0, sparse_images_per_s=64.0, dense_images_per_s=32.0)
    make_run(runs, "s70", 0.7, top1=88.5)
    make_run(runs, "s40_noeval", 0.4, result=None)
    make_run(
        runs,
        "s90_partial",
        0.9,
        steps_done=150,
        finished=False,
        result=None,
        log_tail="WARNING training.trainer: SIGTERM: checkpoint saved at step 150; rerun to resume",
    )
    make_run(
        runs,
        "s100_failed",
        1.0,
        steps_done=40,
        finished=False,
        result=None,
        log_tail="ERROR train: TrainingDiverged: non-finite loss at step 41 "
        "(dino_local_crops_loss=nan)",
    )
    make_run(runs, "s60_badeval", 0.6, result="{not json")
    return runs


def test_every_run_appears_with_its_state(study, tmp_path):
    out = tmp_path / "out"
    make_table(
        [study, tmp_path / "runs" / "s80_never_started"],
        out,
        plots=False,
        extra_notes=["Trained on a toaster."],
    )
    rows = _csv_rows(out)
    assert rows["dense"]["status"] == "complete"
    assert rows["s70"]["status"] == "complete"
    assert rows["s40_noeval"]["status"] == "no eval"
    assert rows["s90_partial"]["status"] == "partial (step 150 of 300, preempted)"
    assert rows["s100_failed"]["status"].startswith(
        "failed (TrainingDiverged: non-finite loss at step 41"
    )
    assert rows["s60_badeval"]["status"].startswith("eval unreadable (eval_linear.json:")
    assert rows["s80_never_started"]["status"] == "missing (no run directory)"
    assert len(rows) == 7
    table = (out / "table.md").read_text()
    for name in rows:
        assert name in table  # the per-run details list every run by name
    assert "partial (step 150 of 300, preempted)" in table and "no eval" in table
    assert "- Trained on a toaster." in table
    assert "Validation split: 360 images, so one image is 0.28 pp" in table
    # rows sorted by sparse fraction, the run without a known schedule last
    assert [r["run"] for r in _csv_rows(out).values()][-1] == "s80_never_started"


def test_delta_and_speedup_arithmetic(study, tmp_path):
    out = tmp_path / "out"
    make_table([study], out, plots=False)
    rows = _csv_rows(out)
    # dense: 300 steps * 32 images / 32 images/s = 300 s; 70%: 210 sparse steps at 64 img/s + 90
    # dense at 32 img/s
    assert float(rows["dense"]["time_s"]) == pytest.approx(300.0)
    assert float(rows["s70"]["sparse_time_s"]) == pytest.approx(105.0)
    assert float(rows["s70"]["dense_time_s"]) == pytest.approx(90.0)
    assert float(rows["s70"]["speedup"]) == pytest.approx(300.0 / 195.0, rel=1e-4)
    assert float(rows["s70"]["sparse_images_per_s"]) == pytest.approx(64.0)
    assert float(rows["s70"]["dense_images_per_s"]) == pytest.approx(32.0)
    assert float(rows["s70"]["images_per_s"]) == pytest.approx(300 * 32 / 195.0, rel=1e-4)
    assert float(rows["s70"]["delta_top1"]) == pytest.approx(-1.5)
    assert float(rows["s70"]["delta_knn_top1"]) == pytest.approx(-1.5)
    assert float(rows["s70"]["knn_top1_k200"]) == pytest.approx(84.5)
    assert rows["s40_noeval"]["delta_top1"] == ""  # no eval: no delta, but its speed-up is known
    assert float(rows["s40_noeval"]["speedup"]) == pytest.approx(
        300.0 / (120 * 0.5 + 180 * 1.0), rel=1e-4
    )
    # the partial run's speed-up is per step done: its 150 steps were all sparse (switch at 270),
    # 0.5 s each
    assert float(rows["s90_partial"]["speedup"]) == pytest.approx(2.0)
    summary = json.loads((out / "summary.json").read_text())
    assert {r["run"] for r in summary["rows"]} == set(rows)
    assert "published" not in summary  # the embedded default's runs: not the published setting


def _slow_first_window(run_dir, factor):
    """The run's first logged window `factor` times slower: compilation with a cold cache."""
    path = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[0]["images_per_s"] /= factor
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_speedup_leaves_compilation_out(tmp_path):
    """A dense reference that compiled for a long time (cold cache) does not make a sparse run with
    the same steady speeds look faster: the speed-up is at the phases' steady speeds, while the
    training time keeps every window."""
    runs = tmp_path / "runs"
    dense = make_run(runs, "dense", 0.0, sparse_images_per_s=32.0, dense_images_per_s=32.0)
    make_run(runs, "s70", 0.7, sparse_images_per_s=32.0, dense_images_per_s=32.0)
    _slow_first_window(dense, factor=41.0)  # 5 steps of 32 images: 5 s become 205 s
    out = tmp_path / "out"
    make_table([runs], out, plots=False)
    rows = _csv_rows(out)
    assert float(rows["dense"]["time_s"]) == pytest.approx(300.0 + 200.0)
    assert float(rows["s70"]["time_s"]) == pytest.approx(300.0)
    assert float(rows["s70"]["speedup"]) == pytest.approx(1.0)
    assert (
        "so compilation, which takes as long as the compiler's cache makes it, does not count"
        in (" ".join((out / "table.md").read_text().split()))
    )


def test_no_speedup_where_a_phase_has_no_steady_speed(tmp_path):
    """A phase with steps done but only its first window logged has no steady speed: no speed-up
    rather than one that holds its compilation."""
    runs = tmp_path / "runs"
    make_run(runs, "dense", 0.0)
    make_run(runs, "s90", 0.9, log_period=30)  # the dense phase's 30 steps: one window
    out = tmp_path / "out"
    make_table([runs], out, plots=False)
    rows = _csv_rows(out)
    assert rows["s90"]["dense_images_per_s"] == "" and rows["s90"]["speedup"] == ""
    assert float(rows["s90"]["time_s"]) > 0


def test_window_straddling_the_switch_is_split_by_steps(tmp_path):
    # log every 7 steps: the window of steps 203..209 is sparse, 210 onwards dense (switch at 210)
    run = read_run(make_run(tmp_path, "r", 0.7, log_period=7, result=None, finished=False))
    assert run.sparse_steps == 210
    covered = 294  # 42 windows of 7 steps
    assert run.timed_steps == covered
    assert run.sparse_time_s == pytest.approx(210 * 0.5)
    assert run.dense_time_s == pytest.approx((covered - 210) * 1.0)


def test_restarted_metrics_are_read_once(tmp_path):
    # a run killed at step 80 before its first checkpoint and started over appends to metrics.jsonl
    # from step 0
    run_dir = make_run(tmp_path, "r", 0.0, result=None)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text("\n".join(lines[:16] + ["{cut mid-wri"] + lines) + "\n")
    run = read_run(run_dir)
    assert (
        run.timed_steps == 300 and run.time_s == pytest.approx(300.0) and len(run.loss_curve) == 60
    )


def test_world_size_from_checkpoint_scales_time(tmp_path):
    # images/s is global: with 2 processes a step moves 64 images, so it takes twice as long at the
    # same rate
    one = read_run(make_run(tmp_path, "one", 0.0, result=None))
    assert one.global_batch == 32  # no checkpoint: the config's per-GPU batch on one process
    two = read_run(make_run(tmp_path, "two", 0.0, result=None, world_size=2))
    assert two.global_batch == 64 and two.time_s == pytest.approx(2 * one.time_s)
    # resumed on 2 processes with half the per-GPU batch (the same global batch): the newest
    # checkpoint tells
    half = make_run(tmp_path, "half", 0.0, result=None, world_size=1)
    torch.save(
        {"step": 300, "world_size": 2, "batch_size_per_gpu": 16},
        half / "checkpoints" / "step_00000300.pt",
    )
    assert read_run(half).global_batch == 32


def test_world_size_from_run_info_without_checkpoints(tmp_path):
    # a committed DDP run keeps no checkpoints: its run_info.json (2 processes) doubles the images a
    # step, so its global images/s mean twice the time a step, as the checkpoint says in the test
    # above
    one = read_run(make_run(tmp_path, "one", 0.0, result=None))
    ddp = make_run(tmp_path, "ddp", 0.0, result=None)
    (ddp / "run_info.json").write_text(
        json.dumps({"world_size": 2, "batch_size_per_gpu": one.global_batch})
    )
    two = read_run(ddp)
    assert two.global_batch == 2 * one.global_batch and two.time_s == pytest.approx(2 * one.time_s)
    # a cut or older run_info.json: the config's per-GPU batch on one process, as before
    for text in (
        '{"world_size": 2',
        json.dumps({"device": "cpu"}),
        json.dumps({"world_size": "two"}),
    ):
        (ddp / "run_info.json").write_text(text)
        assert read_run(ddp).global_batch == one.global_batch


def test_eval_variants_knn_only_and_bare_numbers(tmp_path):
    knn_only = {
        "top1": None,
        "top5": None,
        "best_C": None,
        "C_curve": [],
        "knn": {"20": {"top1": 77.0, "top5": 95.0}},
    }
    run = read_run(make_run(tmp_path, "knn_only", 0.5, result=knn_only))
    assert run.status == "complete" and run.top1 is None and run.knn_top1 == 77.0
    bare = read_run(
        make_run(tmp_path, "bare", 0.5, result={"top1": 80.0, "knn": {"20": 75.5, "10": "nan"}})
    )
    assert bare.top1 == 80.0 and bare.knn_top1 == 75.5
    wrong = read_run(make_run(tmp_path, "wrong", 0.5, result="[1, 2]"))
    assert wrong.status == "eval unreadable (eval_linear.json: not a JSON object)"


def test_no_dense_run_leaves_deltas_blank(tmp_path):
    make_run(tmp_path / "runs", "s70", 0.7)
    out = tmp_path / "out"
    make_table([tmp_path / "runs"], out, plots=False)
    row = _csv_rows(out)["s70"]
    assert row["delta_top1"] == "" and row["speedup"] == ""
    assert "No complete dense (0% sparse) run" in (out / "table.md").read_text()


def test_published_columns_only_for_the_vitl_imagenet_setting(tmp_path):
    vitl = tmp_path / "vitl"
    make_run(vitl, "dense", 0.0, vitl=True, log_period=1250, top1=80.0)
    make_run(vitl, "s40", 0.4, vitl=True, log_period=1250, top1=80.3)
    make_run(vitl, "s32", 0.32, vitl=True, log_period=1250, top1=80.1)
    make_run(vitl, "s50", 0.5, vitl=True, log_period=1250, top1=79.9)  # no published counterpart
    rows = {r.run: r for r in build_rows([read_run(p) for p in sorted(vitl.iterdir())])}
    assert rows["dense"].published_top1 == 82.8 and rows[
        "dense"
    ].published_delta_top1 == pytest.approx(0.0)
    assert (
        rows["s40"].published_top1 == 82.9 and rows["s32"].published_top1 == 82.9
    )  # the 40k-step (32%) row
    assert rows["s40"].published_delta_top1 == pytest.approx(0.1)
    assert rows["s50"].published_top1 is None
    assert rows["s40"].delta_top1 == pytest.approx(0.3)
    out = tmp_path / "out"
    make_table([vitl], out, plots=False)
    table = (out / "table.md").read_text()
    assert (
        "Published top-1 (%)" in table
        and "50k → 75k" in table
        and "Published reference" not in table
    )
    assert (
        json.loads((out / "summary.json").read_text())["published"]["rows"][1]["sparse_steps"]
        == 40_000
    )

    default = tmp_path / "default"
    make_run(default, "s40", 0.4)
    assert build_rows([read_run(default / "s40")])[0].published_top1 is None
    make_table([default], tmp_path / "out_default", plots=False)
    table = (tmp_path / "out_default" / "table.md").read_text()
    # the published ViT-L/16 ImageNet table is not appended beside runs of another model and data
    # set
    assert (
        "Published top-1 (%)" not in table
        and "Published reference" not in table
        and "82.8" not in table
    )
    assert "published" not in json.loads((tmp_path / "out_default" / "summary.json").read_text())


def _assert_drawn(path, min_width):
    image = matplotlib.image.imread(path)
    assert image.shape[1] >= min_width
    assert image[..., :3].std() > 0.05  # drawn on, not a blank canvas


def test_plots_are_written(study, tmp_path):
    out = tmp_path / "out"
    written = make_table([study], out)
    assert {p.name for p in written} >= {"top1_vs_sparsity.png", "loss_curves.png"}
    _assert_drawn(
        out / "top1_vs_sparsity.png", 1200
    )  # two panels: ours, and the published setting apart
    _assert_drawn(out / "loss_curves.png", 1200)
    from PIL import Image

    for name in (
        "top1_vs_sparsity.png",
        "loss_curves.png",
    ):  # palette PNGs: the results budget's 250 KB a figure
        with Image.open(out / name) as image:
            assert image.mode == "P" and len(image.getpalette()) <= 3 * 256
        assert (out / name).stat().st_size <= 250_000
    # the ViT-L/16 ImageNet setting: ours and the published curve on one axes
    make_run(tmp_path / "vitl", "s70", 0.7, vitl=True, log_period=1250)
    plot_accuracy(build_rows([read_run(tmp_path / "vitl" / "s70")]), tmp_path / "vitl.png")
    _assert_drawn(tmp_path / "vitl.png", 800)


def test_cli_reports_a_path_without_runs(tmp_path):
    (tmp_path / "empty").mkdir()
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "make_table.py"),
            str(tmp_path / "empty"),
            "--no-plots",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 2
    assert "neither a run directory" in result.stderr and str(tmp_path / "empty") in result.stderr
