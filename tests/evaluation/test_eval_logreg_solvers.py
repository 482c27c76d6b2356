"""The torch L-BFGS solver and scikit-learn's minimise the same objective and agree on real data (digits pixels)."""

import pytest
import torch
from sklearn.datasets import load_digits

from models.evaluation.logreg import SklearnLBFGS, TorchLBFGS, c_grid, objective_and_grad, topk_accuracy
from models.evaluation.probe import run_probe


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    x, y = torch.tensor(d.data, dtype=torch.float32) / 16.0, torch.tensor(d.target)
    val = torch.arange(len(y)) % 5 == 0
    return x[~val], y[~val], x[val], y[val]


def test_objective_is_sklearns_scaling_and_gradient_is_exact():
    torch.manual_seed(0)
    x, y = torch.randn(50, 6, dtype=torch.float64) + 3.0, torch.randint(0, 4, (50,))
    C, center = 0.3, x.mean(0)
    for c in (None, center):  # plain, and the solver's centred parametrisation W (x - c) + b
        w = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
        b = torch.randn(4, dtype=torch.float64, requires_grad=True)
        xc = x if c is None else x - c
        # sklearn: C * sum CE + ||W||^2 / 2, bias unpenalised; ours is that divided by C n
        reference = (C * torch.nn.functional.cross_entropy(xc @ w.t() + b, y, reduction="sum")
                     + 0.5 * w.pow(2).sum()) / (C * len(y))
        reference.backward()
        loss, gw, gb = objective_and_grad(x, y, w.detach(), b.detach(), C, chunk=7, center=c)
        assert loss == pytest.approx(reference.item(), rel=1e-12)
        assert torch.allclose(gw, w.grad, atol=1e-12) and torch.allclose(gb, b.grad, atol=1e-12)


@pytest.mark.parametrize("C", [1e-4, 1e-2, 1.0])
def test_torch_and_sklearn_agree_per_C(digits, C):
    x, y, xv, yv = digits
    ref = SklearnLBFGS(max_iter=1000, tol=1e-8).fit(x, y, 10, C)
    ours = TorchLBFGS(max_iter=1000, tol=1e-8).fit(x, y, 10, C)
    assert ours.loss == pytest.approx(ref.loss, rel=1e-6)
    assert ours.loss <= ref.loss * (1 + 1e-9)  # at least as converged as the reference
    top_ref, top_ours = topk_accuracy(xv, yv, ref, ks=(1, 5)), topk_accuracy(xv, yv, ours, ks=(1, 5))
    assert abs(top_ref[1] - top_ours[1]) <= 0.1 and abs(top_ref[5] - top_ours[5]) <= 0.1


def test_torch_float32_is_close_too(digits):
    # The GPU path computes in float32 (CPU defaults to float64): same solution to ~1e-5.
    x, y, xv, yv = digits
    ref = SklearnLBFGS(max_iter=1000, tol=1e-8).fit(x, y, 10, 0.1)
    ours = TorchLBFGS(max_iter=1000, tol=1e-6, dtype=torch.float32).fit(x, y, 10, 0.1)
    assert ours.loss == pytest.approx(ref.loss, rel=1e-5)
    assert abs(topk_accuracy(xv, yv, ref)[1] - topk_accuracy(xv, yv, ours)[1]) <= 0.1


def test_warm_start_reaches_the_cold_start_optimum(digits):
    x, y, _, _ = digits
    cold = TorchLBFGS(tol=1e-8).fit(x, y, 10, 0.05)
    warm = TorchLBFGS(tol=1e-8).fit(x, y, 10, 0.05, init=TorchLBFGS(tol=1e-6).fit(x, y, 10, 0.01))
    assert warm.loss == pytest.approx(cold.loss, rel=1e-8)
    assert torch.allclose(warm.weight, cold.weight, atol=1e-3)


def test_whole_protocol_agrees(digits):
    # C grid restricted to the well-posed range (at C >= 10 raw digit pixels are separable and the optimum is
    # flat: any solver's stopping point is as good as another's there).
    x, y, xv, yv = digits
    Cs = c_grid(-4, 0, 5)
    ref = run_probe(SklearnLBFGS(max_iter=1000, tol=1e-7), x, y, xv, yv, Cs=Cs, progress=False)
    ours = run_probe(TorchLBFGS(max_iter=1000, tol=1e-7), x, y, xv, yv, Cs=Cs, progress=False)
    assert ours.best_C == ref.best_C
    assert abs(ours.top1 - ref.top1) <= 0.1 and abs(ours.top5 - ref.top5) <= 0.1
    for a, b in zip(ours.C_curve, ref.C_curve):
        assert a["C"] == b["C"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
        assert abs(a["holdout_top1"] - b["holdout_top1"]) <= 1.0  # at most one hold-out image (143 of them)
    assert ref.top1 > 90.0  # digits pixels are easy: the protocol is doing something
