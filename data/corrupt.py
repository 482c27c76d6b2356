"""Loading with the `data.on_corrupt` policy: skip (log, count, take the next index) or raise."""

import logging

from PIL import Image

from .datasets import CorruptImageError
from .tree import printable

logger = logging.getLogger(__name__)

ON_CORRUPT = ("skip", "raise")
MAX_CONSECUTIVE_CORRUPT = 100


def load_image(dataset, index: int, on_corrupt: str = "skip") -> tuple[Image.Image, int, int]:
    """`dataset[index]` -> (image, label, number of unreadable files skipped to get it).

    With on_corrupt="skip" an unreadable file is logged (path and reason) and replaced by the next
    index (index + 1, + 2, ... modulo len(dataset)), which keeps the replacement deterministic. With
    "raise" the `CorruptImageError` naming the file propagates.
    """
    if on_corrupt not in ON_CORRUPT:
        raise ValueError(f"data.on_corrupt={on_corrupt!r} is not one of {', '.join(ON_CORRUPT)}")
    n = len(dataset)
    for skipped in range(min(n, MAX_CONSECUTIVE_CORRUPT)):
        i = (index + skipped) % n
        try:
            image, label = dataset[i]
            return image, label, skipped
        except CorruptImageError as e:
            if on_corrupt == "raise":
                raise CorruptImageError(
                    e.path,
                    f"{e.reason} (data.on_corrupt=raise; set data.on_corrupt=skip "
                    "to log and skip unreadable images)",
                ) from e
            logger.warning(
                "skipping unreadable image %s (%s); using index %d instead",
                printable(e.path),
                e.reason,
                (i + 1) % n,
            )
    raise CorruptImageError(
        dataset.describe(index),
        f"it and the next {min(n, MAX_CONSECUTIVE_CORRUPT) - 1} images are all unreadable",
    )
