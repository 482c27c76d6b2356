"""torch.compile of the 2:4 layers and of the training step on a CUDA GPU (inductor): compiled ==
eager, no graph break (fullgraph), no NaN, no recompilation in steady state. Run with `pytest -m
gpu`."""

import math

import pytest
import torch
import torch._dynamo
from torch import nn

from sparsity import SemiSparseLinear, is_transposable, swap_linear_modules, swap_to_dense
from sparsity.pruning import prune_reference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_dynamo")]


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def fwd_bwd(fn, layer, x, dy):
    x = x.detach().clone().requires_grad_()
    for p in layer.parameters():
        p.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = fn(x)
    y.backward(dy)
    return [y.detach(), x.grad, layer.weight.grad.clone(), layer.bias.grad.clone()]


@pytest.mark.parametrize("backend", ["cusparselt", "auto", "dense"])
@pytest.mark.parametrize(
    "pruning,masked_grad",
    [("tile_greedy", False), ("tile_greedy", True), ("soft_threshold", False)],
)
@pytest.mark.parametrize(
    "tokens", [2048, 1003]
)  # 1003: the tail GEMM of a token count that is not a multiple of 8
def test_compiled_sparse_linear_equals_eager(backend, pruning, masked_grad, tokens):
    torch.manual_seed(0)
    holder = nn.Sequential(
        nn.Linear(512, 1024)
    ).cuda()  # fp32 master weights under bf16 autocast, as in training
    swap_linear_modules(
        holder, pattern="0", backend=backend, pruning=pruning, masked_grad=masked_grad
    )
    layer = holder[0]
    x = torch.randn(tokens, 512, device="cuda")
    dy = torch.randn(tokens, 1024, device="cuda", dtype=torch.bfloat16)
    eager = fwd_bwd(layer, layer, x, dy)
    compiled = torch.compile(layer, fullgraph=True, dynamic=False)
    got = fwd_bwd(compiled, layer, x, dy)
    again = fwd_bwd(compiled, layer, x, dy)  # a second call: same result, no recompile
    for name, g, e, a in zip(("y", "dx", "dW", "db"), got, eager, again):
        assert torch.isfinite(g).all(), name
        assert rel_err(g, e) < 1e-2, (name, rel_err(g, e))
        assert torch.equal(g, a), name


