"""Where a training step's time goes (`scripts/bench_train_step.py --profile`): kernel time by
category, why the GPU waits (the host's CUDA API calls and the longest idle gaps), and where the
host's Python time goes (cProfile), each over steps of `Trainer.train_step` at mid-training schedule
values."""

import contextlib
from pathlib import Path

import torch

from scripts.benchmarks.profiling import idle_gaps, kernel_summary, runtime_calls
from scripts.benchmarks.timing import MID_TRAINING_STEP


def profiled_steps(trainer, batch, values: dict, steps: int, record: bool = True):
    """`steps` training steps at schedule `values` under torch.profiler's CUDA activity, their
    queued checks settled inside the window; the profiler, or None with `record=False` (a
    data-parallel rank that only keeps the collectives going while rank 0 records)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with (
        profile(activities=[ProfilerActivity.CUDA]) if record else contextlib.nullcontext() as prof
    ):
        for _ in range(steps):
            trainer.train_step(batch, values)
        trainer.settle_checks()
        torch.cuda.synchronize()
    return prof


def profile_steps(trainer, batch: dict, steps: int) -> dict:
    """Kernel time by category and GPU idle time per step (CUDA activity only)."""
    prof = profiled_steps(trainer, batch, trainer.schedules.at(MID_TRAINING_STEP), steps)
    return kernel_summary(prof, steps=steps, top=30)


def stall_profile(trainer, batch: dict, steps: int) -> dict:
    """Why the GPU waits, over `steps` steps profiled with host activity too (which slows the host,
    so the gaps are longer than in the timed steps; read them for where, not how long): the host's
    CUDA API calls per step and the longest GPU idle gaps with what the host did meanwhile."""
    from torch.profiler import ProfilerActivity, profile

    values = trainer.schedules.at(MID_TRAINING_STEP)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            trainer.train_step(batch, values)
        trainer.settle_checks()
        torch.cuda.synchronize()
    summary = kernel_summary(prof, steps=steps, top=0)
    return {
        "steps": steps,
        "span_ms": summary.get("span_ms"),
        "idle_ms": summary.get("idle_ms"),
        "runtime_calls": runtime_calls(prof, steps=steps),
        "idle_gaps": idle_gaps(prof, top=12),
    }


def host_profile(trainer, batch: dict, steps: int, top: int = 45) -> dict:
    """cProfile of `steps` steps (host time: where Python spends it; cProfile roughly doubles
    it)."""
    import cProfile
    import pstats
    import time

    values = trainer.schedules.at(MID_TRAINING_STEP)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(steps):
        trainer.train_step(batch, values)
    prof.disable()
    wall = (time.perf_counter() - t0) / steps
    trainer.settle_checks()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _) in stats.stats.items():
        rows.append(
            {
                "fn": f"{Path(file).name}:{line}:{fn}",
                "calls": nc / steps,
                "tottime_ms": tt / steps * 1e3,
                "cumtime_ms": ct / steps * 1e3,
            }
        )
    by_tot = sorted(rows, key=lambda r: -r["tottime_ms"])[:top]
    by_cum = sorted(rows, key=lambda r: -r["cumtime_ms"])[:top]
    return {
        "steps": steps,
        "wall_ms_per_step_profiled": round(wall * 1e3, 2),
        "total_tottime_ms": round(sum(r["tottime_ms"] for r in rows), 2),
        "by_tottime": by_tot,
        "by_cumtime": by_cum,
    }
