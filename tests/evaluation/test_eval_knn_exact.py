"""k-NN neighbours, similarities and votes equal a numpy float64 computation, also where float32
cannot resolve the similarities (near-constant features, as an undertrained backbone gives), with
exact ties and with k > n."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from evaluation.knn import CosineIndex, knn_classify


def reference(train_x, train_y, val_x, val_y, ks, T=0.07, n_classes=None):
    """Float64 numpy: cosines row by row, neighbours by (similarity desc, index asc), votes exp(sim
    / T), the winning classes by (votes desc, class asc)."""
    X, V = train_x.double().numpy(), val_x.double().numpy()
    X = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)
    V = V / np.maximum(np.linalg.norm(V, axis=1, keepdims=True), 1e-12)
    labels, n_classes = train_y.numpy(), n_classes or int(max(train_y.max(), val_y.max())) + 1
    ks = sorted({min(k, len(X)) for k in ks})
    neighbours, hits = [], {k: [0, 0] for k in ks}
    for q, label in zip(V, val_y.numpy()):
        sims = (X * q).sum(1)
        order = np.lexsort((np.arange(len(X)), -sims))[: ks[-1]]
        neighbours.append(order)
        for k in ks:
            votes = np.zeros(n_classes)
            np.add.at(votes, labels[order[:k]], np.exp(sims[order[:k]] / T))
            top = np.lexsort((np.arange(n_classes), -votes))[:5]
            hits[k][0] += int(top[0] == label)
            hits[k][1] += int(label in top)
    n = len(V)
    return np.array(neighbours), {
        k: {"top1": 100.0 * a / n, "top5": 100.0 * b / n} for k, (a, b) in hits.items()
    }


@pytest.fixture(scope="module")
def near_constant():
    g = torch.Generator().manual_seed(0)
    c = torch.randn(48, generator=g)
    train_x = c + 1e-4 * torch.randn(1500, 48, generator=g)  # spread ~1e-4 of the norm
    val_x = c + 1e-4 * torch.randn(120, 48, generator=g)
    # labels tied to one direction of the noise, so votes are informative (not chance)
    train_y, val_y = (
        ((train_x - c)[:, 0] > 0).long() * 2 + (torch.arange(1500) % 2),
        ((val_x - c)[:, 0] > 0).long() * 2,
    )
    return train_x, train_y, val_x, val_y


def test_near_constant_features_equal_float64(near_constant):
    train_x, train_y, val_x, val_y = near_constant
    ks = [10, 20, 100]
    want_idx, want = reference(train_x, train_y, val_x, val_y, ks)
    # the case is hard: a float32 cosine gets most top-20 neighbours wrong
    plain = (
        (F.normalize(val_x, dim=1) @ F.normalize(train_x, dim=1).t())
        .topk(20, dim=1)
        .indices.numpy()
    )
    assert np.mean([len(set(a) - set(b)) for a, b in zip(plain, want_idx[:, :20])]) / 20 > 0.1
    index = CosineIndex(train_x)
    sims, idx = index.search(val_x, 100)
    assert np.array_equal(idx.numpy(), want_idx)
    assert (
        index.widened == 0
    )  # the candidate margin sufficed: one float32 search, no wider second pass
    X = F.normalize(train_x.double(), dim=1)
    assert torch.allclose(
        sims, (F.normalize(val_x.double(), dim=1)[:, None] * X[idx]).sum(-1), rtol=0, atol=1e-14
    )
    assert knn_classify(train_x, train_y, val_x, val_y, ks=ks, n_classes=4, batch_size=50) == want


def test_exact_ties_break_by_train_index_and_widen_the_search():
    # 60 identical train rows with alternating labels straddle the k-th neighbour: float32
    # candidates cannot be certified, the row is searched again wider, and the lower indices win the
    # tie (as in the reference)
    g = torch.Generator().manual_seed(1)
    base = torch.randn(1, 16, generator=g)
    train_x = torch.cat(
        [torch.randn(40, 16, generator=g), base.expand(60, 16), torch.randn(40, 16, generator=g)]
    )
    train_y = torch.cat(
        [
            torch.randint(0, 3, (40,), generator=g),
            torch.arange(60) % 3,
            torch.randint(0, 3, (40,), generator=g),
        ]
    )
    val_x = torch.cat(
        [base + 1e-3 * torch.randn(4, 16, generator=g), torch.randn(6, 16, generator=g)]
    )
    val_y = torch.randint(0, 3, (10,), generator=g)
    want_idx, want = reference(train_x, train_y, val_x, val_y, [5, 20], n_classes=3)
    index = CosineIndex(train_x)
    _, idx = index.search(val_x, 20)  # 36 candidates < 60 tied rows
    assert np.array_equal(idx.numpy(), want_idx) and index.widened >= 4
    assert idx[0].tolist() == list(range(40, 60))
    assert (
        knn_classify(train_x, train_y, val_x, val_y, ks=[5, 20], n_classes=3, index=index) == want
    )
    # k = 50: the whole tie group is among the 66 candidates, the k-th exact still ties across the
    # group
    want_idx, want = reference(train_x, train_y, val_x, val_y, [50], n_classes=3)
    assert np.array_equal(CosineIndex(train_x).search(val_x, 50)[1].numpy(), want_idx)
    assert knn_classify(train_x, train_y, val_x, val_y, ks=[50], n_classes=3) == want


def test_vote_ties_go_to_the_lower_class():
    # two train rows at the same angle from the query, classes 2 and 1: equal votes, class 1 ranks
    # first
    train_x = torch.tensor([[1.0, 1.0], [1.0, -1.0], [-1.0, 0.0]])
    train_y = torch.tensor([2, 1, 0])
    val_x, val_y = torch.tensor([[1.0, 0.0]]), torch.tensor([1])
    assert knn_classify(train_x, train_y, val_x, val_y, ks=[2], n_classes=3)[2] == {
        "top1": 100.0,
        "top5": 100.0,
    }


def test_k_larger_than_the_train_set():
    g = torch.Generator().manual_seed(2)
    train_x, train_y = torch.randn(7, 5, generator=g), torch.randint(0, 3, (7,), generator=g)
    val_x, val_y = torch.randn(9, 5, generator=g), torch.randint(0, 3, (9,), generator=g)
    want_idx, want = reference(train_x, train_y, val_x, val_y, [3, 20, 200], n_classes=3)
    out = knn_classify(train_x, train_y, val_x, val_y, ks=[3, 20, 200], n_classes=3)
    assert sorted(out) == [3, 7] and out == want
    assert np.array_equal(CosineIndex(train_x).search(val_x, 200)[1].numpy(), want_idx)
