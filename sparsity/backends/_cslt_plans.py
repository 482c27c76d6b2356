"""cuSPARSELt through NVIDIA's `nvmath-python` bindings, with plans cached per shape.

Why not torch's `_cslt_sparse_mm`: it builds descriptors and a plan on every call (about 0.5 ms of host time on an
H100, h100-baseline.md), which starves the GPU at ViT-L MLP shapes. Here a plan is built once per
(device, dtype, orientation, m, k, n, bias, output order) and a call costs one `cusparseLtMatmul` (microseconds).

Orientation of the two GEMMs of a linear layer (W is the dense weight, out x in, row-major; cuSPARSELt computes
D (m x n) = op(A) (m x k) . op(B) (k x n) with A the 2:4 structured operand):

  "fwd"    y^T  = W_s . x^T     A = W (out x in) ROW order, ld = in, 2:4 along in.
                                B = x (tokens x in) ROW, op(B) = T.  D (out x tokens) COL order, ld = out,
                                which is exactly y (tokens x out) row-major: no transposed copy of the output.
  "dgrad"  dx^T = W_s^T . dy^T  A = W^T, i.e. W's own memory described as (in x out) COL order, ld = in,
                                2:4 along out (the tile pruning keeps W^T 2:4 too).  B = dy (tokens x out) ROW,
                                op(B) = T.  D (in x tokens) COL, ld = in = dx (tokens x in) row-major.

Handles and plans live in thread-local storage (one handle per device per thread; autograd may run backward on
another thread and cuSPARSELt handles must not be shared across threads, pytorch/pytorch#113776). Each plan owns
its workspace and (optional) bias buffer, allocated when the plan is built, so a call allocates nothing and does
not synchronise: it can be captured in a CUDA graph. Build plans (first call per shape) outside graph capture:
inside a capture the algorithm search and its result check are skipped (default algorithm) because they would
synchronise.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from .base import BackendUnavailable
from sparsity.backends._timing import median_cuda_ms

log = logging.getLogger(__name__)

# cudaDataType_t, cusparseOrder_t, cusparseOperation_t values (stable C enums)
_CUDA_DTYPE = {torch.float16: 2, torch.bfloat16: 14}
ORDER_COL, ORDER_ROW = 1, 2
OP_N, OP_T = 0, 1
ALIGN = 16  # bytes; every pointer handed to cuSPARSELt must be 16-byte aligned

# Dimension multiples cuSPARSELt 0.8 accepts for 16-bit types (found on the H100, see results/bench/NOTES.md): both
# dims of the structured operand (8, 17, 20, 24, 40 refused; 16, 32, 48, 80, ... accepted) and the token dimension
# of the dense operand (4097 and 4100 refused with NOT_SUPPORTED, 4104 accepted). The backend pads tokens.
STRUCT_MULTIPLE = 16
TOKEN_MULTIPLE = 8

_cslt = None
_load_error: Optional[str] = None
_load_lock = threading.Lock()


def _preload_libcusparselt() -> Optional[str]:
    """Make sure libcusparseLt is loaded into the process so nvmath's loader finds it.

    torch's CUDA wheel depends on nvidia-cusparselt; its library lives in site-packages/nvidia/cusparselt/lib (or
    torch/lib). Loading it with RTLD_GLOBAL first lets nvmath (via cuda-pathfinder) pick up the already-loaded copy.
    """
    cands = []
    for base in {os.path.dirname(os.path.dirname(torch.__file__))}:
        cands += glob.glob(os.path.join(base, "nvidia", "cusparselt", "lib", "libcusparseLt.so*"))
        cands += glob.glob(os.path.join(base, "nvidia", "cu13", "lib", "libcusparseLt.so*"))
    cands += glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libcusparseLt.so*"))
    for path in sorted(cands):
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return path
        except OSError:
            continue
    return None


def lib():
    """The `nvmath.bindings.cusparseLt` module, or raise BackendUnavailable saying why it cannot be used."""
    global _cslt, _load_error
    if _cslt is not None:
        return _cslt
    with _load_lock:
        if _cslt is not None:
            return _cslt
        if _load_error is not None:
            raise BackendUnavailable(_load_error)
        if not torch.cuda.is_available():
            _load_error = "cuSPARSELt needs a CUDA GPU"
            raise BackendUnavailable(_load_error)
        torch.cuda.init()
        _preload_libcusparselt()
        try:
            from nvmath.bindings import cusparseLt as cslt  # noqa: PLC0415
        except ImportError as e:  # pragma: no cover - depends on the environment
            _load_error = (
                "nvmath-python is not importable (pip install nvmath-python; it binds the libcusparseLt that "
                f"torch's CUDA wheel ships): {e}"
            )
            raise BackendUnavailable(_load_error) from e
        try:
            h = cslt.init()
            ver = cslt.get_version(h)
            cslt.destroy(h)
        except Exception as e:  # pragma: no cover
            _load_error = f"cuSPARSELt failed to initialise through nvmath: {e!r}"
            raise BackendUnavailable(_load_error) from e
        log.info("cuSPARSELt %s loaded through nvmath-python", ver)
        _cslt = cslt
        return _cslt


_version: Optional[int] = None


def version() -> int:
    """cuSPARSELt version as an int (e.g. 800 for 0.8.0)."""
    global _version
    if _version is None:
        _version = int(lib().get_version(_state().handle(torch.cuda.current_device())))
    return _version


# ----------------------------------------------------------------------------------------------------------------
# thread-local handles and plans
# ----------------------------------------------------------------------------------------------------------------


class _ThreadState(threading.local):
    def __init__(self):
        self.handles: dict[int, int] = {}
        self.plans: dict[tuple, "GemmPlan"] = {}
        self.compressors: dict[tuple, "Compressor"] = {}

    def handle(self, device_index: int) -> int:
        h = self.handles.get(device_index)
        if h is None:
            with torch.cuda.device(device_index):
                h = lib().init()
            self.handles[device_index] = h
        return h


_tls = _ThreadState()
# algorithm choices are shared across threads (the search result does not depend on the thread)
_alg_choice: dict[tuple, dict] = {}
_alg_lock = threading.Lock()


def _state() -> _ThreadState:
    return _tls


def _ptr(arr: np.ndarray) -> int:
    return arr.ctypes.data


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda idx: torch.cuda.current_stream(idx).cuda_stream
)


@dataclass
class OperandLayout:
    """How the structured operand A of one GEMM orientation is described to cuSPARSELt."""

    rows: int  # m
    cols: int  # k (the 2:4 dimension)
    ld: int
    order: int

    @staticmethod
    def for_weight(out_features: int, in_features: int, kind: str) -> "OperandLayout":
        if kind == "fwd":  # W (out x in) row-major, sparse along in
            return OperandLayout(out_features, in_features, in_features, ORDER_ROW)
        if kind == "dgrad":  # W^T = W's memory as (in x out) column-major, sparse along out
            return OperandLayout(in_features, out_features, in_features, ORDER_COL)
        raise ValueError(kind)


def structured_descriptor(h: int, lay: OperandLayout, dtype: torch.dtype) -> int:
    c = lib()
    return c.structured_descriptor_init(
        h, lay.rows, lay.cols, lay.ld, ALIGN, _CUDA_DTYPE[dtype], lay.order, c.Sparsity.SPARSITY_50_PERCENT
    )


class Compressor:
    """The library's own compressor (`cusparseLtSpMMACompress2`) for one operand layout: the layout oracle."""

    def __init__(self, device_index: int, lay: OperandLayout, dtype: torch.dtype):
        c = lib()
        self.device_index = device_index
        self.h = _state().handle(device_index)
        self.lay, self.dtype = lay, dtype
        self.desc = structured_descriptor(self.h, lay, dtype)
        self.compressed_size, self.buffer_size = c.sp_mma_compressed_size2(self.h, self.desc)
        with torch.cuda.device(device_index):
            self.buffer = torch.empty(max(int(self.buffer_size), 16), dtype=torch.uint8, device="cuda")

    def __call__(self, dense: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """dense: the pruned matrix in the memory the layout describes (W itself for both orientations)."""
        assert dense.is_contiguous() and dense.dtype == self.dtype
        if out is None:
            out = torch.empty(int(self.compressed_size), dtype=torch.uint8, device=dense.device)
        stream = torch.cuda.current_stream(dense.device).cuda_stream
        lib().sp_mma_compress2(
            self.h, self.desc, 1, OP_N, dense.data_ptr(), out.data_ptr(), self.buffer.data_ptr(), stream
        )
        return out

    def __del__(self):  # pragma: no cover
        try:
            lib().mat_descriptor_destroy(self.desc)
        except Exception:
            pass


def compressor(device_index: int, lay: OperandLayout, dtype: torch.dtype) -> Compressor:
    key = (device_index, lay.rows, lay.cols, lay.ld, lay.order, dtype)
    st = _state()
    comp = st.compressors.get(key)
    if comp is None:
        comp = st.compressors[key] = Compressor(device_index, lay, dtype)
    return comp


def compressed_size(out_features: int, in_features: int, kind: str, dtype: torch.dtype) -> int:
    lay = OperandLayout.for_weight(out_features, in_features, kind)
    return int(compressor(torch.cuda.current_device(), lay, dtype).compressed_size)


@dataclass
class GemmPlan:
    """One cached cuSPARSELt plan: descriptors, algorithm, workspace, bias buffer."""

    key: tuple
    device_index: int
    h: int
    lay: OperandLayout
    n: int  # tokens
    dtype: torch.dtype
    b_transposed: bool  # True: B given as (tokens x k) row-major with op(B)=T; False: (k x tokens) row-major
    d_order: int
    has_bias: bool
    alg_id: Optional[int] = None  # None = library default
    descs: list = field(default_factory=list)
    matmul_desc: int = 0
    alg_sel: int = 0
    plan: int = 0
    workspace: Optional[torch.Tensor] = None
    bias_buf: Optional[torch.Tensor] = None
    searched: bool = False

    def build(self):
        c = lib()
        m, k, n = self.lay.rows, self.lay.cols, self.n
        dt = _CUDA_DTYPE[self.dtype]
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
        self.matmul_desc = c.matmul_descriptor_init(self.h, OP_N, op_b, a, b, d, d, c.ComputeType.COMPUTE_32F)
        with torch.cuda.device(self.device_index):
            if self.has_bias:
                self.bias_buf = torch.zeros(m, dtype=self.dtype, device="cuda")
                self._bias_ptr = np.array([self.bias_buf.data_ptr()], dtype=np.uint64)
                c.matmul_desc_set_attribute(
                    self.h, self.matmul_desc, c.MatmulDescAttribute.BIAS_POINTER, _ptr(self._bias_ptr), 8
                )
        self.alg_sel = c.matmul_alg_selection_init(self.h, self.matmul_desc, c.MatmulAlg.DEFAULT)
        if self.alg_id is not None:
            v = np.array([self.alg_id], dtype=np.int32)
            c.matmul_alg_set_attribute(self.h, self.alg_sel, c.MatmulAlgAttribute.CONFIG_ID, _ptr(v), 4)
        self.plan = c.matmul_plan_init(self.h, self.matmul_desc, self.alg_sel)
        self._alloc_workspace()
        self.alpha = np.ones(1, dtype=np.float32)
        self.beta = np.zeros(1, dtype=np.float32)
        self.streams = np.zeros(1, dtype=np.uint64)
        # raw pointers once (arr.ctypes.data costs microseconds per access)
        self._alpha_p, self._beta_p, self._streams_p = _ptr(self.alpha), _ptr(self.beta), _ptr(self.streams)
        self._ws_p = self.workspace.data_ptr()
        self._matmul = c.matmul

    def _alloc_workspace(self):
        ws = int(lib().matmul_get_workspace(self.h, self.plan))
        if self.workspace is None or self.workspace.numel() < ws:
            with torch.cuda.device(self.device_index):
                self.workspace = torch.empty(max(ws, 16), dtype=torch.uint8, device="cuda")
        self._ws_p = self.workspace.data_ptr()

    def current_alg(self) -> int:
        c = lib()
        v = np.zeros(1, dtype=np.int32)
        c.matmul_alg_get_attribute(self.h, self.alg_sel, c.MatmulAlgAttribute.CONFIG_ID, _ptr(v), 4)
        return int(v[0])

    def max_alg(self) -> int:
        c = lib()
        v = np.zeros(1, dtype=np.int32)
        c.matmul_alg_get_attribute(self.h, self.alg_sel, c.MatmulAlgAttribute.CONFIG_MAX_ID, _ptr(v), 4)
        return int(v[0])

    def run(self, a_compressed: torch.Tensor, b: torch.Tensor, d: torch.Tensor, bias: Optional[torch.Tensor] = None):
        if self.has_bias:
            self.bias_buf.copy_(bias)  # casts too; fixed address, so graph-capturable
        self.streams[0] = _raw_stream(self.device_index)
        dp = d.data_ptr()
        self._matmul(self.h, self.plan, self._alpha_p, a_compressed.data_ptr(), b.data_ptr(), self._beta_p, dp, dp,
                     self._ws_p, self._streams_p, 1)

    def search(self, a_compressed: torch.Tensor, b: torch.Tensor, d: torch.Tensor):
        """cusparseLtMatmulSearch: times the algorithms and stores the best in the plan."""
        self.streams[0] = _raw_stream(self.device_index)
        # search may need the largest workspace of all algorithms: give it a generous one
        with torch.cuda.device(self.device_index):
            big = torch.empty(max(self.workspace.numel(), 64 << 20), dtype=torch.uint8, device="cuda")
        lib().matmul_search(
            self.h, self.plan, _ptr(self.alpha), a_compressed.data_ptr(), b.data_ptr(), _ptr(self.beta),
            d.data_ptr(), d.data_ptr(), big.data_ptr(), _ptr(self.streams), 1,
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


def _make_plan(key, device_index, lay, n, dtype, b_transposed, d_order, has_bias, alg_id=None) -> GemmPlan:
    p = GemmPlan(key, device_index, _state().handle(device_index), lay, n, dtype, b_transposed, d_order, has_bias,
                 alg_id)
    p.build()
    return p


SEARCH_MODE = os.environ.get("SPARSITY_CSLT_SEARCH", "sweep")  # sweep | library | none

# Algorithm ids that must never be run: on cuSPARSELt 0.8.0 / sm90 some fp16 algorithms die with an illegal
# instruction, which kills the CUDA context (found with sparsity/packing/probe_algs.py; results/bench/NOTES.md).
# Keyed by (arch, cuSPARSELt version, dtype). The sweep runs only where an entry exists (bf16 and fp16 alike), or
# when SPARSITY_CSLT_SEARCH=sweep_unsafe; elsewhere the default algorithm is used.
BAD_ALGS: dict = {
    ("sm90", 800, torch.bfloat16): frozenset(),
    # fp16: ids >= 34 (dgrad) / >= 36 (fwd) died with "illegal instruction" at every shape probed, ids below ran
    # correctly; all ids >= 34 are kept out (results/bench/NOTES.md, "fp16 algorithms")
    ("sm90", 800, torch.float16): frozenset(range(34, 1024)),
}


def _sweep_blocklist(device_index: int, dtype: torch.dtype):
    arch = "sm%d%d" % torch.cuda.get_device_capability(device_index)
    bad = BAD_ALGS.get((arch, version(), dtype))
    if bad is None and SEARCH_MODE == "sweep_unsafe":
        return frozenset()
    return bad



def get_plan(
    out_features: int,
    in_features: int,
    kind: str,
    n: int,
    dtype: torch.dtype,
    device_index: int,
    *,
    b_transposed: bool = True,
    has_bias: bool = False,
    d_order: int = ORDER_COL,
    search: bool = True,
    a_compressed: Optional[torch.Tensor] = None,
    b: Optional[torch.Tensor] = None,
    reference=None,
) -> GemmPlan:
    """The cached plan for this GEMM; built (and its algorithm chosen and checked) on first use.

    Algorithm choice (once per key and process, shared by all threads), `SPARSITY_CSLT_SEARCH`:
      "sweep"   (default) every CONFIG_ID 0..max is built, run once on the given operands and checked against
                `reference()` (the dense masked product, laid out like D: (n x m) for COL); wrong or failing ones
                are skipped (pytorch/pytorch#155333 reports algorithms that give wrong results); the fastest of
                the rest (median of 5, CUDA events) wins.
      "library" cusparseLtMatmulSearch, then the winner is checked once; if wrong, the default algorithm.
                (On the H100 with cuSPARSELt 0.8.0 this failed with an internal error for fp16 and left the
                context broken, so it is not the default.)
      "none"    the library's default algorithm.
    Without operands, or inside CUDA-graph capture (timing would synchronise), the default algorithm is used and
    the choice is not remembered.
    """
    key = (device_index, dtype, kind, out_features, in_features, n, b_transposed, d_order, has_bias)
    st = _state()
    plan = st.plans.get(key)
    if plan is not None:
        return plan
    lay = OperandLayout.for_weight(out_features, in_features, kind)
    args = (key, device_index, lay, n, dtype, b_transposed, d_order, has_bias)
    with _alg_lock:
        choice = _alg_choice.get(key)
    if choice is not None:
        plan = st.plans[key] = _make_plan(*args, choice["alg_id"])
        return plan
    capturing = torch.cuda.is_current_stream_capturing()
    can_search = search and SEARCH_MODE != "none" and not capturing and None not in (a_compressed, b, reference)
    blocklist = _sweep_blocklist(device_index, dtype) if SEARCH_MODE != "library" else frozenset()
    if blocklist is None:
        can_search = False
    plan = _make_plan(*args)
    if not can_search:
        st.plans[key] = plan
        return plan
    default_alg = plan.current_alg()
    record = {"default_alg": default_alg, "mode": SEARCH_MODE}
    d = _empty_d(plan, b.device)
    bias0 = torch.zeros(lay.rows, dtype=dtype, device=b.device) if has_bias else None
    ref = reference()
    if SEARCH_MODE == "library":
        if plan.has_bias:
            plan.bias_buf.zero_()
        plan.search(a_compressed, b, d)
        searched = plan.current_alg()
        plan.run(a_compressed, b, d, bias0)
        err = _rel_err(_d_as_tokens_major(plan, d), ref)
        record.update(searched_alg=searched, search_rel_err=err)
        if not err < 1e-2:
            log.warning("cuSPARSELt searched alg %d gives rel err %.3g for %s: using the default alg %d",
                        searched, err, key, default_alg)
            plan.destroy()
            plan = _make_plan(*args, default_alg)
    else:
        c = lib()
        max_alg = plan.max_alg()
        timings, rejected = {}, {}
        best_plan, best_ms = None, float("inf")
        for alg in range(max_alg + 1):
            if alg in blocklist:
                rejected[alg] = "blocklisted (crashes)"
                continue
            p = plan if alg == default_alg else None
            log.debug("cuSPARSELt sweep %s: trying alg %d", key[1:], alg)
            try:
                if p is None:
                    p = _make_plan(*args, alg)
                p.run(a_compressed, b, d, bias0)
                torch.cuda.synchronize()
                err = _rel_err(_d_as_tokens_major(p, d), ref)
                if not err < 1e-2:
                    rejected[alg] = f"rel err {err:.3g}"
                    raise _Reject()
                ms = median_cuda_ms(lambda: p.run(a_compressed, b, d, bias0), 2, 5)
                timings[alg] = round(ms, 5)
                if ms < best_ms:
                    if best_plan is not None and best_plan is not p:
                        best_plan.destroy()
                    best_plan, best_ms = p, ms
                    continue
            except _Reject:
                pass
            except c.cuSPARSELtError as e:
                rejected[alg] = repr(e)
            if p is not None and p is not best_plan:
                p.destroy()
        if best_plan is None:
            raise BackendUnavailable(f"no cuSPARSELt algorithm gave a correct result for {key}: {rejected}")
        plan = best_plan
        record.update(timings_ms=timings, rejected=rejected, best_ms=best_ms)
        if rejected:
            log.info("cuSPARSELt %s: algorithms rejected %s", key, rejected)
    record["alg_id"] = plan.current_alg()
    with _alg_lock:
        _alg_choice[key] = record
    st.plans[key] = plan
    log.info("cuSPARSELt plan %s: alg %d (default %d)", key[1:], record["alg_id"], default_alg)
    return plan


class _Reject(Exception):
    pass


def plan_records() -> dict:
    with _alg_lock:
        return {str(k): dict(v) for k, v in _alg_choice.items()}


def _empty_d(plan: GemmPlan, device) -> torch.Tensor:
    m, n = plan.lay.rows, plan.n
    if plan.d_order == ORDER_COL:
        return torch.empty(n, m, dtype=plan.dtype, device=device)  # (tokens x m) row-major
    return torch.empty(m, n, dtype=plan.dtype, device=device)


def _d_as_tokens_major(plan: GemmPlan, d: torch.Tensor) -> torch.Tensor:
    return d if plan.d_order == ORDER_COL else d.t()


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
