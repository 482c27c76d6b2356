"""A dataset decoded once into one uint8 array (`data.in_memory=true`): for small images (CIFAR-size), where opening
and decoding a file per sample per step costs more than the step's augmentation and model together.

The array is shared with forked data workers without copying (numpy pages are read, never written). Unreadable
files follow `data.on_corrupt` at decoding time: skipped (logged, the next readable image takes the slot, as the
per-step path does) or raised.
"""

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Tuple

import numpy as np
from PIL import Image

from .corrupt import load_image
from .datasets import DatasetError

logger = logging.getLogger(__name__)

LOG_EVERY_S = 10.0


class InMemoryImages:
    """`dataset`'s images as one (N, H, W, 3) uint8 array; same `classes`, `targets`, `describe` and
    `__getitem__` -> (PIL RGB image, label) as the dataset it was built from, plus `pixels(i)` (the array row)."""

    def __init__(self, dataset, on_corrupt: str = "skip", threads: int = 8):
        n = len(dataset)
        self.classes = list(getattr(dataset, "classes", []))
        self.targets = np.asarray(dataset.targets, dtype=np.int64).copy()
        self._describe = dataset.describe
        self.corrupt_skipped = 0
        first, _, _ = load_image(dataset, 0, on_corrupt)
        shape = np.asarray(first).shape
        self.array = np.empty((n, *shape), dtype=np.uint8)
        start = last_log = time.perf_counter()

        def decode(i: int) -> Tuple[int, int]:
            image, label, skipped = load_image(dataset, i, on_corrupt)
            pixels = np.asarray(image)
            if pixels.shape != shape:
                raise DatasetError(f"data.in_memory=true needs images of one size: {dataset.describe(i)} is "
                                   f"{pixels.shape[1]}x{pixels.shape[0]}, {dataset.describe(0)} is "
                                   f"{shape[1]}x{shape[0]} (set data.in_memory=false for this dataset)")
            self.array[i] = pixels
            return label, skipped

        with ThreadPoolExecutor(max(1, threads)) as pool:  # PIL releases the GIL while decoding
            for i, (label, skipped) in enumerate(pool.map(decode, range(n), chunksize=256)):
                self.targets[i] = label  # a skipped file's slot holds its replacement's image and label
                self.corrupt_skipped += skipped
                now = time.perf_counter()
                if now - last_log > LOG_EVERY_S:
                    logger.info("decoding into memory: %d/%d images", i + 1, n)
                    last_log = now
        logger.info("decoded %d images (%dx%d) into memory in %.1f s (%.0f MB)%s", n, shape[1], shape[0],
                    time.perf_counter() - start, self.array.nbytes / 2**20,
                    f"; {self.corrupt_skipped} unreadable files replaced" if self.corrupt_skipped else "")

    def __len__(self) -> int:
        return len(self.targets)

    def describe(self, index: int) -> str:
        return self._describe(index)

    def pixels(self, index: int) -> np.ndarray:
        return self.array[index]

    def __getitem__(self, index: int) -> Tuple[Image.Image, int]:
        return Image.fromarray(self.array[index]), int(self.targets[index])
