"""A cuSPARSELt GEMM plan: descriptors, algorithm, workspace and bias buffer of one GEMM shape,
built once.

Why not torch's `_cslt_sparse_mm`: it builds descriptors and a plan on every call (about 0.5 ms of
host time on an H100, measured by `scripts/bench_sparse.py`'s `torch_cslt` rows), which starves the
GPU at ViT-L MLP shapes. A `GemmPlan` is built once per (device, dtype, orientation, m, k, n, bias,
output order) and a call costs one `cusparseLtMatmul` (microseconds). Each plan owns its workspace
and (optional) bias buffer, allocated when it is built, so a call allocates nothing and does not
synchronise: it can be captured in a CUDA graph. Which algorithm a plan runs is chosen in
`search.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ...cuda_buffers import persistent_empty
from ..cuda import raw_stream
from .compressor import OperandLayout, structured_descriptor
from .library import ALIGN, CUDA_DTYPE, OP_N, OP_T, ORDER_COL, ORDER_ROW, handle, lib, ptr


@dataclass
class GemmPlan:
    """One cached cuSPARSELt plan: descriptors, algorithm, workspace, bias buffer."""

    key: tuple
    device_index: int
    h: int
    lay: OperandLayout
    n: int  # tokens
    dtype: torch.dtype
    b_transposed: (
        bool  # True: B given as (tokens x k) row-major with op(B)=T; False: (k x tokens) row-major
    )
    d_order: int
    has_bias: bool
    alg_id: int | None = None  # None = library default
    descs: list = field(default_factory=list)
    matmul_desc: int = 0
    alg_sel: int = 0
    plan: int = 0
    workspace: torch.Tensor | None = None
    bias_buf: torch.Tensor | None = None
    searched: bool = False

    def build(self):
        c = lib()
        m, k, n = self.lay.rows, self.lay.cols, self.n
        dt = CUDA_DTYPE[self.dtype]
        a = structured_descriptor(self.h, self.lay, self.dtype)
        if self.b_transposed:  # B memory (n x k) row-major, op T
            b = c.dense_descriptor_init(self.h, n, k, k, ALIGN, dt, ORDER_ROW)
            op_b = OP_T
        else:  # B memory (k x n) row-major, op N
            b = c.dense_descriptor_init(self.h, k, n, n, ALIGN, dt, ORDER_ROW)
            op_b = OP_N
        ld_d = m if self.d_order == ORDER_COL else n
        d = c.dense_descriptor_init(self.h, m, n, ld_d, ALIGN, dt, self.d_order)
        self.descs = [a, b, d]
        self.matmul_desc = c.matmul_descriptor_init(
            self.h, OP_N, op_b, a, b, d, d, c.ComputeType.COMPUTE_32F
        )
        if self.has_bias:
            self.bias_buf = persistent_empty((m,), self.dtype, self.device_index).zero_()
            self._bias_ptr = np.array([self.bias_buf.data_ptr()], dtype=np.uint64)
            c.matmul_desc_set_attribute(
                self.h, self.matmul_desc, c.MatmulDescAttribute.BIAS_POINTER, ptr(self._bias_ptr), 8
            )
        self.alg_sel = c.matmul_alg_selection_init(self.h, self.matmul_desc, c.MatmulAlg.DEFAULT)
        if self.alg_id is not None:
            v = np.array([self.alg_id], dtype=np.int32)
            c.matmul_alg_set_attribute(
                self.h, self.alg_sel, c.MatmulAlgAttribute.CONFIG_ID, ptr(v), 4
            )
        self.plan = c.matmul_plan_init(self.h, self.matmul_desc, self.alg_sel)
        self._alloc_workspace()
        self.alpha = np.ones(1, dtype=np.float32)
        self.beta = np.zeros(1, dtype=np.float32)
        self.streams = np.zeros(1, dtype=np.uint64)
        # raw pointers once (arr.ctypes.data costs microseconds per access)
        self._alpha_p, self._beta_p, self._streams_p = (
            ptr(self.alpha),
            ptr(self.beta),
            ptr(self.streams),
        )
        self._ws_p = self.workspace.data_ptr()
        self._matmul = c.matmul

    def _alloc_workspace(self):
        ws = int(lib().matmul_get_workspace(self.h, self.plan))
        if self.workspace is None or self.workspace.numel() < ws:
            self.workspace = persistent_empty((max(ws, 16),), torch.uint8, self.device_index)
        self._ws_p = self.workspace.data_ptr()

    def current_alg(self) -> int:
        c = lib()
        v = np.zeros(1, dtype=np.int32)
        c.matmul_alg_get_attribute(self.h, self.alg_sel, c.MatmulAlgAttribute.CONFIG_ID, ptr(v), 4)
        return int(v[0])

    def max_alg(self) -> int:
        c = lib()
        v = np.zeros(1, dtype=np.int32)
        c.matmul_alg_get_attribute(
            self.h, self.alg_sel, c.MatmulAlgAttribute.CONFIG_MAX_ID, ptr(v), 4
        )
        return int(v[0])

    def run(
        self,
        a_compressed: torch.Tensor,
        b: torch.Tensor,
        d: torch.Tensor,
        bias: torch.Tensor | None = None,
    ):
        if self.has_bias:
            self.bias_buf.copy_(bias)  # casts too; fixed address, so graph-capturable
        self.streams[0] = raw_stream(self.device_index)
        dp = d.data_ptr()
        self._matmul(
            self.h,
            self.plan,
            self._alpha_p,
            a_compressed.data_ptr(),
            b.data_ptr(),
            self._beta_p,
            dp,
            dp,
            self._ws_p,
            self._streams_p,
            1,
        )

    def search(self, a_compressed: torch.Tensor, b: torch.Tensor, d: torch.Tensor):
        """cusparseLtMatmulSearch: times the algorithms and stores the best in the plan."""
        self.streams[0] = raw_stream(self.device_index)
        # search may need the largest workspace of all algorithms: give it a generous one
        with torch.cuda.device(self.device_index):
            big = torch.empty(
                max(self.workspace.numel(), 64 << 20), dtype=torch.uint8, device="cuda"
            )
        lib().matmul_search(
            self.h,
            self.plan,
            ptr(self.alpha),
            a_compressed.data_ptr(),
            b.data_ptr(),
            ptr(self.beta),
            d.data_ptr(),
            d.data_ptr(),
            big.data_ptr(),
            ptr(self.streams),
            1,
        )
        self.searched = True
        self._alloc_workspace()

    def destroy(self):  # pragma: no cover
        c = lib()
        try:
            c.matmul_plan_destroy(self.plan)
            c.matmul_alg_selection_destroy(self.alg_sel)
            c.matmul_descriptor_destroy(self.matmul_desc)
            for dsc in self.descs:
                c.mat_descriptor_destroy(dsc)
        except Exception:
            pass


def make_plan(
    key, device_index, lay, n, dtype, b_transposed, d_order, has_bias, alg_id=None
) -> GemmPlan:
    """A built plan (this thread's handle) running algorithm `alg_id` (None: the library's
    default)."""
    p = GemmPlan(
        key,
        device_index,
        handle(device_index),
        lay,
        n,
        dtype,
        b_transposed,
        d_order,
        has_bias,
        alg_id,
    )
    p.build()
    return p


def empty_d(plan: GemmPlan, device) -> torch.Tensor:
    """An output buffer for the plan: (tokens x m) row-major for a COL-order D, (m x tokens) for
    ROW."""
    m, n = plan.lay.rows, plan.n
    if plan.d_order == ORDER_COL:
        return torch.empty(n, m, dtype=plan.dtype, device=device)
    return torch.empty(m, n, dtype=plan.dtype, device=device)


def d_as_tokens_major(plan: GemmPlan, d: torch.Tensor) -> torch.Tensor:
    return d if plan.d_order == ORDER_COL else d.t()
