"""DINOv2 ViT: names, list forward, stochastic depth by batch subset, pos-embed interpolation,
registers, masks."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from models.vision_transformer import ARCH_SIZES, DinoVisionTransformer, build_backbone


def tiny(**kw) -> DinoVisionTransformer:
    args = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, init_values=1e-5)
    args.update(kw)
    torch.manual_seed(0)
    model = DinoVisionTransformer(**args)
    with torch.no_grad():  # non-trivial LayerScale / tokens so every branch matters
        for name, p in model.named_parameters():
            if name.endswith("gamma") or "token" in name:
                p.normal_(0, 0.5)
    return model


def test_module_names_and_plain_linear_mlp():
    m = tiny(num_register_tokens=2)
    names = set(dict(m.named_parameters()))
    for n in [
        "cls_token",
        "pos_embed",
        "register_tokens",
        "mask_token",
        "patch_embed.proj.weight",
        "norm.weight",
        "blocks.1.norm1.weight",
        "blocks.1.attn.qkv.weight",
        "blocks.1.attn.proj.bias",
        "blocks.1.ls1.gamma",
        "blocks.1.norm2.bias",
        "blocks.1.mlp.fc1.weight",
        "blocks.1.mlp.fc2.bias",
        "blocks.1.ls2.gamma",
    ]:
        assert n in names, n
    assert type(m.blocks[0].mlp.fc1) is nn.Linear and type(m.blocks[0].mlp.fc2) is nn.Linear
    assert m.mask_token.shape == (1, 32) and m.register_tokens.shape == (1, 2, 32)
    assert m.norm.eps == 1e-6 and m.blocks[0].norm1.eps == 1e-6
    no_ls = tiny(init_values=0)
    assert not any("gamma" in n for n, _ in no_ls.named_parameters())
    no_bias = tiny(qkv_bias=False, proj_bias=False, ffn_bias=False)
    b = no_bias.blocks[0]
    assert (
        b.attn.qkv.bias is None
        and b.attn.proj.bias is None
        and b.mlp.fc1.bias is None
        and b.mlp.fc2.bias is None
    )


def test_init_like_reference():
    torch.manual_seed(0)
    m = DinoVisionTransformer(
        img_size=16,
        patch_size=4,
        embed_dim=64,
        depth=2,
        num_heads=2,
        init_values=1e-5,
        num_register_tokens=1,
    )
    assert torch.all(m.mask_token == 0)
    assert m.cls_token.abs().max() < 1e-4 and m.register_tokens.abs().max() < 1e-4
    assert (
        0.015 < m.pos_embed.std() < 0.025
    )  # trunc_normal_(std=0.02) (bounds +-2 absolute, as the reference)
    fc1 = m.blocks[0].mlp.fc1
    assert 0.015 < fc1.weight.std() < 0.025 and torch.all(fc1.bias == 0)
    assert torch.all(m.blocks[0].ls1.gamma == 1e-5)


@pytest.mark.parametrize("arch", list(ARCH_SIZES))
def test_build_backbone_sizes(arch):
    from configs.schema import StudentConfig

    cfg = StudentConfig(arch=arch, patch_size=14, drop_path_rate=0.3, num_register_tokens=4)
    if arch == "vit_large":  # building ViT-L is slow on CPU: check the table only
        assert ARCH_SIZES[arch] == (1024, 24, 16)
        return
    m = build_backbone(cfg, img_size=28)
    dim, depth, heads = ARCH_SIZES[arch]
    assert (m.embed_dim, len(m.blocks), m.num_heads) == (dim, depth, heads)
    assert m.blocks[0].mlp.fc1.out_features == 4 * dim and m.pos_embed.shape == (1, 5, dim)
    assert all(b.sample_drop_ratio == 0.3 for b in m.blocks)  # uniform
    assert build_backbone(cfg, img_size=28, drop_path_rate=0.0).blocks[0].sample_drop_ratio == 0.0


def test_list_forward_equals_per_crop_forward_without_drop_path():
    m = tiny(num_register_tokens=1).train()
    g, l = torch.randn(4, 3, 16, 16), torch.randn(6, 3, 8, 8)
    masks = torch.rand(4, 16) < 0.3
    out_g, out_l = m.forward_features([g, l], [masks, None])
    ref_g, ref_l = m.forward_features(g, masks), m.forward_features(l)
    for a, b in ((out_g, ref_g), (out_l, ref_l)):
        for k in ("x_norm_clstoken", "x_norm_regtokens", "x_norm_patchtokens", "x_prenorm"):
            torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-5)
    assert out_g["masks"] is masks and out_l["masks"] is None
    assert out_g["x_norm_patchtokens"].shape == (4, 16, 32) and out_l[
        "x_norm_patchtokens"
    ].shape == (6, 4, 32)
    assert out_g["x_norm_clstoken"].shape == (4, 32) and out_g["x_norm_regtokens"].shape == (
        4,
        1,
        32,
    )


def test_mlp_sees_one_2d_matrix_of_all_crops():
    m = tiny().train()
    shapes = []
    m.blocks[0].mlp.fc1.register_forward_hook(
        lambda mod, inp, out: shapes.append(tuple(inp[0].shape))
    )
    m.forward_features([torch.randn(4, 3, 16, 16), torch.randn(6, 3, 8, 8)], [None, None])
    assert shapes == [(4 * 17 + 6 * 5, 32)]
    shapes.clear()
    m.forward_features(torch.randn(2, 3, 16, 16))
    assert shapes == [(2 * 17, 32)]


def test_attention_linears_see_one_2d_matrix_of_all_crops():
    """In the list forward qkv and proj get the tokens of all crop batches in one matrix, as the MLP
    does; the single-tensor forward keeps timm's (batch, tokens, dim)."""
    m = tiny().train()
    shapes = {"qkv": [], "proj": []}
    for name in shapes:
        getattr(m.blocks[1].attn, name).register_forward_hook(
            lambda mod, inp, out, name=name: shapes[name].append(tuple(inp[0].shape))
        )
    m.forward_features([torch.randn(4, 3, 16, 16), torch.randn(6, 3, 8, 8)], [None, None])
    assert shapes == {"qkv": [(4 * 17 + 6 * 5, 32)], "proj": [(4 * 17 + 6 * 5, 32)]}
    m.forward_features(torch.randn(2, 3, 16, 16))
    assert shapes["qkv"][1:] == shapes["proj"][1:] == [(2, 17, 32)]


