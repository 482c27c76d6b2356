"""After a resume, the first metrics line's mask flip rate equals the uninterrupted run's: the line
logged at the checkpoint compared masks that are those of the weights restored, so the resumed
monitor takes them again instead of reporting no flip rate (null where the uninterrupted run had a
value)."""

import copy

import torch
from torch import nn

from sparsity.converter import SparseThenDense
from training.sparsity_monitor import SparsityMonitor


def _monitor(student, run_dir, converter):
    return SparsityMonitor(
        converter, student, run_dir, total_steps=40, log_period=10, mask_dtype=None, enabled=True
    )


def _step(student, seed):
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed)
        for p in student.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))


def test_the_first_line_after_a_resume_has_the_uninterrupted_flip_rate(tmp_path):
    torch.manual_seed(0)
    student = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
    converter = SparseThenDense(30, modules=r"0|2", backend="dense")
    uninterrupted = _monitor(student, tmp_path / "a", converter)
    (tmp_path / "a").mkdir()
    uninterrupted.record(10, "sparse")
    checkpoint = copy.deepcopy(student.state_dict())  # the checkpoint at step 10, after its line
    _step(student, 1)
    expected = uninterrupted.record(20, "sparse")["mask_flip_rate"]
    assert expected > 0

    resumed_dir = tmp_path / "b"
    resumed_dir.mkdir()
    first = _monitor(student, resumed_dir, converter)
    student.load_state_dict(checkpoint)
    first.record(10, "sparse")  # the interrupted run's line at step 10 (its masks log holds it)
    restarted = _monitor(student, resumed_dir, converter)  # a new process: no masks in memory
    restarted.truncate_after(10)
    _step(student, 1)
    assert restarted.record(20, "sparse")["mask_flip_rate"] == expected
