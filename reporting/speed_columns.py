"""Whether a table may show its runs' speeds (images/s, training time, speed-up): only where every
timed run had one kind of GPU to itself. Runs sharing a GPU, or the cores of a CPU, measure the
sharing; runs on two kinds of GPU measure the GPUs. A run had its GPU to itself when the memory in
use on it outside the run's own allocator (`gpu_mem_outside_mb`, logged at every metrics line) never
passed `SHARED_GPU_MB`: the run's CUDA context and libraries take about a GB, any other training or
evaluation job several."""

from collections.abc import Sequence
from dataclasses import dataclass

SHARED_GPU_MB = 4096.0
NAMED_RUNS = 3  # runs named per reason; the rest are counted


@dataclass(frozen=True)
class SpeedVerdict:
    """`gpu`: the one GPU every timed run had to itself (speeds shown); None where they are left
    out, `why_not` saying why ("" where no run was timed)."""

    gpu: str | None
    why_not: str = ""


def _named(names: list[str]) -> str:
    shown = ", ".join(names[:NAMED_RUNS])
    return shown + (f" and {len(names) - NAMED_RUNS} more" if len(names) > NAMED_RUNS else "")


def speed_verdict(runs: Sequence) -> SpeedVerdict:
    """Whether the runs' (reporting.run_logs.RunSummary) speeds compare, and on which GPU."""
    timed = [r for r in runs if r.time_s]
    if not timed:
        return SpeedVerdict(None)
    cpu = [r.name for r in timed if r.device == "cpu"]
    unrecorded = [r.name for r in timed if r.device != "cpu" and r.gpu_mem_outside_mb is None]
    shared = [
        r.name
        for r in timed
        if r.gpu_mem_outside_mb is not None and r.gpu_mem_outside_mb > SHARED_GPU_MB
    ]
    gpus = sorted({r.device_name for r in timed if r.device != "cpu" and r.device_name})
    reasons = []
    if cpu:
        reasons.append(f"{len(cpu)} trained on a CPU, whose cores runs share ({_named(cpu)})")
    if shared:
        reasons.append(
            f"{len(shared)} shared their GPU with another process, more than "
            f"{SHARED_GPU_MB / 1024:.0f} GB "
            f"in use outside the run ({_named(shared)})"
        )
    if unrecorded:
        reasons.append(
            f"{len(unrecorded)} did not record whether they had their GPU to themselves "
            f"({_named(unrecorded)})"
        )
    if len(gpus) > 1:
        reasons.append(f"the runs trained on different GPUs ({', '.join(gpus)})")
    if reasons or not gpus:
        return SpeedVerdict(None, "; ".join(reasons) or "no run recorded its GPU")
    return SpeedVerdict(gpus[0])
