"""Optimizer parameter groups (the reference's `dinov2/utils/param_groups.py`).

Per parameter:
- lr multiplier `layerwise_decay ** (L + 1 - layer_id)`: in a backbone (a module with `n_blocks` =
  L), names containing pos_embed / patch_embed / mask_token / cls_token / register_tokens are layer
  0, `blocks.{i}.` is layer i + 1, anything else (the final `norm`) L + 1; every parameter of a head
  is L + 1 (multiplier 1);
- times `patch_embed_lr_mult` for names containing "patch_embed";
- wd multiplier 0 for names ending ".bias" or containing "norm" or "gamma", else 1;
- `is_last_layer` for names containing "last_layer" (the trainer zeroes their lr during the
  last-layer freeze).
Groups are fused by (lr_multiplier, wd_multiplier, is_last_layer) within each student module, as the
reference (which builds groups per module: backbone, dino_head, ibot_head). Parameters with
requires_grad=False are skipped.
"""

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

logger = logging.getLogger(__name__)

_LAYER0 = ("pos_embed", "patch_embed", "mask_token", "cls_token", "register_tokens")
_FUSE_KEYS = ("lr_multiplier", "wd_multiplier", "is_last_layer")


def _clean(name: str) -> str:
    for tok in ("_fsdp_wrapped_module.", "_orig_mod.", "module."):
        name = name.replace(tok, "")
    return name


def _n_blocks(module: nn.Module) -> int:
    module = getattr(module, "_orig_mod", module)  # torch.compile wrapper
    if hasattr(module, "n_blocks"):
        return int(module.n_blocks)
    if hasattr(module, "blocks"):
        return len(module.blocks)
    return 0


def get_vit_lr_decay_rate(name: str, lr_decay_rate: float = 1.0, num_layers: int = 12) -> float:
    """Multiplier for a parameter named `name` inside a backbone of `num_layers` blocks (0 blocks: a
    head -> 1)."""
    layer_id = num_layers + 1
    if num_layers > 0:
        if any(tok in name for tok in _LAYER0):
            layer_id = 0
        elif "blocks." in name and "residual." not in name:
            layer_id = int(name[name.find("blocks.") :].split(".")[1]) + 1
    return lr_decay_rate ** (num_layers + 1 - layer_id)


def get_params_groups_with_decay(
    model: nn.Module, lr_decay_rate: float = 1.0, patch_embed_lr_mult: float = 1.0
) -> list[dict[str, Any]]:
    """One dict per trainable parameter: params, name, lr_multiplier, wd_multiplier,
    is_last_layer."""
    n_blocks = _n_blocks(model)
    groups = []
    for name, param in model.named_parameters():
        name = _clean(name)
        if not param.requires_grad:
            continue
        d = {
            "params": param,
            "name": name,
            "lr_multiplier": get_vit_lr_decay_rate(name, lr_decay_rate, num_layers=n_blocks),
            "wd_multiplier": 1.0,
            "is_last_layer": "last_layer" in name,
        }
        if name.endswith(".bias") or "norm" in name or "gamma" in name:
            d["wd_multiplier"] = 0.0
        if "patch_embed" in name:
            d["lr_multiplier"] *= patch_embed_lr_mult
        groups.append(d)
        logger.debug(
            "%s: lr_multiplier %s, wd_multiplier %s", name, d["lr_multiplier"], d["wd_multiplier"]
        )
    return groups


def fuse_params_groups(
    all_params_groups: Iterable[dict[str, Any]], keys=_FUSE_KEYS
) -> list[dict[str, Any]]:
    """Merges per-parameter dicts with equal `keys`; each fused group keeps `params` and their
    `names` in order."""
    fused: dict[tuple, dict[str, Any]] = {}
    for d in all_params_groups:
        ident = tuple(d[k] for k in keys)
        g = fused.setdefault(ident, {"params": [], "names": [], **{k: d[k] for k in keys}})
        g["params"].append(d["params"])
        g["names"].append(d["name"])
    return list(fused.values())


def build_param_groups(
    student: nn.ModuleDict | Mapping[str, nn.Module],
    layerwise_decay: float,
    patch_embed_lr_mult: float,
) -> list[dict[str, Any]]:
    """Fused groups for every student module (backbone, dino_head, ibot_head), ready for
    `torch.optim.AdamW(groups, betas=(beta1, beta2))`; the trainer sets each group's lr /
    weight_decay per step: lr = (last_layer_lr if is_last_layer else lr) * lr_multiplier,
    weight_decay = wd * wd_multiplier. Group names are prefixed with the module key (e.g.
    "backbone.blocks.0.mlp.fc1.weight")."""
    out = []
    for key, module in student.items():
        groups = get_params_groups_with_decay(module, layerwise_decay, patch_embed_lr_mult)
        for g in groups:
            g["name"] = f"{key}.{g['name']}"
        out += fuse_params_groups(groups)
    return out
