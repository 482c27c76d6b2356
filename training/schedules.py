"""Per-iteration hyper-parameter schedules, precomputed as arrays (the reference's CosineScheduler).

Everything is counted in iterations: an "epoch" is `train.epoch_length` iterations, whatever the
dataset size. Precomputed arrays make resuming trivial (index by step) and every value loggable.
"""

from dataclasses import dataclass

import numpy as np

from configs import Config, scaled_lr


def cosine_schedule(
    base_value: float,
    final_value: float,
    total_iters: int,
    warmup_iters: int = 0,
    start_warmup_value: float = 0.0,
    freeze_iters: int = 0,
) -> np.ndarray:
    """`freeze_iters` zeros, then a linear warm-up from `start_warmup_value`, then a cosine to
    `final_value`."""
    if freeze_iters + warmup_iters > total_iters:
        raise ValueError(
            f"freeze ({freeze_iters}) + warm-up ({warmup_iters}) iterations exceed {total_iters}"
        )
    freeze = np.zeros(freeze_iters)
    warmup = np.linspace(start_warmup_value, base_value, warmup_iters)
    iters = np.arange(total_iters - warmup_iters - freeze_iters)
    cosine = final_value + 0.5 * (base_value - final_value) * (
        1 + np.cos(np.pi * iters / max(len(iters), 1))
    )
    return np.concatenate((freeze, warmup, cosine))


def linear_then_constant(start: float, end: float, ramp_iters: int, total_iters: int) -> np.ndarray:
    ramp = np.linspace(start, end, min(ramp_iters, total_iters))
    return np.concatenate((ramp, np.full(total_iters - len(ramp), end)))


@dataclass(frozen=True)
class Schedules:
    lr: np.ndarray
    last_layer_lr: np.ndarray
    weight_decay: np.ndarray
    momentum: np.ndarray
    teacher_temp: np.ndarray
    pruned_decay_scale: np.ndarray  # the masked decay's share of `sparsity.pruned_decay` (its ramp)

    def at(self, step: int) -> dict:
        """Values for iteration `step`; past the end every schedule holds its final value."""
        i = min(step, len(self.lr) - 1)
        return {
            "lr": float(self.lr[i]),
            "last_layer_lr": float(self.last_layer_lr[i]),
            "wd": float(self.weight_decay[i]),
            "momentum": float(self.momentum[i]),
            "teacher_temp": float(self.teacher_temp[i]),
            "pruned_decay_scale": float(self.pruned_decay_scale[i]),
        }


def build_schedules(cfg: Config, world_size: int) -> Schedules:
    """The reference's `build_schedulers`: lr (warm-up + cosine; with `optim.lr_restart_at_switch`
    or `lr_restart_fraction` a second cosine from `lr_restart_peak` x the peak at that step), wd and
    momentum (cosine; its distance from 1 scaled by `cfg.momentum_scale`), teacher temperature
    (linear warm-up then constant), last-layer lr = lr with the first `freeze_last_layer_epochs`
    zeroed."""
    epoch = cfg.train.epoch_length
    total = cfg.total_steps
    peak_lr = scaled_lr(cfg, world_size)
    lr = cosine_schedule(
        peak_lr, cfg.optim.min_lr, total, warmup_iters=cfg.optim.warmup_epochs * epoch
    )
    restart = cfg.lr_restart_step
    if restart is not None:
        lr[restart:] = cosine_schedule(
            cfg.optim.lr_restart_peak * peak_lr, cfg.optim.min_lr, total - restart
        )
    last_layer_lr = lr.copy()
    last_layer_lr[: cfg.optim.freeze_last_layer_epochs * epoch] = 0.0
    return Schedules(
        lr=lr,
        last_layer_lr=last_layer_lr,
        weight_decay=cosine_schedule(cfg.optim.weight_decay, cfg.optim.weight_decay_end, total),
        momentum=_teacher_momentum(cfg),
        teacher_temp=linear_then_constant(
            cfg.teacher.warmup_teacher_temp,
            cfg.teacher.teacher_temp,
            cfg.teacher.warmup_teacher_temp_epochs * epoch,
            total,
        ),
        pruned_decay_scale=pruned_decay_share(cfg),
    )


def pruned_decay_share(cfg: Config) -> np.ndarray:
    """The masked decay's share of its strength per step: with `sparsity.pruned_decay_ramp`, (k + 1)
    / R at the sparse phase's k-th step for its first R = ramp x sparse steps (the first step already
    decays, the R-th at full strength); with `sparsity.pruned_decay_fade`, (F - 1 - j) / F at the
    j-th of its last F = fade x sparse steps (none at the last); 1 everywhere else (outside the
    sparse phase the converter decays nothing anyway)."""
    scale = np.ones(cfg.total_steps)
    start, end = cfg.dense_warmup_steps, cfg.sparse_steps
    ramp = round(cfg.sparsity.pruned_decay_ramp * (end - start))
    if ramp > 0:
        scale[start : start + ramp] = (np.arange(ramp) + 1) / ramp
    fade = round(cfg.sparsity.pruned_decay_fade * (end - start))
    if fade > 0:
        scale[end - fade : end] = (fade - 1 - np.arange(fade)) / fade
    return scale


def _teacher_momentum(cfg: Config) -> np.ndarray:
    """dinov2's cosine from `momentum_teacher` to `final_momentum_teacher` over the run; with
    `teacher.momentum_reference_steps`, 1 - m scaled so that the EMA's horizon is the same fraction
    of the run; with `teacher.momentum_restart_at_switch`, the cosine starts again at the first
    dense step and spans the dense steps; with `teacher.momentum_restart_fraction`, the same at that
    fraction of the steps (its dense control)."""
    t = cfg.teacher
    total = cfg.total_steps
    momentum = cosine_schedule(t.momentum_teacher, t.final_momentum_teacher, total)
    restart = cfg.momentum_restart_step
    if restart is not None:
        momentum[restart:] = cosine_schedule(
            t.momentum_teacher, t.final_momentum_teacher, total - restart
        )
    return 1.0 - (1.0 - momentum) * cfg.momentum_scale
