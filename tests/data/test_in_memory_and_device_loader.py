"""`data.in_memory` (one decoded array) and `data.augment_on=device` (crops made per batch by
`to_device`)."""

import itertools

import numpy as np
import pytest
import torch
from data_test_helpers import write_folder

from data import (
    DatasetError,
    InMemoryImages,
    build_dataset,
    build_ssl_loader,
    build_training_dataset,
)


def first_batches(cfg, n, start_step=0, num_workers=None, dataset=None):
    loader = build_ssl_loader(
        cfg, rank=0, world_size=1, start_step=start_step, num_workers=num_workers, dataset=dataset
    )
    return [loader.to_device(b, torch.device("cpu")) for b in itertools.islice(iter(loader), n)]


def test_in_memory_holds_the_decoded_images(small_cfg):
    cfg = small_cfg("data.in_memory=true")
    plain, memory = build_dataset(cfg), build_training_dataset(cfg)
    assert isinstance(memory, InMemoryImages) and len(memory) == len(plain) == 1437
    assert memory.array.shape == (1437, 24, 24, 3) and memory.array.dtype == np.uint8
    for i in (0, 700, 1436):
        image, label = plain[i]
        assert (
            np.array_equal(memory.pixels(i), np.asarray(image)) and int(memory.targets[i]) == label
        )
        assert np.array_equal(np.asarray(memory[i][0]), np.asarray(image)) and memory[i][1] == label
    # the per-image pipeline reads it like the files: identical batches
    a = first_batches(small_cfg(), 2)
    b = first_batches(cfg, 2, dataset=memory)
    for x, y in zip(a, b):
        assert torch.equal(x.global_crops, y.global_crops) and torch.equal(x.masks, y.masks)


def test_in_memory_refuses_mixed_sizes_and_skips_corrupt_files(tmp_path, small_cfg):
    root = write_folder(tmp_path / "d", per_class=3)
    (root / "train" / "a_cls" / "img_0.JPEG").write_bytes(b"not a jpeg")
    cfg = small_cfg("data.dataset=imagenet_folder", f"data.root={root}", "data.in_memory=true")
    memory = build_training_dataset(cfg)
    assert memory.corrupt_skipped == 1 and len(memory) == 6
    with pytest.raises(Exception, match="cannot read image"):
        build_training_dataset(
            small_cfg(
                "data.dataset=imagenet_folder",
                f"data.root={root}",
                "data.in_memory=true",
                "data.on_corrupt=raise",
            )
        )
    from PIL import Image

    Image.new("RGB", (31, 17)).save(root / "train" / "b_cls" / "img_9.JPEG")
    with pytest.raises(DatasetError, match="data.in_memory=true needs images of one size"):
        build_training_dataset(cfg)


def test_device_augmentation_batches(small_cfg):
    cfg = small_cfg("data.augment_on=device", "data.in_memory=true")
    dataset = build_training_dataset(cfg)
    ref = first_batches(cfg, 4, dataset=dataset)
    batch = ref[0]
    assert batch.images is None and batch.first_position is not None
    assert batch.global_crops.shape == (8, 3, 16, 16) and batch.local_crops.shape == (8, 3, 8, 8)
    assert batch.global_crops.dtype == torch.float32 and batch.masks.shape == (8, 16)
    # workers, resume and files-vs-memory give the same batches: draws depend on (seed, rank,
    # position) only
    for other in (
        first_batches(cfg, 4, num_workers=2, dataset=dataset),
        first_batches(cfg, 4),
        [None] + first_batches(cfg, 3, start_step=1, dataset=dataset),
    ):
        for a, b in zip(ref[1:], other[1:]):
            for k in ("global_crops", "local_crops", "masks", "labels"):
                assert torch.equal(getattr(a, k), getattr(b, k)), k
    assert not torch.equal(ref[0].global_crops, ref[1].global_crops)
    seed1 = first_batches(small_cfg("data.augment_on=device", "train.seed=8"), 1)[0]
    assert not torch.equal(seed1.global_crops, batch.global_crops)


@pytest.mark.usefixtures("fresh_dynamo")
def test_compiled_device_augmentation_gives_the_same_batches(small_cfg):
    """`data.augment_compile=true` (under `train.compile_backend=aot_eager`, which runs the traced
    ops as they are) gives the loader's batches bit for bit: the same draws from the same (seed,
    rank, position), through one graph."""
    eager = small_cfg("data.augment_on=device", "data.in_memory=true")
    compiled = small_cfg(
        "data.augment_on=device",
        "data.in_memory=true",
        "data.augment_compile=true",
        "train.compile_backend=aot_eager",
    )
    dataset = build_training_dataset(eager)
    for a, b in zip(
        first_batches(eager, 2, dataset=dataset), first_batches(compiled, 2, dataset=dataset)
    ):
        for k in ("global_crops", "local_crops", "masks"):
            assert torch.equal(getattr(a, k), getattr(b, k)), k
