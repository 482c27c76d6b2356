"""Weighted k-NN classification on frozen features, as the reference's `eval/knn.py`, with
float64-exact neighbours.

Features are L2-normalised, so the similarity is the cosine; each of the k nearest train features
votes for its label with weight exp(similarity / T) (T = 0.07); the class with the largest summed
weight wins (the sums taken as log-sum-exp, so that no T > 0 overflows). Several k are scored from
one top-max(k) search. k is clipped to the number of train features.

Exactness: the neighbours and their similarities are those of a float64 computation (ties: the lower
train index first; vote ties: the lower class first), at about float32 GEMM cost. A plain float32
cosine is not enough: on near-constant features (an undertrained backbone) all similarities sit
within ~1e-8 of each other, below float32's resolution near 1, and a fifth of the top-20 neighbours
change. `CosineIndex` searches instead with centred products, a.b = (a - m).(b - m) + (b - m).m +
a.m (m: mean normalised train feature; a.m is the same for every train row of a query), whose terms
are small and exact enough in float32; it keeps top-(k + margin) candidates, recomputes their
similarities in float64 and checks, with a float32 rounding-error bound, that no other train row can
beat the k-th: rows where that check fails are searched again with more candidates (finally all
rows).
"""

from collections.abc import Iterable

import torch
from torch import Tensor

from .logreg import matmul_precision

NORM_EPS = 1e-12  # F.normalize's
GATHER_ELEMENTS = 2**24  # float64 elements per exact-recompute block (128 MB)


