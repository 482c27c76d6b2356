"""What train.py checks about the model before the run directory exists, so that a config the model cannot take is
one line and writes nothing: the sparsity converter against the student's modules (a backbone built on the meta
device, no memory), and `student.pretrained_weights` (a regular file whose backbone weights fit the model; a FIFO
there would block the load)."""

from pathlib import Path

import torch

from configs import Config
from models.checkpoint_conversion import load_backbone_weights
from models.safe_io import CorruptFile, UnsafeFile
from models.vision_transformer import build_backbone

from .sparsity_setup import sparsity_converter


class PretrainedWeightsError(ValueError):
    """`student.pretrained_weights` cannot be loaded into the model (the message names the key and the file)."""


def check_model(cfg: Config) -> None:
    """ConversionError (a `sparsity.` key the model cannot take) or PretrainedWeightsError, before any work."""
    with torch.device("meta"):
        backbone = build_backbone(cfg.student, img_size=cfg.crops.global_crops_size)
    sparsity_converter(cfg).check(backbone)
    if cfg.student.pretrained_weights:
        check_pretrained_weights(cfg, Path(cfg.student.pretrained_weights))


def check_pretrained_weights(cfg: Config, path: Path) -> None:
    key = f"student.pretrained_weights={path}"
    if not path.exists():
        raise PretrainedWeightsError(f"{key}: no such file")
    if not path.is_file():
        raise PretrainedWeightsError(f"{key}: not a regular file (a directory, a FIFO or a device)")
    backbone = build_backbone(cfg.student, img_size=cfg.crops.global_crops_size)
    try:
        load_backbone_weights(backbone, str(path))
    except (CorruptFile, UnsafeFile, KeyError, RuntimeError, ValueError, OSError) as e:
        raise PretrainedWeightsError(f"{key}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
