"""The DINOv2 ViT's transformer block (the reference's `NestedTensorBlock`) and its attention, with
a list forward for multi-crop training. Module names follow timm's (`norm1`, `attn.qkv`,
`attn.proj`, `ls1.gamma`, `norm2`, `mlp.fc1`, `mlp.fc2`, `ls2.gamma`), so the backbone's state dict
is timm's and the reference's.

In the list forward every per-token part of a block (the norms, `attn.qkv`, `attn.proj`, the MLP, the
layer scales) runs once on one 2-D `(tokens, dim)` matrix of the tokens of all crop batches, so the
(possibly 2:4-sparse) linears see one large GEMM per block; only the attention itself runs per crop
batch (the reference runs the whole block per crop batch, with a block-diagonal xFormers mask). The
sums are the same; the rows of a GEMM just sit in one call, which is what lets 2:4 pay on the
student's qkv and proj (results/bench/NOTES.md, "The attention's linears on the concatenated crops").

Stochastic depth follows the reference (`dinov2/layers/block.py`), with a uniform rate across
blocks:
- single tensor, training, rate > 0.1: each residual branch runs on a random batch subset of size
  `max(int(B * (1 - rate)), 1)` and is added back to those rows (the reference's `index_add`),
  scaled by `B / subset`;
- single tensor, training, 0 < rate <= 0.1: per-sample DropPath;
- list forward, training, rate > 0: always the batch-subset form (per crop batch; the MLP still runs
  once on the kept subsets of all crops concatenated). This is what the reference's
  `NestedTensorBlock.forward_nested` does, and it is the path the student takes in training.
All random draws use torch's global RNG (`torch.randperm` / `bernoulli_` on the activations'
device).
"""

from collections.abc import Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from configs.torch_env import ensure_torchvision_importable
from models.stochastic_depth import (
    SUBSET_DROP_PATH_MIN_RATE,
    add_to_subset,
    batch_subset,
    kept_samples,
    take_rows,
)

ensure_torchvision_importable()  # before timm, which imports torchvision (see configs/torch_env.py)

from timm.layers import DropPath, Mlp  # noqa: E402 (after the shim above)

try:  # timm >= 1.0.? exports it from timm.layers; older 1.0.x only defines it in the ViT module
    from timm.layers import LayerScale
except ImportError:  # pragma: no cover
    from timm.models.vision_transformer import LayerScale

NORM_LAYER = partial(
    nn.LayerNorm, eps=1e-6
)  # the reference's LayerNorm, in every block and after the last


class Attention(nn.Module):
    """Multi-head self-attention (`qkv`, `proj` as in timm / the reference) on
    F.scaled_dot_product_attention."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, proj_bias: bool = True):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.attend(self.qkv(x), x.shape[0]))

    def attend(self, qkv: Tensor, batch: int) -> Tensor:
        """Softmax attention within each of `batch` sequences, from `qkv`'s output (any leading shape
        holding batch x tokens rows of 3 x dim); the heads' outputs as (batch, tokens, dim)."""
        C = qkv.shape[-1] // 3
        q, k, v = (
            qkv.reshape(batch, -1, 3, self.num_heads, C // self.num_heads)
            .permute(2, 0, 3, 1, 4)
            .unbind(0)
        )
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, -1, C)


