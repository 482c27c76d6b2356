"""StepChecks: per-step flags queued without a host read and resolved later, in step order, with the
values the step had (a non-finite loss or gradient norm, a stop request, skipped images)."""

import math

import torch

from training.distributed import DistContext
from training.step_checks import StepChecks

CPU = DistContext(0, 1, 0, torch.device("cpu"))


def test_flags_resolve_in_order_and_keep_the_newest_when_asked():
    checks = StepChecks(CPU)
    norms = {"grad_norm_backbone": torch.tensor(1.0)}
    checks.queue(
        0,
        torch.tensor(2.0),
        {"a": torch.tensor(1.0)},
        norms,
        stop_requested=False,
        corrupt_skipped=0,
    )
    checks.queue(
        1,
        torch.tensor(math.nan),
        {"a": torch.tensor(math.nan)},
        norms,
        stop_requested=True,
        corrupt_skipped=3,
    )
    checks.queue(2, torch.tensor(1.0), {}, {"grad_norm_backbone": torch.tensor(math.inf)}, False, 0)
    first = checks.resolve(keep_last=2)
    assert [f.step for f in first] == [0]
    assert not (first[0].nonfinite_loss or first[0].nonfinite_grad_norm or first[0].stop)
    rest = checks.resolve()
    assert [f.step for f in rest] == [1, 2] and checks.resolve() == []
    assert (
        rest[0].nonfinite_loss
        and rest[0].stop
        and rest[0].corrupt_skipped == 3
        and not rest[0].nonfinite_grad_norm
    )
    assert rest[1].nonfinite_grad_norm and not rest[1].nonfinite_loss
    assert math.isnan(rest[0].terms["a"].item())


def test_on_a_cpu_nothing_waits_for_a_later_step():
    checks = StepChecks(CPU)
    checks.queue(0, torch.tensor(1.0), {}, {}, False, 0)
    assert [f.step for f in checks.resolve_previous()] == [
        0
    ]  # a CUDA run would keep it for one step
