"""Tiny run directories for evaluation tests: a resolved config.yaml and a teacher export, no
training needed."""

from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]

# The smallest model and inputs the embedded default allows: 16-pixel crops of 24-pixel digits,
# patch 8 (4 patches).
TINY_RUN = [
    "student.arch=vit_tiny",
    "crops.global_crops_size=16",
    "crops.local_crops_size=8",
    "data.digits_image_size=24",
]

# Few C values and iterations: the protocol's shape, not its cost.
FAST_EVAL = [
    "linear.n_c=4",
    "linear.max_iter=50",
    "linear.tol=1e-4",
    "features.num_workers=0",
    "knn.ks=[5,20]",
]
MLP_SUFFIXES = ("_pruned_mlp", "_dense_mlp")


def fast(name: str, args=FAST_EVAL) -> str:
    """The record name a probe under `args`' protocol writes where the default protocol's probe
    writes `name`: its label (`protocol_label`, held against a hand-computed hash in
    test_eval_protocol_names.py) before the MLP suffix."""
    from configs.eval_schema import load_eval_config, protocol_label

    label = protocol_label(load_eval_config(None, list(args)))
    stem = name.removesuffix(".json")
    mlp = next((m for m in MLP_SUFFIXES if stem.endswith(m)), "")
    return f"{stem.removesuffix(mlp)}_{label}{mlp}.json" if label else name


def write_teacher(path: Path, cfg, seed: int, step: int = 16) -> None:
    from models.vision_transformer import build_backbone

    torch.manual_seed(seed)
    backbone = build_backbone(cfg.student, img_size=cfg.crops.global_crops_size, drop_path_rate=0.0)
    torch.save({"backbone": backbone.state_dict(), "step": step}, path)


def make_run_dir(root: Path, *overrides: str, seed: int = 0, checkpoint: str = "real") -> Path:
    """`root` as train.py leaves a finished run: config.yaml (resolved) and teacher_backbone.pth.
    `checkpoint`: "real" (a seeded random backbone), "none", or "dummy" (bytes only, for tests that
    fail before loading it)."""
    from configs import load_config, to_yaml

    cfg = load_config(None, [*TINY_RUN, *overrides])
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text(to_yaml(cfg))
    if checkpoint == "real":
        write_teacher(root / "teacher_backbone.pth", cfg, seed)
    elif checkpoint == "dummy":
        (root / "teacher_backbone.pth").write_bytes(b"not loaded")
    return root


def make_image_tree(
    root: Path, classes: int = 3, n_train: int = 4, n_val: int = 2, size: int = 20
) -> Path:
    """An ImageNet-style folder `root/{train,val}/<class>/<i>.png`: a few small images per class,
    each class its own colour (learnable), with per-image noise."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", n_train), ("val", n_val)):
        for c in range(classes):
            folder = root / split / f"class_{c}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                colour = np.zeros(3)
                colour[c % 3] = 200.0
                pixels = np.clip(colour + rng.normal(0, 30, (size, size, 3)), 0, 255).astype(
                    np.uint8
                )
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def make_folder_run(
    tmp_path: Path, *overrides: str, seed: int = 0, checkpoint: str = "real"
) -> Path:
    """A finished-run directory whose dataset is a tiny image folder tree (fast to extract)."""
    tree = make_image_tree(tmp_path / "images")
    return make_run_dir(
        tmp_path / "run",
        "data.dataset=imagenet_folder",
        f"data.root={tree}",
        *overrides,
        seed=seed,
        checkpoint=checkpoint,
    )
