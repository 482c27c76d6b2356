"""iBOT block masking: the reference's BEiT-style `MaskingGenerator`, drawing from an explicit numpy
Generator."""

import math

import numpy as np


def _uniform(rng: np.random.Generator, a: float, b: float) -> float:
    """Python's `random.uniform(a, b)`: a + (b - a) * U[0, 1); also defined for b < a (the reference
    relies on it)."""
    return a + (b - a) * rng.random()


class MaskingGenerator:
    """Random rectangular blocks of patches, as in BEiT / DINOv2 (`dinov2/data/masking.py`).

    `gen(num_masking_patches, rng)` returns a bool (height, width) mask with at most
    `num_masking_patches` True patches (True = masked). Blocks are added until that count is reached
    or a block cannot be placed: each block gets up to 10 tries with area uniform in
    [min_num_patches, remaining budget capped at max_num_patches] and log-uniform aspect ratio in
    [min_aspect, max_aspect]; a try counts when it adds new patches without exceeding the budget.
    """

    def __init__(
        self,
        input_size,
        num_masking_patches: int | None = None,
        min_num_patches: int = 4,
        max_num_patches: float | None = None,
        min_aspect: float = 0.3,
        max_aspect: float | None = None,
    ):
        if not isinstance(input_size, (tuple, list)):
            input_size = (input_size,) * 2
        self.height, self.width = int(input_size[0]), int(input_size[1])
        self.num_patches = self.height * self.width
        self.num_masking_patches = num_masking_patches
        self.min_num_patches = min_num_patches
        self.max_num_patches = num_masking_patches if max_num_patches is None else max_num_patches
        max_aspect = max_aspect or 1 / min_aspect
        self.log_aspect_ratio = (math.log(min_aspect), math.log(max_aspect))

    def __repr__(self) -> str:
        return (
            f"MaskingGenerator({self.height}, {self.width} -> [{self.min_num_patches} ~ "
            f"{self.max_num_patches}], "
            f"log_aspect {self.log_aspect_ratio[0]:.3f} ~ {self.log_aspect_ratio[1]:.3f})"
        )

    def get_shape(self) -> tuple[int, int]:
        return self.height, self.width

    def _mask(self, mask: np.ndarray, max_mask_patches: float, rng: np.random.Generator) -> int:
        delta = 0
        for _ in range(10):
            target_area = _uniform(rng, self.min_num_patches, max_mask_patches)
            aspect_ratio = math.exp(_uniform(rng, *self.log_aspect_ratio))
            h = int(round(math.sqrt(target_area * aspect_ratio)))
            w = int(round(math.sqrt(target_area / aspect_ratio)))
            if w < self.width and h < self.height:
                top = int(rng.integers(0, self.height - h, endpoint=True))
                left = int(rng.integers(0, self.width - w, endpoint=True))
                block = mask[top : top + h, left : left + w]
                new = h * w - int(block.sum())
                # overlap allowed; only new patches count against the budget
                if 0 < new <= max_mask_patches:
                    block[...] = True
                    delta += new
            if delta > 0:
                break
        return delta

    def __call__(
        self, num_masking_patches: int = 0, rng: np.random.Generator | None = None
    ) -> np.ndarray:
        mask = np.zeros(shape=self.get_shape(), dtype=bool)
        if num_masking_patches <= 0:
            return mask
        if rng is None:
            raise ValueError(
                "MaskingGenerator needs an explicit numpy Generator (rng=...) for a non-empty mask"
            )
        mask_count = 0
        while mask_count < num_masking_patches:
            max_mask_patches = min(num_masking_patches - mask_count, self.max_num_patches)
            delta = self._mask(mask, max_mask_patches, rng)
            if delta == 0:
                break
            mask_count += delta
        return mask


def mask_targets(
    n_images: int,
    n_patches: int,
    mask_ratio_min_max,
    mask_sample_probability: float,
    rng: np.random.Generator,
) -> tuple[list[int], int]:
    """Per-image masked-patch targets of one batch of global crops, as the reference's collate.

    n_masked = int(n_images * mask_sample_probability) images get stratified ratios: with probs =
    linspace(min, max, n_masked + 1), image i targets int(n_patches * uniform(probs[i],
    probs[i+1])); the other images target 0. Returns (targets in that unshuffled order, upperbound =
    sum int(n_patches * probs[i+1])).
    """
    n_masked = int(n_images * mask_sample_probability)
    probs = np.linspace(float(mask_ratio_min_max[0]), float(mask_ratio_min_max[1]), n_masked + 1)
    targets, upperbound = [], 0
    for i in range(n_masked):
        targets.append(int(n_patches * _uniform(rng, probs[i], probs[i + 1])))
        upperbound += int(n_patches * probs[i + 1])
    targets += [0] * (n_images - n_masked)
    return targets, upperbound
