"""Fused 2:4 prune + pack for cuSPARSELt (Triton): one pass over W writes both GEMM operands in the library's layout.

Reads W (out x in, fp16/bf16, any strides) once and, per aligned 4x4 tile,
  * selects the transposable mask: torch core's largest_abs_values_greedy walk, bit-identical to
    `sparsity.pruning.reference.tile_greedy_mask` (or takes a given mask, for the other pruning methods);
  * writes the compressed forward operand (A = W, row-major, 2:4 along `in`) and, if asked, the compressed
    input-gradient operand (A = W^T, W's memory read column-major, 2:4 along `out`), values and metadata, in the
    byte layout of `sparsity.packing.layout` (= what `cusparseLtSpMMACompress2` writes on sm90, cuSPARSELt 0.8.0);
  * writes the 16-bit kept mask of each tile (bit 4*row + col), from which `mask()` / `to_dense()` are rebuilt.

This replaces prune + two `sp_mma_compress` calls (about 0.15-0.23 ms per layer on an H100) by one memory-bound
kernel: 2 bytes read and 2 x (1 + 1/8) bytes written per weight element (+1/8 for the tile masks).

Greedy walk per tile: keys (|w| bits << 4) | (15 - p) are unique and order entries by |w| descending, ties to the
lower row-major index p (|w| of fp16/bf16 compared as its 15 magnitude bits = the reference's fp32 comparison);
16 unrolled steps take the largest remaining key and keep it iff its row and its column hold < 2 kept.

Metadata bytes pair rows r and r+8 of the structured operand, so a program covers whole 16-row/16-column groups
(TR, TC tiles, multiples of 4) and assembles each byte from two nibbles before storing it.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from sparsity.kernels._util import check_launchable, interpreting
from sparsity.packing import layout as L


def _code_lut() -> int:
    """64-bit table: nibble code (i0 | i1 << 2) of the metadata pair for each 4-bit nonzero mask of a group."""
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


@triton.jit
def _prune_pack_kernel(
    w_ptr, m_ptr, vf_ptr, mf_ptr, vd_ptr, md_ptr, bits_ptr,
    R, C, stride_r, stride_c, stride_mr, stride_mc, NKT_F, NKT_D,
    LUT: tl.constexpr, GIVEN_MASK: tl.constexpr, WRITE_T: tl.constexpr, WRITE_BITS: tl.constexpr,
    TR: tl.constexpr, TC: tl.constexpr,
):
    T: tl.constexpr = TR * TC
    tr0 = tl.program_id(0) * TR
    tc0 = tl.program_id(1) * TC
    t = tl.arange(0, T)
    p = tl.arange(0, 16)
    tr = tr0 + t // TC
    tc = tc0 + t % TC
    n_tr = R // 4
    n_tc = C // 4
    valid_t = (tr < n_tr) & (tc < n_tc)
    prow = p // 4
    pcol = p % 4
    row = tr[:, None] * 4 + prow[None, :]
    col = tc[:, None] * 4 + pcol[None, :]
    m2 = valid_t[:, None]
    w = tl.load(w_ptr + row * stride_r + col * stride_c, mask=m2, other=0.0)
    wbits = w.to(tl.int16, bitcast=True).to(tl.int32) & 0x7FFF  # magnitude bits
    if GIVEN_MASK:
        km = tl.load(m_ptr + row * stride_mr + col * stride_mc, mask=m2, other=0)
        kbits = tl.sum((km != 0).to(tl.int32) << p[None, :], axis=1)
    else:
        rem = (wbits << 4) | (15 - p[None, :])
        kbits = tl.sum(rem * 0, axis=1)  # (T,) int32 zeros
        for _s in tl.static_range(16):
            mx = tl.max(rem, axis=1)
            pos = 15 - (mx & 15)
            rem = tl.where(p[None, :] == pos[:, None], -1, rem)
            rb = (kbits >> ((pos >> 2) * 4)) & 15  # kept bits of its row
            cb = kbits & (4369 << (pos & 3))  # kept bits of its column (0x1111 << col)
            ok = ((rb & (rb - 1)) == 0) & ((cb & (cb - 1)) == 0)  # fewer than 2 kept in both
            kbits = kbits | (ok.to(tl.int32) << pos)
    keep = ((kbits[:, None] >> p[None, :]) & 1) != 0
    wz = tl.where(keep, w, 0.0)  # the pruned dense matrix the library would be given
    # the library's metadata pairs are chosen from the nonzero entries (-0.0 counts as zero)
    nz = tl.sum((keep & (wbits != 0)).to(tl.int32) << p[None, :], axis=1)  # (T,)
    if WRITE_BITS:
        tl.store(bits_ptr + tr * n_tc + tc, kbits.to(tl.int16), mask=valid_t)

    # ---- forward operand: A = W (R x C), groups along C: one group per (tile, tile row)
    q4 = tl.arange(0, 4)
    row_nib = (nz[:, None] >> (4 * q4[None, :])) & 15  # (T, 4) nonzero mask of each tile row
    row_code = ((LUT >> (row_nib.to(tl.int64) * 4)) & 15).to(tl.int32)  # (T, 4) i0 | i1 << 2
    cf = tl.sum(row_code << (4 * q4[None, :]), axis=1)  # (T,) the 4 codes packed
    cr = (cf[:, None] >> (4 * prow[None, :])) & 15  # (T, 16) code of each entry's row
    in_f = (pcol[None, :] == (cr & 3)) | (pcol[None, :] == (cr >> 2))
    slot_f = (pcol[None, :] == (cr >> 2)).to(tl.int32)
    tl.store(vf_ptr + row * (C // 2) + tc[:, None] * 2 + slot_f, wz, mask=m2 & in_f)
    # metadata bytes: rows r (low nibble) and r + 8 (high nibble) = tile rows 4a+b and 4a+2+b of this program
    x = tl.reshape(row_code, (TR // 4, 2, 2, TC, 4))
    hsh = 4 * tl.arange(0, 2)[None, :, None, None, None]
    byte_f = tl.sum(x << hsh, axis=1)  # (TR//4, 2, TC, 4)
    a_i = tl.arange(0, TR // 4)[:, None, None, None]
    b_i = tl.arange(0, 2)[None, :, None, None]
    tcl_i = tl.arange(0, TC)[None, None, :, None]
    rit_i = tl.arange(0, 4)[None, None, None, :]
    trg = tr0 + 4 * a_i + b_i
    r = 4 * trg + rit_i
    g = tc0 + tcl_i
    addr_f = (((r // 64) * NKT_F + g // 8) * 4 + (r % 64) // 16) * 64 + 8 * (r % 8) + 2 * (g % 4) + (g % 8) // 4
    tl.store(mf_ptr + addr_f, byte_f.to(tl.uint8), mask=(trg < n_tr) & (g < n_tc))

    if WRITE_T:
        # ---- input-gradient operand: A = W^T (C x R), groups along R: one group per (tile, tile column)
        col_nib = ((nz[:, None] >> q4[None, :]) & 1) | (((nz[:, None] >> (q4[None, :] + 4)) & 1) << 1) \
            | (((nz[:, None] >> (q4[None, :] + 8)) & 1) << 2) | (((nz[:, None] >> (q4[None, :] + 12)) & 1) << 3)
        col_code = ((LUT >> (col_nib.to(tl.int64) * 4)) & 15).to(tl.int32)  # (T, 4)
        cd = tl.sum(col_code << (4 * q4[None, :]), axis=1)
        cc = (cd[:, None] >> (4 * pcol[None, :])) & 15  # (T, 16) code of each entry's column
        in_d = (prow[None, :] == (cc & 3)) | (prow[None, :] == (cc >> 2))
        slot_d = (prow[None, :] == (cc >> 2)).to(tl.int32)
        # values of A (C x R/2) column-major = an (R/2 x C) row-major matrix
        tl.store(vd_ptr + (tr[:, None] * 2 + slot_d) * C + col, wz, mask=m2 & in_d)
        y = tl.reshape(col_code, (TR, TC // 4, 2, 2, 4))
        hsh2 = 4 * tl.arange(0, 2)[None, None, :, None, None]
        byte_d = tl.sum(y << hsh2, axis=2)  # (TR, TC//4, 2, 4)
        trl_i = tl.arange(0, TR)[:, None, None, None]
        a2_i = tl.arange(0, TC // 4)[None, :, None, None]
        b2_i = tl.arange(0, 2)[None, None, :, None]
        cit_i = tl.arange(0, 4)[None, None, None, :]
        tcg = tc0 + 4 * a2_i + b2_i
        c = 4 * tcg + cit_i  # row of A
        gr = tr0 + trl_i  # group of A
        addr_d = (((c // 64) * NKT_D + gr // 8) * 4 + (c % 64) // 16) * 64 + 8 * (c % 8) + 2 * (gr % 4) + (gr % 8) // 4
        tl.store(md_ptr + addr_d, byte_d.to(tl.uint8), mask=(tcg < n_tc) & (gr < n_tr))


class Packed(NamedTuple):
    fwd: torch.Tensor  # uint8, compressed W for the forward GEMM (A = W, row)
    dgrad: Optional[torch.Tensor]  # uint8, compressed W^T for the input-gradient GEMM (A = W^T, col), or None
    tile_bits: torch.Tensor  # int16 (out/4, in/4): kept mask of each 4x4 tile, bit 4*row + col


def _blocks():
    return (16, 16) if not interpreting() else (16, 16)


def prune_pack(
    w: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    *,
    write_t: bool = True,
    out: Optional[Packed] = None,
) -> Packed:
    """Prune `w` (out, in) with tile_greedy (or keep `mask`, bool/uint8 (out, in), if given) and pack it.

    `w`'s entries outside the mask are treated as zero, so `w` may be the raw weight or its pruned values (e.g. an
    S-STE soft-thresholded weight with its mask). `write_t=False` packs only the forward operand (for masks that
    are not transposable). out/in must be multiples of 16 (cuSPARSELt).
    """
    if w.dim() != 2 or w.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"prune_pack needs a 2-D fp16/bf16 weight, got {tuple(w.shape)} {w.dtype}")
    R, C = w.shape
    L.check_shape(R, C)
    check_launchable(w)
    if mask is not None:
        if mask.shape != w.shape:
            raise ValueError(f"mask shape {tuple(mask.shape)} != weight shape {tuple(w.shape)}")
        if mask.dtype == torch.bool:
            mask = mask.view(torch.uint8)
    size = L.compressed_size(R, C)  # same for both orientations
    if out is None:
        fwd = torch.empty(size, dtype=torch.uint8, device=w.device)
        dgrad = torch.empty(size, dtype=torch.uint8, device=w.device) if write_t else None
        bits = torch.empty(R // 4, C // 4, dtype=torch.int16, device=w.device)
    else:
        fwd, dgrad, bits = out
    vb = L.values_bytes(R, C)
    vf, mf = fwd[:vb].view(w.dtype), fwd[vb:]
    if write_t:
        vd, md = dgrad[:vb].view(w.dtype), dgrad[vb:]
    else:
        vd, md = vf, mf  # unused
    TR, TC = _blocks()
    grid = (triton.cdiv(R // 4, TR), triton.cdiv(C // 4, TC))
    m_arg = mask if mask is not None else w
    _prune_pack_kernel[grid](
        w, m_arg, vf, mf, vd, md, bits,
        R, C, w.stride(0), w.stride(1), m_arg.stride(0), m_arg.stride(1),
        -(-C // 32), -(-R // 32),
        LUT=CODE_LUT, GIVEN_MASK=mask is not None, WRITE_T=write_t, WRITE_BITS=True,
        TR=TR, TC=TC, num_warps=8,
    )
    return Packed(fwd, dgrad, bits)


def tile_bits_to_mask(bits: torch.Tensor) -> torch.Tensor:
    """int16 (R/4, C/4) tile masks -> bool (R, C)."""
    p = torch.arange(16, device=bits.device, dtype=torch.int32)
    b = (bits.to(torch.int32)[..., None] >> p) & 1  # (R/4, C/4, 16)
    r4, c4 = bits.shape
    return b.reshape(r4, c4, 4, 4).permute(0, 2, 1, 3).reshape(r4 * 4, c4 * 4).bool()
