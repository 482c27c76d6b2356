"""The cuSPARSELt backend: both GEMMs of a linear layer on the 2:4 sparse tensor cores (sm80, sm86, sm89, sm90).

Per step (`sparsify`): one fused Triton kernel prunes W (tile_greedy) and writes the compressed operands of both
GEMMs in cuSPARSELt's own layout (`sparsity.kernels.pack_cusparselt`); other pruning methods prune with
`sparsity.pruning.prune` and pack with the same kernel from the given mask. Only transposable methods get a
sparse input-gradient GEMM; for the others `matmul_t` is a dense GEMM on the pruned weight.

GEMMs: cached nvmath/cuSPARSELt plans (`_cslt_plans`), also registered as `torch.library` custom ops
(`_cslt_ops`: `sparsity::cslt_mm`, `cslt_prune_pack`, and `cslt_linear` with its autograd formula), which is what a
torch.compile trace of a sparse layer calls (`sparsity.traced`).

The compressed layout is internal to cuSPARSELt. It was reverse-engineered and validated bit for bit on the
(arch, version) pairs in `VALIDATED_LAYOUTS`; on any other pair the backend compresses one probe matrix both ways
at start-up (our kernel vs `cusparseLtSpMMACompress2`) and, if the bytes differ, falls back to the library
compressor (prune with the Triton kernel, then two library compress calls: slower, same results) with a warning.
`SPARSITY_CSLT_PACK=library|triton` forces either path.

Shapes: in/out features must be multiples of 16 (cuSPARSELt); the rows of the sparse operand (out features, or
tokens for an activation-sparse layer) are zero-padded up to a multiple of 16 when needed; token counts are padded
up to a multiple of 8 inside the GEMM op. fp16 and bf16 only.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from sparsity.packing import layout as L

from . import _cslt_plans as P
from ._cslt_ops import mm as _mm
from ._cslt_ops import prune_pack as _prune_pack
from .base import Backend, BackendUnavailable, SparseWeight, cast

log = logging.getLogger(__name__)

# (arch, cuSPARSELt version) pairs on which `sparsity.packing.layout` was checked byte for byte against the
# library's compressor (tests/gpu/test_cusparselt.py::test_fused_pack_equals_library, results/bench/NOTES.md)
VALIDATED_LAYOUTS = {("sm90", 800)}
DTYPES = (torch.float16, torch.bfloat16)


# ----------------------------------------------------------------------------------------------------------------
# sparse weight


class CuSparseLtSparseWeight(SparseWeight):
    """W pruned 2:4 and compressed for cuSPARSELt: `packed` (A = W) and, for transposable masks, `packed_t`
    (A = W^T). Rows of W may have been zero-padded to a multiple of 16 (`rows_pad`)."""

    def __init__(self, shape, packed, packed_t, dtype, *, tile_bits=None, mask=None, values=None, rows_pad=None,
                 ref=None):
        self.shape = torch.Size(shape)
        self.packed = packed
        self.packed_t = packed_t
        self.dtype = dtype
        self._tile_bits = tile_bits
        self._mask = mask
        self._values = values
        self.rows_pad = rows_pad if rows_pad is not None else self.shape[0]
        self._ref = ref  # dense padded pruned W for the library-compressor path (our layout cannot decode it)

    @property
    def transposable(self) -> bool:
        return self.packed_t is not None

    def matmul(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        out, inf = self.shape
        if bias is not None and self.rows_pad != out:
            bias = F.pad(bias, (0, self.rows_pad - out))
        # bias in any dtype: the plan copies it into its own buffer of the GEMM's dtype (the copy casts)
        y = _mm(self.packed, cast(x, self.dtype), bias, self.rows_pad, inf, False, self._ref)
        return y if self.rows_pad == out else y[:, :out]

    def matmul_t(self, dy: torch.Tensor) -> torch.Tensor:
        out, inf = self.shape
        dy = cast(dy, self.dtype)
        if self.packed_t is None:
            return dy @ self.to_dense()
        if self.rows_pad != out:
            dy = F.pad(dy, (0, self.rows_pad - out))
        return _mm(self.packed_t, dy, None, self.rows_pad, inf, True, self._ref)

    def to_dense(self) -> torch.Tensor:
        if self._values is not None:
            return self._values
        if self._ref is not None:
            return self._ref[: self.shape[0]]
        out, inf = self.shape
        return L.unpack_reference(self.packed, self.rows_pad, inf, "row", self.dtype)[:out]

    def mask(self) -> torch.Tensor:
        if self._mask is None:
            from sparsity.kernels.pack_cusparselt import tile_bits_to_mask

            self._mask = tile_bits_to_mask(self._tile_bits)[: self.shape[0]]
        return self._mask


# ----------------------------------------------------------------------------------------------------------------
# layout validation


_layout_lock = threading.Lock()
_layout_status: dict = {}


def arch_of(device: torch.device) -> str:
    return "sm%d%d" % torch.cuda.get_device_capability(device)


def probe_layout(device: torch.device, dtype: torch.dtype) -> bool:
    """Compress one probe matrix with our kernel and with cuSPARSELt's compressor; True if the bytes agree."""
    from sparsity.kernels.pack_cusparselt import prune_pack

    dev_index = device.index if device.index is not None else torch.cuda.current_device()
    g = torch.Generator(device=device).manual_seed(7)
    out_f, in_f = 256, 512
    w = torch.randn(out_f, in_f, device=device, dtype=torch.float32, generator=g).to(dtype)
    pk = prune_pack(w)
    wp = torch.where(pk_mask(pk, out_f), w, torch.zeros((), dtype=dtype, device=device))
    ok = True
    for kind, got in (("fwd", pk.fwd), ("dgrad", pk.dgrad)):
        comp = P.compressor(dev_index, P.OperandLayout.for_weight(out_f, in_f, kind), dtype)
        lib_bytes = comp(wp)
        m, k = (out_f, in_f) if kind == "fwd" else (in_f, out_f)
        valid = L.valid_byte_mask(m, k, device)
        ok &= lib_bytes.numel() == got.numel() and bool(torch.equal(lib_bytes[valid], got[valid]))
    return ok


