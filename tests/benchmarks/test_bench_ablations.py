"""The step benchmark's block ablations (`autograd-gather`, `no-stochastic-depth`,
`attention-per-crop`, `mlp-per-crop`) on the CPU: each changes what a compiled block computes while
it is on (the block compiled as training compiles it, `dynamic=False`: its code is guarded, not
reused stale) and puts everything back after."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from models import vit_block
from models.vision_transformer import DinoVisionTransformer
from scripts import bench_train_step as B


@pytest.fixture(autouse=True)
def fresh_compiles():
    torch._dynamo.reset()  # each test's compiled block starts from no cached graph
    yield
    torch._dynamo.reset()


def trainer_of(backbone: nn.Module) -> SimpleNamespace:
    return SimpleNamespace(model=SimpleNamespace(student=nn.ModuleDict({"backbone": backbone})))


def backbone() -> DinoVisionTransformer:
    torch.manual_seed(0)
    return DinoVisionTransformer(
        img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, drop_path_rate=0.3
    ).train()


def list_forward(block: nn.Module, xs: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return block(xs)


def test_no_stochastic_depth_runs_every_branch_on_the_whole_batch_then_restores():
    model = backbone()
    block = model.blocks[0]
    compiled = torch.compile(block, backend="eager", fullgraph=True, dynamic=False)
    xs = [torch.randn(4, 5, 16), torch.randn(3, 2, 16)]
    subsets = list_forward(compiled, xs, seed=1)
    every_row = [x + block._attn_branch(x) for x in xs]
    every_row = [x + block._ffn_branch(x) for x in every_row]
    with B._Ablation(trainer_of(model), "no-stochastic-depth"):
        assert {b.sample_drop_ratio for b in model.blocks} == {0.0}
        for got, want in zip(list_forward(compiled, xs, seed=1), every_row):
            torch.testing.assert_close(got, want)
    assert {b.sample_drop_ratio for b in model.blocks} == {0.3}
    for got, want in zip(list_forward(compiled, xs, seed=1), subsets):
        assert torch.equal(got, want)
    assert not all(torch.equal(a, b) for a, b in zip(subsets, every_row))


def test_autograd_gather_swaps_the_gather_under_compile_and_back():
    """Under the ablation the compiled block's backward is autograd's indexing (seen by what it
    traces), with the same gradients; afterwards take_rows is back."""
    model = backbone()
    block = model.blocks[0]
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True, dynamic=False)
    traced = []
    original = vit_block.take_rows

    def recording(x, rows):
        traced.append(x.shape)
        return original(x, rows)

    vit_block.take_rows = recording
    try:
        xs = [torch.randn(4, 5, 16, requires_grad=True)]
        grads = []
        for ablate in (False, True):
            traced.clear()
            x = xs[0].detach().clone().requires_grad_()
            if ablate:
                with B._Ablation(trainer_of(model), "autograd-gather"):
                    assert vit_block.take_rows is not recording
                    out = list_forward(compiled, [x], seed=2)
            else:
                out = list_forward(compiled, [x], seed=2)
            out[0].square().sum().backward()
            grads.append(x.grad)
            assert bool(traced) != ablate  # traced with take_rows only when not ablated
        assert vit_block.take_rows is recording
        torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
    finally:
        vit_block.take_rows = original


def test_rows_of_work_changing_ablations_get_no_mfu():
    assert B.ABLATIONS_CHANGING_WORK == ("no-stochastic-depth",)
    assert set(B.ABLATIONS_CHANGING_WORK) <= set(B.ABLATIONS)


def test_an_ablation_drops_a_captured_step_graph_on_entry_and_exit():
    """Under train.cuda_graph the step replays what it captured: turning an ablation on or off must
    make the next step capture again."""
    resets = []
    graph = SimpleNamespace(reset=lambda: resets.append(len(resets)))
    model = backbone()
    trainer = trainer_of(model)
    trainer.step_graph = graph
    with B._Ablation(trainer, "no-stochastic-depth"):
        assert resets == [0]
    assert resets == [0, 1]
    trainer.step_graph = None  # launched: nothing to drop
    with B._Ablation(trainer, "no-stochastic-depth"):
        pass
    assert resets == [0, 1]


def test_pos_embed_interpolate_resizes_by_the_op_to_within_rounding_then_restores():
    """The ablation's resize (F.interpolate) and the model's (the matrix) agree to fp32 rounding,
    and the instance's method is the class's again afterwards."""
    vit = model = backbone()
    with torch.no_grad():
        vit.pos_embed.normal_()
    x = torch.zeros(1, 1 + 36, 16)  # a 24 x 24 image: 6 x 6 patches of a 4 x 4 grid
    want = vit.interpolate_pos_encoding(x, 24, 24)
    with B._Ablation(trainer_of(model), "pos-embed-interpolate"):
        got = vit.interpolate_pos_encoding(x, 24, 24)
        assert "interpolate_pos_encoding" in vit.__dict__
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert "interpolate_pos_encoding" not in vit.__dict__


def test_attention_per_crop_runs_its_linears_per_crop_batch_under_compile_and_back():
    """Under the ablation the compiled block puts only the MLP's tokens in one matrix (seen by what
    it traces) and computes the same values; afterwards the attention's linears share it again."""
    model = backbone()
    block = model.blocks[0]
    compiled = torch.compile(block, backend="eager", fullgraph=True, dynamic=False)
    traced = []
    original = vit_block._rows_of_all

    def recording(xs):
        traced.append(len(xs))
        return original(xs)

    vit_block._rows_of_all = recording
    try:
        xs = [torch.randn(4, 5, 16), torch.randn(3, 2, 16)]
        shared = list_forward(compiled, xs, seed=1)
        assert traced == [2, 2]  # the attention's linears and the MLP, each on one matrix
        traced.clear()
        with B._Ablation(trainer_of(model), "attention-per-crop"):
            per_crop = list_forward(compiled, xs, seed=1)
            assert traced == [2]  # re-traced: the MLP alone
        again = list_forward(compiled, xs, seed=1)
    finally:
        vit_block._rows_of_all = original
    assert "_attn_on_concat" not in block.__dict__
    for a, b, c in zip(shared, per_crop, again):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
        assert torch.equal(c, a)


