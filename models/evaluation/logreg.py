"""L2-regularised multinomial logistic regression: a full-batch L-BFGS solver in torch, and scikit-learn's.

Both minimise scikit-learn's objective, written in its mean-scaled form

    f(W, b) = (1/n) * sum_i CE(W x_i + b, y_i) + ||W||^2 / (2 C n)        (= (C * sum CE + ||W||^2 / 2) / (C n))

with one weight row per class (the over-parametrised multinomial model sklearn fits) and an unpenalised bias, so a
value of C means the same thing for both and their losses are comparable. The torch solver computes the loss and
its gradient by hand over row chunks (no autograd graph, no (n, K) tensor kept), so ImageNet-sized features
(1.28M x 1024, bf16 or fp32) stay where they are; each chunk is upcast to fp32 on the fly.

Both solve the same exactly-equivalent, better-conditioned problem (`Preconditioner`): raw features (offsets and
scales of real backbone features) otherwise leave plain L-BFGS at its iteration cap for large C.
"""

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import Tensor


@dataclass
class LogRegFit:
    weight: Tensor  # (K, D), on the features' device
    bias: Tensor  # (K,)
    C: float
    loss: float  # the objective above at the solution
    n_iter: int
    seconds: float


def c_grid(min_power: float = -6.0, max_power: float = 5.0, n: int = 45) -> list[float]:
    """The reference's C values: 10 ** linspace(min_power, max_power, n) (45 values over 1e-6 .. 1e5)."""
    return [float(c) for c in 10.0 ** np.linspace(min_power, max_power, n)]


@contextlib.contextmanager
def tf32_matmuls(enabled: bool):
    """fp32 matmuls on TF32 tensor cores inside (bf16 features are exact in TF32; the weights round to 10 bits)."""
    if not enabled:
        yield
        return
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def feature_moments(X: Tensor, chunk: int = 65536) -> tuple[Tensor, float]:
    """Per-dimension mean (float64) and the mean per-dimension variance of the rows of X."""
    total = torch.zeros(X.shape[1], dtype=torch.float64, device=X.device)
    squares = torch.zeros((), dtype=torch.float64, device=X.device)
    for start in range(0, X.shape[0], chunk):
        xc = X[start:start + chunk].double()
        total += xc.sum(0)
        squares += xc.pow(2).sum()
    n = max(X.shape[0], 1)
    mean = total / n
    variance = float((squares / n - mean.pow(2).sum()) / max(X.shape[1], 1))
    return mean, max(variance, 0.0)


