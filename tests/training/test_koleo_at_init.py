"""scripts/experiments/koleo_at_init.py: the KoLeo-at-initialisation probe of the residual-stream
numerics, on CPU at ViT-Ti size."""

import json

import numpy as np
import pytest
from PIL import Image

from scripts.experiments.koleo_at_init import main


@pytest.fixture
def image_folder(tmp_path):
    rng = np.random.default_rng(0)
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        for i in range(4):
            smooth = (
                rng.normal(size=(4, 4, 3)).repeat(8, axis=0).repeat(8, axis=1)
            )  # blocky, image-like
            Image.fromarray(np.uint8(np.clip(128 + 40 * smooth, 0, 255))).save(
                tmp_path / cls / f"{i}.png"
            )
    return tmp_path


def test_cases_and_the_layerscale_effect(image_folder, tmp_path):
    out = tmp_path / "koleo.jsonl"
    args = [
        "--images",
        str(image_folder),
        "--count",
        "8",
        "--arch",
        "vit_tiny",
        "--patch-size",
        "8",
        "--size",
        "32",
    ]
    assert main(args + ["--layerscale", "1e-5", "1.0", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["layerscale"], r["residual_dtype"], r["amp_dtype"]) for r in rows] == [
        (ls, res, amp)
        for ls in (1e-5, 1.0)
        for res, amp in (("fp32", "bfloat16"), ("amp", "bfloat16"), ("amp", "float16"))
    ]
    assert all(r["images"] == 8 and np.isfinite(r["koleo"]) for r in rows)
    tiny_ls, large_ls = rows[:3], rows[3:]
    # LayerScale 1: the blocks move the stream by its own size, so bf16 or fp16 residuals barely
    # change KoLeo
    assert max(r["koleo"] for r in large_ls) - min(r["koleo"] for r in large_ls) < 0.05
    # LayerScale 1e-5: the blocks' updates are below bf16's resolution: the class tokens sit closer
    # in bf16
    fp32, bf16 = tiny_ls[0], tiny_ls[1]
    assert bf16["median_nn_distance"] < 0.8 * fp32["median_nn_distance"]
    assert bf16["koleo"] > fp32["koleo"] + 0.1


def test_bad_arguments(image_folder, tmp_path):
    with pytest.raises(SystemExit):
        main(["--images", str(tmp_path / "missing")])
    with pytest.raises(SystemExit):
        main(["--images", str(image_folder), "--count", "1"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="KoLeo needs at least 2"):
        main(["--images", str(tmp_path / "empty")])
