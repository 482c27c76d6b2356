"""DINOv2 losses: DINO (CLS), iBOT (masked patches), KoLeo."""

from .dino_clstoken_loss import DINOLoss, sinkhorn_knopp
from .ibot_patch_loss import iBOTPatchLoss
from .koleo_loss import KoLeoLoss

__all__ = ["DINOLoss", "iBOTPatchLoss", "KoLeoLoss", "sinkhorn_knopp"]
