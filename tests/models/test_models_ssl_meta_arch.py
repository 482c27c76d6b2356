"""SSLMetaArch on tiny configs: losses against an independent write-out of the reference's formulas,
teacher/EMA."""

import copy
import math

import pytest
import torch
from models_test_helpers import N_LOCAL, B, G, L, P, build, expected_terms, make_batch, tiny_cfg
from torch import nn


@pytest.mark.parametrize("n_local", [N_LOCAL, 0])
def test_losses_match_reference_formulas(n_local):
    model = build(
        tiny_cfg(dino__loss_weight=1.5, ibot__loss_weight=0.7, dino__koleo_loss_weight=0.2)
    )
    batch = make_batch(n_local=n_local)
    exp = expected_terms(model, batch, teacher_temp=0.05)
    total, terms = model(batch, teacher_temp=0.05)
    assert set(terms) == {
        "dino_local_crops_loss",
        "dino_global_crops_loss",
        "koleo_loss",
        "ibot_loss",
    }
    for k, v in terms.items():
        torch.testing.assert_close(v, exp[k].detach(), atol=2e-5, rtol=2e-5, msg=k)
        assert not v.requires_grad
    torch.testing.assert_close(total.detach(), sum(terms.values()))
    # the teacher chunks really are swapped (the unswapped pairing gives another value)
    assert not torch.allclose(
        terms["dino_global_crops_loss"], exp["_unswapped_global"].detach(), atol=1e-4
    )
    if n_local == 0:
        assert terms["dino_local_crops_loss"] == 0


def test_forward_backward_finite_and_teacher_frozen():
    model = build(tiny_cfg(drop_path_rate=0.3))
    total, terms = model(make_batch(), teacher_temp=0.04)
    assert torch.isfinite(total) and all(torch.isfinite(v) and v != 0 for v in terms.values())
    total.backward()
    for name, p in model.student.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert all(p.grad is None and not p.requires_grad for p in model.teacher.parameters())
    assert model.training and not model.teacher.training and model.student.training
    model.train()
    assert not model.teacher.training and not model.teacher["backbone"].blocks[0].training
    assert all(b.sample_drop_ratio == 0 for b in model.teacher["backbone"].blocks)
    assert all(b.sample_drop_ratio == 0.3 for b in model.student["backbone"].blocks)


def test_centers_update_after_use_and_are_saved():
    model = build(tiny_cfg())
    batch = make_batch()
    with torch.no_grad():
        t_out = model.teacher["backbone"].forward_features(batch.global_crops)
        cls_head = model.teacher["dino_head"](t_out["x_norm_clstoken"])
        patch_head = model.teacher["dino_head"](t_out["x_norm_patchtokens"][batch.masks])
    model(batch, teacher_temp=0.04)
    torch.testing.assert_close(model.dino_loss.center, 0.1 * cls_head.mean(0, keepdim=True))
    torch.testing.assert_close(
        model.ibot_patch_loss.center, 0.1 * patch_head.mean(0).view(1, 1, -1)
    )
    sd = model.state_dict()
    assert "dino_loss.center" in sd and "ibot_patch_loss.center" in sd


def test_sinkhorn_and_separate_ibot_head():
    model = build(
        tiny_cfg(
            train__centering="sinkhorn_knopp", ibot__separate_head=True, ibot__head_n_prototypes=20
        )
    )
    assert set(model.student) == {"backbone", "dino_head", "ibot_head"} == set(model.teacher)
    assert model.student["ibot_head"].last_layer.out_features == 20
    batch = make_batch()
    total, terms = model(batch, teacher_temp=0.04)
    assert torch.isfinite(total) and terms["ibot_loss"] > 0
    total.backward()
    assert model.student["ibot_head"].last_layer.weight_v.grad is not None
    assert torch.all(model.dino_loss.center == 0)  # SK does not touch the centers


