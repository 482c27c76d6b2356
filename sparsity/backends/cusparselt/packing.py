"""How W is compressed for cuSPARSELt in this process: the fused Triton packer or the library's
compressor.

cuSPARSELt's compressed layout is internal to the library. It was reverse-engineered
(`sparsity.packing.layout`) and validated bit for bit on the (arch, version) pairs in
`VALIDATED_LAYOUTS`; on any other pair the first call compresses one probe matrix both ways (our
kernel vs `cusparseLtSpMMACompress2`) and, if the bytes differ, falls back to the library compressor
(prune with the Triton kernel, then two library compress calls: slower, same results) with a
warning. `pack` (`BackendSettings.cslt_pack`, valid values `CSLT_PACK_MODES`) "triton" or "library"
forces either path; "auto" decides as above.
"""

from __future__ import annotations

import logging
import threading

import torch

from sparsity.packing import layout as L

from ..settings import CSLT_PACK_MODES
from .compressor import OperandLayout, compressor
from .library import arch_of, version

log = logging.getLogger(__name__)

# (arch, cuSPARSELt version) pairs on which `sparsity.packing.layout` was checked byte for byte
# against the library's compressor (tests/gpu/test_cusparselt.py::test_fused_pack_equals_library,
# results/bench/NOTES.md)
VALIDATED_LAYOUTS = {("sm90", 800)}

_layout_lock = threading.Lock()
_layout_status: dict = {}  # (device index, dtype, pack mode) -> status


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def probe_layout(device: torch.device, dtype: torch.dtype) -> bool:
    """Compress one probe matrix with our kernel and with cuSPARSELt's compressor; True if the bytes
    agree."""
    # Triton (an optional dependency on CPU) is imported by the kernel modules, on first use
    from sparsity.kernels.pack_cusparselt import prune_pack, tile_bits_to_mask

    dev_index = _device_index(device)
    g = torch.Generator(device=device).manual_seed(7)
    out_f, in_f = 256, 512
    w = torch.randn(out_f, in_f, device=device, dtype=torch.float32, generator=g).to(dtype)
    pk = prune_pack(w)
    mask = tile_bits_to_mask(pk.tile_bits)[:out_f]
    wp = torch.where(mask, w, torch.zeros((), dtype=dtype, device=device))
    ok = True
    for kind, got in (("fwd", pk.fwd), ("dgrad", pk.dgrad)):
        comp = compressor(dev_index, OperandLayout.for_weight(out_f, in_f, kind), dtype)
        lib_bytes = comp(wp)
        m, k = (out_f, in_f) if kind == "fwd" else (in_f, out_f)
        valid = L.valid_byte_mask(m, k, device)
        ok &= lib_bytes.numel() == got.numel() and bool(torch.equal(lib_bytes[valid], got[valid]))
    return ok


def layout_status(device: torch.device, dtype: torch.dtype, pack: str = CSLT_PACK_MODES[0]) -> dict:
    """How this process packs for (device, dtype) under the `pack` setting: {"pack": "triton" |
    "library", "reason": ..., "arch": ..., "cusparselt": ...}; decided once per (device, dtype,
    setting)."""
    if pack not in CSLT_PACK_MODES:
        raise ValueError(f"cslt_pack={pack!r} is not one of {', '.join(CSLT_PACK_MODES)}")
    key = (_device_index(device), dtype, pack)
    st = _layout_status.get(key)
    if st is not None:
        return st
    with _layout_lock:
        st = _layout_status.get(key)
        if st is not None:
            return st
        arch, ver = arch_of(device), version()
        if pack == "library":
            st = {"pack": "library", "reason": "cslt_pack=library"}
        elif pack == "triton":
            st = {"pack": "triton", "reason": "cslt_pack=triton (no check)"}
        elif (arch, ver) in VALIDATED_LAYOUTS:
            st = {"pack": "triton", "reason": f"layout validated for ({arch}, cuSPARSELt {ver})"}
        elif probe_layout(device, dtype):
            st = {
                "pack": "triton",
                "reason": f"({arch}, cuSPARSELt {ver}) not in the validated table; start-up probe "
                "matched the library's bytes",
            }
            log.warning(
                "cuSPARSELt layout for (%s, %d) not validated before; the start-up probe matched: "
                "using the "
                "fused Triton packer",
                arch,
                ver,
            )
        else:
            st = {
                "pack": "library",
                "reason": f"({arch}, cuSPARSELt {ver}): our packer's bytes differ from the "
                "library's; using cusparseLtSpMMACompress2 (slower)",
            }
            log.warning(
                "cuSPARSELt compressed layout on (%s, cuSPARSELt %d) differs from the one this "
                "package "
                "knows: falling back to the library compressor (sp_mma_compress), which is slower",
                arch,
                ver,
            )
        st.update(arch=arch, cusparselt=ver)
        _layout_status[key] = st
        return st


def layout_records() -> dict:
    """{str((device, dtype, setting)): status} of every decision so far."""
    with _layout_lock:
        return {str(k): dict(v) for k, v in _layout_status.items()}
