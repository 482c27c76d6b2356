"""DINOv2 vision transformer (the reference's `DinoVisionTransformer`), with a list forward for
multi-crop training.

Module names follow timm's `VisionTransformer` (`patch_embed.proj`, `blocks.{i}.norm1`, `attn.qkv`,
`attn.proj`, `ls1.gamma`, `norm2`, `mlp.fc1`, `mlp.fc2`, `ls2.gamma`, `norm`) plus the reference's
`mask_token` and `register_tokens`, so the state dict is also the reference's (non-chunked) layout.

The blocks are in `vit_block.py`: how the list forward hands the MLPs one matrix of all crop
batches' tokens, and the reference's stochastic depth.
"""

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn.init import trunc_normal_

from configs.torch_env import ensure_torchvision_importable
from models.pos_embed import bicubic_resize_matrix, resize_positions
from models.vit_block import NORM_LAYER, Block

ensure_torchvision_importable()  # before timm, which imports torchvision (see configs/torch_env.py)

from timm.layers import PatchEmbed  # noqa: E402 (after the shim above)

ARCH_SIZES: dict[str, tuple[int, int, int]] = {  # embed_dim, depth, num_heads
    "vit_tiny": (192, 12, 3),
    "vit_small": (384, 12, 6),
    "vit_base": (768, 12, 12),
    "vit_large": (1024, 24, 16),
}


