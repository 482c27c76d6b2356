"""Datasets (folder tree, digits), their errors, and the corrupt-image policy with real broken
files."""

import logging

import numpy as np
import pytest
import torch
from data_test_helpers import jpeg_bytes, write_folder
from PIL import Image

from data import (
    CorruptImageError,
    DatasetError,
    DigitsDataset,
    ImageFolderDataset,
    build_dataset,
    build_ssl_loader,
    load_image,
    make_eval_transform,
)


def test_image_folder_classes_sorted_and_extensions(tmp_path):
    root = write_folder(tmp_path / "r", classes=("zebra", "ant"), per_class=2)
    (root / "train" / "ant" / "lower.jpg").write_bytes(jpeg_bytes(9))
    (root / "train" / "ant" / "notes.txt").write_text(
        "not an image"
    )  # ignored: not an image extension
    (root / "train" / ".ipynb_checkpoints").mkdir()  # hidden folders are not classes
    Image.new("RGB", (5, 7), (1, 2, 3)).save(root / "train" / "zebra" / "p.PNG")
    ds = ImageFolderDataset(str(root), "train")
    assert ds.classes == ["ant", "zebra"]
    assert len(ds) == 6 and ds.targets.tolist() == [0, 0, 0, 1, 1, 1]
    assert [p.rsplit("/", 1)[1] for p in map(ds.path, range(6))] == [
        "img_0.JPEG",
        "img_1.JPEG",
        "lower.jpg",
        "img_0.JPEG",
        "img_1.JPEG",
        "p.PNG",
    ]
    image, label = ds[5]
    assert (
        isinstance(image, Image.Image)
        and image.mode == "RGB"
        and image.size == (5, 7)
        and label == 1
    )


def test_image_folder_errors(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DatasetError, match=r"data\.root") as e:
        ImageFolderDataset(str(missing))
    assert str(missing) in str(e.value)
    with pytest.raises(DatasetError, match="data.root is empty"):
        ImageFolderDataset("")
    write_folder(tmp_path / "r", split="val")
    with pytest.raises(
        DatasetError, match=r"no 'train' folder.*train/<class>/<image>\.JPEG.*holds: val"
    ):
        ImageFolderDataset(str(tmp_path / "r"), "train")
    (tmp_path / "flat" / "train").mkdir(parents=True)
    (tmp_path / "flat" / "train" / "a.JPEG").write_bytes(jpeg_bytes(0))
    with pytest.raises(DatasetError, match="no class folders"):
        ImageFolderDataset(str(tmp_path / "flat"))
    (tmp_path / "empty" / "train" / "cls").mkdir(parents=True)
    (tmp_path / "empty" / "train" / "cls" / "readme.md").write_text("x")
    with pytest.raises(DatasetError, match=r"no images under .*\.jpeg"):
        ImageFolderDataset(str(tmp_path / "empty"))
    assert issubclass(DatasetError, FileNotFoundError)


def test_digits_arrays_are_scikit_learns_without_importing_it(monkeypatch, tmp_path):
    import importlib.util
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    from data.datasets import load_digits_arrays

    reference = load_digits()
    images, targets = load_digits_arrays()
    assert images.shape == (1797, 8, 8) and np.array_equal(images, reference.images)
    assert np.array_equal(targets, reference.target)
    # a training run on digits does not pay for scikit-learn's (and scipy's) import
    code = (
        "import sys; from data import DigitsDataset; DigitsDataset(16, 'train'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
    # where the shipped file is not found, scikit-learn's own loader; without scikit-learn, an
    # ImportError
    real_find_spec = importlib.util.find_spec
    elsewhere = importlib.machinery.ModuleSpec("sklearn", None, is_package=True)
    elsewhere.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: elsewhere if name == "sklearn" else real_find_spec(name, *a),
    )
    assert np.array_equal(load_digits_arrays()[0], reference.images)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ImportError, match="pip install scikit-learn"):
        load_digits_arrays()


def test_digits():
    full = DigitsDataset(image_size=24, split="all")
    train, val = DigitsDataset(24, "train"), DigitsDataset(24, "val")
    assert (len(full), len(train), len(val)) == (1797, 1437, 360)
    assert set(full.targets.tolist()) == set(range(10)) and full.classes == [
        str(i) for i in range(10)
    ]
    assert not set(train.indices.tolist()) & set(val.indices.tolist())
    image, label = full[0]
    assert image.mode == "RGB" and image.size == (24, 24) and label == 0
    a = np.asarray(image)
    assert (a[..., 0] == a[..., 1]).all() and a.max() > 200 and a.min() < 30
    assert DigitsDataset(8, "all")[0][0].size == (8, 8)
    with pytest.raises(DatasetError, match="train, val, all"):
        DigitsDataset(24, "test")


