"""State-dict conversion: identical outputs against timm's VisionTransformer both ways;
dinov2-format checkpoints."""

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from models.checkpoint_conversion import (
    convert_to_backbone_state_dict,
    from_timm_state_dict,
    load_backbone_weights,
    timm_model_kwargs,
    to_timm_state_dict,
)
from models.vision_transformer import DinoVisionTransformer


def ours(patch, regs, **kw):
    torch.manual_seed(1)
    m = DinoVisionTransformer(
        img_size=2 * patch,
        patch_size=patch,
        embed_dim=32,
        depth=2,
        num_heads=2,
        init_values=1e-5,
        num_register_tokens=regs,
        **kw,
    ).eval()
    with torch.no_grad():  # make every tensor matter (tokens, LayerScale, norms, biases)
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return m


def randomise(module):
    torch.manual_seed(2)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return module.eval()


@pytest.mark.parametrize("patch", [14, 16])
@pytest.mark.parametrize("regs", [0, 4])
@pytest.mark.parametrize("no_embed_class", [None, False, True])
def test_ours_to_timm_identical_outputs(patch, regs, no_embed_class):
    m = ours(patch, regs)
    kwargs = timm_model_kwargs(m, no_embed_class=no_embed_class)
    timm_model = VisionTransformer(**kwargs).eval()
    timm_model.load_state_dict(
        to_timm_state_dict(m.state_dict(), no_embed_class=kwargs["no_embed_class"])
    )
    x = torch.randn(3, 3, 2 * patch, 2 * patch)
    torch.testing.assert_close(timm_model(x), m(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("patch", [14, 16])
@pytest.mark.parametrize("regs", [0, 4])
@pytest.mark.parametrize("no_embed_class", [False, True])
def test_timm_to_ours_identical_outputs_and_round_trip(patch, regs, no_embed_class):
    torch.manual_seed(3)
    timm_model = randomise(
        VisionTransformer(
            img_size=2 * patch,
            patch_size=patch,
            embed_dim=32,
            depth=2,
            num_heads=2,
            init_values=1e-5,
            num_classes=0,
            reg_tokens=regs,
            no_embed_class=no_embed_class,
        )
    )
    m = DinoVisionTransformer(
        img_size=2 * patch,
        patch_size=patch,
        embed_dim=32,
        depth=2,
        num_heads=2,
        init_values=1e-5,
        num_register_tokens=regs,
    ).eval()
    report = load_backbone_weights(m, timm_model.state_dict())
    assert report["mask_token_kept"] and report["pos_embed_resampled_from"] is None
    x = torch.randn(3, 3, 2 * patch, 2 * patch)
    torch.testing.assert_close(m(x), timm_model(x), atol=1e-5, rtol=1e-5)
    # and back: ours -> timm of the same layout gives the same outputs again
    back = VisionTransformer(**timm_model_kwargs(m, no_embed_class=no_embed_class)).eval()
    back.load_state_dict(to_timm_state_dict(m.state_dict(), no_embed_class=no_embed_class))
    torch.testing.assert_close(back(x), timm_model(x), atol=1e-5, rtol=1e-5)


def test_timm_classifier_head_is_dropped_and_names_coincide():
    timm_model = VisionTransformer(
        img_size=28,
        patch_size=14,
        embed_dim=32,
        depth=2,
        num_heads=2,
        init_values=1e-5,
        num_classes=10,
    )
    sd = from_timm_state_dict(timm_model.state_dict())
    m = DinoVisionTransformer(
        img_size=28, patch_size=14, embed_dim=32, depth=2, num_heads=2, init_values=1e-5
    )
    assert set(sd) | {"mask_token"} == set(m.state_dict())


def _dinov2_chunked(sd, chunks=2, depth=2):
    """Our names -> the reference's BlockChunk names (blocks.{chunk}.{global index}.)."""
    size = depth // chunks
    out = {}
    for k, v in sd.items():
        if k.startswith("blocks."):
            i = int(k.split(".")[1])
            k = f"blocks.{i // size}.{k.split('.', 1)[1]}"
        out[k] = v
    return out


def test_dinov2_formats_convert_to_identical_model(tmp_path):
    src = ours(14, 4)
    sd = src.state_dict()
    x = torch.randn(2, 3, 28, 28)
    expected = src(x)
    head = {
        "dino_head.mlp.0.weight": torch.randn(4, 32),
        "dino_head.last_layer.weight_g": torch.ones(8, 1),
    }
    variants = {
        "hub (plain names)": dict(sd),
        "eval export {'teacher': backbone.+heads}": {
            "teacher": {**{f"backbone.{k}": v for k, v in _dinov2_chunked(sd).items()}, **head}
        },
        "module. prefix": {f"module.backbone.{k}": v for k, v in sd.items()},
        "full training checkpoint": {
            "model": {
                **{f"student.backbone.{k}": v * 0 for k, v in sd.items()},
                **{f"teacher.backbone.{k}": v for k, v in sd.items()},
                "dino_loss.center": torch.zeros(1, 8),
            },
            "iteration": 10,
        },
        "compiled": {f"_orig_mod.{k}": v for k, v in sd.items()},
        "our trainer's teacher export": {
            "backbone": dict(sd),
            "step": 3,
            "student_config": "student: {}",
        },
    }
    for what, obj in variants.items():
        m = DinoVisionTransformer(
            img_size=28,
            patch_size=14,
            embed_dim=32,
            depth=2,
            num_heads=2,
            init_values=1e-5,
            num_register_tokens=4,
        ).eval()
        load_backbone_weights(m, obj)
        torch.testing.assert_close(m(x), expected, atol=1e-6, rtol=1e-6, msg=what)
    # from a file
    path = tmp_path / "teacher_checkpoint.pth"
    torch.save({"teacher": {f"backbone.{k}": v for k, v in sd.items()}}, path)
    torch.testing.assert_close(convert_to_backbone_state_dict(path)["pos_embed"], sd["pos_embed"])
    # student selection from a full checkpoint
    got = convert_to_backbone_state_dict(variants["full training checkpoint"], which="student")
    assert torch.all(got["cls_token"] == 0)


def test_pos_embed_resampled_for_another_grid():
    src = ours(14, 0)  # 2x2 grid
    m = DinoVisionTransformer(
        img_size=56, patch_size=14, embed_dim=32, depth=2, num_heads=2, init_values=1e-5
    )
    report = load_backbone_weights(m, src.state_dict())
    assert report["pos_embed_resampled_from"] == 2 and m.pos_embed.shape == (1, 17, 32)
    torch.testing.assert_close(m.pos_embed[:, 0], src.pos_embed[:, 0])


def test_swiglu_checkpoint_is_a_clear_error():
    sd = dict(ours(14, 0).state_dict())
    sd["blocks.0.mlp.w12.weight"] = sd.pop("blocks.0.mlp.fc1.weight")
    with pytest.raises(ValueError, match="SwiGLU"):
        convert_to_backbone_state_dict(sd)
