"""Weight gradient of a linear layer in one cuBLASLt call: dW = dy^T @ x with the bias gradient db =
sum_tokens dy computed by the same cuBLASLt call (epilogue BGRADB or BGRADA), both written straight
in the master weights' dtype (fp32).

Why: under autocast the stock backward of a linear layer runs the weight-gradient GEMM in bf16,
casts dW to the fp32 master dtype, reduces dy for the bias gradient and casts db: four kernels and
four host-side ops. Here it is one call; on the H100 (cuBLASLt 13, results/bench/NOTES.md, "Linear
forward + backward and the MLP block") the bias gradient still runs as a separate cuBLASLt reduction
kernel (`globalKernelBgradAB`), so the gain is the casts and the launches, not the read of dy. It
wins for fc2 of a ViT-L MLP (out = 1024: 0.39 vs 0.43 ms at 32k tokens) and loses for fc1 (out =
4096: 0.48-0.50 vs 0.48 ms), which is why every shape is timed against the torch ops before it is
used.

Layout (cuBLASLt is column-major), formulation "dW+BGRADB": D (in x out, ld = in) = dW row-major
(out x in); op(A) = x^T, A = x's memory (tokens x in row-major = in x tokens column-major, op N);
op(B) = dy, B = dy's memory (out x tokens column-major, op T); k = tokens; BGRADB reduces B over k:
a vector of length out = db. The other formulation ("dWT+BGRADA") swaps A and B and writes dW^T (see
`_Plan`).

Called by the autograd function of a weight-sparse layer (`sparsity.autograd`) when its backend's
settings allow it (`BackendSettings.fused_wgrad`, the config's `sparsity.fused_wgrad`).
`weight_bias_grad` returns None wherever this path cannot run (CPU, no nvmath/cuBLASLt, a dtype
combination the heuristic has no algorithm for, a result that fails its one-time check against the
torch path, or a fused call slower than the torch path on this GPU): the caller then runs the torch
ops. Each (shape, dtypes, device) is decided once, outside CUDA-graph capture (a key first seen
during capture uses the torch path until an eager call decides); decisions are kept for the run log
(`decisions()`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import numpy as np
import torch

from sparsity.backends.base import cast
from sparsity.backends.cuda import raw_stream, rel_err
from sparsity.backends.timing import median_cuda_ms

log = logging.getLogger(__name__)

_CUDA_DTYPE = {torch.float16: 2, torch.bfloat16: 14, torch.float32: 0}
COMPUTE_32F = 68  # cublasComputeType_t CUBLAS_COMPUTE_32F
OP_N, OP_T = 0, 1
ALIGN = 16  # bytes; operands are copied when their pointers are less aligned than this
WORKSPACE_BYTES = 32 << 20
# the winners on the H100 were always among the heuristic's first four (results/bench/NOTES.md)
N_HEURISTICS = 4

_lt = None
_load_error: str | None = None
_lock = threading.Lock()
_decisions: dict = {}  # key -> record (shared across threads; plans themselves are thread-local)


def _lib():
    """nvmath's cuBLASLt bindings, or None (reason kept in `_load_error`)."""
    global _lt, _load_error, _BIAS_POINTER
    if _lt is not None or _load_error is not None:
        return _lt
    with _lock:
        if _lt is None and _load_error is None:
            try:
                # nvmath-python is an optional dependency (the `gpu` extra): imported on the first
                # CUDA call, so that this module imports without it (the torch ops are used then)
                from nvmath.bindings import cublasLt  # noqa: PLC0415

                cublasLt.get_version()
                _BIAS_POINTER = int(cublasLt.MatmulDescAttribute.BIAS_POINTER)
                _lt = cublasLt
            except Exception as e:  # noqa: BLE001 -- ImportError, or the library cannot be loaded
                _load_error = f"cuBLASLt through nvmath unavailable: {e!r}"
                log.info("fused weight gradient off: %s", _load_error)
    return _lt


def _attr(setter, obj, attr, value, dtype) -> np.ndarray:
    buf = np.array([value], dtype=dtype)
    setter(obj, attr, buf.ctypes.data, buf.itemsize)
    return buf


