"""The whole training step as one CUDA graph (`train.cuda_graph=true`): forward of student and
teacher, backward, clipping, AdamW and the EMA teacher update are captured once per sparsity phase
and replayed every step, so the host launches one graph instead of ~4,300 kernels and its pauses no
longer leave the GPU idle. That pays where the step is host-bound (small models); a ViT-L step on an
H100 is power-bound instead, and gains nothing from it (results/bench/NOTES.md, "Does one CUDA graph
of the whole step help?").

What a replay cannot repeat is moved out of Python values into device memory, written before each
replay:
- the schedules' values: one device buffer (`ScheduleTensors`) holding every parameter group's lr
  and weight decay, the teacher temperature and the EMA momentum, filled from pinned host memory
  with one copy per step; the groups' `lr` are 0-d views into it (fused AdamW takes a tensor lr) and
  the decoupled weight decay, which fused AdamW takes only as a Python float, is applied before the
  AdamW step as p *= 1 - lr * wd per group (the same update);
- the batch: copied into static buffers, with its masked patches padded to the config's fixed bound
  (`SSLBatch.padded_to_bound`, which the model computes identically).
The step's checks (loss and gradient-norm flags, read one step late) stay outside, on the graph's
static outputs.

Each phase runs `warmup` steps eagerly first (compilation, the sparse backends' timing searches and
plans happen there; the graph must not capture a first call), on a side stream as capture requires;
entering another phase drops the graph (`reset`), and the next phase captures its own. Not for fp16
(the grad scaler reads inf checks on the host) or several processes (NCCL capture is not set up):
`configs/load.py` refuses both.
"""

from __future__ import annotations

import torch

from data.batch import DEVICE_FIELDS, SSLBatch

from .optim import group_hyperparameters

CAPTURE_ERROR_MODE = "thread_local"


class ScheduleTensors:
    """The step's schedule values in one fp32 device buffer, written once per step from pinned host
    memory.

    Layout: [lr of group 0, wd of group 0, lr of group 1, ..., teacher_temp, momentum,
    pruned_decay_scale]. Two pinned slots are used in turn, each reused only after its previous copy
    finished (an event), so the host never overwrites memory the GPU has not read yet."""

    # the step's values after the groups', with their value where a schedule leaves one out
    STEP_VALUES = {"teacher_temp": None, "momentum": None, "pruned_decay_scale": 1.0}

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device):
        self.optimizer = optimizer
        n = 2 * len(self.groups) + len(self.STEP_VALUES)
        self.buffer = torch.zeros(n, dtype=torch.float32, device=device)
        pin = device.type == "cuda"
        self._slots = [torch.zeros(n, dtype=torch.float32, pin_memory=pin) for _ in range(2)]
        self._events = [torch.cuda.Event() if pin else None for _ in range(2)]
        self._turn = 0
        tail = len(self.STEP_VALUES)
        self.lr = self.buffer[0:-tail:2]
        self.wd = self.buffer[1:-tail:2]
        self.teacher_temp, self.momentum, self.pruned_decay_scale = self.buffer[-tail:]
        self._bind()

    @property
    def groups(self) -> list[dict]:
        return (
            self.optimizer.param_groups
        )  # a new list after `load_state_dict` (a resume): always read it here

    def _bind(self) -> None:
        for i, group in enumerate(self.groups):
            group["lr"] = self.buffer[
                2 * i
            ]  # a view: the fused AdamW kernel reads the value written before it
            group["weight_decay"] = 0.0  # applied by `decay_weights`, which reads the tensor

    def host_values(self, values: dict) -> list[float]:
        """The buffer's contents for the schedule `values` of a step."""
        out = [v for group in self.groups for v in group_hyperparameters(group, values)]
        return out + [
            values[k] if default is None else values.get(k, default)
            for k, default in self.STEP_VALUES.items()
        ]

    def write(self, values: dict) -> None:
        # a resumed optimizer's groups hold the checkpoint's values: point them at the buffer again
        self._bind()
        slot, event = self._slots[self._turn], self._events[self._turn]
        if event is not None:
            event.synchronize()  # this slot's copy of two steps ago has been read
        slot.copy_(torch.tensor(self.host_values(values), dtype=torch.float32))
        self.buffer.copy_(slot, non_blocking=True)
        if event is not None:
            event.record()
        self._turn ^= 1

    @torch.no_grad()
    def decay_weights(self) -> None:
        """AdamW's decoupled weight decay, p *= 1 - lr * wd, for the parameters the optimizer will
        step."""
        factors = 1.0 - self.lr * self.wd
        for i, group in enumerate(self.groups):
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                torch._foreach_mul_(params, factors[i])