def pk_mask(pk, rows: int) -> torch.Tensor:
    from sparsity.kernels.pack_cusparselt import tile_bits_to_mask

    return tile_bits_to_mask(pk.tile_bits)[:rows]


def layout_status(device: torch.device, dtype: torch.dtype) -> dict:
    """How this process packs for (device, dtype): {"pack": "triton" | "library", "reason": ...}."""
    key = (device.index if device.index is not None else torch.cuda.current_device(), dtype)
    st = _layout_status.get(key)
    if st is not None:
        return st
    with _layout_lock:
        st = _layout_status.get(key)
        if st is not None:
            return st
        forced = os.environ.get("SPARSITY_CSLT_PACK", "auto")
        arch, ver = arch_of(device), P.version()
        if forced == "library":
            st = {"pack": "library", "reason": "SPARSITY_CSLT_PACK=library"}
        elif forced == "triton":
            st = {"pack": "triton", "reason": "SPARSITY_CSLT_PACK=triton (no check)"}
        elif (arch, ver) in VALIDATED_LAYOUTS:
            st = {"pack": "triton", "reason": f"layout validated for ({arch}, cuSPARSELt {ver})"}
        elif probe_layout(device, dtype):
            st = {"pack": "triton", "reason": f"({arch}, cuSPARSELt {ver}) not in the validated table; start-up probe "
                                              "matched the library's bytes"}
            log.warning("cuSPARSELt layout for (%s, %d) not validated before; the start-up probe matched: using the "
                        "fused Triton packer", arch, ver)
        else:
            st = {"pack": "library", "reason": f"({arch}, cuSPARSELt {ver}): our packer's bytes differ from the "
                                               "library's; using cusparseLtSpMMACompress2 (slower)"}
            log.warning("cuSPARSELt compressed layout on (%s, cuSPARSELt %d) differs from the one this package "
                        "knows: falling back to the library compressor (sp_mma_compress), which is slower", arch, ver)
        st.update(arch=arch, cusparselt=ver)
        _layout_status[key] = st
        return st


