"""Fused 2:4 prune + pack for cuSPARSELt (Triton): one pass over W writes both GEMM operands in the
library's layout.

Reads W (out x in, fp16/bf16, any strides) once and, per aligned 4x4 tile,
  * selects the transposable mask: torch core's largest_abs_values_greedy walk, bit-identical to
    `sparsity.pruning.reference.tile_greedy_mask` (or takes a given mask, for the other pruning
    methods);
  * writes the compressed forward operand (A = W, row-major, 2:4 along `in`) and, if asked, the
    compressed input-gradient operand (A = W^T, W's memory read column-major, 2:4 along `out`),
    values and metadata, in the byte layout of `sparsity.packing.layout` (= what
    `cusparseLtSpMMACompress2` writes on sm90, cuSPARSELt 0.8.0);
  * writes the 16-bit kept mask of each tile (bit 4*row + col), from which `mask()` / `to_dense()`
    are rebuilt.

This replaces prune + two `sp_mma_compress` calls (about 0.15-0.23 ms per layer on an H100) by one
memory-bound kernel: 2 bytes read and 2 x (1 + 1/8) bytes written per weight element (+1/8 for the
tile masks).

Per tile (one thread owns whole tiles, all in registers; the unrolled body is generated,
`_gen_pack_tile.py`): keys (|w| bits << 4) | (15 - p) are unique and order the 16 entries by |w|
descending, ties to the lower row-major index p (|w| of fp16/bf16 compared as its 15 magnitude bits
= the reference's fp32 comparison); a 63-comparator sorting network orders them and the greedy walk
keeps an entry iff its row and its column hold < 2 kept. Values are stored as one 4-byte word per
tile row (forward operand) and one 8-byte word per pair slot (input-gradient operand). Metadata
bytes pair rows r and r+8 of the structured operand, i.e. tiles tr and tr+2 (forward) or tc and tc+2
(input gradient), so a thread handles the four tiles {tr, tr+2} x {tc, tc+2} and stores whole bytes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from sparsity.kernels._pack_tile import _load_tile, _tile
from sparsity.kernels._util import check_launchable, interpreting
from sparsity.packing import layout as L


def _code_lut() -> int:
    """64-bit table: nibble code (i0 | i1 << 2) of the metadata pair for each 4-bit nonzero mask of
    a group."""
    lut = 0
    for m in range(16):
        kept = [i for i in range(4) if m >> i & 1]
        if len(kept) > 2:
            continue  # cannot occur
        rest = [i for i in (3, 2, 1, 0) if i not in kept]
        while len(kept) < 2:
            kept.append(rest.pop(0))
        i0, i1 = sorted(kept)
        lut |= (i0 | i1 << 2) << (4 * m)
    return lut


CODE_LUT = _code_lut()
LUT_LO, LUT_HI = (
    CODE_LUT & 0xFFFFFFFF,
    CODE_LUT >> 32,
)  # codes of masks 0-7 and 8-15, as int32 constants


@triton.jit
def _meta_addr(r, g, NKT):
    """Byte of the metadata region holding the nibble of group (r, g) of an operand with NKT
    k-tiles."""
    return (
        (((r // 64) * NKT + g // 8) * 4 + (r % 64) // 16) * 64
        + 8 * (r % 8)
        + 2 * (g % 4)
        + (g % 8) // 4
    )


@triton.jit
def _prune_pack_kernel(
    w_ptr,
    m_ptr,
    vf_ptr,
    vd_ptr,
    bits_ptr,
    wp_ptr,
    R,
    C,
    LUT_LO: tl.constexpr,
    LUT_HI: tl.constexpr,
    GIVEN_MASK: tl.constexpr,
    WRITE_T: tl.constexpr,
    BLOCK: tl.constexpr,
    PRELOAD: tl.constexpr,
    PACK: tl.constexpr,
    DENSE_OUT: tl.constexpr,
):
    # (few runtime arguments on purpose: Triton's launcher spends host time on each one, every step)
    u = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    _prune_pack_units(
        u, w_ptr, m_ptr, vf_ptr, vd_ptr, bits_ptr, wp_ptr, R, C, LUT_LO, LUT_HI, GIVEN_MASK,
        WRITE_T, PRELOAD, PACK, DENSE_OUT,
    )  # fmt: skip


@triton.jit
def _prune_pack_units(u, w_ptr, m_ptr, vf_ptr, vd_ptr, bits_ptr, wp_ptr, R, C, LUT_LO: tl.constexpr,
                      LUT_HI: tl.constexpr, GIVEN_MASK: tl.constexpr, WRITE_T: tl.constexpr,
                      PRELOAD: tl.constexpr, PACK: tl.constexpr, DENSE_OUT: tl.constexpr):  # fmt: skip
    # the units u (one thread each) of the weight at w_ptr: the body of both launches
    # compressed buffer = values (R * C bytes), then metadata; k-tiles of 32 columns of each operand
    mf_ptr = vf_ptr + R * C
    md_ptr = vd_ptr + R * C
    NKT_F = (C + 31) // 32
    NKT_D = (R + 31) // 32
    n_units = (R // 8) * (C // 8)
    # one thread = one unit of four tiles {tr, tr+2} x {tc, tc+2} with tr % 4, tc % 4 in {0, 1}: the
    # tiles whose metadata nibbles share bytes (rows r and r+8 of either operand)
    ok = u < n_units
    upr = C // 8  # units per row of units
    ur = u // upr
    uc = u % upr
    tr = 4 * (ur // 2) + ur % 2
    tc = 4 * (uc // 2) + uc % 2
    if PRELOAD:
        # all 16 loads first (stores in between keep the compiler from hoisting loads: pointers may
        # alias)
        p0, p1, p2, p3 = _load_tile(w_ptr, tr, tc, ok, C)
        q0, q1, q2, q3 = _load_tile(w_ptr, tr + 2, tc, ok, C)
        s0, s1, s2, s3 = _load_tile(w_ptr, tr, tc + 2, ok, C)
        t0, t1, t2, t3 = _load_tile(w_ptr, tr + 2, tc + 2, ok, C)
    else:
        p0, p1, p2, p3 = _load_tile(w_ptr, tr, tc, ok, C)
    a0, a1, a2, a3, b0, b1, b2, b3 = _tile(
        p0,
        p1,
        p2,
        p3,
        m_ptr,
        vf_ptr,
        vd_ptr,
        bits_ptr,
        wp_ptr,
        tr,
        tc,
        ok,
        C,
        LUT_LO,
        LUT_HI,
        GIVEN_MASK,
        WRITE_T,
        PACK,
        DENSE_OUT,
    )
    if not PRELOAD:
        q0, q1, q2, q3 = _load_tile(w_ptr, tr + 2, tc, ok, C)
    c0, c1, c2, c3, d0, d1, d2, d3 = _tile(
        q0,
        q1,
        q2,
        q3,
        m_ptr,
        vf_ptr,
        vd_ptr,
        bits_ptr,
        wp_ptr,
        tr + 2,
        tc,
        ok,
        C,
        LUT_LO,
        LUT_HI,
        GIVEN_MASK,
        WRITE_T,
        PACK,
        DENSE_OUT,
    )
    if not PRELOAD:
        s0, s1, s2, s3 = _load_tile(w_ptr, tr, tc + 2, ok, C)
    e0, e1, e2, e3, f0, f1, f2, f3 = _tile(
        s0,
        s1,
        s2,
        s3,
        m_ptr,
        vf_ptr,
        vd_ptr,
        bits_ptr,
        wp_ptr,
        tr,
        tc + 2,
        ok,
        C,
        LUT_LO,
        LUT_HI,
        GIVEN_MASK,
        WRITE_T,
        PACK,
        DENSE_OUT,
    )
    if not PRELOAD:
        t0, t1, t2, t3 = _load_tile(w_ptr, tr + 2, tc + 2, ok, C)
    g0, g1, g2, g3, h0, h1, h2, h3 = _tile(
        t0,
        t1,
        t2,
        t3,
        m_ptr,
        vf_ptr,
        vd_ptr,
        bits_ptr,
        wp_ptr,
        tr + 2,
        tc + 2,
        ok,
        C,
        LUT_LO,
        LUT_HI,
        GIVEN_MASK,
        WRITE_T,
        PACK,
        DENSE_OUT,
    )
    if PACK:
        # forward operand: rows 4tr + r (low nibble, tile tr) and 4tr + 8 + r (high nibble, tile tr + 2)
        r0 = 4 * tr
        tl.store(mf_ptr + _meta_addr(r0 + 0, tc, NKT_F), (a0 | (c0 << 4)).to(tl.uint8), mask=ok)
        tl.store(mf_ptr + _meta_addr(r0 + 1, tc, NKT_F), (a1 | (c1 << 4)).to(tl.uint8), mask=ok)
        tl.store(mf_ptr + _meta_addr(r0 + 2, tc, NKT_F), (a2 | (c2 << 4)).to(tl.uint8), mask=ok)
        tl.store(mf_ptr + _meta_addr(r0 + 3, tc, NKT_F), (a3 | (c3 << 4)).to(tl.uint8), mask=ok)
        tl.store(mf_ptr + _meta_addr(r0 + 0, tc + 2, NKT_F), (e0 | (g0 << 4)).to(tl.uint8), mask=ok)
        tl.store(mf_ptr + _meta_addr(r0 + 1, tc + 2, NKT_F), (e1 | (g1 << 4)).to(tl.uint8), mask=ok)
        tl.store(mf_ptr + _meta_addr(r0 + 2, tc + 2, NKT_F), (e2 | (g2 << 4)).to(tl.uint8), mask=ok)
        tl.store(mf_ptr + _meta_addr(r0 + 3, tc + 2, NKT_F), (e3 | (g3 << 4)).to(tl.uint8), mask=ok)
        if WRITE_T:
            # input-gradient operand A = W^T: its rows are W's columns 4tc + c (tile tc) and 4tc + 8 + c
            # (tile tc + 2)
            c0_ = 4 * tc
            tl.store(
                md_ptr + _meta_addr(c0_ + 0, tr, NKT_D), (b0 | (f0 << 4)).to(tl.uint8), mask=ok
            )
            tl.store(
                md_ptr + _meta_addr(c0_ + 1, tr, NKT_D), (b1 | (f1 << 4)).to(tl.uint8), mask=ok
            )
            tl.store(
                md_ptr + _meta_addr(c0_ + 2, tr, NKT_D), (b2 | (f2 << 4)).to(tl.uint8), mask=ok
            )
            tl.store(
                md_ptr + _meta_addr(c0_ + 3, tr, NKT_D), (b3 | (f3 << 4)).to(tl.uint8), mask=ok
            )
            tl.store(
                md_ptr + _meta_addr(c0_ + 0, tr + 2, NKT_D), (d0 | (h0 << 4)).to(tl.uint8), mask=ok
            )
            tl.store(
                md_ptr + _meta_addr(c0_ + 1, tr + 2, NKT_D), (d1 | (h1 << 4)).to(tl.uint8), mask=ok
            )
            tl.store(
                md_ptr + _meta_addr(c0_ + 2, tr + 2, NKT_D), (d2 | (h2 << 4)).to(tl.uint8), mask=ok
            )
            tl.store(
                md_ptr + _meta_addr(c0_ + 3, tr + 2, NKT_D), (d3 | (h3 << 4)).to(tl.uint8), mask=ok
            )


class Packed(NamedTuple):
    fwd: torch.Tensor  # uint8, compressed W for the forward GEMM (A = W, row)
    dgrad: (
        torch.Tensor | None
    )  # uint8, compressed W^T for the input-gradient GEMM (A = W^T, col), or None
    tile_bits: torch.Tensor  # int16 (out/4, in/4): kept mask of each 4x4 tile, bit 4*row + col


# launch configuration (block of units per program, warps, preload all 16 words per thread first);
# measured on the H100 by scripts/bench_sparse.py --ops pack_variants (results/bench/NOTES.md)
CONFIG = {"block": 256, "num_warps": 8, "preload": False}


def _block() -> int:
    return 1024 if interpreting() else CONFIG["block"]


def prune_pack(
    w: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    write_t: bool = True,
    out: Packed | None = None,
) -> Packed:
    """Prune `w` (out, in) with tile_greedy (or keep `mask`, bool/uint8 (out, in), if given) and
    pack it.

    `w`'s entries outside the mask are treated as zero, so `w` may be the raw weight or its pruned
    values (e.g. an S-STE soft-thresholded weight with its mask). `write_t=False` packs only the
    forward operand (for masks that are not transposable). out/in must be multiples of 16
    (cuSPARSELt). Non-contiguous inputs are copied.
    """
    if w.dim() != 2 or w.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"prune_pack needs a 2-D fp16/bf16 weight, got {tuple(w.shape)} {w.dtype}")
    R, C = w.shape
    L.check_shape(R, C)
    check_launchable(w)
    if not w.is_contiguous() or w.data_ptr() % 16:
        w = w.contiguous() if not w.is_contiguous() else w.clone()
    if mask is not None:
        if mask.shape != w.shape:
            raise ValueError(f"mask shape {tuple(mask.shape)} != weight shape {tuple(w.shape)}")
        if mask.dtype == torch.bool:
            mask = mask.view(torch.uint8)
        mask = mask.contiguous()
    fwd, dgrad, bits = _empty_packed(R, C, write_t, w.device) if out is None else out
    block = _block()
    _prune_pack_kernel[(triton.cdiv((R // 8) * (C // 8), block),)](
        w,
        mask if mask is not None else w,
        fwd,
        dgrad if write_t else fwd,
        bits,
        w,
        R,
        C,
        LUT_LO=LUT_LO,
        LUT_HI=LUT_HI,
        GIVEN_MASK=mask is not None,
        WRITE_T=write_t,
        BLOCK=block,
        PRELOAD=CONFIG["preload"],
        PACK=True,
        DENSE_OUT=False,
        num_warps=CONFIG["num_warps"],
    )
    return Packed(fwd, dgrad, bits)


def _empty_packed(R: int, C: int, write_t: bool, device) -> Packed:
    size = L.compressed_size(R, C)  # same for both orientations
    return Packed(
        torch.empty(size, dtype=torch.uint8, device=device),
        torch.empty(size, dtype=torch.uint8, device=device) if write_t else None,
        torch.empty(R // 4, C // 4, dtype=torch.int16, device=device),
    )


def prune_dense(w: torch.Tensor):
    """tile_greedy pruning with the same kernel, dense output: (pruned W (zeros where pruned), tile
    bits int16).

    The cheap pruning for the dense fallback of the `auto` backend (one read, one write of W)."""
    if w.dim() != 2 or w.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"prune_dense needs a 2-D fp16/bf16 weight, got {tuple(w.shape)} {w.dtype}")
    R, C = w.shape
    L.check_shape(R, C)
    check_launchable(w)
    if not w.is_contiguous() or w.data_ptr() % 16:
        w = w.contiguous() if not w.is_contiguous() else w.clone()
    wp = torch.empty_like(w)
    bits = torch.empty(R // 4, C // 4, dtype=torch.int16, device=w.device)
    block = _block()
    _prune_pack_kernel[(triton.cdiv((R // 8) * (C // 8), block),)](
        w,
        w,
        wp,
        wp,
        bits,
        wp,
        R,
        C,
        LUT_LO=LUT_LO,
        LUT_HI=LUT_HI,
        GIVEN_MASK=False,
        WRITE_T=False,
        BLOCK=block,
        PRELOAD=CONFIG["preload"],
        PACK=False,
        DENSE_OUT=True,
        num_warps=CONFIG["num_warps"],
    )
    return wp, bits


def tile_bits_to_mask(bits: torch.Tensor) -> torch.Tensor:
    """int16 (R/4, C/4) tile masks -> bool (R, C)."""
    p = torch.arange(16, device=bits.device, dtype=torch.int32)
    b = (bits.to(torch.int32)[..., None] >> p) & 1  # (R/4, C/4, 16)
    r4, c4 = bits.shape
    return b.reshape(r4, c4, 4, 4).permute(0, 2, 1, 3).reshape(r4 * 4, c4 * 4).bool()
