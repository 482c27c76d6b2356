"""Backbone state-dict conversion: ours <-> timm `VisionTransformer`, and from dinov2-format
checkpoints.

Our names are the reference's non-chunked names (`cls_token`, `pos_embed` (1, 1 + N, D) with a cls
entry, `register_tokens` (1, R, D), `mask_token` (1, D), `patch_embed.proj`,
`blocks.{i}.{norm1,attn.qkv,attn.proj,ls1.gamma, norm2,mlp.fc1,mlp.fc2,ls2.gamma}`, `norm`) and
timm's, except for the token layout:

- timm's `vit_*_dinov2` (no registers) has the same layout; it has no `mask_token`.
- timm's `vit_*_reg4_dinov2` uses `no_embed_class=True`: `pos_embed` (1, N, D) covers only patches,
  registers are `reg_token`. The reference adds `pos_embed[:, 0]` to the cls token and nothing to
  registers, so the exact conversion folds that entry into timm's `cls_token` (timm's own
  `_convert_dinov2` does the same) and, back, sets our cls pos entry to 0. A timm model with
  registers and `no_embed_class=False` (pos covers cls + registers + patches) is converted exactly
  too (the register entries are folded into `register_tokens`).

Readers accept: a path or a loaded object; containers `{"teacher": ...}` (the reference's eval
export), `{"model": ...}`, `{"state_dict": ...}`, `{"backbone": ...}` (our trainer's teacher
export), `{"student": ...}`; `module.` / `_orig_mod.` / `_fsdp_wrapped_module.` anywhere;
`teacher.backbone.` / `student.backbone.` / `backbone.` prefixes (heads and loss buffers are
dropped); BlockChunk names `blocks.{chunk}.{i}.` -> `blocks.{i}.`; timm layouts (above).
"""

import logging
import math
import re
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from configs.torch_env import ensure_torchvision_importable
from rundir.torch_files import load_verified

ensure_torchvision_importable()  # before timm, which imports torchvision (see configs/torch_env.py)

from timm.layers import Mlp  # noqa: E402

logger = logging.getLogger(__name__)

StateDict = dict[str, Tensor]

_WRAPPER_TOKENS = ("module.", "_orig_mod.", "_fsdp_wrapped_module.")
_NON_BACKBONE_PREFIXES = (
    "dino_head.",
    "ibot_head.",
    "dino_loss.",
    "ibot_patch_loss.",
    "koleo_loss.",
    "head.",
)
_CHUNK_RE = re.compile(r"^blocks\.(\d+)\.(\d+)\.(.*)$")


def _is_square(n: int) -> bool:
    return n >= 1 and math.isqrt(n) ** 2 == n


def _is_tensor_dict(obj: Any) -> bool:
    return (
        isinstance(obj, Mapping)
        and len(obj) > 0
        and all(isinstance(v, Tensor) for v in obj.values())
    )


def load_checkpoint_file(path) -> Any:
    """The object in a checkpoint file, on CPU: weights-only (tensors, numbers, plain containers and
    the few classes `rundir.torch_files.ALLOWED_GLOBALS` lists), digest-checked where one was
    recorded; never a full unpickle, which would run whatever code the file names (`UnsafeFile`,
    naming it)."""
    return load_verified(path)


# ours <-> timm
# --------------------------------------------------------------------------------------------------
def to_timm_state_dict(
    state_dict: Mapping[str, Tensor], no_embed_class: bool | None = None
) -> StateDict:
    """Ours -> timm `VisionTransformer` (`num_classes=0`). `no_embed_class` defaults to "has
    registers" (the layout of timm's reg4 dinov2 models); pass the target timm model's
    `no_embed_class` if it differs."""
    sd = {k: v for k, v in state_dict.items() if k != "mask_token"}
    regs = sd.pop("register_tokens", None)
    if no_embed_class is None:
        no_embed_class = regs is not None
    pos = sd["pos_embed"]
    if no_embed_class:
        sd["cls_token"] = sd["cls_token"] + pos[:, :1]
        sd["pos_embed"] = pos[:, 1:].clone()
    # timm's pos covers [cls, registers, patches]; ours gives registers no pos entry
    elif regs is not None:
        sd["pos_embed"] = torch.cat(
            [pos[:, :1], pos.new_zeros(1, regs.shape[1], pos.shape[2]), pos[:, 1:]], dim=1
        )
    if regs is not None:
        sd["reg_token"] = regs
    return sd


