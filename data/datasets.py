"""Image datasets for SSL training and probes: an ImageNet-style folder tree, any folder of images
(unlabelled, for pre-training on one's own images), and scikit-learn's bundled digits.

Each returns `(PIL RGB image, int label)` from `__getitem__` (or `(transform(image), label)` when
given a `transform`, e.g. `make_eval_transform()` for a probe), and exposes `kind` (its
`data.dataset` name), `classes` (empty where unlabelled: every target is then 0), `targets` and
`describe(i)` (what to name in a log line about item i). `build_dataset(cfg)` picks one by
`data.dataset`.

What the folder tree may hold (FIFOs, sockets, devices, symlinks and their loops, names that are not
UTF-8 or hold control characters) and what becomes of each: `data/tree.py`. Names reach logs and
error messages only through `tree.printable`.
"""

import hashlib
import importlib.util
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from configs.schema import DATASETS
from rundir.errors import CommandError

from .tree import (
    DataNotes,
    NotRegularFile,
    TreeReport,
    list_classes,
    open_regular,
    printable,
    scan_image_tree,
)

logger = logging.getLogger(__name__)


class DatasetError(CommandError, FileNotFoundError):
    """A dataset that cannot be built as configured; the message says what was expected."""


class CorruptImageError(CommandError, OSError):
    """An image file that cannot be decoded. `path` and `reason` say which and why.

    Raised in a DataLoader worker, only its text reaches the main process, where PyTorch rebuilds
    the exception from that one string (a traceback): the path and the reason are read back from its
    last `cannot read image` line (there as `tree.printable` wrote them: escaping is idempotent, so
    the message is the same on both sides)."""

    def __init__(self, path: str, reason: str | None = None):
        if reason is None:
            found = re.findall(r"cannot read image '(.*)': (.*)", path)
            path, reason = (
                found[-1] if found else ("(in a data worker)", path.strip().splitlines()[-1])
            )
        self.path, self.reason = path, printable(reason)  # PIL's messages may quote the name raw
        super().__init__(f"cannot read image '{printable(path)}': {self.reason}")

    def __reduce__(self):
        return type(self), (self.path, self.reason)


def _image_extensions() -> tuple[str, ...]:
    """Every file extension PIL can decode (JPEG, PNG, GIF, TIFF, WebP, BMP, ...), lower case."""
    Image.init()
    return tuple(sorted(ext.lower() for ext in Image.registered_extensions()))


