"""Timing GPU work: medians of CUDA-event timings after warm-up (used by plan search and `auto`).

`median_cuda_ms` times calls as they are launched (host time shows when the host is slower than the
GPU); `device_only_ms` keeps the host ahead of the GPU so that only device time is measured (what a
CUDA graph replay costs). `device_memory_outside_mb` tells whether anything else holds the GPU while
it is timed."""

import time

import torch


def median_cuda_ms(fn, warmup: int = 3, reps: int = 15) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return _timed_median(fn, reps)


def device_only_ms(fn, warmup: int = 2, reps: int = 10) -> float:
    """Median device time of fn(): a sleep kernel holds the GPU while all repetitions are queued, so
    launch gaps (host time) do not show. The sleep is sized from the measured host time of the
    repetitions."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    host_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    sleep_ms = 2.0 * host_ms * reps + 1.0
    torch.cuda._sleep(
        int(sleep_ms * 2e6)
    )  # ~2e6 cycles per ms (<= 2 GHz clocks): sleeping longer is harmless
    return _timed_median(fn, reps)


def _timed_median(fn, reps: int) -> float:
    """Median over `reps` calls of fn() of the CUDA-event time around each call, as they are queued
    now."""
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(reps)
    ]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) for start, end in events)
    return times[len(times) // 2]


def device_memory_outside_mb(device: torch.device) -> float | None:
    """Memory in use on `device` that this process's PyTorch allocator does not hold: its CUDA
    context and libraries (about a GB), plus whatever other processes hold. Far more than that is the
    sign that another process shares the GPU, and then its kernels run inside any timing taken here.
    None off CUDA."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return max(0.0, (total - free - torch.cuda.memory_reserved(device)) / 2**20)
