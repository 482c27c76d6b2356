"""What a person reads from a run (all on the shared reference run, no training of their own): plain
periodic lines and no progress bar when stderr is not a terminal, the start-up summary, the dtype
actually used, the auto backend's dense fallback said once, TensorBoard events, metrics steps
counted as checkpoints count (older files still read), and a rerun of a finished run that says so
and rewrites nothing."""

import importlib.util
import json
import logging
import os
import re
import shutil

import pytest
import torch
from train_runs import TINY

from configs import load_config, scaled_lr
from reporting.run_logs import read_run
from rundir.metrics import read_metrics, steps_done
from sparsity.backends.auto import AutoBackend

TOTAL = 16  # TINY: 16 steps, switch to dense after 8, a metrics line per step, checkpoints every 3
HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None
PERIODIC = re.compile(r"^\S+ \S+ INFO train: step +(\d+)/16  phase (sparse|dense)  (.*)$", re.M)


def test_plain_periodic_lines_and_no_progress_bar_off_a_terminal(reference_run, reference_stderr):
    lines = PERIODIC.findall((reference_run / "log.txt").read_text())
    assert [int(step) for step, _, _ in lines] == list(range(1, TOTAL + 1))  # train.log_period=1
    assert [phase for _, phase, _ in lines] == ["sparse"] * 8 + ["dense"] * 8
    for _, _, rest in lines:
        for field in (
            "loss",
            "dino_local_crops_loss",
            "dino_global_crops_loss",
            "koleo_loss",
            "ibot_loss",
        ):
            assert re.search(rf"(^|  ){field} -?\d+\.\d{{4}}(  |$)", rest), (field, rest)
        assert re.search(
            r"  lr \d\.\d{3}e[-+]\d\d  .*images/s \d+\.\d  max mem \d+ MB  eta \d+:\d\d:\d\d$", rest
        ), rest
    # the same lines on the console (stderr, a pipe here as in a Slurm .err file), and no tqdm bar
    assert len(PERIODIC.findall(reference_stderr)) == TOTAL
    assert (
        "\r" not in reference_stderr
        and "it/s" not in reference_stderr
        and "s/it" not in reference_stderr
    )


def test_start_up_summary_and_the_dtype_actually_used_are_recorded(reference_run):
    log = (reference_run / "log.txt").read_text()
    info = json.loads((reference_run / "run_info.json").read_text())
    assert str(reference_run) not in json.dumps(
        info
    )  # the path is said, not recorded: run_info.json may be published
    cfg = load_config(reference_run / "config.yaml")
    assert cfg.train.amp_dtype == "bf16"  # config.yaml keeps the configured value ...
    assert (info["amp_dtype"], info["amp_dtype_configured"]) == (
        "float32",
        "bf16",
    )  # ... the run records the used one
    assert "WARNING training.numerics: train.amp_dtype=bf16 is not used on cpu" in log
    assert (info["device"], info["world_size"], info["global_batch"]) == ("cpu", 1, 8)
    from data import DigitsDataset

    assert (
        info["data_fingerprint"] == DigitsDataset(cfg.data.digits_image_size, "train").fingerprint
    )
    assert (info["dataset"], info["images"], info["classes"]) == ("digits", 1437, 10)
    assert "start-up: data: digits: 1,437 images, 10 classes" in log
    assert info["peak_lr"] == pytest.approx(scaled_lr(cfg, 1)) and info["param_dtype"] == "float32"
    assert info["student_params"] == info["trainable_params"] > info["backbone_params"] > 0
    assert (info["sparse_steps"], info["total_steps"], info["sparsity_backend"]) == (
        8,
        TOTAL,
        "auto",
    )
    for line in (
        f"start-up: run directory {reference_run}",
        f"start-up: device cpu (cpu), 1 process(es), torch {torch.__version__}",
        f"start-up: global batch 8 (1 x 8), peak lr {info['peak_lr']:.4g} (base_lr 0.004, "
        f"sqrt_wrt_1024)",
        "start-up: dtypes: parameters float32, autocast float32 (train.amp_dtype=bf16), residual "
        "stream "
        "float32 (train.residual_dtype=fp32), grad scaler off; "
        "torch.compile off",
        f"start-up: schedule: {TOTAL} steps, 2:4 weight sparse (student; teacher dense) for steps "
        f"1-8 of "
        f"{TOTAL} (sparse_fraction 0.5), then dense; backend auto, pruning tile_greedy; starting "
        f"at step 0",
    ):
        assert line in log, line
    # backend=auto on a CPU: dense, said once with the reason
    assert (
        log.count(
            "auto backend: cpu float32 -> dense for every layer (weights on cpu: cuSPARSELt runs "
            "only on "
            "CUDA GPUs)"
        )
        == 1
    )


