"""The optimizer side of a step, apart from the loop (trainer.py): AdamW over the reference's
parameter groups, the schedule values applied per group (lr and weight-decay multipliers, the last
layer's own lr), and gradient clipping per student module (as the reference: not one global
norm)."""

import torch

from configs import Config


def build_optimizer(
    param_groups: list[dict], cfg: Config, device: torch.device
) -> torch.optim.AdamW:
    """`param_groups`: `SSLMetaArch.get_params_groups()` (their "names" are for logging only)."""
    return torch.optim.AdamW(
        [{k: v for k, v in g.items() if k != "names"} for g in param_groups],
        betas=(cfg.optim.adamw_beta1, cfg.optim.adamw_beta2),
        # one fused kernel per parameter group on CUDA instead of foreach's separate passes (same
        # math, fp32); capturable (its step count on the device) when the whole step is a CUDA graph
        # (training/step_graph.py)
        **({"fused": True, "capturable": cfg.train.cuda_graph} if device.type == "cuda" else {}),
    )


def group_hyperparameters(group: dict, values: dict) -> tuple[float, float]:
    """(lr, weight decay) of one parameter group for the schedules' values of a step
    (`Schedules.at(step)`)."""
    lr = values["last_layer_lr"] if group["is_last_layer"] else values["lr"]
    return lr * group["lr_multiplier"], values["wd"] * group["wd_multiplier"]


def set_hyperparameters(optimizer: torch.optim.Optimizer, values: dict) -> None:
    """The schedules' values of a step into every parameter group."""
    for group in optimizer.param_groups:
        group["lr"], group["weight_decay"] = group_hyperparameters(group, values)


def clip_per_module(params_by_module: dict[str, list], max_norm: float) -> dict:
    """Clip each module's gradients to `max_norm` on its own; {"grad_norm_<module>": norm before
    clipping}."""
    norms = {}
    for name, all_params in params_by_module.items():
        params = [p for p in all_params if p.grad is not None]
        if params:
            norms[f"grad_norm_{name}"] = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return norms