def test_upperbound_padding_does_not_change_losses():
    model = build(tiny_cfg())
    a = model(make_batch(extra_upperbound=0), teacher_temp=0.04)[1]
    model.dino_loss.center.zero_(), model.ibot_patch_loss.center.zero_()
    b = model(make_batch(extra_upperbound=7), teacher_temp=0.04)[1]
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "centering,separate",
    [
        ("centering", False),
        ("sinkhorn_knopp", False),
        ("sinkhorn_knopp", True),
        ("centering", True),
    ],
)
def test_masked_patches_padded_to_the_bound_give_the_same_step(centering, separate):
    """The fixed-shape batch a CUDA graph replays (mask_indices / masks_weight padded to upperbound
    with index 0 and weight 0): same losses, gradients and loss centers as the unpadded batch, and a
    0-d tensor teacher temperature gives what the float gives. Checked against the reference
    formulas' write-out too (expected_terms)."""
    cfg = tiny_cfg(
        train__centering=centering, ibot__separate_head=separate, dino__koleo_loss_weight=0.1
    )
    results = []
    for padded, temp in ((False, 0.05), (True, torch.tensor(0.05))):
        model = build(cfg)
        batch = make_batch(extra_upperbound=6)
        if padded:
            batch = batch.padded_to_bound()
            assert (
                batch.mask_indices.shape[0] == batch.upperbound
                and batch.masks_weight[-6:].eq(0).all()
            )
        total, terms = model(batch, teacher_temp=temp)
        total.backward()
        grads = {n: p.grad.clone() for n, p in model.student.named_parameters()}
        results.append(
            (terms, grads, model.dino_loss.center.clone(), model.ibot_patch_loss.center.clone())
        )
    (t0, g0, dc0, ic0), (t1, g1, dc1, ic1) = results
    if centering == "centering" and not separate:
        exp = expected_terms(build(cfg), make_batch(extra_upperbound=6), teacher_temp=0.05)
        torch.testing.assert_close(t1["ibot_loss"], exp["ibot_loss"].detach(), atol=2e-5, rtol=2e-5)
    for k in t0:
        torch.testing.assert_close(t1[k], t0[k], atol=1e-6, rtol=1e-5, msg=k)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], atol=1e-6, rtol=1e-5, msg=n)
    torch.testing.assert_close(dc1, dc0)
    torch.testing.assert_close(ic1, ic0)
    assert t1["ibot_loss"] != 0


def test_padding_past_the_bound_is_refused():
    batch = make_batch(extra_upperbound=0)
    batch.upperbound -= 1
    with pytest.raises(ValueError, match="exceed the batch's upperbound"):
        batch.padded_to_bound()


def test_teacher_starts_equal_and_ema_update_math():
    model = build(tiny_cfg())
    for (ns, s), (nt, t) in zip(model.student.named_parameters(), model.teacher.named_parameters()):
        assert ns == nt and torch.equal(s, t)
    with torch.no_grad():
        for p in model.student.parameters():
            p.add_(torch.randn_like(p))
    before = {n: t.clone() for n, t in model.teacher.named_parameters()}
    student = dict(model.student.named_parameters())
    model.update_teacher(0.9)
    for n, t in model.teacher.named_parameters():
        torch.testing.assert_close(t, 0.9 * before[n] + 0.1 * student[n])
    model.update_teacher(0.0)
    for n, t in model.teacher.named_parameters():
        torch.testing.assert_close(t, student[n])


class SwappedLinear(nn.Linear):
    """Stands in for a 2:4-sparse linear: same parameter names, another class."""


def test_ema_matches_by_name_after_student_mlp_swap():
    model = build(tiny_cfg())
    mlp = model.student["backbone"].blocks[0].mlp
    new = SwappedLinear(mlp.fc1.in_features, mlp.fc1.out_features)
    with torch.no_grad():
        new.weight.copy_(mlp.fc1.weight * 2)
        new.bias.copy_(mlp.fc1.bias)
    # appended at the end of named_parameters? no: same position; the EMA matches by name anyway
    mlp.fc1 = new
    old = model.teacher["backbone"].blocks[0].mlp.fc1.weight.clone()
    model.update_teacher(0.5)
    torch.testing.assert_close(
        model.teacher["backbone"].blocks[0].mlp.fc1.weight, 0.5 * old + 0.5 * new.weight
    )
    assert type(model.teacher["backbone"].blocks[0].mlp.fc1) is nn.Linear  # the teacher stays dense
    mlp.fc1.extra = nn.Parameter(torch.zeros(1))
    with pytest.raises(RuntimeError, match="do not match by name"):
        model.update_teacher(0.5)


def test_teacher_export_and_param_groups():
    model = build(tiny_cfg(student__num_register_tokens=2))
    sd = model.teacher_backbone_state_dict()
    assert set(sd) == set(model.student["backbone"].state_dict()) and "register_tokens" in sd
    groups = model.get_params_groups()
    n = sum(len(g["params"]) for g in groups)
    assert n == sum(1 for p in model.student.parameters() if p.requires_grad)
    assert not any(p is q for g in groups for p in g["params"] for q in model.teacher.parameters())


