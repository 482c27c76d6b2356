"""The cuSPARSELt operations as `torch.library` operators: what torch.compile traces of the 2:4
layers call (eager layers call the same Python functions directly).

    sparsity::cslt_mm          x @ W_s^T (+ bias), or x @ W_s, with W_s compressed for cuSPARSELt (no gradient)
    sparsity::cslt_prune_pack  fused prune (tile_greedy, or a given mask) + compression of W and W^T (no gradient),
                               or, with `library`, the library compressor on an already pruned W
    sparsity::cslt_linear      a 2:4 linear layer's forward GEMM with its registered autograd formula: the input
                               gradient on the compressed W_s^T, the straight-through weight gradient dy^T x for
                               the dense weight (or, with `mvue_wgrad`, its MVUE estimate on the 2:4 GEMM), the
                               bias gradient. This is what a compiled graph sees of a sparse layer; eager layers use
                               `sparsity.autograd` instead (no dispatcher overhead).
    sparsity::cslt_mvue_wgrad  dW = MVUE(dy^T) @ x on cuSPARSELt (`wgrad.py`), its seed a device tensor: what the
                               compiled backward of an `mvue_wgrad` layer calls after drawing the seed on the GPU

The fake (meta) implementations take symbolic shapes, so the ops trace under dynamic shapes too; the
real implementations run eagerly at run time (plans are built, and their algorithm checked, at the
first call of a shape). The backend's settings come in as arguments (`search`:
`BackendSettings.cslt_search`; `library`: where the backend packs with the library compressor), so
the ops read no state of their own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sparsity.mvue_grad import SEED_HIGH, TOKEN_BLOCK
from sparsity.packing import layout as L

from ..settings import CSLT_SEARCH_MODES
from .compressor import compress_weight
from .library import (
    TOKEN_MULTIPLE,
    padded_token_count,
)  # cuSPARSELt 0.8 refuses dense operands whose token count is not a multiple of 8
from .search import get_plan
from .wgrad import mvue_weight_grad, row_major_aligned

DEFAULT_SEARCH = CSLT_SEARCH_MODES[0]
SPLIT_MIN_TOKENS = 64  # below this a padded copy of x is cheaper than a second GEMM call


# --------------------------------------------------------------------------------------------------
# GEMMs


def _gemm_impl(
    packed: torch.Tensor,
    x: torch.Tensor,
    bias: torch.Tensor | None,
    out_features: int,
    in_features: int,
    transpose: bool,
    dense_ref: torch.Tensor | None,
    search: str = DEFAULT_SEARCH,
) -> torch.Tensor:
    """transpose=False: x (n, in) -> x @ W^T (+bias) (n, out).  transpose=True: x (n, out) -> x @ W
    (n, in).

    cuSPARSELt needs the token count to be a multiple of 8. A row-major x with n % 8 != 0 (e.g.
    30779 tokens in a DINOv2 step with stochastic depth) is not copied into a padded buffer (a full
    read + write of x, 0.06-0.25 ms at ViT-L sizes): its first n - n % 8 rows go through the GEMM in
    place and the last n % 8 rows through a second, 8-token GEMM on a padded copy of just those
    rows."""
    k_dim = out_features if transpose else in_features
    m_dim = in_features if transpose else out_features
    if x.dim() != 2 or x.shape[1] != k_dim:
        raise ValueError(
            f"cslt_mm: expected a 2-D input with {k_dim} columns, got {tuple(x.shape)}"
        )
    n = x.shape[0]
    if n == 0:
        return torch.zeros(0, m_dim, dtype=x.dtype, device=x.device)
    tail = n % TOKEN_MULTIPLE
    aligned = x.data_ptr() % 16 == 0
    if (
        x.stride(1) == 1
        and x.stride(0) == k_dim
        and aligned
        and (tail == 0 or n >= SPLIT_MIN_TOKENS)
    ):
        y = torch.empty(n, m_dim, dtype=x.dtype, device=x.device)
        main = n - tail
        _gemm_run(
            packed,
            x[:main] if tail else x,
            True,
            y,
            bias,
            out_features,
            in_features,
            transpose,
            dense_ref,
            search,
        )
        if tail:
            xt = x.new_zeros(TOKEN_MULTIPLE, k_dim)
            xt[:tail].copy_(x[main:])
            yt = torch.empty(TOKEN_MULTIPLE, m_dim, dtype=x.dtype, device=x.device)
            _gemm_run(
                packed, xt, True, yt, bias, out_features, in_features, transpose, dense_ref, search
            )
            y[main:].copy_(yt[:tail])
        return y
    # column-major x = row-major x^T: op(B)=N
    if x.stride(0) == 1 and x.stride(1) == n and tail == 0 and aligned:
        y = torch.empty(n, m_dim, dtype=x.dtype, device=x.device)
        _gemm_run(
            packed, x.t(), False, y, bias, out_features, in_features, transpose, dense_ref, search
        )
        return y
    n_pad = padded_token_count(n)  # anything else: a padded row-major copy
    b = (
        x.new_zeros(n_pad, k_dim)
        if n_pad != n
        else torch.empty(n, k_dim, dtype=x.dtype, device=x.device)
    )
    b[:n].copy_(x)
    y = torch.empty(n_pad, m_dim, dtype=x.dtype, device=x.device)
    _gemm_run(packed, b, True, y, bias, out_features, in_features, transpose, dense_ref, search)
    return y if n_pad == n else y[:n]


def _gemm_run(
    packed, b, b_transposed, y, bias, out_features, in_features, transpose, dense_ref, search
) -> None:
    """One cuSPARSELt GEMM into the first rows of y (row-major (>= n, m)); b: (n, k) row-major when
    b_transposed, else (k, n) row-major; n a multiple of 8."""
    kind = "dgrad" if transpose else "fwd"
    n = b.shape[0] if b_transposed else b.shape[1]
    dtype = b.dtype
    dev_index = b.device.index if b.device.index is not None else torch.cuda.current_device()

    def reference():  # the dense masked product, used once per shape to check the chosen algorithm
        if dense_ref is not None:
            w = dense_ref
        elif transpose:
            w = L.unpack_reference(packed, in_features, out_features, "col", dtype).t()
        else:
            w = L.unpack_reference(packed, out_features, in_features, "row", dtype)
        xb = b if b_transposed else b.t()
        return xb @ w if transpose else xb @ w.t()

    plan = get_plan(
        out_features,
        in_features,
        kind,
        n,
        dtype,
        dev_index,
        mode=search,
        b_transposed=b_transposed,
        has_bias=bias is not None,
        a_compressed=packed,
        b=b,
        reference=reference,
    )
    plan.run(packed, b, y, bias)


# The ops are registered with the low-level `torch.library.Library` API rather than
# `torch.library.custom_op`: a compiled step calls them 144 times (48 layers x 3), and custom_op's
# per-call Python layers (dynamo-disable wrapper, backend wrapper, output-alias check) cost more
# host time than the GEMM launch itself.
_LIB = torch.library.Library("sparsity", "FRAGMENT")
_LIB.define(
    "cslt_mm(Tensor packed, Tensor x, Tensor? bias, int out_features, int in_features, bool "
    "transpose, "
    f"Tensor? dense_ref=None, str search='{DEFAULT_SEARCH}') -> Tensor"
)
_LIB.define(
    "cslt_prune_pack(Tensor w, Tensor? mask, bool write_t, bool library=False) -> (Tensor, Tensor, "
    "Tensor)"
)
_LIB.define(
    "cslt_linear(Tensor x, Tensor w, Tensor? bias, Tensor packed, Tensor dgrad, int rows_pad, "
    f"bool dgrad_sparse, Tensor? dense_ref=None, str search='{DEFAULT_SEARCH}', bool "
    f"mvue_wgrad=False) "
    "-> Tensor"
)
_LIB.define(
    f"cslt_mvue_wgrad(Tensor dy, Tensor x, Tensor seed, str search='{DEFAULT_SEARCH}') -> Tensor"
)


def cslt_mm(
    packed: torch.Tensor,
    x: torch.Tensor,
    bias: torch.Tensor | None,
    out_features: int,
    in_features: int,
    transpose: bool,
    dense_ref: torch.Tensor | None = None,
    search: str = DEFAULT_SEARCH,
) -> torch.Tensor:
    """`sparsity::cslt_mm`: cuSPARSELt 2:4 GEMM with W (out x in) compressed for it: x @ W^T + bias,
    or x @ W when transpose. `dense_ref`: the pruned W dense, only read the first time a shape is
    seen (to check the chosen algorithm); when None it is rebuilt from `packed` with the known
    layout. `search`: how a new shape's algorithm is chosen (`BackendSettings.cslt_search`)."""
    return _gemm_impl(packed, x, bias, out_features, in_features, transpose, dense_ref, search)