@dataclass
class _Plan:
    """One way to run the fused weight-gradient GEMM of a shape: descriptors, one heuristic
    algorithm, workspace.

    Two formulations (`transposed`):
      False  D = dW (out x in row-major = in x out column-major): A = x (op N), B = dy (op T), BGRADB reduces dy.
      True   D = dW^T memory (out x in column-major): A = dy (op N), B = x (op T), BGRADA reduces dy; the
             gradient is returned as a transposed view (autograd copies it to the parameter's layout).
    cuBLASLt's kernels for the two differ in speed with the shape (fc1 vs fc2 of a ViT MLP), so both
    are timed."""

    handle: int
    desc: int
    layouts: tuple  # (A, B, C = D)
    heuristic: object  # cublasLt.MatmulHeuristicResult array, kept alive: algo_ptr points into it
    algo_ptr: int
    workspace: torch.Tensor
    has_bias: bool
    out_dtype: torch.dtype
    transposed: bool
    index: int  # position in the heuristic's list

    @property
    def label(self) -> str:
        return f"{'dWT+BGRADA' if self.transposed else 'dW+BGRADB'}#{self.index}"

    def __post_init__(self):
        # everything a call needs that does not change, as plain ints (numpy's .ctypes.data costs
        # microseconds)
        self._bias_ptr = np.zeros(1, dtype=np.uint64)
        self._bias_ptr_p = self._bias_ptr.ctypes.data
        self._ws = (self.workspace.data_ptr(), self.workspace.numel())
        self._device = self.workspace.device
        self._device_index = self._device.index

    def __call__(
        self, dy: torch.Tensor, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        lt = _lt
        out_f, in_f = dy.shape[1], x.shape[1]
        d = torch.empty(
            (in_f, out_f) if self.transposed else (out_f, in_f),
            dtype=self.out_dtype,
            device=self._device,
        )
        db = None
        if self.has_bias:
            db = torch.empty(out_f, dtype=self.out_dtype, device=self._device)
            self._bias_ptr[0] = db.data_ptr()
            lt.matmul_desc_set_attribute(self.desc, _BIAS_POINTER, self._bias_ptr_p, 8)
        a, b = (dy, x) if self.transposed else (x, dy)
        la, lb, ld = self.layouts
        dp = d.data_ptr()
        lt.matmul(
            self.handle,
            self.desc,
            _ONE_P,
            a.data_ptr(),
            la,
            b.data_ptr(),
            lb,
            _ZERO_P,
            dp,
            ld,
            dp,
            ld,
            self.algo_ptr,
            self._ws[0],
            self._ws[1],
            raw_stream(self._device_index),
        )
        return (d.t() if self.transposed else d), db


_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)
_ONE_P, _ZERO_P = _ONE.ctypes.data, _ZERO.ctypes.data
_BIAS_POINTER = None  # lt.MatmulDescAttribute.BIAS_POINTER, set when the library loads


class _ThreadState(threading.local):
    def __init__(self):
        self.handles: dict = {}
        self.workspaces: dict = {}
        self.plans: dict = {}


_tls = _ThreadState()


