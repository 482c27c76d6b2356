"""The structured operand of a cuSPARSELt GEMM: how a weight is described to the library, and the
library's own compressor (`cusparseLtSpMMACompress2`), the oracle of the compressed layout.

Orientation of the two GEMMs of a linear layer (W is the dense weight, out x in, row-major;
cuSPARSELt computes D (m x n) = op(A) (m x k) . op(B) (k x n) with A the 2:4 structured operand):

  "fwd"    y^T  = W_s . x^T     A = W (out x in) ROW order, ld = in, 2:4 along in.
                                B = x (tokens x in) ROW, op(B) = T.  D (out x tokens) COL order, ld = out,
                                which is exactly y (tokens x out) row-major: no transposed copy of the output.
  "dgrad"  dx^T = W_s^T . dy^T  A = W^T, i.e. W's own memory described as (in x out) COL order, ld = in,
                                2:4 along out (the tile pruning keeps W^T 2:4 too).  B = dy (tokens x out) ROW,
                                op(B) = T.  D (in x tokens) COL, ld = in = dx (tokens x in) row-major.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from ...cuda_buffers import persistent_empty
from .library import ALIGN, CUDA_DTYPE, OP_N, ORDER_COL, ORDER_ROW, handle, lib


@dataclass
class OperandLayout:
    """How the structured operand A of one GEMM orientation is described to cuSPARSELt."""

    rows: int  # m
    cols: int  # k (the 2:4 dimension)
    ld: int
    order: int

    @staticmethod
    def for_weight(out_features: int, in_features: int, kind: str) -> OperandLayout:
        if kind == "fwd":  # W (out x in) row-major, sparse along in
            return OperandLayout(out_features, in_features, in_features, ORDER_ROW)
        if kind == "dgrad":  # W^T = W's memory as (in x out) column-major, sparse along out
            return OperandLayout(in_features, out_features, in_features, ORDER_COL)
        raise ValueError(kind)


def structured_descriptor(h: int, lay: OperandLayout, dtype: torch.dtype) -> int:
    c = lib()
    return c.structured_descriptor_init(
        h,
        lay.rows,
        lay.cols,
        lay.ld,
        ALIGN,
        CUDA_DTYPE[dtype],
        lay.order,
        c.Sparsity.SPARSITY_50_PERCENT,
    )


class Compressor:
    """The library's own compressor (`cusparseLtSpMMACompress2`) for one operand layout: the layout
    oracle."""

    def __init__(self, device_index: int, lay: OperandLayout, dtype: torch.dtype):
        c = lib()
        self.device_index = device_index
        self.h = handle(device_index)
        self.lay, self.dtype = lay, dtype
        self.desc = structured_descriptor(self.h, lay, dtype)
        self.compressed_size, self.buffer_size = c.sp_mma_compressed_size2(self.h, self.desc)
        self.buffer = persistent_empty((max(int(self.buffer_size), 16),), torch.uint8, device_index)

    def __call__(self, dense: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """dense: the pruned matrix in the memory the layout describes (W itself for both
        orientations)."""
        assert dense.is_contiguous() and dense.dtype == self.dtype
        if out is None:
            out = torch.empty(int(self.compressed_size), dtype=torch.uint8, device=dense.device)
        stream = torch.cuda.current_stream(dense.device).cuda_stream
        lib().sp_mma_compress2(
            self.h,
            self.desc,
            1,
            OP_N,
            dense.data_ptr(),
            out.data_ptr(),
            self.buffer.data_ptr(),
            stream,
        )
        return out

    def __del__(self):  # pragma: no cover
        try:
            lib().mat_descriptor_destroy(self.desc)
        except Exception:
            pass


class _Compressors(threading.local):  # per thread, like the handles they use
    def __init__(self):
        self.by_key: dict[tuple, Compressor] = {}


_compressors = _Compressors()


def compressor(device_index: int, lay: OperandLayout, dtype: torch.dtype) -> Compressor:
    """This thread's cached compressor for a layout."""
    key = (device_index, lay.rows, lay.cols, lay.ld, lay.order, dtype)
    comp = _compressors.by_key.get(key)
    if comp is None:
        comp = _compressors.by_key[key] = Compressor(device_index, lay, dtype)
    return comp


def compress_weight(w: torch.Tensor, kind: str) -> torch.Tensor:
    """W (rows, cols), pruned, compressed by the library for the GEMM orientation `kind` ("fwd" or
    "dgrad")."""
    rows, cols = w.shape
    dev = w.device.index if w.device.index is not None else torch.cuda.current_device()
    return compressor(dev, OperandLayout.for_weight(rows, cols, kind), w.dtype)(w)


def compressed_size(out_features: int, in_features: int, kind: str, dtype: torch.dtype) -> int:
    lay = OperandLayout.for_weight(out_features, in_features, kind)
    return int(compressor(torch.cuda.current_device(), lay, dtype).compressed_size)