_LIB.impl("cslt_mm", cslt_mm, "CUDA")


@torch.library.register_fake("sparsity::cslt_mm", lib=_LIB)
def _(packed, x, bias, out_features, in_features, transpose, dense_ref=None, search=DEFAULT_SEARCH):
    return x.new_empty(x.shape[0], in_features if transpose else out_features)


def mm(packed, x, bias, out_features, in_features, transpose, ref, search=DEFAULT_SEARCH):
    """cslt_mm for eager callers: skips the custom-op dispatch (tens of microseconds of host time
    per call)."""
    if torch.compiler.is_compiling():
        return torch.ops.sparsity.cslt_mm(
            packed, x, bias, out_features, in_features, transpose, ref, search
        )
    return _gemm_impl(packed, x, bias, out_features, in_features, transpose, ref, search)


# --------------------------------------------------------------------------------------------------
# prune + pack


def compressed_size(rows, cols):
    """`layout.compressed_size` for symbolic sizes too (no shape check here: the kernel checks)."""

    def ceil(a, b):
        return (a + b - 1) // b * b

    return (
        rows * cols
        + torch.sym_max(ceil(rows, 64) * ceil(cols, 32), ceil(rows, 32) * ceil(cols, 64)) // 8
    )


def cslt_prune_pack(
    w: torch.Tensor, mask: torch.Tensor | None, write_t: bool, library: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`sparsity::cslt_prune_pack`: prune (tile_greedy, or keep `mask`) and compress W (rows, cols)
    for both GEMMs: (fwd bytes, dgrad bytes or an empty tensor, tile bits (rows/4, cols/4) int16).
    With `library` (where the backend packs with the library compressor: a cuSPARSELt layout not
    validated here, `packing.layout_status`), `w` must already hold the pruned values and the tile
    bits are not computed."""
    return prune_pack(w, mask, write_t, library)


_LIB.impl("cslt_prune_pack", cslt_prune_pack, "CUDA")


@torch.library.register_fake("sparsity::cslt_prune_pack", lib=_LIB)
def _(w, mask, write_t, library=False):
    rows, cols = w.shape
    size = compressed_size(rows, cols)
    return (
        w.new_empty(size, dtype=torch.uint8),
        w.new_empty(size if write_t else 0, dtype=torch.uint8),
        w.new_empty(rows // 4, cols // 4, dtype=torch.int16),
    )


def prune_pack(w, mask, write_t, library=False):
    """cslt_prune_pack's implementation (eager callers use it directly, without the dispatcher)."""
    if library:
        rows, cols = w.shape
        fwd = compress_weight(w, "fwd")
        dgrad = compress_weight(w, "dgrad") if write_t else w.new_empty(0, dtype=torch.uint8)
        return fwd, dgrad, w.new_empty(rows // 4, cols // 4, dtype=torch.int16)
    # Triton (an optional dependency on CPU) is imported by the kernel modules, on first use
    from sparsity.kernels.pack_cusparselt import prune_pack as kernel

    pk = kernel(w, mask, write_t=write_t)
    return (
        pk.fwd,
        pk.dgrad if pk.dgrad is not None else w.new_empty(0, dtype=torch.uint8),
        pk.tile_bits,
    )


# --------------------------------------------------------------------------------------------------
# the linear layer as one differentiable op


def cslt_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    packed: torch.Tensor,
    dgrad: torch.Tensor,
    rows_pad: int,
    dgrad_sparse: bool,
    dense_ref: torch.Tensor | None = None,
    search: str = DEFAULT_SEARCH,
    mvue_wgrad: bool = False,
) -> torch.Tensor:
    """`sparsity::cslt_linear`: y = x @ W_s^T + bias (tokens, out) in x's dtype, W_s (out, in) given
    compressed in `packed` (rows zero-padded to `rows_pad`). `w` (out, in) is not read: it is the
    tensor the straight-through weight gradient dy^T x is returned for. `dgrad`: W_s^T compressed
    (`dgrad_sparse`) or W_s dense (out, in) for a dense input gradient. `bias` may be in any float
    dtype (the plan's copy casts it). `dense_ref`: the padded pruned W, needed only where the
    library compressor packs (its layout cannot be decoded here to check a new plan's algorithm).
    `search`: `BackendSettings.cslt_search`. `mvue_wgrad`: the weight gradient is MVUE(dy^T) @ x on
    the 2:4 GEMM (`sparsity.mvue_grad`), its seed drawn from torch's CUDA generator in the
    backward."""
    out_features, in_features = w.shape
    if bias is not None and rows_pad != out_features:
        bias = F.pad(bias, (0, rows_pad - out_features))
    y = _gemm_impl(packed, x, bias, rows_pad, in_features, False, dense_ref, search)
    return y if rows_pad == out_features else y[:, :out_features].contiguous()


_LIB.impl("cslt_linear", cslt_linear, "CUDA")


@torch.library.register_fake("sparsity::cslt_linear", lib=_LIB)
def _(
    x,
    w,
    bias,
    packed,
    dgrad,
    rows_pad,
    dgrad_sparse,
    dense_ref=None,
    search=DEFAULT_SEARCH,
    mvue_wgrad=False,
):
    return x.new_empty(x.shape[0], w.shape[0])


def cslt_mvue_wgrad(
    dy: torch.Tensor, x: torch.Tensor, seed: torch.Tensor, search: str = DEFAULT_SEARCH
) -> torch.Tensor:
    """`sparsity::cslt_mvue_wgrad`: MVUE(dy^T) @ x (out x in) in dy's dtype, as `sparsity.mvue_grad`
    defines it (whole blocks of 64 tokens pruned, the rest exact), on cuSPARSELt; `seed`: one int64
    on dy's device. Operands the GEMM cannot read in place (x not row-major or not 16-byte aligned,
    out % 16 != 0) are copied first."""
    tokens, out = dy.shape
    if tokens < TOKEN_BLOCK:
        return dy.t() @ x  # nothing to prune: exact, as the estimator says
    pad = -out % 16
    dyp = F.pad(dy, (0, pad)) if pad else dy
    if not row_major_aligned(x):
        x = x.clone(memory_format=torch.contiguous_format)
    dw = mvue_weight_grad(dyp, x, seed, search)
    return dw[:out] if pad else dw


_LIB.impl("cslt_mvue_wgrad", cslt_mvue_wgrad, "CUDA")


@torch.library.register_fake("sparsity::cslt_mvue_wgrad", lib=_LIB)
def _(dy, x, seed, search=DEFAULT_SEARCH):
    return dy.new_empty(dy.shape[1], x.shape[1])


def _linear_setup_context(ctx, inputs, output):
    x, w, bias, packed, dgrad, rows_pad, dgrad_sparse, dense_ref, search, mvue_wgrad = inputs
    ctx.save_for_backward(x, dgrad, dense_ref)
    ctx.meta = (
        w.shape,
        w.dtype,
        None if bias is None else bias.dtype,
        rows_pad,
        dgrad_sparse,
        search,
        mvue_wgrad,
    )


def _linear_backward(ctx, dy):
    x, dgrad, dense_ref = ctx.saved_tensors
    (out_features, in_features), w_dtype, b_dtype, rows_pad, dgrad_sparse, search, mvue_wgrad = (
        ctx.meta
    )
    dx = dw = db = None
    if ctx.needs_input_grad[0]:
        if dgrad_sparse:
            dyp = dy if rows_pad == out_features else F.pad(dy, (0, rows_pad - out_features))
            dx = torch.ops.sparsity.cslt_mm(
                dgrad, dyp, None, rows_pad, in_features, True, dense_ref, search
            )
        else:
            dx = dy @ dgrad
    if ctx.needs_input_grad[1]:
        # the seed drawn on the GPU: reproducible from torch's CUDA generator, capturable in a graph
        if mvue_wgrad:
            seed = torch.randint(0, SEED_HIGH, (1,), device=dy.device)
            dw = torch.ops.sparsity.cslt_mvue_wgrad(dy, x, seed, search).to(w_dtype)
        else:
            dw = (dy.t() @ x).to(w_dtype)
    if ctx.needs_input_grad[2]:
        db = dy.sum(0).to(b_dtype)
    return dx, dw, db, None, None, None, None, None, None, None


torch.library.register_autograd(
    "sparsity::cslt_linear", _linear_backward, setup_context=_linear_setup_context, lib=_LIB
)
