"""Hand-computed cases for the DINO / iBOT / KoLeo losses and the teacher targets (centering,
Sinkhorn-Knopp)."""

import math

import pytest
import torch

from models.losses import DINOLoss, KoLeoLoss, iBOTPatchLoss, sinkhorn_knopp


# Sinkhorn-Knopp
# --------------------------------------------------------------------------------------------------
def test_sinkhorn_one_iteration_by_hand():
    # exp(t / 1) = [[1, 2], [3, 4]] (rows = samples). Q = K-by-B = [[1, 3], [2, 4]] / 10.
    # rows (prototypes) -> 1/K: [[1/8, 3/8], [1/6, 1/3]]; columns -> 1/B then * B:
    # sample 0 = [1/8, 1/6] / (7/24) = [3/7, 4/7]; sample 1 = [3/8, 1/3] / (17/24) = [9/17, 8/17].
    t = torch.log(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    q = sinkhorn_knopp(t, teacher_temp=1.0, n_samples_total=2, n_iterations=1)
    expected = torch.tensor([[3 / 7, 4 / 7], [9 / 17, 8 / 17]])
    torch.testing.assert_close(q, expected, rtol=0, atol=1e-6)


def test_sinkhorn_three_iterations_marginals():
    # 3 samples x 3 prototypes: samples sum to 1 exactly; prototypes approach B/K = 1
    # (equipartition).
    t = torch.tensor([[2.0, 0.0, 0.0], [1.5, 0.2, 0.0], [1.0, 0.0, 0.5]])
    q = DINOLoss(3).sinkhorn_knopp_teacher(t, teacher_temp=1.0, n_iterations=3)
    torch.testing.assert_close(q.sum(dim=1), torch.ones(3), rtol=0, atol=1e-6)
    assert torch.all((q.sum(dim=0) - 1).abs() < 0.05)
    q1 = DINOLoss(3).sinkhorn_knopp_teacher(t, teacher_temp=1.0, n_iterations=1)
    # more iterations -> closer to equipartition over prototypes
    assert (q.sum(0) - 1).abs().max() < (q1.sum(0) - 1).abs().max()
    # fp32 even for low-precision logits
    assert DINOLoss(3).sinkhorn_knopp_teacher(t.to(torch.bfloat16), 1.0).dtype == torch.float32


def test_ibot_sinkhorn_uses_n_masked_patches():
    t = torch.log(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    q = iBOTPatchLoss(2).sinkhorn_knopp_teacher(
        t, 1.0, n_masked_patches_tensor=torch.tensor(2), n_iterations=1
    )
    torch.testing.assert_close(
        q, torch.tensor([[3 / 7, 4 / 7], [9 / 17, 8 / 17]]), rtol=0, atol=1e-6
    )


# softmax centering + center EMA
def test_softmax_centering_and_center_ema():
    loss = DINOLoss(2, center_momentum=0.9)
    t = torch.tensor([[1.0, 0.0], [3.0, 0.0]])
    # center 0: softmax(t / 0.5) -> row 0 = [e^2, 1] / (e^2 + 1)
    p = loss.softmax_center_teacher(t, teacher_temp=0.5)
    torch.testing.assert_close(p[0], torch.tensor([math.exp(2), 1]) / (math.exp(2) + 1))
    loss.update_center(t)  # batch mean [2, 0] -> center = 0.1 * [2, 0]
    torch.testing.assert_close(loss.center, torch.tensor([[0.2, 0.0]]))
    p = loss.softmax_center_teacher(t, teacher_temp=0.5)  # (1 - 0.2) / 0.5 = 1.6
    torch.testing.assert_close(p[0], torch.tensor([math.exp(1.6), 1]) / (math.exp(1.6) + 1))
    loss.update_center(torch.tensor([[0.0, 1.0]]))  # 0.9 * [0.2, 0] + 0.1 * [0, 1]
    torch.testing.assert_close(loss.center, torch.tensor([[0.18, 0.1]]))
    assert "center" in loss.state_dict()


def test_ibot_center_ema_and_shape():
    loss = iBOTPatchLoss(3)
    assert loss.center.shape == (1, 1, 3) and "center" in loss.state_dict()
    loss.update_center(torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]))  # mean [2, 2, 2]
    torch.testing.assert_close(loss.center, torch.full((1, 1, 3), 0.2))
    loss.update_center(torch.zeros(0, 3))  # no masked patch: center unchanged (not NaN)
    torch.testing.assert_close(loss.center, torch.full((1, 1, 3), 0.2))
    p = loss.softmax_center_teacher(torch.zeros(4, 3), 0.1)
    assert p.shape == (4, 3)
    torch.testing.assert_close(p, torch.full((4, 3), 1 / 3))


