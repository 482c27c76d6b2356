"""Two classes: both solvers fit sklearn's single-logit (sigmoid) model at C, not two softmax rows
(that is the single-logit problem at 2C), and report sklearn's binary objective. Checked against
plain scikit-learn LogisticRegression (newton-cholesky: another algorithm) and a numpy float64
objective on the bundled breast-cancer set, whose raw features span four orders of magnitude."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression

from evaluation.logreg import LogRegFit, Preconditioner, SklearnLBFGS, TorchLBFGS, c_grid
from evaluation.probe import best_C, holdout_split, run_probe

CS = c_grid(
    -5, -2, 4
)  # where L-BFGS converges on the raw features (larger C: ill-conditioned, 1000+ iterations)


@pytest.fixture(scope="module")
def cancer():
    d = load_breast_cancer()
    val = np.arange(len(d.target)) % 5 == 0
    return d.data[~val], d.target[~val], d.data[val], d.target[val]


def reference(x, y, C):
    return LogisticRegression(C=C, solver="newton-cholesky", tol=1e-12, max_iter=1000).fit(x, y)


def binary_objective(x, y, coef, intercept, C):
    """sklearn's (C sum log-loss + ||w||^2 / 2), divided by C n: the solvers' mean-scaled form."""
    z = x @ coef + intercept
    return float(np.mean(np.logaddexp(0.0, z) - y * z) + coef @ coef / (2.0 * C * len(y)))


@pytest.mark.parametrize(
    "solver", [TorchLBFGS(tol=1e-8), SklearnLBFGS(tol=1e-8)], ids=["torch", "sklearn"]
)
def test_both_solvers_fit_the_single_logit_model_at_C(cancer, solver):
    x, y, _, _ = cancer
    C = 1e-3
    ref = reference(x, y, C)
    fit = solver.fit(torch.from_numpy(x), torch.from_numpy(y), 2, C)
    assert (
        torch.all(fit.weight[0] == 0) and fit.bias[0] == 0
    )  # row 0 fixed at zero, through the preconditioner
    want = binary_objective(x, y, ref.coef_[0], ref.intercept_[0], C)
    assert fit.loss == pytest.approx(
        want, rel=1e-7
    )  # the reported loss is sklearn's binary objective at C
    coef = fit.weight[1].numpy()
    assert np.abs(coef - ref.coef_[0]).max() <= 1e-3 * np.abs(ref.coef_[0]).max()
    assert fit.bias[1].item() == pytest.approx(ref.intercept_[0], rel=1e-3, abs=1e-3)


def test_torch_warm_start_from_two_free_rows(cancer):
    # an init with both rows non-zero (e.g. the older symmetric pair) keeps its logit difference,
    # row 0 -> zero
    x, y, _, _ = cancer
    X, Y = torch.from_numpy(x), torch.from_numpy(y)
    cold = TorchLBFGS(tol=1e-8).fit(X, Y, 2, 1e-3)
    pair = LogRegFit(
        torch.stack([-cold.weight[1] / 2, cold.weight[1] / 2]),
        torch.stack([-cold.bias[1] / 2, cold.bias[1] / 2]),
        1e-3,
        0.0,
        0,
        0.0,
    )
    warm = TorchLBFGS(tol=1e-8).fit(X, Y, 2, 1e-3, init=pair)
    assert torch.all(warm.weight[0] == 0) and warm.n_iter <= 2
    assert warm.loss == pytest.approx(cold.loss, rel=1e-10)


def test_preconditioner_keeps_a_zero_row_zero():
    x = torch.randn(30, 4, dtype=torch.float64) * 5 + 9
    pre = Preconditioner.for_problem(x, 2, 0.1)
    weight = torch.stack([torch.zeros(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)])
    bias = torch.tensor([0.0, 1.5], dtype=torch.float64)
    V, b = pre.from_original(weight, bias)
    assert torch.all(V[0] == 0) and b[0] == 0
    W, b = pre.to_original(V, b)
    assert torch.all(W[0] == 0) and b[0] == 0


def test_whole_protocol_agrees_with_plain_sklearn(cancer):
    x, y, xv, yv = cancer
    fit_idx, hold_idx = (i.numpy() for i in holdout_split(len(y), 0.1, seed=0))
    curve = []
    for C in CS:
        ref = reference(x[fit_idx], y[fit_idx], C)
        curve.append(
            {
                "C": C,
                "holdout_top1": 100.0 * np.mean(ref.predict(x[hold_idx]) == y[hold_idx]),
                "loss": binary_objective(
                    x[fit_idx], y[fit_idx], ref.coef_[0], ref.intercept_[0], C
                ),
            }
        )
    chosen = best_C(curve)
    ref_top1 = 100.0 * np.mean(reference(x, y, chosen).predict(xv) == yv)
    X, Y, XV, YV = (torch.from_numpy(a) for a in (x, y, xv, yv))
    for solver in (TorchLBFGS(tol=1e-8), SklearnLBFGS(tol=1e-8)):
        result = run_probe(solver, X, Y, XV, YV, Cs=CS, progress=False)
        assert result.best_C == chosen and result.top1 == pytest.approx(ref_top1, abs=1e-9), (
            solver.name
        )
        for ours, theirs in zip(result.C_curve, curve):
            assert ours["holdout_top1"] == theirs["holdout_top1"]
            assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-6), (solver.name, ours["C"])
    assert ref_top1 > 85.0
