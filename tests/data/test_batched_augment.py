"""The device-side multi-crop augmentation against independent implementations: torchvision's
functional ops and RandomResizedCrop sampling, Python's colorsys, PIL's grayscale, and the per-image
PIL pipeline's statistics."""

import colorsys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cifar_config import cifar_augmentation
from PIL import Image
from torchvision.transforms import RandomResizedCrop, functional as TF

from data.augmentations import DataAugmentationDINO
from data.batched_augment import (
    BatchedAugmentationDINO,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    apply_blur,
    draw_blur,
    grayscale,
    resized_crops,
    sample_crop_boxes,
)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def smooth_images(n, size=32, seed=0):
    """Natural-ish images: low-frequency colour fields (what crops, blur and jitter act on
    visibly)."""
    g = gen(seed)
    low = torch.rand(n, 3, 4, 4, generator=g)
    return F.interpolate(low, size=(size, size), mode="bilinear", align_corners=False)


def test_crop_boxes_follow_torchvision_sampling():
    n, H, W, scale = 20000, 32, 32, (0.25, 1.0)
    boxes = sample_crop_boxes(n, H, W, scale, gen(1), "cpu")
    top, left, h, w = boxes.unbind(1)
    assert bool(
        ((top >= 0) & (left >= 0) & (top + h <= H) & (left + w <= W) & (h >= 1) & (w >= 1)).all()
    )
    torch.manual_seed(0)
    ref = torch.tensor(
        [
            RandomResizedCrop.get_params(torch.zeros(3, H, W), scale, (3 / 4, 4 / 3))
            for _ in range(n)
        ],
        dtype=torch.float32,
    )
    for ours, theirs in (
        (h * w, ref[:, 2] * ref[:, 3]),
        (w / h, ref[:, 3] / ref[:, 2]),
        (top, ref[:, 0]),
        (left, ref[:, 1]),
    ):
        assert abs(float(ours.mean() - theirs.mean())) < 0.03 * float(theirs.mean()) + 0.05
        assert abs(float(ours.std() - theirs.std())) < 0.05 * float(theirs.std()) + 0.05


def test_crop_fallback_matches_torchvision():
    # a 32 x 8 image (height 8): no try fits a near-full-area crop with a ratio in [3/4, 4/3]: the
    # centred fallback
    boxes = sample_crop_boxes(5, 8, 32, (0.99, 1.0), gen(), "cpu")
    torch.manual_seed(0)
    top, left, h, w = RandomResizedCrop.get_params(
        torch.zeros(3, 8, 32), (0.99, 1.0), (3 / 4, 4 / 3)
    )
    assert boxes.tolist() == [[top, left, h, w]] * 5


def test_resized_crop_equals_interpolate_and_exact_copy():
    x = torch.rand(3, 3, 32, 32, generator=gen())
    full = torch.tensor([[0.0, 0.0, 32.0, 32.0]] * 3)
    out = resized_crops(x, full, torch.zeros(3, dtype=torch.bool), 48)
    ref = F.interpolate(x, size=(48, 48), mode="bicubic", align_corners=False).clamp(0, 1)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    flipped = resized_crops(x, full, torch.ones(3, dtype=torch.bool), 48)
    torch.testing.assert_close(flipped, ref.flip(-1), atol=1e-5, rtol=0)
    # a crop resized to its own size lands on pixel centres: an exact copy of the box
    box = torch.tensor([[3.0, 5.0, 16.0, 16.0]] * 3)
    torch.testing.assert_close(
        resized_crops(x, box, torch.zeros(3, dtype=torch.bool), 16),
        x[..., 3:19, 5:21],
        atol=1e-6,
        rtol=0,
    )


def test_hue_against_colorsys_and_torchvision():
    x = torch.rand(4, 3, 5, 5, generator=gen(2))
    x[0, :, 0, 0] = torch.tensor([0.5, 0.5, 0.5])  # gray: hue undefined, must stay gray
    x[0, :, 0, 1] = torch.tensor([0.0, 0.0, 0.0])
    shift = torch.tensor([0.1, -0.1, 0.05, -0.03])
    out = adjust_hue(x, shift)
    for i in range(4):
        torch.testing.assert_close(out[i], TF.adjust_hue(x[i], float(shift[i])), atol=1e-5, rtol=0)
        for r, c in ((0, 0), (2, 3), (4, 1)):
            h, s, v = colorsys.rgb_to_hsv(*x[i, :, r, c].tolist())
            expected = colorsys.hsv_to_rgb((h + float(shift[i])) % 1.0, s, v)
            assert out[i, :, r, c].tolist() == pytest.approx(expected, abs=1e-5)


def test_brightness_contrast_saturation_against_torchvision():
    x = torch.rand(3, 3, 6, 6, generator=gen(3))
    f = torch.tensor([0.6, 1.0, 1.4])
    for ours, theirs in (
        (adjust_brightness, TF.adjust_brightness),
        (adjust_contrast, TF.adjust_contrast),
        (adjust_saturation, TF.adjust_saturation),
    ):
        out = ours(x, f)
        for i in range(3):
            torch.testing.assert_close(out[i], theirs(x[i], float(f[i])), atol=1e-6, rtol=0)


def test_grayscale_against_pil():
    pixels = np.random.default_rng(0).integers(0, 256, (7, 9, 3), dtype=np.uint8)
    ours = grayscale(torch.from_numpy(pixels).permute(2, 0, 1)[None].float() / 255)[0, 0] * 255
    pil = np.asarray(Image.fromarray(pixels).convert("L"), dtype=np.float32)
    assert float((ours - torch.from_numpy(pil)).abs().max()) <= 1.0  # PIL rounds to integers


