"""train.compile on a CPU: a DINOv2 block compiled with fullgraph=True in both sparsity phases
equals eager, the sparse -> dense switch compiles once and steady-state steps never, compiled
training equals eager training, and a compiled 2-process gloo run equals the compiled 1-process run
with the same global batch.

The dynamo front end (graph capture, guards, AOT autograd) is what these check; they use the
aot_eager backend so that CI does not spend minutes in C++ compilation (inductor runs in
tests/sparsity/test_traced.py and, on a GPU, tests/gpu/test_compile_gpu.py)."""

import pytest
import torch
import torch._dynamo
from train_runs import TINY, run_train

from configs import load_config
from models.vit_block import Block
from rundir.metrics import read_metrics
from sparsity import SemiSparseLinear, swap_linear_modules, swap_to_dense
from training.compile import compile_wanted
from training.distributed import DistContext
from training.trainer import Trainer

COMPILED = ["train.compile=true", "train.compile_backend=aot_eager"]
CPU = DistContext(0, 1, 0, torch.device("cpu"))
pytestmark = [
    pytest.mark.usefixtures("fresh_dynamo"),
    pytest.mark.slow,
]  # compiles for tens of seconds per test


def test_compile_setting_resolution():
    assert compile_wanted("auto", torch.device("cuda")) and not compile_wanted(
        "auto", torch.device("cpu")
    )
    assert compile_wanted("true", torch.device("cpu")) and not compile_wanted(
        "false", torch.device("cuda")
    )
    assert (
        load_config(None, ["train.compile=on"]).train.compile == "true"
    )  # YAML booleans are accepted
    with pytest.raises(
        ValueError, match="train.compile='sometimes' is not one of auto, true, false"
    ):
        load_config(None, ["train.compile=sometimes"])
    with pytest.raises(ValueError, match="reduce-overhead needs train.compile_backend=inductor"):
        load_config(None, ["train.compile_mode=reduce-overhead", "train.compile_backend=aot_eager"])


def test_block_compiles_fullgraph_in_both_phases_and_equals_eager():
    torch.manual_seed(0)
    block = Block(
        64, 4, drop_path=0.3, init_values=1e-5
    ).train()  # subset drop-path: the student's path
    xs = [torch.randn(6, 5, 64), torch.randn(12, 3, 64)]
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True, dynamic=False)

    def step(fn, seed):
        torch.manual_seed(seed)  # the same drop-path subsets for both
        for p in block.parameters():
            p.grad = None
        out = fn([x.clone().requires_grad_() for x in xs])
        sum((o * o).mean() for o in out).backward()
        return [o.detach() for o in out] + [p.grad.clone() for p in block.parameters()]

    for phase in ("sparse", "dense"):
        if phase == "sparse":
            swap_linear_modules(block, pattern=r"mlp\.fc[12]", backend="dense")
            assert isinstance(block.mlp.fc1, SemiSparseLinear)
        else:
            swap_to_dense(block)
        for seed in range(3):
            got, want = step(compiled, seed), step(block, seed)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
            torch._dynamo.config.error_on_recompile = (
                True  # the phase's graph exists: no more compiling
            )
        torch._dynamo.config.error_on_recompile = False
    eager_sparse_differs = step(block, 0)[0]
    swap_linear_modules(block, pattern=r"mlp\.fc[12]", backend="dense")
    assert not torch.equal(
        step(compiled, 0)[0], eager_sparse_differs
    )  # the switch back is picked up too


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _compiled_then_eager(tmp_path, overrides: list) -> tuple[list, list]:
    """TINY with `overrides`, trained compiled (counting the graphs each step made new) and then
    eagerly; asserts that the two loss curves are equal and returns (new graphs per step, the
    compiled run's metrics)."""
    trainer = Trainer(load_config(None, TINY + COMPILED + overrides), tmp_path / "compiled", CPU)
    new_graphs = []
    step_fn = trainer.train_step

    def counted(batch, values):
        before = _graphs()
        out = step_fn(batch, values)
        new_graphs.append(_graphs() - before)
        return out

    trainer.train_step = counted
    trainer.train()
    Trainer(load_config(None, TINY + overrides), tmp_path / "eager", CPU).train()
    a, b = (
        read_metrics(tmp_path / "compiled" / "metrics.jsonl"),
        read_metrics(tmp_path / "eager" / "metrics.jsonl"),
    )
    torch.testing.assert_close(
        torch.tensor([r["loss"] for r in a]),
        torch.tensor([r["loss"] for r in b]),
        rtol=1e-4,
        atol=1e-5,
    )
    return new_graphs, a


