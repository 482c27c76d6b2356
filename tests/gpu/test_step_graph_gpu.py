"""train.cuda_graph on a CUDA GPU: the whole training step captured once per phase and replayed
equals the eagerly launched step (bf16 autocast as in training, the same state before every step;
losses to 1e-4, weight updates to rounding, see assert_same_update), through the sparse-then-dense
switch with each backend, compiled and not; with bf16 and drop-path the replays draw fresh random
subsets. Run with `pytest -m gpu`."""

import threading

import pytest
import torch
import torch._dynamo
from tiny_run import TINY_MODEL_AND_DATA

from configs import load_config
from data.batch import DEVICE_FIELDS
from scripts.benchmarks.batch import synthetic_batch
from training.distributed import DistContext
from training.step_graph import StepGraph
from training.trainer import Trainer

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_dynamo")]
GPU = DistContext(0, 1, 0, torch.device("cuda")) if torch.cuda.is_available() else None
TINY = [*TINY_MODEL_AND_DATA, "sparsity.sparse_fraction=0.5"]


@torch.no_grad()
def copy_state(src: Trainer, dst: Trainer) -> None:
    """src's weights, buffers and AdamW moments into dst's tensors, in place (a graph holds their
    addresses)."""
    for p, q in zip(src.model.parameters(), dst.model.parameters()):
        q.copy_(p)
        for k, v in src.optimizer.state.get(p, {}).items():
            dst.optimizer.state[q][k].copy_(v)
    for b, c in zip(src.model.buffers(), dst.model.buffers()):
        c.copy_(b)


def resolved_gradients(trainer) -> dict:
    """Per parameter name, where its gradient (the student's, for a teacher's EMA copy) stands above
    rounding: Adam divides by the gradient's running size, so where a gradient is rounding noise
    (the keys' bias, whose exact gradient is 0 since softmax ignores a shift of the logits) two
    roundings give full-size steps of either sign."""
    grads = {n: p.grad.float() for n, p in trainer.model.named_parameters() if p.grad is not None}
    out = {}
    for name, p in trainer.model.named_parameters():
        g = grads.get(name, grads.get(name.replace("teacher.", "student.", 1)))
        out[name] = None if g is None else g.abs() >= 1e-2 * g.abs().max()
    return out


def assert_same_update(before, p, q, lr, resolved, where):
    """The two steps moved the weights alike: compiled with the schedule as tensors and the masked
    patches padded (graph) or as floats and unpadded (plain), inductor's kernels round differently;
    so the gradients agree to 1e-2, and where a gradient is resolved (`resolved_gradients`) the
    update's relative error is below 1e-2 with at most 1 entry in 1,000 off by > 1% of lr (launched
    eagerly, the two are equal)."""
    if p.grad is not None:
        g, h = p.grad.float(), q.grad.float()
        grad_rel = ((g - h).norm() / g.norm().clamp_min(1e-30)).item()
        assert grad_rel <= 1e-2, f"{where}: gradient relative error {grad_rel:.2e}"
    dp, dq = (p - before).float(), (q - before).float()
    if resolved is not None:
        dp, dq = dp[resolved], dq[resolved]
    err = (dp - dq).abs()
    off = (err > 0.01 * lr).float().mean().item()
    rel = (err.norm() / dp.norm().clamp_min(1e-30)).item()
    assert off <= 1e-3 and rel <= 1e-2, (
        f"{where}: update relative error {rel:.2e}, {off:.2e} of entries off"
    )


def values_at(trainer, step):
    return {
        **trainer.schedules.at(step),
        "lr": 1e-3 * (1 + step),
        "last_layer_lr": 5e-4 * step,
        "wd": 0.1 + 0.02 * step,
        "teacher_temp": 0.04 + 0.002 * step,
        "momentum": 0.9 + 0.005 * step,
    }


