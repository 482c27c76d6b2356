"""CPU tests of the step's FLOP count and MFU (scripts/benchmarks/flops.py), against FLOPs counted
by hand."""

from types import SimpleNamespace

import pytest
import torch

from scripts.benchmarks import flops as F
from tests.benchmarks.test_ledger import EMBED, HIDDEN, TOKENS, Model


def test_step_flops_by_hand():
    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.SGD(model.student.parameters(), lr=0.1)
    x = torch.randn(TOKENS, EMBED)

    def train_step(batch, values):
        model(batch).backward()
        opt.step()

    trainer = SimpleNamespace(
        model=model,
        train_step=train_step,
        settle_checks=lambda: None,
        sparsity=SimpleNamespace(selected_linears=lambda m: {"fc1": m.fc1, "fc2": m.fc2}),
    )
    got = F.step_flops(trainer, x, {})
    T, E, H = TOKENS, EMBED, HIDDEN
    mlp = 2 * (2 * T * E * H)  # fc1 and fc2, one GEMM each
    assert got["student_mlp"] == 3 * mlp  # forward, input and weight gradients
    assert got["teacher_mlp"] == mlp  # forward only
    qkv, head = 2 * T * E * E, 2 * T * E * 5
    # student qkv: forward + weight gradient (its input needs none); head: all three; teacher qkv:
    # forward
    assert got["total"] == 3 * mlp + 2 * qkv + 3 * head + mlp + qkv


def test_mfu_by_hand():
    flops = {"total": 10**12, "student_mlp": 6 * 10**11, "teacher_mlp": 10**11}
    dense = F.mfu(flops, step_ms=100.0, rate_tflops=20.0)
    assert dense["nominal_mfu"] == dense["executed_mfu"] == 0.5  # 10 TFLOP/s of 20
    sparse = F.mfu(
        flops, step_ms=100.0, rate_tflops=20.0, student_sparse_gemms=2, teacher_sparse=True
    )
    # half of 2/3 of the student's MLP FLOPs (0.2e12) and half of the teacher's (0.05e12) skipped
    assert (
        sparse["executed_tflop"] == 0.75
        and sparse["executed_mfu"] == 0.375
        and sparse["nominal_mfu"] == 0.5
    )
    # the weight gradient of one linear in two on 2:4 besides the forward and input gradient: half
    # of 2.5/3
    assert (
        F.mfu(flops, step_ms=100.0, rate_tflops=20.0, student_sparse_gemms=2.5)["executed_tflop"]
        == 0.75
    )
    with pytest.raises(ValueError, match="3 GEMMs"):
        F.mfu(flops, 1.0, 1.0, student_sparse_gemms=4)
