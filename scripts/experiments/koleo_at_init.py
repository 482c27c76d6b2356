"""KoLeo of the class tokens of a freshly initialised backbone, per residual-stream numerics: does a
low-precision residual stream (`train.residual_dtype=amp`) change what KoLeo sees at the start of
training, and is LayerScale why?

    python scripts/experiments/koleo_at_init.py --images data/cifar10/train --arch vit_large --size 112 \
        --layerscale 1e-5 1e-1

Reads --count images evenly spaced over the sorted paths under --images (e.g. a prepared CIFAR-10
split), builds one backbone per LayerScale init (seed 0) and evaluates it on CPU under autocast as
`fp32` (bf16 matmuls, fp32 residual stream) and as `amp` in bf16 and in fp16 (the reference's
param_dtype choices), all from the same weights. Prints one line and writes one JSON line (--out)
per case: KoLeo of the batch's class tokens and the median nearest-neighbour distance between them.
With LayerScale at 1e-5 each block adds ~1e-5 of the stream, below bf16's resolution, so the class
tokens of different images differ less in bf16 than in fp32 (results/bench/NOTES.md, "What do the
reference's numerics cost?").
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

CASES = (("fp32", "bfloat16"), ("amp", "bfloat16"), ("amp", "float16"))


def load_images(root: Path, count: int, size: int):
    """(count, 3, size, size) ImageNet-normalised tensor of `count` images evenly spaced over the
    sorted image paths under `root` (the extensions the datasets read)."""
    import torch
    from PIL import Image

    from data.datasets import IMG_EXTENSIONS
    from data.transforms import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    paths = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMG_EXTENSIONS and p.is_file())
    paths = paths[:: max(1, len(paths) // count)][
        :count
    ]  # evenly spaced: every class of a class-per-folder tree
    if len(paths) < 2:
        raise SystemExit(f"{root}: {len(paths)} image(s); KoLeo needs at least 2")
    pixels = []
    for p in paths:
        with Image.open(p) as im:
            pixels.append(np.asarray(im.convert("RGB").resize((size, size), Image.BICUBIC)))
    x = torch.from_numpy(np.stack(pixels)).permute(0, 3, 1, 2).float() / 255
    mean = torch.tensor(IMAGENET_DEFAULT_MEAN)[:, None, None]
    std = torch.tensor(IMAGENET_DEFAULT_STD)[:, None, None]
    return (x - mean) / std


def koleo_cases(x, arch: str, patch_size: int, layerscale: float) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from models import vision_transformer
    from models.losses.koleo_loss import KoLeoLoss
    from training.numerics import apply_residual_dtype

    def build():
        build_arch = getattr(vision_transformer, arch)
        return build_arch(
            img_size=x.shape[-1], patch_size=patch_size, init_values=layerscale
        ).eval()

    torch.manual_seed(0)
    state = build().state_dict()
    rows = []
    for residual_dtype, amp_dtype in CASES:
        model = build()
        model.load_state_dict(state)
        apply_residual_dtype(model, residual_dtype)
        with torch.no_grad(), torch.autocast("cpu", dtype=getattr(torch, amp_dtype)):
            cls = model.forward_features(x)["x_norm_clstoken"]
            koleo = KoLeoLoss()(cls).item()
        unit = F.normalize(cls.double(), dim=-1)
        dist = (unit[:, None] - unit[None]).norm(
            dim=-1
        )  # direct differences: no cancellation of a Gram matrix
        dist.fill_diagonal_(float("inf"))
        rows.append(
            {
                "arch": arch,
                "layerscale": layerscale,
                "residual_dtype": residual_dtype,
                "amp_dtype": amp_dtype,
                "images": x.shape[0],
                "size": x.shape[-1],
                "koleo": koleo,
                "median_nn_distance": dist.min(dim=1).values.median().item(),
                "cls_dtype": str(cls.dtype).split(".")[-1],
            }
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--images", type=Path, required=True, help="a folder of images (read recursively, sorted)"
    )
    ap.add_argument("--count", type=int, default=32, help="images in the batch (default 32)")
    from models.vision_transformer import ARCH_SIZES  # the architectures the models build, one list

    ap.add_argument("--arch", default="vit_large", choices=sorted(ARCH_SIZES))
    ap.add_argument("--patch-size", type=int, default=16)
    ap.add_argument("--size", type=int, default=112, help="image side in pixels (default 112)")
    ap.add_argument("--layerscale", type=float, nargs="+", default=[1e-5, 1e-1])
    ap.add_argument("--out", type=Path, default=None, help="JSONL file for the cases")
    args = ap.parse_args(argv)
    if args.count < 2:
        ap.error("--count must be >= 2 (KoLeo needs a nearest neighbour)")
    if not args.images.is_dir():
        ap.error(f"--images {args.images}: not a directory")
    x = load_images(args.images, args.count, args.size)
    rows = []
    for layerscale in args.layerscale:
        for row in koleo_cases(x, args.arch, args.patch_size, layerscale):
            print(
                f"layerscale {layerscale:g}, residual {row['residual_dtype']}, autocast "
                f"{row['amp_dtype']}: "
                f"KoLeo {row['koleo']:.4f}, median nearest-neighbour distance "
                f"{row['median_nn_distance']:.3e}",
                flush=True,
            )
            rows.append(row)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
