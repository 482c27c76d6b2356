"""A dataset decoded once into one uint8 array (`data.in_memory=true`): for small images
(CIFAR-size), where opening and decoding a file per sample per step costs more than the step's
augmentation and model together.

The array is shared with forked data workers without copying (numpy pages are read, never written).
Unreadable files follow `data.on_corrupt` at decoding time: skipped (logged, the next readable image
takes the slot, as the per-step path does) or raised.

A replaced file counts where the per-step path counts it: each time its slot is drawn, the sample
reports the files skipped to fill it (`replaced_at`), so `corrupt_skipped` in metrics.jsonl is the
same with and without `data.in_memory` (it is not a count of distinct files: that number is in the
warning logged after decoding).
"""

import logging
import time

import numpy as np
from PIL import Image

from .corrupt import load_image
from .decode_pool import decode_chunks, default_workers
from .tree import SHOWN, DataNotes, printable

logger = logging.getLogger(__name__)

LOG_EVERY_S = 10.0


class InMemoryImages:
    """`dataset`'s images as one (N, H, W, 3) uint8 array; same `classes`, `targets`, `describe` and
    `__getitem__` -> (PIL RGB image, label) as the dataset it was built from, plus `pixels(i)` (the
    array row)."""

    def __init__(self, dataset, on_corrupt: str = "skip", workers: int | None = None):
        """`workers`: processes (Linux) or threads decoding at once (`decode_pool.py`); default
        the CPUs this process may use, at most 8."""
        workers = default_workers() if workers is None else workers
        n = len(dataset)
        self.classes = list(getattr(dataset, "classes", []))
        self.targets = np.asarray(dataset.targets, dtype=np.int64).copy()
        self.fingerprint = getattr(
            dataset, "fingerprint", ""
        )  # the images it decodes: the same data set
        self.kind = getattr(dataset, "kind", "")
        self._describe = dataset.describe
        self.notes = DataNotes()  # the tree's warnings and this decoding's, kept for the run's log
        inner = getattr(dataset, "notes", None)
        if inner is not None:
            self.notes.extend(inner)
        self.replaced = np.zeros(n, dtype=np.int64)  # per slot: unreadable files skipped to fill it
        start = last_log = time.perf_counter()
        first, self.targets[0], self.replaced[0] = load_image(dataset, 0, on_corrupt)
        shape = np.asarray(first).shape
        self.array = np.empty((n, *shape), dtype=np.uint8)
        self.array[0] = np.asarray(first)

        for first_index, pixels, labels, skipped in decode_chunks(
            dataset, on_corrupt, shape, workers
        ):
            stop = first_index + len(labels)
            self.array[first_index:stop] = pixels
            # a skipped file's slot holds its replacement's image and label
            self.targets[first_index:stop] = labels
            self.replaced[first_index:stop] = skipped
            now = time.perf_counter()
            if now - last_log > LOG_EVERY_S:
                logger.info("decoding into memory: %d/%d images", stop, n)
                last_log = now
        bad = np.flatnonzero(self.replaced)
        self.corrupt_skipped = len(bad)  # distinct unreadable files (each slot's own file)
        if len(bad):
            names = ", ".join(printable(dataset.describe(int(i))) for i in bad[:SHOWN])
            self.notes.warn(
                f"{len(bad)} of {n} images are unreadable and were replaced by the next readable "
                f"one "
                f"while decoding into memory (data.on_corrupt=skip); each draw of one counts in "
                f"corrupt_skipped: {names}{', ...' if len(bad) > SHOWN else ''}",
                logger,
            )
        logger.info(
            "decoded %d images (%dx%d) into memory in %.1f s (%.0f MB)",
            n,
            shape[1],
            shape[0],
            time.perf_counter() - start,
            self.array.nbytes / 2**20,
        )

    def __len__(self) -> int:
        return len(self.targets)

    def describe(self, index: int) -> str:
        return self._describe(index)

    def replaced_at(self, index: int) -> int:
        """Unreadable files skipped to fill slot `index` (what reading it from disk would report
        each time)."""
        return int(self.replaced[index])

    def pixels(self, index: int) -> np.ndarray:
        return self.array[index]

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return Image.fromarray(self.array[index]), int(self.targets[index])
