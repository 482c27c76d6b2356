"""Triton pruning kernels, bit-identical to `sparsity.pruning.reference` (masks exact, values exact
on GPU; under the CPU interpreter fp32 -> bf16 stores truncate, so soft_threshold's bf16 values may
differ by 1 ulp there).

Every kernel reads its input once (any strides), computes in fp32, is branch-free and writes a
contiguous (values, mask) pair. Tie rules are those of the reference: a pairwise "j beats i"
comparison (|w_j| > |w_i|, or equal and j < i) gives each element its rank in the documented order.

- groups of 4 (rowwise, soft_threshold): one program handles BLOCK_G groups laid out as (BLOCK_G,
  4).
- 4x4 tiles (tile_greedy, tile_greedy_signed, tile_optimal): one program handles BLOCK_T tiles laid
  out as (BLOCK_T, 16), entries in row-major order inside the tile. Greedy: ranks from 16x16
  pairwise comparisons, then the greedy walk as 16 unrolled steps on a 16-bit kept mask per tile
  (row/column "has < 2 kept" = popcount < 2 = x & (x - 1) == 0). Optimal: the 24 pair sums, the 90
  pattern scores summed in the reference's order (patterns from a small table), argmax with the
  first-max rule.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparsity.cuda_buffers import persistent_copy
from sparsity.kernels._util import check_launchable, interpreting
from sparsity.pruning.reference import ROW_PAIRS, TILE_PATTERN_BITS, TILE_PATTERNS, check_shape

N_PATTERNS = len(TILE_PATTERNS)  # 90
PATTERN_SLOTS = 128  # power of two >= N_PATTERNS for tl.arange


@triton.jit
def _groups4_kernel(
    w_ptr,
    out_ptr,
    mask_ptr,
    n_groups,
    groups_per_row,
    stride_r,
    stride_c,
    n_cols,
    SOFT: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    g = tl.program_id(0) * BLOCK_G + tl.arange(0, BLOCK_G)
    valid = g < n_groups
    r = g // groups_per_row
    j = tl.arange(0, 4)
    col = (g % groups_per_row)[:, None] * 4 + j[None, :]
    m2 = valid[:, None]
    w = tl.load(w_ptr + r[:, None] * stride_r + col * stride_c, mask=m2, other=0.0)
    a = w.to(tl.float32)
    mag = tl.abs(a)
    mi = mag[:, :, None]
    mj = mag[:, None, :]
    beats = (mj > mi) | ((mj == mi) & (j[None, None, :] < j[None, :, None]))
    rank = tl.sum(beats.to(tl.int32), axis=2)  # (G, 4), a permutation of 0..3 per group
    keep = rank < 2
    if SOFT:
        t = tl.sum(tl.where(rank == 2, mag, 0.0), axis=1)[
            :, None
        ]  # 2nd-smallest |a| (one non-zero term: exact)
        s = tl.where(a > 0, a - t, a + t)
        val = tl.where(keep, s, 0.0).to(out_ptr.dtype.element_ty)
    else:
        val = tl.where(keep, w, 0.0)
    off = r[:, None] * n_cols + col
    tl.store(out_ptr + off, val, mask=m2)
    tl.store(mask_ptr + off, keep.to(tl.uint8), mask=m2)


@triton.jit
def _greedy_bits(mag, p):
    """(T, 16) ordering keys (|w|, or w for the signed walk) -> (T,) int32 kept mask of the greedy
    walk (bit p = row-major position p)."""
    mi = mag[:, :, None]
    mj = mag[:, None, :]
    beats = (mj > mi) | ((mj == mi) & (p[None, None, :] < p[None, :, None]))
    rank = tl.sum(beats.to(tl.int32), axis=2)  # (T, 16): position of each entry in the walk
    kept = tl.sum(rank * 0, axis=1)  # (T,) zeros, int32
    for k in tl.static_range(16):
        pos = tl.sum(tl.where(rank == k, p[None, :], 0), axis=1)  # the entry visited at step k
        rb = (kept >> ((pos >> 2) * 4)) & 15  # kept bits of its row
        cb = kept & (4369 << (pos & 3))  # kept bits of its column (0x1111 << col)
        ok = ((rb & (rb - 1)) == 0) & ((cb & (cb - 1)) == 0)  # fewer than 2 kept in both
        kept = kept | (ok.to(tl.int32) << pos)
    return kept


@triton.jit
def _tile_entry(mag, p, q: tl.constexpr):
    return tl.sum(tl.where(p[None, :] == q, mag, 0.0), axis=1)  # one non-zero term: exact


@triton.jit
def _optimal_bits(mag, p, pat_ptr, bits_ptr, N_PAT: tl.constexpr, SLOTS: tl.constexpr):
    """(T, 16) |w| -> (T,) int32 mask of the best 2-per-row-and-column pattern (reference order of
    sums, first max)."""
    slot = tl.arange(0, SLOTS)
    score = tl.zeros([mag.shape[0], SLOTS], dtype=tl.float32)
    for r in tl.static_range(4):
        a0 = _tile_entry(mag, p, 4 * r + 0)
        a1 = _tile_entry(mag, p, 4 * r + 1)
        a2 = _tile_entry(mag, p, 4 * r + 2)
        a3 = _tile_entry(mag, p, 4 * r + 3)
        # pair sums in ROW_PAIRS order: (0,1) (0,2) (0,3) (1,2) (1,3) (2,3)
        k = tl.load(pat_ptr + r * SLOTS + slot)[None, :]
        g = tl.where(
            k == 0,
            (a0 + a1)[:, None],
            tl.where(
                k == 1,
                (a0 + a2)[:, None],
                tl.where(
                    k == 2,
                    (a0 + a3)[:, None],
                    tl.where(
                        k == 3,
                        (a1 + a2)[:, None],
                        tl.where(k == 4, (a1 + a3)[:, None], (a2 + a3)[:, None]),
                    ),
                ),
            ),
        )
        score = score + g  # 0 + row0, then ((row0 + row1) + row2) + row3: the reference's order
    score = tl.where(slot[None, :] < N_PAT, score, -1.0)
    best_score = tl.max(score, axis=1)
    best = tl.min(tl.where(score == best_score[:, None], slot[None, :], SLOTS), axis=1)
    bits = tl.load(bits_ptr + slot)
    return tl.sum(tl.where(slot[None, :] == best[:, None], bits[None, :], 0), axis=1)


@triton.jit
def _tiles_kernel(
    w_ptr,
    out_ptr,
    mask_ptr,
    pat_ptr,
    bits_ptr,
    n_tiles,
    tiles_per_row,
    stride_r,
    stride_c,
    n_cols,
    OPTIMAL: tl.constexpr,
    SIGNED: tl.constexpr,
    N_PAT: tl.constexpr,
    SLOTS: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    valid = t < n_tiles
    p = tl.arange(0, 16)
    row = (t // tiles_per_row)[:, None] * 4 + (p // 4)[None, :]
    col = (t % tiles_per_row)[:, None] * 4 + (p % 4)[None, :]
    m2 = valid[:, None]
    w = tl.load(w_ptr + row * stride_r + col * stride_c, mask=m2, other=0.0)
    # tile_greedy_signed: the walk ordered by w itself (torch's default largest_values_greedy)
    if SIGNED:
        mag = w.to(tl.float32)
    else:
        mag = tl.abs(w.to(tl.float32))
    if OPTIMAL:
        bits = _optimal_bits(mag, p, pat_ptr, bits_ptr, N_PAT, SLOTS)
    else:
        bits = _greedy_bits(mag, p)
    keep = ((bits[:, None] >> p[None, :]) & 1) != 0
    off = row * n_cols + col
    tl.store(out_ptr + off, tl.where(keep, w, 0.0), mask=m2)
    tl.store(mask_ptr + off, keep.to(tl.uint8), mask=m2)


_TABLES: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _pattern_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(4, SLOTS) int32 ROW_PAIRS index per row and pattern, (SLOTS,) int32 pattern bits; padding
    slots are unused."""
    if device not in _TABLES:
        assert len(ROW_PAIRS) == 6
        pat = torch.zeros(4, PATTERN_SLOTS, dtype=torch.int32)
        pat[:, :N_PATTERNS] = torch.tensor(TILE_PATTERNS, dtype=torch.int32).t()
        bits = torch.zeros(PATTERN_SLOTS, dtype=torch.int32)
        bits[:N_PATTERNS] = torch.tensor(TILE_PATTERN_BITS, dtype=torch.int32)
        if device.type == "cuda":  # kept across calls: from no CUDA-graph pool (cuda_buffers.py)
            index = device.index if device.index is not None else torch.cuda.current_device()
            _TABLES[device] = (persistent_copy(pat, index), persistent_copy(bits, index))
        else:
            _TABLES[device] = (pat.to(device), bits.to(device))
    return _TABLES[device]