def test_loss_weights_scale_terms():
    batch = make_batch()
    a = build(tiny_cfg())(copy.deepcopy(batch), 0.04)[1]
    b = build(tiny_cfg(dino__loss_weight=2.0, ibot__loss_weight=3.0, dino__koleo_loss_weight=0.0))(
        batch, 0.04
    )[1]
    torch.testing.assert_close(b["dino_local_crops_loss"], 2 * a["dino_local_crops_loss"])
    torch.testing.assert_close(b["dino_global_crops_loss"], 2 * a["dino_global_crops_loss"])
    torch.testing.assert_close(b["ibot_loss"], 3 * a["ibot_loss"])
    assert b["koleo_loss"] == 0 and math.isfinite(a["koleo_loss"].item())


def test_pretrained_weights_load_into_student_and_teacher(tmp_path):
    src = build(tiny_cfg(), seed=5)
    path = tmp_path / "teacher_checkpoint.pth"
    torch.save(
        {"teacher": {f"backbone.{k}": v for k, v in src.teacher_backbone_state_dict().items()}},
        path,
    )
    model = build(tiny_cfg(student__pretrained_weights=str(path)), seed=6, perturb=False)
    for k, v in src.teacher_backbone_state_dict().items():
        assert torch.equal(model.student["backbone"].state_dict()[k], v), k
        assert torch.equal(model.teacher["backbone"].state_dict()[k], v), k


def test_batch_from_the_data_collate():
    """Contract with `data.collate`: its SSLBatch goes straight into forward, and the losses match
    the formulas."""
    from data.collate import SSLCollate, SSLSample

    cfg = tiny_cfg(drop_path_rate=0.0)
    collate = SSLCollate(
        patches_per_side=G // P,
        local_crops_size=L,
        mask_ratio_min_max=cfg.ibot.mask_ratio_min_max,
        mask_sample_probability=cfg.ibot.mask_sample_probability,
        seed=0,
        rank=0,
    )
    gen = torch.Generator().manual_seed(1)
    samples = [
        SSLSample(
            global_crops=[torch.randn(3, G, G, generator=gen) for _ in range(2)],
            local_crops=[torch.randn(3, L, L, generator=gen) for _ in range(N_LOCAL)],
            label=i,
            position=i,
            corrupt_skipped=0,
        )
        for i in range(B)
    ]
    batch = collate(samples)
    assert batch.mask_indices.numel() > 0
    model = build(cfg)
    exp = expected_terms(model, batch, 0.04)
    total, terms = model(batch, teacher_temp=0.04)
    for k, v in terms.items():
        torch.testing.assert_close(v, exp[k].detach(), atol=2e-5, rtol=2e-5, msg=k)
    total.backward()


def test_compiled_student_backbone_keeps_names_for_ema_and_groups():
    model = build(tiny_cfg())
    model.student["backbone"] = torch.compile(model.student["backbone"], backend="eager")
    total, _ = model(make_batch(), teacher_temp=0.04)
    total.backward()
    model.update_teacher(0.5)
    names = {n for g in model.get_params_groups() for n in g["names"]}
    assert "backbone.blocks.0.mlp.fc1.weight" in names and not any("_orig_mod" in n for n in names)


def test_batch_is_typed_and_moved_once_by_its_owner():
    """forward reads an `SSLBatch` already on the model's device (the loader's one copy); it never
    copies it, and refuses a batch elsewhere or an untyped dict instead of copying it a second
    time."""
    model = build(tiny_cfg())
    batch = make_batch()
    moved = batch.to("meta")
    on_device = (
        "global_crops",
        "local_crops",
        "masks",
        "mask_indices",
        "masks_weight",
        "n_masked_patches",
    )
    assert all(getattr(moved, k).device.type == "meta" for k in on_device)
    assert (
        moved.labels is batch.labels and moved.corrupt_skipped is batch.corrupt_skipped
    )  # host bookkeeping
    assert batch.to("cpu").global_crops is batch.global_crops  # already there: no copy
    with pytest.raises(ValueError, match=r"batch.to\(device\)"):
        model(moved, teacher_temp=0.04)
    with pytest.raises(TypeError, match="SSLBatch"):
        model(batch.fields(), teacher_temp=0.04)
