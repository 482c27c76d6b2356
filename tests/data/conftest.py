"""Fixtures of the data tests: a tiny config on the digits, and writers of small image folders."""

import pytest
from data_test_helpers import write_folder

from configs import load_config

SMALL = [
    "crops.global_crops_size=16",
    "crops.local_crops_size=8",
    "student.patch_size=4",
    "crops.local_crops_number=2",
    "data.digits_image_size=24",
    "train.batch_size_per_gpu=4",
    "train.num_workers=0",
    "train.seed=7",
]


@pytest.fixture
def small_cfg():
    """`small_cfg(*overrides)`: the embedded default config shrunk to 16 px global / 8 px local
    crops."""
    return lambda *overrides: load_config(overrides=SMALL + list(overrides))


@pytest.fixture
def image_folder(tmp_path):
    return write_folder(tmp_path / "imnet")