# ----------------------------------------------------------------------------------------------------------------
# backend


class CuSparseLtBackend(Backend):
    name = "cusparselt"

    def __init__(self):
        self._ok: set = set()  # (device, dtype) pairs that passed check()

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        if (device, dtype) in self._ok:
            return
        device = torch.device(device)
        if device.type != "cuda":
            raise BackendUnavailable(f"cusparselt needs a CUDA device, got {device}")
        if dtype not in DTYPES:
            raise BackendUnavailable(f"cusparselt backend supports fp16 and bf16, got {dtype}")
        major, minor = torch.cuda.get_device_capability(device)
        if major < 8:
            raise BackendUnavailable(f"2:4 sparse tensor cores need compute capability >= 8.0, got {major}.{minor}")
        P.lib()  # raises BackendUnavailable with the reason if nvmath/cuSPARSELt cannot be loaded
        self._ok.add((device, dtype))

    def check_shape(self, out_features: int, in_features: int, pruning: str = "tile_greedy") -> None:
        """cuSPARSELt dims are multiples of 16: rows are zero-padded up to one, the sparse K dim cannot be. Tile
        prunings also need whole 4x4 tiles, so rows % 4 == 0 (a tile mixing real and padding rows would prune
        differently from the dense reference); row-wise ones (e.g. an activation with any token count) do not."""
        from sparsity.pruning import is_transposable

        if in_features % 16 or (is_transposable(pruning) and out_features % 4):
            raise BackendUnavailable(
                f"cusparselt needs in_features % 16 == 0{' and out_features % 4 == 0' * is_transposable(pruning)} "
                f"for pruning={pruning!r} (cuSPARSELt dims are multiples of 16; out is padded), got weight shape "
                f"({out_features}, {in_features})"
            )

    def sparsify(self, weight: torch.Tensor, pruning: str) -> CuSparseLtSparseWeight:
        from sparsity.pruning import is_transposable, prune

        self.check(weight.device, weight.dtype)
        out_f, in_f = weight.shape
        self.check_shape(out_f, in_f, pruning)
        rows_pad = -(-out_f // 16) * 16
        w = weight
        if rows_pad != out_f:
            w = F.pad(w, (0, 0, 0, rows_pad - out_f))
        status = layout_status(weight.device, weight.dtype)
        transposable = is_transposable(pruning) and in_f % 4 == 0
        if status["pack"] == "triton":
            if pruning == "tile_greedy":
                fwd, dgrad, bits = _prune_pack(w, None, True)
                return CuSparseLtSparseWeight((out_f, in_f), fwd, dgrad, w.dtype, tile_bits=bits, rows_pad=rows_pad)
            values, mask = prune(w, pruning)
            fwd, dgrad, _ = _prune_pack(values, mask, transposable)
            return CuSparseLtSparseWeight((out_f, in_f), fwd, dgrad if transposable else None, w.dtype,
                                          mask=mask[:out_f], values=None if transposable else values[:out_f],
                                          rows_pad=rows_pad)
        # library compressor fallback
        values, mask = prune(w, pruning)
        dev_index = w.device.index if w.device.index is not None else torch.cuda.current_device()
        fwd = P.compressor(dev_index, P.OperandLayout.for_weight(rows_pad, in_f, "fwd"), w.dtype)(values)
        dgrad = None
        if transposable and rows_pad % 16 == 0:
            dgrad = P.compressor(dev_index, P.OperandLayout.for_weight(rows_pad, in_f, "dgrad"), w.dtype)(values)
        return CuSparseLtSparseWeight((out_f, in_f), fwd, dgrad, w.dtype, mask=mask[:out_f],
                                      values=None if dgrad is not None else values[:out_f], rows_pad=rows_pad,
                                      ref=values)

    def describe(self) -> dict:
        from ._cublaslt_wgrad import decisions

        out = {"backend": self.name, "layouts": {str(k): v for k, v in _layout_status.items()},
               "weight_grad": decisions()}
        try:
            out["plans"] = P.plan_records()
        except Exception:  # noqa: BLE001
            pass
        return out
