"""train.residual_dtype (training/numerics.py): `amp` computes the backbone's residual stream,
LayerNorm and LayerScale in the autocast dtype, as the reference's FSDP
MixedPrecision(param_dtype=bf16) does. Checked against an independent emulation of param_dtype (a
bf16 copy of the model run without autocast), and shown to change nothing where autocast is off."""

import copy

import pytest
import torch
from torch import nn

from configs import ConfigError, load_config
from models.vision_transformer import DinoVisionTransformer
from models.vit_block import LayerScale
from training.numerics import InputDtypeLayerNorm, InputDtypeLayerScale, apply_residual_dtype

BF16 = torch.bfloat16


def backbone(seed=0, **kw) -> DinoVisionTransformer:
    torch.manual_seed(seed)
    model = DinoVisionTransformer(
        img_size=16, patch_size=4, embed_dim=48, depth=3, num_heads=3, init_values=0.5, **kw
    )
    for (
        p
    ) in model.parameters():  # LayerScale, norms and tokens away from their init, so casts matter
        p.data.add_(0.05 * torch.randn_like(p))
    return model


def images(seed=1, n=4, size=16):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def features(model, x, masks=None):
    out = model.forward_features(x, masks)
    return torch.cat([out["x_norm_clstoken"][:, None], out["x_norm_patchtokens"]], dim=1)


def test_fp32_changes_nothing_and_a_wrong_value_is_refused():
    model = backbone()
    assert apply_residual_dtype(model, "fp32") == []
    assert all(
        type(m) in (nn.LayerNorm, LayerScale)
        for m in model.modules()
        if isinstance(m, (nn.LayerNorm, LayerScale))
    )
    with pytest.raises(ValueError, match="fp32, amp"):
        apply_residual_dtype(model, "bf16")
    with pytest.raises(ConfigError, match="train.residual_dtype"):
        load_config(None, ["train.residual_dtype=bf16"])


def test_amp_converts_every_norm_and_layerscale_once_and_keeps_the_state_dict():
    model = backbone()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert apply_residual_dtype(model, "amp") == ["backbone"]
    assert apply_residual_dtype(model, "amp") == []  # already converted: no second hook
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    scales = [m for m in model.modules() if isinstance(m, LayerScale)]
    assert len(norms) == 2 * 3 + 1 and all(type(m) is InputDtypeLayerNorm for m in norms)
    assert len(scales) == 2 * 3 and all(type(m) is InputDtypeLayerScale for m in scales)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


@pytest.mark.parametrize("crop_list", [False, True])
def test_without_autocast_amp_computes_exactly_what_fp32_computes(crop_list):
    plain, converted = backbone(), backbone()
    apply_residual_dtype(converted, "amp")
    masks = torch.zeros(4, 16, dtype=torch.bool)
    masks[1, [2, 5]] = True
    if crop_list:  # the training path: a list of crop batches, through Block.forward_list
        xs, ms = [images(1), images(2, size=8)], [masks, None]
        outs = [
            [o["x_norm_clstoken"] for o in m.forward_features(xs, ms)] for m in (plain, converted)
        ]
        assert all(torch.equal(a, b) for a, b in zip(*outs))
        losses = [sum(o.square().sum() for o in out) for out in outs]
    else:
        outs = [features(m, images(), masks) for m in (plain, converted)]
        assert torch.equal(*outs)
        losses = [o.square().sum() for o in outs]
    for loss in losses:
        loss.backward()
    for (name, a), b in zip(plain.named_parameters(), converted.parameters()):
        assert torch.equal(a.grad, b.grad), name


def test_under_autocast_the_residual_stream_stays_in_bf16_and_gradients_in_fp32():
    seen = {}

    def record(name):
        def hook(module, args, out):
            seen[name] = out.dtype  # (a hook returning a value would replace the output)

        return hook

    for setting, expected in (("fp32", torch.float32), ("amp", BF16)):
        model = backbone()
        apply_residual_dtype(model, setting)
        seen.clear()
        for i, blk in enumerate(model.blocks):
            blk.register_forward_hook(record(f"block{i}"))
            blk.norm1.register_forward_hook(record(f"block{i}.norm1"))
            blk.ls2.register_forward_hook(record(f"block{i}.ls2"))
        with torch.autocast("cpu", dtype=BF16):
            out = features(model, images())
        assert set(seen.values()) == {expected}, (setting, seen)
        assert out.dtype == expected
        out.float().square().sum().backward()
        assert {p.grad.dtype for p in model.parameters() if p.grad is not None} == {torch.float32}
        assert all(p.dtype == torch.float32 for p in model.parameters())  # masters stay fp32


def bf16_valued(model):
    """The model with every parameter rounded to a bf16 value (still fp32 tensors), so that casting
    it is exact."""
    for p in model.parameters():
        p.data = p.data.to(BF16).float()
    return model


