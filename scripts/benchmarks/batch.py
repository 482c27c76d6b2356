"""One synthetic training batch for the step benchmarks: the loader's shapes and the real collate's
iBOT masks, random pixels, so that the data pipeline is out of the measurement."""

from __future__ import annotations

import torch

from data.batch import SSLBatch
from data.collate import SSLCollate, SSLSample


def synthetic_batch(cfg, device, rank: int = 0, seed: int = 0) -> SSLBatch:
    """A batch shaped exactly like the loader's for `rank`: real masks from the collate, random
    pixels drawn from `seed` (sample positions rank * batch + i, so ranks differ where the loader's
    would)."""
    gen = torch.Generator().manual_seed(seed)
    g, loc, n = (
        cfg.crops.global_crops_size,
        cfg.crops.local_crops_size,
        cfg.crops.local_crops_number,
    )
    b = cfg.train.batch_size_per_gpu
    samples = [
        SSLSample(
            global_crops=[torch.randn(3, g, g, generator=gen) for _ in range(2)],
            local_crops=[torch.randn(3, loc, loc, generator=gen) for _ in range(n)],
            label=0,
            position=rank * b + i,
            corrupt_skipped=0,
        )
        for i in range(b)
    ]
    collate = SSLCollate(
        patches_per_side=g // cfg.student.patch_size,
        local_crops_size=loc,
        mask_ratio_min_max=tuple(cfg.ibot.mask_ratio_min_max),
        mask_sample_probability=cfg.ibot.mask_sample_probability,
        seed=0,
        rank=rank,
    )
    return collate(samples).to(device)
