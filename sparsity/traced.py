"""The 2:4 linear layers as torch.compile traces them: tensor ops and opaque custom ops, nothing
else.

Eager calls go through the autograd Functions of `sparsity.autograd` (tuned for host time). Inside a
torch.compile trace, `semi_sparse_linear` / `semi_sparse_activation_linear` route here, where the
same math is written so that the compiler sees all of it (no Python object crosses forward ->
backward, no context manager, no host decision at run time, symbolic shapes accepted):

- dense math (backend `dense`; `cutlass`, whose torch ops do not trace; every backend on a CPU): the
  pruned weight from the custom op `sparsity::prune`, a straight-through weight W_ste = W_s + (W -
  W.detach()) (times the mask with `masked_grad`), then `F.linear`: the compiler fuses the casts,
  the straight-through sum and the bias;
- `cusparselt`: `sparsity::cslt_prune_pack` (fused prune + compression of W and W^T), then
  `sparsity::cslt_linear`, whose registered autograd formula runs the input gradient on the
  compressed W^T and returns dy^T x for W (with `weight_grad="mvue24"`, its MVUE estimate on the 2:4
  GEMM, seeded on the GPU: the only way that option compiles, so an `auto` layer with it runs on
  cuSPARSELt);
- `auto`: its per-shape choice is made once, while the graph is traced, never inside it
  (`AutoBackend.choice_for_trace`, timing both ways on the GPU if the shape is new), and is a
  constant of the graph: no guard, no recompile. Logged and listed in `describe()` like the eager
  decisions. Under dynamic shapes an `auto` layer's graph is specialized on its token count (the
  choice is per count).

Activation sparsity (`semi_sparse_activation_linear`) runs the dense math under torch.compile on
every backend.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sparsity.backends import get_backend
from sparsity.backends.cusparselt.library import padded_token_count
from sparsity.backends.dense import dense_sparsify
from sparsity.pruning import is_transposable, prune

# --------------------------------------------------------------------------------------------------
# pruning as an opaque op (Triton kernels on CUDA, the torch references elsewhere)


@torch.library.custom_op("sparsity::prune", mutates_args=())
def prune_op(w: torch.Tensor, method: str, with_mask: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(pruned values in w.dtype, bool mask, or an empty bool tensor when `with_mask` is False)."""
    # the fused kernel's dense-output mode where it applies
    if not with_mask and method == "tile_greedy":
        return dense_sparsify(w, method).to_dense(), torch.empty(
            0, dtype=torch.bool, device=w.device
        )
    values, mask = prune(w, method)
    return values, mask if with_mask else torch.empty(0, dtype=torch.bool, device=w.device)


@prune_op.register_fake
def _(w, method, with_mask):
    return torch.empty_like(w), w.new_empty(w.shape if with_mask else (0,), dtype=torch.bool)


def _straight_through(values: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """values in the forward pass, identity gradient to w (w - w.detach() is exactly 0, so values
    are unchanged)."""
    return values + (w - w.detach())


# --------------------------------------------------------------------------------------------------
# which way a layer runs: decided at trace time, a constant of the graph


@torch._dynamo.assume_constant_result
def _path(
    backend: str,
    pruning: str,
    device: str,
    dtype: str,
    out_features: int,
    in_features: int,
    tokens: int,
    has_bias: bool,
) -> str:
    """ "dense", "cusparselt" or "cusparselt-library" (cuSPARSELt with the library compressor). Runs
    as plain Python when the graph is traced, never in it; raises `BackendUnavailable` as the eager
    layer would."""
    dev, dt = torch.device(device), getattr(torch, dtype)
    if backend == "auto":
        choice = get_backend("auto").choice_for_trace(
            dev, dt, out_features, in_features, tokens, pruning, has_bias
        )
        if choice == "dense":
            return "dense"
    elif backend != "cusparselt":
        return "dense"
    cs = get_backend("cusparselt")
    cs.check(dev, dt)
    cs.check_shape(out_features, in_features, pruning)
    return "cusparselt" if cs.layout_status(dev, dt)["pack"] == "triton" else "cusparselt-library"


@torch._dynamo.assume_constant_result
def _cslt_search() -> str:
    """How the cuSPARSELt GEMMs choose a new shape's algorithm: the `cusparselt` backend's setting
    (a constant of the graph, passed to the ops)."""
    return get_backend("cusparselt").settings.cslt_search


def _specialized(n) -> int:
    """n as a Python int. Under dynamic shapes this specializes the graph on n (a guard; each new
    value compiles its own graph): auto's choice is per token count, so a layer with backend `auto`
    cannot be shape-polymorphic. (Dynamo keeps int(n) symbolic; building a list of length n is what
    makes it concrete.)"""
    return len([None] * n)


def _rows(x: torch.Tensor, features: int, dtype: torch.dtype) -> torch.Tensor:
    x2 = x.reshape(-1, features)
    return x2 if x2.dtype == dtype else x2.to(dtype)


# --------------------------------------------------------------------------------------------------
# weight-sparse linear


def semi_sparse_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    backend: str,
    pruning: str,
    masked_grad: bool,
    scale: torch.Tensor | None,
    dtype: torch.dtype,
    weight_grad: str = "dense",
) -> torch.Tensor:
    """The traced form of `sparsity.autograd.semi_sparse_linear` (same arguments, resolved)."""
    out_f, in_f = weight.shape
    x2 = _rows(x, in_f, dtype)
    w = weight if weight.dtype == dtype else weight.to(dtype)
    mvue = weight_grad == "mvue24"
    if mvue:
        backend = _mvue_backend(backend, x.device)
    tokens = (
        _specialized(x2.shape[0]) if backend == "auto" else 0
    )  # auto's choice is per token count
    path = _path(
        backend,
        pruning,
        str(x.device),
        str(dtype).replace("torch.", ""),
        out_f,
        in_f,
        tokens,
        bias is not None,
    )
    if path == "dense":
        y = _dense(x2, w, bias, pruning, masked_grad, scale)
    else:
        y = _cusparselt(
            x2,
            w,
            bias,
            pruning,
            masked_grad,
            scale,
            library=path == "cusparselt-library",
            mvue=mvue,
        )
    return y.reshape(*x.shape[:-1], out_f)


