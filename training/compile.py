"""torch.compile for the training step, applied to the model from outside: the model code knows
nothing of it.

`train.compile` (auto: on for CUDA, off on CPU) and `train.compile_backend` (inductor; aot_eager or
eager to debug). What is compiled, one piece at a time (as torchtitan and DINOv3 do: a graph per
block compiles fast and is shared by identical blocks; a whole-step graph would break at the
data-dependent iBOT selection anyway):

- every transformer block of the student and of the teacher, in place (`Module.compile`: module
  objects, parameters and state-dict keys stay the same, so DDP, the EMA, the optimizer and
  checkpoints are untouched). fullgraph=True: a graph break inside a block is an error, never a
  silent slow path; dynamic=False: crop shapes are fixed by the config. The 2:4 layers trace through
  `sparsity.traced`. The sparse -> dense switch changes the class of the student's fc1/fc2, which
  the compiled block guards on: it compiles once more, then steady-state steps never recompile (the
  teacher's blocks are dense and eval-mode throughout: their own graph);
- the DINO (and iBOT) heads: fixed shapes (masked tokens are padded to the collate's `upperbound`);
- the student's loss terms over the prototypes (fp32 log-softmax and cross-entropy), a few passes
  over (tokens x 65536) logits each in eager mode. The number of masked patches changes every step,
  so the iBOT one is compiled with dynamic shapes: one graph for every count;
- the teacher's centred softmax (DINO and iBOT) and this rank's part of the iBOT centre update (the
  masked tokens' mean), each a few eager passes over the teacher's (tokens x 65536) logits. Dynamic:
  the temperature, a Python float that changes every warm-up step, is then a symbolic input, not a
  new graph for every value.
Left eager: patch embedding and token preparation, the final norm, KoLeo (small), the centres'
all-reduces and averages, and Sinkhorn-Knopp (they all-reduce across ranks).
"""

from __future__ import annotations

import contextlib
import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)


def compile_wanted(setting: str, device: torch.device) -> bool:
    """`train.compile` resolved: "true" / "false", or "auto" = on for CUDA devices only (a CPU run
    is a smoke test or CI, where compiling costs more than it saves)."""
    if setting == "auto":
        return device.type == "cuda"
    return setting == "true"


# the teacher-side passes over the prototypes' logits that compile_model compiles: (loss, method)
TEACHER_CENTERING = (
    ("dino_loss", "softmax_center_teacher"),
    ("ibot_patch_loss", "softmax_center_teacher"),
    ("ibot_patch_loss", "local_center_stats"),
)


def _compile_method(obj: nn.Module, name: str, **options) -> None:
    setattr(obj, name, torch.compile(getattr(obj, name), **options))


def compile_model(model: nn.Module, backend: str = "inductor", mode: str = "default") -> list[str]:
    """Compile the pieces of an `SSLMetaArch` listed in this module's docstring, in place; returns
    their names. `mode` applies to the blocks: "reduce-overhead" replays the student's blocks'
    forward and backward as CUDA graphs; "max-autotune-no-cudagraphs" lets inductor time its GEMM
    templates (bias and GELU in the epilogue) against cuBLAS in every block, the student's and the
    teacher's. The heads and losses always compile in the default mode (their outputs live across
    the step)."""
    static = dict(backend=backend, dynamic=False, fullgraph=True)
    compiled = []
    graphs = mode == "reduce-overhead"
    for role in ("student", "teacher"):
        # CUDA graphs for the student's blocks only: the teacher's run without gradients, and
        # CUDA-graph trees start a new generation at every such call, overwriting the output the
        # next block is about to read
        opts = (
            dict(static, mode=mode)
            if mode != "default" and (role == "student" or not graphs)
            else static
        )
        blocks = getattr(model, role)["backbone"].blocks
        for block in blocks:
            block.compile(**opts)
        compiled.append(
            f"{role}.backbone.blocks "
            f"(x{len(blocks)}{', ' + opts['mode'] if 'mode' in opts else ''})"
        )
        for name, head in getattr(model, role).items():
            if name != "backbone":
                head.compile(**static)
                compiled.append(f"{role}.{name}")
    model.dino_loss.compile(**static)
    dynamic = dict(backend=backend, dynamic=True, fullgraph=True)
    _compile_method(model.ibot_patch_loss, "forward_masked", **dynamic)
    compiled += ["dino_loss (cross-entropy)", "ibot_patch_loss.forward_masked (cross-entropy)"]
    for loss, method in TEACHER_CENTERING:
        _compile_method(getattr(model, loss), method, **dynamic)
        compiled.append(f"{loss}.{method}")
    logger.info("torch.compile (backend %s): %s", backend, ", ".join(compiled))
    return compiled


def ddp_graph_splits(split: bool) -> contextlib.AbstractContextManager:
    """The context the DDP-wrapped forward runs in (`train.ddp_split_compiled_graphs`). A graph is
    compiled when the forward first reaches it, and under DDP's forward dynamo then cuts it at DDP's
    gradient-bucket boundaries (its DDPOptimizer), so that the all-reduce of a bucket filled halfway
    through a block's backward can start before the block's backward ends. Our graphs are single
    blocks and heads, so the cuts buy overlap finer than a block, and every cut also ends the kernel
    fusions across it. split=False compiles whole graphs: the gradients of a block become ready
    together when its backward ends, and DDP's hooks start their all-reduces then. The setting is
    read when a graph is compiled and is not one of the guards of dynamo's cache: a process keeps
    the graphs it compiled first, so this context must be the same for every step of a process."""
    if split:
        return contextlib.nullcontext()
    import torch._dynamo  # loaded by torch.compile anyway; not at import time

    return torch._dynamo.config.patch(optimize_ddp=False)