IMG_EXTENSIONS = _image_extensions()


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL image as 8-bit RGB, scaling rather than clipping high bit depths: PIL's own
    convert("RGB") clips 16-bit, 32-bit integer and float images to 255 (a 16-bit PNG comes out
    nearly all white)."""
    if image.mode.startswith("I;16"):
        return Image.fromarray((np.asarray(image, dtype=np.uint16) >> 8).astype(np.uint8)).convert(
            "RGB"
        )
    if image.mode in ("I", "F"):
        a = np.asarray(image, dtype=np.float64)
        a = np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)
        lo, hi = float(a.min()), float(a.max())
        # 16-bit data in a 32-bit mode (some PNG/TIFF readers)
        if image.mode == "I" and lo >= 0 and hi <= 65535:
            scale = 255.0 / 65535.0 if hi > 255 else 1.0
            a = a * scale
        elif image.mode == "F" and lo >= 0 and hi <= 1:
            a = a * 255.0
        elif hi > lo:  # anything else: its own range onto 0..255
            a = (a - lo) * (255.0 / (hi - lo))
        return Image.fromarray(np.clip(np.rint(a), 0, 255).astype(np.uint8)).convert("RGB")
    return image.convert("RGB")


def _listing(path: str, limit: int = 8) -> str:
    try:
        names = sorted(os.listdir(path))
    except OSError as e:
        return f"(cannot list: {printable(e)})"
    if not names:
        return "(empty)"
    more = f", ... ({len(names)} entries)" if len(names) > limit else ""
    return ", ".join(printable(n) for n in names[:limit]) + more


class _ImageFiles:
    """Images read from files listed once: the paths kept in one bytes blob plus offsets rather than
    a list of Python strings, so forked DataLoader workers do not copy them page by page on access
    (refcount writes), which matters at ImageNet scale. Subclasses list the files (`_scan`) and keep
    them (`_keep`)."""

    kind = ""

    def _scan(
        self,
        base_dir: str,
        classes: list[str],
        report: TreeReport | None = None,
        skip_hidden: bool = False,
    ) -> list[tuple[str, int]]:
        """`tree.scan_image_tree`'s (path, class index) list; what it left out is kept
        (`tree_report`) and logged."""
        samples, self.tree_report = scan_image_tree(
            base_dir, classes, IMG_EXTENSIONS, report, skip_hidden
        )
        for line in self.tree_report.warnings(base_dir):
            self.notes.warn(line, logger)
        return samples

    def _keep(self, base_dir: str, samples: list[tuple[str, int]], classes: list[str]) -> None:
        self.base_dir = base_dir
        encoded = [
            os.path.relpath(p, base_dir).encode("utf-8", "surrogateescape") for p, _ in samples
        ]
        self._offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=self._offsets[1:])
        self._blob = b"".join(encoded)
        self.targets = np.asarray([t for _, t in samples], dtype=np.int64)
        self.fingerprint = images_fingerprint(
            self.kind,
            "\n".join(classes).encode("utf-8", "surrogateescape"),
            self._offsets.tobytes(),
            self._blob,
            self.targets.tobytes(),
        )

    def __len__(self) -> int:
        return len(self.targets)

    def path(self, index: int) -> str:
        rel = self._blob[self._offsets[index] : self._offsets[index + 1]].decode(
            "utf-8", "surrogateescape"
        )
        return os.path.join(self.base_dir, rel)

    describe = path

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        path = self.path(index)
        try:
            with open_regular(
                path
            ) as f:  # never blocks on a FIFO that replaced the file since the listing
                image = Image.open(f)
                image = to_rgb(image)  # decodes the whole file: truncated data raises here
        except NotRegularFile as e:
            raise CorruptImageError(path, str(e)) from None
        except (
            Exception
        ) as e:  # PIL raises OSError, SyntaxError, ValueError, struct.error, ... on bad files
            raise CorruptImageError(path, f"{type(e).__name__}: {e}") from e
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.targets[index])


def _existing_root(root: str, expected: str) -> str:
    """`data.root` expanded, or a DatasetError saying what it should hold."""
    if not root:
        raise DatasetError(f"data.root is empty: set data.root to the folder holding {expected}")
    root = os.path.expanduser(str(root))
    if not os.path.isdir(root):
        raise DatasetError(
            f"data.root={root!r} does not exist or is not a folder (config key data.root); "
            f"expected {printable(os.path.join(root, expected))}"
        )
    return root


class ImageFolderDataset(_ImageFiles):
    """ImageNet-style tree `root/<split>/<class>/<image>` (extensions as torchvision's ImageFolder,
    any case).

    Classes are the sorted non-hidden sub-folders of `root/<split>`; images are the regular files
    with an image extension under them, in torchvision's `make_dataset` order (sorted, so indices
    are stable across processes and runs), listed by `tree.scan_image_tree` (non-regular entries and
    symlink loops are skipped and logged).
    """

    kind = "imagenet_folder"

    def __init__(
        self,
        root: str,
        split: str = "train",
        transform: Callable | None = None,
        split_key: str = "data.split",
    ):
        self.transform = transform
        self.notes = (
            DataNotes()
        )  # warnings about the tree, kept for the run's log (`DataNotes.log_again`)
        root = _existing_root(root, os.path.join(split, "<class>", "<image>.JPEG"))
        split_dir = os.path.join(root, split)
        if not os.path.isdir(split_dir):
            raise DatasetError(
                f"data.root={root!r} has no '{printable(split)}' folder ({split_key}={split!r}): "
                f"expected {printable(os.path.join(split_dir, '<class>', '<image>.JPEG'))}; "
                f"{printable(root)} holds: {_listing(root)}"
            )
        shown = printable(split_dir)
        try:
            report = TreeReport()
            classes = list_classes(split_dir, report)
        except OSError as e:
            raise DatasetError(f"cannot list {shown}: {printable(e.strerror or e)}") from None
        if not classes:
            raise DatasetError(
                f"{shown} has no class folders: expected {shown}/<class>/<image>.JPEG "
                f"(one sub-folder per class; for a folder of images without classes, "
                f"data.dataset=image_folder); it holds: {_listing(split_dir)}"
            )
        samples = self._scan(split_dir, classes, report)
        if not samples:
            raise DatasetError(
                f"no images under {shown}/<class>/: expected regular files ending in "
                f"{', '.join(IMG_EXTENSIONS)} (any case) in its {len(classes)} class folders "
                f"({_listing(split_dir, 4)})"
            )
        counts = np.bincount([t for _, t in samples], minlength=len(classes))
        empty = [c for c, n in zip(classes, counts) if n == 0]
        if empty:
            self.notes.warn(
                f"{len(empty)} class folders of {shown} hold no images: "
                f"{', '.join(printable(c) for c in empty[:10])}",
                logger,
            )

        self.root, self.split, self.split_dir = root, split, split_dir
        self.classes: list[str] = classes
        self.class_to_idx = {c: i for i, c in enumerate(classes)}
        self._keep(split_dir, samples, classes)
        logger.info("ImageFolderDataset %s: %d images, %d classes", shown, len(self), len(classes))


class UnlabelledImageFolder(_ImageFiles):
    """Every image under `root`, at any depth (a flat folder, or nested ones), for pre-training on
    one's own images: folder names are not labels (`classes` is empty, every target 0). Hidden files
    and folders (`.cache/`, `.DS_Store`) are left out, the rest as `tree.scan_image_tree` lists a
    class folder, in its sorted order."""

    kind = "image_folder"

    def __init__(self, root: str, transform: Callable | None = None):
        self.transform = transform
        self.notes = DataNotes()
        root = _existing_root(root, "<image>.JPEG (at any depth)")
        shown = printable(root)
        samples = self._scan(root, [""], skip_hidden=True)
        if not samples:
            raise DatasetError(
                f"no images under {shown} (data.dataset=image_folder takes every image at any "
                f"depth): "
                f"expected regular files ending in {', '.join(IMG_EXTENSIONS)} (any case); it "
                f"holds: "
                f"{_listing(root)}"
            )
        held = [s for s in ("train", "val") if os.path.isdir(os.path.join(root, s))]
        if held == ["train", "val"]:  # pre-training on a probe's held-out images is a silent leak
            self.notes.warn(
                f"{shown} holds train/ and val/: data.dataset=image_folder pre-trains on the "
                f"images of "
                f"both; set data.root={printable(os.path.join(root, 'train'))} to keep val/ out",
                logger,
            )
        self.root, self.split = root, ""
        self.classes: list[str] = []
        self._keep(root, [(p, 0) for p, _ in samples], [])
        logger.info("UnlabelledImageFolder %s: %d images, unlabelled", shown, len(self))


DIGITS_SPLITS = ("train", "val", "all")


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """`sklearn.datasets.load_digits()`'s images (1797, 8, 8, values 0..16) and targets, read from
    the CSV that scikit-learn ships and `load_digits` reads (`sklearn/datasets/data/digits.csv.gz`:
    64 pixels and the label per row) without importing scikit-learn, whose import (scipy.stats)
    outlasts a tiny run's training steps; `load_digits` itself where that file is not there.
    ImportError without scikit-learn."""
    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the digits dataset is scikit-learn's: pip install scikit-learn")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if path.is_file():
        table = np.loadtxt(path, delimiter=",", ndmin=2)
        if table.shape == (1797, 65):
            return table[:, :64].reshape(-1, 8, 8), table[:, 64].astype(int)
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images, digits.target


class DigitsDataset:
    """scikit-learn's bundled handwritten digits (`sklearn.datasets.load_digits`): 1797 real 8x8
    grayscale images of the digits 0-9 (UCI optical recognition set), shipped inside scikit-learn,
    so nothing is downloaded.

    Pixel values 0..16 are scaled to 0..255 (ink bright on a dark background), replicated to RGB and
    upscaled to `image_size` x `image_size` with bicubic interpolation (from
    `data.digits_image_size`), so the multi-crop augmentation sees images larger than its crops.
    Splits: "val" = every 5th image (indices 0, 5, 10, ...: 360 images), "train" = the other 1437,
    "all" = all 1797; the SSL run uses "train" and a probe can hold out "val".
    """

    kind = "digits"

    def __init__(
        self, image_size: int = 64, split: str = "train", transform: Callable | None = None
    ):
        self.transform = transform
        if split not in DIGITS_SPLITS:
            raise DatasetError(
                f"data.split={split!r} is not a split of the digits dataset: use one of "
                f"{', '.join(DIGITS_SPLITS)}"
            )
        images, targets = load_digits_arrays()
        keep = np.arange(len(targets))
        if split != "all":
            is_val = keep % 5 == 0
            keep = keep[is_val] if split == "val" else keep[~is_val]
        self.images = np.round(images[keep] * (255.0 / 16.0)).astype(np.uint8)  # (n, 8, 8)
        self.targets = targets[keep].astype(np.int64)
        self.indices = keep  # indices into load_digits()
        self.classes = [str(c) for c in range(10)]
        self.image_size = int(image_size)
        self.split = split
        self.fingerprint = images_fingerprint(
            "digits", str(self.image_size).encode(), keep.astype(np.int64).tobytes()
        )

    def __len__(self) -> int:
        return len(self.targets)

    def describe(self, index: int) -> str:
        return f"digits[{int(self.indices[index])}]"

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        image = Image.fromarray(self.images[index]).convert("RGB")
        if self.image_size != image.width:
            image = image.resize((self.image_size, self.image_size), Image.Resampling.BICUBIC)
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.targets[index])


def images_fingerprint(kind: str, *parts: bytes) -> str:
    """16 hex digits naming a split's images: its class names, each image's path relative to the
    split (or its index in a bundled set) and label, in order. The same tree at another path gives
    the same fingerprint, any other tree another: what lets the tables tell seeds on one data set
    from runs on two (run_info.json's `data_fingerprint`)."""
    digest = hashlib.sha256(kind.encode())
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()[:16]


def build_dataset(
    cfg, split: str | None = None, transform: Callable | None = None, split_key: str = "data.split"
):
    """The dataset named by `data.dataset` (`imagenet_folder` | `image_folder` | `digits`), for
    `split` (default `data.split`; image_folder has none), applying `transform` to each image if
    given. `cfg` is a `Config` or its `DataConfig`.
    """
    data = getattr(cfg, "data", cfg)
    split = data.split if split is None else split
    if data.dataset == "imagenet_folder":
        return ImageFolderDataset(data.root, split, transform, split_key)
    if data.dataset == "image_folder":
        return UnlabelledImageFolder(data.root, transform)
    if data.dataset == "digits":
        return DigitsDataset(data.digits_image_size, split, transform)
    raise DatasetError(f"data.dataset={data.dataset!r} is not one of {', '.join(DATASETS)}")


def dataset_summary(dataset) -> dict:
    """What the start-up summary and run_info.json say of the training images (no path: run_info may
    be published)."""
    classes = len(getattr(dataset, "classes", []))
    return {"dataset": getattr(dataset, "kind", ""), "images": len(dataset), "classes": classes}