@dataclass
class Preconditioner:
    """An exact reparametrisation of the objective that L-BFGS converges on quickly for every C.

    W x + b = V (s (x - m)) + b'  with  W = s V  and  b = b' - W m:  features centred on the train mean m (the
    unpenalised bias absorbs it, which decouples bias from weights) and scaled by one scalar s. The penalty
    ||W||^2 / (2 C n) = ||V||^2 / (2 C' n) with C' = C / s^2, so the objective has the same value at matching
    points and the optimum maps back exactly. s is chosen so V's diagonal curvature (data + penalty, at uniform
    probabilities: (var + K / (C n)) / K) matches the bias's (1 / K).
    """

    mean: Tensor  # (D,) train-feature mean
    scale: float  # s

    @classmethod
    def for_problem(cls, X: Tensor, n_classes: int, C: float, chunk: int = 65536) -> "Preconditioner":
        mean, variance = feature_moments(X, chunk)
        return cls(mean, 1.0 / math.sqrt(variance + n_classes / (C * X.shape[0])))

    def C(self, C: float) -> float:
        """C' of the preconditioned problem."""
        return C / self.scale ** 2

    def grad_tol(self, tol: float) -> float:
        """Stop tolerance on the preconditioned gradient s * dW: min(s, 1) * tol keeps the stop at least as strict
        as max |dW| <= tol (the bias gradient is unchanged)."""
        return tol * min(self.scale, 1.0)

    def transform(self, X: Tensor) -> Tensor:
        """s (x - m) row by row (materialised: for solvers that need the features themselves)."""
        return (X.to(self.mean.dtype) - self.mean) * self.scale

    def to_original(self, V: Tensor, b_prime: Tensor) -> tuple[Tensor, Tensor]:
        weight = V * self.scale
        return weight, b_prime - weight @ self.mean.to(weight.dtype)

    def from_original(self, weight: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
        return weight / self.scale, bias + weight @ self.mean.to(weight.dtype)


def objective_and_grad(X: Tensor, y: Tensor, weight: Tensor, bias: Tensor, C: float, chunk: int = 65536,
                       need_grad: bool = True, center: Optional[Tensor] = None
                       ) -> tuple[float, Optional[Tensor], Optional[Tensor]]:
    """f(W, b) above and its gradient; X (n, D) any float dtype, y (n,) int64 on X's device; W (K, D), b (K,).
    With `center`, rows are x - center (the same model up to b -> b - W center, as the bias is unpenalised)."""
    n = X.shape[0]
    ce_sum = torch.zeros((), dtype=torch.float64, device=X.device)
    grad_w = torch.zeros_like(weight) if need_grad else None
    grad_b = torch.zeros_like(bias) if need_grad else None
    # centring by algebra, never by a pass over X: W (x - c) + b = W x + (b - W c); d/dW adds -sum(dlogits) c^T
    shifted_bias = bias - weight @ center if center is not None else bias
    for start in range(0, n, chunk):
        xc = X[start:start + chunk].to(weight.dtype)
        yc = y[start:start + chunk]
        logits = torch.addmm(shifted_bias, xc, weight.t())
        lse = torch.logsumexp(logits, dim=1)
        ce_sum += (lse - logits.gather(1, yc[:, None]).squeeze(1)).sum(dtype=torch.float64)
        if need_grad:
            probs = logits.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
            probs[torch.arange(len(yc), device=X.device), yc] -= 1.0  # d CE / d logits = softmax - onehot
            grad_w.addmm_(probs.t(), xc)
            grad_b += probs.sum(0)
    if need_grad and center is not None:
        grad_w.sub_(torch.outer(grad_b, center))
    penalty = weight.double().pow(2).sum() / (2.0 * C * n)
    loss = float(ce_sum / n + penalty)
    if need_grad:
        grad_w.div_(n).add_(weight, alpha=1.0 / (C * n))
        grad_b.div_(n)
    return loss, grad_w, grad_b


class TorchLBFGS:
    """Full-batch L-BFGS (`torch.optim.LBFGS`, strong-Wolfe line search) on the objective above.

    The problem it solves is `Preconditioner`'s (centred features, weights W = s V); without it, small C values
    take hundreds of iterations and large ones hit the cap. Centring is done by algebra in `objective_and_grad`,
    never by a pass over X.
    Stops after `max_iter` iterations or when max |gradient| <= `tol` (scipy's `pgtol`, which sklearn's lbfgs
    uses with the same objective scaling). `fit(..., init=previous)` warm-starts along a C path.
    Precision: parameters and per-chunk arithmetic in `dtype`; by default float64 (sklearn's precision) on CPU and
    for small problems on GPU, float32 for large GPU problems (n * D * K > FLOAT64_MAX_WORK, e.g. ImageNet), where
    `tf32=True` also runs the two matmuls per evaluation on TF32 tensor cores.
    """

    name = "torch"

    def __init__(self, max_iter: int = 1000, tol: float = 1e-6, history_size: int = 10, chunk: int = 65536,
                 dtype: Optional[torch.dtype] = None, tf32: bool = True):
        self.max_iter, self.tol, self.history_size, self.chunk = max_iter, tol, history_size, chunk
        self.dtype, self.tf32 = dtype, tf32

    FLOAT64_MAX_WORK = 1e10  # n * D * K: ~0.04 TFLOP per evaluation, milliseconds in float64 on a GPU

    def _dtype(self, X: Tensor, n_classes: int) -> torch.dtype:
        if self.dtype is not None:
            return self.dtype
        large = X.shape[0] * X.shape[1] * n_classes > self.FLOAT64_MAX_WORK
        return torch.float32 if X.is_cuda and large else torch.float64

    def fit(self, X: Tensor, y: Tensor, n_classes: int, C: float, init: Optional[LogRegFit] = None) -> LogRegFit:
        start = time.perf_counter()
        dtype = self._dtype(X, n_classes)
        pre = Preconditioner.for_problem(X, n_classes, C, self.chunk)
        center = pre.mean.to(dtype)
        if init is not None:
            scaled, bias = pre.from_original(init.weight.detach().to(X.device, dtype),
                                             init.bias.detach().to(X.device, dtype))
        else:
            scaled = torch.zeros(n_classes, X.shape[1], dtype=dtype, device=X.device)
            bias = torch.zeros(n_classes, dtype=dtype, device=X.device)
        scaled.requires_grad_(True)
        bias.requires_grad_(True)
        optimizer = torch.optim.LBFGS([scaled, bias], lr=1.0, max_iter=self.max_iter, max_eval=self.max_iter * 2,
                                      tolerance_grad=pre.grad_tol(self.tol), tolerance_change=1e-12,
                                      history_size=self.history_size, line_search_fn="strong_wolfe")

        def closure() -> Tensor:
            # f at W = s V in original units (its value is the preconditioned objective's); d/dV = s * d/dW
            loss, grad_w, grad_b = objective_and_grad(X, y, scaled.detach() * pre.scale, bias.detach(), C,
                                                      self.chunk, center=center)
            scaled.grad, bias.grad = grad_w.mul_(pre.scale), grad_b
            return torch.tensor(loss, dtype=torch.float64)

        with tf32_matmuls(X.is_cuda and self.tf32 and dtype == torch.float32), torch.no_grad():
            optimizer.step(closure)
            weight, bias = pre.to_original(scaled.detach(), bias.detach())
            loss, _, _ = objective_and_grad(X, y, weight, bias, C, self.chunk, need_grad=False)
        n_iter = int(optimizer.state[scaled].get("n_iter", 0))
        return LogRegFit(weight, bias, C, loss, n_iter, time.perf_counter() - start)


class SklearnLBFGS:
    """scikit-learn's `LogisticRegression(solver="lbfgs")` (multinomial, float64), cold-started per C as
    the reference's cuML fits are, on `Preconditioner`'s problem: features s (x - m) and C' = C / s^2, with the
    coefficients mapped back to original units (the returned fit and its C are in original units). On raw
    features it hits `max_iter` for large C and stops at a worse loss than the torch solver. sklearn's gtol is
    the same as the torch solver's stop (max |gradient| <= min(s, 1) * tol on the preconditioned gradient);
    its ftol (64 eps) is fixed by sklearn. Features are copied to host numpy: for small data only."""

    name = "sklearn"

    def __init__(self, max_iter: int = 1000, tol: float = 1e-6):
        self.max_iter, self.tol = max_iter, tol

    def fit(self, X: Tensor, y: Tensor, n_classes: int, C: float, init: Optional[LogRegFit] = None) -> LogRegFit:
        import warnings

        from sklearn.exceptions import ConvergenceWarning
        from sklearn.linear_model import LogisticRegression

        start = time.perf_counter()
        X64 = X.detach().cpu().double()
        pre = Preconditioner.for_problem(X64, n_classes, C)
        y_np = y.cpu().numpy()
        present = np.unique(y_np)
        clf = LogisticRegression(C=pre.C(C), solver="lbfgs", max_iter=self.max_iter, tol=pre.grad_tol(self.tol))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # reported through n_iter == max_iter instead
            clf.fit(pre.transform(X64).numpy(), y_np)
        scaled = torch.zeros(n_classes, X.shape[1], dtype=torch.float64)
        bias = torch.zeros(n_classes, dtype=torch.float64)
        coef, intercept = torch.from_numpy(clf.coef_), torch.from_numpy(clf.intercept_)
        if len(present) == 2:  # sklearn fits one logit for two classes: expand to the symmetric pair
            coef, intercept = torch.cat([-coef / 2, coef / 2]), torch.cat([-intercept / 2, intercept / 2])
        scaled[torch.from_numpy(present)], bias[torch.from_numpy(present)] = coef, intercept
        weight, bias = pre.to_original(scaled, bias)
        # classes absent from the train labels keep zero weights and a very negative bias (never predicted)
        absent = torch.ones(n_classes, dtype=torch.bool)
        absent[torch.from_numpy(present)] = False
        bias[absent] = -1e4
        weight, bias = weight.to(X.device), bias.to(X.device)
        loss, _, _ = objective_and_grad(X, y, weight, bias, C, need_grad=False)
        n_iter = int(np.max(clf.n_iter_))
        return LogRegFit(weight, bias, C, loss, n_iter, time.perf_counter() - start)


def build_solver(name: str, max_iter: int, tol: float, history_size: int = 10):
    """`sklearn`, `torch`, or `auto` (torch when CUDA is available, else sklearn)."""
    if name == "auto":
        name = "torch" if torch.cuda.is_available() else "sklearn"
    if name == "torch":
        return TorchLBFGS(max_iter=max_iter, tol=tol, history_size=history_size)
    if name == "sklearn":
        return SklearnLBFGS(max_iter=max_iter, tol=tol)
    raise ValueError(f"solver={name!r} is not one of sklearn, torch, auto")


@torch.no_grad()
def topk_accuracy(X: Tensor, y: Tensor, fit: LogRegFit, ks=(1, 5), chunk: int = 65536) -> dict[int, float]:
    """Percent of rows whose label is among the `k` largest logits, for each k (clipped to the class count)."""
    hits = {k: 0 for k in ks}
    for start in range(0, X.shape[0], chunk):
        xc = X[start:start + chunk].to(fit.weight.dtype)
        logits = torch.addmm(fit.bias, xc, fit.weight.t())
        top = logits.topk(min(max(ks), logits.shape[1]), dim=1).indices
        match = top == y[start:start + chunk, None]
        for k in ks:
            hits[k] += int(match[:, :k].any(1).sum())
    return {k: 100.0 * hits[k] / max(X.shape[0], 1) for k in ks}
