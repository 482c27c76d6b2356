"""The cuSPARSELt backend: both GEMMs of a linear layer on the 2:4 sparse tensor cores (sm80, sm86,
sm89, sm90).

Per step (`sparsify`): one fused Triton kernel prunes W (tile_greedy) and writes the compressed
operands of both GEMMs in cuSPARSELt's own layout (`sparsity.kernels.pack_cusparselt`); other
pruning methods prune with `sparsity.pruning.prune` and pack with the same kernel from the given
mask. Only transposable methods get a sparse input-gradient GEMM; for the others `matmul_t` is a
dense GEMM on the pruned weight. Where this process packs with the library compressor
(`packing.layout_status`, setting `cslt_pack`) W is pruned, then compressed by
`cusparseLtSpMMACompress2`.

GEMMs: cached plans (`plans`, algorithms chosen by `search` with the `cslt_search` setting), also
registered as `torch.library` custom ops (`ops`: `sparsity::cslt_mm`, `cslt_prune_pack`, and
`cslt_linear` with its autograd formula), which is what a torch.compile trace of a sparse layer
calls (`sparsity.traced`).

Shapes: in/out features must be multiples of 16 (cuSPARSELt); the rows of the sparse operand (out
features, or tokens for an activation-sparse layer) are zero-padded up to a multiple of 16 when
needed; token counts are padded up to a multiple of 8 inside the GEMM op. fp16 and bf16 only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sparsity.packing import layout as L
from sparsity.pruning import is_transposable, prune

from ..base import Backend, BackendUnavailable, SparseWeight, cast
from ..settings import BackendSettings
from .compressor import compress_weight
from .library import lib
from .ops import mm, prune_pack
from .packing import layout_records, layout_status
from .search import plan_records
from .wgrad import maybe_mvue_weight_grad

DTYPES = (torch.float16, torch.bfloat16)


def _tile_bits_to_mask(bits: torch.Tensor) -> torch.Tensor:
    # Triton (an optional dependency on CPU) is imported by the kernel modules, on first use
    from sparsity.kernels.pack_cusparselt import tile_bits_to_mask

    return tile_bits_to_mask(bits)


class CuSparseLtSparseWeight(SparseWeight):
    """W pruned 2:4 and compressed for cuSPARSELt: `packed` (A = W) and, for transposable masks,
    `packed_t` (A = W^T). Rows of W may have been zero-padded to a multiple of 16 (`rows_pad`).
    `search`: how the GEMMs of a new shape choose their algorithm (the backend's `cslt_search`
    setting)."""

    def __init__(
        self,
        shape,
        packed,
        packed_t,
        dtype,
        *,
        tile_bits=None,
        mask=None,
        values=None,
        rows_pad=None,
        ref=None,
        search: str = BackendSettings.cslt_search,
    ):
        self.shape = torch.Size(shape)
        self.packed = packed
        self.packed_t = packed_t
        self.dtype = dtype
        self._tile_bits = tile_bits
        self._mask = mask
        self._values = values
        self.rows_pad = rows_pad if rows_pad is not None else self.shape[0]
        # dense padded pruned W for the library-compressor path (our layout cannot decode it)
        self._ref = ref
        self.search = search

    @property
    def transposable(self) -> bool:
        return self.packed_t is not None

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out, inf = self.shape
        if bias is not None and self.rows_pad != out:
            bias = F.pad(bias, (0, self.rows_pad - out))
        # bias in any dtype: the plan copies it into its own buffer of the GEMM's dtype (the copy
        # casts)
        y = mm(
            self.packed,
            cast(x, self.dtype),
            bias,
            self.rows_pad,
            inf,
            False,
            self._ref,
            self.search,
        )
        return y if self.rows_pad == out else y[:, :out]

    def matmul_t(self, dy: torch.Tensor) -> torch.Tensor:
        out, inf = self.shape
        dy = cast(dy, self.dtype)
        if self.packed_t is None:
            return dy @ self.to_dense()
        if self.rows_pad != out:
            dy = F.pad(dy, (0, self.rows_pad - out))
        return mm(self.packed_t, dy, None, self.rows_pad, inf, True, self._ref, self.search)

    def to_dense(self) -> torch.Tensor:
        if self._values is not None:
            return self._values
        if self._ref is not None:
            return self._ref[: self.shape[0]]
        out, inf = self.shape
        return L.unpack_reference(self.packed, self.rows_pad, inf, "row", self.dtype)[:out]

    def mask(self) -> torch.Tensor:
        if self._mask is None:
            self._mask = _tile_bits_to_mask(self._tile_bits)[: self.shape[0]]
        return self._mask


class CuSparseLtBackend(Backend):
    name = "cusparselt"

    def __init__(self, settings: BackendSettings | None = None):
        super().__init__(settings)
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
            raise BackendUnavailable(
                f"2:4 sparse tensor cores need compute capability >= 8.0, got {major}.{minor}"
            )
        lib()  # raises BackendUnavailable with the reason if nvmath/cuSPARSELt cannot be loaded
        self._ok.add((device, dtype))

    def check_shape(
        self, out_features: int, in_features: int, pruning: str = "tile_greedy"
    ) -> None:
        """cuSPARSELt dims are multiples of 16: rows are zero-padded up to one, the sparse K dim
        cannot be. Tile prunings also need whole 4x4 tiles, so rows % 4 == 0 (a tile mixing real and
        padding rows would prune differently from the dense reference); row-wise ones (e.g. an
        activation with any token count) do not."""
        if in_features % 16 or (is_transposable(pruning) and out_features % 4):
            raise BackendUnavailable(
                f"cusparselt needs in_features % 16 == "
                f"0{' and out_features % 4 == 0' * is_transposable(pruning)} "
                f"for pruning={pruning!r} (cuSPARSELt dims are multiples of 16; out is padded), "
                f"got weight shape "
                f"({out_features}, {in_features})"
            )

    def layout_status(self, device: torch.device, dtype: torch.dtype) -> dict:
        """How this backend packs for (device, dtype) under its `cslt_pack` setting
        (`packing.layout_status`)."""
        return layout_status(device, dtype, self.settings.cslt_pack)

    def sparsify(self, weight: torch.Tensor, pruning: str) -> CuSparseLtSparseWeight:
        self.check(weight.device, weight.dtype)
        out_f, in_f = weight.shape
        self.check_shape(out_f, in_f, pruning)
        search = self.settings.cslt_search
        rows_pad = -(-out_f // 16) * 16
        w = weight
        if rows_pad != out_f:
            w = F.pad(w, (0, 0, 0, rows_pad - out_f))
        status = self.layout_status(weight.device, weight.dtype)
        transposable = is_transposable(pruning) and in_f % 4 == 0
        if status["pack"] == "triton":
            if pruning == "tile_greedy":
                fwd, dgrad, bits = prune_pack(w, None, True)
                return CuSparseLtSparseWeight(
                    (out_f, in_f),
                    fwd,
                    dgrad,
                    w.dtype,
                    tile_bits=bits,
                    rows_pad=rows_pad,
                    search=search,
                )
            values, mask = prune(w, pruning)
            fwd, dgrad, _ = prune_pack(values, mask, transposable)
            return CuSparseLtSparseWeight(
                (out_f, in_f),
                fwd,
                dgrad if transposable else None,
                w.dtype,
                mask=mask[:out_f],
                values=None if transposable else values[:out_f],
                rows_pad=rows_pad,
                search=search,
            )
        # library compressor fallback
        values, mask = prune(w, pruning)
        fwd = compress_weight(values, "fwd")
        dgrad = compress_weight(values, "dgrad") if transposable and rows_pad % 16 == 0 else None
        return CuSparseLtSparseWeight(
            (out_f, in_f),
            fwd,
            dgrad,
            w.dtype,
            mask=mask[:out_f],
            values=None if dgrad is not None else values[:out_f],
            rows_pad=rows_pad,
            ref=values,
            search=search,
        )

    def mvue_weight_grad(self, dy: torch.Tensor, x: torch.Tensor, seed: int) -> torch.Tensor | None:
        return maybe_mvue_weight_grad(dy, x, seed, self.settings.cslt_search)

    def describe(self) -> dict:
        """The settings, how each (device, dtype) packs, and the algorithm chosen per GEMM shape."""
        return {
            "backend": self.name,
            "settings": self.settings_dict(),
            "layouts": layout_records(),
            "plans": plan_records(),
        }