def _candidates(
    dev: int,
    dtype: torch.dtype,
    n: int,
    in_f: int,
    out_f: int,
    out_dtype: torch.dtype,
    has_bias: bool,
    transposed: bool,
) -> list:
    """The heuristic's algorithms (best first) for one formulation, as runnable plans."""
    lt = _lt
    st = _tls
    if dev not in st.handles:
        with torch.cuda.device(dev):
            st.handles[dev] = lt.create()
            st.workspaces[dev] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    h, ws = st.handles[dev], st.workspaces[dev]
    desc = lt.matmul_desc_create(COMPUTE_32F, _CUDA_DTYPE[torch.float32])
    A = lt.MatmulDescAttribute
    _attr(lt.matmul_desc_set_attribute, desc, A.TRANSA, OP_N, np.int32)
    _attr(lt.matmul_desc_set_attribute, desc, A.TRANSB, OP_T, np.int32)
    if has_bias:
        epilogue = lt.Epilogue.BGRADA if transposed else lt.Epilogue.BGRADB
        _attr(lt.matmul_desc_set_attribute, desc, A.EPILOGUE, epilogue, np.uint32)
        _attr(
            lt.matmul_desc_set_attribute, desc, A.BIAS_DATA_TYPE, _CUDA_DTYPE[out_dtype], np.int32
        )
    x_layout = lt.matrix_layout_create(
        _CUDA_DTYPE[dtype], in_f, n, in_f
    )  # x as (in x tokens) column-major
    dy_layout = lt.matrix_layout_create(
        _CUDA_DTYPE[dtype], out_f, n, out_f
    )  # dy as (out x tokens) column-major
    if transposed:
        layouts = (
            dy_layout,
            x_layout,
            lt.matrix_layout_create(_CUDA_DTYPE[out_dtype], out_f, in_f, out_f),
        )
    else:
        layouts = (
            x_layout,
            dy_layout,
            lt.matrix_layout_create(_CUDA_DTYPE[out_dtype], in_f, out_f, in_f),
        )
    pref = lt.matmul_preference_create()
    P = lt.MatmulPreferenceAttribute
    _attr(
        lt.matmul_preference_set_attribute, pref, P.MAX_WORKSPACE_BYTES, WORKSPACE_BYTES, np.uint64
    )
    for name in (
        "MIN_ALIGNMENT_A_BYTES",
        "MIN_ALIGNMENT_B_BYTES",
        "MIN_ALIGNMENT_C_BYTES",
        "MIN_ALIGNMENT_D_BYTES",
    ):
        _attr(lt.matmul_preference_set_attribute, pref, getattr(P, name), ALIGN, np.uint32)
    results = lt.MatmulHeuristicResult(N_HEURISTICS)
    count = np.zeros(1, dtype=np.int32)
    try:
        lt.matmul_algo_get_heuristic(
            h,
            desc,
            layouts[0],
            layouts[1],
            layouts[2],
            layouts[2],
            pref,
            N_HEURISTICS,
            results.ptr,
            count.ctypes.data,
        )
    except lt.cuBLASLtError as e:
        log.info(
            "fused weight gradient: no cuBLASLt algorithm for %s: %r",
            (n, in_f, out_f, dtype, transposed),
            e,
        )
        count[0] = 0
    finally:
        lt.matmul_preference_destroy(pref)
    itemsize = (
        lt.matmul_heuristic_result_dtype.itemsize
    )  # each result starts with its cublasLtMatmulAlgo_t
    return [
        _Plan(
            h,
            desc,
            layouts,
            results,
            results.ptr + i * itemsize,
            ws,
            has_bias,
            out_dtype,
            transposed,
            i,
        )
        for i in range(int(count[0]))
    ]


def _torch_grads(dy2, x2, w_dtype, b_dtype) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    dw = None if w_dtype is None else (dy2.t() @ x2).to(w_dtype)
    db = None if b_dtype is None else dy2.sum(0).to(b_dtype)
    return dw, db


def _rowmajor(t: torch.Tensor) -> torch.Tensor:
    if t.stride(1) == 1 and t.stride(0) == t.shape[1] and t.data_ptr() % ALIGN == 0:
        return t
    return t.contiguous() if not t.is_contiguous() else t.clone()


