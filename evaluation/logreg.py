"""L2-regularised multinomial logistic regression: a full-batch L-BFGS solver in torch, and
scikit-learn's.

Both minimise scikit-learn's objective, written in its mean-scaled form

    f(W, b) = (1/n) * sum_i CE(W x_i + b, y_i) + ||W||^2 / (2 C n)        (= (C * sum CE + ||W||^2 / 2) / (C n))

with one weight row per class (the over-parametrised multinomial model sklearn fits) and an
unpenalised bias, so a value of C means the same thing for both and their losses are comparable. The
torch solver computes the loss and its gradient by hand over row chunks (no autograd graph, no (n,
K) tensor kept), so ImageNet-sized features (1.28M x 1024, bf16 or fp32) stay where they are; each
chunk is upcast to fp32 on the fly.

Both solve the same exactly-equivalent, better-conditioned problem (`Preconditioner`): raw features
(offsets and scales of real backbone features) otherwise leave plain L-BFGS at its iteration cap for
large C.

Two classes: the model is sklearn's (and the reference cuML's) single logit, stored as two rows with
row 0 fixed at zero (weight and bias): softmax over [0, w x + b] is the sigmoid and ||W||^2 =
||w||^2, so f is exactly sklearn's binary objective at the same C (two free softmax rows would be
the single-logit problem at 2C).
"""

import contextlib
import math
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from configs.eval_schema import (
    INEXACT_PRECISIONS,
    PRECISIONS,
)  # the torch solver's arithmetic, declared there


@dataclass
class LogRegFit:
    weight: Tensor  # (K, D), on the features' device
    bias: Tensor  # (K,)
    C: float
    loss: float  # the objective above at the solution
    n_iter: int
    seconds: float
    precision: str = "float64"  # arithmetic of the solve (`PRECISIONS`)
    # stopped by its tolerance, not by linear.max_iter (or the line search's evaluation budget, 2x
    # that): a fit stopped at the cap may sit above its optimum, and its hold-out accuracy is then
    # not the C's own
    converged: bool = True


def c_grid(min_power: float = -6.0, max_power: float = 5.0, n: int = 45) -> list[float]:
    """The reference's C values: 10 ** linspace(min_power, max_power, n) (45 values over 1e-6 ..
    1e5)."""
    return [float(c) for c in 10.0 ** np.linspace(min_power, max_power, n)]


MATMUL_MODES = {
    "float32": "ieee",
    "float32_3xtf32": "3xtf32",
    "float32_tf32": "tf32",
    "float64": "ieee",
}


@contextlib.contextmanager
def matmul_precision(name: str):
    """torch.set_float32_matmul_precision(name) inside ("highest": IEEE fp32; "high": TF32 on
    CUDA)."""
    previous = torch.get_float32_matmul_precision()
    if previous == name:
        yield
        return
    torch.set_float32_matmul_precision(name)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def split_tf32(x: Tensor) -> tuple[Tensor, Tensor]:
    """(hi, lo) of an fp32 tensor: hi = x with the low 13 of its 23 mantissa bits zeroed (exact in
    TF32's 10), lo = x - hi (exact in fp32: same exponent, at most 13 significant bits)."""
    hi = (x.view(torch.int32) & -8192).view(torch.float32)  # -8192 == ~0x1FFF
    return hi, x - hi


def addmm(
    c: Tensor,
    a: Tensor,
    b: Tensor,
    mode: str = "ieee",
    a_exact: bool = False,
    b_exact: bool = False,
) -> Tensor:
    """c + a @ b (c broadcast as torch.addmm). mode "ieee": IEEE fp32 (or float64) GEMM; "3xtf32":
    fp32 accuracy from TF32 GEMMs, a_hi b_hi + a_hi b_lo + a_lo b_hi (lo lo, ~2^-22 relative,
    dropped; an operand exactly representable in TF32, `*_exact`, e.g. upcast bf16 features, has no
    lo term: 2 GEMMs); "tf32": one TF32 GEMM (inexact, benchmarking only)."""
    if mode != "3xtf32" or a.dtype != torch.float32:
        with matmul_precision("high" if mode == "tf32" else "highest"):
            return torch.addmm(c, a, b)
    a_hi, a_lo = (a, None) if a_exact else split_tf32(a)
    b_hi, b_lo = (b, None) if b_exact else split_tf32(b)
    terms = [(x, y) for x, y in ((a_hi, b_lo), (a_lo, b_hi)) if x is not None and y is not None]
    terms.append((a_hi, b_hi))  # the large term last: the small ones are not lost in its rounding
    with matmul_precision("high"):
        out = torch.addmm(c, *terms[0])
        for x, y in terms[1:]:
            out.addmm_(x, y)
    return out


