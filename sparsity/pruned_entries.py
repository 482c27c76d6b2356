"""The entries a 2:4 mask drops: what training does with them, and how to watch it.

Plain straight-through training (STE: the published recipe, and the default here) gives a pruned
entry the dense gradient dy^T x, full AdamW steps and no extra decay, so it keeps moving although
the forward never uses it: masks flip often (Hu et al., ICML 2024, "flip rate") and the pruned
entries drift to values the network never computed with, which enter at once at a sparse -> dense
switch. Two remedies act on those entries:

- masked gradient (`SemiSparseLinear(masked_grad=True)`, the converter's `pruned_grad="masked"`): dW
  * mask, so a pruned entry gets no gradient and AdamW's decoupled weight decay alone moves it
  (xFormers' first 2:4 training modes);
- masked decay (`decay_pruned_grads`, the converter's `pruned_decay`): after backward and clipping,
  before the optimizer step, grad += strength * (1 - mask) * W (SR-STE, Zhou et al. 2021; applied to
  the gradient under AdamW as Hu et al. do): a pull of the pruned entries towards zero, through the
  optimizer.

`MaskStats` measures, per layer and in total, the flip rate (share of mask entries changed since its
last call), the pruned entries' share of sum |W|, and the root mean square of their gradient over
that of their weight: the `strength` at which the masked decay would equal the gradient it is added
to. Both act on the mask the forward uses: the weight cast to the dtype the forward pruned in
(`mask_dtype`, e.g. bf16 under autocast), pruned with the module's method. One host synchronisation
per `MaskStats.update`, none in `decay_pruned_grads`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from sparsity.modules import SemiSparseLinear
from sparsity.options import PRUNED_GRADS, pruned_decay_problem
from sparsity.pruning import prune


def check_pruned_grad(name: str) -> str:
    if name not in PRUNED_GRADS:
        raise ValueError(f"pruned_grad={name!r} is not one of {', '.join(PRUNED_GRADS)}")
    return name


def check_pruned_decay(strength: float, pruning: str) -> float:
    """The masked decay's strength: a finite number >= 0, and 0 with a method that does not mask."""
    problem = pruned_decay_problem(strength, pruning)
    if problem:
        raise ValueError(problem)
    return float(strength)


def weight_mask(
    weight: torch.Tensor, method: str, mask_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The bool 2:4 mask of `weight` as the forward computes it: pruned with `method` after the cast
    to `mask_dtype` (default: the weight's own dtype)."""
    w = weight.detach()
    return prune(w if mask_dtype in (None, w.dtype) else w.to(mask_dtype), method)[1]


def sparse_weight_layers(modules: Iterable[tuple[str, nn.Module]]) -> dict[str, SemiSparseLinear]:
    """The weight-sparse 2:4 linears among (name, module) pairs, e.g. `model.named_modules()`."""
    return {name: m for name, m in modules if isinstance(m, SemiSparseLinear)}


@torch.no_grad()
def decay_pruned_grads(
    layers: Iterable[nn.Module],
    strength: float,
    mask_dtype: torch.dtype | None = None,
    scale: float | torch.Tensor = 1.0,
) -> int:
    """grad += strength * scale * (1 - mask) * W for each `SemiSparseLinear` in `layers` whose
    weight has a gradient; the mask is the one its forward used (`weight_mask`). `scale`: a step's
    share of the strength (a schedule's value; a 0-d tensor where a captured CUDA graph must read it
    from device memory). Call between backward (and clipping) and the optimizer step; on device, no
    host synchronisation. Returns the number of weights decayed."""
    done = 0
    if not strength:
        return done
    for m in layers:
        if not isinstance(m, SemiSparseLinear) or m.weight.grad is None:
            continue
        check_pruned_decay(strength, m.pruning)
        w = m.weight.detach()
        kept = weight_mask(w, m.pruning, mask_dtype)
        pruned = torch.where(kept, torch.zeros((), dtype=w.dtype, device=w.device), w)
        m.weight.grad.add_(pruned if _is_one(scale) else pruned * scale, alpha=strength)
        done += 1
    return done


def _is_one(scale) -> bool:
    return not isinstance(scale, torch.Tensor) and scale == 1.0


@dataclass
class MaskReport:
    """One `MaskStats.update`: per layer and in total. `flip_rate` is None where there was no
    earlier mask to compare with; `grad_to_weight` None where the weight has no gradient."""

    flip_rate: dict[str, float | None] = field(default_factory=dict)
    pruned_share: dict[str, float] = field(default_factory=dict)
    grad_to_weight: dict[str, float | None] = field(default_factory=dict)
    total_flip_rate: float | None = None
    total_pruned_share: float = float("nan")
    total_grad_to_weight: float | None = None


class MaskStats:
    """The 2:4 masks of named weights followed over time (see the module docstring):
    `update(weights)` compares each weight's current mask with the one of the previous call. Keeps
    one bool mask per weight on its device."""

    def __init__(self, method: str, mask_dtype: torch.dtype | None = None):
        self.method, self.mask_dtype = method, mask_dtype
        self.previous: dict[str, torch.Tensor] = {}

    def reset(self) -> None:
        """Forget the earlier masks: the next update reports no flip rate (e.g. after a phase
        change)."""
        self.previous = {}

    @torch.no_grad()
    def update(self, weights: dict[str, torch.Tensor]) -> MaskReport:
        names = list(weights)
        if not names:
            return MaskReport()
        # per layer: entries, flips, |W| pruned, |W| all, sum g^2 pruned, sum w^2 pruned (one
        # transfer for all)
        rows, has_prev, has_grad = [], [], []
        for name in names:
            w = weights[name]
            mask = weight_mask(w, self.method, self.mask_dtype)
            pruned = ~mask
            prev = self.previous.get(name)
            has_prev.append(prev is not None and prev.shape == mask.shape)
            flips = (mask != prev).sum() if has_prev[-1] else mask.new_zeros((), dtype=torch.long)
            a = w.detach().float().abs()
            g = getattr(w, "grad", None)
            has_grad.append(g is not None)
            g2 = (g.float().square() * pruned).sum() if g is not None else a.new_zeros(())
            rows.append(
                torch.stack(
                    [
                        a.new_full((), float(mask.numel())),
                        flips.float(),
                        (a * pruned).sum(),
                        a.sum(),
                        g2,
                        (a.square() * pruned).sum(),
                    ]
                )
            )
            self.previous[name] = mask
        values = torch.stack(rows).double().cpu()
        report = MaskReport()
        for i, name in enumerate(names):
            n, flips, pruned_abs, all_abs, g2, w2 = values[i].tolist()
            report.flip_rate[name] = flips / n if has_prev[i] else None
            report.pruned_share[name] = pruned_abs / all_abs if all_abs > 0 else float("nan")
            report.grad_to_weight[name] = (g2 / w2) ** 0.5 if has_grad[i] and w2 > 0 else None
        n, flips, pruned_abs, all_abs, g2, w2 = values.sum(0).tolist()
        if all(has_prev):
            report.total_flip_rate = flips / n
        report.total_pruned_share = pruned_abs / all_abs if all_abs > 0 else float("nan")
        if all(has_grad) and w2 > 0:
            report.total_grad_to_weight = (g2 / w2) ** 0.5
        return report
