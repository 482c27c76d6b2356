"""A training step's FLOPs and its model FLOPs utilisation (MFU) against the GPU's own measured GEMM
rate.

    flops = step_flops(trainer, batch, values)      one eager dense step under torch's FlopCounterMode
    rate = gemm_rate_tflops(device)                 a large bf16 GEMM on random data, timed on this GPU now
    mfu(flops, step_ms, rate, student_sparse_gemms=2, teacher_sparse=False)

Nominal FLOPs are the dense step's (matrix products, convolutions and attention, forward and
backward), the same for both phases: the work the step stands for. Executed FLOPs count a 2:4 GEMM
at half of its dense FLOPs (the multiply-adds the tensor cores skip): the student's MLP linears run
`student_sparse_gemms` of their three GEMMs 2:4 (forward and input gradient with a transposable
mask, the forward alone without), the teacher's its one forward GEMM with `teacher_sparse`. That
assumes each such GEMM ran 2:4; the `auto` backend's per-shape choices (in a benchmark's
`sparse_decisions`) say whether one ran dense instead.
"""

from __future__ import annotations

import torch

from scripts.benchmarks.timing import median_ms


def _module_flops(counts: dict, suffix: str) -> int:
    return sum(sum(by_op.values()) for name, by_op in counts.items() if name.endswith(suffix))


def step_flops(trainer, batch, values: dict) -> dict:
    """FLOPs of one training step of `trainer` as it stands (call it in the dense phase), run
    eagerly under FlopCounterMode: the total, and the part of it in the linears the sparsity
    converter selects, per backbone (`student_mlp`: their forward, input and weight gradients;
    `teacher_mlp`: its forward)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.compiler.set_stance("force_eager"), counter:
        trainer.train_step(batch, values)
    trainer.settle_checks()
    counts = counter.get_flop_counts()
    out = {"total": int(counter.get_total_flops())}
    for role in ("student", "teacher"):
        backbone = getattr(trainer.model, role)["backbone"]
        names = trainer.sparsity.selected_linears(backbone)
        out[f"{role}_mlp"] = int(sum(_module_flops(counts, f".{role}.backbone.{n}") for n in names))
    return out


def gemm_rate_tflops(
    device, n: int = 8192, dtype=torch.bfloat16, sets: int = 3, reps: int = 20
) -> float:
    """TFLOP/s of an n x n x n product on random data (rotating over `sets` input pairs, so that
    none is served from L2): the GPU's GEMM rate as it runs now, the denominator of the MFU."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = [torch.randn(n, n, device=device, dtype=dtype, generator=gen) for _ in range(sets)]
    b = [torch.randn(n, n, device=device, dtype=dtype, generator=gen) for _ in range(sets)]
    ms = median_ms(lambda i: torch.mm(a[i], b[i]), sets, warm=5, reps=reps)
    return 2 * n**3 / ms / 1e9


def mfu(
    flops: dict,
    step_ms: float,
    rate_tflops: float,
    student_sparse_gemms: float = 0,
    teacher_sparse: bool = False,
) -> dict:
    """Nominal and executed TFLOP per step and their MFU: FLOPs per second of the step over
    `rate_tflops`. `student_sparse_gemms`: how many of a student MLP linear's three GEMMs run 2:4,
    on average over its linears (the weight gradient of one linear in two: 0.5 of a GEMM)."""
    if not 0 <= student_sparse_gemms <= 3:
        raise ValueError(f"student_sparse_gemms={student_sparse_gemms}: a linear runs 3 GEMMs")
    nominal = flops["total"]
    skipped = 0.5 * (
        flops["student_mlp"] * student_sparse_gemms / 3
        + (flops["teacher_mlp"] if teacher_sparse else 0)
    )
    executed = nominal - skipped

    def utilisation(f):
        return round(f / step_ms / 1e9 / rate_tflops, 4)

    return {
        "nominal_tflop": round(nominal / 1e12, 3),
        "executed_tflop": round(executed / 1e12, 3),
        "nominal_mfu": utilisation(nominal),
        "executed_mfu": utilisation(executed),
        "gemm_rate_tflops": round(rate_tflops, 1),
    }
