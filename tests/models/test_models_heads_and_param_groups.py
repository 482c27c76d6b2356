"""DINOHead structure and weight norm; parameter groups with hand-computed multipliers."""

import warnings

import pytest
import torch
from torch import nn

from models.heads import DINOHead, WeightNormLinear
from models.param_groups import build_param_groups, fuse_params_groups, get_params_groups_with_decay
from models.vision_transformer import DinoVisionTransformer


def test_dino_head_structure_and_forward():
    torch.manual_seed(0)
    head = DINOHead(in_dim=16, out_dim=10, nlayers=3, hidden_dim=24, bottleneck_dim=8)
    kinds = [type(m) for m in head.mlp]
    assert kinds == [nn.Linear, nn.GELU, nn.Linear, nn.GELU, nn.Linear]
    assert [m.out_features for m in head.mlp if isinstance(m, nn.Linear)] == [24, 24, 8]
    names = dict(head.named_parameters())
    assert set(n for n in names if "last_layer" in n) == {
        "last_layer.weight_g",
        "last_layer.weight_v",
    }
    assert names["last_layer.weight_g"].requires_grad and torch.all(
        names["last_layer.weight_g"] == 1
    )
    assert "last_layer.bias" not in names
    assert torch.all(head.mlp[0].bias == 0) and 0.01 < head.mlp[0].weight.std() < 0.03
    x = torch.randn(5, 16)
    z = nn.functional.normalize(head.mlp(x), dim=-1)
    v = head.last_layer.weight_v
    expected = z @ (v / v.norm(dim=1, keepdim=True)).t()  # g = 1: unit-norm prototypes
    torch.testing.assert_close(head(x), expected)
    head(x).sum().backward()
    assert head.last_layer.weight_g.grad is not None and head.last_layer.weight_v.grad is not None
    assert DINOHead(16, 10, nlayers=1, bottleneck_dim=8).mlp.out_features == 8


