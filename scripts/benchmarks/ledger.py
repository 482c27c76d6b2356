"""The step's ledger: GPU time by what each kernel computes, and what 2:4 could make of it.

`bench_train_step.py --ledger N` profiles N steps of a row with host activity and shapes, and files
every kernel under one class of `CLASSES`, from three facts the profiler links to it:

- the host op that launched it (the profiler lists each op's kernels, `FunctionEvent.kernels`), with
  that op's input shapes: a GEMM whose operands or output hold an (embed x hidden) matrix is an MLP
  GEMM; with the output weight-shaped, a weight gradient;
- whether it ran in the forward (inside a `ledger:forward` range), in the backward (under an
  autograd node) or after both (clipping, AdamW, the EMA, the step's checks);
- its owner: the backbone whose `ledger:<role>.backbone` range encloses the forward op; a backward
  kernel's owner is its autograd node's forward op's (matched by sequence number and thread, as the
  profiler records them); anything else in the forward belongs to the heads and losses.

`ledger(...)` sums the classes per step (ms, and the GEMM FLOPs their host ops' shapes give; the
step's kernels run on one stream, so their durations add up to its busy time), and `projections`
turns a dense row's ledger into the sparse phase's step ratio for each set of GEMMs 2:4 could cover,
at a given in-place speed-up: the arithmetic behind "the GEMMs 2:4 replaces are x% of the step".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from scripts.benchmarks.profiling import categorize

FORWARD_RANGE = "ledger:forward"
RANGE_PREFIX = "ledger:"
HEADS = "heads_and_losses"
BACKWARD_NODE = "autograd::engine::evaluate_function"

CLASSES = (
    "student_mlp_forward",
    "student_mlp_input_grad",
    "student_mlp_weight_grad",
    "teacher_mlp_forward",
    "student_prune_pack",
    "teacher_prune_pack",
    "attention",
    "other_linears",
    "mlp_gelu",
    "norms_and_elementwise",
    HEADS,
    "optimizer_and_ema",
    "unattributed",
)

# The GEMM sets 2:4 covers or could cover, each with the classes it runs in place, and the classes a
# fused epilogue would remove outright (the GELU passes beside the MLP GEMMs).
COVERAGE = (
    ("today", ("student_mlp_forward", "student_mlp_input_grad"), ()),
    ("+ teacher", ("student_mlp_forward", "student_mlp_input_grad", "teacher_mlp_forward"), ()),
    (
        "+ weight gradient",
        (
            "student_mlp_forward",
            "student_mlp_input_grad",
            "teacher_mlp_forward",
            "student_mlp_weight_grad",
        ),
        (),
    ),
    (
        "+ fused epilogues",
        (
            "student_mlp_forward",
            "student_mlp_input_grad",
            "teacher_mlp_forward",
            "student_mlp_weight_grad",
        ),
        ("mlp_gelu",),
    ),
)
SPEEDUPS = (1.3, 1.5, 2.0)


@dataclass(frozen=True)
class KernelRecord:
    name: str
    us: float
    category: str  # profiling.categorize(name)
    op: str  # the host op that launched it
    op_id: int
    shapes: tuple  # that op's input shapes
    direction: str  # forward | backward | after
    owner: str | None  # student.backbone | teacher.backbone | heads_and_losses | None (unknown)


# --------------------------------------------------------------------------------------------------
# the ranges the records are read from


@contextlib.contextmanager
def annotated(trainer) -> Iterator[None]:
    """Profiler ranges around the trainer's forward and around each backbone's forward, for
    `kernel_records` (removed on exit). The backbones are not compiled themselves (their blocks
    are), so the hooks run eagerly."""
    from torch.autograd.profiler import record_function

    def ranged(name):
        def pre(module, args):
            module._ledger_range = record_function(RANGE_PREFIX + name)
            module._ledger_range.__enter__()

        def post(module, args, out):
            module.__dict__.pop("_ledger_range").__exit__(None, None, None)

        return pre, post

    handles = []
    for role in ("student", "teacher"):
        backbone = getattr(trainer.model, role)["backbone"]
        pre, post = ranged(f"{role}.backbone")
        handles += [backbone.register_forward_pre_hook(pre), backbone.register_forward_hook(post)]
    forward = trainer.forward_model

    def forward_in_range(*args, **kwargs):
        with record_function(FORWARD_RANGE):
            return forward(*args, **kwargs)

    trainer.forward_model = forward_in_range
    try:
        yield
    finally:
        trainer.forward_model = forward
        for h in handles:
            h.remove()


def _chain(e) -> Iterator:
    while e is not None:
        yield e
        e = e.cpu_parent


def _owner_in(chain: Sequence) -> str | None:
    for a in chain:  # innermost first
        if a.name.startswith(RANGE_PREFIX) and a.name != FORWARD_RANGE:
            return a.name[len(RANGE_PREFIX) :]
    return HEADS


def kernel_records(events: Iterable, launches: Sequence[tuple] | None = None) -> list[KernelRecord]:
    """One record per kernel of a profile taken under `annotated` with host activity (`events`:
    `prof.events()`). `launches`: (kernel name, microseconds, the host op that launched it) per
    kernel; by default every host op's `kernels` (the CPU tests pass host ops standing in for
    kernels)."""
    events = list(events)
    host = [e for e in events if not str(getattr(e, "device_type", "")).endswith("CUDA")]
    if launches is None:
        launches = [(k.name, k.duration, e) for e in host for k in e.kernels]
    # forward ops by (thread, sequence number) -> owner: what a backward node's forward op was part
    # of
    forward_owner: dict[tuple[int, int], str | None] = {}
    for e in host:
        if e.sequence_nr >= 0 and not e.name.startswith(BACKWARD_NODE):
            chain = list(_chain(e))
            if any(a.name == FORWARD_RANGE for a in chain):
                forward_owner.setdefault((e.thread, e.sequence_nr), _owner_in(chain))
    out = []
    for name, us, op in launches:
        chain = list(_chain(op))
        node = next((a for a in chain if a.name.startswith(BACKWARD_NODE)), None)
        if node is not None:
            direction, owner = "backward", forward_owner.get((node.fwd_thread, node.sequence_nr))
        elif any(a.name == FORWARD_RANGE for a in chain):
            direction, owner = "forward", _owner_in(chain)
        else:
            direction, owner = "after", None
        out.append(
            KernelRecord(
                name,
                float(us),
                categorize(name),
                op.name,
                op.id,
                tuple(tuple(s) for s in (op.input_shapes or ())),
                direction,
                owner,
            )
        )
    return out


# --------------------------------------------------------------------------------------------------
# classes


def gemm_operands(shapes: Sequence) -> tuple[tuple, tuple, tuple] | None:
    """(A, B, output) of a matrix product from its op's input shapes: the first two 2-D inputs (mm,
    addmm's matrices, an `out=` buffer after them), or None."""
    mats = [tuple(s) for s in shapes if len(s) == 2][:2]
    if len(mats) < 2 or mats[0][1] != mats[1][0]:
        return None
    return mats[0], mats[1], (mats[0][0], mats[1][1])


