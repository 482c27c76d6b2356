"""k-NN: cosine similarity on L2-normalised features, exp(sim / T) weighted votes, k clipped to the
train size."""

import math

import pytest
import torch

from evaluation.knn import knn_classify


def test_hand_checkable_votes():
    # Train points on the unit circle (norms vary: only directions count). Query at angle 0.
    angles = torch.tensor([0.1, 0.2, -0.3, 2.0, 3.0])
    radii = torch.tensor([1.0, 5.0, 0.5, 2.0, 1.0])
    train_x = torch.stack([radii * angles.cos(), radii * angles.sin()], dim=1)
    train_y = torch.tensor([0, 1, 1, 2, 2])
    val_x, val_y = torch.tensor([[3.0, 0.0]]), torch.tensor([1])
    T = 0.07
    # k=1: the nearest (angle 0.1) is class 0 -> wrong.
    # k=3: class 0 weight exp(cos .1/T); class 1 exp(cos .2/T) + exp(cos .3/T) -> larger -> right.
    w = {a: math.exp(math.cos(a) / T) for a in (0.1, 0.2, 0.3)}
    assert w[0.2] + w[0.3] > w[0.1]
    out = knn_classify(train_x, train_y, val_x, val_y, ks=[1, 3], temperature=T, n_classes=3)
    assert out[1]["top1"] == 0.0 and out[3]["top1"] == 100.0
    assert (
        out[1]["top5"] == 100.0
    )  # all 3 classes are within top-5 (k=1 votes class 0 only; ties fill the rest)


def test_temperature_changes_the_winner():
    # One close neighbour of class 0 vs two farther ones of class 1: a low T trusts the closest, a
    # high T counts.
    train_x = torch.tensor(
        [[1.0, 0.0], [math.cos(0.5), math.sin(0.5)], [math.cos(-0.5), math.sin(-0.5)]]
    )
    train_y = torch.tensor([0, 1, 1])
    val_x, val_y = torch.tensor([[1.0, 0.0]]), torch.tensor([0])
    assert (
        knn_classify(train_x, train_y, val_x, val_y, ks=[3], temperature=0.01)[3]["top1"] == 100.0
    )
    assert knn_classify(train_x, train_y, val_x, val_y, ks=[3], temperature=10.0)[3]["top1"] == 0.0


def test_k_is_clipped_to_the_train_size_and_batches_do_not_matter():
    torch.manual_seed(0)
    train_x, train_y = torch.randn(30, 8), torch.randint(0, 4, (30,))
    val_x, val_y = torch.randn(25, 8), torch.randint(0, 4, (25,))
    whole = knn_classify(train_x, train_y, val_x, val_y, ks=[10, 20, 100, 200], batch_size=1000)
    assert sorted(whole) == [10, 20, 30]  # 100 and 200 clip to 30 and collapse
    batched = knn_classify(train_x, train_y, val_x, val_y, ks=[10, 20, 100, 200], batch_size=7)
    assert batched == whole


def test_empty_train_set_is_an_error():
    with pytest.raises(ValueError, match="at least one train feature"):
        knn_classify(
            torch.empty(0, 4),
            torch.empty(0, dtype=torch.long),
            torch.randn(2, 4),
            torch.tensor([0, 1]),
            n_classes=2,
        )


def test_a_tiny_temperature_does_not_overflow_the_votes():
    # The nearest neighbour (cos 1) is class 1; three farther ones (cos 0.99) are class 0. At T =
    # 1e-3 the weights are exp(1000) and 3 exp(990): both inf in float64, so plain sums tie and the
    # lower class, 0, would win; the true votes differ by a factor e^10 / 3, and class 1 wins.
    near, far = 1.0, 0.99
    far_points = [[far, math.sqrt(1 - far * far) * s] for s in (1.0, -1.0, 1.0)]
    train_x = torch.tensor([[near, 0.0], *far_points], dtype=torch.float64)
    train_y = torch.tensor([1, 0, 0, 0])
    val_x, val_y = torch.tensor([[1.0, 0.0]], dtype=torch.float64), torch.tensor([1])
    assert torch.isinf(torch.tensor(near / 1e-3, dtype=torch.float64).exp())
    assert (
        knn_classify(train_x, train_y, val_x, val_y, ks=[4], temperature=1e-3)[4]["top1"] == 100.0
    )
    assert (
        knn_classify(train_x, train_y, val_x, val_y, ks=[4], temperature=1.0)[4]["top1"] == 0.0
    )  # counts win


@pytest.mark.parametrize("temperature", [1e-3, 0.01, 0.07, 1.0])
def test_the_votes_agree_with_a_float64_log_sum_exp_reference(temperature):
    """Random features, every T: the winners equal those of an independent numpy/scipy
    implementation of the rule (cosines in float64, neighbours by sorting, class votes as scipy's
    logsumexp of sim / T)."""
    import numpy as np
    from scipy.special import logsumexp

    torch.manual_seed(1)
    train_x, train_y = torch.randn(200, 16, dtype=torch.float64), torch.randint(0, 5, (200,))
    val_x = torch.randn(60, 16, dtype=torch.float64)
    a = train_x.numpy() / np.linalg.norm(train_x.numpy(), axis=1, keepdims=True)
    b = val_x.numpy() / np.linalg.norm(val_x.numpy(), axis=1, keepdims=True)
    sims, k = b @ a.T, 20
    expected = []
    for row in sims:
        nearest = np.argsort(-row, kind="stable")[:k]
        votes = [
            logsumexp(row[nearest][train_y.numpy()[nearest] == c] / temperature)
            if (train_y.numpy()[nearest] == c).any()
            else -np.inf
            for c in range(5)
        ]
        expected.append(int(np.argmax(votes)))
    val_y = torch.tensor(expected)  # the reference's predictions as labels: top-1 must be 100%
    out = knn_classify(train_x, train_y, val_x, val_y, ks=[k], temperature=temperature, n_classes=5)
    assert out[k]["top1"] == 100.0
