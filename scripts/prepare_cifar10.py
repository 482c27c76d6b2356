"""Unpack the JPEG-q75 CIFAR-10 npz into the ImageNet-style folder tree that
`data.dataset=imagenet_folder` reads:

    python scripts/prepare_cifar10.py --npz ../shared/data/cifar10-jpeg/cifar10_jpeg_bytes.npz --out data/cifar10

writes OUT/train/<class>/<index>.JPEG (the 50,000 training images) and OUT/val/<class>/<index>.JPEG
(the 10,000 test images), <index> being the image's position in its split (zero-padded, so names
sort in the original order). Class folders carry the CIFAR-10 names, whose sorted order is the label
order 0-9, so the folder dataset's class indices equal the original labels. The JPEG bytes are
written unchanged (no re-encoding, no second loss).

The tree is built in a hidden sibling folder and renamed into place at the end: a kill leaves no
half tree at OUT (the next run removes the leftover). An existing OUT is never overwritten: if it is
a complete tree of the same npz (its marker file `prepared_cifar10.json` and its file counts agree),
the script says so and exits 0; otherwise it stops with exit status 1. Exit status 1 also for an npz
that is not the documented format (the message names what).
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import numpy as np

from training.terminal import Progress  # torch-free

# CIFAR-10 label order; sorted() of these names is the same order, which the folder dataset relies
# on
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
assert list(CLASSES) == sorted(CLASSES)
SPLITS = {"train": "train", "test": "val"}  # npz split -> folder
MARKER = "prepared_cifar10.json"
FORMAT = 1


class PrepareError(Exception):
    """Bad input or an existing output that cannot be kept: the message says which."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _array(npz, key: str, path: Path) -> np.ndarray:
    try:
        return npz[key]
    except ValueError as e:  # e.g. an object array, which allow_pickle=False refuses
        raise PrepareError(f"{path}: array {key!r} cannot be read without pickle ({e})") from None


def load_npz(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """{split: (jpeg bytes, offsets, labels)}, each checked against the documented format."""
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise PrepareError(f"{path}: not a readable .npz file ({e})") from None
    with npz:
        if not hasattr(npz, "files"):
            raise PrepareError(f"{path}: a single array, not an .npz archive of arrays")
        expected = [f"{kind}_{split}" for split in SPLITS for kind in ("jpeg", "offsets", "y")]
        missing = [k for k in expected if k not in npz.files]
        if missing:
            raise PrepareError(
                f"{path}: missing arrays {', '.join(missing)} (it holds: {', '.join(npz.files)})"
            )
        splits = {}
        for split in SPLITS:
            jpeg, offsets, labels = (
                _array(npz, f"{kind}_{split}", path) for kind in ("jpeg", "offsets", "y")
            )
            _check_split(path, split, jpeg, offsets, labels)
            splits[split] = (jpeg, offsets.astype(np.int64), labels.astype(np.int64))
    return splits


def _check_split(
    path: Path, split: str, jpeg: np.ndarray, offsets: np.ndarray, labels: np.ndarray
) -> None:
    def bad(message: str) -> PrepareError:
        return PrepareError(f"{path}: {message}")

    if jpeg.dtype != np.uint8 or jpeg.ndim != 1:
        raise bad(f"jpeg_{split} must be a 1-D uint8 array, got {jpeg.dtype} of shape {jpeg.shape}")
    for key, array in ((f"offsets_{split}", offsets), (f"y_{split}", labels)):
        if array.dtype.kind not in "iu" or array.ndim != 1:
            raise bad(
                f"{key} must be a 1-D integer array, got {array.dtype} of shape {array.shape}"
            )
    n = len(labels)
    if n == 0:
        raise bad(f"y_{split} is empty")
    if len(offsets) != n + 1:
        raise bad(
            f"offsets_{split} has {len(offsets)} entries; y_{split} has {n} labels, so it needs "
            f"{n + 1}"
        )
    if offsets[0] != 0 or offsets[-1] != len(jpeg):
        raise bad(
            f"offsets_{split} must run from 0 to len(jpeg_{split}) = {len(jpeg)}, "
            f"got {offsets[0]} to {offsets[-1]}"
        )
    sizes = np.diff(offsets.astype(np.int64))
    if (sizes <= 0).any():
        i = int(np.argmax(sizes <= 0))
        raise bad(
            f"offsets_{split} must increase: image {i} spans [{offsets[i]}, {offsets[i + 1]})"
        )
    out_of_range = (labels < 0) | (labels >= len(CLASSES))
    if out_of_range.any():
        i = int(np.argmax(out_of_range))
        raise bad(f"y_{split}[{i}] = {labels[i]}: labels must be 0-{len(CLASSES) - 1}")
    starts, ends = offsets[:-1].astype(np.int64), offsets[1:].astype(np.int64)
    # every image must be a whole JPEG (start-of-image FFD8 ... end-of-image FFD9): wrong offsets
    # show here
    whole = (
        (sizes >= 4)
        & (jpeg[starts] == 0xFF)
        & (jpeg[np.minimum(starts + 1, len(jpeg) - 1)] == 0xD8)
        & (jpeg[np.maximum(ends - 2, 0)] == 0xFF)
        & (jpeg[ends - 1] == 0xD9)
    )
    if not whole.all():
        i = int(np.argmin(whole))
        raise bad(
            f"image {i} of the {split} split (bytes {starts[i]}-{ends[i]} of jpeg_{split}) is not "
            f"a whole JPEG "
            f"file (no FFD8 start / FFD9 end marker): offsets_{split} does not match jpeg_{split}"
        )


def expected_counts(splits: dict) -> dict:
    """{folder: {class: images}} and {folder: total bytes}: what a complete tree holds (the marker's
    content)."""
    counts, sizes = {}, {}
    for split, folder in SPLITS.items():
        jpeg, offsets, labels = splits[split]
        per_class = np.bincount(labels, minlength=len(CLASSES))
        counts[folder] = {name: int(n) for name, n in zip(CLASSES, per_class)}
        sizes[folder] = int(offsets[-1])
    return {"counts": counts, "bytes": sizes}


def tree_counts(root: Path) -> dict:
    """The same shape as expected_counts, measured on disk."""
    counts, sizes = {}, {}
    for folder in SPLITS.values():
        counts[folder], sizes[folder] = {}, 0
        for name in CLASSES:
            directory = root / folder / name
            entries = list(os.scandir(directory)) if directory.is_dir() else []
            files = [e for e in entries if e.is_file() and e.name.endswith(".JPEG")]
            counts[folder][name] = len(files)
            sizes[folder] += sum(e.stat().st_size for e in files)
    return {"counts": counts, "bytes": sizes}


def existing_tree_matches(out: Path, digest: str, expected: dict) -> str:
    """'' if `out` is a complete tree of this npz, else why not."""
    marker = out / MARKER
    if not marker.is_file():
        return f"it has no {MARKER} (not a tree written by this script, or one cut short)"
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError) as e:
        return f"its {MARKER} is unreadable ({e})"
    if recorded.get("source_sha256") != digest:
        return (
            f"it was prepared from another npz (sha256 "
            f"{str(recorded.get('source_sha256'))[:12]}...)"
        )
    on_disk = tree_counts(out)
    if on_disk != expected:
        return (
            f"its files differ from the npz (on disk: {on_disk['counts']}, {on_disk['bytes']} "
            f"bytes)"
        )
    return ""