def weight_bias_grad(
    dy2: torch.Tensor, x2: torch.Tensor, w_dtype: torch.dtype, b_dtype: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(dy^T @ x in w_dtype, dy.sum(0) in b_dtype or None) from one fused cuBLASLt GEMM, or None if
    this path does not apply here (the caller then runs `dy2.t() @ x2` and `dy2.sum(0)`).

    dy2 (tokens x out) and x2 (tokens x in): CUDA, same 16-bit dtype. w_dtype: the weight's dtype
    (the GEMM writes it directly when it is fp32 or the compute dtype). b_dtype: the bias's dtype,
    or None for no bias gradient."""
    if not (dy2.is_cuda and dy2.dtype in (torch.float16, torch.bfloat16) and x2.dtype == dy2.dtype):
        return None
    out_dtype = torch.float32 if w_dtype == torch.float32 else dy2.dtype
    if w_dtype not in (torch.float32, dy2.dtype) or (
        b_dtype is not None and b_dtype not in (out_dtype, dy2.dtype)
    ):
        return None
    if dy2.shape[0] == 0 or _lib() is None:
        return None
    n, out_f = dy2.shape
    in_f = x2.shape[1]
    dev = dy2.device.index if dy2.device.index is not None else torch.cuda.current_device()
    has_bias = b_dtype is not None
    key = (dev, dy2.dtype, n, in_f, out_f, out_dtype, has_bias)
    rec = _decisions.get(key)
    if rec is not None and not rec["fused"]:
        return None
    if rec is None and (torch.cuda.is_current_stream_capturing() or torch.compiler.is_compiling()):
        return None  # decide on an eager call: the check and the timing synchronise
    dy2, x2 = _rowmajor(dy2), _rowmajor(x2)
    if rec is None:
        rec = _first_call(key, dy2, x2, w_dtype, b_dtype)
        if not rec["fused"]:
            return None
    plan = _tls.plans.get(key)
    # decided in another thread (autograd runs backward in its own): the same algorithm here
    if plan is None:
        cands = _candidates(*key, transposed=rec["transposed"])
        plan = _tls.plans[key] = cands[rec["index"]] if rec["index"] < len(cands) else cands[0]
    dw, db = plan(dy2, x2)  # dw already in w_dtype (the plan's output dtype); db may need a cast
    return dw, cast(db, b_dtype)


def _first_call(key, dy2, x2, w_dtype, b_dtype) -> dict:
    """Once per key: run every candidate (both formulations, the heuristic's algorithms), check each
    against the torch ops, time the correct ones and the torch ops, keep the fastest (recorded with
    all timings)."""
    with _lock:
        rec = _decisions.get(key)
        if rec is not None:
            return rec
        ref_w, ref_b = _torch_grads(
            dy2, x2, torch.float32, torch.float32 if b_dtype is not None else None
        )
        timings, rejected = {}, {}
        best, best_ms = None, float("inf")
        for transposed in (False, True):
            for plan in _candidates(*key, transposed=transposed):
                try:
                    dw, db = plan(dy2, x2)
                    torch.cuda.synchronize()
                except _lt.cuBLASLtError as e:
                    rejected[plan.label] = repr(e)
                    continue
                err_w, err_b = rel_err(dw, ref_w), (0.0 if db is None else rel_err(db, ref_b))
                if not (err_w < 1e-2 and err_b < 1e-2):
                    rejected[plan.label] = f"rel err dW {err_w:.3g}, db {err_b:.3g}"
                    continue
                # a transposed gradient is copied to the parameter's layout by autograd: part of its
                # cost
                ms = median_cuda_ms(lambda: plan(dy2, x2)[0].contiguous(), 2, 5)
                timings[plan.label] = round(ms, 4)
                if ms < best_ms:
                    best, best_ms = plan, ms
        if best is None:
            if rejected:
                log.warning(
                    "fused weight gradient %s: every cuBLASLt candidate failed: %s", key, rejected
                )
            return _decide(key, False, reason="no correct cuBLASLt algorithm", rejected=rejected)
        torch_ms = median_cuda_ms(lambda: _torch_grads(dy2, x2, w_dtype, b_dtype), 2, 7)
        fused = best_ms <= torch_ms
        if fused:
            _tls.plans[key] = best
        return _decide(
            key,
            fused,
            choice=best.label,
            transposed=best.transposed,
            index=best.index,
            fused_ms=round(best_ms, 4),
            torch_ms=round(torch_ms, 4),
            candidates_ms=timings,
            rejected=rejected,
        )


def _decide(key, fused: bool, **info) -> dict:
    rec = {"fused": fused, **info}
    _decisions[key] = rec
    dev, dtype, n, in_f, out_f, out_dtype, has_bias = key
    log.info(
        "weight gradient tokens=%d in=%d out=%d %s->%s bias=%s: %s %s",
        n,
        in_f,
        out_f,
        dtype,
        out_dtype,
        has_bias,
        f"fused cuBLASLt {info.get('choice')}" if fused else "torch ops",
        info,
    )
    return rec


def decisions() -> list:
    """Every decision so far, for the run log."""
    with _lock:
        items = list(_decisions.items())
    return [
        {
            "tokens": k[2],
            "in_features": k[3],
            "out_features": k[4],
            "dtype": str(k[1]).replace("torch.", ""),
            "out_dtype": str(k[5]).replace("torch.", ""),
            "bias": k[6],
            **v,
        }
        for k, v in items
    ]
