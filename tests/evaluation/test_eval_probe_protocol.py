"""The reference protocol around the solver: hold-out split, C grid, best-C rule, refit on all train
features."""

import math

import pytest
import torch
from sklearn.datasets import load_digits

from evaluation.logreg import TorchLBFGS, c_grid
from evaluation.probe import best_C, holdout_split, run_probe


def test_c_grid_is_the_reference_grid():
    Cs = c_grid()
    assert len(Cs) == 45
    assert Cs[0] == pytest.approx(1e-6) and Cs[-1] == pytest.approx(1e5)
    ratios = [b / a for a, b in zip(Cs, Cs[1:])]
    assert all(r == pytest.approx(10 ** (11 / 44)) for r in ratios)


def test_holdout_split_is_a_fixed_random_tenth():
    fit, hold = holdout_split(1437, 0.1, seed=0)
    assert len(hold) == 143 and len(fit) == 1437 - 143
    assert sorted(torch.cat([fit, hold]).tolist()) == list(range(1437))
    again_fit, again_hold = holdout_split(1437, 0.1, seed=0)
    assert torch.equal(hold, again_hold) and torch.equal(fit, again_fit)
    assert not torch.equal(hold, holdout_split(1437, 0.1, seed=1)[1])
    assert hold.max() > 1000  # random, not the first rows
    with pytest.raises(ValueError, match="at least 2"):
        holdout_split(1, 0.1, seed=0)


def test_best_C_takes_the_smallest_C_among_ties():
    curve = [
        {"C": 0.1, "holdout_top1": 50.0},
        {"C": 1.0, "holdout_top1": 70.0},
        {"C": 10.0, "holdout_top1": 70.0},
    ]
    assert best_C(curve) == 1.0


class RecordingSolver(TorchLBFGS):
    def __init__(self):
        super().__init__(max_iter=200, tol=1e-5)
        self.calls = []

    def fit(self, X, y, n_classes, C, init=None):
        fit = super().fit(X, y, n_classes, C, init)
        self.calls.append(
            {"n": len(y), "C": C, "init_C": None if init is None else init.C, "fit": fit}
        )
        return fit


def test_sweep_on_the_fit_rows_then_refit_on_all_train_rows():
    d = load_digits()
    x, y = torch.tensor(d.data, dtype=torch.float32) / 16.0, torch.tensor(d.target)
    val = torch.arange(len(y)) % 5 == 0
    (tx, ty), (vx, vy) = (x[~val], y[~val]), (x[val], y[val])
    Cs = [1e-4, 1e-2, 1.0, 1e-3]  # given out of order: swept ascending
    solver = RecordingSolver()
    result = run_probe(solver, tx, ty, vx, vy, Cs=Cs, holdout_fraction=0.1, seed=0, progress=False)
    n_hold = int(len(ty) * 0.1)
    sweep, final = solver.calls[:-1], solver.calls[-1]
    assert [c["C"] for c in sweep] == sorted(Cs) and all(c["n"] == len(ty) - n_hold for c in sweep)
    assert [c["init_C"] for c in sweep] == [None, 1e-4, 1e-3, 1e-2]  # warm-started along the path
    assert [p["C"] for p in result.C_curve] == sorted(Cs)
    assert result.best_C == best_C(result.C_curve) and final["C"] == result.best_C
    assert final["n"] == len(ty)  # refit on all train features, hold-out included
    assert result.final is final["fit"]
    # the reported numbers are the refit model's on val
    logits = vx @ result.final.weight.float().t() + result.final.bias.float()
    top1 = 100.0 * (logits.argmax(1) == vy).float().mean().item()
    assert result.top1 == pytest.approx(top1, abs=1e-6) and result.top5 >= result.top1
    assert result.top1 > 90.0 and math.isfinite(result.C_curve[0]["loss"])
