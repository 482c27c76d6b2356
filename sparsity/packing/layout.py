"""Pure-torch reference of cuSPARSELt's compressed 2:4 layout for 16-bit types (fp16, bf16).

Reverse-engineered on an H100 (sm90) with cuSPARSELt 0.8.0 by compressing known inputs with the
library's own compressor (`scripts/experiments/probes/probe_layout.py`, analysis in
results/bench/NOTES.md); the library says this layout is internal and "can change at any time", so
the backend re-checks it at start-up on every (arch, version) pair it has not been validated on
(`sparsity/backends/cusparselt/packing.py`).

Vocabulary. The structured operand A is a logical (m x k) matrix, 2:4 along k, with m % 16 == 0 and
k % 16 == 0 (the library refuses other shapes). It lies in memory either row-major ("row": W in the
forward GEMM, A = W) or column-major ("col": the input-gradient GEMM, A = W^T read from W's own
memory). Groups are A[r, 4g : 4g + 4].

Compressed buffer = values, then metadata:

* values: per group two 16-bit values, the group's entries at its two metadata indices (i0 < i1), in
  that order. They form an (m x k/2) matrix stored row-major for "row" and column-major for "col";
  m*k bytes in all.
* metadata: per group a nibble i0 | i1 << 2. Which two indices: the nonzero entries (x != 0, so -0.0
  counts as zero), filled up with the highest unused indices when fewer than two are nonzero (e.g.
  {1} -> (1, 3), {3} -> (2, 3), {} -> (2, 3)). Padding slots hold the dense entry at that index (a
  zero). Nibble q (low nibble of byte q // 2 first) holds group (r, g) with
      tiles of 64 rows x 8 groups (32 columns), 256 bytes each, ordered k-tile fastest then 64-row band;
      inside a tile, 4 chunks of 16 rows; inside a chunk q_in = 16 * (r % 8) + 2 * j + (r % 16) // 8
      with j = 2 * (g % 4) + (g % 8) // 4   (groups 0,4,1,5,2,6,3,7 of the tile, rows r and r+8 interleaved).
  This is the same in logical (r, g) coordinates for both orientations.
* size: m*k + max(ceil64(m) * ceil32(k), ceil32(m) * ceil64(k)) / 8 bytes (the library's size; bytes
  beyond the tiles the shape uses are never read and are left uninitialised by the library; we write
  zeros).
"""

from __future__ import annotations

from functools import lru_cache

import torch

ORIENTS = ("row", "col")
TILE_ROWS, TILE_GROUPS, TILE_BYTES = 64, 8, 256


