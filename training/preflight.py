"""What train.py checks about the model before the run directory exists, so that a config the model
cannot take is one line and writes nothing: the sparsity converter against the student's modules (a
backbone built on the meta device, no memory), and `student.pretrained_weights` (a regular file
whose backbone weights fit the model; a FIFO there would block the load)."""

from pathlib import Path

import torch

from configs import Config
from models.checkpoint_conversion import load_backbone_weights
from models.vision_transformer import build_backbone
from rundir.digests import CorruptFile, UnsafeFile
from sparsity.converter import ConversionError
from sparsity.pruning import check_shape

from .sparsity_setup import ModelConfigError, check_sparsity, sparsity_converter


class PretrainedWeightsError(ModelConfigError):
    """`student.pretrained_weights` cannot be loaded into the model (the message names the key and
    the file)."""


def check_model(cfg: Config) -> None:
    """`ModelConfigError` (a `sparsity.` key the model cannot take: the library's ConversionError as
    this command's refusal) or `PretrainedWeightsError`, before any work."""
    with torch.device("meta"):
        backbone = build_backbone(cfg.student, img_size=cfg.crops.global_crops_size)
    check_sparsity(sparsity_converter(cfg), backbone)
    try:
        check_activation_rows(cfg, backbone)
    except ConversionError as e:
        raise ModelConfigError(str(e)) from None
    if cfg.student.pretrained_weights:
        check_pretrained_weights(cfg, Path(cfg.student.pretrained_weights))


GLOBAL_CROPS = 2  # DINOv2's two global crops per image, forwarded together


def check_activation_rows(cfg: Config, backbone) -> None:
    """kind=activation prunes the MLP linears' *inputs*, whose rows are the tokens of every crop the
    block's MLP sees at once (the kept drop-path subsets in training): each count must be a shape
    the pruning takes (4x4 tiles need rows divisible by 4; rowwise any count). Checked from the
    config, before the run directory exists, since the first forward that breaks it would come
    after."""
    sp = cfg.sparsity
    if sp.kind != "activation" or cfg.sparse_steps == 0:
        return
    batch = cfg.train.batch_size_per_gpu
    student = [
        (GLOBAL_CROPS * batch, cfg.crops.global_crops_size),
        (cfg.crops.local_crops_number * batch, cfg.crops.local_crops_size),
    ]
    forwards = [("the student's", backbone.mlp_rows(student, training=True))]
    if sp.teacher == "sparse":
        forwards.append(("the teacher's", backbone.mlp_rows(student[:1], training=False)))
    for whose, rows in forwards:
        bad = sorted({r for r in rows if _refused(r, sp.pruning)})
        if bad:
            raise ConversionError(
                f"sparsity.kind=activation with sparsity.pruning={sp.pruning} prunes 4x4 tiles of "
                f"the MLP inputs, so "
                f"their token rows must be divisible by 4, and {whose} blocks get "
                f"{', '.join(map(str, bad))} "
                f"(train.batch_size_per_gpu={batch}, the crops' sizes and numbers, "
                f"student.drop_path_rate's kept "
                "subsets); use sparsity.pruning=rowwise (any number of tokens) or another batch "
                "size"
            )


def _refused(rows: int, pruning: str) -> bool:
    try:
        check_shape((rows, 4), pruning)
    except ValueError:
        return True
    return False


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
        raise PretrainedWeightsError(
            f"{key}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None