class Block(nn.Module):
    """Pre-norm transformer block: x + ls1(attn(norm1(x))), then x + ls2(mlp(norm2(x)))."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        proj_bias: bool = True,
        ffn_bias: bool = True,
        drop_path: float = 0.0,
        init_values: float | None = None,
        norm_layer=NORM_LAYER,
    ):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads, qkv_bias=qkv_bias, proj_bias=proj_bias)
        self.ls1 = LayerScale(dim, init_values=init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(
            in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=nn.GELU, bias=ffn_bias
        )
        self.ls2 = LayerScale(dim, init_values=init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.sample_drop_ratio = drop_path

    # residual branches
    # -------------------------------------------------------------------------------------------
    def _attn_branch(self, x: Tensor) -> Tensor:
        return self.ls1(self.attn(self.norm1(x)))

    def _ffn_branch_2d(self, x2d: Tensor) -> Tensor:
        """The MLP branch on a 2-D (tokens, dim) matrix."""
        return self.ls2(self.mlp(self.norm2(x2d)))

    def _ffn_branch(self, x: Tensor) -> Tensor:
        return self._ffn_branch_2d(x.reshape(-1, x.shape[-1])).view(x.shape)

    # single tensor
    # ----------------------------------------------------------------------------------------------
    def forward(self, x: Tensor | list[Tensor]) -> Tensor | list[Tensor]:
        if isinstance(x, (list, tuple)):
            return self.forward_list(list(x))
        rate = self.sample_drop_ratio
        if self.training and rate > SUBSET_DROP_PATH_MIN_RATE:
            for branch in (self._attn_branch, self._ffn_branch):
                brange, _, scale = batch_subset(x.shape[0], rate, x.device)
                x, kept = take_rows(x, brange)
                x = add_to_subset(x, brange, branch(kept), scale)
            return x
        if self.training and rate > 0.0:
            x = x + self.drop_path1(self._attn_branch(x))
            return x + self.drop_path2(self._ffn_branch(x))
        x = x + self._attn_branch(x)
        return x + self._ffn_branch(x)

    # list of crop batches
    # -------------------------------------------------------------------------------------------
    def _attn_on_concat(self, xs: list[Tensor]) -> list[Tensor]:
        """The attention branch on the tensors in `xs` (each (b, n, D)): norm1, qkv, proj and ls1 run
        once on the tokens of all of them, the attention per tensor; per-tensor results."""
        qkv = self.attn.qkv(self.norm1(_rows_of_all(xs)))
        mixed = [
            self.attn.attend(part, x.shape[0]).reshape(part.shape[0], -1)
            for part, x in zip(qkv.split(_rows_each(xs), dim=0), xs)
        ]
        return _split_like(self.ls1(self.attn.proj(_cat_rows(mixed))), xs)

    def _ffn_on_concat(self, xs: list[Tensor]) -> list[Tensor]:
        """The MLP branch run once on the tokens of all tensors in `xs` (each (b, n, D)); per-tensor
        results."""
        return _split_like(self._ffn_branch_2d(_rows_of_all(xs)), xs)

    def mlp_rows(self, batches: Sequence[tuple[int, int]], training: bool) -> int:
        """The rows of the (tokens, dim) matrix the MLP gets in `forward_list` for crop batches of
        (images, tokens each): the kept subsets' tokens when drop-path samples subsets; qkv and proj
        get as many (their subsets are drawn apart, of the same sizes). For config checks without
        tensors (a pruning of a linear's input that needs a row multiple)."""
        if training and self.sample_drop_ratio > 0.0:
            return sum(kept_samples(b, self.sample_drop_ratio) * n for b, n in batches)
        return sum(b * n for b, n in batches)

    def forward_list(self, x_list: list[Tensor]) -> list[Tensor]:
        rate = self.sample_drop_ratio
        if self.training and rate > 0.0:
            # attention: a random subset of each crop batch (reference:
            # drop_add_residual_stochastic_depth_list), its linears on all subsets' tokens at once
            subsets = [batch_subset(x.shape[0], rate, x.device) for x in x_list]
            taken = [take_rows(x, brange) for x, (brange, _, _) in zip(x_list, subsets)]
            residuals = self._attn_on_concat([kept for _, kept in taken])
            x_list = [
                add_to_subset(x, brange, r, scale)
                for (x, _), r, (brange, _, scale) in zip(taken, residuals, subsets)
            ]
            # MLP: fresh subsets, kept tokens of all crop batches in one matrix
            subsets = [batch_subset(x.shape[0], rate, x.device) for x in x_list]
            taken = [take_rows(x, brange) for x, (brange, _, _) in zip(x_list, subsets)]
            residuals = self._ffn_on_concat([kept for _, kept in taken])
            return [
                add_to_subset(x, brange, r, scale)
                for (x, _), r, (brange, _, scale) in zip(taken, residuals, subsets)
            ]
        x_list = [x + r for x, r in zip(x_list, self._attn_on_concat(x_list))]
        return [x + r for x, r in zip(x_list, self._ffn_on_concat(x_list))]


def _rows_of_all(xs: list[Tensor]) -> Tensor:
    """The tokens of all tensors in `xs` (each (b, n, D)) as one (tokens, D) matrix."""
    return _cat_rows([x.reshape(-1, x.shape[-1]) for x in xs])


def _cat_rows(matrices: list[Tensor]) -> Tensor:
    """2-D `matrices` stacked along their rows (the one matrix itself, uncopied, where it is alone)."""
    return torch.cat(matrices, dim=0) if len(matrices) > 1 else matrices[0]


def _rows_each(xs: list[Tensor]) -> list[int]:
    """The tokens of each tensor in `xs` (each (b, n, D))."""
    return [x.shape[0] * x.shape[1] for x in xs]


def _split_like(out: Tensor, xs: list[Tensor]) -> list[Tensor]:
    """A (tokens, D) matrix of the tokens of all tensors in `xs`, in order, as one tensor per `xs`
    of its shape."""
    return [o.view(x.shape) for o, x in zip(out.split(_rows_each(xs), dim=0), xs)]
