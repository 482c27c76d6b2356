"""The positional embedding's bicubic resize as a matrix (models/pos_embed.py), against a
hand-written bicubic (Keys' cubic, a = -0.75, half-pixel centres, edges clamped: what PyTorch's
`upsample_bicubic2d` computes) and against `F.interpolate` in the model, values and gradients."""

import math

import pytest
import torch
import torch.nn.functional as F

from models.pos_embed import bicubic_resize_matrix, resize_positions
from models.vision_transformer import DinoVisionTransformer


def cubic_weights(t: float, a: float = -0.75) -> list[float]:
    """Keys' cubic convolution weights of the taps at offsets -1, 0, 1, 2 from floor(src)."""

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def resize_1d(n_in: int, n_out: int, scale_factor: float | None) -> torch.Tensor:
    """(n_out, n_in): each output's weights on the inputs, taps beyond the edges clamped to it."""
    step = 1 / scale_factor if scale_factor is not None else n_in / n_out
    w = torch.zeros(n_out, n_in, dtype=torch.float64)
    for o in range(n_out):
        src = step * (o + 0.5) - 0.5
        base = math.floor(src)
        for k, weight in enumerate(cubic_weights(src - base)):
            w[o, min(max(base - 1 + k, 0), n_in - 1)] += weight
    return w


@pytest.mark.parametrize(
    "grid, size, scale",
    [
        (4, (6, 8), ((6 + 0.1) / 4, (8 + 0.1) / 4)),
        (14, (6, 6), (6.1 / 14, 6.1 / 14)),
        (5, (3, 7), None),
    ],
    ids=["up-offset", "vitl-local-crops", "by-size"],
)
def test_matrix_is_the_hand_written_bicubic(grid, size, scale):
    """Up and down, by scale factor (the reference's offset) and by size: the matrix is the outer
    product of the two 1-D cubic resizes (row y * w + x, column i * grid + j)."""
    got = bicubic_resize_matrix(grid, size, scale, False)
    sy, sx = scale if scale is not None else (None, None)
    want = torch.kron(resize_1d(grid, size[0], sy), resize_1d(grid, size[1], sx))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(got.sum(1), torch.ones(size[0] * size[1], dtype=torch.float64))


def test_a_resize_that_gives_another_size_is_refused():
    with pytest.raises(ValueError, match="not \\(5, 5\\)"):
        bicubic_resize_matrix(4, (5, 5), (1.1, 1.1), False)


@pytest.mark.parametrize("antialias", [False, True])
def test_model_resize_equals_interpolate_with_its_gradient(antialias):
    """The model's resized pos-embed and the gradient reaching pos_embed through it equal those of
    F.interpolate computed in float64 (the exact sums) to within fp32 rounding, and the matrix is
    made once per setting."""
    torch.manual_seed(0)
    m = DinoVisionTransformer(img_size=32, patch_size=4, embed_dim=16, depth=1, num_heads=2)
    m.interpolate_antialias = antialias
    with torch.no_grad():
        m.pos_embed.normal_()
    grad = torch.randn(1, 1 + 36, 16)

    def through(fn):
        m.pos_embed.grad = None
        out = fn()
        out.backward(grad)
        return out.detach(), m.pos_embed.grad.clone()

    got, got_grad = through(lambda: m.interpolate_pos_encoding(torch.zeros(1, 37, 16), 24, 24))

    def reference():
        pos = m.pos_embed.double()
        grid = pos[:, 1:].reshape(1, 8, 8, 16).permute(0, 3, 1, 2)
        patches = F.interpolate(
            grid, scale_factor=(6.1 / 8, 6.1 / 8), mode="bicubic", antialias=antialias
        )
        return torch.cat(
            (pos[:, :1], patches.permute(0, 2, 3, 1).reshape(1, 36, 16)), dim=1
        ).float()

    want, want_grad = through(reference)
    torch.testing.assert_close(got, want, rtol=1.2e-7, atol=1e-7)
    torch.testing.assert_close(got_grad, want_grad, rtol=1.2e-7, atol=1e-7)
    cached = dict(m._resize_matrices)
    m.interpolate_pos_encoding(torch.zeros(1, 37, 16), 24, 24)
    assert len(cached) == 1 and all(m._resize_matrices[k] is v for k, v in cached.items())


def test_resize_positions_rounds_the_exact_sum_once():
    matrix = torch.tensor([[1 / 3, 2 / 3]], dtype=torch.float64)
    pos = torch.tensor([[1.0], [2.0**-24]], dtype=torch.float32)
    out = resize_positions(pos, matrix)
    assert out.dtype == torch.float32
    assert out.item() == torch.tensor(1 / 3 + 2 / 3 * 2.0**-24, dtype=torch.float64).float().item()