def _hand_attention(attn, x):
    """Multi-head softmax attention written out: per head, softmax(q k^T / sqrt(d)) v."""
    b, n, c = x.shape
    h = attn.num_heads
    d = c // h
    q, k, v = (x @ attn.qkv.weight.T + attn.qkv.bias).split(c, dim=-1)
    heads = []
    for i in range(h):
        qi, ki, vi = (t[..., i * d : (i + 1) * d] for t in (q, k, v))
        weights = torch.softmax(qi @ ki.transpose(1, 2) / math.sqrt(d), dim=-1)
        heads.append(weights @ vi)
    return torch.cat(heads, dim=-1) @ attn.proj.weight.T + attn.proj.bias


def test_list_forward_is_the_hand_written_block_per_crop_batch():
    """The list forward of crop batches of different token counts, in fp64 and without stochastic
    depth, against the block written out per crop batch with a hand-written attention: the shared
    linears change where rows sit in a GEMM, never which tokens attend to which."""
    blk = tiny().double().blocks[0].eval()
    xs = [torch.randn(3, 17, 32, dtype=torch.float64), torch.randn(5, 5, 32, dtype=torch.float64)]
    got = blk.forward_list(xs)
    for x, g in zip(xs, got):
        x = x + blk.ls1.gamma * _hand_attention(
            blk.attn, F.layer_norm(x, (32,), blk.norm1.weight, blk.norm1.bias, 1e-6)
        )
        hidden = F.layer_norm(x, (32,), blk.norm2.weight, blk.norm2.bias, 1e-6)
        mlp = F.gelu(hidden @ blk.mlp.fc1.weight.T + blk.mlp.fc1.bias) @ blk.mlp.fc2.weight.T
        want = x + blk.ls2.gamma * (mlp + blk.mlp.fc2.bias)
        torch.testing.assert_close(g, want, rtol=1e-12, atol=1e-12)


