"""The SSL training loader: dataset + multi-crop augmentation + masks, on an infinite resumable stream.

Every random draw is a function of (train.seed, rank, stream position): the sampler's permutations of (seed, pass),
each sample's augmentation of (seed, global position) through `torch.random.fork_rng` + a seeded CPU generator
(torchvision's v1 transforms draw from torch's global RNG), each batch's masks of (seed, rank, position of its first
sample). So batches do not depend on `num_workers`, and a loader started at step k yields exactly batches k, k+1, ...
of one started at 0.
"""

import logging
import signal
from typing import Dict, Iterator, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader

from .augmentations import DataAugmentationDINO, applied_blur_probabilities, build_augmentation
from .batched_augment import BatchedAugmentationDINO
from .collate import SSLCollate, SSLSample
from .corrupt import load_image
from .datasets import build_dataset
from .in_memory import InMemoryImages
from .samplers import InfiniteShardedSampler
from .seeding import TAG_AUGMENTATION, TAG_DEVICE_AUGMENTATION, TAG_LOADER, torch_seed

logger = logging.getLogger(__name__)


class SSLDataset(torch.utils.data.Dataset):
    """Maps a sampler item `(index, position)` to an augmented `SSLSample`, seeded by (seed, position); with
    `augmentation=None`, to a sample holding the un-augmented uint8 image (augmented later, per batch, on the
    training device)."""

    def __init__(self, dataset, augmentation: Optional[DataAugmentationDINO], seed: int, on_corrupt: str = "skip"):
        self.dataset = dataset
        self.augmentation = augmentation
        self.seed = int(seed)
        self.on_corrupt = on_corrupt

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item) -> SSLSample:
        index, position = item
        if self.augmentation is None:
            return self._raw_sample(index, position)
        image, label, skipped = load_image(self.dataset, index, self.on_corrupt)
        # fork_rng restores torch's CPU RNG afterwards. Seed only the CPU generator: torch.manual_seed would also
        # reseed the CUDA generators of the main process (num_workers=0), which fork_rng(devices=[]) does not restore.
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(torch_seed(TAG_AUGMENTATION, self.seed, position))
            crops = self.augmentation(image)
        return SSLSample(crops["global_crops"], crops["local_crops"], label, position, skipped)

    def _raw_sample(self, index: int, position: int) -> SSLSample:
        if hasattr(self.dataset, "pixels"):  # decoded in memory
            pixels, label, skipped = self.dataset.pixels(index), int(self.dataset.targets[index]), 0
        else:
            image, label, skipped = load_image(self.dataset, index, self.on_corrupt)
            pixels = np.asarray(image)
        return SSLSample([], [], label, position, skipped, image=torch.from_numpy(np.array(pixels)).permute(2, 0, 1))


class SSLLoader:
    """Infinite iterable of batch dicts (see `data.collate`) starting at `start_step`.

    `next_step` is the step of the next batch to be yielded; `state_dict()` is the sampler state at the batches
    actually consumed (not at the DataLoader's prefetch), for a checkpoint taken after `next_step - 1`.
    Re-iterating restarts the stream at `next_step`.
    """

    def __init__(self, dataloader: DataLoader, sampler: InfiniteShardedSampler, batch_size: int, start_step: int,
                 device_augmentation: Optional[BatchedAugmentationDINO] = None, seed: int = 0, rank: int = 0):
        self.device_augmentation = device_augmentation
        self.seed, self.rank = int(seed), int(rank)
        self.dataloader = dataloader
        self.sampler = sampler
        self.dataset = dataloader.dataset.dataset
        self.batch_size = batch_size
        self.start_step = start_step
        self.next_step = start_step

    def __iter__(self) -> Iterator[Dict[str, object]]:
        self.sampler.position = self.next_step * self.batch_size
        try:
            for batch in self.dataloader:
                self.next_step += 1
                yield batch
        finally:
            self.close()

    def to_device(self, batch: Dict[str, object], device: torch.device) -> Dict[str, object]:
        """The batch on `device`, its crops made there if the loader left that to the device (`images`): the
        generator is seeded by (seed, rank, position of the batch's first sample), so a resumed run draws the same
        crops."""
        batch = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
        if "images" in batch:
            generator = torch.Generator(device=device)
            generator.manual_seed(torch_seed(TAG_DEVICE_AUGMENTATION, self.seed, self.rank, batch["first_position"]))
            batch.update(self.device_augmentation(batch.pop("images"), generator))
        return batch

    def close(self) -> None:
        """Stop the workers now, cooperatively. Persistent workers otherwise live until the interpreter exits, whose
        clean-up stops them with SIGTERM, which they ignore (`ignore_stop_signals`)."""
        iterator = getattr(self.dataloader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        self.dataloader._iterator = None

    def state_dict(self) -> Dict[str, int]:
        return {**self.sampler.state_dict(), "position": self.next_step * self.batch_size,
                "next_step": self.next_step, "batch_size": self.batch_size}


def ignore_stop_signals(worker_id: int) -> None:
    """In each data worker: ignore SIGTERM and SIGUSR1/2. Slurm (preemption, time limit, `scontrol requeue`) signals
    every process of the job, workers included; a worker killed by it makes the trainer's next batch raise before
    the trainer, which handles the signal, can save its checkpoint. The trainer stops its workers itself when it
    exits, and a worker whose trainer died exits on its own (PyTorch's watchdog)."""
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)


