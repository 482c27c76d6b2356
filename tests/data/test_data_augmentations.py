"""Multi-crop augmentation: every parameter and probability of DataAugmentationDINO, both blur
settings."""

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms

from data import DataAugmentationDINO, build_augmentation, make_eval_transform
from data.transforms import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD


def _aug(inversion: bool, n_local: int = 3) -> DataAugmentationDINO:
    return DataAugmentationDINO(
        global_crops_scale=(0.32, 1.0),
        local_crops_scale=(0.05, 0.32),
        local_crops_number=n_local,
        global_crops_size=16,
        local_crops_size=8,
        reference_blur_inversion=inversion,
    )


@pytest.mark.parametrize("inversion, expected", [(False, (1.0, 0.1, 0.5)), (True, (0.0, 0.9, 0.5))])
def test_blur_probabilities(inversion, expected):
    aug = _aug(inversion)
    got = aug.blur_probabilities()
    assert (got["global1"], got["global2"], got["local"]) == pytest.approx(expected)
    # the same numbers read straight off the composed transforms
    assert aug.global_transfo1.transforms[1].p == pytest.approx(expected[0])
    assert aug.global_transfo2.transforms[1].transforms[0].p == pytest.approx(expected[1])
    assert aug.local_transfo.transforms[1].p == pytest.approx(expected[2])
    for blur in (
        aug.global_transfo1.transforms[1],
        aug.global_transfo2.transforms[1].transforms[0],
        aug.local_transfo.transforms[1],
    ):
        (inner,) = blur.transforms
        assert isinstance(inner, transforms.GaussianBlur)
        assert tuple(inner.kernel_size) == (9, 9) and tuple(inner.sigma) == (0.1, 2.0)


def test_every_other_parameter_is_the_reference():
    aug = _aug(False)
    for geo, size, scale in (
        (aug.geometric_augmentation_global, 16, (0.32, 1.0)),
        (aug.geometric_augmentation_local, 8, (0.05, 0.32)),
    ):
        rrc, flip = geo.transforms
        assert isinstance(rrc, transforms.RandomResizedCrop) and tuple(rrc.size) == (size, size)
        assert (
            tuple(rrc.scale) == scale and rrc.interpolation == transforms.InterpolationMode.BICUBIC
        )
        assert tuple(rrc.ratio) == pytest.approx((3 / 4, 4 / 3))
        assert isinstance(flip, transforms.RandomHorizontalFlip) and flip.p == 0.5
    for composed in (aug.global_transfo1, aug.global_transfo2, aug.local_transfo):
        color, _, normalize = composed.transforms
        jitter_apply, gray = color.transforms
        assert (
            jitter_apply.p == 0.8 and isinstance(gray, transforms.RandomGrayscale) and gray.p == 0.2
        )
        (jitter,) = jitter_apply.transforms
        assert tuple(jitter.brightness) == pytest.approx((0.6, 1.4))
        assert tuple(jitter.contrast) == pytest.approx((0.6, 1.4))
        assert tuple(jitter.saturation) == pytest.approx((0.8, 1.2))
        assert tuple(jitter.hue) == pytest.approx((-0.1, 0.1))
        to_tensor, norm = normalize.transforms
        assert isinstance(to_tensor, transforms.ToTensor)
        assert tuple(norm.mean) == IMAGENET_DEFAULT_MEAN and tuple(norm.std) == IMAGENET_DEFAULT_STD
    solarize = aug.global_transfo2.transforms[1].transforms[1]
    assert (
        isinstance(solarize, transforms.RandomSolarize)
        and solarize.threshold == 128
        and solarize.p == 0.2
    )
    # global 1 and local crops are never solarized
    assert not any(isinstance(t, transforms.RandomSolarize) for t in aug.global_transfo1.transforms)
    assert not any(isinstance(t, transforms.RandomSolarize) for t in aug.local_transfo.transforms)


class _Marker:
    """Stands in for the blur: records that it ran."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def __call__(self, img):
        self.log.append(self.name)
        return img


@pytest.mark.parametrize("inversion, expected", [(False, (1.0, 0.1, 0.5)), (True, (0.0, 0.9, 0.5))])
def test_blur_frequencies_statistically(inversion, expected):
    """Run the real pipeline with the blur kernels replaced by markers and count how often each
    fires."""
    aug = _aug(inversion, n_local=2)
    log = []
    aug.global_transfo1.transforms[1].transforms = [_Marker(log, "g1")]
    aug.global_transfo2.transforms[1].transforms[0].transforms = [_Marker(log, "g2")]
    aug.local_transfo.transforms[1].transforms = [_Marker(log, "loc")]
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (12, 12, 3), dtype=np.uint8))
    n = 600
    torch.manual_seed(0)
    for _ in range(n):
        aug(image)
    freq = [log.count("g1") / n, log.count("g2") / n, log.count("loc") / (2 * n)]
    # 4 sigma of a binomial with n=600 is at most 0.082
    for f, p in zip(freq, expected):
        assert abs(f - p) < 0.082, (freq, expected)
    if expected[0] in (0.0, 1.0):
        assert freq[0] == expected[0]


def test_output_shapes_and_build_from_config(small_cfg):
    cfg = small_cfg("crops.reference_blur_inversion=true")
    aug = build_augmentation(cfg)
    assert aug.blur_probabilities() == {"global1": 0.0, "global2": pytest.approx(0.9), "local": 0.5}
    out = aug(Image.new("RGB", (24, 24), (120, 30, 200)))
    assert [t.shape for t in out["global_crops"]] == [(3, 16, 16)] * 2
    assert [t.shape for t in out["local_crops"]] == [(3, 8, 8)] * 2
    assert all(t.dtype == torch.float32 for t in out["global_crops"] + out["local_crops"])


def test_eval_transform():
    t = make_eval_transform(resize=32, crop=24)
    resize, crop, _ = t.transforms
    assert resize.size == 32 and resize.interpolation == transforms.InterpolationMode.BICUBIC
    assert tuple(crop.size) == (24, 24)
    x = t(Image.new("RGB", (64, 40), (255, 255, 255)))
    assert x.shape == (3, 24, 24)
    expected = (1 - torch.tensor(IMAGENET_DEFAULT_MEAN)) / torch.tensor(IMAGENET_DEFAULT_STD)
    torch.testing.assert_close(x[:, 12, 12], expected)
    default = make_eval_transform()
    assert default.transforms[0].size == 256 and tuple(default.transforms[1].size) == (224, 224)
