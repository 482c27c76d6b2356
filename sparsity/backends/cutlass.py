"""The `cutlass` backend: torch core's CUTLASS 2:4 kernels, for sm8x (A100: the users' cluster).

Per step: `torch._sparse_semi_structured_tile(W, "largest_abs_values_greedy", use_cutlass=True)`
prunes 4x4 tiles with torch's transposable greedy and packs W and W^T in CUTLASS's format in one
kernel; the products are `torch._sparse_semi_structured_linear` (x @ W^T + bias, and dy @ (W^T)^T
for the input gradient).

Limits (torch 2.11, read in aten/src/ATen/native/sparse/cuda/): the CUTLASS GEMM is compiled for
sm80 only and refuses other compute capabilities ("Supported only on GPUs with compute capability
8.x"); fp16/bf16; in_features a multiple of 64 and out_features of 32 for the packer's tiles (we
check 64/64 to be safe).

Pruning: only "tile_greedy" runs on torch's fused tile kernel. Its greedy sorts the 16 entries of a
tile with a sorting network whose order among *equal* |w| is not ours (ties to the lower row-major
index), so in rare exact ties its mask can differ from `sparsity.pruning.reference.tile_greedy_mask`
(measured on the H100, where the packer runs although the GEMM does not: see
tests/gpu/test_cutlass.py); the kept mass is the same up to those ties. Other methods prune with
`sparsity.pruning.prune` and pack the pruned weight with `torch.sparse.to_sparse_semi_structured`
(CUTLASS format, slower; W^T too when the mask is transposable).

Not validated here: this repository's GPU machine is an H100 (sm90); the GEMM path was only
exercised to the point of its capability check. Run `pytest -m gpu tests/gpu/test_cutlass.py` on an
A100 before relying on it.
"""

from __future__ import annotations

import torch
from torch.sparse import SparseSemiStructuredTensor, to_sparse_semi_structured

from sparsity.pruning import is_transposable, prune

from .base import Backend, BackendUnavailable, SparseWeight, cast

SM8X_REASON = "torch's CUTLASS 2:4 GEMM supports only compute capability 8.x"


class CutlassSparseWeight(SparseWeight):
    def __init__(
        self,
        shape,
        packed,
        meta,
        packed_t,
        meta_t,
        dtype,
        *,
        bitmask=None,
        mask=None,
        values=None,
        source=None,
    ):
        self.shape = torch.Size(shape)
        self.packed, self.meta, self.packed_t, self.meta_t = packed, meta, packed_t, meta_t
        self.dtype = dtype
        self._bitmask = bitmask
        self._mask = mask
        self._values = values
        self._source = source

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch._sparse_semi_structured_linear(
            cast(x, self.dtype), self.packed, self.meta, bias=cast(bias, self.dtype)
        )

    def matmul_t(self, dy: torch.Tensor) -> torch.Tensor:
        if self.packed_t is None:
            return cast(dy, self.dtype) @ self.to_dense()
        return torch._sparse_semi_structured_linear(
            cast(dy, self.dtype), self.packed_t, self.meta_t
        )

    def to_dense(self) -> torch.Tensor:
        if self._values is None:
            self._values = torch._sparse_semi_structured_apply_dense(self._source, self._bitmask)
        return self._values

    def mask(self) -> torch.Tensor:
        if self._mask is None:
            self._mask = self.to_dense() != 0
        return self._mask


class CutlassBackend(Backend):
    name = "cutlass"

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        device = torch.device(device)
        if device.type != "cuda":
            raise BackendUnavailable(f"cutlass needs a CUDA device, got {device}")
        major, minor = torch.cuda.get_device_capability(device)
        if major != 8:
            raise BackendUnavailable(f"{SM8X_REASON} (this GPU is {major}.{minor})")
        if dtype not in (torch.float16, torch.bfloat16):
            raise BackendUnavailable(f"cutlass backend supports fp16 and bf16, got {dtype}")

    def check_shape(self, out_features: int, in_features: int) -> None:
        if out_features % 64 or in_features % 64:
            raise BackendUnavailable(
                f"cutlass needs in/out features divisible by 64, got ({out_features}, "
                f"{in_features})"
            )

    def sparsify(self, weight: torch.Tensor, pruning: str) -> CutlassSparseWeight:
        self.check(weight.device, weight.dtype)
        self.check_shape(*weight.shape)
        w = weight.detach().contiguous()
        if pruning == "tile_greedy":
            packed, meta, packed_t, meta_t, bitmask = torch._sparse_semi_structured_tile(
                w, "largest_abs_values_greedy", use_cutlass=True
            )
            return CutlassSparseWeight(
                w.shape, packed, meta, packed_t, meta_t, w.dtype, bitmask=bitmask, source=w
            )
        values, mask = prune(w, pruning)
        prev = SparseSemiStructuredTensor._FORCE_CUTLASS
        SparseSemiStructuredTensor._FORCE_CUTLASS = True
        try:
            s = to_sparse_semi_structured(values)
            packed_t = meta_t = None
            if is_transposable(pruning):
                st = to_sparse_semi_structured(values.t().contiguous())
                packed_t, meta_t = st.packed, st.meta
        finally:
            SparseSemiStructuredTensor._FORCE_CUTLASS = prev
        return CutlassSparseWeight(
            w.shape, s.packed, s.meta, packed_t, meta_t, w.dtype, mask=mask, values=values
        )