def test_mlp_per_crop_runs_the_mlp_per_crop_batch_under_compile_and_back():
    """Under the ablation the compiled block puts only the attention's tokens in one matrix, the MLP
    sees each crop batch's rows, and the values are the same; afterwards the MLP shares it again."""
    model = backbone()
    block = model.blocks[0]
    compiled = torch.compile(block, backend="eager", fullgraph=True, dynamic=False)
    mlp_rows = []
    hook = block.mlp.fc1.register_forward_hook(lambda m, a, out: mlp_rows.append(a[0].shape[0]))
    try:
        xs = [torch.randn(4, 5, 16), torch.randn(3, 2, 16)]
        shared = list_forward(compiled, xs, seed=1)
        with B._Ablation(trainer_of(model), "mlp-per-crop"):
            per_crop = list_forward(compiled, xs, seed=1)
        again = list_forward(compiled, xs, seed=1)
    finally:
        hook.remove()
    # drop-path 0.3 keeps a subset of each crop batch (2 of 4 and 2 of 3 images here): 10 + 4 rows
    # together, then 10 and 4 apart, then together again
    assert mlp_rows == [14, 10, 4, 14]
    assert "_ffn_on_concat" not in block.__dict__
    for a, b, c in zip(shared, per_crop, again):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
        assert torch.equal(c, a)


@pytest.mark.parametrize(
    "row, ablate, runs",
    [
        ("compiled-dense", "dense", True),
        ("stepgraph-dense", "dense", True),
        ("stepgraph-auto+teacher+mvue-fc2", "dense", False),
        ("stepgraph-auto+teacher+mvue-fc2", "all", True),
        ("compiled-cusparselt", "all", True),
        ("eager-dense", "dense", False),
        ("eager-auto", "all", False),
    ],
)
def test_ablations_follow_the_dense_compiled_rows_or_every_compiled_row(row, ablate, runs):
    from scripts.bench_train_step import build_parser, runs_ablations

    assert runs_ablations(row, ablate) is runs
    assert build_parser().parse_args(["--ablate", ablate]).ablate == ablate
