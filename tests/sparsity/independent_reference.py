"""An independent reference of torchao's `SemiSparseLinear` (torchao/sparsity/training, since
deleted upstream), written from the published semantics alone: pure torch, nothing imported from
this repository (not `sparsity`, `models`, `training`, ...), so that `test_independent_reference.py`
(masks, layer) and `test_independent_reference_training.py` (whole training runs) compare the
repository's 2:4 layers and its trainer against code that shares none of their implementation.

What torchao published (torchao/sparsity/training/{__init__,autograd}.py and torch core's
aten/src/ATen/native/sparse/cuda/{ComputeSparseTile.h,StaticSort.h,SparseSemiStructuredPack.h}):

    class SemiSparseLinear(nn.Linear):
        def forward(self, x):
            sparse_weight = semi_structured_sparsify(self.weight, backend="cusparselt")   # algo="" (the default)
            return F.linear(x, sparse_weight, self.bias)

    semi_structured_sparsify = _SparsifyFunc.apply: forward torch._sparse_semi_structured_tile(W, algorithm=algo)
    (a transposable 2:4 pattern computed on every aligned 4x4 tile of W, at every call), backward the identity
    (straight-through: the gradient of the sparse weight goes to the dense W unchanged, NOT masked).

So per call: W_s = W * mask(W);  y = x @ W_s^T + b;  dx = dy @ W_s;  dW = dy^T @ x (dense);  db =
sum of dy over tokens. torchao needs 16-bit weights (the kernel takes fp16/bf16 only): in practice
the model is bf16/fp16, or, as here and in the repository, fp32 master weights run under autocast,
where everything is first cast to the autocast dtype as F.linear would be (the mask is then computed
on the 16-bit weight, which is what the kernel would see).

The tile mask (torch core's `LargestValuesGreedy<Op>`): the 16 entries of a tile are sorted by
Op(value) with a sorting network, then visited from the largest down; an entry is kept iff its row
and its column inside the tile both hold fewer than 2 kept entries. Exactly 2 per row and per column
when the walk allows it; it may keep fewer than 8 (e.g. `TILE_WITH_7_KEPT` in the tests). The
algorithms (`named_algorithms`):

    "largest_abs_values_greedy"   Op = |.|   (what the repository's `tile_greedy` documents it implements)
    "largest_values_greedy"       Op = identity: the largest *signed* values
    ""                            torch's default = LargestValuesGreedy<IdentityOp>, i.e. "largest_values_greedy".
                                  NB: this is what torchao's SemiSparseLinear actually calls (it passes no algo).

Tie rule (`tie_order`), i.e. the visiting order among entries with equal Op(value):

    "row_major"  (default) the lower row-major position p = 4*row + col inside the tile first. This is the
                 repository's documented convention (sparsity/pruning/reference.py: "ties to the lower row-major
                 index inside the tile"); it is used by default so that masks can be compared bit for bit. It is
                 implemented here by a rank count (rank_p = #{q: k_q > k_p} + #{q < p: k_q == k_p}), not by a sort.
    "kernel"     the order torch's CUDA kernel produces: StaticSort's Bose-Nelson network (transcribed from the
                 templates PS/PB of StaticSort.h) over the row-major array, whose compare-exchange
                 `t = v0 < v1 ? v0 : v1; v1 = v0 < v1 ? v1 : v0; v0 = t` EXCHANGES equal elements; the walk then
                 goes from the last element (the largest) to the first. With distinct values both orders are the
                 same; with ties (frequent once weights are rounded to bf16: 16 values with 8 mantissa bits) they
                 can keep different entries.

Shapes: rows and cols must be multiples of 4 (aligned tiles), as in the repository. (torch's kernel
itself wants cols % 32 == 0 for CUTLASS and rows, cols % 128 == 0 for cuSPARSELt, and pads rows with
-inf; not modelled.)

`ReferenceSemiSparseLinear.from_dense` / `.to_dense` and `swap_to_reference` / `swap_to_linear` move
between nn.Linear and the reference layer by module-name regex, sharing the Parameter objects both
ways (the optimizer state, EMA pairs and per-module clipping lists keep working). Unlike torchao's
`from_dense`, which builds `cls(in_features, out_features)` and so draws a throw-away initialisation
from torch's global RNG, these draw nothing: a training run that swaps keeps the same random stream
(drop-path draws) as one that does not.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

ALGORITHMS = ("largest_abs_values_greedy", "largest_values_greedy", "")
DEFAULT_ALGORITHM = "largest_abs_values_greedy"
TORCH_DEFAULT_ALGORITHM = (
    ""  # what torch._sparse_semi_structured_tile runs when no algorithm is given
)
TIE_ORDERS = ("row_major", "kernel")
MLP_PATTERN = r"blocks\.\d+\.mlp\.fc[12]"


# --------------------------------------------------------------------------------------------------
# the 4x4 tile mask


def bose_nelson_network(n: int = 16) -> tuple[tuple[int, int], ...]:
    """The compare-exchange pairs (0-based, in execution order) of torch's `StaticSort<n>`,
    transcribed from its templates: PS<I, M> sorts a[I-1 .. I+M-2] by sorting both halves and
    merging them with PB<I, J, X, Y>."""
    pairs: list[tuple[int, int]] = []

    def pb(i: int, j: int, x: int, y: int) -> None:
        if (x, y) == (1, 1):
            pairs.append((i - 1, j - 1))
        elif (x, y) == (1, 2):
            pairs.extend([(i - 1, j), (i - 1, j - 1)])
        elif (x, y) == (2, 1):
            pairs.extend([(i - 1, j - 1), (i, j - 1)])
        else:
            half = x >> 1
            m = (y if x & 1 else y + 1) >> 1
            pb(i, j, half, m)
            pb(i + half, j + m, x - half, y - m)
            pb(i + half, j, x - half, m)

    def ps(i: int, m: int) -> None:
        if m <= 1:
            return
        half = m >> 1
        ps(i, half)
        ps(i + half, m - half)
        pb(i, i + half, half, m - half)

    ps(1, n)
    return tuple(pairs)


KERNEL_NETWORK = bose_nelson_network(16)


def _tile_keys(w: torch.Tensor, algorithm: str) -> torch.Tensor:
    """(R, C) -> (R/4 * C/4, 16) fp32 ranking keys, tile by tile (row-major tile order), row-major
    inside a tile. fp32 holds fp16/bf16/fp32 values exactly, so comparisons are those of the
    original dtype."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; one of {ALGORITHMS}")
    if w.dim() != 2 or w.shape[0] % 4 or w.shape[1] % 4:
        raise ValueError(
            f"a 4x4-tile 2:4 mask needs a 2-D weight with rows and cols divisible by 4, got shape "
            f"{tuple(w.shape)}"
        )
    v = w.detach().to(torch.float32)
    if algorithm == "largest_abs_values_greedy":
        v = v.abs()
    r, c = v.shape
    return v.reshape(r // 4, 4, c // 4, 4).transpose(1, 2).reshape(-1, 16)


def _visit_order(keys: torch.Tensor, tie_order: str) -> torch.Tensor:
    """(T, 16) positions 0..15 in the order the greedy walk visits them (largest key first)."""
    n, dev = keys.shape[0], keys.device
    sixteen = torch.arange(16, device=dev)
    if tie_order == "row_major":
        kp, kq = keys[:, :, None], keys[:, None, :]  # [t, p, q]
        earlier = sixteen[None, :] < sixteen[:, None]  # [p, q]: q < p
        rank = ((kq > kp) | ((kq == kp) & earlier)).sum(dim=2)  # a permutation of 0..15 per tile
        order = torch.empty_like(rank)
        order[torch.arange(n, device=dev)[:, None], rank] = sixteen.expand(n, 16)
        return order
    if tie_order == "kernel":
        vals, pos = keys.clone(), sixteen.expand(n, 16).clone()
        for i, j in KERNEL_NETWORK:
            exchange = ~(
                vals[:, i] < vals[:, j]
            )  # equal elements are exchanged too, as in StaticSort's Swap
            vi, vj, pi, pj = (
                vals[:, i].clone(),
                vals[:, j].clone(),
                pos[:, i].clone(),
                pos[:, j].clone(),
            )
            vals[:, i], vals[:, j] = torch.where(exchange, vj, vi), torch.where(exchange, vi, vj)
            pos[:, i], pos[:, j] = torch.where(exchange, pj, pi), torch.where(exchange, pi, pj)
        return pos.flip(1)  # ascending network output, walked from the end
    raise ValueError(f"unknown tie_order {tie_order!r}; one of {TIE_ORDERS}")


@torch.no_grad()
def tile_mask(
    w: torch.Tensor, algorithm: str = DEFAULT_ALGORITHM, tie_order: str = "row_major"
) -> torch.Tensor:
    """Boolean (R, C) mask of `LargestValuesGreedy` on every aligned 4x4 tile of `w` (see the module
    docstring)."""
    keys = _tile_keys(w, algorithm)
    order = _visit_order(keys, tie_order)
    n, dev = keys.shape[0], keys.device
    tiles = torch.arange(n, device=dev)
    kept = torch.zeros(n, 16, dtype=torch.bool, device=dev)
    in_row = torch.zeros(n, 4, dtype=torch.int64, device=dev)
    in_col = torch.zeros(n, 4, dtype=torch.int64, device=dev)
    for k in range(16):
        p = order[:, k]
        row, col = p // 4, p % 4
        take = (in_row[tiles, row] < 2) & (in_col[tiles, col] < 2)
        kept[tiles, p] = take
        in_row[tiles, row] += take.long()
        in_col[tiles, col] += take.long()
    r, c = w.shape
    return kept.reshape(r // 4, c // 4, 4, 4).transpose(1, 2).reshape(r, c)


# --------------------------------------------------------------------------------------------------
# the autograd function


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """What F.linear computes in: the autocast dtype where autocast is on for x's device (and x is a
    float32 / 16-bit tensor autocast would cast), else x's dtype."""
    device = x.device.type
    if torch.is_autocast_enabled(device) and x.dtype in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
    ):
        return torch.get_autocast_dtype(device)
    return x.dtype


class ReferenceSemiSparseFunction(torch.autograd.Function):
    """y = x @ (W*mask)^T + b; dx = dy @ (W*mask); dW = dy^T @ x (straight-through, dense); db = sum
    of dy. Computed in `dtype`; gradients returned in the dtypes of x, W and b."""

    @staticmethod
    def forward(ctx, x, weight, bias, algorithm: str, tie_order: str, dtype: torch.dtype):
        with torch.autocast(x.device.type, enabled=False):
            xc, wc = x.to(dtype), weight.to(dtype)
            mask = tile_mask(wc, algorithm, tie_order)
            ws = (
                wc * mask
            )  # W*mask (pruned entries become +-0, the same as 0 in every product below)
            # x @ W_s^T + b as torchao computes it: F.linear(x, sparse_weight, bias), one GEMM with
            # the bias added before the result is rounded to `dtype` (a matmul followed by "+ b"
            # would round twice in bf16)
            y = F.linear(xc, ws, None if bias is None else bias.to(dtype))
        ctx.save_for_backward(xc, ws)
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        return y

    @staticmethod
    def backward(ctx, dy):
        xc, ws = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        dx = dw = db = None
        with torch.autocast(dy.device.type, enabled=False):
            dy = dy.to(ws.dtype)
            dy2, x2 = dy.reshape(-1, dy.shape[-1]), xc.reshape(-1, xc.shape[-1])
            if ctx.needs_input_grad[0]:
                dx = (dy @ ws).to(x_dtype)
            if ctx.needs_input_grad[1]:
                dw = (dy2.t() @ x2).to(
                    w_dtype
                )  # not multiplied by the mask: straight-through to the dense W
            if ctx.needs_input_grad[2]:
                db = dy2.sum(0).to(b_dtype)
        return dx, dw, db, None, None, None


def reference_semi_sparse_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    algorithm: str = DEFAULT_ALGORITHM,
    tie_order: str = "row_major",
) -> torch.Tensor:
    return ReferenceSemiSparseFunction.apply(
        x, weight, bias, algorithm, tie_order, compute_dtype(x)
    )


