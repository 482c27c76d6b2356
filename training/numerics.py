"""Which dtype the backbone's residual stream computes in under autocast (`train.residual_dtype`): a
model converter the Trainer applies once, before compilation, to the student's and the teacher's
backbones.

- `fp32`: under autocast only the matmuls (linears, attention, the patch convolution) run in
  `train.amp_dtype`; the tokens are fp32 after the fp32 position embedding, autocast computes
  LayerNorm in fp32, and so the residual stream, LayerNorm and LayerScale stay fp32 (more
  elementwise memory traffic, which the H100 profile names as the largest part of the fused
  elementwise kernels' time).
- `amp`: the reference's numerics. dinov2 trains under FSDP `MixedPrecision(param_dtype=bf16 or
  fp16)`: each parameter is cast to the low dtype for the forward, so the residual stream, LayerNorm
  and LayerScale compute in it too, while master weights, gradients, the optimizer and the losses
  (softmax, centering, cross-entropy: in fp32 in models/losses) stay fp32. Without FSDP the same is
  had by casting the tokens to the autocast dtype where they enter the first block and computing
  LayerNorm and LayerScale in their input's dtype (their weights cast to it, as param_dtype casts
  them).

Where autocast is off (a CPU run, an evaluation in fp32) `amp` computes exactly what `fp32`
computes: every cast it adds is to the dtype the tensor already has. The parameters and the state
dict are the same for both, so a checkpoint of one loads into the other (a resume still refuses a
changed setting, as for any config key).
"""

import logging

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.vision_transformer import DinoVisionTransformer
from models.vit_block import LayerScale

logger = logging.getLogger(__name__)

RESIDUAL_DTYPES = ("fp32", "amp")
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def autocast_dtype(name: str, device: torch.device, warn: bool = True) -> torch.dtype:
    """The dtype a run's autocast computes in for `train.amp_dtype=name`: that dtype on CUDA,
    float32 elsewhere (autocast runs only on CUDA here), with a warning when that differs from the
    config (`warn`: rank 0 only)."""
    dtype = AMP_DTYPES[name] if device.type == "cuda" else torch.float32
    if dtype != AMP_DTYPES[name] and warn:
        logger.warning(
            "train.amp_dtype=%s is not used on %s: autocast runs only on CUDA here, so this run "
            "computes "
            "in float32 (config.yaml keeps the configured value; run_info.json and the start-up "
            "summary "
            "record the dtype used)",
            name,
            device.type,
        )
    return dtype


def _autocast_dtype(t: Tensor) -> torch.dtype | None:
    """The autocast dtype for `t`'s device where autocast is on, else None."""
    device = t.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None


class InputDtypeLayerNorm(nn.LayerNorm):
    """nn.LayerNorm that computes in its input's dtype under autocast (autocast would compute it in
    fp32), its weight and bias cast to that dtype; the fp32 path of nn.LayerNorm otherwise."""

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32 or _autocast_dtype(x) is None:
            return super().forward(x)
        weight = self.weight.to(x.dtype) if self.weight is not None else None
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        with torch.autocast(x.device.type, enabled=False):
            return F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)


class InputDtypeLayerScale(LayerScale):
    """LayerScale whose gamma is cast to the input's dtype (an fp32 gamma would promote a bf16
    branch to fp32)."""

    def forward(self, x: Tensor) -> Tensor:
        gamma = self.gamma.to(x.dtype)
        return x.mul_(gamma) if self.inplace else x * gamma


def _tokens_to_autocast_dtype(module: nn.Module, args: tuple) -> tuple:
    """Forward pre-hook of the first block: its input tokens (a tensor, or a list of them for the
    crop batches) in the autocast dtype, from where the residual stream stays in it."""

    def cast(t):
        dtype = _autocast_dtype(t) if isinstance(t, Tensor) and t.is_floating_point() else None
        return t.to(dtype) if dtype is not None else t

    x = args[0]
    return ([cast(t) for t in x] if isinstance(x, (list, tuple)) else cast(x), *args[1:])


def _retype(module: nn.Module, new_class: type) -> None:
    # The same object with the subclass's forward: its parameters (already in the optimizer's and
    # the EMA's lists, if any were built) and its state dict are untouched.
    module.__class__ = new_class


def apply_residual_dtype(model: nn.Module, residual_dtype: str) -> list[str]:
    """Set every DinoVisionTransformer in `model` to compute its residual stream as `residual_dtype`
    says (see the module docstring); returns what was converted, for the start-up log. `fp32`
    changes nothing."""
    if residual_dtype not in RESIDUAL_DTYPES:
        raise ValueError(
            f"train.residual_dtype={residual_dtype!r} is not one of {', '.join(RESIDUAL_DTYPES)}"
        )
    if residual_dtype == "fp32":
        return []
    converted = []
    for name, backbone in model.named_modules():
        if not isinstance(backbone, DinoVisionTransformer) or getattr(
            backbone, "_residual_dtype_hook", None
        ):
            continue
        for module in backbone.modules():
            if type(module) is nn.LayerNorm:
                _retype(module, InputDtypeLayerNorm)
            elif type(module) is LayerScale:
                _retype(module, InputDtypeLayerScale)
        if len(backbone.blocks):
            backbone._residual_dtype_hook = backbone.blocks[0].register_forward_pre_hook(
                _tokens_to_autocast_dtype
            )
        converted.append(name or "backbone")
    return converted
