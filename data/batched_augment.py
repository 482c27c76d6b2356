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


def draw_color_jitter(n: int, g: torch.Generator, device) -> dict[str, Tensor]:
    """ColorJitter's random draws for n images (`apply_color_jitter` uses them): whether it applies
    (p COLOR_JITTER_P), a random order of the four ops per image, and their factors."""
    b, c, s, h = (COLOR_JITTER[k] for k in ("brightness", "contrast", "saturation", "hue"))
    apply = torch.rand(n, generator=g, device=device) < COLOR_JITTER_P
    order = torch.rand(n, 4, generator=g, device=device).argsort(1)  # a permutation per image
    factors = torch.stack(
        [
            _uniform(n, 1 - b, 1 + b, g, device),
            _uniform(n, 1 - c, 1 + c, g, device),
            _uniform(n, 1 - s, 1 + s, g, device),
            _uniform(n, -h, h, g, device),
        ],
        1,
    )
    return {"jitter": apply, "jitter_order": order, "jitter_factors": factors}


def apply_color_jitter(x: Tensor, apply: Tensor, order: Tensor, factors: Tensor) -> Tensor:
    ops = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)  # torchvision's order
    for slot in range(4):
        for op_id, op in enumerate(ops):
            # every op on every image, then a select: no host sync on a device tensor, so the host
            # runs ahead
            chosen = apply & (order[:, slot] == op_id)
            x = torch.where(chosen.view(-1, 1, 1, 1), op(x, factors[:, op_id]), x)
    return x


def draw_blur(n: int, g: torch.Generator, device) -> dict[str, Tensor]:
    """The blur's draws for n images: a uniform in [0, 1) (blurred where below the crop's p) and
    sigma ~ U(BLUR_SIGMA); drawn whatever p is, so that the stream after it does not depend on p."""
    return {
        "blur_u": torch.rand(n, generator=g, device=device),
        "blur_sigma": _uniform(n, BLUR_SIGMA[0], BLUR_SIGMA[1], g, device),
    }


def apply_blur(x: Tensor, apply: Tensor, sigma: Tensor) -> Tensor:
    """Blur image i with sigma[i] where apply[i], as torchvision's tensor `gaussian_blur` (kernel
    BLUR_KERNEL_SIZE, reflect padding); the others pass through a unit kernel."""
    n, ch, height, width = x.shape
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


def apply_solarize(x: Tensor, apply: Tensor) -> Tensor:
    return torch.where(apply.view(-1, 1, 1, 1) & (x >= SOLARIZE_THRESHOLD / 255.0), 1.0 - x, x)


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
        compile: bool = False,
        compile_backend: str = "inductor",
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
        # eager, apply launches ~1,400 small kernels a 512-image batch; compiled, a few fused ones
        self._apply = (
            torch.compile(self.apply, fullgraph=True, dynamic=False, backend=compile_backend)
            if compile
            else self.apply
        )

    def _draw_crops(self, n, height, width, copies, scale, g, device) -> dict[str, Tensor]:
        # copy c of image i at c * n + i: the collate's order
        boxes = sample_crop_boxes(copies * n, height, width, scale, g, device)
        flip = torch.rand(copies * n, generator=g, device=device) < HFLIP_P
        return {"boxes": boxes, "flip": flip}

    @staticmethod
    def _draw_photometric(n, solarize_p: float, g, device) -> dict[str, Tensor]:
        draws = draw_color_jitter(n, g, device)
        draws["gray"] = torch.rand(n, generator=g, device=device) < GRAYSCALE_P
        draws.update(draw_blur(n, g, device))
        if solarize_p > 0:
            draws["solarize"] = torch.rand(n, generator=g, device=device) < solarize_p
        return draws

    def draw(self, n: int, height: int, width: int, g: torch.Generator, device) -> dict:
        """Every random draw of a batch of n images, in the generator's order (global crops, the
        photometric ops of global crop 1, of global crop 2, local crops, theirs): `apply` is then a
        pure function of the images and these tensors."""
        draws = {
            "global": self._draw_crops(n, height, width, 2, self.global_crops_scale, g, device)
        }
        draws["first"] = self._draw_photometric(n, 0.0, g, device)
        draws["second"] = self._draw_photometric(n, self.solarize_probability, g, device)
        if self.local_crops_number:
            draws["local_crops"] = self._draw_crops(
                n, height, width, self.local_crops_number, self.local_crops_scale, g, device
            )
            draws["local"] = self._draw_photometric(self.local_crops_number * n, 0.0, g, device)
        draws["mean"], draws["std"] = _mean_std(device, torch.float32)
        return draws

    @staticmethod
    def _photometric(x: Tensor, d: dict[str, Tensor], blur_p: float) -> Tensor:
        x = apply_color_jitter(x, d["jitter"], d["jitter_order"], d["jitter_factors"])
        x = torch.where(d["gray"].view(-1, 1, 1, 1), grayscale(x).expand_as(x), x)
        if blur_p > 0:
            x = apply_blur(x, d["blur_u"] < blur_p, d["blur_sigma"])
        if "solarize" in d:
            x = apply_solarize(x, d["solarize"])
        return x

    def apply(self, images: Tensor, draws: dict) -> dict[str, Tensor]:
        """The crops of uint8 `images` under `draws` (`draw`); no randomness and no host
        synchronisation, so that it compiles to one graph (`compile=True`)."""
        x = images.float().div_(255.0)
        n = x.shape[0]
        p1, p2, p_local = self.blur_probabilities
        mean, std = draws["mean"], draws["std"]
        g = draws["global"]
        globals_ = resized_crops(
            x.repeat(2, 1, 1, 1), g["boxes"], g["flip"], self.global_crops_size
        )
        first = self._photometric(globals_[:n], draws["first"], p1)
        second = self._photometric(globals_[n:], draws["second"], p2)
        out = {"global_crops": (torch.cat([first, second]) - mean) / std}
        if self.local_crops_number:
            c = draws["local_crops"]
            local = resized_crops(
                x.repeat(self.local_crops_number, 1, 1, 1),
                c["boxes"],
                c["flip"],
                self.local_crops_size,
            )
            out["local_crops"] = (self._photometric(local, draws["local"], p_local) - mean) / std
        else:
            out["local_crops"] = x.new_zeros((0, 3, self.local_crops_size, self.local_crops_size))
        return out

    @torch.no_grad()
    def __call__(self, images: Tensor, generator: torch.Generator) -> dict[str, Tensor]:
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(
                f"expected uint8 images (N, 3, H, W), got {images.dtype} {tuple(images.shape)}"
            )
        n, _, height, width = images.shape
        return self._apply(images, self.draw(n, height, width, generator, images.device))