# --------------------------------------------------------------------------------------------------
# the module and the swaps


def _share(src: nn.Linear, dst: nn.Module) -> nn.Module:
    """dst holds src's Parameters (the same objects), features and train/eval flag; no
    initialisation is drawn."""
    nn.Module.__init__(dst)
    dst.in_features, dst.out_features = src.in_features, src.out_features
    dst.weight = src.weight
    dst.register_parameter("bias", src.bias)
    dst.train(src.training)
    return dst


class ReferenceSemiSparseLinear(nn.Linear):
    """torchao's SemiSparseLinear, from its published semantics (see the module docstring)."""

    algorithm = DEFAULT_ALGORITHM
    tie_order = "row_major"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return reference_semi_sparse_linear(
            x, self.weight, self.bias, self.algorithm, self.tie_order
        )

    @classmethod
    def from_dense(
        cls, linear: nn.Linear, algorithm: str = DEFAULT_ALGORITHM, tie_order: str = "row_major"
    ) -> ReferenceSemiSparseLinear:
        if algorithm not in ALGORITHMS or tie_order not in TIE_ORDERS:
            raise ValueError(
                f"algorithm {algorithm!r} / tie_order {tie_order!r}: one of {ALGORITHMS} / "
                f"{TIE_ORDERS}"
            )
        out, inp = linear.weight.shape
        if out % 4 or inp % 4:
            raise ValueError(
                f"ReferenceSemiSparseLinear: weight (out, in) = ({out}, {inp}): rows and cols must "
                f"be "
                "divisible by 4 (aligned 4x4 tiles)"
            )
        mod = _share(linear, cls.__new__(cls))
        mod.algorithm, mod.tie_order = algorithm, tie_order
        return mod

    def to_dense(self) -> nn.Linear:
        return _share(self, nn.Linear.__new__(nn.Linear))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, algorithm={self.algorithm!r}, tie_order={self.tie_order}"


def _set_child(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def swap_to_reference(
    model: nn.Module, pattern: str = MLP_PATTERN, module_cls: type = None, **options
) -> list[str]:
    """Every plain nn.Linear of `model` whose name fully matches `pattern` becomes a
    ReferenceSemiSparseLinear (or `module_cls`, a subclass) holding the same Parameters, in place in
    `model`; returns the names. A pattern matching nothing is an error."""
    module_cls = module_cls or ReferenceSemiSparseLinear
    regex = re.compile(pattern)
    names = [n for n, m in model.named_modules() if type(m) is nn.Linear and regex.fullmatch(n)]
    if not names:
        raise ValueError(f"pattern {pattern!r} matches no nn.Linear of the model")
    for name in names:
        _set_child(model, name, module_cls.from_dense(model.get_submodule(name), **options))
    return names


def swap_to_linear(model: nn.Module) -> list[str]:
    """Every ReferenceSemiSparseLinear of `model` back to a plain nn.Linear (same Parameters);
    returns the names."""
    names = [n for n, m in model.named_modules() if isinstance(m, ReferenceSemiSparseLinear)]
    for name in names:
        _set_child(model, name, model.get_submodule(name).to_dense())
    return names
