"""Did a run on the embedded default learn anything? k-NN top-1 of its teacher on the held-out digits.

    python scripts/knn_digits.py runs/default-20261122-101500 [more run dirs] [--random-init]

Features: final-norm CLS of the exported teacher backbone (`teacher_backbone.pth`) on the 1437 `train` digits
(the images the run trained on, labels unused by training) and the 360 `val` digits; cosine-similarity k-NN with
the reference's softmax(sim / 0.07) vote, k = 20. `--random-init` also scores an untrained backbone of the same
architecture, the baseline the trained one must beat. One JSON line per run on stdout.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from configs import load_config  # noqa: E402
from data import build_dataset  # noqa: E402  (first: makes torchvision importable on CPU torch)
from data.transforms import make_normalize_transform  # noqa: E402

import torchvision.transforms as T  # noqa: E402
from models.vision_transformer import build_backbone  # noqa: E402


@torch.no_grad()
def features(backbone, dataset, device) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.stack([dataset[i][0] for i in range(len(dataset))])
    labels = torch.tensor([dataset[i][1] for i in range(len(dataset))])
    feats = torch.cat([backbone(images[i : i + 256].to(device)).float() for i in range(0, len(images), 256)])
    return F.normalize(feats, dim=-1).cpu(), labels


def knn_top1(train, val, k: int = 20, temperature: float = 0.07) -> float:
    (f_train, y_train), (f_val, y_val) = train, val
    top = (f_val @ f_train.t()).topk(k, dim=1)
    votes = torch.zeros(len(f_val), int(y_train.max()) + 1)
    votes.scatter_add_(1, y_train[top.indices], (top.values / temperature).exp())
    return (votes.argmax(1) == y_val).float().mean().item()


def score(run: Path, random_init: bool, device) -> dict:
    cfg = load_config(run / "config.yaml")
    if cfg.data.dataset != "digits":
        raise SystemExit(f"{run}: data.dataset={cfg.data.dataset}; this probe is for the embedded digits default")
    torch.manual_seed(cfg.train.seed)
    backbone = build_backbone(cfg.student, img_size=cfg.crops.global_crops_size).to(device).eval()
    if not random_init:
        backbone.load_state_dict(torch.load(run / "teacher_backbone.pth", map_location=device, weights_only=True)["backbone"])
    size = cfg.crops.global_crops_size
    transform = T.Compose([T.Resize(size, interpolation=T.InterpolationMode.BICUBIC), T.ToTensor(),
                           make_normalize_transform()])
    train, val = (features(backbone, build_dataset(cfg, split=s, transform=transform), device) for s in ("train", "val"))
    return {"run": str(run), "weights": "random init" if random_init else "teacher", "knn20_top1": knn_top1(train, val)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--random-init", action="store_true", help="also score an untrained backbone")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for run in args.runs:
        for random_init in ([False, True] if args.random_init else [False]):
            print(json.dumps(score(run, random_init, device)), flush=True)


if __name__ == "__main__":
    main()
