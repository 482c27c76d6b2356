"""scripts/bench_scaling.py in its CPU smoke mode (gloo, 1 and 2 processes, a tiny model, a few
steps): the harness the GPU run uses, end to end, so that run is known to work before it is made."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from train_runs import REPO

TINY_MODEL = [
    "crops.global_crops_size=16",
    "crops.local_crops_size=8",
    "crops.local_crops_number=2",
    "dino.head_n_prototypes=64",
    "ibot.head_n_prototypes=64",
    "dino.head_hidden_dim=32",
    "ibot.head_hidden_dim=32",
    "dino.head_bottleneck_dim=16",
    "ibot.head_bottleneck_dim=16",
    "data.digits_image_size=24",
]


def _bench_module():
    spec = importlib.util.spec_from_file_location(
        "bench_scaling", REPO / "scripts" / "bench_scaling.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_cpu_smoke_run_writes_rows_curves_and_plot(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "scripts.bench_scaling",
        "--cpu",
        "--gpus",
        "1",
        "2",
        "--models",
        "small",
        "--small-batches",
        "4",
        "--warmup",
        "1",
        "--iters",
        "2",
        "--curve-steps",
        "3",
        "--curve-batch",
        "4",
        "--curve-workers",
        "0",
        "--out",
        str(tmp_path),
        *TINY_MODEL,
    ]
    result = subprocess.run(
        cmd,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    data = json.loads((tmp_path / "scaling_cpu.json").read_text())
    assert data["gpu"] == "cpu" and "vit_tiny" in data["model"]
    assert data["loss_curves"]["compiled"] is False  # eager curves unless --compiled-curves
    rows = {r["gpus"]: r for r in data["rows"]}
    assert sorted(rows) == [1, 2] and all(
        r["per_gpu_batch"] == 4 and r["images_per_s"] > 0 for r in rows.values()
    )
    assert rows[1]["efficiency"] == 1.0
    assert all(
        r["phase"] == "dense" and r["sparse_linears"] == 0 for r in rows.values()
    )  # the harness's default
    assert rows[2]["efficiency"] == pytest.approx(
        rows[2]["images_per_s"] / (2 * rows[1]["images_per_s"])
    )
    runs = {(c["gpus"], c["per_gpu_batch"], c["seed"]): c for c in data["loss_curves"]["runs"]}
    assert sorted(runs) == [(1, 8, 0), (1, 8, 1), (2, 4, 0)]
    assert all(len(c["loss"]) == len(c["koleo_loss"]) == 3 for c in runs.values())
    assert [c["quantity"] for c in data["loss_curves"]["comparisons"]] == [
        "loss",
        "loss - koleo_loss",
    ]
    assert (tmp_path / "scaling_cpu.png").stat().st_size > 0


def test_gpu_names_and_curve_plan():
    bench = _bench_module()
    assert bench.gpu_slug("NVIDIA H200") == "h200"
    assert bench.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert bench.gpu_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert bench.curve_plan(1, [1, 2, 4], 32) == [(64, 0), (64, 1), (128, 0), (128, 1)]
    assert bench.curve_plan(4, [1, 2, 4], 32) == [(32, 0)]
    with pytest.raises(SystemExit):
        bench.parse_args(["--gpus", "2", "4"])


@pytest.mark.parametrize(("fraction", "phase"), [(0, "dense"), (1, "sparse")])
def test_timed_rows_run_the_phase_they_name(tmp_path, fraction, phase):
    """A timed row trains in the phase of its config: with sparsity.sparse_fraction=1 the student's
    MLP linears are 2:4 (a new trainer is dense until the phase is entered, as the training loop
    does at its first step)."""
    import torch

    from configs import load_config
    from training.distributed import DistContext

    bench = _bench_module()
    cfg = load_config(
        REPO / "configs" / "default.yaml",
        [
            *bench.BENCH_OVERRIDES,
            *TINY_MODEL,
            "student.arch=vit_tiny",
            "train.batch_size_per_gpu=4",
            "train.num_workers=0",
            "train.compile=false",
            f"sparsity.sparse_fraction={fraction}",
        ],
    )
    row = bench.time_model(
        DistContext(0, 1, 0, torch.device("cpu")), cfg, warmup=0, iters=1, workdir=tmp_path
    )
    depth = 12  # vit_tiny's blocks, two MLP linears each
    assert row["phase"] == phase and row["sparse_linears"] == (2 * depth if fraction else 0)
    assert row["step_ms"] > 0 and "profile" not in row