def _block(gpu: int, interp: int) -> int:
    return interp if interpreting() else gpu


def prune(w: torch.Tensor, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of `reference.prune_reference`: (values in w.dtype, bool mask), both
    contiguous."""
    check_shape(w.shape, method)
    check_launchable(w)
    rows, cols = w.shape
    out = torch.empty((rows, cols), dtype=w.dtype, device=w.device)
    mask = torch.empty((rows, cols), dtype=torch.bool, device=w.device)
    if w.numel() == 0:
        return out, mask
    if method in ("rowwise", "soft_threshold"):
        n_groups = rows * cols // 4
        block = _block(256, 4096)
        _groups4_kernel[(triton.cdiv(n_groups, block),)](
            w,
            out,
            mask.view(torch.uint8),
            n_groups,
            cols // 4,
            w.stride(0),
            w.stride(1),
            cols,
            SOFT=method == "soft_threshold",
            BLOCK_G=block,
            num_warps=4,
        )
    else:
        n_tiles = rows * cols // 16
        block = _block(32, 256)
        pat, bits = _pattern_tables(w.device)
        _tiles_kernel[(triton.cdiv(n_tiles, block),)](
            w,
            out,
            mask.view(torch.uint8),
            pat,
            bits,
            n_tiles,
            cols // 4,
            w.stride(0),
            w.stride(1),
            cols,
            OPTIMAL=method == "tile_optimal",
            SIGNED=method == "tile_greedy_signed",
            N_PAT=N_PATTERNS,
            SLOTS=PATTERN_SLOTS,
            BLOCK_T=block,
            num_warps=4,
        )
    return out, mask
