"""The SSL training loader: dataset + multi-crop augmentation + masks, on an infinite resumable
stream.

Every random draw is a function of (train.seed, rank, stream position): the sampler's permutations
of (seed, pass), each sample's augmentation of (seed, global position) through
`torch.random.fork_rng` + a seeded CPU generator (torchvision's v1 transforms draw from torch's
global RNG), each batch's masks of (seed, rank, position of its first sample). So batches do not
depend on `num_workers`, and a loader started at step k yields exactly batches k, k+1, ... of one
started at 0.
"""

import dataclasses
import gc
import logging
import signal
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils import signal_handling

from .augmentations import DataAugmentationDINO, applied_blur_probabilities, build_augmentation
from .batch import SSLBatch
from .batched_augment import BatchedAugmentationDINO
from .collate import SSLCollate, SSLSample
from .corrupt import load_image
from .datasets import build_dataset
from .in_memory import InMemoryImages
from .samplers import InfiniteShardedSampler
from .seeding import TAG_AUGMENTATION, TAG_DEVICE_AUGMENTATION, TAG_LOADER, torch_seed

logger = logging.getLogger(__name__)


class SSLDataset(torch.utils.data.Dataset):
    """Maps a sampler item `(index, position)` to an augmented `SSLSample`, seeded by (seed,
    position); with `augmentation=None`, to a sample holding the un-augmented uint8 image (augmented
    later, per batch, on the training device)."""

    def __init__(
        self,
        dataset,
        augmentation: DataAugmentationDINO | None,
        seed: int,
        on_corrupt: str = "skip",
    ):
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
        skipped += self._replaced_at(index)
        # fork_rng restores torch's CPU RNG afterwards. Seed only the CPU generator:
        # torch.manual_seed would also reseed the CUDA generators of the main process
        # (num_workers=0), which fork_rng(devices=[]) does not restore.
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(torch_seed(TAG_AUGMENTATION, self.seed, position))
            crops = self.augmentation(image)
        return SSLSample(crops["global_crops"], crops["local_crops"], label, position, skipped)

    def _replaced_at(self, index: int) -> int:
        """Decoded in memory: the unreadable files met when slot `index` was filled, counted at each
        draw as the per-step path counts them (so metrics' corrupt_skipped does not depend on
        data.in_memory)."""
        replaced_at = getattr(self.dataset, "replaced_at", None)
        return replaced_at(index) if replaced_at is not None else 0

    def _raw_sample(self, index: int, position: int) -> SSLSample:
        if hasattr(self.dataset, "pixels"):  # decoded in memory
            pixels, label = self.dataset.pixels(index), int(self.dataset.targets[index])
            skipped = self._replaced_at(index)
        else:
            image, label, skipped = load_image(self.dataset, index, self.on_corrupt)
            pixels = np.asarray(image)
        return SSLSample(
            [],
            [],
            label,
            position,
            skipped,
            image=torch.from_numpy(np.array(pixels)).permute(2, 0, 1),
        )


