"""Pure-PyTorch 2:4 pruning oracles: the definitions every kernel in this package must reproduce bit
for bit.

Layout: a weight is (out, in) = (rows, cols). Groups of 4 run along `cols` (the GEMM's reduction dim
K for W); a tile is an aligned 4x4 block. Magnitudes are compared as fp32 |w|, which is exact for
fp32/fp16/bf16 inputs. Inputs must be finite: with NaN or inf the selections are unspecified.

Tie rules (deterministic, shared by the Triton kernels):
- groups of 4: the element with the lower index wins a tie;
- 4x4 tiles: order by |w| descending, ties to the lower row-major index inside the tile (0..15, p =
  4*row + col).

Methods (`METHODS`):
- ``tile_greedy``   torch core's ``LargestValuesGreedy<AbsOp>`` ("largest_abs_values_greedy"): walk
  the 16 entries of
                    a tile in the order above, keep one iff its row and its column both hold < 2 kept. W and W^T are
                    both 2:4 (transposable); may keep fewer than 8 per tile.
- ``tile_greedy_signed`` the same walk ordered by the *signed* value w (descending) instead of |w|:
  torch core's
                    default ``LargestValuesGreedy<IdentityOp>`` (algorithm "" or "largest_values_greedy"), which is what
                    torchao's ``SemiSparseLinear`` calls (it passes no algorithm), so the published DINOv2 runs most
                    likely pruned this way: large negative weights are pruned first. Transposable. Ties as above.
- ``tile_optimal``  per tile, the pattern with exactly 2 kept per row and per column (90 of them,
  `TILE_PATTERNS`)
                    maximising the kept |w| sum; transposable. Scores are summed in a fixed fp32 order (see
                    `tile_pattern_scores`) and ties go to the first pattern of `TILE_PATTERNS`.
- ``rowwise``       plain 2:4 along rows: top-2 |w| of each group of 4. Not transposable.
- ``soft_threshold`` S-STE (arXiv 2409.09099): rowwise mask, kept values shrunk towards 0 by the
  group's
                    2nd-smallest |w|. Not transposable. Continuous in W.

Plus `mvue24(x, seed)`: the unbiased stochastic 2:4 of S-STE's gradient path, driven by a Philox
generator that is bit-identical to Triton's ``tl.rand4x`` (`philox_uniform4`), so the Triton kernel
can reproduce it exactly.
"""

from __future__ import annotations

import itertools

import torch

from sparsity.options import PRUNING_METHODS as METHODS

TRANSPOSABLE_METHODS = frozenset({"tile_greedy", "tile_greedy_signed", "tile_optimal"})

# Pairs of kept columns inside one row of a tile, in this fixed order (index k = 0..5).
ROW_PAIRS: tuple[tuple[int, int], ...] = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))


def _enumerate_tile_patterns() -> tuple[tuple[int, int, int, int], ...]:
    """All 4x4 patterns with exactly two kept per row and per column, as the ROW_PAIRS index of each
    row.

    Order: lexicographic in (row0's pair, row1's pair, row2's pair, row3's pair), pair indices as in
    ROW_PAIRS.
    """
    out = []
    for choice in itertools.product(range(len(ROW_PAIRS)), repeat=4):
        counts = [0, 0, 0, 0]
        for k in choice:
            for c in ROW_PAIRS[k]:
                counts[c] += 1
        if counts == [2, 2, 2, 2]:
            out.append(choice)
    return tuple(out)


TILE_PATTERNS = _enumerate_tile_patterns()
assert len(TILE_PATTERNS) == 90
# The same patterns as 16-bit masks: bit p = 4*row + col set where kept.
TILE_PATTERN_BITS = tuple(
    sum(1 << (4 * r + c) for r, k in enumerate(pat) for c in ROW_PAIRS[k]) for pat in TILE_PATTERNS
)


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"unknown pruning method {method!r}; choose one of {', '.join(METHODS)}")
    return method


def is_transposable(method: str) -> bool:
    """True when the method's mask is 2:4 along rows AND columns, so W^T can run as a sparse GEMM
    too.

    Backends must run the input-gradient GEMM (dy @ W_s) dense on the masked weight when this is
    False.
    """
    return check_method(method) in TRANSPOSABLE_METHODS


