"""The probe job's time request, from the size of the data it probes: feature extraction and the C
sweep grow with the images, so a fixed request is either far too long for a small set (12 hours for
the digits) or too short for ImageNet. Torch-free: the images are counted from the folder listing,
without opening them."""

import math
import os

FLOOR_MIN = 30  # start-up, model load, the C sweep's fixed cost
IMAGES_PER_MIN = (
    5_000  # a ViT-L probe on one GPU: ~20 min of extraction and ~1-2 h of fits for ImageNet's 1.33M
)
DIGITS_IMAGES = 1797


def probe_images(dataset: str, root: str, splits: tuple[str, ...]) -> int | None:
    """Files under `root/<split>/` for each split (imagenet_folder), the bundled set's size
    (digits); None where the folder is not on this machine (it may be only on the cluster's nodes)
    or the kind has no labels."""
    if dataset == "digits":
        return DIGITS_IMAGES
    if dataset != "imagenet_folder":
        return None
    root = os.path.expanduser(root)
    if not all(os.path.isdir(os.path.join(root, split)) for split in splits):
        return None
    count, seen = 0, set()
    for split in splits:
        for top, dirs, files in os.walk(os.path.join(root, split), followlinks=True):
            st = os.stat(top)
            if (
                st.st_dev,
                st.st_ino,
            ) in seen:  # a link back to a folder already counted: a loop, or a second path
                dirs[:] = []
                continue
            seen.add((st.st_dev, st.st_ino))
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            count += sum(1 for f in files if not f.startswith("."))
    return count


def eval_time_min(images: int) -> int:
    """Minutes to ask for a probe of `images` images (train and val splits together)."""
    return FLOOR_MIN + math.ceil(images / IMAGES_PER_MIN)