def _manual_block(blk, x, brange_attn, brange_ffn):
    """The reference's drop_add_residual_stochastic_depth, written out for one tensor."""
    b = x.shape[0]
    r = blk.ls1(blk.attn(blk.norm1(x[brange_attn])))
    x = torch.index_add(x, 0, brange_attn, r, alpha=b / len(brange_attn))
    r = blk.ls2(blk.mlp(blk.norm2(x[brange_ffn])))
    return torch.index_add(x, 0, brange_ffn, r, alpha=b / len(brange_ffn))


def test_subset_drop_path_single_tensor_matches_reference_formula():
    m = tiny(drop_path_rate=0.5).train()
    blk = m.blocks[0]
    x = torch.randn(5, 17, 32)
    torch.manual_seed(123)
    got = blk(x)
    torch.manual_seed(123)
    keep = int(5 * 0.5)
    ba = torch.randperm(5)[:keep]
    bf = torch.randperm(5)[:keep]
    torch.testing.assert_close(got, _manual_block(blk, x, ba, bf))
    # samples outside both subsets are untouched
    untouched = sorted(set(range(5)) - set(ba.tolist()) - set(bf.tolist()))
    for i in untouched:
        torch.testing.assert_close(got[i], x[i])


def test_subset_drop_path_list_matches_reference_formula():
    m = tiny(drop_path_rate=0.3).train()
    blk = m.blocks[0]
    xs = [torch.randn(4, 17, 32), torch.randn(6, 5, 32)]
    torch.manual_seed(7)
    got = blk.forward_list(xs)
    torch.manual_seed(7)
    # reference draw order: attention subsets of every crop batch, then the MLP subsets of every
    # crop batch
    ba = [torch.randperm(4)[: int(4 * 0.7)], torch.randperm(6)[: int(6 * 0.7)]]
    bf = [torch.randperm(4)[: int(4 * 0.7)], torch.randperm(6)[: int(6 * 0.7)]]
    for x, g, a, f in zip(xs, got, ba, bf):
        torch.testing.assert_close(g, _manual_block(blk, x, a, f), atol=1e-6, rtol=1e-5)


def test_small_drop_path_rate_single_tensor_is_per_sample_droppath():
    m = tiny(drop_path_rate=0.1).train()
    blk = m.blocks[0]
    x = torch.randn(8, 17, 32)
    torch.manual_seed(3)
    got = blk(x)
    torch.manual_seed(3)
    keep1 = x.new_empty(8, 1, 1).bernoulli_(0.9) / 0.9
    y = x + blk.ls1(blk.attn(blk.norm1(x))) * keep1
    keep2 = x.new_empty(8, 1, 1).bernoulli_(0.9) / 0.9
    y = y + blk.ls2(blk.mlp(blk.norm2(y))) * keep2
    torch.testing.assert_close(got, y)


def test_drop_path_is_reproducible_from_global_rng_and_off_in_eval():
    m = tiny(drop_path_rate=0.4)
    g, l = torch.randn(4, 3, 16, 16), torch.randn(4, 3, 8, 8)
    m.train()
    torch.manual_seed(0)
    a = m.forward_features([g, l], [None, None])[0]["x_norm_clstoken"]
    torch.manual_seed(0)
    b = m.forward_features([g, l], [None, None])[0]["x_norm_clstoken"]
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    m.eval()
    ref = m(g)
    out = m.forward_features([g, l], [None, None])[0]["x_norm_clstoken"]
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_masks_replace_patch_tokens_by_mask_token():
    m = tiny()
    x = torch.randn(2, 3, 16, 16)
    masks = torch.zeros(2, 16, dtype=torch.bool)
    masks[0, [0, 5]] = True
    tokens = m.prepare_tokens_with_masks(x, masks)
    pos = m.pos_embed[0]
    torch.testing.assert_close(tokens[0, 1], m.mask_token[0] + pos[1])
    torch.testing.assert_close(tokens[0, 6], m.mask_token[0] + pos[6])
    plain = m.prepare_tokens_with_masks(x)
    torch.testing.assert_close(tokens[1], plain[1])
    torch.testing.assert_close(tokens[0, 2], plain[0, 2])
    # the masked content does not leak: changing the masked pixels leaves the masked forward
    # unchanged
    x2 = x.clone()
    x2[0, :, :4, :4] = 100.0  # patch 0
    torch.testing.assert_close(
        m.forward_features(x2, masks)["x_prenorm"], m.forward_features(x, masks)["x_prenorm"]
    )