def from_timm_state_dict(
    state_dict: Mapping[str, Tensor], num_patches: int | None = None
) -> StateDict:
    """timm `VisionTransformer` -> ours. The classifier `head.*` is dropped; `mask_token` is not set
    (timm has none).

    The pos-embed layout is inferred from shapes; `num_patches` (the checkpoint's patch count, when
    known) settles the one ambiguous case (tiny grids where both readings are square)."""
    sd = {k: v for k, v in state_dict.items() if not k.startswith("head.")}
    for k in list(sd):
        if k.startswith("fc_norm.") or k.startswith("norm_pre.") or k.startswith("attn_pool."):
            raise ValueError(
                f"timm checkpoint has '{k}': only token-pooled ViTs without pre-norm convert "
                f"exactly"
            )
    regs = sd.pop("reg_token", None)
    n_reg = 0 if regs is None else regs.shape[1]
    pos = sd["pos_embed"]
    P = pos.shape[1]
    if num_patches is not None and P in (num_patches, 1 + n_reg + num_patches):
        no_embed_class = P == num_patches
    else:
        no_embed_class = _is_square(P)
    if no_embed_class:  # patches only
        sd["pos_embed"] = torch.cat([pos.new_zeros(1, 1, pos.shape[2]), pos], dim=1)
    elif n_reg and _is_square(P - 1 - n_reg):  # pos covers [cls, registers, patches]
        regs = regs + pos[:, 1 : 1 + n_reg]
        sd["pos_embed"] = torch.cat([pos[:, :1], pos[:, 1 + n_reg :]], dim=1)
    elif not _is_square(P - 1):
        raise ValueError(
            f"timm pos_embed with {P} entries and {n_reg} registers is not a square patch grid"
        )
    if regs is not None:
        sd["register_tokens"] = regs
    return sd


def timm_model_kwargs(backbone: nn.Module, no_embed_class: bool | None = None) -> dict[str, Any]:
    """kwargs for `timm.models.vision_transformer.VisionTransformer` equal to `backbone` (our
    DinoVisionTransformer)."""
    blk = backbone.blocks[0]
    grid = math.isqrt(backbone.pos_embed.shape[1] - 1)
    ls = getattr(blk.ls1, "gamma", None)
    kwargs: dict[str, Any] = dict(
        img_size=grid * backbone.patch_size,
        patch_size=backbone.patch_size,
        embed_dim=backbone.embed_dim,
        depth=len(backbone.blocks),
        num_heads=backbone.num_heads,
        mlp_ratio=blk.mlp.fc1.out_features / backbone.embed_dim,
        qkv_bias=blk.attn.qkv.bias is not None,
        init_values=1e-5 if ls is not None else None,
        num_classes=0,
        global_pool="token",
        reg_tokens=backbone.num_register_tokens,
        no_embed_class=(backbone.num_register_tokens > 0)
        if no_embed_class is None
        else no_embed_class,
    )
    if blk.attn.proj.bias is None:
        kwargs["proj_bias"] = False
    if blk.mlp.fc1.bias is None:
        kwargs["mlp_layer"] = partial(Mlp, bias=False)
    return kwargs


# any format -> ours
# --------------------------------------------------------------------------------------------------
def _unwrap(obj: Any, which: str) -> StateDict:
    if isinstance(obj, nn.Module):
        return dict(obj.state_dict())
    if _is_tensor_dict(obj):
        return dict(obj)
    if isinstance(obj, Mapping):
        for key in (
            which,
            "model",
            "state_dict",
            "backbone",
            "student" if which != "student" else "teacher",
        ):
            if key in obj and isinstance(obj[key], Mapping):
                return _unwrap(obj[key], which)
        tensors = {k: v for k, v in obj.items() if isinstance(v, Tensor)}
        if tensors:
            return tensors
    raise ValueError(f"cannot find a state dict in a checkpoint of type {type(obj).__name__}")