def test_weight_norm_linear_matches_torch_weight_norm():
    torch.manual_seed(0)
    ours = WeightNormLinear(6, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = nn.utils.weight_norm(nn.Linear(6, 4, bias=False))
    ref.load_state_dict({"weight_g": torch.rand(4, 1) + 0.5, "weight_v": torch.randn(4, 6)})
    ours.load_state_dict(ref.state_dict())  # same names and shapes as the reference's checkpoints
    x = torch.randn(3, 6, requires_grad=True)
    torch.testing.assert_close(ours(x), ref(x))


def tiny_student():
    backbone = DinoVisionTransformer(
        img_size=8,
        patch_size=4,
        embed_dim=8,
        depth=2,
        num_heads=2,
        init_values=1e-5,
        num_register_tokens=1,
    )
    return nn.ModuleDict(
        {"backbone": backbone, "dino_head": DINOHead(8, 6, hidden_dim=8, bottleneck_dim=4)}
    )


def test_param_groups_hand_computed_multipliers():
    # L = 2 blocks, decay 0.5: layer 0 -> 0.5**3, blocks.0 -> 0.5**2, blocks.1 -> 0.5, final norm /
    # heads -> 1.
    groups = get_params_groups_with_decay(
        tiny_student()["backbone"], lr_decay_rate=0.5, patch_embed_lr_mult=0.2
    )
    by_name = {g["name"]: g for g in groups}
    expected = {
        "patch_embed.proj.weight": (0.125 * 0.2, 1.0),
        "patch_embed.proj.bias": (0.125 * 0.2, 0.0),
        "cls_token": (0.125, 1.0),
        "pos_embed": (0.125, 1.0),
        "mask_token": (0.125, 1.0),
        "register_tokens": (0.125, 1.0),
        "blocks.0.attn.qkv.weight": (0.25, 1.0),
        "blocks.0.attn.qkv.bias": (0.25, 0.0),
        "blocks.0.norm1.weight": (0.25, 0.0),
        "blocks.0.ls1.gamma": (0.25, 0.0),
        "blocks.1.mlp.fc1.weight": (0.5, 1.0),
        "blocks.1.mlp.fc2.bias": (0.5, 0.0),
        "blocks.1.ls2.gamma": (0.5, 0.0),
        "norm.weight": (1.0, 0.0),
        "norm.bias": (1.0, 0.0),
    }
    for name, (lr_mult, wd_mult) in expected.items():
        assert by_name[name]["lr_multiplier"] == pytest.approx(lr_mult), name
        assert by_name[name]["wd_multiplier"] == wd_mult, name
        assert by_name[name]["is_last_layer"] is False
    head = {
        g["name"]: g for g in get_params_groups_with_decay(tiny_student()["dino_head"], 0.5, 0.2)
    }
    assert (
        head["mlp.0.weight"]["lr_multiplier"] == 1.0
        and head["mlp.0.weight"]["wd_multiplier"] == 1.0
    )
    assert head["mlp.0.bias"]["wd_multiplier"] == 0.0
    assert (
        head["last_layer.weight_g"]["is_last_layer"]
        and head["last_layer.weight_v"]["is_last_layer"]
    )
    assert (
        head["last_layer.weight_g"]["wd_multiplier"] == 1.0
        and not head["mlp.4.weight"]["is_last_layer"]
    )


def test_fused_groups_for_adamw():
    student = tiny_student()
    student["backbone"].mask_token.requires_grad_(False)  # frozen parameters are skipped
    groups = build_param_groups(student, layerwise_decay=0.5, patch_embed_lr_mult=0.2)
    keys = [(g["lr_multiplier"], g["wd_multiplier"], g["is_last_layer"]) for g in groups]
    n_backbone = sum(1 for n, p in student["backbone"].named_parameters() if p.requires_grad)
    assert sum(len(g["params"]) for g in groups) == n_backbone + len(
        list(student["dino_head"].parameters())
    )
    assert all(len(g["params"]) == len(g["names"]) for g in groups)
    assert not any("backbone.mask_token" in g["names"] for g in groups)
    # backbone: (0.025, 1) (0.025, 0) (0.125, 1) (0.25, 1) (0.25, 0) (0.5, 1) (0.5, 0) (1, 0); head:
    # (1, 1) (1, 0) (1, 1, last) -> fused per module as the reference, so (1, 0) appears for the
    # backbone and the head
    assert len(groups) == 11 and len(set(keys)) == 10
    g = next(g for g in groups if g["is_last_layer"])
    assert set(g["names"]) == {"dino_head.last_layer.weight_v", "dino_head.last_layer.weight_g"}
    opt = torch.optim.AdamW(groups, betas=(0.9, 0.999))
    for group in opt.param_groups:
        group["lr"] = 1e-3 * group["lr_multiplier"]
        group["weight_decay"] = 0.04 * group["wd_multiplier"]
    out = student["backbone"](torch.randn(2, 3, 8, 8))
    student["dino_head"](out).sum().backward()
    opt.step()


def test_fuse_params_groups_merges_equal_keys():
    a, b, c = (nn.Parameter(torch.zeros(1)) for _ in range(3))
    groups = fuse_params_groups(
        [
            {
                "params": a,
                "name": "a",
                "lr_multiplier": 0.5,
                "wd_multiplier": 1.0,
                "is_last_layer": False,
            },
            {
                "params": b,
                "name": "b",
                "lr_multiplier": 0.5,
                "wd_multiplier": 0.0,
                "is_last_layer": False,
            },
            {
                "params": c,
                "name": "c",
                "lr_multiplier": 0.5,
                "wd_multiplier": 1.0,
                "is_last_layer": False,
            },
        ]
    )
    assert [g["names"] for g in groups] == [["a", "c"], ["b"]]
    assert groups[0]["params"][0] is a and groups[0]["params"][1] is c