class DinoVisionTransformer(nn.Module):
    """The reference backbone. `img_size` fixes the learned pos-embed grid; other sizes are
    interpolated."""

    def __init__(
        self,
        img_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        proj_bias: bool = True,
        ffn_bias: bool = True,
        drop_path_rate: float = 0.0,
        init_values: float | None = None,  # LayerScale init; None or 0 -> no LayerScale
        num_register_tokens: int = 0,
        interpolate_antialias: bool = False,
        interpolate_offset: float = 0.1,
    ):
        super().__init__()
        self.num_features = self.embed_dim = embed_dim
        self.num_tokens = 1
        self.n_blocks = depth
        self.num_heads = num_heads
        self.patch_size = patch_size
        self.num_register_tokens = num_register_tokens
        self.interpolate_antialias = interpolate_antialias
        self.interpolate_offset = interpolate_offset
        self.chunked_blocks = False  # read by the reference's param-group code; we never chunk
        self._resize_matrices = {}  # the pos-embed resizes on each device (interpolate_pos_encoding)

        self.patch_embed = PatchEmbed(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            embed_dim=embed_dim,
            strict_img_size=False,
        )
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + self.num_tokens, embed_dim))
        if num_register_tokens < 0:
            raise ValueError("num_register_tokens must be >= 0")
        self.register_tokens = (
            nn.Parameter(torch.zeros(1, num_register_tokens, embed_dim))
            if num_register_tokens
            else None
        )
        self.blocks = nn.ModuleList(
            [
                Block(
                    dim=embed_dim,
                    num_heads=num_heads,
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    proj_bias=proj_bias,
                    ffn_bias=ffn_bias,
                    # uniform across blocks (reference drop_path_uniform: true)
                    drop_path=drop_path_rate,
                    init_values=init_values,
                    norm_layer=NORM_LAYER,
                )
                for _ in range(depth)
            ]
        )
        self.norm = NORM_LAYER(embed_dim)
        self.head = nn.Identity()
        self.mask_token = nn.Parameter(torch.zeros(1, embed_dim))
        self.init_weights()

    def init_weights(self) -> None:
        trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        if self.register_tokens is not None:
            nn.init.normal_(self.register_tokens, std=1e-6)
        for m in (
            self.modules()
        ):  # init_weights_vit_timm: every Linear (patch_embed's conv keeps torch's default)
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    # tokens
    # ----------------------------------------------------------------------------------------------
    def interpolate_pos_encoding(self, x: Tensor, h: int, w: int) -> Tensor:
        """Pos-embed for an (h, w) image; `x` holds cls + patch tokens. Bicubic, as the reference
        (offset/antialias)."""
        previous_dtype = x.dtype
        npatch = x.shape[1] - 1
        N = self.pos_embed.shape[1] - 1
        if npatch == N and w == h:
            return self.pos_embed
        pos_embed = self.pos_embed.float()
        grid, size, scale_factor = self.resize_target(h, w)
        matrix = self._resize_matrix(grid, size, scale_factor, x.device)
        patch_pos_embed = resize_positions(pos_embed[0, 1:], matrix).unsqueeze(0)
        return torch.cat((pos_embed[:, :1], patch_pos_embed), dim=1).to(previous_dtype)

    def resize_target(self, h: int, w: int) -> tuple[int, tuple[int, int], tuple | None]:
        """(grid, (h0, w0), scale_factor) of the pos-embed's resize for an (h, w) image: its
        grid x grid positions to h0 x w0 patches, by `scale_factor` where the reference gives one
        (`interpolate_offset`), else by size."""
        N = self.pos_embed.shape[1] - 1
        M = int(math.sqrt(N))
        assert N == M * M, f"pos_embed holds {N} patch positions, not a square grid"
        h0, w0 = h // self.patch_size, w // self.patch_size
        if not self.interpolate_offset:
            return M, (h0, w0), None
        # historical kludge (dino issue #8) kept for compatibility: the operator uses the scale
        # factor
        offset = self.interpolate_offset
        return M, (h0, w0), (float(h0 + offset) / M, float(w0 + offset) / M)

    def _resize_matrix(self, grid: int, size, scale_factor, device) -> Tensor:
        """`bicubic_resize_matrix` on `device`, copied there once (a copy from the host in every
        step would wait for the GPU, and cannot be captured in a CUDA graph)."""
        key = (grid, size, scale_factor, self.interpolate_antialias, str(device))
        if key not in self._resize_matrices:
            matrix = bicubic_resize_matrix(grid, size, scale_factor, self.interpolate_antialias)
            self._resize_matrices[key] = matrix.to(device)
        return self._resize_matrices[key]

    def tokens_per_image(self, img_size: int) -> int:
        """Class token, registers and patches of a square `img_size` image."""
        return 1 + self.num_register_tokens + (img_size // self.patch_size) ** 2

    def mlp_rows(self, crops: Sequence[tuple[int, int]], training: bool) -> list[int]:
        """Per block, the rows the MLP gets in the list forward of crop batches of (images, image
        size)."""
        batches = [(images, self.tokens_per_image(size)) for images, size in crops if images]
        return [blk.mlp_rows(batches, training) for blk in self.blocks]

    def prepare_tokens_with_masks(self, x: Tensor, masks: Tensor | None = None) -> Tensor:
        h, w = x.shape[-2:]
        x = self.patch_embed(x)
        if masks is not None:
            x = torch.where(masks.unsqueeze(-1), self.mask_token.to(x.dtype).unsqueeze(0), x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = x + self.interpolate_pos_encoding(x, h, w)
        if self.register_tokens is not None:
            x = torch.cat(
                (x[:, :1], self.register_tokens.expand(x.shape[0], -1, -1), x[:, 1:]), dim=1
            )
        return x

    def _output(self, x: Tensor, masks: Tensor | None) -> dict[str, Tensor | None]:
        x_norm = self.norm(x)
        r = self.num_register_tokens
        return {
            "x_norm_clstoken": x_norm[:, 0],
            "x_norm_regtokens": x_norm[:, 1 : r + 1],
            "x_norm_patchtokens": x_norm[:, r + 1 :],
            "x_prenorm": x,
            "masks": masks,
        }

    # forwards
    # ----------------------------------------------------------------------------------------------
    def forward_features_list(
        self, x_list: Sequence[Tensor], masks_list: Sequence[Tensor | None] | None = None
    ) -> list[dict[str, Tensor | None]]:
        if masks_list is None:
            masks_list = [None] * len(x_list)
        if len(masks_list) != len(x_list):
            raise ValueError(f"{len(x_list)} crop batches but {len(masks_list)} masks")
        xs = [self.prepare_tokens_with_masks(x, m) for x, m in zip(x_list, masks_list)]
        for blk in self.blocks:
            xs = blk(
                xs
            )  # the module call (-> forward_list), so hooks and per-block compilation apply
        return [self._output(x, m) for x, m in zip(xs, masks_list)]

    def forward_features(self, x, masks=None):
        """One dict for a tensor `x` (B, 3, H, W); a list of dicts for a list of crop batches
        (`masks` a list too)."""
        if isinstance(x, (list, tuple)):
            return self.forward_features_list(x, masks)
        x = self.prepare_tokens_with_masks(x, masks)
        for blk in self.blocks:
            x = blk(x)
        return self._output(x, masks)

    def forward(self, x, masks=None, is_training: bool = False):
        """Eval: the final-norm CLS feature (B, D). `is_training=True` returns `forward_features`
        (reference API)."""
        ret = self.forward_features(x, masks)
        if is_training:
            return ret
        return self.head(ret["x_norm_clstoken"])

    def _get_intermediate_layers(self, x: Tensor, n: int | Sequence[int] = 1) -> list[Tensor]:
        x = self.prepare_tokens_with_masks(x)
        total = len(self.blocks)
        blocks_to_take = range(total - n, total) if isinstance(n, int) else n
        output = []
        for i, blk in enumerate(self.blocks):
            x = blk(x)
            if i in blocks_to_take:
                output.append(x)
        assert len(output) == len(blocks_to_take), (
            f"only {len(output)} / {len(blocks_to_take)} blocks found"
        )
        return output

    def get_intermediate_layers(
        self,
        x: Tensor,
        n: int | Sequence[int] = 1,  # the n last blocks, or these block indices
        reshape: bool = False,
        return_class_token: bool = False,
        norm: bool = True,
    ):
        """As the reference: per block, patch tokens (B, N, D) or (B, D, h, w) with `reshape`,
        optionally with CLS."""
        outputs = self._get_intermediate_layers(x, n)
        if norm:
            outputs = [self.norm(out) for out in outputs]
        class_tokens = [out[:, 0] for out in outputs]
        outputs = [out[:, 1 + self.num_register_tokens :] for out in outputs]
        if reshape:
            B, _, h, w = x.shape
            outputs = [
                out.reshape(B, h // self.patch_size, w // self.patch_size, -1)
                .permute(0, 3, 1, 2)
                .contiguous()
                for out in outputs
            ]
        if return_class_token:
            return tuple(zip(outputs, class_tokens))
        return tuple(outputs)


def vit_tiny(**kwargs) -> DinoVisionTransformer:
    return _vit("vit_tiny", **kwargs)


def vit_small(**kwargs) -> DinoVisionTransformer:
    return _vit("vit_small", **kwargs)


def vit_base(**kwargs) -> DinoVisionTransformer:
    return _vit("vit_base", **kwargs)


def vit_large(**kwargs) -> DinoVisionTransformer:
    return _vit("vit_large", **kwargs)


def _vit(arch: str, **kwargs) -> DinoVisionTransformer:
    embed_dim, depth, num_heads = ARCH_SIZES[arch]
    return DinoVisionTransformer(
        embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=4.0, **kwargs
    )


def build_backbone(
    student_cfg, img_size: int, drop_path_rate: float | None = None
) -> DinoVisionTransformer:
    """Backbone from `configs.schema.StudentConfig`; pos-embed sized for `img_size` (the global crop
    size).

    `drop_path_rate` overrides the config's (the teacher is built with 0).
    """
    if student_cfg.arch not in ARCH_SIZES:
        raise ValueError(f"student.arch={student_cfg.arch!r} is not one of {', '.join(ARCH_SIZES)}")
    if student_cfg.ffn_layer != "mlp":
        raise ValueError(f"student.ffn_layer={student_cfg.ffn_layer!r}: only 'mlp' is implemented")
    return _vit(
        student_cfg.arch,
        img_size=img_size,
        patch_size=student_cfg.patch_size,
        qkv_bias=student_cfg.qkv_bias,
        proj_bias=student_cfg.proj_bias,
        ffn_bias=student_cfg.ffn_bias,
        drop_path_rate=student_cfg.drop_path_rate if drop_path_rate is None else drop_path_rate,
        init_values=student_cfg.layerscale or None,
        num_register_tokens=student_cfg.num_register_tokens,
        interpolate_antialias=student_cfg.interpolate_antialias,
        interpolate_offset=student_cfg.interpolate_offset,
    )