def _ceil(a: int, b: int) -> int:
    return -(-a // b) * b


def check_shape(m: int, k: int) -> None:
    if m % 16 or k % 16 or m <= 0 or k <= 0:
        raise ValueError(
            f"cuSPARSELt's 2:4 layout needs both dims of the structured operand to be positive "
            f"multiples "
            f"of 16, got ({m}, {k})"
        )


def values_bytes(m: int, k: int) -> int:
    return m * k  # m * k/2 elements of 2 bytes


def meta_bytes(m: int, k: int) -> int:
    return max(_ceil(m, 64) * _ceil(k, 32), _ceil(m, 32) * _ceil(k, 64)) // 8


@lru_cache(maxsize=256)
def compressed_size(m: int, k: int) -> int:
    check_shape(m, k)
    return values_bytes(m, k) + meta_bytes(m, k)


def used_meta_bytes(m: int, k: int) -> int:
    """Bytes of the metadata region that the tiles of this shape occupy (the rest is never read)."""
    return (
        (_ceil(m, TILE_ROWS) // TILE_ROWS)
        * (_ceil(k // 4, TILE_GROUPS) // TILE_GROUPS)
        * TILE_BYTES
    )


@lru_cache(maxsize=64)
def _nibble_index_cpu(m: int, k: int) -> torch.Tensor:
    g_count = k // 4
    r = torch.arange(m).view(m, 1)
    g = torch.arange(g_count).view(1, g_count)
    n_ktiles = _ceil(g_count, TILE_GROUPS) // TILE_GROUPS
    band, tk = r // TILE_ROWS, g // TILE_GROUPS
    chunk = (r % TILE_ROWS) // 16
    gg = g % TILE_GROUPS
    j = 2 * (gg % 4) + gg // 4
    q_in = 16 * (r % 8) + 2 * j + (r % 16) // 8
    return (((band * n_ktiles + tk) * 4 + chunk) * 128 + q_in).contiguous()


def nibble_index(m: int, k: int, device=None) -> torch.Tensor:
    """(m, k/4) int64: the metadata nibble index q of every group (r, g)."""
    check_shape(m, k)
    return _nibble_index_cpu(m, k).to(device if device is not None else "cpu")


def valid_byte_mask(m: int, k: int, device=None) -> torch.Tensor:
    """Bool per byte of the compressed buffer: True where the library defines the content (values
    and used meta)."""
    size = compressed_size(m, k)
    valid = torch.zeros(size, dtype=torch.bool, device=device)
    valid[: values_bytes(m, k)] = True
    q = nibble_index(m, k, device).reshape(-1)
    valid[values_bytes(m, k) + q // 2] = True
    return valid


def select_pairs(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group of 4 along the last dim: the two metadata indices (i0 < i1), int64, shape (...,
    k/4)."""
    nz = (a.reshape(*a.shape[:-1], -1, 4) != 0).to(torch.int64)
    # priority: nonzeros first (in index order), then zeros from the highest index down
    idx = torch.arange(4, device=a.device)
    key = torch.where(nz.bool(), idx, 4 + (3 - idx))  # smaller key = chosen earlier
    order = torch.argsort(key, dim=-1)
    two = order[..., :2]
    return two.min(dim=-1).values, two.max(dim=-1).values


def pack_reference(a: torch.Tensor, orient: str) -> torch.Tensor:
    """Compress the logical (m, k) 2:4 matrix `a` (fp16/bf16, at most 2 nonzeros per group) as the
    library does.

    Returns the uint8 buffer of `compressed_size(m, k)` bytes (unused padding bytes zero).
    """
    if orient not in ORIENTS:
        raise ValueError(orient)
    if a.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"16-bit types only, got {a.dtype}")
    m, k = a.shape
    check_shape(m, k)
    i0, i1 = select_pairs(a)
    groups = a.reshape(m, k // 4, 4)
    v0 = groups.gather(-1, i0.unsqueeze(-1)).squeeze(-1)
    v1 = groups.gather(-1, i1.unsqueeze(-1)).squeeze(-1)
    vals = torch.stack([v0, v1], dim=-1).reshape(m, k // 2)
    if orient == "col":
        vals = vals.t()
    out = torch.zeros(compressed_size(m, k), dtype=torch.uint8, device=a.device)
    out[: values_bytes(m, k)] = vals.contiguous().view(torch.uint8).reshape(-1)
    code = (i0 | (i1 << 2)).reshape(-1)
    q = nibble_index(m, k, a.device).reshape(-1)
    nib = torch.zeros(meta_bytes(m, k) * 2, dtype=torch.int64, device=a.device)
    nib[q] = code
    nib = nib.reshape(-1, 2)
    out[values_bytes(m, k) :] = (nib[:, 0] | (nib[:, 1] << 4)).to(torch.uint8)
    return out


def unpack_reference(
    buf: torch.Tensor, m: int, k: int, orient: str, dtype: torch.dtype
) -> torch.Tensor:
    """Inverse of `pack_reference`: the dense logical (m, k) matrix (zeros where pruned)."""
    check_shape(m, k)
    vb = values_bytes(m, k)
    vals = buf[:vb].view(dtype)
    vals = vals.reshape(m, k // 2) if orient == "row" else vals.reshape(k // 2, m).t()
    q = nibble_index(m, k, buf.device).reshape(-1)
    meta = buf[vb:].to(torch.int64)
    nib = torch.stack([meta & 15, meta >> 4], dim=-1).reshape(-1)[q].reshape(m, k // 4)
    i0, i1 = nib & 3, nib >> 2
    out = torch.zeros(m, k // 4, 4, dtype=dtype, device=buf.device)
    v = vals.reshape(m, k // 4, 2)
    # i1 last so that a (2,3) pad pair with a kept 3 keeps its value
    out.scatter_(-1, i0.unsqueeze(-1), v[..., 0:1])
    out.scatter_(-1, i1.unsqueeze(-1), v[..., 1:2])
    return out.reshape(m, k)


def logical_operand(w: torch.Tensor, kind: str) -> tuple[torch.Tensor, str]:
    """The structured operand of a linear layer's GEMM for weight w (out, in): (logical A,
    orientation).

    kind "fwd": A = W (out x in), row-major.  kind "dgrad": A = W^T (in x out), column-major (W's
    own memory).
    """
    if kind == "fwd":
        return w, "row"
    if kind == "dgrad":
        return w.t(), "col"
    raise ValueError(kind)


def pack_weight_reference(w_pruned: torch.Tensor, kind: str) -> torch.Tensor:
    a, orient = logical_operand(w_pruned, kind)
    return pack_reference(a, orient)
