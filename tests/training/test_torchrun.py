"""train.py under torchrun (2 CPU processes, gloo): runs, checkpoints with its world size, resumes."""

import os
import subprocess
import sys

import pytest
import torch
from train_runs import REPO, TINY

from models.training.metrics import read_metrics


def _torchrun(out, *overrides):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "train.py"), "--output-dir", str(out), *TINY, *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.mark.slow
def test_two_process_run_checkpoints_and_resumes(tmp_path):
    _torchrun(tmp_path, "train.max_steps=3")
    state = torch.load(tmp_path / "checkpoints" / "step_00000003.pt", weights_only=True)
    assert state["world_size"] == 2 and state["step"] == 3
    _torchrun(tmp_path, "train.max_steps=5")
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]  # rank 0 alone writes; resumed at step 3
    assert all(r["phase"] == "sparse" for r in records)