def test_blur_against_torchvision_per_image():
    x = torch.rand(5, 3, 16, 16, generator=gen(4))
    d = draw_blur(5, gen(9), x.device)
    out = apply_blur(x, d["blur_u"] < 0.6, d["blur_sigma"])
    g = gen(9)  # replay the draws to know which images were blurred and with which sigma
    apply = torch.rand(5, generator=g) < 0.6
    sigma = torch.rand(5, generator=g) * 1.9 + 0.1
    assert 0 < int(apply.sum()) < 5
    for i in range(5):
        ref = TF.gaussian_blur(x[i], [9, 9], [float(sigma[i])] * 2) if apply[i] else x[i]
        torch.testing.assert_close(out[i], ref, atol=1e-5, rtol=0)


def test_layout_order_and_determinism():
    n = 6
    images = torch.zeros(n, 3, 32, 32, dtype=torch.uint8)
    images[0::2] = 120  # even images constant: every crop of them is spatially constant
    images[1::2] = torch.randint(0, 256, (n // 2, 3, 32, 32), dtype=torch.uint8, generator=gen(5))
    aug = BatchedAugmentationDINO(
        (0.3, 1.0), (0.1, 0.3), 3, 24, 12, blur_probabilities=(0.0, 0.0, 0.0)
    )
    out = aug(images, gen(11))
    assert out["global_crops"].shape == (2 * n, 3, 24, 24) and out["local_crops"].shape == (
        3 * n,
        3,
        12,
        12,
    )
    for name, copies in (("global_crops", 2), ("local_crops", 3)):
        spread = out[name].flatten(2).std(2).amax(1)  # per crop: largest per-channel spatial std
        for c in range(copies):
            for i in range(n):
                assert (float(spread[c * n + i]) < 1e-4) == (i % 2 == 0), (name, c, i)
    again = aug(images, gen(11))
    other = aug(images, gen(12))
    assert all(torch.equal(out[k], again[k]) for k in out)
    assert not torch.equal(out["global_crops"], other["global_crops"])
    with pytest.raises(ValueError, match="uint8"):
        aug(images.float(), gen())


def test_statistics_match_the_per_image_pipeline():
    """Same transforms, same probabilities as the PIL pipeline: the normalised crops' per-channel
    mean and std, and the spatial contrast of global crop 1 (always blurred) and of the others,
    agree. Sampling noise over 400 images is ~0.02; the PIL path also rounds to uint8 after each
    jitter op, which shifts its mean by ~0.04 (normalised units, ~2/255). Without the blur on crop 1
    its spatial contrast is off by 0.06, with crops of scale 0.9-1 by 0.09."""
    n = 400
    images = (smooth_images(n, seed=6) * 255).round().to(torch.uint8)
    kw = dict(
        global_crops_scale=(0.3, 1.0),
        local_crops_scale=(0.1, 0.3),
        local_crops_number=2,
        global_crops_size=32,
        local_crops_size=16,
    )
    ours = BatchedAugmentationDINO(**kw)(images, gen(7))
    pil = DataAugmentationDINO(**kw)
    torch.manual_seed(0)
    crops = [pil(Image.fromarray(img.permute(1, 2, 0).numpy())) for img in images]
    theirs = {
        "global_crops": torch.stack([c["global_crops"][k] for k in range(2) for c in crops]),
        "local_crops": torch.stack([c["local_crops"][k] for k in range(2) for c in crops]),
    }

    def contrast(t):
        return t.flatten(2).std(2).mean(1)  # per crop: mean over channels of the spatial std

    for name in theirs:
        a, b = ours[name], theirs[name]
        assert float((a.mean((0, 2, 3)) - b.mean((0, 2, 3))).abs().max()) < 0.08, name
        assert float((a.std((0, 2, 3)) - b.std((0, 2, 3))).abs().max()) < 0.04, name
        assert abs(float(contrast(a)[n:].mean() - contrast(b)[n:].mean())) < 0.04, name
    a, b = contrast(ours["global_crops"][:n]), contrast(theirs["global_crops"][:n])
    assert abs(float(a.mean() - b.mean())) < 0.045


def test_apply_compiles_to_one_graph_with_the_eager_values():
    """`compile=True` traces `apply` as one graph (fullgraph: a graph break, e.g. a draw moved back
    into it, fails here) and, under a backend that runs the traced ops as they are (aot_eager), gives
    the eager path's values bit for bit, from the same draws. Inductor's fused kernels differ by
    float rounding only (tests/gpu)."""
    images = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8, generator=gen(2))
    fewer = "crops.local_crops_number=3"  # the CIFAR config's 8 cost CPU time, not coverage
    eager = cifar_augmentation(fewer)(images, gen(5))
    traced = cifar_augmentation(
        fewer, "data.augment_compile=true", "train.compile_backend=aot_eager"
    )
    compiled = traced(images, gen(5))
    assert all(torch.equal(eager[k], compiled[k]) for k in eager)
    assert not torch.equal(traced(images, gen(6))["global_crops"], eager["global_crops"])


def test_draws_come_first_and_apply_uses_no_generator():
    """The draws of a batch are all made before any pixel is touched: `apply` given the same draws
    twice gives the same crops, and `draw` leaves the generator where `__call__` leaves it."""
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8, generator=gen(3))
    aug = BatchedAugmentationDINO((0.3, 1.0), (0.1, 0.3), 2, 32, 16)
    g1, g2 = gen(8), gen(8)
    draws = aug.draw(4, 32, 32, g1, images.device)
    aug(images, g2)
    assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))
    first, again = aug.apply(images, draws), aug.apply(images, draws)
    assert all(torch.equal(first[k], again[k]) for k in first)
