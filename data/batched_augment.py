"""DINOv2's multi-crop augmentation for a whole batch at once, on the training device
(`data.augment_on=device`).

Small images make the per-image PIL pipeline (`augmentations.DataAugmentationDINO`, in data workers)
the bottleneck of a GPU step long before the GEMMs are: ~4-9 ms of CPU per 32 px image for 2 global
+ 6 local crops. This module applies the same distribution of transforms to a uint8 batch (N, 3, H,
W) with a few batched tensor ops:

- RandomResizedCrop: torchvision's sampling (10 tries of scale x log-uniform ratio, then its
  centre-crop fallback) drawn for every crop at once; the crop and the resize are one bicubic
  `grid_sample` per crop type (the crop's borders read the neighbouring pixels of the image instead
  of repeating its own edge). The horizontal flip is the sign of the sampling grid.
- ColorJitter(0.4, 0.4, 0.2, 0.1) with p 0.8, in a random order per crop as torchvision's; grayscale
  p 0.2; Gaussian blur (kernel 9, sigma U(0.1, 2), reflect padding, torchvision's tensor kernel)
  with the configured probabilities; solarize(128/255) p 0.2 on the second global crop; ImageNet
  normalisation.
Pixels stay float in [0, 1] between steps (the PIL path rounds to uint8 after each). Randomness
comes from one generator per batch, seeded by the caller (`loader.SSLLoader.to_device`: seed, rank,
position of the batch), so a resumed run draws the same crops.
"""

import functools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .augmentations import (
    BLUR_P_GLOBAL1,
    BLUR_P_GLOBAL2,
    BLUR_P_LOCAL,
    COLOR_JITTER,
    COLOR_JITTER_P,
    GRAYSCALE_P,
    HFLIP_P,
    SOLARIZE_P,
    SOLARIZE_THRESHOLD,
)
from .transforms import BLUR_KERNEL_SIZE, BLUR_SIGMA, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

RATIO = (3.0 / 4.0, 4.0 / 3.0)  # RandomResizedCrop's default aspect-ratio range
CROP_TRIES = 10  # torchvision's attempts before its centre-crop fallback
GRAY_WEIGHTS = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale


def _uniform(n: int, low: float, high: float, g: torch.Generator, device) -> Tensor:
    return torch.rand(n, generator=g, device=device) * (high - low) + low


