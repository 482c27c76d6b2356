"""In-memory decoding in forked processes (data/decode_pool.py): the same pixels, labels and
replacements as decoding in this process, the per-file warnings logged by the parent, and a bad
image's error raised here."""

import logging
import re

import numpy as np
import pytest
from hostile_tree_helpers import base_tree, png_bytes, put

import data.decode_pool as pool
from data import CorruptImageError, InMemoryImages
from data.datasets import DatasetError, ImageFolderDataset


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 2 images, and a record of whether the forked path ran."""
    monkeypatch.setattr(pool, "CHUNK", 2)
    forked = []
    in_processes = pool._in_processes

    def recording(*args):
        forked.append(True)
        yield from in_processes(*args)

    monkeypatch.setattr(pool, "_in_processes", recording)
    return forked


def tree_with_broken_files(root):
    base_tree(root, per_class=5)
    put(root / "train" / "a" / "img_1x.png", data=b"not an image")
    put(root / "train" / "b" / "img_3x.png", data=png_bytes(7)[:40])
    return root


def unreadable_warnings(caplog) -> list[str]:
    """The per-file warnings, the file descriptor in PIL's reason left out (it is the process's)."""
    return sorted(
        re.sub(r"name=\d+", "name=N", r.getMessage())
        for r in caplog.records
        if "skipping unreadable" in r.getMessage()
    )


def test_forked_decoding_matches_decoding_here_and_logs_the_same_warnings(
    tmp_path, caplog, small_chunks
):
    dataset = ImageFolderDataset(str(tree_with_broken_files(tmp_path)), "train")
    decoded, warned = {}, {}
    for workers in (1, 3):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            decoded[workers] = InMemoryImages(dataset, "skip", workers=workers)
        warned[workers] = unreadable_warnings(caplog)
    assert small_chunks == [True]  # three workers forked, one decoded here
    here, forked = decoded[1], decoded[3]
    assert np.array_equal(here.array, forked.array)
    assert here.targets.tolist() == forked.targets.tolist()
    assert here.replaced.tolist() == forked.replaced.tolist() and forked.corrupt_skipped == 2
    assert len(warned[3]) == 2 and warned[3] == warned[1]


def test_a_bad_image_in_a_child_is_the_error_here(tmp_path, small_chunks):
    root = base_tree(tmp_path, per_class=4)
    put(root / "train" / "b" / "img_9.png", data=png_bytes(3, size=20))
    with pytest.raises(DatasetError, match=r"img_9\.png is 20x20.*data.in_memory=false"):
        InMemoryImages(ImageFolderDataset(str(root), "train"), "skip", workers=2)
    put(root / "train" / "b" / "img_9.png", data=b"junk")
    with pytest.raises(CorruptImageError, match=r"img_9\.png.*data.on_corrupt=skip"):
        InMemoryImages(ImageFolderDataset(str(root), "train"), "raise", workers=2)
    assert small_chunks == [True, True]