def check_shape(shape, method: str) -> None:
    """Raise ValueError naming the shape if `method` cannot prune a 2-D tensor of this shape.

    Tile methods need rows % 4 == 0 and cols % 4 == 0; the row-wise methods only cols % 4 == 0 (so
    activations with any number of tokens can be pruned).
    """
    check_method(method)
    shape = tuple(shape)
    if len(shape) != 2:
        raise ValueError(f"{method} pruning needs a 2-D (rows, cols) tensor, got shape {shape}")
    rows, cols = shape
    if method in TRANSPOSABLE_METHODS:
        if rows % 4 or cols % 4:
            raise ValueError(
                f"{method} pruning needs rows and cols divisible by 4 (4x4 tiles), got shape "
                f"{shape}"
            )
    elif cols % 4:
        raise ValueError(
            f"{method} pruning needs cols divisible by 4 (groups of 4 along rows), got shape "
            f"{shape}"
        )


def _abs32(w: torch.Tensor) -> torch.Tensor:
    return w.detach().abs().to(torch.float32)


def _rank_desc(v: torch.Tensor) -> torch.Tensor:
    """Rank along the last dim by value descending, ties to the lower index (rank 0 = largest)."""
    order = torch.sort(v, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(
        -1, order, torch.arange(v.shape[-1], device=v.device).expand_as(order).contiguous()
    )
    return rank


def _to_tiles(v: torch.Tensor) -> torch.Tensor:
    """(R, C) -> (R/4 * C/4, 16): tiles in row-major tile order, entries in row-major order inside
    the tile."""
    r, c = v.shape
    return v.reshape(r // 4, 4, c // 4, 4).permute(0, 2, 1, 3).reshape(-1, 16)


def _from_tiles(t: torch.Tensor, shape) -> torch.Tensor:
    r, c = shape
    return t.reshape(r // 4, c // 4, 4, 4).permute(0, 2, 1, 3).reshape(r, c)


# --------------------------------------------------------------------------------------------------
# masks


def rowwise_mask(w: torch.Tensor) -> torch.Tensor:
    """Boolean mask keeping the 2 largest |w| of every group of 4 consecutive elements of a row
    (ties: lower index)."""
    check_shape(w.shape, "rowwise")
    r, c = w.shape
    rank = _rank_desc(_abs32(w).reshape(r, c // 4, 4))
    return (rank < 2).reshape(r, c)


def tile_greedy_mask(w: torch.Tensor) -> torch.Tensor:
    """torch core's largest_abs_values_greedy on aligned 4x4 tiles (see the module docstring);
    transposable."""
    check_shape(w.shape, "tile_greedy")
    return _from_tiles(_greedy_walk(_to_tiles(_abs32(w))), w.shape)


def tile_greedy_signed_mask(w: torch.Tensor) -> torch.Tensor:
    """torch core's default largest_values_greedy (signed order) on aligned 4x4 tiles;
    transposable."""
    check_shape(w.shape, "tile_greedy_signed")
    return _from_tiles(_greedy_walk(_to_tiles(w.detach().to(torch.float32))), w.shape)


def _greedy_walk(v: torch.Tensor) -> torch.Tensor:
    """(T, 16) ordering keys of tiles -> (T, 16) kept: the greedy walk, largest key first, ties to
    the lower index."""
    n = v.shape[0]
    order = torch.sort(
        v, dim=1, descending=True, stable=True
    ).indices  # (T, 16) positions, largest first
    kept = torch.zeros(n, 16, dtype=torch.bool, device=v.device)
    row_count = torch.zeros(n, 4, dtype=torch.int32, device=v.device)
    col_count = torch.zeros(n, 4, dtype=torch.int32, device=v.device)
    for step in range(16):
        p = order[:, step : step + 1]
        r, c = p // 4, p % 4
        ok = (row_count.gather(1, r) < 2) & (col_count.gather(1, c) < 2)
        kept.scatter_(1, p, ok)
        row_count.scatter_add_(1, r, ok.to(torch.int32))
        col_count.scatter_add_(1, c, ok.to(torch.int32))
    return kept


def tile_pattern_scores(w: torch.Tensor) -> torch.Tensor:
    """(T, 90) fp32 kept-|w| sums of every `TILE_PATTERNS` entry for each 4x4 tile of `w`.

    Fixed summation order (kernels reproduce it exactly): per row the pair sum |w[r,i]| + |w[r,j]|,
    then ((pair_row0 + pair_row1) + pair_row2) + pair_row3.
    """
    v = _to_tiles(_abs32(w)).reshape(-1, 4, 4)
    pair = torch.stack(
        [v[:, :, i] + v[:, :, j] for i, j in ROW_PAIRS], dim=2
    )  # (T, 4 rows, 6 pairs)
    idx = torch.tensor(TILE_PATTERNS, device=w.device)  # (90, 4)
    s = pair[:, 0, idx[:, 0]]
    for r in range(1, 4):
        s = s + pair[:, r, idx[:, r]]
    return s


def tile_optimal_mask(w: torch.Tensor) -> torch.Tensor:
    """Per 4x4 tile, the 2-per-row-and-column pattern with the largest kept |w| sum (first in
    TILE_PATTERNS on ties)."""
    check_shape(w.shape, "tile_optimal")
    scores = tile_pattern_scores(w)
    n_pat = scores.shape[1]
    best = (
        torch.where(
            scores == scores.max(dim=1, keepdim=True).values,
            torch.arange(n_pat, device=w.device),
            n_pat,
        )
        .min(dim=1)
        .values
    )
    bits = torch.tensor(TILE_PATTERN_BITS, dtype=torch.int64, device=w.device)[best]  # (T,)
    kept = ((bits[:, None] >> torch.arange(16, device=w.device)) & 1).bool()
    return _from_tiles(kept, w.shape)


# --------------------------------------------------------------------------------------------------
# S-STE soft thresholding


def soft_threshold(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """S-STE soft thresholding along rows: returns (S(w) in w.dtype, mask).

    Per group of 4: t = 2nd-smallest |a| (the paper's min/max formula selects exactly that value),
    kept = top-2 |a| (ties as `rowwise_mask`), S(a)_i = a_i - t if a_i > 0 else a_i + t for kept i
    (= sign(a_i)(|a_i| - t)), 0 else. Computed in fp32 and rounded once to w.dtype.
    """
    check_shape(w.shape, "soft_threshold")
    r, c = w.shape
    a = w.detach().to(torch.float32).reshape(r, c // 4, 4)
    mag = a.abs()
    rank = _rank_desc(mag)
    keep = rank < 2
    t = torch.sort(mag, dim=-1, descending=True).values[..., 2:3]
    s = torch.where(
        keep, torch.where(a > 0, a - t, a + t), torch.zeros((), dtype=a.dtype, device=a.device)
    )
    return s.reshape(r, c).to(w.dtype), keep.reshape(r, c)


def soft_threshold_scale(w: torch.Tensor) -> torch.Tensor:
    """S-STE's per-tensor scale beta = <W, S(W)> / <S(W), S(W)> (MSE-minimising), a 0-d fp32 tensor.

    The paper computes it once (at initialisation) and keeps it fixed; 1.0 if S(W) is all zero.
    """
    s = soft_threshold(w)[0].to(torch.float64)
    w64 = w.detach().to(torch.float64)
    den = (s * s).sum()
    if den == 0:
        return torch.ones((), dtype=torch.float32, device=w.device)
    return ((w64 * s).sum() / den).to(torch.float32)


# --------------------------------------------------------------------------------------------------
# Philox (bit-identical to triton.language.rand4x) and MVUE


_M32 = 0xFFFFFFFF
_PHILOX_KEY_A, _PHILOX_KEY_B = 0x9E3779B9, 0xBB67AE85
_PHILOX_ROUND_A, _PHILOX_ROUND_B = 0xD2511F53, 0xCD9E8D57
_UNIFORM_SCALE = 4.6566127342e-10  # Triton's uint_to_uniform_float scale for 32-bit draws


def _mul32(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit halves of the 64-bit product of constant a and uint32 values b (held in
    int64)."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    p_hi, p_lo = a_hi * b, a_lo * b  # each < 2**48
    high = (p_hi + (p_lo >> 16)) >> 16
    low = (((p_hi & 0xFFFF) << 16) + p_lo) & _M32
    return high, low


def philox_uniform4(
    seed: int, offsets: torch.Tensor, n_rounds: int = 10
) -> tuple[torch.Tensor, ...]:
    """Four fp32 uniforms in [0, 1) per offset, equal bit for bit to ``tl.rand4x(seed,
    offsets)``."""
    if not 0 <= int(seed) < 2**63:
        raise ValueError(f"seed must be in [0, 2**63), got {seed}")
    seed = int(seed)
    off = offsets.to(torch.int64)
    c0, c1 = off & _M32, (off >> 32) & _M32
    c2 = torch.zeros_like(off)
    c3 = torch.zeros_like(off)
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(n_rounds):
        hi_b, lo_b = _mul32(_PHILOX_ROUND_B, c2)
        hi_a, lo_a = _mul32(_PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _PHILOX_KEY_A) & _M32, (k1 + _PHILOX_KEY_B) & _M32
    out = []
    scale = torch.tensor(_UNIFORM_SCALE, dtype=torch.float32)
    for x in (c0, c1, c2, c3):
        x = torch.where(x >= 2**31, x - 2**32, x)  # bitcast to int32
        x = torch.where(x < 0, -x - 1, x)
        out.append(x.to(torch.float32) * scale.to(x.device))
    return tuple(out)


MVUE_EPS = 1.19209e-07  # added to |x| so that zeros can be drawn (the S-STE reference's eps)


def mvue_uniforms(seed: int, n_groups: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(u1, u2) of groups 0..n_groups-1: groups 2h and 2h + 1 share the draw ``tl.rand4x(seed, h)``,
    the first taking its outputs 0 and 1, the second its outputs 2 and 3 (one Philox call per two
    groups)."""
    g = torch.arange(n_groups, device=device)
    r0, r1, r2, r3 = philox_uniform4(seed, g // 2)
    odd = (g % 2).bool()
    return torch.where(odd, r2, r0), torch.where(odd, r3, r1)


def mvue24(x: torch.Tensor, seed: int) -> torch.Tensor:
    """Unbiased stochastic 2:4 along the last dim: E[mvue24(x, seed)] = x over seeds. Deterministic
    per seed.

    Per group of 4 (a_i = |x_i| + eps, S = sum a, in index order): draw index i1 with probability
    a_i / S (u1 * S against the running sum of a), then i2 among the 3 others with probability a_j /
    (S - a_i1) (u2 * their sum against their running sum, in index order). The draws compare
    products and sums only, so a kernel reproduces them exactly. Kept x_i are divided by their
    inclusion probability p_i = (a_i / S) (1 + W - w_i), w_j = a_j / (S - a_j), W = sum w_j  (i
    first, or j first and then i), computed as x_i * S / (a_i * (1 + (W - w_i))); the rest are 0.
    (u1, u2): `mvue_uniforms`, g the group's row-major index in the logical (..., C/4) layout. fp32
    throughout; the result is rounded once to x.dtype.
    """
    if x.shape[-1] % 4:
        raise ValueError(f"mvue24 needs the last dim divisible by 4, got shape {tuple(x.shape)}")
    shape = x.shape
    g = x.detach().to(torch.float32).reshape(-1, 4)
    u1, u2 = mvue_uniforms(seed, g.shape[0], x.device)
    a = g.abs() + MVUE_EPS
    a0, a1, a2, a3 = a.unbind(1)
    c0 = a0
    c1 = c0 + a1
    c2 = c1 + a2
    s = c2 + a3
    us = u1 * s
    i1 = (us > c0).long() + (us > c1).long() + (us > c2).long()
    # second draw among the other three, in index order: r_m = a[m + (m >= i1)]
    r0 = torch.where(i1 == 0, a1, a0)
    r1 = torch.where(i1 <= 1, a2, a1)
    r2 = torch.where(i1 <= 2, a3, a2)
    e1 = r0 + r1
    tt = u2 * (e1 + r2)
    m = (tt > r0).long() + (tt > e1).long()
    i2 = m + (m >= i1).long()
    w = a / (s[:, None] - a)
    big_w = ((w[:, 0] + w[:, 1]) + w[:, 2]) + w[:, 3]
    q = g * s[:, None] / (a * (1.0 + (big_w[:, None] - w)))
    idx = torch.arange(4, device=x.device)
    keep = (idx == i1[:, None]) | (idx == i2[:, None])
    out = torch.where(keep, q, torch.zeros((), dtype=torch.float32, device=x.device))
    return out.reshape(shape).to(x.dtype)


# --------------------------------------------------------------------------------------------------
# one entry point


_MASKS = {
    "tile_greedy": tile_greedy_mask,
    "tile_greedy_signed": tile_greedy_signed_mask,
    "tile_optimal": tile_optimal_mask,
    "rowwise": rowwise_mask,
}


def prune_reference(w: torch.Tensor, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(pruned values in w.dtype, bool mask) for `method`; mask methods return w * mask,
    soft_threshold S(w)."""
    check_shape(w.shape, method)
    if method == "soft_threshold":
        return soft_threshold(w)
    mask = _MASKS[method](w)
    return masked_values(w, mask), mask


def masked_values(w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """w where `mask` keeps it, 0 elsewhere, in w's dtype: a mask method's pruned values."""
    return torch.where(mask, w.detach(), torch.zeros((), dtype=w.dtype, device=w.device))