def feature_moments(X: Tensor, chunk: int = 65536) -> tuple[Tensor, float]:
    """Per-dimension mean (float64) and the mean per-dimension variance of the rows of X."""
    total = torch.zeros(X.shape[1], dtype=torch.float64, device=X.device)
    squares = torch.zeros((), dtype=torch.float64, device=X.device)
    for start in range(0, X.shape[0], chunk):
        xc = X[start : start + chunk].double()
        total += xc.sum(0)
        squares += xc.pow(2).sum()
    n = max(X.shape[0], 1)
    mean = total / n
    variance = float((squares / n - mean.pow(2).sum()) / max(X.shape[1], 1))
    return mean, max(variance, 0.0)


@dataclass
class Preconditioner:
    """An exact reparametrisation of the objective that L-BFGS converges on quickly for every C.

    W x + b = V (s (x - m)) + b'  with  W = s V  and  b = b' - W m:  features centred on the train
    mean m (the unpenalised bias absorbs it, which decouples bias from weights) and scaled by one
    scalar s. The penalty
    ||W||^2 / (2 C n) = ||V||^2 / (2 C' n) with C' = C / s^2, so the objective has the same value at matching
    points and the optimum maps back exactly. s is chosen so V's diagonal curvature (data + penalty,
    at uniform probabilities: (var + K / (C n)) / K) matches the bias's (1 / K).
    """

    mean: Tensor  # (D,) train-feature mean
    scale: float  # s

    @classmethod
    def for_problem(
        cls, X: Tensor, n_classes: int, C: float, chunk: int = 65536
    ) -> "Preconditioner":
        mean, variance = feature_moments(X, chunk)
        return cls(mean, 1.0 / math.sqrt(variance + n_classes / (C * X.shape[0])))

    def C(self, C: float) -> float:
        """C' of the preconditioned problem."""
        return C / self.scale**2

    def grad_tol(self, tol: float) -> float:
        """Stop tolerance on the preconditioned gradient s * dW: min(s, 1) * tol keeps the stop at
        least as strict as max |dW| <= tol (the bias gradient is unchanged)."""
        return tol * min(self.scale, 1.0)

    def transform(self, X: Tensor) -> Tensor:
        """s (x - m) row by row (materialised: for solvers that need the features themselves)."""
        return (X.to(self.mean.dtype) - self.mean) * self.scale

    def to_original(self, V: Tensor, b_prime: Tensor) -> tuple[Tensor, Tensor]:
        weight = V * self.scale
        return weight, b_prime - _shift(weight, self.mean)

    def from_original(self, weight: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
        return weight / self.scale, bias + _shift(weight, self.mean)


def _shift(weight: Tensor, center: Tensor) -> Tensor:
    """weight @ center in float64 (never TF32, whatever the global setting), in weight's dtype. A
    zero row gives 0: the binary model's fixed row stays zero through the preconditioner."""
    return (weight.double() @ center.double()).to(weight.dtype)


def objective_and_grad(
    X: Tensor,
    y: Tensor,
    weight: Tensor,
    bias: Tensor,
    C: float,
    chunk: int = 65536,
    need_grad: bool = True,
    center: Tensor | None = None,
    mode: str = "ieee",
) -> tuple[float, Tensor | None, Tensor | None]:
    """f(W, b) above and its gradient; X (n, D) any float dtype, y (n,) int64 on X's device; W (K,
    D), b (K,). With `center`, rows are x - center (the same model up to b -> b - W center, as the
    bias is unpenalised). `mode`: how the two GEMMs per chunk run in fp32 (`addmm`)."""
    n = X.shape[0]
    x_exact = X.dtype in (
        torch.bfloat16,
        torch.float16,
    )  # upcast to fp32, exact in TF32: no lo term
    ce_sum = torch.zeros((), dtype=torch.float64, device=X.device)
    grad_w = torch.zeros_like(weight) if need_grad else None
    grad_b = torch.zeros_like(bias) if need_grad else None
    # centring by algebra, never by a pass over X: W (x - c) + b = W x + (b - W c); d/dW adds
    # -sum(dlogits) c^T
    shifted_bias = bias - _shift(weight, center) if center is not None else bias
    for start in range(0, n, chunk):
        xc = X[start : start + chunk].to(weight.dtype)
        yc = y[start : start + chunk]
        logits = addmm(shifted_bias, xc, weight.t(), mode, a_exact=x_exact)
        lse = torch.logsumexp(logits, dim=1)
        ce_sum += (lse - logits.gather(1, yc[:, None]).squeeze(1)).sum(dtype=torch.float64)
        if need_grad:
            probs = logits.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
            probs[torch.arange(len(yc), device=X.device), yc] -= (
                1.0  # d CE / d logits = softmax - onehot
            )
            grad_w = addmm(grad_w, probs.t(), xc, mode, b_exact=x_exact)
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

    The problem it solves is `Preconditioner`'s (centred features, weights W = s V); without it,
    small C values take hundreds of iterations and large ones hit the cap. Centring is done by
    algebra in `objective_and_grad`, never by a pass over X. Stops after `max_iter` iterations or
    when max |gradient| <= `tol` (scipy's `pgtol`, which sklearn's lbfgs uses with the same
    objective scaling). `fit(..., init=previous)` warm-starts along a C path. `precision`
    (`PRECISIONS`, or `INEXACT_PRECISIONS` for benchmarks): "auto" is float64 (sklearn's) on CPU and
    for small problems on GPU, float32_3xtf32 for large GPU problems (n * D * K > FLOAT64_MAX_WORK,
    e.g. ImageNet). `dtype=torch.float32 / float64` is the older spelling of precision="float32" /
    "float64".
    """

    name = "torch"

    def __init__(
        self,
        max_iter: int = 1000,
        tol: float = 1e-6,
        history_size: int = 10,
        chunk: int = 65536,
        dtype: torch.dtype | None = None,
        precision: str = "auto",
    ):
        if precision not in PRECISIONS + INEXACT_PRECISIONS:
            raise ValueError(
                f"precision={precision!r} is not one of "
                f"{', '.join(PRECISIONS + INEXACT_PRECISIONS)}"
            )
        if dtype is not None:
            named = {torch.float32: "float32", torch.float64: "float64"}[dtype]
            if precision not in ("auto", named):
                raise ValueError(f"dtype={dtype} contradicts precision={precision!r}")
            precision = named
        self.max_iter, self.tol, self.history_size, self.chunk = max_iter, tol, history_size, chunk
        self.precision = precision

    FLOAT64_MAX_WORK = (
        1e10  # n * D * K: ~0.04 TFLOP per evaluation, milliseconds in float64 on a GPU
    )

    def resolve_precision(self, X: Tensor, n_classes: int) -> str:
        if self.precision != "auto":
            return self.precision
        large = X.shape[0] * X.shape[1] * n_classes > self.FLOAT64_MAX_WORK
        return "float32_3xtf32" if X.is_cuda and large else "float64"

    def fit(
        self, X: Tensor, y: Tensor, n_classes: int, C: float, init: LogRegFit | None = None
    ) -> LogRegFit:
        start = time.perf_counter()
        precision = self.resolve_precision(X, n_classes)
        dtype, mode = (
            (torch.float64 if precision == "float64" else torch.float32),
            MATMUL_MODES[precision],
        )
        binary = n_classes == 2  # sklearn's single logit: row 0 fixed at zero (module docstring)
        pre = Preconditioner.for_problem(X, n_classes, C, self.chunk)
        center = pre.mean.to(dtype)
        if init is not None:
            weight, bias = (
                init.weight.detach().to(X.device, dtype),
                init.bias.detach().to(X.device, dtype),
            )
            if binary:  # the same logit difference with row 0 at zero
                weight, bias = weight - weight[:1], bias - bias[:1]
            scaled, bias = pre.from_original(weight, bias)
        else:
            scaled = torch.zeros(n_classes, X.shape[1], dtype=dtype, device=X.device)
            bias = torch.zeros(n_classes, dtype=dtype, device=X.device)
        scaled.requires_grad_(True)
        bias.requires_grad_(True)
        optimizer = torch.optim.LBFGS(
            [scaled, bias],
            lr=1.0,
            max_iter=self.max_iter,
            max_eval=self.max_iter * 2,
            tolerance_grad=pre.grad_tol(self.tol),
            tolerance_change=1e-12,
            history_size=self.history_size,
            line_search_fn="strong_wolfe",
        )

        def closure() -> Tensor:
            # f at W = s V in original units (its value is the preconditioned objective's); d/dV = s
            # * d/dW
            loss, grad_w, grad_b = objective_and_grad(
                X,
                y,
                scaled.detach() * pre.scale,
                bias.detach(),
                C,
                self.chunk,
                center=center,
                mode=mode,
            )
            if binary:  # zero gradient on row 0: L-BFGS never moves it from zero
                grad_w[0], grad_b[0] = 0.0, 0.0
            scaled.grad, bias.grad = grad_w.mul_(pre.scale), grad_b
            return torch.tensor(loss, dtype=torch.float64)

        with torch.no_grad():
            optimizer.step(closure)
            weight, bias = pre.to_original(scaled.detach(), bias.detach())
            loss, _, _ = objective_and_grad(
                X, y, weight, bias, C, self.chunk, need_grad=False, mode=mode
            )
        state = optimizer.state[scaled]
        n_iter = int(state.get("n_iter", 0))
        converged = n_iter < self.max_iter and int(state.get("func_evals", 0)) < self.max_iter * 2
        return LogRegFit(
            weight, bias, C, loss, n_iter, time.perf_counter() - start, precision, converged
        )


class SklearnLBFGS:
    """scikit-learn's `LogisticRegression(solver="lbfgs")` (multinomial; one logit for two classes;
    float64), cold-started per C as the reference's cuML fits are, on `Preconditioner`'s problem:
    features s (x - m) and C' = C / s^2, with the coefficients mapped back to original units (the
    returned fit and its C are in original units). On raw features it hits `max_iter` for large C
    and stops at a worse loss than the torch solver. sklearn's gtol is the same as the torch
    solver's stop (max |gradient| <= min(s, 1) * tol on the preconditioned gradient); its ftol (64
    eps) is fixed by sklearn. Features are copied to host numpy: for small data only."""

    name = "sklearn"

    def __init__(self, max_iter: int = 1000, tol: float = 1e-6):
        self.max_iter, self.tol = max_iter, tol

    def fit(
        self, X: Tensor, y: Tensor, n_classes: int, C: float, init: LogRegFit | None = None
    ) -> LogRegFit:
        # scikit-learn only for this solver (the torch one is the default): its import takes a
        # moment
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.linear_model import LogisticRegression

        start = time.perf_counter()
        X64 = X.detach().cpu().double()
        pre = Preconditioner.for_problem(X64, n_classes, C)
        y_np = y.cpu().numpy()
        present = np.unique(y_np)
        clf = LogisticRegression(
            C=pre.C(C), solver="lbfgs", max_iter=self.max_iter, tol=pre.grad_tol(self.tol)
        )
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore", ConvergenceWarning
            )  # reported through n_iter == max_iter instead
            clf.fit(pre.transform(X64).numpy(), y_np)
        scaled = torch.zeros(n_classes, X.shape[1], dtype=torch.float64)
        bias = torch.zeros(n_classes, dtype=torch.float64)
        coef, intercept = torch.from_numpy(clf.coef_), torch.from_numpy(clf.intercept_)
        # sklearn's one logit for present[1] against present[0]: rows [0, coef]
        if len(present) == 2:
            coef = torch.cat([torch.zeros_like(coef), coef])
            intercept = torch.cat([torch.zeros_like(intercept), intercept])
        scaled[torch.from_numpy(present)], bias[torch.from_numpy(present)] = coef, intercept
        weight, bias = pre.to_original(scaled, bias)
        # classes absent from the train labels keep zero weights and a very negative bias (never
        # predicted)
        absent = torch.ones(n_classes, dtype=torch.bool)
        absent[torch.from_numpy(present)] = False
        bias[absent] = -1e4
        weight, bias = weight.to(X.device), bias.to(X.device)
        loss, _, _ = objective_and_grad(X, y, weight, bias, C, need_grad=False)
        n_iter = int(np.max(clf.n_iter_))
        return LogRegFit(
            weight,
            bias,
            C,
            loss,
            n_iter,
            time.perf_counter() - start,
            converged=n_iter < self.max_iter,
        )


def build_solver(
    name: str, max_iter: int, tol: float, history_size: int = 10, precision: str = "auto"
):
    """`sklearn`, `torch`, or `auto` (torch when CUDA is available or a float32 precision is asked
    for, else sklearn, which is float64 only)."""
    if name == "auto":
        name = (
            "torch"
            if torch.cuda.is_available() or precision not in ("auto", "float64")
            else "sklearn"
        )
    if name == "torch":
        return TorchLBFGS(
            max_iter=max_iter, tol=tol, history_size=history_size, precision=precision
        )
    if name == "sklearn":
        if precision not in ("auto", "float64"):
            raise ValueError(
                f"precision={precision!r} needs the torch solver: sklearn solves in float64"
            )
        return SklearnLBFGS(max_iter=max_iter, tol=tol)
    raise ValueError(f"solver={name!r} is not one of sklearn, torch, auto")


@torch.no_grad()
def topk_accuracy(
    X: Tensor, y: Tensor, fit: LogRegFit, ks=(1, 5), chunk: int = 65536
) -> dict[int, float]:
    """Percent of rows whose label is among the `k` largest logits, for each k (clipped to the class
    count)."""
    hits = {k: 0 for k in ks}
    for start in range(0, X.shape[0], chunk):
        xc = X[start : start + chunk].to(fit.weight.dtype)
        logits = addmm(fit.bias, xc, fit.weight.t())  # IEEE, whatever the global TF32 setting
        top = logits.topk(min(max(ks), logits.shape[1]), dim=1).indices
        match = top == y[start : start + chunk, None]
        for k in ks:
            hits[k] += int(match[:, :k].any(1).sum())
    return {k: 100.0 * hits[k] / max(X.shape[0], 1) for k in ks}
