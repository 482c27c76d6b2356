"""The positional embedding's bicubic resize to another patch grid (the reference's
`F.interpolate(..., mode="bicubic")`) as a matrix: the resize is linear, so each of its outputs is a
fixed weighted sum of the grid's positions. The matrix is the op itself applied to every one-hot map
of the grid, in float64; applying it is one small matrix product. On a GPU the op's own kernel
parallelises over output positions and loops over the channels (about 0.7 ms forward and 0.5 ms
backward for ViT-L's 1,024 channels, results/bench/NOTES.md), where the product takes microseconds."""

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor


@lru_cache(maxsize=32)
def bicubic_resize_matrix(
    grid: int, size: tuple[int, int], scale_factor: tuple[float, float] | None, antialias: bool
) -> Tensor:
    """(h * w, grid * grid) float64 on the CPU: row y * w + x holds the weight of each position
    (row-major) of a grid x grid map in output (y, x) of `F.interpolate(map, mode="bicubic",
    antialias=antialias)` with `scale_factor` if given, else `size` = (h, w)."""
    basis = torch.eye(grid * grid, dtype=torch.float64).reshape(grid * grid, 1, grid, grid)
    out = bicubic_resize(basis, size, scale_factor, antialias)
    return out.reshape(grid * grid, size[0] * size[1]).t().contiguous()


def bicubic_resize(
    maps: Tensor, size: tuple[int, int], scale_factor: tuple[float, float] | None, antialias: bool
) -> Tensor:
    """`F.interpolate(maps, mode="bicubic")` (maps (n, c, grid, grid)) to `size`, by `scale_factor`
    where given (the reference's offset), checked to land on `size`."""
    resize = dict(scale_factor=scale_factor) if scale_factor is not None else dict(size=size)
    out = F.interpolate(maps, mode="bicubic", antialias=antialias, **resize)
    if tuple(out.shape[-2:]) != tuple(size):
        raise ValueError(f"the resize gives a {tuple(out.shape[-2:])} grid, not {tuple(size)}")
    return out


def resize_positions(pos: Tensor, matrix: Tensor) -> Tensor:
    """`pos` (grid * grid, dim) resized by `matrix` (h * w, grid * grid, float64 on pos's device):
    each output the float64 sum of its weighted positions, rounded once to pos's dtype (the op
    computes in pos's dtype; its results agree to within a few units in the last place)."""
    return (matrix @ pos.double()).to(pos.dtype)
