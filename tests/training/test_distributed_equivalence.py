"""Data parallelism is numerically the single-process run: train.py under torchrun with 2 gloo
processes x 8 images equals 1 process x 16 images (loss curve and final teacher), through a
2-process resume, and a 2-process checkpoint continues in 1 process with the per-GPU batch doubled.

The comparison turns off what is per-rank by design (not by accident): drop-path draws (per-rank RNG
streams), KoLeo (nearest neighbours within each rank's batch, as the reference) and iBOT masks
(drawn per rank batch). Both phases run: 2:4-sparse MLPs (pruned from the dense weight inside
forward, under DDP) for 4 steps, then dense.
"""

import os
import shutil
import subprocess
import sys

import pytest
import torch
from train_runs import REPO, TINY, run_train

from rundir.metrics import read_metrics

STEPS = 8
SAME_GLOBAL_BATCH = [
    "optim.epochs=2",
    "student.drop_path_rate=0",
    "dino.koleo_loss_weight=0",
    "ibot.mask_sample_probability=0",
]
RESUMED_AT = (
    3  # a checkpoint of the 2-process run (checkpoint_period=3), before the switch at step 4
)


def torchrun(out, *overrides) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(REPO / "train.py"),
        "--output-dir",
        str(out),
        *TINY,
        *overrides,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = subprocess.run(
        cmd,
        cwd=REPO,
        env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("one_process")
    run_train(out, *SAME_GLOBAL_BATCH, "train.batch_size_per_gpu=16")
    return out


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """2 x 8 images, stopped after step 3 and resumed, still on 2 processes, to the end."""
    out = tmp_path_factory.mktemp("two_processes")
    torchrun(out, *SAME_GLOBAL_BATCH, f"train.max_steps={RESUMED_AT}")
    shutil.copytree(out, out.parent / "two_processes_at_3")
    torchrun(out, *SAME_GLOBAL_BATCH)
    return out


def assert_same_run(got, expected):
    a, b = read_metrics(got / "metrics.jsonl"), read_metrics(expected / "metrics.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1))
    assert [r["phase"] for r in a] == [r["phase"] for r in b] == ["sparse"] * 4 + ["dense"] * 4
    for key in (
        "loss",
        "dino_local_crops_loss",
        "dino_global_crops_loss",
        "ibot_loss",
        "lr",
        "grad_norm_backbone",
    ):
        torch.testing.assert_close(
            torch.tensor([r[key] for r in a]),
            torch.tensor([r[key] for r in b]),
            rtol=1e-5,
            atol=1e-6,
            msg=key,
        )
    ta = torch.load(got / "teacher_backbone.pth", weights_only=True)["backbone"]
    tb = torch.load(expected / "teacher_backbone.pth", weights_only=True)["backbone"]
    assert ta.keys() == tb.keys()
    for k in tb:
        torch.testing.assert_close(ta[k], tb[k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.slow
def test_two_processes_equal_one_process_with_the_same_global_batch(one_process, two_processes):
    state = torch.load(two_processes / "checkpoints" / f"step_{STEPS:08d}.pt", weights_only=True)
    assert (state["world_size"], state["batch_size_per_gpu"], state["samples_consumed"]) == (
        2,
        8,
        STEPS * 16,
    )
    assert len(state["rng"]) == 2 and not torch.equal(
        state["rng"][0]["torch"], state["rng"][1]["torch"]
    )
    assert f"resumed at step {RESUMED_AT}" in (two_processes / "log.txt").read_text()
    assert_same_run(two_processes, one_process)


@pytest.mark.slow
def test_two_process_checkpoint_resumes_in_one_process_with_double_batch(
    one_process, two_processes, tmp_path
):
    run = tmp_path / "resumed"
    shutil.copytree(two_processes.parent / "two_processes_at_3", run)
    result = run_train(run, *SAME_GLOBAL_BATCH, check=False)  # 1 x 8: another global batch, refused
    assert result.returncode != 0
    assert "global batch of 16 (2 processes x 8 per GPU)" in result.stderr
    assert "set train.batch_size_per_gpu=16" in result.stderr
    assert not (run / "checkpoints" / f"step_{STEPS:08d}.pt").exists()

    result = run_train(run, *SAME_GLOBAL_BATCH, "train.batch_size_per_gpu=16")
    assert f"resumed at step {RESUMED_AT}" in result.stderr
    assert "resumed on 1: data order preserved" in result.stderr
    assert_same_run(run, one_process)