def test_build_dataset(small_cfg, image_folder):
    assert isinstance(build_dataset(small_cfg()), DigitsDataset)
    assert len(build_dataset(small_cfg(), split="val")) == 360
    cfg = small_cfg("data.dataset=imagenet_folder", f"data.root={image_folder}")
    ds = build_dataset(cfg)
    assert isinstance(ds, ImageFolderDataset) and ds.classes == ["a_cls", "b_cls"] and len(ds) == 6
    assert len(build_dataset(cfg.data)) == 6
    x, label = build_dataset(cfg, split="train", transform=make_eval_transform(resize=16, crop=12))[
        5
    ]
    assert x.shape == (3, 12, 12) and label == 1
    x, label = build_dataset(
        small_cfg(), split="val", transform=make_eval_transform(resize=16, crop=12)
    )[0]
    assert x.shape == (3, 12, 12) and label == 0


@pytest.fixture
def corrupt_folder(tmp_path):
    """One class, 6 files sorted as: good, truncated JPEG, zero bytes, text as .jpg, good, good."""
    d = tmp_path / "c" / "train" / "only"
    d.mkdir(parents=True)
    good = jpeg_bytes(1, size=64)
    (d / "0_good.jpg").write_bytes(good)
    (d / "1_truncated.jpg").write_bytes(good[: len(good) // 2])
    (d / "2_empty.jpg").write_bytes(b"")
    (d / "3_text.jpg").write_text("this is not an image\n")
    (d / "4_good.jpg").write_bytes(jpeg_bytes(2))
    Image.new("RGB", (6, 6), (9, 9, 9)).save(d / "5_good.png")
    return tmp_path / "c"


@pytest.mark.parametrize(
    "index, name", [(1, "1_truncated.jpg"), (2, "2_empty.jpg"), (3, "3_text.jpg")]
)
def test_corrupt_raises_naming_the_file(corrupt_folder, index, name):
    ds = ImageFolderDataset(str(corrupt_folder))
    with pytest.raises(CorruptImageError, match=name) as e:
        ds[index]
    assert e.value.path.endswith(name)
    with pytest.raises(CorruptImageError, match=f"{name}.*data.on_corrupt=skip"):
        load_image(ds, index, "raise")


def test_corrupt_skip_logs_counts_and_takes_next(corrupt_folder, caplog):
    ds = ImageFolderDataset(str(corrupt_folder))
    with caplog.at_level(logging.WARNING, logger="data.corrupt"):
        image, _, skipped = load_image(ds, 1, "skip")
    assert skipped == 3 and np.array_equal(np.asarray(image), np.asarray(ds[4][0]))
    text = caplog.text
    for name, reason in (
        ("1_truncated.jpg", "truncated"),
        ("2_empty.jpg", "cannot identify"),
        ("3_text.jpg", "cannot identify"),
    ):
        assert name in text and reason in text
    assert load_image(ds, 0, "skip")[2] == 0
    with pytest.raises(ValueError, match="on_corrupt"):
        load_image(ds, 0, "ignore")


def test_corrupt_count_travels_in_the_batch(small_cfg, corrupt_folder):
    cfg = small_cfg(
        "data.dataset=imagenet_folder", f"data.root={corrupt_folder}", "train.batch_size_per_gpu=6"
    )
    batch = next(iter(build_ssl_loader(cfg, rank=0, world_size=1, start_step=0)))
    # one pass over the 6 files: samples at the 3 broken files skip 3, 2 and 1 files
    assert int(batch.corrupt_skipped) == 6
    assert batch.global_crops.shape == (12, 3, 16, 16) and torch.isfinite(batch.global_crops).all()
    cfg = small_cfg(
        "data.dataset=imagenet_folder",
        f"data.root={corrupt_folder}",
        "train.batch_size_per_gpu=6",
        "data.on_corrupt=raise",
    )
    with pytest.raises(CorruptImageError, match=r"(truncated|empty|text)\.jpg"):
        next(iter(build_ssl_loader(cfg, rank=0, world_size=1, start_step=0)))


def test_the_fingerprint_names_the_images_not_the_path(tmp_path):
    """run_info.json's data_fingerprint: the same tree at another path agrees; a renamed image, an
    image moved to another class or a different split does not; the bundled digits differ by split
    and image size."""
    import shutil

    write_folder(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "elsewhere" / "b")
    first = ImageFolderDataset(str(tmp_path / "a"), "train").fingerprint
    assert (
        len(first) == 16
        and ImageFolderDataset(str(tmp_path / "elsewhere" / "b"), "train").fingerprint == first
    )
    images = sorted((tmp_path / "elsewhere" / "b" / "train" / "a_cls").iterdir())
    images[0].rename(images[0].with_name("renamed.jpg"))
    renamed = ImageFolderDataset(str(tmp_path / "elsewhere" / "b"), "train").fingerprint
    (tmp_path / "elsewhere" / "b" / "train" / "a_cls" / "renamed.jpg").rename(
        tmp_path / "elsewhere" / "b" / "train" / "b_cls" / "renamed.jpg"
    )
    moved = ImageFolderDataset(str(tmp_path / "elsewhere" / "b"), "train").fingerprint
    assert len({first, renamed, moved}) == 3
    digits = {
        DigitsDataset(size, split).fingerprint
        for size, split in ((64, "train"), (64, "val"), (32, "train"))
    }
    assert (
        len(digits) == 3
        and DigitsDataset(64, "train").fingerprint == DigitsDataset(64, "train").fingerprint
    )
