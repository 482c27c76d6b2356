"""Images of any mode and format, and unreadable files behind data workers (the eval side:
tests/evaluation/ test_eval_outputs.py)."""

import numpy as np
import pytest
from PIL import Image
from train_runs import run_train

from data.datasets import CorruptImageError, ImageFolderDataset


def tree(root, files: dict):
    for rel, writer in files.items():
        path = root / "train" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        writer(path)
    return root


def rgb(path, seed=0):
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(
        path
    )


def test_every_mode_decodes_to_8_bit_rgb_without_clipping(tmp_path):
    ramp16 = (np.arange(16 * 16, dtype=np.uint32).reshape(16, 16) * 257).astype(
        np.uint16
    )  # 0 .. 65535
    files = {
        "a/gray16.png": lambda p: Image.fromarray(ramp16).save(p),
        "a/float.tiff": lambda p: Image.fromarray(
            np.linspace(0, 1, 256, dtype=np.float32).reshape(16, 16)
        ).save(p),
        "a/palette.gif": lambda p: Image.fromarray(ramp16 >> 8).convert("P").save(p),
        "a/rgba.png": lambda p: Image.new("RGBA", (16, 16), (10, 200, 30, 0)).save(p),
        "a/cmyk.jpg": lambda p: Image.new("CMYK", (16, 16), (0, 255, 255, 0)).save(p),
        "a/bilevel.bmp": lambda p: Image.new("1", (16, 16), 1).save(p),
        "a/notes.txt": lambda p: p.write_text("not an image"),
    }
    ds = ImageFolderDataset(str(tree(tmp_path, files)), "train")
    names = sorted(ds.path(i).rsplit("/", 1)[1] for i in range(len(ds)))
    assert names == [
        "bilevel.bmp",
        "cmyk.jpg",
        "float.tiff",
        "gray16.png",
        "palette.gif",
        "rgba.png",
    ]  # GIF in
    for i in range(len(ds)):
        image, _ = ds[i]
        assert image.mode == "RGB" and image.size == (16, 16)
        a = np.asarray(image)
        if ds.path(i).endswith(("gray16.png", "float.tiff")):
            assert a.min() <= 1 and a.max() >= 254 and 100 < a.mean() < 155, ds.path(
                i
            )  # a full ramp, not clipped
    assert np.asarray(ds[names.index("cmyk.jpg")][0])[0, 0, 0] > 200  # CMYK (0,255,255,0) is red


def test_non_images_are_logged_not_silently_dropped(tmp_path, caplog):
    tree(tmp_path, {"a/x.png": rgb, "a/readme.md": lambda p: p.write_text("x"), "b/y.png": rgb})
    ds = ImageFolderDataset(str(tmp_path), "train")
    assert len(ds) == 2 and "1 files under" in caplog.text and "readme.md" in caplog.text


def test_the_error_survives_the_worker_boundary():
    """What PyTorch does with an exception raised in a DataLoader worker: rebuilds it from one
    string."""
    original = CorruptImageError(
        "/data/train/cat/broken.png", "UnidentifiedImageError: cannot identify image file"
    )
    wrapped = (
        "Caught CorruptImageError in DataLoader worker process 1.\nOriginal Traceback (most recent "
        "call last):\n"
        '  File "x.py", line 1, in f\ndata.datasets.CorruptImageError: ' + str(original)
    )
    again = CorruptImageError(wrapped)
    assert (again.path, again.reason) == (original.path, original.reason) and str(again) == str(
        original
    )
    import pickle

    assert str(pickle.loads(pickle.dumps(original))) == str(original)


@pytest.mark.slow
@pytest.mark.parametrize(
    "files,message",
    [
        (
            {
                "cat/0.png": rgb,
                "cat/broken.png": lambda p: p.write_bytes(b"no image"),
                "dog/1.png": rgb,
            },
            "broken.png",
        ),
        (
            {"cat/0.png": lambda p: p.write_bytes(b"x"), "dog/1.png": lambda p: p.write_bytes(b"")},
            "all unreadable",
        ),
    ],
    ids=["raise-with-workers", "nothing-readable-with-workers"],
)
def test_unreadable_images_behind_data_workers_are_one_clear_line(tmp_path, files, message):
    root = tree(tmp_path / "data", files)
    on_corrupt = "raise" if message == "broken.png" else "skip"
    result = run_train(
        tmp_path / "run",
        "data.dataset=imagenet_folder",
        f"data.root={root}",
        "train.num_workers=2",
        f"data.on_corrupt={on_corrupt}",
        "train.max_steps=2",
        "train.batch_size_per_gpu=3",
        check=False,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "CorruptImageError: cannot read image" in last and message in last, last
    assert "Traceback" not in result.stderr and "DataLoader worker" not in last
