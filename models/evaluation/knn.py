"""Weighted k-NN classification on frozen features, as the reference's `eval/knn.py`.

Features are L2-normalised, so the similarity is the cosine; each of the k nearest train features votes for its
label with weight exp(similarity / T) (T = 0.07); the class with the largest summed weight wins. Several k are
scored from one top-max(k) search. k is clipped to the number of train features.
"""

from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor


@torch.no_grad()
def knn_classify(train_x: Tensor, train_y: Tensor, val_x: Tensor, val_y: Tensor, ks: Iterable[int] = (10, 20, 100, 200),
                 temperature: float = 0.07, n_classes: Optional[int] = None, batch_size: int = 256
                 ) -> dict[int, dict[str, float]]:
    """{k: {"top1": %, "top5": %}} for each k (after clipping; duplicate k collapse). Runs on train_x's device."""
    if len(train_y) == 0:
        raise ValueError("k-NN needs at least one train feature")
    device = train_x.device
    n_classes = n_classes or int(max(train_y.max(), val_y.max())) + 1
    ks = sorted({min(int(k), len(train_y)) for k in ks})
    train_n = F.normalize(train_x.float(), dim=1)
    train_y = train_y.to(device)
    hits = {k: {1: 0, 5: 0} for k in ks}
    for start in range(0, len(val_y), batch_size):
        val_n = F.normalize(val_x[start:start + batch_size].to(device).float(), dim=1)
        labels = val_y[start:start + batch_size].to(device)
        sims, idx = (val_n @ train_n.t()).topk(ks[-1], dim=1)
        weights, neighbour_labels = (sims / temperature).exp(), train_y[idx]
        for k in ks:
            votes = torch.zeros(len(labels), n_classes, device=device)
            votes.scatter_add_(1, neighbour_labels[:, :k], weights[:, :k])
            top = votes.topk(min(5, n_classes), dim=1).indices
            match = top == labels[:, None]
            hits[k][1] += int(match[:, :1].any(1).sum())
            hits[k][5] += int(match.any(1).sum())
    n = max(len(val_y), 1)
    return {k: {"top1": 100.0 * h[1] / n, "top5": 100.0 * h[5] / n} for k, h in hits.items()}