def test_auto_backend_dense_fallback_is_logged_once_per_decision(caplog):
    auto = AutoBackend()  # a fresh instance: the process-wide one may have decided already
    with caplog.at_level(logging.INFO, logger="sparsity.backends.auto"):
        for shape in ((32, 16), (16, 32), (32, 16)):
            w = auto.sparsify(torch.randn(*shape), "tile_greedy")
            assert torch.equal(w.to_dense() == 0, ~w.mask())  # the dense backend's pruned weight
        assert (
            auto.choice_for_trace(
                torch.device("cpu"), torch.float32, 32, 16, 64, "tile_greedy", False
            )
            == "dense"
        )
        auto.sparsify(torch.randn(32, 16, dtype=torch.float64), "tile_greedy")
    said = [r.getMessage() for r in caplog.records if "auto backend" in r.getMessage()]
    assert said == [
        "auto backend: cpu float32 -> dense for every layer (weights on cpu: cuSPARSELt runs only "
        "on CUDA "
        "GPUs)",
        "auto backend: cpu float64 -> dense for every layer (weights on cpu: cuSPARSELt runs only "
        "on CUDA GPUs)",
    ]
    assert [(f["device"], f["dtype"], f["choice"]) for f in auto.describe()["fallbacks"]] == [
        ("cpu", "float32", "dense"),
        ("cpu", "float64", "dense"),
    ]


@pytest.mark.skipif(
    not HAS_TENSORBOARD,
    reason="the optional tensorboard package is not installed (pip install -e '.[tensorboard]')",
)
def test_tensorboard_event_files_beside_the_metrics(reference_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert list(reference_run.glob("events.out.tfevents.*"))
    events = EventAccumulator(str(reference_run))
    events.Reload()
    records = read_metrics(reference_run / "metrics.jsonl")
    for tag, key in (
        ("loss/loss", "loss"),
        ("loss/ibot_loss", "ibot_loss"),
        ("train/lr", "lr"),
        ("grad_norm/backbone", "grad_norm_backbone"),
    ):
        scalars = events.Scalars(tag)
        assert (
            [s.step for s in scalars] == [r["step"] for r in records] == list(range(1, TOTAL + 1))
        )
        assert [s.value for s in scalars] == pytest.approx([r[key] for r in records], rel=1e-6)


@pytest.mark.skipif(HAS_TENSORBOARD, reason="tensorboard is installed: event files are written")
def test_without_tensorboard_the_log_says_once_that_event_files_are_off(reference_run):
    log = (reference_run / "log.txt").read_text()
    assert (
        log.count(
            "TensorBoard event files are off: the optional `tensorboard` package is not installed"
        )
        == 1
    )
    assert not list(reference_run.glob("events.out.tfevents.*"))


def test_metrics_steps_count_the_steps_done_as_checkpoints_do(reference_run, tmp_path):
    records = read_metrics(reference_run / "metrics.jsonl")
    checkpoints = sorted(
        int(p.name[5:13]) for p in (reference_run / "checkpoints").glob("step_*.pt")
    )
    export = torch.load(reference_run / "teacher_backbone.pth", weights_only=True)
    assert records[-1]["step"] == checkpoints[-1] == export["step"] == TOTAL
    assert set(checkpoints) <= {r["step"] for r in records}
    by_step = {r["step"]: r["phase"] for r in records}
    assert (by_step[8], by_step[9]) == (
        "sparse",
        "dense",
    )  # "step 8: sparse -> dense switch": after 8 steps
    # Files written before counted from 0, without the "format" key: read as one step more, so that
    # an old run directory reads exactly as a new one.
    assert steps_done({"step": 7}) == steps_done({"step": 8, "format": 2}) == 8
    old = tmp_path / "old_run"
    old.mkdir()
    shutil.copy(reference_run / "config.yaml", old / "config.yaml")
    (old / "metrics.jsonl").write_text(
        "".join(
            json.dumps({**{k: v for k, v in r.items() if k != "format"}, "step": r["step"] - 1})
            + "\n"
            for r in records
        )
    )
    new_run, old_run = read_run(reference_run), read_run(old)
    assert new_run.steps_done == old_run.steps_done == TOTAL
    assert new_run.loss_terms == old_run.loss_terms and [s for s, _ in new_run.loss_curve] == list(
        range(1, TOTAL + 1)
    )
    assert (new_run.sparse_images_per_s, new_run.time_s) == pytest.approx(
        (old_run.sparse_images_per_s, old_run.time_s)
    )


def test_rerunning_a_finished_run_says_it_is_complete_and_rewrites_nothing(
    reference_run, tmp_path, monkeypatch, caplog
):
    import train

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    last = sorted((reference_run / "checkpoints").glob("step_*.pt"))[-1].name
    for name in ("config.yaml", "metrics.jsonl", "run_info.json", "log.txt"):
        shutil.copy2(reference_run / name, run / name)
    for name in (
        "teacher_backbone.pth",
        "teacher_backbone.pth.sha256",
        f"checkpoints/{last}",
        f"checkpoints/{last}.sha256",
    ):
        os.link(
            reference_run / name, run / name
        )  # large files shared: a rewrite would replace them (a new inode)
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size) for p in run.rglob("*")}
    for key in [
        k for k in os.environ if k.startswith("SLURM_") or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    ]:
        monkeypatch.delenv(key)  # one process, whatever launched the tests
    monkeypatch.setattr(
        train, "setup_logging", lambda output_dir, is_main: None
    )  # leave this process's logging
    with caplog.at_level(logging.INFO):
        assert train.main(["--output-dir", str(run), *TINY]) == 0
    assert (
        f"{run} is complete: checkpoint at step {TOTAL} of {TOTAL}, teacher exported" in caplog.text
    )
    # the one change: the lock file it held (taken whatever the command), created empty, never
    # written
    assert (run / ".lock").stat().st_size == 0
    assert {
        p: (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size)
        for p in run.rglob("*")
        if p.name != ".lock"
    } == before
