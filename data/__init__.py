"""Data pipeline of DINOv2 training: datasets, multi-crop augmentation, iBOT masks, the resumable
SSL loader.

Public API:
    build_ssl_loader(cfg, *, rank, world_size, start_step) -> SSLLoader   infinite iterable of SSLBatch
    build_dataset(cfg, split=None)                  ImageFolderDataset | UnlabelledImageFolder | DigitsDataset
    build_training_dataset(cfg)                                           the same, decoded in memory if asked
    make_eval_transform(resize=256, crop=224)                             transform for kNN / linear probes
    DataAugmentationDINO, build_augmentation(cfg), MaskingGenerator, SSLCollate, InfiniteShardedSampler
SSLBatch (`data.batch`): the typed batch; `SSLLoader.to_device` moves it to the training device
once.
"""

from configs.torch_env import ensure_torchvision_importable

ensure_torchvision_importable()

from .augmentations import DataAugmentationDINO, build_augmentation  # noqa: E402
from .batch import SSLBatch  # noqa: E402
from .batched_augment import BatchedAugmentationDINO  # noqa: E402
from .collate import SSLCollate, SSLSample, collate_ssl_samples  # noqa: E402
from .corrupt import load_image  # noqa: E402
from .datasets import (  # noqa: E402
    CorruptImageError,
    DatasetError,
    DigitsDataset,
    ImageFolderDataset,
    UnlabelledImageFolder,
    build_dataset,
    dataset_summary,
)
from .in_memory import InMemoryImages  # noqa: E402
from .loader import SSLDataset, SSLLoader, build_ssl_loader, build_training_dataset  # noqa: E402
from .masking import MaskingGenerator, mask_targets  # noqa: E402
from .samplers import InfiniteShardedSampler  # noqa: E402
from .transforms import (  # noqa: E402
    IMAGENET_DEFAULT_MEAN,
    IMAGENET_DEFAULT_STD,
    GaussianBlur,
    make_eval_transform,
    make_normalize_transform,
)

__all__ = [
    "BatchedAugmentationDINO",
    "InMemoryImages",
    "build_training_dataset",
    "CorruptImageError",
    "DataAugmentationDINO",
    "DatasetError",
    "DigitsDataset",
    "GaussianBlur",
    "IMAGENET_DEFAULT_MEAN",
    "IMAGENET_DEFAULT_STD",
    "ImageFolderDataset",
    "InfiniteShardedSampler",
    "MaskingGenerator",
    "SSLBatch",
    "SSLCollate",
    "SSLDataset",
    "SSLLoader",
    "SSLSample",
    "build_augmentation",
    "build_dataset",
    "build_ssl_loader",
    "collate_ssl_samples",
    "load_image",
    "make_eval_transform",
    "make_normalize_transform",
    "mask_targets",
    "UnlabelledImageFolder",
    "dataset_summary",
]
