"""Frozen-teacher features for probes: checkpoint loading, the eval transform, batched extraction, a
disk cache.

The feature is the CLS token after the backbone's final norm (what `DinoVisionTransformer.forward`
returns in eval mode), extracted under autocast on GPU and stored as float32. The cache file
`<run>/eval/features_<split>.pt` holds a key: a hash of the checkpoint's bytes, the transform, the
dataset and the model config. Any change (a retrained or re-exported checkpoint, another crop size,
another data root, images or classes added or removed) re-extracts and overwrites; on a hit the
model is not even built. Editing images in place is not seen: pass features.cache=false then.
"""

import dataclasses
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from models.checkpoint_conversion import load_backbone_weights
from models.vision_transformer import build_backbone
from rundir.digests import CorruptFile, UnsafeFile, checked_digest
from rundir.errors import CommandError
from rundir.torch_files import load_verified, save_verified
from training.terminal import track

logger = logging.getLogger(__name__)

CACHE_FORMAT = 1  # bump when the stored layout or the extraction itself changes


class EvalInputError(CommandError, ValueError):
    """A run directory, checkpoint or dataset that cannot be evaluated as given."""


@dataclass
class Features:
    x: Tensor  # (n, D) float32, CPU
    y: Tensor  # (n,) int64
    step: int | None = None  # training step of the checkpoint they come from
    from_cache: bool = False


class PixelFeatures(torch.nn.Module):
    """checkpoint=pixels: the eval transform's output (normalised pixels) flattened, 3 * crop * crop
    features; the raw-pixel baseline of a results table, next to the random-init network."""

    def forward(self, images: Tensor) -> Tensor:
        return images.flatten(1)


def require_checkpoint(checkpoint: Path) -> None:
    if not checkpoint.is_file():
        raise EvalInputError(
            f"no final teacher checkpoint at {checkpoint}: the run has not finished (train.py "
            f"writes "
            "it after the last step), or pass checkpoint=<path to a teacher_backbone.pth>"
        )


def weights_digest(run_cfg, checkpoint: Path | None) -> str:
    """sha256 of the checkpoint file, checked against its recorded digest (a damaged one refuses the
    checkpoint here, before a feature cache keyed on it could stand in for loading it), or a name
    for the seeded random initialisation (checkpoint None)."""
    if checkpoint is None:
        return f"random-init-seed-{run_cfg.train.seed}"
    require_checkpoint(checkpoint)
    try:
        return checked_digest(checkpoint)
    except CorruptFile as e:
        raise EvalInputError(f"cannot read {checkpoint}: it {e.reason}") from None


def load_teacher(run_cfg, checkpoint: Path | None):
    """The run's backbone (teacher architecture, no drop-path) with the checkpoint's weights, in
    eval mode, and the training step stored in the checkpoint (None if it has none). Loads with
    weights_only=True. `checkpoint=None`: the untrained backbone, initialised with the run's seed
    (the baseline a run must beat)."""
    if checkpoint is None:
        torch.manual_seed(run_cfg.train.seed)
        backbone = build_backbone(
            run_cfg.student, img_size=run_cfg.crops.global_crops_size, drop_path_rate=0.0
        )
        return backbone.eval(), 0
    require_checkpoint(checkpoint)
    try:
        state = load_verified(
            checkpoint
        )  # digest-checked where one was recorded; weights-only, no fallback
    except (CorruptFile, UnsafeFile) as e:
        raise EvalInputError(f"cannot read {checkpoint}: it {e.reason}") from None
    except OSError as e:
        raise EvalInputError(f"cannot read {checkpoint}: {e.strerror or e}") from None
    if not isinstance(state, dict):
        raise EvalInputError(
            f"{checkpoint} holds a {type(state).__name__}, not a checkpoint (a dict of weights)"
        )
    backbone = build_backbone(
        run_cfg.student, img_size=run_cfg.crops.global_crops_size, drop_path_rate=0.0
    )
    try:
        load_backbone_weights(backbone, state, which="teacher")
    except (KeyError, RuntimeError, ValueError) as e:
        raise EvalInputError(
            f"{checkpoint} does not fit the run's model ({run_cfg.student.arch}, patch "
            f"{run_cfg.student.patch_size}): {e}"
        ) from None
    step = state.get("step") if isinstance(state, dict) else None
    return backbone.eval(), (int(step) if step is not None else None)


def transform_settings(run_cfg, feats_cfg) -> dict:
    crop = feats_cfg.crop_size or run_cfg.crops.global_crops_size
    return {
        "resize": int(round(crop * feats_cfg.resize_ratio)),
        "crop": int(crop),
        "interpolation": "bicubic",
        "normalize": "imagenet",
    }