def candidate_count(k: int) -> int:
    """Candidates kept from the float32 search for a top-k: k + max(k // 4, 16). The margin only
    sets the cost: the k-th exact neighbour must beat every non-candidate's bound, else the row is
    searched again 8x wider."""
    return k + max(k // 4, 16)


class CosineIndex:
    """Train features for exact (float64) top-k cosine search. `widened` counts query rows that
    needed a second, wider search (the first candidates could not be certified)."""

    def __init__(self, train_x: Tensor, chunk: int = 65536):
        self.x, n, dim = train_x, train_x.shape[0], train_x.shape[1]
        device = train_x.device
        self.norm = torch.empty(n, dtype=torch.float64, device=device)
        total = torch.zeros(dim, dtype=torch.float64, device=device)
        for s in range(0, n, chunk):
            xc = train_x[s : s + chunk].double()
            self.norm[s : s + chunk] = xc.norm(dim=1).clamp_min(NORM_EPS)
            total += (xc / self.norm[s : s + chunk, None]).sum(0)
        self.mean = total / max(n, 1)
        self.centred = torch.empty(
            n, dim, dtype=torch.float32, device=device
        )  # b - m, searched in float32
        offset = torch.empty(n, dtype=torch.float64, device=device)  # (b - m).m, exact
        self.centred_max = 0.0
        for s in range(0, n, chunk):
            centred = train_x[s : s + chunk].double() / self.norm[s : s + chunk, None] - self.mean
            self.centred[s : s + chunk] = centred.float()
            offset[s : s + chunk] = centred @ self.mean
            self.centred_max = max(self.centred_max, float(centred.norm(dim=1).max()))
        self.offset = offset.float()
        self.offset_max = float(offset.abs().max()) if n else 0.0
        self.widened = 0

    def __len__(self) -> int:
        return self.norm.shape[0]

    def exact(self, query: Tensor, idx: Tensor) -> Tensor:
        """float64 cosines of normalised float64 queries (B, D) with train rows idx (B, c),
        blockwise."""
        out = torch.empty(idx.shape, dtype=torch.float64, device=idx.device)
        dim = self.x.shape[1]
        cols = min(idx.shape[1], max(1, GATHER_ELEMENTS // dim))
        rows = max(1, GATHER_ELEMENTS // (cols * dim))
        for r in range(0, idx.shape[0], rows):
            for c in range(0, idx.shape[1], cols):
                block = idx[r : r + rows, c : c + cols]
                # multiply-and-sum, not bmm: identical train rows give bitwise identical
                # similarities (ties)
                dots = (self.x[block].double() * query[r : r + rows, None, :]).sum(-1)
                out[r : r + rows, c : c + cols] = dots / self.norm[block]
        return out

    def error_bound(self, query_centred: Tensor) -> Tensor:
        """Per query, a bound on |float32 search score - exact score| plus the float64 recompute's
        own error: float32 rounding of both centred operands and of the offset, a length-D float32
        dot product (D u |a||b|, Cauchy-Schwarz) and the final addition; doubled for safety."""
        u32, u64 = 2.0**-24, 2.0**-53
        dim = self.x.shape[1]
        products = (dim + 5) * query_centred.norm(dim=1) * self.centred_max
        return 2.0 * (u32 * (products + 2.0 * self.offset_max) + 4.0 * (dim + 2) * u64)

    def search(self, query: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """(similarities float64, train indices), both (B, k), of the k nearest train rows to each
        query row, ordered by similarity (descending) then index. Equal to a float64 search."""
        n = len(self)
        k = min(k, n)
        q64 = query.double()
        q64 = q64 / q64.norm(dim=1, keepdim=True).clamp_min(NORM_EPS)
        sims = torch.empty(len(q64), k, dtype=torch.float64, device=q64.device)
        idx = torch.empty(len(q64), k, dtype=torch.int64, device=q64.device)
        rows = torch.arange(len(q64), device=q64.device)
        count = candidate_count(k)
        while len(rows):
            count = min(count, n)
            q = q64[rows]
            if count == n:  # every train row is a candidate: nothing to certify
                cand = torch.arange(n, device=q.device).expand(len(q), n)
                exact, cand = _ordered(self.exact(q, cand), cand)
                sims[rows], idx[rows] = exact[:, :k], cand[:, :k]
                break
            centred = q - self.mean
            with matmul_precision("highest"):  # IEEE float32 products: the error bound assumes them
                score = torch.addmm(self.offset, centred.float(), self.centred.t())
            last, cand = score.topk(count, dim=1)
            exact, cand = _ordered(self.exact(q, cand), cand)
            # a non-candidate scores <= the last candidate's float32 score: its exact cosine is at
            # most that + a.m
            # + the error bound; the k-th exact candidate beating it proves the top-k (ties
            #   included) is exact
            ceiling = last[:, -1].double() + q @ self.mean + self.error_bound(centred)
            ok = exact[:, k - 1] > ceiling
            sims[rows[ok]], idx[rows[ok]] = exact[ok, :k], cand[ok, :k]
            rows = rows[~ok]
            self.widened += len(rows)
            count *= 8
        return sims, idx


def _ordered(sims: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
    """Each row sorted by similarity descending, ties by train index ascending (stable sorts)."""
    idx, order = idx.sort(dim=1, stable=True)
    sims = sims.gather(1, order)
    sims, order = sims.sort(dim=1, descending=True, stable=True)
    return sims, idx.gather(1, order)


def class_log_votes(scores: Tensor, labels: Tensor, n_classes: int) -> Tensor:
    """Per query and class, log sum over the class's neighbours of exp(score) (score = similarity /
    T; -inf for a class without a neighbour): the vote's logarithm, which ranks the classes as the
    summed weights do, taken from each class's largest score so that no T > 0 overflows (exp(1 /
    0.001) is inf in float64) or underflows."""
    top = torch.full(
        (len(scores), n_classes), float("-inf"), dtype=torch.float64, device=scores.device
    )
    top.scatter_reduce_(1, labels, scores, reduce="amax", include_self=True)
    sums = torch.zeros_like(top).scatter_add_(1, labels, (scores - top.gather(1, labels)).exp())
    return top + sums.log()  # a class without a neighbour: -inf + log 0 = -inf


@torch.no_grad()
def knn_classify(
    train_x: Tensor,
    train_y: Tensor,
    val_x: Tensor,
    val_y: Tensor,
    ks: Iterable[int] = (10, 20, 100, 200),
    temperature: float = 0.07,
    n_classes: int | None = None,
    batch_size: int = 256,
    index: CosineIndex | None = None,
) -> dict[int, dict[str, float]]:
    """{k: {"top1": %, "top5": %}} for each k (after clipping; duplicate k collapse). Runs on
    train_x's device."""
    if len(train_y) == 0:
        raise ValueError("k-NN needs at least one train feature")
    device = train_x.device
    n_classes = n_classes or int(max(train_y.max(), val_y.max())) + 1
    ks = sorted({min(int(k), len(train_y)) for k in ks})
    index = index or CosineIndex(train_x)
    train_y = train_y.to(device)
    hits = {k: {1: 0, 5: 0} for k in ks}
    for start in range(0, len(val_y), batch_size):
        sims, idx = index.search(val_x[start : start + batch_size].to(device), ks[-1])
        labels = val_y[start : start + batch_size].to(device)
        scores, neighbour_labels = sims / temperature, train_y[idx]
        for k in ks:
            votes = class_log_votes(scores[:, :k], neighbour_labels[:, :k], n_classes)
            top = votes.sort(dim=1, descending=True, stable=True).indices[:, : min(5, n_classes)]
            match = top == labels[:, None]
            hits[k][1] += int(match[:, :1].any(1).sum())
            hits[k][5] += int(match.any(1).sum())
    n = max(len(val_y), 1)
    return {k: {"top1": 100.0 * h[1] / n, "top5": 100.0 * h[5] / n} for k, h in hits.items()}
