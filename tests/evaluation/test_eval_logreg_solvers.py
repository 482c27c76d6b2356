"""The torch L-BFGS solver and scikit-learn's minimise the same objective and agree on real data
(digits pixels)."""

import warnings

import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression

from evaluation.logreg import (
    Preconditioner,
    SklearnLBFGS,
    TorchLBFGS,
    c_grid,
    objective_and_grad,
    topk_accuracy,
)
from evaluation.probe import run_probe


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
        reference = (
            C * torch.nn.functional.cross_entropy(xc @ w.t() + b, y, reduction="sum")
            + 0.5 * w.pow(2).sum()
        ) / (C * len(y))
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
    top_ref, top_ours = (
        topk_accuracy(xv, yv, ref, ks=(1, 5)),
        topk_accuracy(xv, yv, ours, ks=(1, 5)),
    )
    assert abs(top_ref[1] - top_ours[1]) <= 0.1 and abs(top_ref[5] - top_ours[5]) <= 0.1


def test_preconditioner_maps_back_exactly():
    torch.manual_seed(0)
    x = torch.randn(40, 5, dtype=torch.float64) * 7.0 + 20.0
    y = torch.randint(0, 3, (40,))
    weight, bias = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    pre, C = Preconditioner.for_problem(x, 3, 0.2), 0.2
    V, b_prime = pre.from_original(weight, bias)
    # same logits, and the same objective value at C' = C / s^2 on the transformed features
    assert torch.allclose(pre.transform(x) @ V.t() + b_prime, x @ weight.t() + bias, atol=1e-10)
    assert objective_and_grad(pre.transform(x), y, V, b_prime, pre.C(C), need_grad=False)[
        0
    ] == pytest.approx(objective_and_grad(x, y, weight, bias, C, need_grad=False)[0], rel=1e-12)
    back = pre.to_original(V, b_prime)
    assert torch.allclose(back[0], weight, atol=1e-12) and torch.allclose(back[1], bias, atol=1e-12)


def test_sklearn_converges_on_badly_scaled_features(digits):
    # Backbone features carry large offsets and scales; on such raw features plain sklearn lbfgs
    # stops at its iteration cap well short of the optimum. The preconditioned problem converges to
    # the torch solver's optimum.
    x, y, xv, yv = (t * 64.0 + 300.0 if t.is_floating_point() else t for t in digits)
    C, max_iter, tol = 1e-4, 200, 1e-6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        plain = LogisticRegression(C=C, max_iter=max_iter, tol=tol).fit(
            x.double().numpy(), y.numpy()
        )
    plain_loss = objective_and_grad(
        x, y, torch.from_numpy(plain.coef_), torch.from_numpy(plain.intercept_), C, need_grad=False
    )[0]
    ours = TorchLBFGS(max_iter=max_iter, tol=tol).fit(x, y, 10, C)
    fit = SklearnLBFGS(max_iter=max_iter, tol=tol).fit(x, y, 10, C)
    assert plain.n_iter_.max() == max_iter and plain_loss > ours.loss * (
        1 + 1e-4
    )  # the case is a hard one
    assert fit.n_iter < max_iter and ours.n_iter < max_iter  # both converged
    assert fit.C == C and fit.loss == pytest.approx(ours.loss, rel=1e-6)
    assert abs(topk_accuracy(xv, yv, fit)[1] - topk_accuracy(xv, yv, ours)[1]) <= 0.1
    # the returned (original-unit) coefficients are sklearn's preconditioned ones mapped back: same
    # logits
    pre = Preconditioner.for_problem(x.double(), 10, C)
    preconditioned = LogisticRegression(C=pre.C(C), max_iter=max_iter, tol=pre.grad_tol(tol))
    preconditioned.fit(pre.transform(x).numpy(), y.numpy())
    logits_pre = torch.from_numpy(preconditioned.decision_function(pre.transform(xv).numpy()))
    logits = xv.double() @ fit.weight.t() + fit.bias
    assert torch.allclose(logits, logits_pre, rtol=1e-9, atol=1e-9)
    assert torch.equal(logits.argmax(1), logits_pre.argmax(1))


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
    # C grid restricted to the well-posed range (at C >= 10 raw digit pixels are separable and the
    # optimum is flat: any solver's stopping point is as good as another's there).
    x, y, xv, yv = digits
    Cs = c_grid(-4, 0, 5)
    ref = run_probe(SklearnLBFGS(max_iter=1000, tol=1e-7), x, y, xv, yv, Cs=Cs, progress=False)
    ours = run_probe(TorchLBFGS(max_iter=1000, tol=1e-7), x, y, xv, yv, Cs=Cs, progress=False)
    assert ours.best_C == ref.best_C
    assert abs(ours.top1 - ref.top1) <= 0.1 and abs(ours.top5 - ref.top5) <= 0.1
    for a, b in zip(ours.C_curve, ref.C_curve):
        assert a["C"] == b["C"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
        assert (
            abs(a["holdout_top1"] - b["holdout_top1"]) <= 1.0
        )  # at most one hold-out image (143 of them)
    assert ref.top1 > 90.0  # digits pixels are easy: the protocol is doing something


def test_a_fit_stopped_at_the_cap_says_so_and_sklearns_own_warning_agrees(digits):
    """`converged` against scikit-learn's own verdict: its ConvergenceWarning on the same problem
    (the solver's preconditioned features and tolerance, as SklearnLBFGS passes them), at a cap too
    small and one large enough."""
    x, y, _, _ = digits
    x64 = x.double()
    pre = Preconditioner.for_problem(x64, 10, 100.0)
    for max_iter in (5, 1000):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            LogisticRegression(
                C=pre.C(100.0), solver="lbfgs", max_iter=max_iter, tol=pre.grad_tol(1e-6)
            ).fit(pre.transform(x64).numpy(), y.numpy())
        sklearn_converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
        fit = SklearnLBFGS(max_iter=max_iter, tol=1e-6).fit(x, y, 10, 100.0)
        assert fit.converged is sklearn_converged
        assert sklearn_converged is (max_iter == 1000)
    capped = TorchLBFGS(max_iter=5, tol=1e-7).fit(x, y, 10, 100.0)
    assert (capped.converged, capped.n_iter) == (False, 5)
    assert TorchLBFGS(max_iter=1000, tol=1e-7).fit(x, y, 10, 1e-2).converged


def test_the_probe_names_the_C_values_whose_fits_hit_the_cap(digits, caplog):
    x, y, xv, yv = digits
    with caplog.at_level("WARNING", logger="evaluation.probe"):
        result = run_probe(
            TorchLBFGS(max_iter=8, tol=1e-7), x, y, xv, yv, Cs=c_grid(-4, 2, 4), progress=False
        )
    capped = [
        p["C"] for p in result.C_curve if p["n_iter"] >= 8
    ]  # by hand: every fit that used all 8 iterations
    assert capped and [p["C"] for p in result.C_curve if not p["converged"]] == capped
    assert "fits of the C sweep stopped at linear.max_iter=8 before converging" in caplog.text
    assert f"{capped[-1]:.3g}" in caplog.text and "Raise linear.max_iter" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="evaluation.probe"):
        run_probe(
            TorchLBFGS(max_iter=1000, tol=1e-7), x, y, xv, yv, Cs=c_grid(-4, -2, 3), progress=False
        )
    assert "before converging" not in caplog.text
