"""Corrupt images on the `data.in_memory=true` path: counted in the same `corrupt_skipped` the
per-step path feeds into metrics (per draw, so both paths count alike), and warned through logging,
into the run's log.txt."""

import json
import logging
import os
import subprocess
import sys

import pytest
import torch
from hostile_tree_helpers import (
    REPO,
    assert_clean_log,
    base_tree,
    make_fifo,
    png_bytes,
    put,
    run_isolated,
)
from tiny_run import TINY_MODEL_AND_DATA

from data import CorruptImageError, InMemoryImages, build_ssl_loader, build_training_dataset
from data.datasets import ImageFolderDataset


def truncated_png() -> bytes:
    data = png_bytes(3, size=24)
    return data[: len(data) // 2]


def corrupt_tree(root, bad: dict):
    """base_tree with 4 images per class plus `bad` {relative name: bytes}."""
    base_tree(root, per_class=4)
    for rel, data in bad.items():
        put(os.fsencode(root / "train") + b"/" + os.fsencode(rel), data=data)
    return root


def loader_cfg(small_cfg, root, *extra):
    return small_cfg(
        "data.dataset=imagenet_folder", f"data.root={root}", "train.batch_size_per_gpu=5", *extra
    )


def skipped_over(cfg, steps: int) -> int:
    loader = build_ssl_loader(cfg, rank=0, world_size=1)
    total = 0
    for step, batch in enumerate(loader):
        total += int(batch.corrupt_skipped)
        if step + 1 == steps:
            break
    loader.close()
    return total


def memory_warnings(caplog):
    return [r.getMessage() for r in caplog.records if "decoding into memory" in r.getMessage()]


def test_one_corrupt_image_is_counted_and_warned_through_logging(tmp_path, caplog):
    root = corrupt_tree(tmp_path, {"a/img_1x.png": b"not an image"})
    with caplog.at_level(logging.WARNING):
        memory = InMemoryImages(ImageFolderDataset(str(root), "train"), "skip")
    slot = [i for i in range(len(memory)) if memory.describe(i).endswith("img_1x.png")][0]
    assert (
        memory.corrupt_skipped == 1
        and memory.replaced_at(slot) == 1
        and int(memory.replaced.sum()) == 1
    )
    lines = memory_warnings(caplog)
    assert (
        len(lines) == 1
        and lines[0].startswith("1 of 9 images are unreadable")
        and "img_1x.png" in lines[0]
    )
    assert memory.notes.lines[-1] == lines[0]  # kept, to reach log.txt once it exists


@pytest.mark.parametrize("augment_on", ["workers", "device"])
def test_in_memory_counts_what_the_per_step_path_counts(tmp_path, small_cfg, augment_on):
    root = corrupt_tree(tmp_path, {"a/img_0x.png": b"", "b/img_2x.png": truncated_png()})
    streaming = skipped_over(loader_cfg(small_cfg, root, f"data.augment_on={augment_on}"), 4)
    memory = skipped_over(
        loader_cfg(small_cfg, root, f"data.augment_on={augment_on}", "data.in_memory=true"), 4
    )
    assert streaming == memory == 4  # 20 draws over 2 passes of 10: each broken file met twice


def test_consecutive_corrupt_images_and_one_at_index_0(tmp_path, caplog):
    root = corrupt_tree(tmp_path, {"a/0_bad.png": b"x", "a/img_0x.png": b"y", "a/img_0y.png": b"z"})
    with caplog.at_level(logging.WARNING):
        memory = InMemoryImages(ImageFolderDataset(str(root), "train"), "skip")
    assert memory.replaced[:4].tolist() == [1, 0, 2, 1] and memory.corrupt_skipped == 3
    per_file = [
        r.getMessage() for r in caplog.records if "skipping unreadable image" in r.getMessage()
    ]
    assert sorted(m.split()[3].rsplit("/", 1)[1] for m in per_file) == [
        "0_bad.png",
        "img_0x.png",
        "img_0y.png",
        "img_0y.png",
    ]  # each once per slot it fills
    assert torch.equal(
        torch.from_numpy(memory.pixels(0)), torch.from_numpy(memory.pixels(1))
    )  # the next readable


def test_in_memory_with_a_hostile_name_raises_escaped_or_warns_escaped(tmp_path, caplog, small_cfg):
    root = corrupt_tree(tmp_path, {"b/img_\n\x1b[1m\xff.png".encode("latin-1"): b"junk"})
    cfg = loader_cfg(small_cfg, root, "data.in_memory=true", "data.on_corrupt=raise")
    with pytest.raises(
        CorruptImageError, match=r"img_\\n\\x1b\[1m\\xff\.png.*data.on_corrupt=skip"
    ):
        build_training_dataset(cfg)
    with caplog.at_level(logging.WARNING):
        build_training_dataset(loader_cfg(small_cfg, root, "data.in_memory=true"))
    assert "img_\\n\\x1b[1m\\xff.png" in memory_warnings(caplog)[0]
    assert_clean_log(caplog.text)


def test_in_memory_with_nothing_readable_is_one_clear_error(tmp_path, small_cfg):
    put(tmp_path / "train" / "a" / "x.png", data=b"")
    put(tmp_path / "train" / "b" / "y.png", data=truncated_png())
    with pytest.raises(CorruptImageError, match="all unreadable"):
        build_training_dataset(loader_cfg(small_cfg, tmp_path, "data.in_memory=true"))


def test_in_memory_with_a_fifo_listed_and_one_swapped_in_does_not_hang(tmp_path):
    root = base_tree(tmp_path, per_class=4)
    make_fifo(root / "train" / "a" / "listed_fifo.png")
    out = run_isolated(f"""
        import logging, os; logging.basicConfig(level=logging.WARNING)
        from data import InMemoryImages
        from data.datasets import ImageFolderDataset
        ds = ImageFolderDataset({str(root)!r}, "train")
        os.remove(ds.path(5)); os.mkfifo(ds.path(5))  # after the listing, before decoding
        memory = InMemoryImages(ds, "skip")
        print("replaced", memory.replaced.tolist(), len(memory.notes.lines))
    """)
    assert "replaced [0, 0, 0, 0, 0, 1, 0, 0] 2" in out.stdout
    assert "listed_fifo.png (FIFO)" in out.stderr and "not a regular file (FIFO)" in out.stderr


@pytest.mark.slow
def test_a_run_on_a_hostile_tree_in_memory_logs_clean_lines_and_counts(tmp_path):
    root = corrupt_tree(
        tmp_path / "d", {"a/bad.png": b"junk", b"b/evil\n\x1b[31m\xff.png": b"junk"}
    )
    make_fifo(root / "train" / "b" / "pipe.png")
    for c in "ab":  # crops are 16 px: images of 24
        for i in range(4):
            put(root / "train" / c / f"img_{i}.png", data=png_bytes(i, 24))
    run = tmp_path / "run"
    command = [
        sys.executable,
        str(REPO / "train.py"),
        "--output-dir",
        str(run),
        *TINY_MODEL_AND_DATA,
        "data.dataset=imagenet_folder",
        f"data.root={root}",
        "data.in_memory=true",
        "train.max_steps=2",
        "train.log_period=1",
        "train.batch_size_per_gpu=5",
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    log = (run / "log.txt").read_text(errors="surrogateescape")
    assert_clean_log(log)
    assert (
        "b/pipe.png (FIFO)" in log
        and "2 of 10 images are unreadable" in log
        and "evil\\n\\x1b[31m\\xff.png" in log
    )
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["corrupt_skipped"] >= 1  # 10 draws of 10 slots: both replaced slots are met
