"""DINOv2's multi-crop augmentation (`DataAugmentationDINO`), with the blur-probability inversion as
a flag."""

from collections.abc import Sequence

import torch
from PIL import Image

from .transforms import GaussianBlur, make_to_tensor_normalize, transforms

COLOR_JITTER = dict(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)
COLOR_JITTER_P = 0.8
GRAYSCALE_P = 0.2
HFLIP_P = 0.5
SOLARIZE_THRESHOLD = 128
SOLARIZE_P = 0.2
# Intended blur probabilities; with reference_blur_inversion the applied ones are 1 - p (0.0 / 0.9 /
# 0.5).
BLUR_P_GLOBAL1 = 1.0
BLUR_P_GLOBAL2 = 0.1
BLUR_P_LOCAL = 0.5


class DataAugmentationDINO:
    """PIL image -> {"global_crops": [2 x (3, G, G)], "local_crops": [n x (3, L, L)]} float tensors.

    As the reference: every crop is RandomResizedCrop (bicubic) + horizontal flip 0.5, then colour
    jitter (0.4, 0.4, 0.2, 0.1) with p 0.8, grayscale p 0.2, then per crop type: global 1 blur p
    1.0; global 2 blur p 0.1 and solarize(128) p 0.2; local blur p 0.5; then ToTensor + ImageNet
    normalisation. Draws come from torch's global RNG in the reference's order (global 1, global 2,
    locals); callers seed it (see `loader.SSLDataset`).
    """

    def __init__(
        self,
        global_crops_scale: Sequence[float],
        local_crops_scale: Sequence[float],
        local_crops_number: int,
        global_crops_size: int = 224,
        local_crops_size: int = 96,
        reference_blur_inversion: bool = False,
        blur_probabilities: Sequence[float] = (BLUR_P_GLOBAL1, BLUR_P_GLOBAL2, BLUR_P_LOCAL),
        solarize_probability: float = SOLARIZE_P,
    ):
        self.global_crops_scale = tuple(global_crops_scale)
        self.local_crops_scale = tuple(local_crops_scale)
        self.local_crops_number = local_crops_number
        self.global_crops_size = global_crops_size
        self.local_crops_size = local_crops_size
        self.reference_blur_inversion = reference_blur_inversion
        bicubic = transforms.InterpolationMode.BICUBIC

        self.geometric_augmentation_global = transforms.Compose(
            [
                transforms.RandomResizedCrop(
                    global_crops_size, scale=self.global_crops_scale, interpolation=bicubic
                ),
                transforms.RandomHorizontalFlip(p=HFLIP_P),
            ]
        )
        self.geometric_augmentation_local = transforms.Compose(
            [
                transforms.RandomResizedCrop(
                    local_crops_size, scale=self.local_crops_scale, interpolation=bicubic
                ),
                transforms.RandomHorizontalFlip(p=HFLIP_P),
            ]
        )
        color_jittering = transforms.Compose(
            [
                transforms.RandomApply([transforms.ColorJitter(**COLOR_JITTER)], p=COLOR_JITTER_P),
                transforms.RandomGrayscale(p=GRAYSCALE_P),
            ]
        )
        inv = reference_blur_inversion
        p_global1, p_global2, p_local = blur_probabilities
        global_transfo1_extra = GaussianBlur(p=p_global1, reference_inversion=inv)
        global_transfo2_extra = transforms.Compose(
            [
                GaussianBlur(p=p_global2, reference_inversion=inv),
                transforms.RandomSolarize(threshold=SOLARIZE_THRESHOLD, p=solarize_probability),
            ]
        )
        local_transfo_extra = GaussianBlur(p=p_local, reference_inversion=inv)
        self.normalize = make_to_tensor_normalize()

        self.global_transfo1 = transforms.Compose(
            [color_jittering, global_transfo1_extra, self.normalize]
        )
        self.global_transfo2 = transforms.Compose(
            [color_jittering, global_transfo2_extra, self.normalize]
        )
        self.local_transfo = transforms.Compose(
            [color_jittering, local_transfo_extra, self.normalize]
        )

    def __call__(self, image: Image.Image) -> dict[str, list[torch.Tensor]]:
        global_crop_1 = self.global_transfo1(self.geometric_augmentation_global(image))
        global_crop_2 = self.global_transfo2(self.geometric_augmentation_global(image))
        local_crops = [
            self.local_transfo(self.geometric_augmentation_local(image))
            for _ in range(self.local_crops_number)
        ]
        return {"global_crops": [global_crop_1, global_crop_2], "local_crops": local_crops}

    def blur_probabilities(self) -> dict[str, float]:
        """The blur probabilities actually applied (global1, global2, local)."""
        return {
            "global1": self.global_transfo1.transforms[1].p,
            "global2": self.global_transfo2.transforms[1].transforms[0].p,
            "local": self.local_transfo.transforms[1].p,
        }


def build_augmentation(cfg) -> DataAugmentationDINO:
    """From a `Config` (reads `cfg.crops`) or a `CropsConfig`."""
    crops = getattr(cfg, "crops", cfg)
    return DataAugmentationDINO(
        global_crops_scale=crops.global_crops_scale,
        local_crops_scale=crops.local_crops_scale,
        local_crops_number=crops.local_crops_number,
        global_crops_size=crops.global_crops_size,
        local_crops_size=crops.local_crops_size,
        reference_blur_inversion=crops.reference_blur_inversion,
        blur_probabilities=crops.blur_probabilities,
        solarize_probability=crops.solarize_probability,
    )


def applied_blur_probabilities(crops) -> tuple:
    """(global 1, global 2, local) blur probabilities actually applied: the configured ones, or 1 -
    p with the reference's inversion."""
    return tuple(
        (1.0 - p) if crops.reference_blur_inversion else p for p in crops.blur_probabilities
    )
