"""`prune_pack` of several weights of one shape in one launch (`prune_pack_group`): the fused
kernel's body (`pack_cusparselt._prune_pack_units`) with a second grid axis that picks the weight,
whose tensors' addresses come from int64 tables. One weight's launch has too few programs to keep a
large GPU busy through its ramp and drain; a model's layers together have enough."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from sparsity.kernels._util import check_launchable
from sparsity.kernels.pack_cusparselt import (
    CONFIG,
    LUT_HI,
    LUT_LO,
    Packed,
    _block,
    _empty_packed,
    _prune_pack_units,
)
from sparsity.packing import layout as L


@triton.jit
def _prune_pack_group_kernel(
    w_table,
    vf_table,
    vd_table,
    bits_table,
    R,
    C,
    LUT_LO: tl.constexpr,
    LUT_HI: tl.constexpr,
    WRITE_T: tl.constexpr,
    BLOCK: tl.constexpr,
    PRELOAD: tl.constexpr,
):
    # one weight per program row (axis 1): its tensors' addresses from the int64 tables
    layer = tl.program_id(1)
    w_ptr = tl.load(w_table + layer).to(tl.pointer_type(tl.int16))
    vf_ptr = tl.load(vf_table + layer).to(tl.pointer_type(tl.uint8))
    vd_ptr = tl.load(vd_table + layer).to(tl.pointer_type(tl.uint8))
    bits_ptr = tl.load(bits_table + layer).to(tl.pointer_type(tl.int16))
    u = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    _prune_pack_units(
        u, w_ptr, w_ptr, vf_ptr, vd_ptr, bits_ptr, w_ptr, R, C, LUT_LO, LUT_HI, False, WRITE_T,
        PRELOAD, True, False,
    )  # fmt: skip


def prune_pack_group(
    weights: list[torch.Tensor], *, write_t: bool = True, out: list[Packed] | None = None
) -> list[Packed]:
    """`prune_pack` of several weights of one shape and dtype in one launch: each weight's outputs
    are what `prune_pack(w, write_t=write_t)` writes for it, bit for bit (tile_greedy pruning; a
    given mask is not supported). One weight's launch has too few programs to fill a large GPU; the
    weights of a model's layers together do. The weights must be contiguous and 16-byte aligned, as
    parameters are; `out` (one `Packed` a weight, e.g. from an earlier call) is written in place."""
    if not weights:
        raise ValueError("prune_pack_group needs at least one weight")
    w0 = weights[0]
    if w0.dim() != 2 or w0.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(
            f"prune_pack_group needs 2-D fp16/bf16 weights, got {tuple(w0.shape)} {w0.dtype}"
        )
    for i, w in enumerate(weights):
        if (w.shape, w.dtype, w.device) != (w0.shape, w0.dtype, w0.device):
            raise ValueError(
                f"weight {i} is {tuple(w.shape)} {w.dtype} on {w.device}; weight 0 is "
                f"{tuple(w0.shape)} {w0.dtype} on {w0.device}: one launch packs one shape"
            )
        if not w.is_contiguous() or w.data_ptr() % 16:
            raise ValueError(f"weight {i} is not contiguous and 16-byte aligned")
    R, C = w0.shape
    L.check_shape(R, C)
    check_launchable(*weights)
    if out is None:
        out = [_empty_packed(R, C, write_t, w0.device) for _ in weights]
    elif len(out) != len(weights):
        raise ValueError(f"{len(out)} outputs for {len(weights)} weights")
    tables = [
        _address_table(tuple(t.data_ptr() for t in ts), w0.device)
        for ts in (
            weights,
            [o.fwd for o in out],
            [o.dgrad if write_t else o.fwd for o in out],
            [o.tile_bits for o in out],
        )
    ]
    block = _block()
    _prune_pack_group_kernel[(triton.cdiv((R // 8) * (C // 8), block), len(weights))](
        *tables,
        R,
        C,
        LUT_LO=LUT_LO,
        LUT_HI=LUT_HI,
        WRITE_T=write_t,
        BLOCK=block,
        PRELOAD=CONFIG["preload"],
        num_warps=CONFIG["num_warps"],
    )
    return out


@functools.lru_cache(maxsize=64)
def _address_table(addresses: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The addresses as an int64 tensor on `device`, made once per set of addresses: a step replayed
    as a CUDA graph cannot copy a new table from the host, and a table is right for any tensors at
    those addresses."""
    return torch.tensor(addresses, dtype=torch.int64, device=device)