def test_pos_embed_interpolation_like_reference():
    m = tiny(img_size=16, patch_size=4)  # 4x4 grid
    x = torch.randn(1, 3, 24, 32)  # 6x8 grid
    tokens = m.prepare_tokens_with_masks(x)
    assert tokens.shape == (1, 1 + 48, 32)
    pos = m.interpolate_pos_encoding(torch.zeros(1, 49, 32), 24, 32)
    grid = m.pos_embed[:, 1:].reshape(1, 4, 4, 32).permute(0, 3, 1, 2)
    expected = F.interpolate(grid, scale_factor=((6 + 0.1) / 4, (8 + 0.1) / 4), mode="bicubic")
    torch.testing.assert_close(pos[:, 1:], expected.permute(0, 2, 3, 1).reshape(1, 48, 32))
    torch.testing.assert_close(pos[:, 0], m.pos_embed[:, 0])
    # offset 0 -> explicit size; antialias honoured
    m.interpolate_offset, m.interpolate_antialias = 0.0, True
    pos = m.interpolate_pos_encoding(torch.zeros(1, 5, 32), 8, 8)
    expected = F.interpolate(grid, size=(2, 2), mode="bicubic", antialias=True)
    torch.testing.assert_close(pos[:, 1:], expected.permute(0, 2, 3, 1).reshape(1, 4, 32))
    # native size: the parameter itself
    assert m.interpolate_pos_encoding(torch.zeros(1, 17, 32), 16, 16) is m.pos_embed


def test_registers_sit_between_cls_and_patches_without_pos_embed():
    m = tiny(num_register_tokens=3)
    x = torch.randn(2, 3, 16, 16)
    t = m.prepare_tokens_with_masks(x)
    assert t.shape == (2, 1 + 3 + 16, 32)
    torch.testing.assert_close(t[0, 1:4], m.register_tokens[0])
    out = m.forward_features(x)
    assert out["x_norm_regtokens"].shape == (2, 3, 32) and out["x_norm_patchtokens"].shape == (
        2,
        16,
        32,
    )


def test_eval_forward_and_intermediate_layers():
    m = tiny(num_register_tokens=2).eval()
    x = torch.randn(2, 3, 16, 20)
    cls = m(x)
    assert cls.shape == (2, 32)
    torch.testing.assert_close(cls, m.forward_features(x)["x_norm_clstoken"])
    outs = m.get_intermediate_layers(x, n=2, return_class_token=True)
    assert len(outs) == 2 and outs[1][0].shape == (2, 20, 32) and outs[1][1].shape == (2, 32)
    torch.testing.assert_close(outs[-1][1], cls)  # last block, normed -> final CLS
    (r,) = m.get_intermediate_layers(x, n=[0], reshape=True)
    assert r.shape == (2, 32, 4, 5)
    (raw,) = m.get_intermediate_layers(x, n=1, norm=False)
    torch.testing.assert_close(m.norm(raw), m.forward_features(x)["x_norm_patchtokens"])
    assert m(x, is_training=True)["x_norm_clstoken"].shape == (2, 32)


