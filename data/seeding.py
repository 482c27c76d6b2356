"""Seeds for every random draw of the data pipeline, derived from (train.seed, stream position,
...).

Nothing in `data/` reads a global random state: each draw comes from a generator seeded here, so a
batch is a pure function of the config, the rank and its position in the sample stream (independent
of `num_workers` and of where a run was resumed). Each consumer has its own tag, so two streams
never share a seed.
"""

import numpy as np

TAG_PERMUTATION = 0x5045524D  # sampler: one permutation per pass over the dataset
TAG_AUGMENTATION = 0x41554731  # multi-crop augmentation of one sample
TAG_MASKING = 0x4D41534B  # iBOT masks of one batch
TAG_LOADER = 0x4C4F4144  # the DataLoader's own (unused by us) base seed
TAG_DEVICE_AUGMENTATION = 0x44415547  # multi-crop augmentation of one batch on the training device


def _check(values) -> list:
    out = [int(v) for v in values]
    if any(v < 0 for v in out):
        raise ValueError(f"seeds and positions must be >= 0, got {out}")
    return out


def seed_sequence(tag: int, *values: int) -> np.random.SeedSequence:
    return np.random.SeedSequence(_check((tag, *values)))


def numpy_rng(tag: int, *values: int) -> np.random.Generator:
    """An independent numpy Generator for (tag, *values)."""
    return np.random.default_rng(seed_sequence(tag, *values))


def torch_seed(tag: int, *values: int) -> int:
    """A 63-bit seed for `torch.manual_seed` / `torch.Generator.manual_seed` for (tag, *values)."""
    lo, hi = seed_sequence(tag, *values).generate_state(2, np.uint32)
    return ((int(hi) << 32) | int(lo)) & 0x7FFF_FFFF_FFFF_FFFF