# DINO cross-entropy
def test_dino_loss_sums_pairs_of_batch_means():
    loss = DINOLoss(2)
    # student logits s/0.1 = [ln 3, 0] -> log_softmax = [ln 3/4, ln 1/4]; zeros -> [ln 1/2, ln 1/2]
    s1 = torch.tensor([[0.1 * math.log(3), 0.0], [0.0, 0.0]])
    s2 = torch.zeros(2, 2)
    t1 = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    t2 = torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    ce = lambda ls, t: -(t * ls).sum(-1).mean()  # noqa: E731
    ls1 = torch.tensor([[math.log(0.75), math.log(0.25)], [math.log(0.5), math.log(0.5)]])
    ls2 = torch.full((2, 2), math.log(0.5))
    expected = ce(ls1, t1) + ce(ls1, t2) + ce(ls2, t1) + ce(ls2, t2)
    torch.testing.assert_close(loss([s1, s2], [t1, t2]), expected)
    # by hand: ce(ls1, t1) = -(ln .75 + ln .5) / 2
    torch.testing.assert_close(ce(ls1, t1), torch.tensor(-(math.log(0.75) + math.log(0.5)) / 2))


# iBOT masked loss
def test_ibot_forward_masked_weights_each_image_by_its_masked_count():
    # 3 images of 4 patches: image 0 has 1 masked patch, image 1 has 3, image 2 none.
    masks = torch.tensor([[1, 0, 0, 0], [0, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    masks_weight = torch.tensor([1.0, 1 / 3, 1 / 3, 1 / 3])
    # per masked patch CE: teacher one-hot on class 0; student log-probs of class 0 chosen by hand
    p0 = torch.tensor([0.75, 0.5, 0.5, 0.25])  # student probability of class 0 per masked patch
    s = 0.1 * torch.stack([torch.log(p0), torch.log(1 - p0)], dim=1)  # s / 0.1 = log-probs
    t = torch.tensor([[1.0, 0.0]] * 4)
    loss = iBOTPatchLoss(2)
    got = loss.forward_masked(
        s, t, student_masks_flat=masks, n_masked_patches=4, masks_weight=masks_weight
    )
    expected = (-math.log(0.75) * 1 + (-math.log(0.5) - math.log(0.5) - math.log(0.25)) / 3) / 3
    torch.testing.assert_close(got, torch.tensor(expected))
    # masks_weight=None derives the same weights from the masks
    torch.testing.assert_close(loss.forward_masked(s, t, student_masks_flat=masks), got)
    # rows past n_masked_patches (upperbound padding) are ignored
    s_pad, t_pad = torch.cat([s, torch.randn(3, 2)]), torch.cat([t, torch.rand(3, 2)])
    torch.testing.assert_close(
        loss.forward_masked(s_pad, t_pad, masks, n_masked_patches=4, masks_weight=masks_weight), got
    )


def test_ibot_dense_forward_matches_masked_forward():
    torch.manual_seed(0)
    masks = torch.tensor([[1, 0, 1, 0], [0, 1, 1, 1]], dtype=torch.bool)
    s, t = torch.randn(2, 4, 5), torch.softmax(torch.randn(2, 4, 5), -1)
    loss = iBOTPatchLoss(5)
    dense = loss(s, t, masks)
    masked = loss.forward_masked(s[masks], t[masks], masks)
    torch.testing.assert_close(dense, masked)


# KoLeo
def test_koleo_known_nearest_neighbour_distances():
    # unit vectors at angles 0, 60, 180 degrees (scaled: KoLeo normalises first). chord = 2
    # sin(d/2): NN distances are 1 (0<->60), 1 (60<->0), 2 sin(60 deg) = sqrt(3) (180 -> 60).
    angles = torch.tensor([0.0, math.pi / 3, math.pi])
    x = torch.stack([torch.cos(angles), torch.sin(angles)], dim=1) * torch.tensor(
        [[2.0], [0.5], [7.0]]
    )
    got = KoLeoLoss()(x)
    expected = -(math.log(1.0) + math.log(1.0) + math.log(math.sqrt(3))) / 3
    torch.testing.assert_close(got, torch.tensor(expected), atol=1e-5, rtol=0)
    assert KoLeoLoss.pairwise_NNs_inner(torch.nn.functional.normalize(x, dim=-1)).tolist() == [
        1,
        0,
        1,
    ]


def test_koleo_batch_of_one_is_a_clear_error():
    with pytest.raises(ValueError, match="at least 2 samples"):
        KoLeoLoss()(torch.randn(1, 8))


def test_koleo_fp32_under_low_precision_input():
    x = torch.randn(6, 16)
    torch.testing.assert_close(
        KoLeoLoss()(x.to(torch.bfloat16)), KoLeoLoss()(x.to(torch.bfloat16).float())
    )
    assert KoLeoLoss()(x.to(torch.bfloat16)).dtype == torch.float32
