"""Collate of SSL samples into the `batch.SSLBatch` the model consumes, with the iBOT masks of the
global crops.

With `data.augment_on=device` the samples carry their uint8 image instead of crops: the batch then
holds `images` and `first_position` in place of the crops, which `loader.SSLLoader.to_device` makes
on the training device.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .batch import SSLBatch
from .masking import MaskingGenerator, mask_targets
from .seeding import TAG_MASKING, numpy_rng

N_GLOBAL = 2  # global crops per image


@dataclass
class SSLSample:
    """One augmented image, as `loader.SSLDataset` returns it."""

    global_crops: list[torch.Tensor]
    local_crops: list[torch.Tensor]
    label: int
    position: int  # position of this sample in the (global) sample stream; seeds its randomness
    corrupt_skipped: int  # unreadable files met before a readable one was found
    image: torch.Tensor | None = None  # uint8 (3, H, W), un-augmented (data.augment_on=device)


def collate_ssl_samples(
    samples: Sequence[SSLSample],
    mask_generator: MaskingGenerator,
    mask_ratio_min_max: Sequence[float],
    mask_sample_probability: float,
    rng: np.random.Generator,
    local_crops_size: int,
) -> SSLBatch:
    """Stack crops and draw the iBOT masks (see `SSLBatch`); all randomness comes from `rng`."""
    if samples[0].image is not None:  # crops are made on the training device
        pixels = {
            "images": torch.stack([s.image for s in samples]),
            "first_position": int(samples[0].position),
        }
        n_images = N_GLOBAL * len(samples)
    else:
        n_global = len(samples[0].global_crops)
        n_local = len(samples[0].local_crops)
        global_crops = torch.stack([s.global_crops[i] for i in range(n_global) for s in samples])
        if n_local:
            local_crops = torch.stack([s.local_crops[i] for i in range(n_local) for s in samples])
        else:
            local_crops = torch.zeros(
                (0, 3, local_crops_size, local_crops_size), dtype=global_crops.dtype
            )
        pixels = {"global_crops": global_crops, "local_crops": local_crops}
        n_images = global_crops.shape[0]
    n_patches = mask_generator.num_patches
    targets, upperbound = mask_targets(
        n_images, n_patches, mask_ratio_min_max, mask_sample_probability, rng
    )
    masks_np = np.stack([mask_generator(t, rng) for t in targets])
    masks_np = masks_np[rng.permutation(n_images)]
    masks = torch.from_numpy(masks_np).reshape(n_images, n_patches)

    mask_indices = masks.flatten().nonzero().flatten()
    per_image = masks.sum(-1).clamp(min=1).to(torch.float32)
    masks_weight = (1.0 / per_image).unsqueeze(-1).expand_as(masks)[masks]
    return SSLBatch(
        **pixels,
        masks=masks,
        mask_indices=mask_indices,
        masks_weight=masks_weight,
        n_masked_patches=torch.tensor(mask_indices.numel(), dtype=torch.long),
        upperbound=int(upperbound),
        labels=torch.tensor([s.label for s in samples], dtype=torch.long),
        corrupt_skipped=torch.tensor(sum(s.corrupt_skipped for s in samples), dtype=torch.long),
    )


class SSLCollate:
    """Picklable collate_fn for the SSL DataLoader.

    The masking RNG of a batch is seeded by (seed, rank, position of the batch's first sample), so a
    batch is the same whichever worker builds it and whether or not the run was resumed.
    """

    def __init__(
        self,
        *,
        patches_per_side: int,
        local_crops_size: int,
        mask_ratio_min_max: Sequence[float],
        mask_sample_probability: float,
        seed: int,
        rank: int,
    ):
        n_patches = patches_per_side * patches_per_side
        self.mask_generator = MaskingGenerator(
            input_size=(patches_per_side, patches_per_side), max_num_patches=0.5 * n_patches
        )
        self.local_crops_size = local_crops_size
        self.mask_ratio_min_max = tuple(float(r) for r in mask_ratio_min_max)
        self.mask_sample_probability = float(mask_sample_probability)
        self.seed = int(seed)
        self.rank = int(rank)

    def rng_for(self, first_position: int) -> np.random.Generator:
        return numpy_rng(TAG_MASKING, self.seed, self.rank, first_position)

    def __call__(self, samples: Sequence[SSLSample]) -> SSLBatch:
        return collate_ssl_samples(
            samples,
            self.mask_generator,
            self.mask_ratio_min_max,
            self.mask_sample_probability,
            self.rng_for(samples[0].position),
            self.local_crops_size,
        )
