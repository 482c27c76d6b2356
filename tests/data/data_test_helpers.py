"""Writers of small image files and folders for the data tests."""

import io
from pathlib import Path

import numpy as np
from PIL import Image


def jpeg_bytes(seed: int, size: int = 20) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def write_folder(
    root: Path,
    split: str = "train",
    classes=("b_cls", "a_cls"),
    per_class: int = 3,
    ext: str = ".JPEG",
) -> Path:
    """root/split/<class>/img_<i><ext> with small random JPEGs; returns root."""
    for c_i, c in enumerate(classes):
        d = root / split / c
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            (d / f"img_{i}{ext}").write_bytes(jpeg_bytes(100 * c_i + i))
    return root