class StepGraph:
    """`step(batch, values)` runs `compute(batch, hyper)` (the trainer's step: hyper = this object's
    `ScheduleTensors`) eagerly for the first `warmup` steps of a phase, then captures it once and
    replays it. Returns the step's (loss, terms, norms) as the graph's static output tensors
    (overwritten by the next replay: copy what must outlive it). `capture=False` runs every step
    eagerly through the same tensors (for CPU tests)."""

    def __init__(
        self,
        compute,
        hyper: ScheduleTensors,
        device: torch.device,
        warmup: int = 3,
        capture: bool = True,
    ):
        if warmup < 1:
            raise ValueError(f"warmup={warmup}: at least one eager step must precede a capture")
        self.compute, self.hyper, self.device = compute, hyper, device
        self.warmup, self.capture = warmup, capture
        self.captures = 0  # graphs captured so far (one per phase entered)
        self.reset()

    def reset(self) -> None:
        """Drop the graph (the model changed: another sparsity phase); the next steps run eagerly,
        then capture."""
        self.graph = None
        self._static_batch = None
        self._out = None
        self._eager_left = self.warmup
        if self.device.type == "cuda":
            # the old graph's private memory pool goes back before the next capture
            torch.cuda.empty_cache()

    def step(self, batch: SSLBatch, values: dict):
        self.hyper.write(values)
        batch = (
            batch.padded_to_bound()
        )  # every step in the same shapes, eager ones too (one compilation)
        if not self.capture or self._eager_left > 0:
            self._eager_left -= 1
            return self._eager(batch)
        if self.graph is None:
            self._capture(batch)
        else:
            self._load(batch)
        self.graph.replay()
        return self._out

    def _eager(self, batch: SSLBatch):
        if self.device.type != "cuda":
            return self.compute(batch, self.hyper)
        side = (
            torch.cuda.Stream()
        )  # warm-up for capture runs on a side stream (torch.cuda.graphs' rule)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = self.compute(batch, self.hyper)
        torch.cuda.current_stream().wait_stream(side)
        return out

    def _load(self, batch: SSLBatch) -> None:
        for name in DEVICE_FIELDS:
            src, dst = getattr(batch, name), getattr(self._static_batch, name)
            if src is None:
                continue
            if dst is None or src.shape != dst.shape or src.dtype != dst.dtype:
                raise RuntimeError(
                    f"batch field {name} changed from {None if dst is None else tuple(dst.shape)} "
                    f"to {tuple(src.shape)} within a phase: a CUDA graph replays fixed shapes"
                )
            dst.copy_(src, non_blocking=True)

    def _capture(self, batch: SSLBatch) -> None:
        self._static_batch = (
            batch  # its tensors become the graph's inputs: later batches are copied into them
        )
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: the DataLoader's pinning thread keeps calling CUDA (pinned allocations,
        # event queries) while this thread captures; in the default global mode any such call
        # invalidates the capture, at random
        with torch.cuda.graph(self.graph, capture_error_mode=CAPTURE_ERROR_MODE):
            self._out = self.compute(self._static_batch, self.hyper)
        self.captures += 1


def build_step_graph(
    enabled: bool, ctx, optimizer: torch.optim.Optimizer, compute
) -> StepGraph | None:
    """The trainer's step graph for `train.cuda_graph` (None when off); `compute(batch, hyper)` is
    its step."""
    if not enabled:
        return None
    if ctx.device.type != "cuda" or ctx.world_size > 1:
        raise ValueError(
            f"train.cuda_graph=true needs one process on a CUDA device, not {ctx.world_size} on "
            f"{ctx.device.type}"
        )
    return StepGraph(compute, ScheduleTensors(optimizer, ctx.device), ctx.device)