def gemm_flops(shapes: Sequence) -> int:
    """2 m k n of a matrix product's op shapes, 0 if they are not one."""
    ops = gemm_operands(shapes)
    if ops is None:
        return 0
    (m, k), (_, n), _ = ops
    return 2 * m * k * n


def classify(r: KernelRecord, mlp_dims: tuple[int, int]) -> str:
    """The ledger class of one kernel; `mlp_dims`: (embed, hidden) of the MLP linears."""
    if r.direction == "after":
        return "optimizer_and_ema"
    if r.owner is None:
        return "unattributed"
    if r.owner == HEADS:
        return HEADS
    role = "teacher" if r.owner.startswith("teacher") else "student"
    if r.category == "prune_pack":
        return f"{role}_prune_pack"
    # the 2:4 weight gradient: its pruning pass, its GEMM and its exact tail GEMM
    if "cslt_mvue_wgrad" in r.op:
        return "student_mlp_weight_grad"
    # the patch embedding (cuDNN's kernels, whose names read as attention's)
    if "convolution" in r.op:
        return "other_linears"
    if r.category == "attention":
        return "attention"
    if r.category in ("dense_gemm", "sparse_gemm"):
        weight = tuple(sorted(mlp_dims))
        ops = gemm_operands(r.shapes)
        mlp = r.category == "sparse_gemm" or (
            ops is not None and any(tuple(sorted(m)) == weight for m in ops)
        )
        if not mlp:
            return "other_linears"
        if role == "teacher":
            return "teacher_mlp_forward"
        if r.direction == "forward":
            return "student_mlp_forward"
        weight_grad = (
            ops is not None and tuple(sorted(ops[2])) == weight and r.category == "dense_gemm"
        )
        return "student_mlp_weight_grad" if weight_grad else "student_mlp_input_grad"
    if "gelu" in r.name.lower():
        return "mlp_gelu"
    return "norms_and_elementwise"


