"""scripts/prepare_cifar10.py on a tiny synthetic npz: the tree the folder dataset reads, bytes
unchanged, bad inputs refused with the array named, reruns, and no half tree after a failure."""

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "prepare_cifar10.py"


@pytest.fixture(scope="module")
def prep():
    spec = importlib.util.spec_from_file_location("prepare_cifar10", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=75)
    return buf.getvalue()


def _split(n: int, seed: int):
    images = [_jpeg(seed + i) for i in range(n)]
    offsets = np.cumsum([0] + [len(b) for b in images]).astype(np.int64)
    labels = (np.arange(n) * 3 % 10).astype(np.uint8)  # every class, out of order
    return np.frombuffer(b"".join(images), dtype=np.uint8), offsets, labels, images


def make_npz(path: Path, **replace) -> tuple[Path, dict]:
    arrays, images = {}, {}
    for split, n, seed in (("train", 23, 0), ("test", 11, 1000)):
        jpeg, offsets, labels, images[split] = _split(n, seed)
        arrays.update({f"jpeg_{split}": jpeg, f"offsets_{split}": offsets, f"y_{split}": labels})
    arrays.update(replace)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    np.savez(path, **arrays)
    return path, images


def test_tree_holds_the_original_bytes_in_label_order(prep, tmp_path, capsys):
    npz, images = make_npz(tmp_path / "c.npz")
    out = tmp_path / "cifar"
    assert prep.main(["--npz", str(npz), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "train: 23 images, val: 11 images" in printed and "10 classes" in printed
    labels = np.load(npz)["y_train"]
    for i, data in enumerate(images["train"]):
        assert (out / "train" / prep.CLASSES[labels[i]] / f"{i:02d}.JPEG").read_bytes() == data
    assert (out / "val" / "automobile" / "07.JPEG").read_bytes() == images["test"][
        7
    ]  # 7 * 3 % 10 = 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npz", "cifar"]  # no work folder left
    marker = json.loads((out / prep.MARKER).read_text())
    assert (
        marker["counts"]["val"]["airplane"] == 2 and sum(marker["counts"]["train"].values()) == 23
    )

    from data.datasets import ImageFolderDataset

    dataset = ImageFolderDataset(str(out), "train")
    assert dataset.classes == list(prep.CLASSES)
    # the dataset's class index of each file is the npz label of that image
    for path_index, target in enumerate(dataset.targets):
        index = int(Path(dataset.path(path_index)).stem)
        assert target == labels[index]


def test_rerun_is_a_no_op_and_a_damaged_tree_is_refused(prep, tmp_path, capsys):
    npz, _ = make_npz(tmp_path / "c.npz")
    out = tmp_path / "cifar"
    assert prep.main(["--npz", str(npz), "--out", str(out)]) == 0
    capsys.readouterr()
    assert prep.main(["--npz", str(npz), "--out", str(out)]) == 0
    assert "already complete and identical" in capsys.readouterr().out
    (out / "val" / "bird" / "04.JPEG").unlink()
    assert prep.main(["--npz", str(npz), "--out", str(out)]) == 1
    assert "its files differ from the npz" in capsys.readouterr().err
    # another npz: refused too, the tree is left as it is
    other, _ = make_npz(tmp_path / "other.npz", y_test=np.zeros(11, dtype=np.uint8))
    assert prep.main(["--npz", str(other), "--out", str(out)]) == 1
    assert "prepared from another npz" in capsys.readouterr().err


def test_existing_foreign_folder_is_not_touched(prep, tmp_path, capsys):
    npz, _ = make_npz(tmp_path / "c.npz")
    out = tmp_path / "cifar"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert prep.main(["--npz", str(npz), "--out", str(out)]) == 1
    assert f"no {prep.MARKER}" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    (out / "mine.txt").unlink()  # an empty folder is fine
    assert prep.main(["--npz", str(npz), "--out", str(out)]) == 0


def _shifted_offsets():
    _, offsets, _, _ = _split(23, 0)
    offsets = offsets.copy()
    offsets[5] += 3  # image 4 gets 3 bytes of image 5: neither ends nor starts where it should
    return offsets


@pytest.mark.parametrize(
    "replace, message",
    [
        ({"offsets_train": "shifted"}, "image 4 of the train split"),
        (
            {"offsets_test": np.zeros(12, dtype=np.int64)},
            "offsets_test must run from 0 to len(jpeg_test)",
        ),
        (
            {"offsets_train": np.arange(5, dtype=np.int64)},
            "offsets_train has 5 entries; y_train has 23 labels",
        ),
        ({"y_train": np.full(23, 10, dtype=np.uint8)}, "y_train[0] = 10: labels must be 0-9"),
        ({"jpeg_test": np.zeros((3, 4), dtype=np.uint8)}, "jpeg_test must be a 1-D uint8 array"),
        (
            {"offsets_test": np.zeros(12, dtype=np.float32)},
            "offsets_test must be a 1-D integer array",
        ),
        ({"y_test": None}, "missing arrays y_test"),
    ],
)
def test_bad_npz_is_refused_with_the_array_named(prep, tmp_path, capsys, replace, message):
    if isinstance(replace.get("offsets_train"), str):
        replace = {"offsets_train": _shifted_offsets()}
    npz, _ = make_npz(tmp_path / "bad.npz", **replace)
    out = tmp_path / "cifar"
    assert prep.main(["--npz", str(npz), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert message in err and str(npz) in err
    assert not out.exists()


def test_not_an_npz(prep, tmp_path, capsys):
    (tmp_path / "x.npz").write_bytes(b"not a zip")
    assert prep.main(["--npz", str(tmp_path / "x.npz"), "--out", str(tmp_path / "o")]) == 1
    assert "not a readable .npz file" in capsys.readouterr().err
    assert prep.main(["--npz", str(tmp_path / "absent.npz"), "--out", str(tmp_path / "o")]) == 1
    assert "no such file" in capsys.readouterr().err


def test_a_failure_midway_leaves_no_tree_and_leftovers_are_removed(prep, tmp_path, monkeypatch):
    npz, _ = make_npz(tmp_path / "c.npz")
    out = tmp_path / "cifar"
    real_write = prep.write_tree

    def dies_halfway(root, splits):
        (root / "train" / "cat").mkdir(parents=True)
        (root / "train" / "cat" / "00.JPEG").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(prep, "write_tree", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        prep.prepare(npz, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npz"]
    monkeypatch.setattr(prep, "write_tree", real_write)
    # a run killed outright (SIGKILL) leaves its work folder; its process is gone, so the next run
    # removes it
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f".cifar.partial-{int(gone.stdout)}"
    (stale / "train").mkdir(parents=True)
    prep.prepare(npz, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npz", "cifar"]


def test_command_line_prints_plain_progress_off_a_terminal(tmp_path):
    npz, _ = make_npz(tmp_path / "c.npz")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--npz", str(npz), "--out", str(tmp_path / "cifar")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "train: 23/23 images" in result.stdout and "val: 11/11 images" in result.stdout
    assert "wrote " in result.stdout