@pytest.mark.parametrize("bf16_params", [True, False])
def test_amp_is_the_reference_param_dtype_forward(bf16_params):
    """The independent reference: FSDP MixedPrecision(param_dtype=bf16) runs the forward with every
    parameter cast to bf16, which a bf16 copy of the model run without autocast reproduces. With
    parameters that are bf16 values (casting them exact) `amp` under autocast computes that forward
    bit for bit: the one sum it does in fp32 (cls token and position embedding onto the tokens, then
    cast) rounds as a bf16 sum does. `fp32` keeps 16 more mantissa bits in the residual stream and
    differs. With arbitrary fp32 parameters both are within a few bf16 ulps."""
    make = (lambda: bf16_valued(backbone())) if bf16_params else backbone
    x = images(3, n=8).to(BF16).float()  # images that are bf16 values too
    want = features(copy.deepcopy(make()).to(BF16), x.to(BF16)).float()
    errors = {}
    for setting in ("fp32", "amp"):
        model = make()
        apply_residual_dtype(model, setting)
        with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
            got = features(model, x).float()
        errors[setting] = ((got - want).norm() / want.norm()).item()
    if bf16_params:
        assert errors["amp"] == 0.0 and errors["fp32"] > 1e-3, errors
    else:
        assert errors["amp"] < 0.02 and errors["fp32"] < 0.02, (
            errors
        )  # 2^-8 = 0.4% per bf16 rounding


def test_a_teacher_and_student_are_both_converted_and_an_eval_forward_is_unchanged():
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.student, self.teacher = (
                nn.ModuleDict({"backbone": backbone()}),
                nn.ModuleDict({"backbone": backbone()}),
            )

    pair = Pair()
    assert apply_residual_dtype(pair, "amp") == ["student.backbone", "teacher.backbone"]
    plain = backbone()
    with (
        torch.no_grad()
    ):  # an evaluation in fp32 (features extracted without autocast) sees no difference
        assert torch.equal(plain(images()), pair.teacher["backbone"](images()))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, torch.float16])
def test_cuda_autocast_with_compiled_blocks_keeps_the_residual_stream_in_the_autocast_dtype(dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = backbone().cuda()
    apply_residual_dtype(model, "amp")
    for blk in model.blocks:
        blk.compile()
    with torch.autocast("cuda", dtype=dtype):
        out = model.forward_features([images().cuda(), images(2, size=8).cuda()], [None, None])
    assert {o["x_prenorm"].dtype for o in out} == {dtype}
    reference = copy.deepcopy(backbone()).cuda().to(dtype)
    want = reference.forward_features(images().cuda().to(dtype))["x_norm_clstoken"].float()
    got = out[0]["x_norm_clstoken"].float()
    assert ((got - want).norm() / want.norm()).item() < 0.02


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32])
def test_compiled_stochastic_depth_add_is_index_add(dtype):
    """The stochastic-depth add as torch.compile lowers it (a gather-add-scatter, no atomics)
    against eager torch.index_add on the GPU, at a ViT-L-like row size, in every stream dtype."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from models.stochastic_depth import add_to_subset

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 257, 1024, device="cuda", generator=gen).to(dtype)
    brange = torch.randperm(64, device="cuda", generator=gen)[:44]
    r = torch.randn(44, 257, 1024, device="cuda", generator=gen).to(dtype)
    got = torch.compile(add_to_subset)(x, brange, r, 64 / 44)
    want = torch.index_add(x.float(), 0, brange, r.float(), alpha=64 / 44)
    torch.testing.assert_close(got.float(), want, rtol=2 * torch.finfo(dtype).eps, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, torch.float32])
def test_compiled_take_rows_gradients_equal_autograd_indexing_on_the_gpu(dtype):
    """The stochastic-depth gather with its hand-written backward (take_rows), compiled with a
    branch and the add at a ViT-L-like row size on the GPU: values and the stream's gradient equal
    those of autograd's own indexing compiled alike, bit for bit, in both stream dtypes."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from models.stochastic_depth import add_to_subset, take_rows

    gen = torch.Generator(device="cuda").manual_seed(1)
    x0 = torch.randn(64, 257, 1024, device="cuda", generator=gen).to(dtype)
    g = torch.randn(64, 257, 1024, device="cuda", generator=gen).to(dtype)
    w = torch.randn(1024, 1024, device="cuda", generator=gen).to(dtype) / 32
    rows = torch.randperm(64, device="cuda", generator=gen)[:44]

    def fused(x):
        x, kept = take_rows(x, rows)
        return add_to_subset(x, rows, torch.tanh(kept @ w), 64 / 44)

    def plain(x):
        return add_to_subset(x, rows, torch.tanh(x[rows] @ w), 64 / 44)

    results = []
    for fn in (fused, plain):
        x = x0.clone().requires_grad_()
        out = torch.compile(fn, fullgraph=True)(x)
        out.backward(g)
        results.append((out.detach(), x.grad))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_a_cpu_run_with_amp_records_the_setting_and_trains_as_fp32(tmp_path):
    """On a CPU autocast is off, so `amp` computes what `fp32` computes (the losses equal step for
    step); config.yaml keeps the setting and run_info.json / the start-up summary say which dtype
    the residual stream used."""
    import json

    from train_runs import run_train

    from rundir.metrics import read_metrics

    runs = {setting: tmp_path / setting for setting in ("fp32", "amp")}
    for setting, run in runs.items():
        run_train(
            run,
            "train.max_steps=2",
            f"train.residual_dtype={setting}",
            "sparsity.sparse_fraction=0.0",
        )
    info = json.loads((runs["amp"] / "run_info.json").read_text())
    assert (info["residual_dtype"], info["residual_dtype_configured"]) == ("float32", "amp")
    assert load_config(runs["amp"] / "config.yaml").train.residual_dtype == "amp"
    assert (
        "residual stream float32 (train.residual_dtype=amp)"
        in (runs["amp"] / "log.txt").read_text()
    )
    losses = {
        s: [r["loss"] for r in read_metrics(run / "metrics.jsonl")] for s, run in runs.items()
    }
    assert len(losses["amp"]) == 2 and losses["amp"] == losses["fp32"]