def test_switch_compiles_once_and_compiled_training_equals_eager(tmp_path):
    """16 steps (8 sparse, 8 dense): new graphs at the first step and at the switch only, the switch
    adding exactly one (the student's block with dense MLPs); the loss curve is the eager run's."""
    new_graphs, metrics = _compiled_then_eager(tmp_path, [])
    assert len(new_graphs) == 16
    assert new_graphs[0] > 0 and new_graphs[8] == 1, new_graphs
    assert sum(new_graphs[1:8]) == 0 and sum(new_graphs[9:]) == 0, new_graphs
    assert [r["phase"] for r in metrics] == ["sparse"] * 8 + ["dense"] * 8


def test_a_dense_warm_up_compiles_at_both_of_its_changes_and_equals_eager(tmp_path):
    """16 steps with a dense warm-up of 4 before the sparse phase ends at 8: new graphs only at the
    first step and at the two changes of phase; losses equal eager's."""
    new_graphs, metrics = _compiled_then_eager(tmp_path, ["sparsity.dense_warmup_fraction=0.25"])
    changes = [i for i, n in enumerate(new_graphs) if n]
    assert changes[0] == 0 and set(changes) <= {0, 4, 8} and 4 in changes, new_graphs
    assert [r["phase"] for r in metrics] == ["dense"] * 4 + ["sparse"] * 4 + ["dense"] * 8


@pytest.mark.slow
def test_compiled_two_processes_equal_compiled_one_process(tmp_path):
    from test_distributed_equivalence import SAME_GLOBAL_BATCH, assert_same_run, torchrun

    one, two = tmp_path / "one", tmp_path / "two"
    run_train(one, *SAME_GLOBAL_BATCH, *COMPILED, "train.batch_size_per_gpu=16")
    torchrun(two, *SAME_GLOBAL_BATCH, *COMPILED)
    log = (two / "log.txt").read_text()
    assert "torch.compile (backend aot_eager)" in log
    assert "DDP: compiled graphs whole (train.ddp_split_compiled_graphs=false)" in log
    assert_same_run(two, one)


def test_auto_decisions_reach_the_metrics(monkeypatch):
    """What `auto` decided (eagerly, or while a graph was traced) is summarised in every
    sparse-phase metrics line."""
    from configs import load_config
    from sparsity.backends import GemmKey, get_backend
    from training.sparsity_setup import sparsity_converter

    auto = get_backend("auto")
    monkeypatch.setattr(auto, "decisions", {})
    schedule = sparsity_converter(
        load_config(None, ["sparsity.backend=auto", "sparsity.sparse_fraction=0.5"])
    )
    assert schedule.auto_summary() == {}  # dense phase: nothing to report
    schedule.phase = "sparse"
    auto._record(GemmKey(30779, 1024, 4096, torch.bfloat16, 0), "dense", choice_graph="cusparselt")
    auto._record(GemmKey(30779, 4096, 1024, torch.bfloat16, 0), "cusparselt")
    assert schedule.auto_summary() == {
        "auto_shapes": 2,
        "auto_sparse_eager": 1,
        "auto_sparse_compiled": 2,
    }
    schedule.backend = "cusparselt"
    assert schedule.auto_summary() == {}


