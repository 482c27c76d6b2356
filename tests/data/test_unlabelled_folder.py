"""data.dataset=image_folder: pre-training on any folder of images, flat or nested, folder names not
labels. The listing is checked against an independent walk (os.walk, sorted by hand), with the
awkward entries a user's folder holds: hidden files and folders, text files, a broken image, a split
layout that would leak val/ into pre-training."""

import logging
import os

import pytest
from data_test_helpers import jpeg_bytes, write_folder
from PIL import Image

from configs import load_config
from data import (
    DatasetError,
    ImageFolderDataset,
    UnlabelledImageFolder,
    build_dataset,
    dataset_summary,
)
from data.datasets import IMG_EXTENSIONS


def _messy_folder(root):
    """Images flat and two levels down, a hidden folder of thumbnails, a hidden file, a text file, a
    broken JPEG."""
    (root / "holiday" / "day2").mkdir(parents=True)
    (root / ".thumbnails").mkdir()
    for name in (
        "b.jpg",
        "a.PNG",
        "holiday/z.jpeg",
        "holiday/day2/c.JPG",
        ".thumbnails/t.jpg",
        ".hidden.jpg",
    ):
        (root / name).write_bytes(jpeg_bytes(len(name)))
    (root / "notes.txt").write_text("not an image")
    (root / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    return root


def _independent_listing(root):
    """Every non-hidden file with an image extension, by os.walk: per folder (sorted by path) its
    files by name."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [
            (folder, name)
            for name in files
            if not name.startswith(".") and name.lower().endswith(IMG_EXTENSIONS)
        ]
    return [os.path.join(folder, name) for folder, name in sorted(found)]


def test_every_image_at_any_depth_unlabelled_hidden_entries_left_out(tmp_path, caplog):
    root = _messy_folder(tmp_path / "mine")
    with caplog.at_level(logging.WARNING):
        ds = UnlabelledImageFolder(str(root))
    paths = [ds.path(i) for i in range(len(ds))]
    assert paths == _independent_listing(root)
    assert [os.path.relpath(p, root) for p in paths] == [
        "a.PNG",
        "b.jpg",
        "broken.jpg",
        "holiday/z.jpeg",
        "holiday/day2/c.JPG",
    ]  # sorted by folder, then name
    assert ds.classes == [] and ds.targets.tolist() == [0] * 5 and ds.kind == "image_folder"
    assert dataset_summary(ds) == {"dataset": "image_folder", "images": 5, "classes": 0}
    assert "2 hidden files and folders under" in caplog.text and ".hidden.jpg" in caplog.text
    assert "notes.txt" in caplog.text
    image, label = ds[0]
    assert image.mode == "RGB" and label == 0


def test_a_flat_folder_and_one_with_a_single_subfolder_both_train(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(3):
        Image.new("RGB", (9, 9), (i, 0, 0)).save(flat / f"{i}.png")
    single = tmp_path / "single"
    (single / "only").mkdir(parents=True)
    (single / "only" / "x.jpg").write_bytes(jpeg_bytes(1))
    assert (
        len(build_dataset(load_config(None, ["data.dataset=image_folder", f"data.root={flat}"])))
        == 3
    )
    assert (
        len(build_dataset(load_config(None, ["data.dataset=image_folder", f"data.root={single}"])))
        == 1
    )
    with pytest.raises(DatasetError, match="no class folders.*data.dataset=image_folder"):
        ImageFolderDataset(str(tmp_path), "flat")  # the class-tree kind points to the folder kind


def test_a_folder_with_train_and_val_warns_that_val_would_be_pre_trained_on(tmp_path, caplog):
    root = write_folder(write_folder(tmp_path / "set", "train"), "val")
    with caplog.at_level(logging.WARNING):
        ds = UnlabelledImageFolder(str(root))
    assert len(ds) == 12
    assert "holds train/ and val/" in caplog.text and f"data.root={root / 'train'}" in caplog.text
    assert ds.notes.lines  # kept for the run's log.txt


def test_no_images_and_no_root_are_errors_naming_what_was_expected(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("x")
    with pytest.raises(DatasetError, match=r"no images under .*docs.*any depth.*holds: a\.txt"):
        UnlabelledImageFolder(str(tmp_path / "docs"))
    with pytest.raises(DatasetError, match="does not exist"):
        UnlabelledImageFolder(str(tmp_path / "nowhere"))
    with pytest.raises(DatasetError, match="data.root is empty"):
        UnlabelledImageFolder("")


def test_the_class_tree_keeps_its_fingerprint(tmp_path):
    """The refactor under both folder kinds must not rename committed runs' data (run_info.json's
    data_fingerprint): the value below was computed by the code before image_folder existed."""
    ds = ImageFolderDataset(str(write_folder(tmp_path / "r")), "train")
    assert ds.fingerprint == "97692880b8905316"
    unlabelled = UnlabelledImageFolder(str(tmp_path / "r" / "train"))
    assert (
        unlabelled.fingerprint != ds.fingerprint
    )  # the same files, read without labels: another data set