def test_backward_through_list_forward_with_drop_path():
    m = tiny(drop_path_rate=0.3).train()
    out = m.forward_features(
        [torch.randn(4, 3, 16, 16), torch.randn(4, 3, 8, 8)], [torch.rand(4, 16) < 0.5, None]
    )
    loss = sum(o["x_norm_clstoken"].square().sum() + o["x_norm_patchtokens"].mean() for o in out)
    loss.backward()
    assert m.mask_token.grad is not None and m.blocks[1].mlp.fc1.weight.grad.abs().sum() > 0
    assert all(
        math.isfinite(p.grad.abs().sum().item()) for p in m.parameters() if p.grad is not None
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def testadd_to_subset_is_index_add_with_its_gradients(dtype):
    """The gather-add-scatter that replaces index_add (no atomics under torch.compile): its values
    are the exact sums rounded once to the stream's dtype (torch.index_add may round twice in bf16),
    its gradients torch.index_add's; the first and last rows are in the subset, the others
    untouched."""
    from models.stochastic_depth import add_to_subset

    torch.manual_seed(3)
    brange = torch.tensor([6, 0, 3])  # unique, unordered, as randperm gives
    scale = 7 / 3
    x = torch.randn(7, 5, 4, dtype=dtype)
    r = torch.randn(
        3, 5, 4, dtype=dtype
    )  # the branch output, in the stream's dtype as under autocast
    grad = torch.randn(7, 5, 4, dtype=dtype)
    outs = []
    for fn in (
        lambda a, b: add_to_subset(a, brange, b, scale),
        lambda a, b: torch.index_add(a, 0, brange, b, alpha=scale),
    ):
        a, b = x.clone().requires_grad_(), r.clone().requires_grad_()
        out = fn(a, b)
        out.backward(grad)
        outs.append((out.detach(), a.grad, b.grad))
    (got, got_gx, got_gr), (ref, ref_gx, ref_gr) = outs
    exact = x[brange].double() + r.double() * scale
    if dtype == torch.bfloat16:  # computed in fp32, rounded once: the exact sum's bf16 rounding
        assert torch.equal(got[brange], exact.to(dtype))
    torch.testing.assert_close(
        got[brange].double(), exact, rtol=0, atol=2 * torch.finfo(dtype).eps * exact.abs().max()
    )
    torch.testing.assert_close(
        got, ref, rtol=0, atol=2 * torch.finfo(dtype).eps * x.abs().max().item() * scale
    )
    assert torch.equal(got[[1, 2, 4, 5]], x[[1, 2, 4, 5]])
    torch.testing.assert_close(got_gx, ref_gx, rtol=0, atol=0)
    torch.testing.assert_close(got_gr, ref_gr)


def test_add_to_rows_compiles_whole_with_index_adds_gradients():
    """The bf16/fp16 stream's add: under torch.compile(fullgraph=True) (a graph break here would
    split every block) the add and its hand-written backward give torch.index_add's values and
    gradients, also for a residual in another dtype than the stream (its gradient comes back in the
    residual's dtype)."""
    from models.stochastic_depth import AddToRows

    torch.manual_seed(4)
    brange = torch.tensor([2, 5, 0])
    x = torch.randn(6, 3, 8, dtype=torch.float64)
    r = torch.randn(3, 3, 8, dtype=torch.float32)
    grad = torch.randn(6, 3, 8, dtype=torch.float64)
    results = []
    for fn in (
        torch.compile(lambda a, b: AddToRows.apply(a, brange, b, 2.0), fullgraph=True),
        lambda a, b: torch.index_add(a, 0, brange, b.double(), alpha=2.0),
    ):
        a, b = x.clone().requires_grad_(), r.clone().requires_grad_()
        out = fn(a, b)
        out.backward(grad)
        results.append((out.detach(), a.grad, b.grad))
    (got, got_gx, got_gr), (ref, ref_gx, ref_gr) = results
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    assert torch.equal(got_gx, grad) and torch.equal(ref_gx, grad)
    assert got_gr.dtype == torch.float32
    torch.testing.assert_close(got_gr, ref_gr)
    torch.testing.assert_close(got_gr.double(), grad[brange] * 2.0)


@pytest.mark.parametrize(
    "rows",
    [[6, 0, 3], [4], [2, 0, 6, 1, 5, 3, 4]],
    ids=["unordered-first-last", "one-row", "every-row"],
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_take_rows_gradient_adds_the_rows_gradient_into_the_streams(rows, dtype):
    """take_rows's forward is (x, x[rows]); x's gradient is the stream's gradient with the rows'
    gradient added into its rows, each sum rounded once to the dtype (hand-computed in fp64), the
    other rows' gradient passed through bit for bit."""
    from models.stochastic_depth import take_rows

    torch.manual_seed(5)
    rows = torch.tensor(rows)
    x = torch.randn(7, 3, 4, dtype=dtype, requires_grad=True)
    g_stream = torch.randn(7, 3, 4, dtype=dtype)
    g_rows = torch.randn(len(rows), 3, 4, dtype=dtype)
    through, kept = take_rows(x, rows)
    assert torch.equal(through, x) and torch.equal(kept, x[rows])
    torch.autograd.backward([through, kept], [g_stream, g_rows])
    want = g_stream.double()
    for i, r in enumerate(rows.tolist()):
        want[r] += g_rows[i].double()
    assert torch.equal(x.grad, want.to(dtype))
    others = sorted(set(range(7)) - set(rows.tolist()))
    assert torch.equal(x.grad[others], g_stream[others])


def test_take_rows_with_one_output_unused_and_under_compile():
    """When only the rows reach the loss, x's gradient is their scatter into zeros. Compiled whole
    (fullgraph) with a branch and the add that follow it in a block, values and gradients equal
    those of autograd's own indexing compiled alike, bit for bit, in bf16."""
    from models.stochastic_depth import add_to_subset, take_rows

    torch.manual_seed(6)
    rows = torch.tensor([3, 0])
    x = torch.randn(5, 2, 4, requires_grad=True)
    take_rows(x, rows)[1].sum().backward()
    assert torch.equal(x.grad, torch.zeros(5, 2, 4).index_fill(0, rows, 1.0))

    w = torch.randn(4, 4, dtype=torch.bfloat16)
    g = torch.randn(5, 2, 4, dtype=torch.bfloat16)

    def fused(a):
        a, kept = take_rows(a, rows)
        return add_to_subset(a, rows, torch.tanh(kept @ w), 5 / 2)

    def plain(a):
        return add_to_subset(a, rows, torch.tanh(a[rows] @ w), 5 / 2)

    results = []
    for fn in (torch.compile(fused, fullgraph=True), torch.compile(plain, fullgraph=True)):
        a = x.detach().to(torch.bfloat16).requires_grad_()
        out = fn(a)
        out.backward(g)
        results.append((out.detach(), a.grad))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_list_forward_with_drop_path_has_the_reference_formulas_gradients():
    """The block's list forward with stochastic depth (take_rows, the gather-add-scatter and their
    hand-written backwards) against the reference's formula on autograd's own indexing and
    index_add: the inputs' and every parameter's gradients, in fp64."""
    m = tiny(drop_path_rate=0.3).double().train()
    blk = m.blocks[0]
    torch.manual_seed(8)
    xs = [torch.randn(4, 17, 32, dtype=torch.float64), torch.randn(6, 5, 32, dtype=torch.float64)]
    grads = [torch.randn_like(x) for x in xs]

    def gradients(forward):
        blk.zero_grad()
        inputs = [x.clone().requires_grad_() for x in xs]
        torch.autograd.backward(forward(inputs), grads)
        return [i.grad for i in inputs] + [p.grad.clone() for p in blk.parameters()]

    torch.manual_seed(9)
    got = gradients(blk.forward_list)
    torch.manual_seed(9)
    ba = [torch.randperm(4)[: int(4 * 0.7)], torch.randperm(6)[: int(6 * 0.7)]]
    bf = [torch.randperm(4)[: int(4 * 0.7)], torch.randperm(6)[: int(6 * 0.7)]]
    want = gradients(
        lambda inputs: [_manual_block(blk, x, a, f) for x, a, f in zip(inputs, ba, bf)]
    )
    assert len(got) == len(want) == 2 + len(list(blk.parameters()))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