@pytest.mark.parametrize(
    "mode, teacher_too", [("reduce-overhead", False), ("max-autotune-no-cudagraphs", True)]
)
def test_compile_mode_reaches_the_blocks_it_is_meant_for(monkeypatch, mode, teacher_too):
    """CUDA graphs for the student's blocks only (CUDA-graph trees and the teacher's no-grad calls
    do not mix); autotuned GEMM templates for every block; heads and losses always in the default
    mode."""
    from models.ssl_meta_arch import SSLMetaArch
    from training.compile import compile_model

    model = SSLMetaArch(load_config(None, TINY))
    seen = []
    monkeypatch.setattr(
        torch.nn.Module, "compile", lambda self, **kw: seen.append((self, kw.get("mode")))
    )
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    compile_model(model, mode=mode)
    mode_of = {id(m): md for m, md in seen}
    for role, wanted in (("student", mode), ("teacher", mode if teacher_too else None)):
        blocks = getattr(model, role)["backbone"].blocks
        assert [mode_of[id(b)] for b in blocks] == [wanted] * len(blocks), role
        assert all(
            mode_of[id(h)] is None for n, h in getattr(model, role).items() if n != "backbone"
        )
    assert mode_of[id(model.dino_loss)] is None
    assert load_config(None, [f"train.compile_mode={mode}"]).train.compile_mode == mode
    with pytest.raises(
        ValueError, match=f"train.compile_mode={mode} needs train.compile_backend=inductor"
    ):
        load_config(None, [f"train.compile_mode={mode}", "train.compile_backend=aot_eager"])


def test_teacher_centering_compiles_once_for_every_temperature_and_equals_eager():
    """compile_model's teacher-side pieces (the DINO and iBOT centred softmax, the iBOT centre's
    local statistics), compiled as it compiles them: one graph whatever the temperature (a float
    that changes every warm-up step), values those of the eager methods, and the statistics those
    of a hand-written masked mean (padding rows left out; no valid row: zeros and a zero flag)."""
    from torch._dynamo.utils import counters

    from models.losses.dino_clstoken_loss import DINOLoss
    from models.losses.ibot_patch_loss import iBOTPatchLoss
    from training.compile import TEACHER_CENTERING, _compile_method

    torch._dynamo.reset()
    model = torch.nn.Module()
    model.dino_loss, model.ibot_patch_loss = DINOLoss(96), iBOTPatchLoss(96)
    gen = torch.Generator().manual_seed(0)
    model.dino_loss.center.normal_(generator=gen)
    model.ibot_patch_loss.center.normal_(generator=gen)
    eager = {(loss, m): getattr(getattr(model, loss), m) for loss, m in TEACHER_CENTERING}
    for loss, method in TEACHER_CENTERING:
        _compile_method(
            getattr(model, loss), method, backend="inductor", dynamic=True, fullgraph=True
        )
    cls_tokens = torch.randn(6, 96, generator=gen).to(torch.bfloat16)
    patch_tokens = torch.randn(10, 96, generator=gen).to(torch.bfloat16)
    graphs = counters["stats"]["unique_graphs"]
    for temp in (0.04, 0.055, 0.07):
        for loss, tokens in (("dino_loss", cls_tokens), ("ibot_patch_loss", patch_tokens)):
            got = getattr(model, loss).softmax_center_teacher(tokens, temp)
            want = eager[(loss, "softmax_center_teacher")](tokens, temp)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    assert counters["stats"]["unique_graphs"] - graphs == 2  # one a loss, all temperatures
    valid = torch.tensor([True, False, True, True, False, False, True, True, False, True])
    got = model.ibot_patch_loss.local_center_stats(patch_tokens, valid)
    torch.testing.assert_close(
        got, eager[("ibot_patch_loss", "local_center_stats")](patch_tokens, valid)
    )
    rows = patch_tokens.double()[valid]
    torch.testing.assert_close(got[:-1].double(), rows.sum(0) / len(rows), rtol=1e-6, atol=1e-7)
    assert got[-1].item() == 1.0
    none = model.ibot_patch_loss.local_center_stats(patch_tokens, torch.zeros(10, dtype=torch.bool))
    assert torch.equal(none, torch.zeros(97))
