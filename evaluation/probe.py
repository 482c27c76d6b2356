"""The reference's logistic-regression protocol (dinov2 `eval/log_regression.py`) on precomputed
features.

Raw features (no L2 normalisation, no standardisation, as the reference); C swept over 45 values
log-spaced in 1e-6 .. 1e5 on a random 10% hold-out of the train features
(`torch.manual_seed(0)`-style fixed generator); the C with the best hold-out top-1 (the smallest on
ties) is refitted on all train features and scored on val.
"""

import logging
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from training.terminal import track

from .logreg import LogRegFit, c_grid, topk_accuracy

logger = logging.getLogger(__name__)


@dataclass
class ProbeResult:
    top1: float
    top5: float
    best_C: float
    C_curve: list[dict]  # {C, holdout_top1, loss, n_iter, converged, seconds} per C, in sweep order
    final: LogRegFit
    seconds: float


def holdout_split(n: int, fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """(fit indices, hold-out indices): a fixed-seed random `fraction` of range(n) held out (at
    least one row)."""
    if n < 2:
        raise ValueError(
            f"need at least 2 train features to hold some out for C selection, got {n}"
        )
    generator = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=generator)
    n_holdout = min(max(1, int(n * fraction)), n - 1)
    return perm[n_holdout:].sort().values, perm[:n_holdout].sort().values


def sweep_C(
    solver,
    X_fit: Tensor,
    y_fit: Tensor,
    X_hold: Tensor,
    y_hold: Tensor,
    n_classes: int,
    Cs: list[float],
    progress: bool = True,
    every: float = 0.1,
) -> tuple[list[dict], dict[float, LogRegFit]]:
    """Fit each C (small to large, each warm-started from the previous fit when the solver can use
    it) and score the hold-out. Returns the curve and the fits by C. `every`: the share of the fits
    between progress lines."""
    curve, fits, previous = [], {}, None
    for C in track(
        sorted(Cs),
        f"C sweep ({solver.name})",
        "fits",
        enabled=progress,
        every=every,
        say=logger.info,
    ):
        fit = solver.fit(X_fit, y_fit, n_classes, C, init=previous)
        acc = topk_accuracy(X_hold, y_hold, fit, ks=(1,))
        curve.append(
            {
                "C": C,
                "holdout_top1": acc[1],
                "loss": fit.loss,
                "n_iter": fit.n_iter,
                "converged": fit.converged,
                "seconds": round(fit.seconds, 4),
            }
        )
        fits[C] = previous = fit
        logger.debug(
            "C=%.3g hold-out top-1 %.2f%% loss %.5f (%d iterations)",
            C,
            acc[1],
            fit.loss,
            fit.n_iter,
        )
    return curve, fits


def unconverged_Cs(curve: list[dict]) -> list[float]:
    """The sweep's C values whose fit stopped at the iteration cap (curves written before
    `converged`: none)."""
    return [point["C"] for point in curve if point.get("converged") is False]


def convergence_warning(
    capped: list[float], n_fits: int, final: LogRegFit, max_iter: int | None
) -> str:
    """One line naming the fits that stopped at linear.max_iter, and what that means for the chosen
    C."""
    cap = f"linear.max_iter={max_iter}" if max_iter else "the iteration cap"
    shown = ", ".join(f"{c:.3g}" for c in capped[:8]) + (
        f", ... ({len(capped)} in all)" if len(capped) > 8 else ""
    )
    parts = []
    if capped:
        parts.append(
            f"{len(capped)} of {n_fits} fits of the C sweep stopped at {cap} before converging (C "
            f"= "
            f"{shown}): their hold-out accuracy may be below their C's own, so the choice of C can "
            f"differ "
            "from a converged sweep's"
        )
    parts.append(
        f"the final refit at C={final.C:.3g} "
        f"{'converged' if final.converged else 'stopped at the cap too'}"
        f" ({final.n_iter} iterations)"
    )
    return (
        "; ".join(parts)
        + f". Raise {cap.split('=')[0]} to fit them to the end (the reference also caps at 1000)"
    )


def best_C(curve: list[dict]) -> float:
    """The C of the highest hold-out top-1; the smallest such C (strongest regularisation) on
    ties."""
    best = max(point["holdout_top1"] for point in curve)
    return min(point["C"] for point in curve if point["holdout_top1"] == best)


def run_probe(
    solver,
    train_x: Tensor,
    train_y: Tensor,
    val_x: Tensor,
    val_y: Tensor,
    *,
    n_classes: int | None = None,
    Cs: list[float] | None = None,
    holdout_fraction: float = 0.1,
    seed: int = 0,
    progress: bool = True,
    every_fit: bool = False,
) -> ProbeResult:
    """The whole protocol: hold-out split, C sweep, refit on all train features with the best C, val
    top-1/top-5. `every_fit`: a progress line per fit of the sweep (slow fits, e.g. on raw pixels),
    not per tenth of it."""
    start = time.perf_counter()
    Cs = c_grid() if Cs is None else Cs
    n_classes = n_classes or int(max(train_y.max(), val_y.max())) + 1
    fit_idx, hold_idx = holdout_split(len(train_y), holdout_fraction, seed)
    fit_idx, hold_idx = fit_idx.to(train_x.device), hold_idx.to(train_x.device)
    curve, fits = sweep_C(
        solver,
        train_x[fit_idx],
        train_y[fit_idx],
        train_x[hold_idx],
        train_y[hold_idx],
        n_classes,
        Cs,
        progress,
        every=1 / len(Cs) if every_fit else 0.1,
    )
    chosen = best_C(curve)
    if progress:  # one more fit, on all the train features: as long as one of the sweep's
        logger.info("refitting the best C %.3g on all %d train features", chosen, len(train_y))
    final = solver.fit(train_x, train_y, n_classes, chosen, init=fits[chosen])
    acc = topk_accuracy(val_x, val_y, final, ks=(1, 5))
    logger.info("best C %.3g: val top-1 %.2f%%, top-5 %.2f%%", chosen, acc[1], acc[5])
    capped = unconverged_Cs(curve)
    if capped or not final.converged:
        logger.warning(
            "%s", convergence_warning(capped, len(curve), final, getattr(solver, "max_iter", None))
        )
    return ProbeResult(acc[1], acc[5], chosen, curve, final, time.perf_counter() - start)