def ledger(
    records: Sequence[KernelRecord],
    steps: int,
    mlp_dims: tuple[int, int],
    step_ms: float | None = None,
    top: int = 4,
) -> dict:
    """Per step: ms and kernel count by class, the GEMM TFLOP of each class's host ops, each class's
    `top` largest launching ops, the busy time (the kernels' sum: one stream), and with `step_ms`
    (the timed step's median) the idle time, step_ms - busy."""
    ms = dict.fromkeys(CLASSES, 0.0)
    kernels = dict.fromkeys(CLASSES, 0)
    by_shapes: dict[tuple[str, str], dict[str, list]] = {}  # (class, op) -> shapes -> [us, kernels]
    flops = dict.fromkeys(CLASSES, 0)
    seen_ops = set()
    for r in records:
        c = classify(r, mlp_dims)
        ms[c] += r.us / 1e3
        kernels[c] += 1
        seen = by_shapes.setdefault((c, r.op), {}).setdefault(
            str([list(x) for x in r.shapes]), [0.0, 0]
        )
        seen[0] += r.us
        seen[1] += 1
        # an op's FLOPs once, however many kernels
        if r.category == "dense_gemm" and r.op_id not in seen_ops:
            seen_ops.add(r.op_id)
            flops[c] += gemm_flops(r.shapes)
    busy = sum(r.us for r in records) / 1e3 / steps
    by_op: dict[str, dict[str, float]] = {}  # per class: launching op name -> us
    for (c, op), shapes in by_shapes.items():
        by_op.setdefault(c, {})[op] = sum(us for us, _ in shapes.values())
    top_ops = {
        c: sorted(by_op[c].items(), key=lambda kv: -kv[1])[:top] for c in CLASSES if c in by_op
    }
    out = {
        "steps": steps,
        "mlp_dims": list(mlp_dims),
        "ms": {c: round(v / steps, 3) for c, v in ms.items()},
        "kernels": {c: round(v / steps, 1) for c, v in kernels.items()},
        "dense_gemm_tflop": {c: round(v / steps / 1e12, 4) for c, v in flops.items() if v},
        # what each class is made of: its largest launching ops (a check that the filing is right)
        "top_ops": {
            c: [[op, round(us / steps / 1e3, 3)] for op, us in ops] for c, ops in top_ops.items()
        },
        # and the input shapes each of those ops ran on, the largest three by time: [shapes, ms a
        # step, kernels a step] (an op name such as aten::sum says little about what it summed)
        "top_op_shapes": {
            c: {op: _largest_shapes(by_shapes[(c, op)], steps) for op, _ in ops}
            for c, ops in top_ops.items()
        },
        "busy_ms": round(busy, 3),
    }
    return out if step_ms is None else set_step_time(out, step_ms)


def _largest_shapes(shapes: dict[str, list], steps: int, n: int = 3) -> list:
    return [
        [key, round(us / steps / 1e3, 3), round(count / steps, 1)]
        for key, (us, count) in sorted(shapes.items(), key=lambda kv: -kv[1][0])[:n]
    ]


def set_step_time(led: dict, step_ms: float) -> dict:
    """`led` with the timed step's median (`step_ms`) and the idle time, step_ms - busy; returns
    it."""
    led["step_ms"], led["idle_ms"] = round(step_ms, 3), round(step_ms - led["busy_ms"], 3)
    return led


def profile_ledger(
    trainer, batch, values: dict, steps: int, mlp_dims: tuple[int, int], top: int = 4
) -> dict:
    """`steps` training steps profiled with host activity and shapes under `annotated`: their
    `ledger` (`top` launching ops listed per class)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with (
        annotated(trainer),
        profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True
        ) as prof,
    ):
        for _ in range(steps):
            trainer.train_step(batch, values)
        trainer.settle_checks()
        torch.cuda.synchronize()
    return ledger(kernel_records(prof.events()), steps, mlp_dims, top=top)


# --------------------------------------------------------------------------------------------------
# what 2:4 could make of it


def projections(dense: dict, speedups: Sequence[float] = SPEEDUPS) -> list[dict]:
    """From a dense row's ledger (with `step_ms`): for each coverage set of `COVERAGE`, the dense ms
    it covers, its share of the step, and the sparse phase's step ratio (dense step / projected
    step) if those GEMMs ran `s` times faster in place (prune + pack included) and the removed
    classes cost nothing."""
    step = dense["step_ms"]
    out = []
    for name, covered, removed in COVERAGE:
        covered_ms = sum(dense["ms"][c] for c in covered)
        removed_ms = sum(dense["ms"][c] for c in removed)
        out.append(
            {
                "coverage": name,
                "classes": list(covered),
                "removed": list(removed),
                "covered_ms": round(covered_ms, 3),
                "removed_ms": round(removed_ms, 3),
                "share_of_step": round((covered_ms + removed_ms) / step, 4),
                "step_ratio": {
                    f"{s:g}x": round(step / (step - covered_ms * (1 - 1 / s) - removed_ms), 4)
                    for s in speedups
                },
            }
        )
    return out


def in_place(dense: dict, sparse: dict, covered: Sequence[str]) -> dict:
    """The in-place speed-up a sparse row achieved on the `covered` classes: their dense ms over the
    sparse row's ms of the same classes plus its prune + pack."""
    before = sum(dense["ms"][c] for c in covered)
    after = (
        sum(sparse["ms"][c] for c in covered)
        + sparse["ms"]["student_prune_pack"]
        + sparse["ms"]["teacher_prune_pack"]
    )
    return {
        "classes": list(covered),
        "dense_ms": round(before, 3),
        "sparse_ms": round(after, 3),
        "speedup": round(before / after, 3) if after else None,
    }