def resolve_data(run_cfg, eval_data):
    """The run's DataConfig with the eval's `data.dataset` / `data.root` applied. A root falls back
    to the run's only for the run's own dataset; imagenet_folder without one, or a root given for
    digits, is an error (never a silent evaluation of some other dataset)."""
    dataset = eval_data.dataset or run_cfg.data.dataset
    # only a run's own data can be unlabelled: the eval schema does not offer it
    if dataset == "image_folder":
        raise EvalInputError(
            "the run was trained on unlabelled images (data.dataset=image_folder), and a probe "
            "needs "
            "labels: add data.dataset=imagenet_folder data.root=<folder with train/<class>/<image> "
            "and val/<class>/<image>> (or data.dataset=digits)"
        )
    root = eval_data.root or (run_cfg.data.root if dataset == run_cfg.data.dataset else "")
    if dataset == "imagenet_folder" and not root:
        raise EvalInputError(
            "data.dataset=imagenet_folder needs data.root=<folder with <split>/<class>/<image> "
            f"trees> (the run was trained on {run_cfg.data.dataset}, which has no root to reuse)"
        )
    if dataset == "digits" and eval_data.root:
        raise EvalInputError(
            f"data.root={eval_data.root} is set but the dataset is digits (the "
            f"{'eval' if eval_data.dataset else 'run'}'s data.dataset), which has no root: add "
            "data.dataset=imagenet_folder to evaluate on that folder tree"
        )
    return dataclasses.replace(
        run_cfg.data, dataset=dataset, root=root if dataset == "imagenet_folder" else ""
    )


def dataset_settings(data_cfg, split: str) -> dict:
    settings = {"dataset": data_cfg.dataset, "split": split}
    if data_cfg.dataset == "digits":
        settings["digits_image_size"] = data_cfg.digits_image_size
    else:
        settings["root"] = (
            os.path.realpath(os.path.expanduser(data_cfg.root)) if data_cfg.root else ""
        )
    return settings


def cache_key(
    checkpoint_digest: str,
    transform: dict,
    dataset: dict,
    student_cfg,
    precision: str,
    mlp_weights: str = "dense",
) -> str:
    """Everything the extracted features depend on, hashed. `mlp_weights` (evaluation.mlp_pruning)
    enters only when not dense, so the keys of dense caches written before it existed stay valid."""
    payload = {
        "format": CACHE_FORMAT,
        "checkpoint_sha256": checkpoint_digest,
        "transform": transform,
        "dataset": dataset,
        "student": dataclasses.asdict(student_cfg),
        "precision": precision,
    }
    if mlp_weights != "dense":
        payload["mlp_weights"] = mlp_weights
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def load_cached(path: Path, key: str, rows: int | None = None) -> Features | None:
    """The features cached at `path` under `key` (`rows`: the split's image count, which they must
    cover), or None where there is no usable cache: missing, unreadable, stale, or not features of
    that many images."""
    if not path.is_file():
        return None
    try:
        stored = load_verified(path)
    except Exception as e:  # noqa: BLE001 - an unreadable cache is only a cache: extract again
        logger.warning("ignoring unreadable feature cache %s (%s)", path, e)
        return None
    if not isinstance(stored, dict) or stored.get("key") != key:
        logger.info(
            "feature cache %s is stale (checkpoint, transform, data or model changed): "
            "re-extracting",
            path,
        )
        return None
    problem = _cache_problem(stored, rows)
    if problem:
        logger.warning("ignoring feature cache %s (%s): re-extracting", path, problem)
        return None
    return Features(stored["features"], stored["labels"], stored.get("step"), from_cache=True)


def _cache_problem(stored: dict, rows: int | None) -> str:
    """What makes a cache's content unusable (its key can be right and its tensors not), or ""."""
    x, y, step = stored.get("features"), stored.get("labels"), stored.get("step")
    if not isinstance(x, Tensor) or x.dim() != 2 or not x.is_floating_point():
        return "its features are not a 2-D float tensor"
    if not isinstance(y, Tensor) or y.dim() != 1 or y.dtype != torch.int64:
        return "its labels are not a 1-D int64 tensor"
    if len(x) != len(y):
        return f"{len(x)} feature rows for {len(y)} labels"
    if rows is not None and len(x) != rows:
        return f"{len(x)} rows where the split has {rows} images"
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        return "its step is not an integer"
    return ""


def save_cached(path: Path, key: str, features: Features) -> None:
    save_verified(
        {"key": key, "features": features.x, "labels": features.y, "step": features.step}, path
    )


@torch.no_grad()
def extract(
    backbone,
    dataset,
    *,
    batch_size: int,
    num_workers: int,
    device: torch.device,
    amp_dtype: torch.dtype | None,
    step: int | None = None,
    desc: str = "features",
) -> Features:
    """CLS-after-norm features of every image, in dataset order (float32 on CPU)."""
    workers = min(num_workers, os.cpu_count() or 1)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        drop_last=False,
    )
    feats: Tensor | None = None
    labels = torch.empty(len(dataset), dtype=torch.int64)
    backbone = backbone.to(device)
    autocast = torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)
    offset = 0
    for images, targets in track(loader, desc, "batches", say=logger.info):
        with autocast:
            out = backbone(images.to(device, non_blocking=True)).float().cpu()
        if feats is None:
            feats = torch.empty(len(dataset), out.shape[1], dtype=torch.float32)
        feats[offset : offset + len(out)] = out
        labels[offset : offset + len(out)] = targets
        offset += len(out)
    if feats is None:
        raise EvalInputError(f"the {desc} dataset is empty")
    return Features(feats, labels, step)
