"""DINOv2 models: ViT backbone, DINO/iBOT heads, losses, the student/teacher meta-architecture,
param groups.

Names are imported lazily, so importing one submodule (e.g. `models.checkpoint_conversion`) does not
pay for timm / torchvision.
"""

import importlib

_EXPORTS = {
    "ARCH_SIZES": "vision_transformer",
    "DinoVisionTransformer": "vision_transformer",
    "build_backbone": "vision_transformer",
    "vit_tiny": "vision_transformer",
    "vit_small": "vision_transformer",
    "vit_base": "vision_transformer",
    "vit_large": "vision_transformer",
    "DINOHead": "heads",
    "WeightNormLinear": "heads",
    "DINOLoss": "losses",
    "iBOTPatchLoss": "losses",
    "KoLeoLoss": "losses",
    "SSLMetaArch": "ssl_meta_arch",
    "get_params_groups_with_decay": "param_groups",
    "fuse_params_groups": "param_groups",
    "build_param_groups": "param_groups",
    "convert_to_backbone_state_dict": "checkpoint_conversion",
    "from_dinov2_state_dict": "checkpoint_conversion",
    "from_timm_state_dict": "checkpoint_conversion",
    "to_timm_state_dict": "checkpoint_conversion",
    "load_backbone_weights": "checkpoint_conversion",
    "timm_model_kwargs": "checkpoint_conversion",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