def _mvue_backend(backend: str, device: torch.device) -> str:
    """The backend an MVUE layer compiles on: cuSPARSELt (its GEMM takes a seed drawn on the GPU),
    else refused."""
    if backend not in ("cusparselt", "auto") or device.type != "cuda":
        raise NotImplementedError(
            f"weight_grad='mvue24' compiles only on cuSPARSELt (backend cusparselt or auto, on a "
            f"CUDA GPU), not "
            f"backend {backend!r} on {device.type}: set train.compile=false to run it eagerly"
        )
    return "cusparselt"


def _dense(x2, w, bias, pruning, masked_grad, scale):
    values, mask = torch.ops.sparsity.prune(w.detach(), pruning, masked_grad)
    w_ste = _straight_through(values, w * mask if masked_grad else w)
    if scale is None:
        return F.linear(x2, w_ste, None if bias is None else bias.to(x2.dtype))
    y = F.linear(x2, w_ste) * scale
    return y if bias is None else y + bias.to(x2.dtype)


# cuSPARSELt takes token counts that are multiples of 8. Zero rows appended to x spare the GEMM op its
# tail handling (a second GEMM on the last n % 8 rows, copies, host time); their gradients are zero,
# so dx, dW, db are unchanged. Padded by a concatenation and unpadded by a split, not F.pad and a
# slice: the slice's gradient is a slice_scatter, which the compiler does not fuse with a
# concatenation, so on a block's one matrix of all crop batches the output gradient (the crop
# batches' gradients concatenated) was written out and copied again; the split's gradient is a
# concatenation, and nested concatenations land in one buffer. On one H200, one ViT-L block with
# its MLP and attention linears on 2:4: 0.22 ms faster a block (results/bench/NOTES.md, "The rows
# padded by concatenation: the probe measured").


def _pad_rows(x2: torch.Tensor, pad: int) -> torch.Tensor:
    return torch.cat([x2, x2.new_zeros(pad, x2.shape[1])])


def _unpad_rows(y: torch.Tensor, tokens: int) -> torch.Tensor:
    return y.split([tokens, y.shape[0] - tokens])[0]


def _cusparselt(x2, w, bias, pruning, masked_grad, scale, library: bool, mvue: bool = False):
    out_f, in_f = w.shape
    rows_pad = -(-out_f // 16) * 16
    wd = w.detach()
    if rows_pad != out_f:
        wd = F.pad(wd, (0, 0, 0, rows_pad - out_f))
    transposable = is_transposable(pruning)
    # W^T is packed only where an input gradient can be asked for: the EMA teacher (no grad) packs W
    # alone. Both are trace-time facts, guarded by dynamo like every grad-mode and requires_grad it
    # reads.
    needs_dx = torch.is_grad_enabled() and x2.requires_grad
    ref = None
    if pruning == "tile_greedy" and not library:
        fwd, dgrad, bits = torch.ops.sparsity.cslt_prune_pack(wd, None, needs_dx)
        mask = None
        if masked_grad:
            # Triton (an optional dependency on CPU) is imported by the kernel modules, on first use
            from sparsity.kernels.pack_cusparselt import tile_bits_to_mask

            mask = tile_bits_to_mask(bits)[:out_f]
    else:
        values, mask = torch.ops.sparsity.prune(wd, pruning, True)
        fwd, dgrad, _ = torch.ops.sparsity.cslt_prune_pack(
            values, mask, transposable and needs_dx, library
        )
        mask = mask[:out_f]
        if not transposable:
            dgrad = values[:out_f]
        if library:
            ref = values
    w_grad = w * mask if masked_grad else w
    tokens = x2.shape[0]
    pad = padded_token_count(tokens) - tokens
    if pad:
        x2 = _pad_rows(x2, pad)
    y = torch.ops.sparsity.cslt_linear(
        x2,
        w_grad,
        bias if scale is None else None,
        fwd,
        dgrad,
        rows_pad,
        transposable,
        ref,
        _cslt_search(),
        mvue,
    )
    if pad:
        y = _unpad_rows(y, tokens)
    if scale is None:
        return y
    y = y * scale
    return y if bias is None else y + bias.to(y.dtype)


# --------------------------------------------------------------------------------------------------
# activation-sparse linear


def semi_sparse_activation_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    pruning: str,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The traced form of `sparsity.autograd.semi_sparse_activation_linear` (dense math on the
    pruned input)."""
    out_f, in_f = weight.shape
    x2 = _rows(x, in_f, dtype)
    w = weight if weight.dtype == dtype else weight.to(dtype)
    values, _ = torch.ops.sparsity.prune(x2.detach(), pruning, False)
    y = F.linear(_straight_through(values, x2), w, None if bias is None else bias.to(dtype))
    return y.reshape(*x.shape[:-1], out_f)
