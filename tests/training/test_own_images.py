"""Pre-training on one's own folder of images (data.dataset=image_folder), end to end: the start-up
summary names the data set, its root and the image count, run_info.json records them (without the
path), and a broken file in the folder is skipped and counted as in any other data set."""

import json

from PIL import Image
from train_runs import run_train

from rundir.metrics import read_metrics


def test_a_flat_and_nested_folder_of_images_trains_and_says_what_it_read(tmp_path):
    root = tmp_path / "my photos"
    (root / "trip" / "day 2").mkdir(parents=True)
    (root / ".thumbs").mkdir()
    for i, name in enumerate(
        [
            "a.png",
            "b.png",
            "c.png",
            "trip/d.png",
            "trip/day 2/e.png",
            "trip/day 2/f.png",
            ".thumbs/g.png",
        ]
    ):
        Image.new("RGB", (24, 24), (40 * i, 255 - 30 * i, 7 * i)).save(root / name)
    (root / "trip" / "broken.png").write_bytes(b"\x89PNG truncated")
    result = run_train(
        tmp_path / "run",
        "data.dataset=image_folder",
        f"data.root={root}",
        "train.max_steps=4",
        "train.batch_size_per_gpu=7",
    )
    log = (tmp_path / "run" / "log.txt").read_text()
    assert (
        f"start-up: data: image_folder at {root}: 7 images, unlabelled" in log
    )  # 6 images + the broken one
    assert "1 hidden files and folders under" in log and ".thumbs" in log
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert (info["dataset"], info["images"], info["classes"]) == ("image_folder", 7, 0)
    assert str(root) not in json.dumps(info)
    assert (
        read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]["corrupt_skipped"] >= 1
    )  # 28 draws of 7 files
    assert "broken.png" in log and result.returncode == 0
