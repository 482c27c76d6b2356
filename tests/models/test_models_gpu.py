"""The meta-architecture on a CUDA GPU under bf16 autocast (the trainer's setting). Run with `pytest
-m gpu`."""

import pytest
import torch
from models_test_helpers import build, expected_terms, make_batch, tiny_cfg

from models.vision_transformer import DinoVisionTransformer

pytestmark = pytest.mark.gpu


def test_ssl_meta_arch_bf16_autocast_forward_backward_ema():
    for centering in ("centering", "sinkhorn_knopp"):
        model = build(tiny_cfg(drop_path_rate=0.3, train__centering=centering)).cuda()
        batch = make_batch().to("cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            total, terms = model(batch, teacher_temp=0.04)
        assert total.dtype == torch.float32 and torch.isfinite(total)
        assert all(torch.isfinite(v) for v in terms.values())
        total.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.student.parameters())
        model.update_teacher(0.99)
        assert model.dino_loss.center.dtype == torch.float32

    # bf16 losses track the fp32 ones (no drop-path, fresh centers)
    model = build(tiny_cfg()).cuda()
    batch = make_batch().to("cuda")
    exp = expected_terms(model, batch, 0.05)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        _, terms = model(batch, teacher_temp=0.05)
    for k, v in terms.items():
        torch.testing.assert_close(v, exp[k].detach(), atol=0.05, rtol=0.05, msg=k)


def test_list_forward_bf16_matches_per_crop():
    torch.manual_seed(0)
    m = DinoVisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, init_values=1e-5
    ).cuda()
    g, loc = torch.randn(4, 3, 32, 32, device="cuda"), torch.randn(8, 3, 16, 16, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out_g, out_l = m.forward_features([g, loc], [None, None])
        ref_g, ref_l = m.forward_features(g), m.forward_features(loc)
    torch.testing.assert_close(
        out_g["x_norm_clstoken"], ref_g["x_norm_clstoken"], atol=2e-2, rtol=2e-2
    )
    torch.testing.assert_close(
        out_l["x_norm_patchtokens"], ref_l["x_norm_patchtokens"], atol=2e-2, rtol=2e-2
    )