def sample_crop_boxes(
    n: int, height: int, width: int, scale: Sequence[float], g: torch.Generator, device
) -> Tensor:
    """(n, 4) float boxes (top, left, h, w) drawn as torchvision's
    `RandomResizedCrop.get_params`."""
    area = height * width
    target = area * (
        torch.rand(n, CROP_TRIES, generator=g, device=device) * (scale[1] - scale[0]) + scale[0]
    )
    log_r = torch.rand(n, CROP_TRIES, generator=g, device=device) * (
        math.log(RATIO[1]) - math.log(RATIO[0])
    )
    aspect = torch.exp(log_r + math.log(RATIO[0]))
    w = torch.round(torch.sqrt(target * aspect))
    h = torch.round(torch.sqrt(target / aspect))
    ok = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = ok.int().argmax(1)  # the first accepted try (0 when none is, handled below)
    w, h = w.gather(1, first[:, None]).squeeze(1), h.gather(1, first[:, None]).squeeze(1)
    top = torch.floor(torch.rand(n, generator=g, device=device) * (height - h + 1))
    left = torch.floor(torch.rand(n, generator=g, device=device) * (width - w + 1))
    # torchvision's fallback: the largest centred crop with the ratio clamped into RATIO
    in_ratio = width / height
    if in_ratio < RATIO[0]:
        fw, fh = width, round(width / RATIO[0])
    elif in_ratio > RATIO[1]:
        fw, fh = round(height * RATIO[1]), height
    else:
        fw, fh = width, height
    # Python scalars into torch.where: no host-to-device copy (a pageable copy waits for the stream,
    # every step)
    fallback = ((height - fh) // 2, (width - fw) // 2, fh, fw)
    found = ok.any(1)
    return torch.stack(
        [torch.where(found, v, float(f)) for v, f in zip((top, left, h, w), fallback)], 1
    )


def resized_crops(images: Tensor, boxes: Tensor, flip: Tensor, size: int) -> Tensor:
    """Bicubic crop-and-resize of float images (n, 3, H, W) to (n, 3, size, size), mirrored where
    `flip`. Output pixel centres sample the box's pixel grid as `F.interpolate(...,
    align_corners=False)` does."""
    n, _, height, width = images.shape
    top, left, h, w = boxes.unbind(1)
    theta = torch.zeros(n, 2, 3, dtype=images.dtype, device=images.device)
    theta[:, 0, 0] = torch.where(flip, -w, w) / width
    theta[:, 0, 2] = (2 * left + w) / width - 1
    theta[:, 1, 1] = h / height
    theta[:, 1, 2] = (2 * top + h) / height - 1
    grid = F.affine_grid(theta, [n, 3, size, size], align_corners=False)
    out = F.grid_sample(images, grid, mode="bicubic", padding_mode="border", align_corners=False)
    return out.clamp_(0, 1)


def grayscale(x: Tensor) -> Tensor:
    r, g, b = x.unbind(1)
    return (GRAY_WEIGHTS[0] * r + GRAY_WEIGHTS[1] * g + GRAY_WEIGHTS[2] * b).unsqueeze(1)


def _blend(x: Tensor, other: Tensor, factor: Tensor) -> Tensor:
    f = factor.view(-1, 1, 1, 1)
    return (f * x + (1 - f) * other).clamp_(0, 1)


def adjust_brightness(x: Tensor, factor: Tensor) -> Tensor:
    return _blend(x, torch.zeros_like(x), factor)


def adjust_contrast(x: Tensor, factor: Tensor) -> Tensor:
    return _blend(x, grayscale(x).mean((2, 3), keepdim=True), factor)


def adjust_saturation(x: Tensor, factor: Tensor) -> Tensor:
    return _blend(x, grayscale(x), factor)


def rgb_to_hsv(x: Tensor) -> Tensor:
    """(n, 3, H, W) RGB in [0, 1] -> HSV with hue in [0, 1) (torchvision's `_rgb2hsv`)."""
    r, g, b = x.unbind(1)
    maxc, _ = x.max(1)
    minc, _ = x.min(1)
    delta = maxc - minc
    s = delta / torch.where(maxc == 0, torch.ones_like(maxc), maxc)
    safe = torch.where(delta == 0, torch.ones_like(delta), delta)
    rc, gc, bc = (maxc - r) / safe, (maxc - g) / safe, (maxc - b) / safe
    h = torch.where(maxc == r, bc - gc, torch.where(maxc == g, 2.0 + rc - bc, 4.0 + gc - rc))
    h = torch.where(delta == 0, torch.zeros_like(h), h)
    h = torch.fmod(h / 6.0 + 1.0, 1.0)
    return torch.stack([h, s, maxc], 1)


def hsv_to_rgb(x: Tensor) -> Tensor:
    h, s, v = x.unbind(1)
    i = torch.floor(h * 6.0)
    f = h * 6.0 - i
    i = i.to(torch.int64) % 6
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    # channel values for each of the six hue sectors
    table = torch.stack(
        [
            torch.stack([v, q, p, p, t, v], 1),
            torch.stack([t, v, v, q, p, p], 1),
            torch.stack([p, p, t, v, v, q], 1),
        ],
        1,
    )  # (n, 3, 6, H, W)
    index = i[:, None, None].expand(-1, 3, 1, -1, -1)
    return table.gather(2, index).squeeze(2)


def adjust_hue(x: Tensor, shift: Tensor) -> Tensor:
    hsv = rgb_to_hsv(x)
    hsv[:, 0] = torch.remainder(hsv[:, 0] + shift.view(-1, 1, 1), 1.0)
    return hsv_to_rgb(hsv)


def color_jitter(x: Tensor, g: torch.Generator) -> Tensor:
    """RandomApply(ColorJitter(brightness, contrast, saturation, hue), p) with a random order of the
    four per image, as torchvision's ColorJitter draws it."""
    n, device = x.shape[0], x.device
    b, c, s, h = (COLOR_JITTER[k] for k in ("brightness", "contrast", "saturation", "hue"))
    apply = torch.rand(n, generator=g, device=device) < COLOR_JITTER_P
    order = torch.rand(n, 4, generator=g, device=device).argsort(
        1
    )  # a random permutation per image
    factors = [
        _uniform(n, 1 - b, 1 + b, g, device),
        _uniform(n, 1 - c, 1 + c, g, device),
        _uniform(n, 1 - s, 1 + s, g, device),
        _uniform(n, -h, h, g, device),
    ]
    ops = (
        adjust_brightness,
        adjust_contrast,
        adjust_saturation,
        adjust_hue,
    )  # torchvision's fn_idx order
    for slot in range(4):
        for op_id, (op, factor) in enumerate(zip(ops, factors)):
            # every op on every image, then a select: no host sync on a device tensor, so the host
            # runs ahead
            chosen = apply & (order[:, slot] == op_id)
            x = torch.where(chosen.view(-1, 1, 1, 1), op(x, factor), x)
    return x


def gaussian_blur(x: Tensor, p: float, g: torch.Generator) -> Tensor:
    """Blur each image with probability p, sigma ~ U(BLUR_SIGMA), as torchvision's tensor
    `gaussian_blur` (kernel BLUR_KERNEL_SIZE, reflect padding); the others pass through a unit
    kernel."""
    n, ch, height, width = x.shape
    apply = torch.rand(n, generator=g, device=x.device) < p
    sigma = _uniform(n, BLUR_SIGMA[0], BLUR_SIGMA[1], g, x.device)
    if p <= 0:
        return x
    half = (BLUR_KERNEL_SIZE - 1) * 0.5
    grid = torch.linspace(-half, half, BLUR_KERNEL_SIZE, device=x.device, dtype=x.dtype)
    kernel = torch.exp(-0.5 * (grid[None] / sigma[:, None].to(x.dtype)) ** 2)
    kernel = kernel / kernel.sum(1, keepdim=True)
    identity = (grid == 0).to(x.dtype).expand(n, -1)
    kernel = torch.where(apply[:, None], kernel, identity).repeat_interleave(ch, 0)  # (n*ch, k)
    pad = BLUR_KERNEL_SIZE // 2
    y = F.pad(x.reshape(1, n * ch, height, width), (pad, pad, pad, pad), mode="reflect")
    y = F.conv2d(y, kernel.view(n * ch, 1, 1, -1), groups=n * ch)
    y = F.conv2d(y, kernel.view(n * ch, 1, -1, 1), groups=n * ch)
    return y.view(n, ch, height, width)


def solarize(x: Tensor, p: float, g: torch.Generator) -> Tensor:
    apply = (torch.rand(x.shape[0], generator=g, device=x.device) < p).view(-1, 1, 1, 1)
    return torch.where(apply & (x >= SOLARIZE_THRESHOLD / 255.0), 1.0 - x, x)


@functools.cache
def _mean_std(device: torch.device, dtype: torch.dtype) -> tuple:
    """ImageNet mean and std as (1, 3, 1, 1) tensors, copied to `device` once (not once per batch: a
    copy from pageable host memory waits for the device's stream, which would keep the host from
    running ahead)."""
    return tuple(
        torch.tensor(v, dtype=dtype).view(1, 3, 1, 1).to(device)
        for v in (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)
    )


class BatchedAugmentationDINO:
    """uint8 images (N, 3, H, W) -> {"global_crops": (2N, 3, G, G), "local_crops": (nL*N, 3, L, L)}
    normalised float32, ordered as `collate.collate_ssl_samples` orders them (crop 0 of every image,
    then crop 1, ...)."""

    def __init__(
        self,
        global_crops_scale: Sequence[float],
        local_crops_scale: Sequence[float],
        local_crops_number: int,
        global_crops_size: int,
        local_crops_size: int,
        blur_probabilities: Sequence[float] = (BLUR_P_GLOBAL1, BLUR_P_GLOBAL2, BLUR_P_LOCAL),
        solarize_probability: float = SOLARIZE_P,
    ):
        self.global_crops_scale = tuple(global_crops_scale)
        self.local_crops_scale = tuple(local_crops_scale)
        self.local_crops_number = int(local_crops_number)
        self.global_crops_size, self.local_crops_size = (
            int(global_crops_size),
            int(local_crops_size),
        )
        self.blur_probabilities = tuple(float(p) for p in blur_probabilities)
        self.solarize_probability = float(solarize_probability)

    def _crops(self, images: Tensor, copies: int, scale, size: int, g: torch.Generator) -> Tensor:
        n, _, height, width = images.shape
        source = images.repeat(
            copies, 1, 1, 1
        )  # copy c of image i at c * n + i: the collate's order
        boxes = sample_crop_boxes(copies * n, height, width, scale, g, images.device)
        flip = torch.rand(copies * n, generator=g, device=images.device) < HFLIP_P
        return resized_crops(source, boxes, flip, size)

    def _photometric(
        self, x: Tensor, blur_p: float, solarize_p: float, g: torch.Generator
    ) -> Tensor:
        x = color_jitter(x, g)
        gray = (torch.rand(x.shape[0], generator=g, device=x.device) < GRAYSCALE_P).view(
            -1, 1, 1, 1
        )
        x = torch.where(gray, grayscale(x).expand_as(x), x)
        x = gaussian_blur(x, blur_p, g)
        if solarize_p > 0:
            x = solarize(x, solarize_p, g)
        return x

    @staticmethod
    def _normalize(x: Tensor) -> Tensor:
        mean, std = _mean_std(x.device, x.dtype)
        return (x - mean) / std

    @torch.no_grad()
    def __call__(self, images: Tensor, generator: torch.Generator) -> dict[str, Tensor]:
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(
                f"expected uint8 images (N, 3, H, W), got {images.dtype} {tuple(images.shape)}"
            )
        x = images.float().div_(255.0)
        n = x.shape[0]
        p1, p2, p_local = self.blur_probabilities
        globals_ = self._crops(x, 2, self.global_crops_scale, self.global_crops_size, generator)
        first = self._photometric(globals_[:n], p1, 0.0, generator)
        second = self._photometric(globals_[n:], p2, self.solarize_probability, generator)
        out = {"global_crops": self._normalize(torch.cat([first, second]))}
        if self.local_crops_number:
            local = self._crops(
                x, self.local_crops_number, self.local_crops_scale, self.local_crops_size, generator
            )
            out["local_crops"] = self._normalize(self._photometric(local, p_local, 0.0, generator))
        else:
            out["local_crops"] = x.new_zeros((0, 3, self.local_crops_size, self.local_crops_size))
        return out