@pytest.mark.parametrize("backend", ["cusparselt", "auto"])
def test_compiled_mvue24_weight_gradient_is_seeded_on_the_gpu_and_unbiased(backend):
    """Compiled, the MVUE weight gradient runs on cuSPARSELt with its seed drawn from torch's CUDA
    generator: each backward a new estimate, the same sequence after reseeding, the mean over 64
    draws near the straight-through dense gradient dy^T x (unbiased: its error shrinks like
    1/sqrt(draws)); y, dx and db as without it."""
    torch.manual_seed(0)
    holder = nn.Sequential(nn.Linear(512, 1024)).cuda()
    swap_linear_modules(holder, pattern="0", backend=backend, weight_grad="mvue24")
    layer = holder[0]
    x = torch.randn(
        1003, 512, device="cuda"
    )  # 960 tokens pruned, 43 exact (and 5 zero rows of padding to 8)
    dy = torch.randn(1003, 1024, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(layer, fullgraph=True, dynamic=False)
    reference = dy.float().t() @ x.bfloat16().float()
    torch.cuda.manual_seed(7)
    draws = [fwd_bwd(compiled, layer, x, dy) for _ in range(64)]
    torch.cuda.manual_seed(7)
    assert torch.equal(
        fwd_bwd(compiled, layer, x, dy)[2], draws[0][2]
    )  # reproducible from the CUDA generator
    assert not torch.equal(draws[0][2], draws[1][2])  # a new seed every backward
    single = rel_err(draws[0][2], reference)
    mean = rel_err(torch.stack([d[2] for d in draws]).mean(0), reference)
    assert 0.05 < single < 2.0, single
    assert mean < single / 4, (mean, single)
    holder_dense = nn.Sequential(nn.Linear(512, 1024)).cuda()
    holder_dense.load_state_dict(holder.state_dict())
    swap_linear_modules(
        holder_dense, pattern="0", backend="cusparselt"
    )  # where an auto layer with MVUE runs
    plain = fwd_bwd(
        torch.compile(holder_dense[0], fullgraph=True, dynamic=False), holder_dense[0], x, dy
    )
    assert torch.equal(draws[0][0], plain[0]) and torch.equal(
        draws[0][1], plain[1]
    )  # y, dx: the same GEMMs
    assert (
        rel_err(draws[0][3], plain[3]) < 1e-3
    )  # db: the exact sum (its reduction may fuse differently)


@pytest.mark.parametrize("pruning", ["tile_greedy", "tile_optimal"])
def test_compiled_no_grad_forward_packs_w_alone_and_computes_the_same(pruning):
    """The EMA teacher's forward (no gradient) packs only W for cuSPARSELt, not W^T: the same output
    as the eager layer, and as the compiled layer with gradients on; its graph asks the packer for
    no transposed copy."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.manual_seed(0)
    holder = nn.Sequential(nn.Linear(1024, 4096)).cuda()
    swap_linear_modules(holder, pattern="0", backend="cusparselt", pruning=pruning)
    x = torch.randn(2048, 1024, device="cuda")
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(holder, backend=counter, fullgraph=True, dynamic=False)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        with torch.no_grad():
            eager, got = holder(x), compiled(x)
        with_grad = compiled(x.requires_grad_())
    assert rel_err(got, eager) < 1e-2 and torch.equal(got, with_grad.detach())
    assert counter.frame_count == 2  # the no-grad graph is its own
    pack_ops = (torch.ops.sparsity.cslt_prune_pack, torch.ops.sparsity.cslt_prune_pack.default)
    packs = [n for g in counter.graphs for n in g.graph.nodes if n.target in pack_ops]
    assert [n.args[2] for n in packs] == [
        False,
        True,
    ]  # write W^T: not without gradients, yes with them


@pytest.mark.parametrize("pruning", ["tile_greedy", "tile_optimal"])
def test_reduce_overhead_passes_replay_the_eager_result(pruning):
    """torch.compile(mode="reduce-overhead") (forward and backward as CUDA graphs, as
    bench_published runs them) of an fp16 MLP with 2:4 layers built fresh inside the compile: the
    caches made on first use (cuSPARSELt plans and compressors, the pruning tables) come from no
    graph pool (sparsity/cuda_buffers.py), so the graph trees' pool check passes, and every replay
    gives the eager pass's output and gradients."""
    torch.manual_seed(
        0
    )  # fp16 (the other tests run bf16): plans of new keys, first made inside the warm-up
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda().half()
    swap_linear_modules(model, pattern=r"[02]", backend="cusparselt", pruning=pruning)
    x = torch.randn(2048, 1024, device="cuda", dtype=torch.half)

    def grads():
        return [p.grad.clone() for p in model.parameters()]

    compiled, passes = torch.compile(model, mode="reduce-overhead"), []
    # warm-up, record, then replays; first, so that the caches are first made inside them
    for _ in range(4):
        torch.compiler.cudagraph_mark_step_begin()
        model.zero_grad(set_to_none=True)
        y = compiled(x)
        y.float().sum().backward()
        passes.append([y.detach().clone(), *grads()])
    model.zero_grad(set_to_none=True)
    eager_y = model(x)
    eager_y.float().sum().backward()
    eager = [eager_y.detach(), *grads()]
    for got in passes:
        for i, (g, e) in enumerate(zip(got, eager)):
            assert rel_err(g, e) < 1e-2, (i, rel_err(g, e))


def test_compiled_auto_choice_is_made_at_trace_time_and_recorded():
    from sparsity.backends import get_backend

    torch.manual_seed(0)
    holder = nn.Sequential(nn.Linear(1024, 4096)).cuda()
    swap_linear_modules(holder, pattern="0", backend="auto")
    auto = get_backend("auto")
    before = len(auto.decisions)
    x = torch.randn(4096, 1024, device="cuda")
    compiled = torch.compile(holder, fullgraph=True, dynamic=False)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = compiled(x)
    assert torch.isfinite(y).all()
    recs = [
        r for r in auto.describe()["decisions"] if r["tokens"] == 4096 and r["in_features"] == 1024
    ]
    assert len(auto.decisions) == before + 1 and recs and recs[0]["first_met"] == "compiled"
    assert recs[0]["choice_graph"] in ("cusparselt", "dense")


def test_compiled_auto_times_an_unaligned_token_count_at_the_padded_rows():
    """A traced layer of 4,099 rows runs one 2:4 GEMM on 4,104 padded rows: auto times that, and
    records the decision under the layer's own count."""
    from sparsity.backends import get_backend

    torch.manual_seed(0)
    holder = nn.Sequential(nn.Linear(1024, 3072)).cuda()
    swap_linear_modules(holder, pattern="0", backend="auto")
    x = torch.randn(4099, 1024, device="cuda")
    compiled = torch.compile(holder, fullgraph=True, dynamic=False)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert torch.isfinite(compiled(x)).all()
    (rec,) = [
        r
        for r in get_backend("auto").describe()["decisions"]
        if r["tokens"] == 4099 and r["out_features"] == 3072
    ]
    assert rec["first_met"] == "compiled" and rec["timed_tokens"] == 4104


@pytest.mark.parametrize("backend", ["cusparselt", "auto"])
def test_compiled_block_fullgraph_both_phases_no_steady_state_recompile(backend):
    """A ViT block in training (list forward, subset drop-path) under fullgraph compile: equal to
    eager in the sparse and the dense phase (same drop-path draws), the switch recompiles, further
    steps do not."""
    from models.vit_block import Block

    torch.manual_seed(0)
    block = Block(384, 6, drop_path=0.3, init_values=1e-5).cuda().train()
    xs = [torch.randn(16, 17, 384, device="cuda"), torch.randn(32, 5, 384, device="cuda")]
    compiled = torch.compile(block, fullgraph=True, dynamic=False)

    def step(fn, seed):
        torch.manual_seed(seed)
        for p in block.parameters():
            p.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fn([x.clone() for x in xs])
        sum(o.float().square().mean() for o in out).backward()
        return [o.detach() for o in out] + [block.mlp.fc1.weight.grad.clone()]

    for phase in ("sparse", "dense"):
        if phase == "sparse":
            swap_linear_modules(block, pattern=r"mlp\.fc[12]", backend=backend)
        else:
            swap_to_dense(block)
        torch._dynamo.config.error_on_recompile = False
        for seed in range(3):
            got, want = step(compiled, seed), step(block, seed)
            for g, w in zip(got, want):
                assert torch.isfinite(g).all() and rel_err(g, w) < 2e-2, (
                    phase,
                    seed,
                    rel_err(g, w),
                )
            torch._dynamo.config.error_on_recompile = (
                True  # after the first compiled step of the phase
            )


def _trainer(compile_: str, backend: str, tmp_path):
    from configs import load_config
    from training.distributed import DistContext
    from training.trainer import Trainer

    cfg = load_config(
        None,
        [
            "student.arch=vit_small",
            "student.patch_size=8",
            "student.drop_path_rate=0.2",
            "dino.head_n_prototypes=1024",
            "ibot.head_n_prototypes=1024",
            "dino.head_hidden_dim=256",
            "dino.head_bottleneck_dim=64",
            "crops.global_crops_size=32",
            "crops.local_crops_size=16",
            "crops.local_crops_number=4",
            "data.digits_image_size=32",
            "train.batch_size_per_gpu=16",
            "train.num_workers=0",
            "optim.epochs=2",
            "train.epoch_length=10",
            "optim.warmup_epochs=1",
            "sparsity.sparse_fraction=0.5",
            f"sparsity.backend={backend}",
            f"train.compile={compile_}",
        ],
    )
    return Trainer(cfg, tmp_path / compile_, DistContext(0, 1, 0, torch.device("cuda")))


def _run_steps(trainer, steps, on_step=None):
    losses = []
    batches = trainer.batches()
    for step in range(steps):
        trainer.enter_phase(trainer.sparsity.phase_at(step))
        loss, _, _ = trainer.train_step(next(batches), trainer.schedules.at(step))
        trainer.step += 1
        losses.append(loss.item())
        if on_step is not None:
            on_step(step)
    trainer.settle_checks()
    return losses


@pytest.mark.parametrize("backend", ["cusparselt", "auto"])
def test_compiled_training_equals_eager_20_steps(backend, tmp_path):
    """20 steps (10 sparse, 10 dense) from the same initial state, eager vs compiled: losses within
    bf16 tolerance, no NaN, no recompilation after the first step of each phase; the sparse weights
    used are 2:4 along rows and columns."""
    eager = _run_steps(_trainer("false", backend, tmp_path), 20)
    trainer = _trainer("true", backend, tmp_path)

    def no_recompile_after_first_step_of_a_phase(step):
        torch._dynamo.config.error_on_recompile = step not in (
            9,
        )  # step 10 is the switch: it compiles once

    compiled = _run_steps(trainer, 20, no_recompile_after_first_step_of_a_phase)
    torch._dynamo.config.error_on_recompile = False
    assert all(math.isfinite(v) for v in eager + compiled)
    for step, (c, e) in enumerate(zip(compiled, eager)):
        assert abs(c - e) / abs(e) < 1e-2, (step, c, e)
    trainer.enter_phase("sparse")
    for name, m in trainer.model.student.backbone.named_modules():
        if isinstance(m, SemiSparseLinear):
            values, mask = prune_reference(m.weight.detach().to(torch.bfloat16), m.pruning)
            assert is_transposable(m.pruning)
            rows, cols = (
                mask.reshape(mask.shape[0], -1, 4).sum(-1),
                mask.t().reshape(mask.shape[1], -1, 4).sum(-1),
            )
            assert rows.max() <= 2 and cols.max() <= 2, name
            x = torch.randn(64, m.in_features, device="cuda", dtype=torch.bfloat16)
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                y = m(x)
            ref = x.float() @ values.float().t() + m.bias.float()
            assert rel_err(y, ref) < 1e-2, name