@pytest.mark.parametrize("compile", ["false", "true"])
@pytest.mark.parametrize("backend", ["cusparselt", "auto"])
def test_replayed_step_equals_the_launched_step(tmp_path, compile, backend):
    over = TINY + [
        "student.drop_path_rate=0",
        f"train.compile={compile}",
        f"sparsity.backend={backend}",
    ]
    plain = Trainer(load_config(None, over), tmp_path / "a", GPU)
    graphed = Trainer(load_config(None, over + ["train.cuda_graph=true"]), tmp_path / "b", GPU)
    batches = [synthetic_batch(plain.cfg, GPU.device, rank=r, seed=r) for r in range(3)]
    assert len({b.mask_indices.numel() for b in batches}) > 1  # each replay pads another count
    step = 0
    for phase in ("sparse", "dense"):
        for trainer in (plain, graphed):
            trainer.enter_phase(phase)
        for i in range(7):  # 3 eager steps, the capture (which runs the step once), 3 replays
            if step:
                copy_state(plain, graphed)
            values = values_at(plain, step)
            before = [p.detach().clone() for p in plain.model.parameters()]
            a = plain.train_step(batches[i % 3], values)
            b = graphed.train_step(batches[i % 3], values)
            step += 1
            for k in a[1]:
                torch.testing.assert_close(
                    b[1][k], a[1][k], rtol=1e-4, atol=1e-6, msg=f"{phase} {i}: {k}"
                )
            resolved = resolved_gradients(plain)
            for (name, p), q, p0 in zip(
                plain.model.named_parameters(), graphed.model.parameters(), before
            ):
                assert_same_update(
                    p0, p, q, values["lr"], resolved[name], f"{phase} step {i}: {name}"
                )
        assert graphed.step_graph.graph is not None
    assert graphed.step_graph.captures == 2  # one per phase
    plain.settle_checks(), graphed.settle_checks()


def test_bf16_replays_draw_fresh_drop_path_subsets_and_stay_finite(tmp_path):
    trainer = Trainer(
        load_config(None, TINY + ["train.cuda_graph=true", "student.drop_path_rate=0.4"]),
        tmp_path,
        GPU,
    )
    batch = synthetic_batch(trainer.cfg, GPU.device)
    values = trainer.schedules.at(5)
    trainer.enter_phase("sparse")
    for _ in range(4):  # 3 eager, then the capture
        trainer.train_step(batch, values)
    tensors = [
        *trainer.model.parameters(),
        *trainer.model.buffers(),
        *(v for s in trainer.optimizer.state.values() for v in s.values()),
    ]
    saved = [t.detach().clone() for t in tensors]
    losses = []
    for _ in range(2):  # the same state, batch and values: only the random subsets may differ
        with torch.no_grad():
            for t, v in zip(tensors, saved):
                t.copy_(v)
        losses.append(trainer.train_step(batch, values)[0].item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[0] != losses[1]
    trainer.settle_checks()


class _Batch:
    """The least a StepGraph needs of a batch: its device fields (one set) and the padding call."""

    def __init__(self, images):
        for name in DEVICE_FIELDS:
            setattr(self, name, None)
        self.images = images

    def padded_to_bound(self):
        return self


class _Hyper:
    def write(self, values):
        pass


def test_capture_survives_a_thread_pinning_host_memory():
    """A DataLoader with pin_memory=True pins every batch in a thread of its own, which calls CUDA
    (new pinned blocks, event queries) at any moment; a capture in CUDA's default global mode is
    invalidated by such a call from any thread ("operation failed due to a previous error during
    capture": a dense CIFAR-10 run failed so at its first capture). The pinning thread here
    allocates fresh pinned blocks without pause while the step graph captures, 8 times."""
    weight = torch.randn(256, 256, device="cuda")

    def compute(batch, hyper):
        x = batch.images
        # a capture long enough for the other thread's calls to land inside it
        for _ in range(1000):
            x = torch.tanh(x @ weight)
        return x.sum()

    stop = threading.Event()

    def pin_forever():
        # kept alive, so each allocation is a fresh cudaHostAlloc, not a block of the host cache
        held = []
        while not stop.is_set() and len(held) < 50_000:
            try:
                held.append(torch.empty(4096, dtype=torch.uint8, pin_memory=True))
            # refused while a global-mode capture runs: the capture is what the test checks
            except RuntimeError:
                pass

    pinner = threading.Thread(target=pin_forever, daemon=True)
    pinner.start()
    try:
        for _ in range(8):
            graph = StepGraph(compute, _Hyper(), torch.device("cuda"), warmup=1)
            batch = _Batch(torch.randn(64, 256, device="cuda"))
            eager = graph.step(batch, {})
            replayed = graph.step(batch, {})  # the capture, then its replay
            torch.testing.assert_close(replayed, eager)
            assert graph.captures == 1
    finally:
        stop.set()
        pinner.join()
