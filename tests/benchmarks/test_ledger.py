"""CPU tests of the step's ledger (scripts/benchmarks/ledger.py): a real host profile of a tiny
student / teacher / head model, its GEMM and GELU ops standing in for kernels, filed by hand-worked
classes; and the projections' arithmetic by hand."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from scripts.benchmarks import ledger as L

EMBED, HIDDEN, TOKENS = 8, 32, 12


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(EMBED, EMBED)  # another linear: embed x embed
        self.fc1, self.act, self.fc2 = nn.Linear(EMBED, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, EMBED)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(self.qkv(x))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.student = nn.ModuleDict({"backbone": Backbone(), "head": nn.Linear(EMBED, 5)})
        self.teacher = nn.ModuleDict({"backbone": Backbone()})
        self.teacher.requires_grad_(False)

    def forward(self, x):
        with torch.no_grad():
            target = self.teacher["backbone"](x)
        return ((self.student["head"](self.student["backbone"](x)) - target[:, :5]) ** 2).mean()


# host ops standing in for kernels, named as the GPU's kernels would be categorized
STAND_IN = {
    "aten::addmm": "nvjet_gemm",
    "aten::mm": "nvjet_gemm",
    "aten::gelu": "triton_poi_fused_gelu_0",
    "aten::gelu_backward": "triton_poi_fused_gelu_backward_1",
    "aten::_foreach_lerp_": "multi_tensor_lerp",
}


def profiled_records():
    torch.manual_seed(0)
    model = Model()
    trainer = SimpleNamespace(model=model, forward_model=model)
    opt = torch.optim.SGD(model.student.parameters(), lr=0.1)
    x = torch.randn(TOKENS, EMBED)
    from torch.profiler import ProfilerActivity, profile

    with (
        L.annotated(trainer),
        profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof,
    ):
        trainer.forward_model(x).backward()
        opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(
                list(model.teacher.parameters()), list(model.student["backbone"].parameters()), 0.1
            )
    assert (
        trainer.forward_model is model and not model.student["backbone"]._forward_hooks
    )  # all removed
    events = prof.events()
    return L.kernel_records(
        events,
        [(STAND_IN[e.name], e.time_range.elapsed_us(), e) for e in events if e.name in STAND_IN],
    )


def test_kernels_filed_by_direction_owner_and_shape():
    records = profiled_records()
    got = sorted(
        (
            r.direction,
            r.owner,
            L.classify(r, (EMBED, HIDDEN)),
            tuple(r.shapes[1:3]) if r.op == "aten::addmm" else tuple(r.shapes[:2]),
        )
        for r in records
    )
    T, E, H = TOKENS, EMBED, HIDDEN
    expected = sorted(
        [
            # teacher forward (no gradient): qkv, fc1, gelu, fc2
            ("forward", "teacher.backbone", "other_linears", ((T, E), (E, E))),
            ("forward", "teacher.backbone", "teacher_mlp_forward", ((T, E), (E, H))),
            ("forward", "teacher.backbone", "mlp_gelu", ((T, H), ())),
            ("forward", "teacher.backbone", "teacher_mlp_forward", ((T, H), (H, E))),
            # student forward, then its head
            ("forward", "student.backbone", "other_linears", ((T, E), (E, E))),
            ("forward", "student.backbone", "student_mlp_forward", ((T, E), (E, H))),
            ("forward", "student.backbone", "mlp_gelu", ((T, H), ())),
            ("forward", "student.backbone", "student_mlp_forward", ((T, H), (H, E))),
            ("forward", "heads_and_losses", "heads_and_losses", ((T, E), (E, 5))),
            # backward: the head's input and weight gradients, then the MLP's, then qkv's weight
            # gradient (x needs none)
            ("backward", "heads_and_losses", "heads_and_losses", ((T, 5), (5, E))),
            ("backward", "heads_and_losses", "heads_and_losses", ((5, T), (T, E))),
            (
                "backward",
                "student.backbone",
                "student_mlp_input_grad",
                ((T, E), (E, H)),
            ),  # fc2's dx
            (
                "backward",
                "student.backbone",
                "student_mlp_weight_grad",
                ((E, T), (T, H)),
            ),  # fc2's dW (E x H)
            ("backward", "student.backbone", "mlp_gelu", ((T, H), (T, H))),
            (
                "backward",
                "student.backbone",
                "student_mlp_input_grad",
                ((T, H), (H, E)),
            ),  # fc1's dx
            (
                "backward",
                "student.backbone",
                "student_mlp_weight_grad",
                ((H, T), (T, E)),
            ),  # fc1's dW (H x E)
            ("backward", "student.backbone", "other_linears", ((E, T), (T, E))),  # qkv's dW
            (
                "after",
                None,
                "optimizer_and_ema",
                ((E, E), (E,)),
            ),  # the lerp's first tensors: qkv's weight and bias
        ]
    )
    assert [g[:3] for g in got] == [e[:3] for e in expected]
    assert [g[3] for g in got if g[2] != "optimizer_and_ema"] == [
        e[3] for e in expected if e[2] != "optimizer_and_ema"
    ]


def test_ledger_sums_times_flops_and_idle():
    def rec(cls_args, us, shapes=(), op_id=0):
        direction, owner, category, name = cls_args
        return L.KernelRecord(name, us, category, "aten::mm", op_id, shapes, direction, owner)

    fwd = ("forward", "student.backbone", "dense_gemm", "nvjet")
    recs = [
        rec(fwd, 1000, ((100, 8), (8, 32)), op_id=1),
        rec(
            fwd, 200, ((100, 8), (8, 32)), op_id=1
        ),  # a second kernel of the same op (split-K): FLOPs once
        rec(("backward", "student.backbone", "attention", "flash_bwd"), 500),
        rec(("after", None, "optimizer", "multi_tensor_apply"), 100),
    ]
    out = L.ledger(recs, steps=2, mlp_dims=(8, 32), step_ms=2.0)
    assert out["ms"]["student_mlp_forward"] == 0.6 and out["kernels"]["student_mlp_forward"] == 1.0
    assert out["ms"]["attention"] == 0.25 and out["ms"]["optimizer_and_ema"] == 0.05
    assert out["dense_gemm_tflop"] == {"student_mlp_forward": round(2 * 100 * 8 * 32 / 2 / 1e12, 4)}
    assert out["busy_ms"] == pytest.approx(0.9) and out["idle_ms"] == pytest.approx(1.1)
    assert sum(out["ms"].values()) == pytest.approx(0.9)


def test_ledger_lists_each_class_top_ops_largest_first_as_many_as_asked():
    recs = [
        L.KernelRecord(
            f"k{i}",
            100.0 * i,
            "other",
            f"triton_poi_fused_add_{i}",
            i,
            (),
            "forward",
            "student.backbone",
        )  # fmt: skip
        for i in range(1, 7)
    ]
    ops = {t: L.ledger(recs, steps=1, mlp_dims=(8, 32), top=t)["top_ops"] for t in (2, 10)}
    assert ops[2] == {"norms_and_elementwise": [["triton_poi_fused_add_6", 0.6],
                                                ["triton_poi_fused_add_5", 0.5]]}  # fmt: skip
    assert [op for op, _ in ops[10]["norms_and_elementwise"]] == [
        f"triton_poi_fused_add_{i}" for i in range(6, 0, -1)
    ]


def test_ledger_names_the_shapes_each_top_op_ran_on_largest_first():
    """An op such as aten::sum launched on several shapes: per top op, its shapes by time a step
    (two steps here), with their kernels a step, the largest three."""

    def rec(us, shapes, op="aten::sum", i=0):
        return L.KernelRecord("k", us, "other", op, i, shapes, "forward", "student.backbone")

    big, small, tiny, rest = ((3800, 65536),), ((128, 65536),), ((64,),), ((8, 8), (8,))
    recs = [rec(800.0, big), rec(900.0, big), rec(300.0, small), rec(10.0, tiny), rec(5.0, rest)]
    recs.append(rec(50.0, big, op="aten::copy_"))
    out = L.ledger(recs, steps=2, mlp_dims=(8, 32), top=4)
    shapes = out["top_op_shapes"]["norms_and_elementwise"]
    assert shapes["aten::sum"] == [
        ["[[3800, 65536]]", 0.85, 1.0],
        ["[[128, 65536]]", 0.15, 0.5],
        ["[[64]]", 0.005, 0.5],
    ]
    assert shapes["aten::copy_"] == [["[[3800, 65536]]", 0.025, 0.5]]
    assert set(shapes) == {op for op, _ in out["top_ops"]["norms_and_elementwise"]}


def test_projections_and_in_place_by_hand():
    ms = dict.fromkeys(L.CLASSES, 0.0)
    ms.update(
        student_mlp_forward=20.0,
        student_mlp_input_grad=20.0,
        student_mlp_weight_grad=20.0,
        teacher_mlp_forward=10.0,
        mlp_gelu=5.0,
    )
    dense = {"ms": ms, "step_ms": 200.0}
    rows = {p["coverage"]: p for p in L.projections(dense, speedups=(2.0,))}
    assert rows["today"]["covered_ms"] == 40.0 and rows["today"]["share_of_step"] == 0.2
    assert rows["today"]["step_ratio"]["2x"] == round(200 / 180, 4)  # 40 ms at 2x saves 20
    assert rows["+ teacher"]["step_ratio"]["2x"] == round(200 / 175, 4)
    assert rows["+ weight gradient"]["step_ratio"]["2x"] == round(200 / 165, 4)
    assert rows["+ fused epilogues"]["step_ratio"]["2x"] == round(
        200 / 160, 4
    )  # and the 5 ms of GELU gone
    sparse_ms = dict(
        ms, student_mlp_forward=14.0, student_mlp_input_grad=15.0, student_prune_pack=1.0
    )
    got = L.in_place(dense, {"ms": sparse_ms}, L.COVERAGE[0][1])
    assert got == {
        "classes": list(L.COVERAGE[0][1]),
        "dense_ms": 40.0,
        "sparse_ms": 30.0,
        "speedup": 1.333,
    }


@pytest.mark.parametrize(
    "shapes, flops",
    [
        (((4, 8), (8, 16)), 2 * 4 * 8 * 16),
        (((16,), (4, 8), (8, 16), (), ()), 2 * 4 * 8 * 16),  # addmm
        (((4, 8), (9, 16)), 0),
        (((4, 8),), 0),
    ],
)
def test_gemm_flops(shapes, flops):
    assert L.gemm_flops(shapes) == flops


def test_the_patch_embedding_convolution_is_a_linear_not_attention():
    conv = L.KernelRecord(
        "cudnn_generated_fort_native_conv_sm90",
        10.0,
        "attention",
        "aten::cudnn_convolution",
        1,
        (),
        "forward",
        "student.backbone",
    )
    flash = L.KernelRecord(
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop",
        10.0,
        "attention",
        "aten::_cudnn_attention_forward",
        2,
        (),
        "forward",
        "student.backbone",
    )
    assert (
        L.classify(conv, (8, 32)) == "other_linears" and L.classify(flash, (8, 32)) == "attention"
    )
    # the 2:4 weight gradient (sparsity.weight_grad=mvue24): its pruning pass and its sparse GEMM
    # are the weight gradient's, not the input gradient's (a sparse GEMM in the backward) nor
    # elementwise work
    for name, category in (
        ("_mvue_pack_t_kernel", "other"),
        ("sm90_xmma_sparse_gemm", "sparse_gemm"),
    ):
        rec = L.KernelRecord(
            name, 5.0, category, "sparsity::cslt_mvue_wgrad", 0, (), "backward", "student.backbone"
        )
        assert L.classify(rec, (8, 32)) == "student_mlp_weight_grad"