def write_tree(root: Path, splits: dict) -> None:
    for split, folder in SPLITS.items():
        jpeg, offsets, labels = splits[split]
        for name in CLASSES:
            (root / folder / name).mkdir(parents=True)
        width = len(str(len(labels) - 1))
        progress = Progress(len(labels), folder, "images", say=print)
        data = memoryview(jpeg)
        for i, label in enumerate(labels.tolist()):
            with open(root / folder / CLASSES[label] / f"{i:0{width}d}.JPEG", "wb") as f:
                f.write(data[offsets[i] : offsets[i + 1]])
            if i % 1000 == 999 or i == len(labels) - 1:
                progress.update(i % 1000 + 1)
        progress.close()


def _remove_stale_partials(out: Path) -> None:
    """Remove the hidden work folders of earlier runs that were killed (their process is gone)."""
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.partial-(\d+)$")
    for path in out.parent.iterdir():
        match = pattern.match(path.name)
        if not match or int(match.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            print(f"removing {path}, left by a run that was stopped")
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:  # alive, someone else's
            pass


def prepare(npz_path: Path, out: Path) -> str:
    """Write the tree; returns a one-line summary. Raises PrepareError."""
    npz_path, out = Path(npz_path), Path(out)
    if not npz_path.is_file():
        raise PrepareError(f"{npz_path}: no such file")
    splits = load_npz(npz_path)
    expected = expected_counts(splits)
    digest = file_sha256(npz_path)
    totals = {folder: sum(c.values()) for folder, c in expected["counts"].items()}
    summary = ", ".join(f"{folder}: {n} images" for folder, n in totals.items())
    if out.exists() and not (
        out.is_dir() and not any(out.iterdir())
    ):  # an empty folder may be replaced
        why = existing_tree_matches(out, digest, expected) if out.is_dir() else "it is not a folder"
        if why:
            raise PrepareError(
                f"{out} already exists and is not a complete tree of {npz_path}: {why}. "
                "Remove it or choose another --out"
            )
        return f"{out} is already complete and identical ({summary}); nothing to do"
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(out)
    work = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        write_tree(work, splits)
        record = {
            "format": FORMAT,
            "source": str(npz_path),
            "source_sha256": digest,
            "classes": list(CLASSES),
            "splits": SPLITS,
            **expected,
        }
        (work / MARKER).write_text(json.dumps(record, indent=1) + "\n")
        try:
            if out.is_dir():
                out.rmdir()  # the empty folder checked above
            os.rename(work, out)
        except (
            OSError
        ) as e:  # another run got there first (or wrote into the empty folder) meanwhile
            why = existing_tree_matches(out, digest, expected)
            if why:
                raise PrepareError(
                    f"{out} appeared while this run was writing and cannot be replaced ({e}): {why}"
                ) from None
            return (
                f"{out} was completed meanwhile by another run and is identical ({summary}); "
                f"nothing to do"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    per_class = ", ".join(
        f"{folder} {min(c.values())}-{max(c.values())} per class"
        for folder, c in expected["counts"].items()
    )
    return f"wrote {out}: {summary} ({per_class}), {len(CLASSES)} classes"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--npz", type=Path, required=True, help="cifar10_jpeg_bytes.npz")
    parser.add_argument(
        "--out", type=Path, required=True, help="folder to create (train/ and val/ inside)"
    )
    args = parser.parse_args(argv)
    # SIGTERM as an exception, so the work folder is removed on the way out (SIGKILL: the next run
    # removes it)
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        print(prepare(args.npz, args.out))
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