def build_ssl_loader(cfg, *, rank: int, world_size: int, start_step: int,
                     dataset=None, num_workers: Optional[int] = None) -> SSLLoader:
    """The training loader of one rank: `cfg.train.batch_size_per_gpu` images per batch, `cfg.train.num_workers`
    persistent workers (pinned memory when CUDA is available), the sampler at `start_step * batch_size`.

    `dataset` (default `build_dataset(cfg)`) and `num_workers` (default `cfg.train.num_workers`) are overrides for
    tests and tools.
    """
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}")
    dataset = build_training_dataset(cfg) if dataset is None else dataset
    num_workers = cfg.train.num_workers if num_workers is None else num_workers
    batch_size = cfg.train.batch_size_per_gpu
    seed = cfg.train.seed
    patch = cfg.student.patch_size
    if cfg.crops.global_crops_size % patch or cfg.crops.local_crops_size % patch:
        logger.warning("crop sizes %d/%d are not multiples of patch size %d: the last pixels are not covered",
                       cfg.crops.global_crops_size, cfg.crops.local_crops_size, patch)

    on_device = cfg.data.augment_on == "device"
    ssl_dataset = SSLDataset(dataset, None if on_device else build_augmentation(cfg), seed=seed,
                             on_corrupt=cfg.data.on_corrupt)
    sampler = InfiniteShardedSampler(len(dataset), rank=rank, world_size=world_size, seed=seed,
                                     start=start_step * batch_size)
    collate = SSLCollate(patches_per_side=cfg.crops.global_crops_size // patch,
                         local_crops_size=cfg.crops.local_crops_size,
                         mask_ratio_min_max=cfg.ibot.mask_ratio_min_max,
                         mask_sample_probability=cfg.ibot.mask_sample_probability, seed=seed, rank=rank)
    # Our own generator: otherwise creating the DataLoader iterator draws its base seed from torch's global RNG,
    # which would make the trainer's randomness depend on when the loader was (re)built.
    generator = torch.Generator().manual_seed(torch_seed(TAG_LOADER, seed, rank))
    dataloader = DataLoader(
        ssl_dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate,
        pin_memory=torch.cuda.is_available(),
        drop_last=True,
        persistent_workers=num_workers > 0,
        generator=generator,
        worker_init_fn=ignore_stop_signals,
    )
    device_augmentation = build_batched_augmentation(cfg) if on_device else None
    return SSLLoader(dataloader, sampler, batch_size, start_step, device_augmentation, seed=seed, rank=rank)


def build_batched_augmentation(cfg) -> BatchedAugmentationDINO:
    crops = cfg.crops
    return BatchedAugmentationDINO(crops.global_crops_scale, crops.local_crops_scale, crops.local_crops_number,
                                   crops.global_crops_size, crops.local_crops_size,
                                   blur_probabilities=applied_blur_probabilities(crops),
                                   solarize_probability=crops.solarize_probability)


def build_training_dataset(cfg):
    """The training split (`build_dataset(cfg)`), decoded into memory when `data.in_memory` is set."""
    dataset = build_dataset(cfg)
    return InMemoryImages(dataset, cfg.data.on_corrupt) if cfg.data.in_memory else dataset