def from_dinov2_state_dict(state_dict: Mapping[str, Tensor], which: str = "teacher") -> StateDict:
    """Prefixes and BlockChunk names -> ours (already flat tensor dict, any of the reference's
    layouts)."""
    sd = {}
    for k, v in state_dict.items():
        for tok in _WRAPPER_TOKENS:
            k = k.replace(tok, "")
        sd[k] = v
    for prefix in (f"{which}.backbone.", "backbone."):
        if any(k.startswith(prefix) for k in sd):
            sd = {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}
            break
    sd = {k: v for k, v in sd.items() if not k.startswith(_NON_BACKBONE_PREFIXES)}
    if any(k.startswith(("student.", "teacher.")) for k in sd):
        raise ValueError("checkpoint holds student/teacher modules but no '<which>.backbone.' keys")
    out = {}
    for k, v in sd.items():
        m = _CHUNK_RE.match(k)
        # BlockChunk: blocks.{chunk}.{global index}.rest (chunks are padded with Identity to keep
        # indices)
        if m:
            k = f"blocks.{m.group(2)}.{m.group(3)}"
        if re.match(r"blocks\.\d+\.mlp\.(w12|w3)\.", k):
            raise ValueError(
                f"'{k}': SwiGLU FFN checkpoints are not supported (student.ffn_layer is 'mlp' only)"
            )
        out[k] = v
    return out


def convert_to_backbone_state_dict(
    obj: Any, which: str = "teacher", num_patches: int | None = None
) -> StateDict:
    """Any supported checkpoint (path, loaded object, module) -> our backbone state dict
    (`mask_token` may be absent).

    `which` picks the teacher or student backbone from checkpoints holding both; `num_patches` is an
    optional hint for timm layouts (see `from_timm_state_dict`).
    """
    if isinstance(obj, (str, Path)):
        obj = load_checkpoint_file(obj)
    sd = from_dinov2_state_dict(_unwrap(obj, which), which=which)
    pos = sd.get("pos_embed")
    if pos is None:
        raise ValueError(f"no pos_embed in the checkpoint's backbone keys ({sorted(sd)[:8]}...)")
    ours_layout = "reg_token" not in sd and _is_square(pos.shape[1] - 1)
    return sd if ours_layout else from_timm_state_dict(sd, num_patches=num_patches)


def resample_pos_embed(pos_embed: Tensor, new_grid: int, antialias: bool = False) -> Tensor:
    """(1, 1 + M*M, D) -> (1, 1 + new_grid**2, D): bicubic on the patch grid, cls entry kept."""
    M = math.isqrt(pos_embed.shape[1] - 1)
    if M == new_grid:
        return pos_embed
    dim = pos_embed.shape[-1]
    grid = pos_embed[:, 1:].float().reshape(1, M, M, dim).permute(0, 3, 1, 2)
    grid = F.interpolate(
        grid, size=(new_grid, new_grid), mode="bicubic", antialias=antialias, align_corners=False
    )
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_grid * new_grid, dim).to(pos_embed.dtype)
    return torch.cat([pos_embed[:, :1], grid], dim=1)


def load_backbone_weights(backbone: nn.Module, obj: Any, which: str = "teacher") -> dict[str, Any]:
    """Loads any supported checkpoint into our backbone, strictly. A missing `mask_token` keeps the
    model's own (zeros at init); a pos-embed of another grid is resampled bicubically. Returns what
    was adapted."""
    sd = convert_to_backbone_state_dict(
        obj, which=which, num_patches=backbone.pos_embed.shape[1] - 1
    )
    report: dict[str, Any] = {"mask_token_kept": False, "pos_embed_resampled_from": None}
    if "mask_token" not in sd:
        sd["mask_token"] = backbone.mask_token.detach().clone()
        report["mask_token_kept"] = True
    target = backbone.pos_embed.shape[1] - 1
    if sd["pos_embed"].shape[1] - 1 != target:
        report["pos_embed_resampled_from"] = math.isqrt(sd["pos_embed"].shape[1] - 1)
        sd["pos_embed"] = resample_pos_embed(
            sd["pos_embed"], math.isqrt(target), backbone.interpolate_antialias
        )
    backbone.load_state_dict(sd, strict=True)
    return report
