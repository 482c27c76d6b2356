"""What a 2:4 run's masks do, logged with the metrics: the student's MLP masks at every logged step,
and the loss across the sparse -> dense switch.

At each metrics line (`record`, where the trainer synchronises anyway; nothing per step) the
student's selected linears are pruned as the forward prunes them
(`sparsity.pruned_entries.MaskStats`): in total into metrics.jsonl as `mask_flip_rate` (share of
mask entries changed since the previous line), `pruned_share` (the pruned entries' share of sum |W|)
and `pruned_grad_to_weight` (RMS of their gradient, as the optimizer received it, over RMS of their
weight: the `sparsity.pruned_decay` at which the decay would equal it), and per layer into
sparsity_masks.jsonl and TensorBoard. Dense phases and dense runs are measured too (the mask a 2:4
pruning of the weights would take), which is what the sparse phase is compared with. The masks are
those of the weights after the logged step's update (the next forward's), so with
`sparsity.pruned_grad=masked` the few entries that flipped in that update show a gradient.

With `sparsity.pruning=soft_threshold` (S-STE), `soft_threshold_scale_ratio`: the mean over layers
of the frozen scale (computed once, when the layer was converted) over the scale that would fit the
current weights.

The switch: the mean loss of rank 0's last `log_period` sparse steps and of its first `log_period`
dense steps (`switch_loss_before`, `switch_loss_after`, `switch_loss_jump`, on the first line after
both), summed on the device step by step and read with that line. A run resumed inside those steps
reports no jump.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from configs.schema import has_switch
from rundir.metrics import FORMAT_KEY, METRICS_FORMAT, MetricsLog
from rundir.run_dir import RunDir
from sparsity import SparseThenDense
from sparsity.modules import SCALE_BUFFER
from sparsity.pruned_entries import MaskStats
from sparsity.pruning import soft_threshold_scale

logger = logging.getLogger(__name__)


class SwitchLoss:
    """Sums the loss over `window` steps on each side of the switch at step `switch` (0-based steps:
    the first dense step is `switch`), on the device."""

    def __init__(self, switch: int, window: int):
        self.switch, self.window = switch, window
        self.sums = [None, None]  # before, after
        self.counts = [0, 0]
        self.reported = False

    def observe(self, step: int, loss: torch.Tensor) -> None:
        side = (
            0
            if self.switch - self.window <= step < self.switch
            else (1 if self.switch <= step < self.switch + self.window else None)
        )
        if side is None or self.window <= 0:
            return
        loss = loss.detach().float()
        self.sums[side] = loss if self.sums[side] is None else self.sums[side] + loss
        self.counts[side] += 1

    def result(self) -> dict:
        """Once both windows are complete: the two means and their difference (then never again)."""
        if self.reported or self.window <= 0 or self.counts != [self.window, self.window]:
            return {}
        self.reported = True
        before, after = (float(s) / self.window for s in self.sums)
        return {
            "switch_loss_before": before,
            "switch_loss_after": after,
            "switch_loss_jump": after - before,
        }


class SparsityMonitor:
    """Mask statistics of `student` (the linears `converter` selects) and the switch's loss jump,
    for one run's metrics (rank 0 writes; `enabled` False: nothing is measured)."""

    def __init__(
        self,
        converter: SparseThenDense,
        student: nn.Module,
        output_dir: Path,
        total_steps: int,
        log_period: int,
        mask_dtype: torch.dtype | None,
        enabled: bool,
    ):
        self.enabled = enabled and converter.kind == "weight"
        self.converter, self.student = converter, student
        self.stats = MaskStats(converter.pruning, mask_dtype)
        self.masks_log = MetricsLog(RunDir(output_dir).masks_file, enabled=self.enabled)
        sparse = converter.sparse_steps
        window = (
            min(log_period, sparse, total_steps - sparse) if has_switch(sparse, total_steps) else 0
        )
        self.switch = SwitchLoss(sparse, window)

    def truncate_after(self, step: int) -> None:
        """On a (re)start, as metrics.jsonl: lines past the checkpoint go. Where the last line kept
        was logged at `step` itself, its masks are those of the weights just restored (bit-exactly):
        taken again, so that the next line's flip rate compares with them as the uninterrupted run's
        did, instead of being empty."""
        last = self.masks_log.truncate_after(step)
        if self.enabled and step > 0 and last == step:
            self.stats.update(
                {
                    name: m.weight
                    for name, m in self.converter.selected_linears(self.student).items()
                }
            )

    def observe_step(self, step: int, loss: torch.Tensor) -> None:
        """After each step (0-based `step`): the loss around the switch (a no-op elsewhere)."""
        if self.enabled:
            self.switch.observe(step, loss)

    def record(self, step: int, phase: str, progress=None) -> dict:
        """The metrics line's sparsity fields at `step` steps done; the per-layer line is written
        here."""
        if not self.enabled:
            return {}
        weights = {
            name: m.weight for name, m in self.converter.selected_linears(self.student).items()
        }
        report = self.stats.update(weights)
        fields = {
            "mask_flip_rate": report.total_flip_rate,
            "pruned_share": report.total_pruned_share,
            "pruned_grad_to_weight": report.total_grad_to_weight,
            **self.switch.result(),
            "soft_threshold_scale_ratio": self._scale_ratio(),
        }
        per_layer = {
            "flip_rate": report.flip_rate,
            "pruned_share": report.pruned_share,
            "grad_to_weight": report.grad_to_weight,
        }
        self.masks_log.write(
            {"step": step, FORMAT_KEY: METRICS_FORMAT, "phase": phase, **per_layer}
        )
        if progress is not None:
            progress.scalars("sparsity_layers", step, per_layer)
        if "switch_loss_jump" in fields:
            logger.info(
                "switch: mean loss %.4f over the last %d sparse steps, %.4f over the first %d "
                "dense steps "
                "(jump %+.4f)",
                fields["switch_loss_before"],
                self.switch.window,
                fields["switch_loss_after"],
                self.switch.window,
                fields["switch_loss_jump"],
            )
        return {k: v for k, v in fields.items() if v is not None}

    @torch.no_grad()
    def _scale_ratio(self) -> float | None:
        """S-STE's frozen scale over the one the current weights would give, averaged over the
        converted layers."""
        ratios = [
            getattr(m, SCALE_BUFFER) / soft_threshold_scale(m.weight)
            for m in self.student.modules()
            if SCALE_BUFFER in m._buffers
        ]
        return float(torch.stack(ratios).mean()) if ratios else None
