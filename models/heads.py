"""DINO / iBOT projection head (the reference's `dinov2/layers/dino_head.py::DINOHead`)."""

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.init import trunc_normal_


class WeightNormLinear(nn.Module):
    """`torch.nn.utils.weight_norm(nn.Linear(in, out, bias=False))` as a plain module.

    Same parameters and state-dict names as the reference (`weight_g` (out, 1), `weight_v` (out,
    in)), same math (weight = g * v / ||v|| per output row), but no forward pre-hook and no
    deprecated API. `weight_g` is trainable.
    """

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        linear = nn.Linear(
            in_features, out_features, bias=False
        )  # torch's default init, as the reference
        self.in_features, self.out_features = in_features, out_features
        self.weight_v = nn.Parameter(linear.weight.detach().clone())
        self.weight_g = nn.Parameter(
            torch.ones(out_features, 1)
        )  # reference: weight_g.data.fill_(1)

    @property
    def weight(self) -> Tensor:
        return torch._weight_norm(self.weight_v, self.weight_g, 0)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def _build_mlp(
    nlayers: int, in_dim: int, bottleneck_dim: int, hidden_dim: int, bias: bool = True
) -> nn.Module:
    if nlayers == 1:
        return nn.Linear(in_dim, bottleneck_dim, bias=bias)
    layers = [nn.Linear(in_dim, hidden_dim, bias=bias), nn.GELU()]
    for _ in range(nlayers - 2):
        layers += [nn.Linear(hidden_dim, hidden_dim, bias=bias), nn.GELU()]
    layers.append(nn.Linear(hidden_dim, bottleneck_dim, bias=bias))
    return nn.Sequential(*layers)


class DINOHead(nn.Module):
    """MLP (nlayers Linear+GELU, last to `bottleneck_dim`) -> L2-normalise -> weight-normed
    prototypes (no bias).

    Parameter names: `mlp.{0,2,4}.{weight,bias}`, `last_layer.weight_g`, `last_layer.weight_v`
    ("last_layer" is what the last-layer freeze keys on).
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        nlayers: int = 3,
        hidden_dim: int = 2048,
        bottleneck_dim: int = 256,
        mlp_bias: bool = True,
    ):
        super().__init__()
        nlayers = max(nlayers, 1)
        self.mlp = _build_mlp(nlayers, in_dim, bottleneck_dim, hidden_dim=hidden_dim, bias=mlp_bias)
        self.apply(
            self._init_weights
        )  # before last_layer exists: the prototypes keep torch's default init
        self.last_layer = WeightNormLinear(bottleneck_dim, out_dim)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.constant_(m.bias, 0)

    def forward(self, x: Tensor) -> Tensor:
        x = self.mlp(x)
        eps = 1e-6 if x.dtype == torch.float16 else 1e-12
        x = F.normalize(x, dim=-1, p=2, eps=eps)
        return self.last_layer(x)


def build_dino_head(cfg, in_dim: int) -> DINOHead:
    """DINO head from `configs.schema.Config.dino` sizes."""
    d = cfg.dino
    return DINOHead(
        in_dim, d.head_n_prototypes, d.head_nlayers, d.head_hidden_dim, d.head_bottleneck_dim
    )


def build_ibot_head(cfg, in_dim: int) -> DINOHead:
    """Separate iBOT head from `configs.schema.Config.ibot` sizes (used when
    `ibot.separate_head`)."""
    i = cfg.ibot
    return DINOHead(
        in_dim, i.head_n_prototypes, i.head_nlayers, i.head_hidden_dim, i.head_bottleneck_dim
    )
