"""Correctness of the sparse layer against an independent reference. `independent_reference.py`
(pure torch; nothing imported from this repository) is torchao's `SemiSparseLinear` written from its
published semantics. This file checks the repository's masks and layer against it: the 4x4 tile
masks on hand-computed tiles (ties, an all-equal tile, a tile where the greedy walk keeps 7), the
shapes both refuse, and the repository's `SemiSparseLinear` (backend="dense", pruning="tile_greedy")
against the reference layer: the same mask, forward, dx, dW and db (fp32, and bf16 autocast),
leading batch dims included; and (gpu) the reference's masks against torch's own kernel
(`torch._sparse_semi_structured_tile`). The same comparison over whole training runs is
`test_independent_reference_training.py`.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

# tests/sparsity/independent_reference.py: pure torch, none of the above
from independent_reference import (
    KERNEL_NETWORK,
    MLP_PATTERN,
    ReferenceSemiSparseLinear,
    swap_to_linear,
    swap_to_reference,
    tile_mask,
)
from torch import nn

from sparsity import SemiSparseLinear
from sparsity.pruning import prune

# ==================================================================================================
# masks and the layer


def _mask(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


# PyTorch's own expected mask for largest_abs_values_greedy (test/test_sparse_semi_structured.py,
# test_pruning_algo_largest_abs_values_greedy: run on the real kernel); it has ties (4 = 4, 3 =
# |-3|, 2 = 2 = 2, ...)
TORCH_TEST_TILE = [[4, 3, 2, 1], [-1, -3, 0.6, 0.5], [1, 2, 3, 4], [10, 2, -1, 5]]
TORCH_TEST_MASK = [[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1], [1, 0, 0, 1]]
# The greedy walk keeps 7: 16 at (3,3), then the six off-diagonal entries of the top-left 3x3 fill
# rows 0-2 and columns 0-2; row 3 and column 3 each still have a free slot, but the only cell they
# share, (3,3), is taken.
TILE_WITH_7_KEPT = [[1, 15, 14, 2], [13, 3, 12, 4], [11, 10, 5, 6], [7, 8, 9, 16]]
MASK_7_KEPT = [[0, 1, 1, 0], [1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 1]]
# torch's default algorithm (""; = largest_values_greedy) ranks signed values: on -TILE_WITH_7_KEPT
# it walks from -1 (0,0), -2 (0,3), -3 (1,1), -4 (1,3), -5 (2,2), [-6 (2,3): column 3 full], -7
# (3,0), -8 (3,1), then nothing fits
SIGNED_MASK_OF_NEGATED_7 = [[1, 0, 0, 1], [0, 1, 0, 1], [0, 0, 1, 0], [1, 1, 0, 0]]
# All 16 equal, row-major ties: (0,0) (0,1) | (1,0) (1,1) | (2,0), (2,1): columns full, (2,2) (2,3)
# | (3,2) (3,3)
BLOCK_DIAGONAL = [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]
# The 3 = 3 tie of row 0 goes to the lower column; the zeros then fill as in the all-equal tile
TIE_IN_ROW_0 = [[5, 3, 3, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
# All 16 equal under the kernel's order: StaticSort exchanges equal elements, which permutes the
# visit order (the network is simulated here: this mask is what the simulation gives, checked
# against the real kernel by test_reference_masks_equal_torch_kernel on a GPU); the walk keeps 7
KERNEL_ALL_EQUAL = [[1, 0, 1, 0], [0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 1]]

ABS = "largest_abs_values_greedy"
TILE_CASES = [  # id, tile, algorithm, tie_order, expected mask
    ("torch-test-tile", TORCH_TEST_TILE, ABS, "row_major", TORCH_TEST_MASK),
    ("torch-test-tile-kernel-order", TORCH_TEST_TILE, ABS, "kernel", TORCH_TEST_MASK),
    ("7-kept", TILE_WITH_7_KEPT, ABS, "row_major", MASK_7_KEPT),
    ("7-kept-negated", [[-v for v in r] for r in TILE_WITH_7_KEPT], ABS, "row_major", MASK_7_KEPT),
    (
        "7-kept-negated-signed",
        [[-v for v in r] for r in TILE_WITH_7_KEPT],
        "largest_values_greedy",
        "row_major",
        SIGNED_MASK_OF_NEGATED_7,
    ),
    (
        "7-kept-negated-torch-default",
        [[-v for v in r] for r in TILE_WITH_7_KEPT],
        "",
        "kernel",
        SIGNED_MASK_OF_NEGATED_7,
    ),
    ("all-equal", [[0.5] * 4] * 4, ABS, "row_major", BLOCK_DIAGONAL),
    ("all-equal-signs", [[0.5, -0.5, 0.5, -0.5]] * 4, ABS, "row_major", BLOCK_DIAGONAL),
    ("all-zero", [[0.0] * 4] * 4, ABS, "row_major", BLOCK_DIAGONAL),
    ("tie-in-row-0", TIE_IN_ROW_0, ABS, "row_major", BLOCK_DIAGONAL),
    ("all-equal-kernel-order", [[0.5] * 4] * 4, ABS, "kernel", KERNEL_ALL_EQUAL),
]


@pytest.mark.parametrize(
    "tile,algorithm,tie_order,expected", [c[1:] for c in TILE_CASES], ids=[c[0] for c in TILE_CASES]
)
def test_tile_masks_on_hand_computed_tiles(tile, algorithm, tie_order, expected):
    w = torch.tensor(tile, dtype=torch.float32)
    assert torch.equal(tile_mask(w, algorithm, tie_order), _mask(expected))
    # the repository's tile_greedy: the same hand-computed mask
    if algorithm == ABS and tie_order == "row_major":
        assert torch.equal(prune(w, "tile_greedy")[1], _mask(expected))


def test_tiles_are_placed_where_they_are_in_the_weight():
    """Six different hand-computed tiles laid out as an 8 x 12 weight: each tile's mask lands at its
    place (catches a transposed or mis-strided tiling, which single-tile tests cannot)."""
    tiles = [
        (TORCH_TEST_TILE, TORCH_TEST_MASK),
        (TILE_WITH_7_KEPT, MASK_7_KEPT),
        (TIE_IN_ROW_0, BLOCK_DIAGONAL),
        ([[-v for v in r] for r in TILE_WITH_7_KEPT], MASK_7_KEPT),
        (
            [list(r) for r in zip(*TILE_WITH_7_KEPT)],
            [list(r) for r in zip(*MASK_7_KEPT)],
        ),  # transposed
        ([[0.25] * 4] * 4, BLOCK_DIAGONAL),
    ]
    w = torch.zeros(8, 12)
    expected = torch.zeros(8, 12, dtype=torch.bool)
    for k, (tile, mask) in enumerate(tiles):
        r, c = 4 * (k // 3), 4 * (k % 3)
        w[r : r + 4, c : c + 4] = torch.tensor(tile)
        expected[r : r + 4, c : c + 4] = _mask(mask)
    assert torch.equal(tile_mask(w), expected)
    assert torch.equal(prune(w, "tile_greedy")[1], expected)


def _greedy_python(w: torch.Tensor) -> torch.Tensor:
    """A third implementation, plain Python per tile: sort (-|v|, position), walk, keep if row and
    column < 2."""
    rows, cols = w.shape
    out = torch.zeros(rows, cols, dtype=torch.bool)
    for tr in range(0, rows, 4):
        for tc in range(0, cols, 4):
            cells = [(abs(float(w[tr + i, tc + j])), 4 * i + j) for i in range(4) for j in range(4)]
            in_row, in_col = [0] * 4, [0] * 4
            for _, p in sorted(cells, key=lambda cell: (-cell[0], cell[1])):
                i, j = divmod(p, 4)
                if in_row[i] < 2 and in_col[j] < 2:
                    out[tr + i, tc + j] = True
                    in_row[i] += 1
                    in_col[j] += 1
    return out


@pytest.mark.parametrize("kind", ["fp32", "bf16", "integers"])
def test_random_weights_three_implementations_agree(kind):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(16, 24, generator=g)
    if kind == "bf16":
        w = (w * 0.02).to(torch.bfloat16)
    elif kind == "integers":  # many ties, zeros included
        w = torch.randint(-2, 3, (16, 24), generator=g).float()
    m = tile_mask(w)
    assert torch.equal(m, _greedy_python(w))
    assert torch.equal(m, prune(w, "tile_greedy")[1])
    per_tile = m.reshape(4, 4, 6, 4).transpose(1, 2)  # (tile row, tile col, 4, 4)
    assert (
        per_tile.sum(-1).max() <= 2 and per_tile.sum(-2).max() <= 2
    )  # <= 2 per row and per column of a tile
    if kind == "fp32":  # distinct values: the tie rule cannot matter
        assert torch.equal(m, tile_mask(w, tie_order="kernel"))


def test_kernel_network_is_a_sorting_network():
    """The transcribed StaticSort<16> (65 compare-exchanges) sorts every 0/1 input, hence every
    input (0-1 principle): a transcription error in the network would show here before it shows in a
    mask."""
    assert len(KERNEL_NETWORK) == 65
    v = ((torch.arange(2**16)[:, None] >> torch.arange(16)) & 1).float()
    for i, j in KERNEL_NETWORK:
        lo, hi = torch.minimum(v[:, i], v[:, j]), torch.maximum(v[:, i], v[:, j])
        v[:, i], v[:, j] = lo, hi
    assert bool((v[:, 1:] >= v[:, :-1]).all())


def test_bf16_ties_the_repository_matches_row_major_ties_not_always_the_kernel_order():
    """MLP-shaped weights rounded to bf16 (what the mask sees under bf16 autocast): the repository's
    tile_greedy is the reference with row-major ties bit for bit; torch's kernel breaks ties in its
    sorting network's order, which keeps other entries in a small fraction of tiles (printed; fp32
    weights have no ties, and no difference)."""
    g = torch.Generator().manual_seed(2)
    w = (torch.randn(768, 192, generator=g) * 0.02).to(torch.bfloat16)
    repo = prune(w, "tile_greedy")[1]
    assert torch.equal(tile_mask(w), repo)
    differing = (tile_mask(w, tie_order="kernel") != repo).reshape(192, 4, 48, 4).any(3).any(1)
    frac = differing.float().mean().item()
    print(
        f"\nbf16 N(0, 0.02) weight 768x192: {frac:.4%} of 4x4 tiles keep other entries under the "
        f"kernel's tie order"
    )
    assert 0 < frac < 0.05


def test_torch_default_algorithm_ranks_signed_values_unlike_tile_greedy():
    """torchao's SemiSparseLinear calls `_sparse_semi_structured_tile` with algorithm "" =
    largest_values_greedy (signed values, ComputeSparseTile.h's named_algorithms); the repository's
    tile_greedy (and the reference's default) is largest_abs_values_greedy. On random weights the
    two keep different entries in most tiles."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 64, generator=g)
    assert torch.equal(tile_mask(w, ""), tile_mask(w, "largest_values_greedy"))
    differing = (tile_mask(w, "") != prune(w, "tile_greedy")[1]).reshape(16, 4, 16, 4).any(3).any(1)
    print(f"\nsigned vs abs greedy: {differing.float().mean().item():.1%} of tiles differ")
    assert differing.float().mean() > 0.5


@pytest.mark.parametrize("kind", ["fp32", "bf16", "integers"])
def test_repository_tile_greedy_signed_is_the_torch_default_algorithm(kind):
    """The repository's `tile_greedy_signed` is torchao's ranking: the reference's "" algorithm
    (signed values, row-major ties), masks equal bit for bit, and so is the layer's forward and
    backward built on it."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(32, 48, generator=g)
    if kind == "bf16":  # many exact ties
        w = (w * 0.02).to(torch.bfloat16)
    elif kind == "integers":
        w = torch.randint(-2, 3, (32, 48), generator=g).float()
    assert torch.equal(prune(w, "tile_greedy_signed")[1], tile_mask(w, ""))
    lin = nn.Linear(48, 32)
    x, dy = torch.randn(3, 5, 48, generator=g), torch.randn(3, 5, 32, generator=g)
    repo = _grads(
        SemiSparseLinear.from_dense(lin, backend="dense", pruning="tile_greedy_signed"),
        x,
        dy,
        False,
    )
    ref = _grads(ReferenceSemiSparseLinear.from_dense(lin, algorithm=""), x, dy, False)
    for a, b in zip(repo, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("out_f,in_f", [(6, 8), (8, 6), (8, 10), (2, 4), (4, 2), (12, 18)])
def test_shapes_refused_by_both(out_f, in_f):
    lin = nn.Linear(in_f, out_f)
    with pytest.raises(ValueError, match="divisible by 4"):
        SemiSparseLinear.from_dense(lin, backend="dense", pruning="tile_greedy")
    with pytest.raises(ValueError, match="divisible by 4"):
        ReferenceSemiSparseLinear.from_dense(lin)
    assert type(lin) is nn.Linear


def _grads(module, x, dy, autocast: bool):
    x = x.detach().clone().requires_grad_()
    module.weight.grad = None
    if module.bias is not None:
        module.bias.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = module(x)
    y.backward(dy.to(y.dtype))
    return (
        y.detach(),
        x.grad,
        module.weight.grad.clone(),
        None if module.bias is None else module.bias.grad.clone(),
    )


LAYER_SHAPES = [
    ((4, 4), (3,)),
    ((20, 12), (5,)),
    ((8, 36), (2, 3)),
    ((768, 192), (2, 3, 7)),
    ((192, 768), (50,)),
]


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize(
    "shape,lead", LAYER_SHAPES, ids=[f"{s[0]}x{s[1]}-lead{len(d)}" for s, d in LAYER_SHAPES]
)
def test_repository_layer_equals_reference(shape, lead, bias, autocast):
    """Same forward, dx, dW, db as the reference on random inputs; and both equal a third path,
    plain autograd through F.linear with the pruned weight as a leaf (straight-through by
    construction: its gradient IS dW). Tolerances: fp32 1e-5 (a different but valid GEMM summation
    order would differ by a few ulp of the O(1)-O(10) values); bf16 1e-2, 2.5 bf16 ulp. Measured:
    identical bits in both dtypes."""
    out_f, in_f = shape
    torch.manual_seed(LAYER_SHAPES.index((shape, lead)) + 10 * bias)
    lin = nn.Linear(in_f, out_f, bias=bias)
    x, dy = torch.randn(*lead, in_f), torch.randn(*lead, out_f)
    repo = _grads(
        SemiSparseLinear.from_dense(lin, backend="dense", pruning="tile_greedy"), x, dy, autocast
    )
    ref = _grads(ReferenceSemiSparseLinear.from_dense(lin), x, dy, autocast)
    dtype = torch.bfloat16 if autocast else torch.float32
    mask = tile_mask(lin.weight.detach().to(dtype))
    assert torch.equal(mask, prune(lin.weight.detach().to(dtype), "tile_greedy")[1])

    ws = (lin.weight.detach().to(dtype) * mask).requires_grad_()
    xl = x.clone().requires_grad_()
    bl = None if lin.bias is None else lin.bias.detach().to(dtype).requires_grad_()
    y = F.linear(xl.to(dtype), ws, bl)
    y.backward(dy.to(dtype))
    third = (y.detach(), xl.grad, ws.grad.float(), None if bl is None else bl.grad.float())

    tol = dict(rtol=1e-2, atol=1e-2) if autocast else dict(rtol=1e-5, atol=1e-5)
    for name, r, t, th in zip(("y", "dx", "dW", "db"), repo, ref, third):
        if r is None:
            assert t is None and th is None
            continue
        assert r.dtype == t.dtype and r.shape == t.shape, name
        torch.testing.assert_close(
            r, t, **tol, msg=lambda m: f"{name}: repository vs reference: {m}"
        )
        torch.testing.assert_close(
            t.float(), th.float(), **tol, msg=lambda m: f"{name}: reference vs autograd: {m}"
        )
    assert (
        repo[0].dtype == dtype and repo[1].dtype == torch.float32 and repo[2].dtype == torch.float32
    )
    dw = ref[2]
    assert (
        dw[~mask] != 0
    ).float().mean() > 0.95  # the weight gradient is not masked (straight-through)


def _toy_model() -> nn.Module:
    def block():
        b = nn.Module()
        b.attn = nn.Module()
        b.attn.qkv = nn.Linear(8, 24)
        b.mlp = nn.Module()
        b.mlp.fc1, b.mlp.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)
        return b

    m = nn.Module()
    m.blocks = nn.ModuleList([block(), block()])
    m.head = nn.Linear(8, 4)
    return m


def test_swap_by_regex_keeps_parameters_draws_no_random_numbers_and_goes_back():
    model = _toy_model().eval()
    params = {n: p for n, p in model.named_parameters()}
    rng = torch.get_rng_state()
    names = swap_to_reference(model)
    assert torch.equal(rng, torch.get_rng_state())  # no throw-away initialisation drawn
    assert names == ["blocks.0.mlp.fc1", "blocks.0.mlp.fc2", "blocks.1.mlp.fc1", "blocks.1.mlp.fc2"]
    for n, m in model.named_modules():
        assert isinstance(m, ReferenceSemiSparseLinear) == bool(re.fullmatch(MLP_PATTERN, n)), n
    assert all(p is params[n] for n, p in model.named_parameters())
    assert len(params) == len(dict(model.named_parameters()))
    assert not model.blocks[0].mlp.fc1.training
    assert swap_to_linear(model) == names
    assert all(type(m) is nn.Linear for n, m in model.named_modules() if isinstance(m, nn.Linear))
    assert all(p is params[n] for n, p in model.named_parameters())
    with pytest.raises(ValueError, match="matches no nn.Linear"):
        swap_to_reference(model, pattern=r"blocks\.\d+\.mlp\.fc3")


# ==================================================================================================
# (gpu) the reference's masks against torch's own kernel


def kernel_mask(w: torch.Tensor, algorithm: str) -> tuple:
    """torch's own `_sparse_semi_structured_tile` mask of w (CUDA, 16-bit, cols % 32 == 0): the kept
    entries of `_sparse_semi_structured_apply_dense(ones, bitmask)`; and the same read from the
    bitmask's layout directly (per thread an 8x8 area: four uint16 4x4 masks a b / c d, bit col + 4
    * row; SparseSemiStructuredPack.h), or None where that layout is not as read here."""
    out = torch._sparse_semi_structured_tile(w, algorithm=algorithm, use_cutlass=True)
    bitmask = out[-1]
    applied = torch._sparse_semi_structured_apply_dense(torch.ones_like(w), bitmask) != 0
    decoded = None
    try:
        b = bitmask.to(torch.int32)
        x, y = b.shape[0], b.shape[1]
        words = b[..., 0::2] | (b[..., 1::2] << 8)  # (X, Y, 4): tiles a, b, c, d
        bits = (words[..., None] >> torch.arange(16, device=w.device)) & 1
        decoded = bits.reshape(x, y, 2, 2, 4, 4).permute(0, 2, 4, 1, 3, 5).reshape(8 * x, 8 * y)
        decoded = decoded[: w.shape[0], : w.shape[1]].bool()
    except Exception:  # noqa: BLE001 - informative only
        pass
    return applied, decoded


def _tiled(tile, rows=64, cols=64) -> torch.Tensor:
    return torch.tensor(tile, dtype=torch.float32).repeat(rows // 4, cols // 4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reference_masks_equal_torch_kernel(dtype):
    """The reference's tile mask with the kernel's tie order equals torch's
    `_sparse_semi_structured_tile` for its three algorithms, on random MLP-shaped weights (ties from
    the 16-bit rounding), integer weights (ties everywhere) and the hand-computed tiles above; the
    repository's tile_greedy (Triton on the GPU) equals the reference with row-major ties. Prints
    how often the repository's masks differ from torch's."""
    if not hasattr(torch, "_sparse_semi_structured_tile"):
        pytest.skip("this torch has no torch._sparse_semi_structured_tile")
    g = torch.Generator().manual_seed(4)
    weights = {
        "N(0, 0.02) 768x192": torch.randn(768, 192, generator=g) * 0.02,
        "N(0, 0.02) 192x768": torch.randn(192, 768, generator=g) * 0.02,
        "integers in [-2, 2] 128x128": torch.randint(-2, 3, (128, 128), generator=g).float(),
        "TORCH_TEST_TILE": _tiled(TORCH_TEST_TILE),
        "TILE_WITH_7_KEPT": _tiled(TILE_WITH_7_KEPT),
        "all equal": torch.full((64, 64), 0.5),
        "TIE_IN_ROW_0": _tiled(TIE_IN_ROW_0),
    }
    try:
        kernel_mask(weights["all equal"].to("cuda", dtype), "")
    except RuntimeError as e:
        pytest.skip(f"torch._sparse_semi_structured_tile does not run here: {e}")
    failures = []
    for name, w in weights.items():
        w = w.to("cuda", dtype)
        repo = prune(w, "tile_greedy")[1]
        assert torch.equal(repo, tile_mask(w)), name  # Triton kernel = reference, row-major ties
        for algorithm in ("", "largest_values_greedy", "largest_abs_values_greedy"):
            applied, decoded = kernel_mask(w, algorithm)
            ours = tile_mask(w, algorithm, tie_order="kernel")
            r, c = w.shape
            tiles = lambda m: m.reshape(r // 4, 4, c // 4, 4).any(3).any(1)  # noqa: E731
            vs_repo = tiles(applied != repo).float().mean().item()
            print(
                f"{dtype} {name:28s} algorithm {algorithm or '(default)':26s}: reference (kernel "
                f"ties) "
                f"{'equals' if torch.equal(ours, applied) else 'DIFFERS FROM'} torch's kernel "
                f"({tiles(ours != applied).float().mean().item():.3%} of tiles); bitmask read "
                f"directly "
                f"{'agrees' if decoded is not None and torch.equal(decoded, applied) else 'does not agree'}; "
                f"torch's kernel vs the repository's tile_greedy: {vs_repo:.3%} of tiles differ"
            )
            if not torch.equal(ours, applied):
                failures.append((name, algorithm))
    assert not failures, failures