class SSLLoader:
    """Infinite iterable of `SSLBatch`es (on the host, pinned when CUDA is available).

    The stream position is the sampler's: `state_dict()` is the sampler's state at the batches
    actually delivered (not at the DataLoader's prefetch), what a checkpoint stores;
    `load_state_dict` continues such a state, also one saved with another number of ranks
    (`InfiniteShardedSampler.load_state_dict`). Re-iterating restarts the stream at the first batch
    not yet delivered. `next_step` = batches delivered before the next one (with the start).
    """

    def __init__(
        self,
        dataloader: DataLoader,
        sampler: InfiniteShardedSampler,
        batch_size: int,
        device_augmentation: BatchedAugmentationDINO | None = None,
        seed: int = 0,
        rank: int = 0,
    ):
        self.device_augmentation = device_augmentation
        self.seed, self.rank = int(seed), int(rank)
        self.dataloader = dataloader
        self.sampler = sampler
        self.dataset = dataloader.dataset.dataset
        self.batch_size = batch_size
        self.delivered = (
            sampler.position
        )  # this rank's samples handed out so far (the sampler runs ahead of it)

    @property
    def next_step(self) -> int:
        return self.delivered // self.batch_size

    def __iter__(self) -> Iterator[SSLBatch]:
        self.sampler.position = self.delivered
        try:
            for batch in self.dataloader:
                self.delivered += self.batch_size
                yield batch
        finally:
            self.close()

    def to_device(self, batch: SSLBatch, device: torch.device) -> SSLBatch:
        """The batch on `device` (one asynchronous copy, `SSLBatch.to`), its crops made there if the
        loader left that to the device (`images`): the generator is seeded by (seed, rank, position
        of the batch's first sample), so a resumed run draws the same crops."""
        batch = batch.to(device)
        if batch.needs_augmentation:
            generator = torch.Generator(device=device)
            generator.manual_seed(
                torch_seed(TAG_DEVICE_AUGMENTATION, self.seed, self.rank, batch.first_position)
            )
            crops = self.device_augmentation(batch.images, generator)
            batch = dataclasses.replace(
                batch,
                images=None,
                global_crops=crops["global_crops"],
                local_crops=crops["local_crops"],
            )
        return batch

    def close(self) -> None:
        """Stop the workers now, cooperatively. Persistent workers otherwise live until the
        interpreter exits, whose clean-up stops them with SIGTERM, which they ignore
        (`ignore_stop_signals`).

        Every batch asked for has been delivered by then, so a worker that dies as it exits (a C++
        thread left over in it aborts the process: "terminate called without an active exception")
        loses nothing: that is a warning naming the signal, where PyTorch's SIGCHLD handler would
        raise in the middle of the join below."""
        iterator = getattr(self.dataloader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            # stop watching the workers before they exit
            if getattr(iterator, "_worker_pids_set", False):
                signal_handling._remove_worker_pids(id(iterator))
                iterator._worker_pids_set = False
            iterator._shutdown_workers()
            for worker in getattr(iterator, "_workers", []):
                if worker.exitcode is not None and worker.exitcode < 0:
                    logger.warning(
                        "data worker %d died by %s as it stopped; every batch asked for was "
                        "delivered",
                        worker.pid,
                        signal.Signals(-worker.exitcode).name,
                    )
        self.dataloader._iterator = None

    def state_dict(self) -> dict[str, int]:
        """The sampler's state at the delivered batches (+ `next_step`, `batch_size` for
        reading)."""
        return {
            **self.sampler.state_dict(position=self.delivered),
            "next_step": self.next_step,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue the stream of `state` (a `state_dict()`, possibly of another world size): the
        next batch is the one the saving run would have drawn next."""
        self.close()
        self.sampler.load_state_dict(state)
        self.delivered = self.sampler.position


def init_worker(worker_id: int) -> None:
    """Each data worker's set-up: stop signals ignored, and Python's automatic garbage collection
    on. A worker is forked from a trainer that may have turned it off for its own loop
    (`train.gc_period`), and a worker's per-image work is where automatic collection belongs."""
    ignore_stop_signals(worker_id)
    gc.enable()


def ignore_stop_signals(worker_id: int) -> None:
    """In each data worker: ignore SIGTERM, SIGINT and SIGUSR1/2. Slurm (preemption, time limit,
    `scontrol requeue`) signals every process of the job, and Ctrl-C every process of the terminal's
    foreground group, workers included; a worker killed by it makes the trainer's next batch raise
    before the trainer, which handles the signal, can save its checkpoint. The trainer stops its
    workers itself when it exits, and a worker whose trainer died exits on its own (PyTorch's
    watchdog)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)


def build_ssl_loader(
    cfg,
    *,
    rank: int,
    world_size: int,
    start_step: int = 0,
    sampler_state: dict | None = None,
    dataset=None,
    num_workers: int | None = None,
    multiprocessing_context: str | None = None,
) -> SSLLoader:
    """The training loader of one rank: `cfg.train.batch_size_per_gpu` images per batch,
    `cfg.train.num_workers` persistent workers (pinned memory when CUDA is available). It starts
    where `sampler_state` (a loader's `state_dict()`, from a checkpoint) says, else at batch
    `start_step` of this rank's stream (tests, tools).

    `dataset` (default `build_dataset(cfg)`) and `num_workers` (default `cfg.train.num_workers`) are
    overrides for tests and tools. `multiprocessing_context` ("spawn", "forkserver"; default: the
    platform's, fork on Linux) is for a tool that builds loaders after its process has started
    threads (compilation, CUDA): a forked worker would hold copies of them.
    """
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}")
    dataset = build_training_dataset(cfg) if dataset is None else dataset
    notes = getattr(dataset, "notes", None)
    # train.py builds the dataset before log.txt exists: its warnings go there now
    if notes is not None:
        notes.log_again(logger)
    num_workers = cfg.train.num_workers if num_workers is None else num_workers
    batch_size = cfg.train.batch_size_per_gpu
    seed = cfg.train.seed
    patch = cfg.student.patch_size
    if cfg.crops.global_crops_size % patch or cfg.crops.local_crops_size % patch:
        logger.warning(
            "crop sizes %d/%d are not multiples of patch size %d: the last pixels are not covered",
            cfg.crops.global_crops_size,
            cfg.crops.local_crops_size,
            patch,
        )

    on_device = cfg.data.augment_on == "device"
    ssl_dataset = SSLDataset(
        dataset,
        None if on_device else build_augmentation(cfg),
        seed=seed,
        on_corrupt=cfg.data.on_corrupt,
    )
    sampler = InfiniteShardedSampler(
        len(dataset), rank=rank, world_size=world_size, seed=seed, start=start_step * batch_size
    )
    collate = SSLCollate(
        patches_per_side=cfg.crops.global_crops_size // patch,
        local_crops_size=cfg.crops.local_crops_size,
        mask_ratio_min_max=cfg.ibot.mask_ratio_min_max,
        mask_sample_probability=cfg.ibot.mask_sample_probability,
        seed=seed,
        rank=rank,
    )
    # Our own generator: otherwise creating the DataLoader iterator draws its base seed from torch's
    # global RNG, which would make the trainer's randomness depend on when the loader was (re)built.
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
        worker_init_fn=init_worker,
        multiprocessing_context=multiprocessing_context if num_workers > 0 else None,
    )
    device_augmentation = build_batched_augmentation(cfg) if on_device else None
    loader = SSLLoader(dataloader, sampler, batch_size, device_augmentation, seed=seed, rank=rank)
    if sampler_state is not None:
        loader.load_state_dict(sampler_state)
    return loader


def build_batched_augmentation(cfg) -> BatchedAugmentationDINO:
    crops = cfg.crops
    return BatchedAugmentationDINO(
        crops.global_crops_scale,
        crops.local_crops_scale,
        crops.local_crops_number,
        crops.global_crops_size,
        crops.local_crops_size,
        blur_probabilities=applied_blur_probabilities(crops),
        solarize_probability=crops.solarize_probability,
        compile=cfg.data.augment_compile,
        compile_backend=cfg.train.compile_backend,  # aot_eager and eager to debug, as the model's
    )


def build_training_dataset(cfg):
    """The training split (`build_dataset(cfg)`), decoded into memory when `data.in_memory` is
    set."""
    dataset = build_dataset(cfg)
    return InMemoryImages(dataset, cfg.data.on_corrupt) if cfg.data.in_memory else dataset
